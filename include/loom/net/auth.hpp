// Cluster-token authentication for loom's message layer (docs/wire-protocol.md).
//
// Every connection starts with a handshake, both sides proving knowledge of the
// cluster token without sending it:
//
//   client -> hello       role, has-token flag, client id, 32-byte client nonce Nc
//   server -> challenge   token-required flag, 32-byte server nonce Ns,
//                         server proof HMAC-SHA256(token, "loom-v1-server" | Nc | Ns | id)
//   client -> auth        has-proof flag, client proof HMAC-SHA256(token, "loom-v1-client" | Ns |
//   Nc | id) server -> auth_result status (0 = ok, else 1 + error_code) and a message
//
// Nonces come from OpenSSL's RAND_bytes, proofs are compared with CRYPTO_memcmp
// (constant time). A token is taken from the options, else LOOM_CLUSTER_TOKEN,
// else the file named by LOOM_CLUSTER_TOKEN_FILE (trailing whitespace trimmed).
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/net/frame.hpp>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

namespace loom::net {

using digest = std::array<unsigned char, 32>;
using nonce = std::array<unsigned char, 32>;

enum class connection_role : std::uint8_t { control = 0, bulk = 1 };

// The token from LOOM_CLUSTER_TOKEN, else from the file LOOM_CLUSTER_TOKEN_FILE names;
// nullopt when neither is set. An unreadable or empty token file is an error.
LOOM_COMPILED_ONCE std::optional<std::string> token_from_environment();

// The token to use: the explicit one if given (an empty string means "no token"),
// else the environment's.
inline std::optional<std::string> resolve_token(const std::optional<std::string>& explicit_token) {
  if (explicit_token) {
    if (explicit_token->empty())
      return std::nullopt;
    return explicit_token;
  }
  return token_from_environment();
}

// LOOM_ALLOW_INSECURE=1 (or true/yes) opts into serving beyond loopback without a token.
LOOM_COMPILED_ONCE bool insecure_from_environment();

LOOM_COMPILED_ONCE nonce random_nonce();

inline std::uint64_t random_u64() {
  std::uint64_t v = 0;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&v), sizeof v) != 1)
    throw internal_error("OpenSSL RAND_bytes failed");
  return v;
}

// This process's id in the hellos of its channels (channel_options::process_id):
// random, drawn once.
inline std::uint64_t this_process_id() {
  static const std::uint64_t id = random_u64();
  return id;
}

LOOM_COMPILED_ONCE digest hmac_sha256(std::string_view key, std::string_view data);

inline bool equal_digests(const digest& a, const digest& b) noexcept {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

namespace detail {
LOOM_COMPILED_ONCE std::string proof_input(std::string_view label, const nonce& first,
                                           const nonce& second, std::uint64_t client_id);
} // namespace detail

inline digest server_proof(std::string_view token, const nonce& client_nonce,
                           const nonce& server_nonce, std::uint64_t client_id) {
  return hmac_sha256(token,
                     detail::proof_input("loom-v1-server", client_nonce, server_nonce, client_id));
}
inline digest client_proof(std::string_view token, const nonce& client_nonce,
                           const nonce& server_nonce, std::uint64_t client_id) {
  return hmac_sha256(token,
                     detail::proof_input("loom-v1-client", server_nonce, client_nonce, client_id));
}

// ---- handshake records (the metadata of the handshake frames) ----

struct hello_msg {
  connection_role role = connection_role::control;
  bool has_token = false;
  std::uint64_t client_id = 0;
  nonce client_nonce{};
  std::uint64_t process_id = 0; // the client's process (client_identity)
};
struct challenge_msg {
  bool token_required = false;
  nonce server_nonce{};
  digest proof{}; // zero when the server has no token or the client said it has none
};
struct auth_msg {
  bool has_proof = false;
  digest proof{};
};
struct auth_result_msg {
  std::uint32_t status = 0; // 0 ok, else 1 + error_code
  std::string message;
};

namespace detail {
inline std::string handshake_frame(frame_kind k, const std::string& body) {
  std::string out;
  begin_head(out, k, 0, 0);
  out += body;
  finish_head(out, 0);
  return out;
}
template <std::size_t N> void put_bytes(std::string& s, const std::array<unsigned char, N>& a) {
  s.append(reinterpret_cast<const char*>(a.data()), N);
}
} // namespace detail

LOOM_COMPILED_ONCE std::string encode(const hello_msg& m);
LOOM_COMPILED_ONCE std::string encode(const challenge_msg& m);
LOOM_COMPILED_ONCE std::string encode(const auth_msg& m);
LOOM_COMPILED_ONCE std::string encode(const auth_result_msg& m);

namespace detail {
LOOM_COMPILED_ONCE bool flag(reader& r, std::string_view what);
} // namespace detail

// Decoders of the handshake records (throw data_loss_error on malformed bytes).
LOOM_COMPILED_ONCE hello_msg decode_hello(std::span<const std::byte> b);
LOOM_COMPILED_ONCE challenge_msg decode_challenge(std::span<const std::byte> b);
LOOM_COMPILED_ONCE auth_msg decode_auth(std::span<const std::byte> b);
LOOM_COMPILED_ONCE auth_result_msg decode_auth_result(std::span<const std::byte> b);

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net {

LOOM_COMPILED_ONCE std::optional<std::string> token_from_environment() {
  if (const char* t = std::getenv("LOOM_CLUSTER_TOKEN"); t && *t)
    return std::string(t);
  if (const char* f = std::getenv("LOOM_CLUSTER_TOKEN_FILE"); f && *f) {
    std::ifstream in(f, std::ios::binary);
    if (!in)
      throw not_found_error("cannot read the cluster token file '" + std::string(f) +
                            "' named by LOOM_CLUSTER_TOKEN_FILE");
    std::ostringstream ss;
    ss << in.rdbuf();
    std::string tok = ss.str();
    while (!tok.empty() &&
           (tok.back() == '\n' || tok.back() == '\r' || tok.back() == ' ' || tok.back() == '\t'))
      tok.pop_back();
    if (tok.empty())
      throw invalid_argument_error("the cluster token file '" + std::string(f) + "' is empty");
    return tok;
  }
  return std::nullopt;
}

LOOM_COMPILED_ONCE bool insecure_from_environment() {
  const char* v = std::getenv("LOOM_ALLOW_INSECURE");
  if (!v)
    return false;
  const std::string_view s(v);
  return s == "1" || s == "true" || s == "yes" || s == "TRUE" || s == "YES";
}

LOOM_COMPILED_ONCE nonce random_nonce() {
  nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
    throw internal_error("OpenSSL RAND_bytes failed to produce a nonce");
  return n;
}

LOOM_COMPILED_ONCE digest hmac_sha256(std::string_view key, std::string_view data) {
  digest out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(), &len) ||
      len != out.size())
    throw internal_error("OpenSSL HMAC-SHA256 failed");
  return out;
}
} // namespace loom::net

namespace loom::net::detail {

LOOM_COMPILED_ONCE std::string proof_input(std::string_view label, const nonce& first,
                                           const nonce& second, std::uint64_t client_id) {
  std::string s(label);
  s.append(reinterpret_cast<const char*>(first.data()), first.size());
  s.append(reinterpret_cast<const char*>(second.data()), second.size());
  put_u64(s, client_id);
  return s;
}
} // namespace loom::net::detail

namespace loom::net {

LOOM_COMPILED_ONCE std::string encode(const hello_msg& m) {
  std::string b;
  b.push_back(static_cast<char>(m.role));
  b.push_back(m.has_token ? 1 : 0);
  detail::put_u64(b, m.client_id);
  detail::put_bytes(b, m.client_nonce);
  detail::put_u64(b, m.process_id);
  return detail::handshake_frame(frame_kind::hello, b);
}

LOOM_COMPILED_ONCE std::string encode(const challenge_msg& m) {
  std::string b;
  b.push_back(m.token_required ? 1 : 0);
  detail::put_bytes(b, m.server_nonce);
  detail::put_bytes(b, m.proof);
  return detail::handshake_frame(frame_kind::challenge, b);
}

LOOM_COMPILED_ONCE std::string encode(const auth_msg& m) {
  std::string b;
  b.push_back(m.has_proof ? 1 : 0);
  detail::put_bytes(b, m.proof);
  return detail::handshake_frame(frame_kind::auth, b);
}

LOOM_COMPILED_ONCE std::string encode(const auth_result_msg& m) {
  std::string b;
  detail::put_u32(b, m.status);
  detail::put_u32(b, static_cast<std::uint32_t>(m.message.size()));
  b += m.message;
  return detail::handshake_frame(frame_kind::auth_result, b);
}
} // namespace loom::net

namespace loom::net::detail {

LOOM_COMPILED_ONCE bool flag(reader& r, std::string_view what) {
  const auto v = r.u8();
  if (v > 1)
    throw data_loss_error(std::string(what) + ": bad flag byte " + std::to_string(v));
  return v == 1;
}
} // namespace loom::net::detail

namespace loom::net {

LOOM_COMPILED_ONCE hello_msg decode_hello(std::span<const std::byte> b) {
  detail::reader r(b, "hello frame");
  hello_msg m;
  const auto role = r.u8();
  if (role > 1)
    throw data_loss_error("hello frame: unknown connection role " + std::to_string(role));
  m.role = static_cast<connection_role>(role);
  m.has_token = detail::flag(r, "hello frame");
  m.client_id = r.u64();
  r.bytes(m.client_nonce.data(), m.client_nonce.size());
  m.process_id = r.u64();
  return m;
}

LOOM_COMPILED_ONCE challenge_msg decode_challenge(std::span<const std::byte> b) {
  detail::reader r(b, "challenge frame");
  challenge_msg m;
  m.token_required = detail::flag(r, "challenge frame");
  r.bytes(m.server_nonce.data(), m.server_nonce.size());
  r.bytes(m.proof.data(), m.proof.size());
  return m;
}

LOOM_COMPILED_ONCE auth_msg decode_auth(std::span<const std::byte> b) {
  detail::reader r(b, "auth frame");
  auth_msg m;
  m.has_proof = detail::flag(r, "auth frame");
  r.bytes(m.proof.data(), m.proof.size());
  return m;
}

LOOM_COMPILED_ONCE auth_result_msg decode_auth_result(std::span<const std::byte> b) {
  detail::reader r(b, "auth_result frame");
  auth_result_msg m;
  m.status = r.u32();
  if (m.status > max_status)
    throw data_loss_error("auth_result frame: unknown status " + std::to_string(m.status));
  m.message = r.str(r.u32());
  return m;
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

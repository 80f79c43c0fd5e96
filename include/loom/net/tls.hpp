// TLS for loom's connections (docs/wire-protocol.md, "TLS"): the OpenSSL context a server or
// a channel makes from its tls_settings (cluster/tls_settings.hpp), and what a failed TLS
// handshake means, said for humans. The bytes themselves go through net::transport.
//
// - TLS 1.3 only, AES-GCM or ChaCha20-Poly1305. No session tickets (every connection of a
//   cluster is long-lived; resumption would buy nothing).
// - Keyed by the cluster token: an external pre-shared key (RFC 8446 section 4.2.11) of 32
//   bytes, HKDF-SHA256 (OpenSSL's) of the token, used with an (EC)DHE exchange (psk_dhe_ke,
//   OpenSSL's default), so traffic recorded today stays secret if the token leaks later. No
//   certificate files. A peer with another token fails the handshake: its PSK binder does
//   not verify. A client in this mode accepts no certificate from the server (its trust store
//   is empty), so a server that ignores the PSK cannot stand in with one.
// - With certificates: both sides present theirs and verify the peer's against the CA
//   (mutual TLS). Any certificate the CA signed belongs to the cluster: there is no host
//   name check, the CA being the cluster's own, as the token is.
// The cluster-token handshake (auth.hpp) still runs, inside the TLS stream.
#pragma once

#include <loom/cluster/tls_settings.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/net/frame.hpp>

#include <asio/error.hpp>
#include <asio/ssl/context.hpp>
#include <asio/ssl/error.hpp>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509err.h>

#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

namespace loom::net {

enum class tls_role { client, server };

namespace detail {

using tls_key = std::array<unsigned char, 32>;

// The name both sides give the pre-shared key (TLS sends it in the clear; it says which
// scheme, not which cluster).
inline constexpr std::string_view tls_psk_identity = "loom-cluster-token-v1";
// TLS_AES_128_GCM_SHA256, the suite the PSK is bound to (RFC 8446 4.2.11: an external PSK
// names its hash; every suite offered in this mode uses SHA-256).
inline constexpr unsigned char tls_psk_suite[2] = {0x13, 0x01};

// HKDF-SHA256(salt "loom-tls-psk-v1", key = the token, info): the TLS key of a cluster token.
LOOM_COMPILED_ONCE tls_key derive_tls_key(std::string_view token);

// Where an SSL_CTX keeps its tls_key (asio uses the context's app data itself).
inline int tls_key_slot() {
  static const int slot = SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return slot;
}

// A TLS 1.3 session that holds the context's key: how OpenSSL takes an external PSK.
LOOM_COMPILED_ONCE SSL_SESSION* psk_session(SSL* ssl);

// Client: offers the PSK (OpenSSL's SSL_psk_use_session_cb_func).
LOOM_COMPILED_ONCE int offer_psk(SSL* ssl, const EVP_MD* md, const unsigned char** id,
                                 std::size_t* idlen, SSL_SESSION** sess);

// Server: the PSK a client names (OpenSSL's SSL_psk_find_session_cb_func); an unknown name
// finds none (the handshake then fails: the server has no certificate).
LOOM_COMPILED_ONCE int find_psk(SSL* ssl, const unsigned char* id, std::size_t idlen,
                                SSL_SESSION** sess);

} // namespace detail

// The TLS context of one server or one channel: shared by its connections (OpenSSL's SSL_CTX
// is safe to share), immutable once made.
class tls_context {
public:
  // Throws failed_precondition_error (keyed by the token without a token) or
  // invalid_argument_error naming a certificate, key or CA file that does not load.
  tls_context(const tls_settings& settings, const std::optional<std::string>& token, tls_role role);
  tls_context(const tls_context&) = delete;
  tls_context& operator=(const tls_context&) = delete;

  asio::ssl::context& native() noexcept { return ctx_; }
  tls_role role() const noexcept { return role_; }
  const tls_settings& settings() const noexcept { return settings_; }

private:
  static invalid_argument_error file_error(std::string_view what, std::string_view var,
                                           std::string_view flag, const std::string& path,
                                           const std::error_code& ec);

  tls_settings settings_;
  tls_role role_;
  asio::ssl::context ctx_;
  detail::tls_key key_{}; // the PSK (keyed by the token); ctx_ points at it
};

// A server's or a channel's TLS context for `settings`; null when they turn TLS off.
inline std::shared_ptr<tls_context> make_tls_context(const tls_settings& settings,
                                                     const std::optional<std::string>& token,
                                                     tls_role role) {
  if (!settings.enabled())
    return nullptr;
  return std::make_shared<tls_context>(settings, token, role);
}

// True when the bytes start like a TLS handshake record (a ClientHello): what a plain
// server sees from a client that uses TLS.
inline bool looks_like_tls(std::span<const std::byte> b) noexcept {
  return b.size() >= 2 && b[0] == std::byte{0x16} && b[1] == std::byte{0x03};
}

// What a TLS handshake that failed with `ec` means: an error code and a sentence about the
// peer, for the error a client throws and the line a server logs. `ssl` (may be null)
// gives the certificate verification's own reason; `mode` is this side's.
struct tls_failure {
  error_code code;
  std::string why;
};
LOOM_COMPILED_ONCE tls_failure explain_tls_failure(const std::error_code& ec, SSL* ssl,
                                                   tls_mode mode);

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net::detail {

LOOM_COMPILED_ONCE tls_key derive_tls_key(std::string_view token) {
  static constexpr std::string_view salt = "loom-tls-psk-v1";
  static constexpr std::string_view info = "loom cluster token -> TLS 1.3 external PSK";
  tls_key out{};
  std::size_t len = out.size();
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
  const bool ok =
      ctx && EVP_PKEY_derive_init(ctx) > 0 && EVP_PKEY_CTX_set_hkdf_md(ctx, EVP_sha256()) > 0 &&
      EVP_PKEY_CTX_set1_hkdf_salt(ctx, reinterpret_cast<const unsigned char*>(salt.data()),
                                  static_cast<int>(salt.size())) > 0 &&
      EVP_PKEY_CTX_set1_hkdf_key(ctx, reinterpret_cast<const unsigned char*>(token.data()),
                                 static_cast<int>(token.size())) > 0 &&
      EVP_PKEY_CTX_add1_hkdf_info(ctx, reinterpret_cast<const unsigned char*>(info.data()),
                                  static_cast<int>(info.size())) > 0 &&
      EVP_PKEY_derive(ctx, out.data(), &len) > 0 && len == out.size();
  EVP_PKEY_CTX_free(ctx);
  if (!ok)
    throw internal_error("OpenSSL's HKDF-SHA256 failed to derive the TLS key of the cluster token");
  return out;
}

LOOM_COMPILED_ONCE SSL_SESSION* psk_session(SSL* ssl) {
  const auto* key =
      static_cast<const tls_key*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), tls_key_slot()));
  const SSL_CIPHER* suite = SSL_CIPHER_find(ssl, tls_psk_suite);
  if (!key || !suite)
    return nullptr;
  SSL_SESSION* s = SSL_SESSION_new();
  if (s && SSL_SESSION_set1_master_key(s, key->data(), key->size()) == 1 &&
      SSL_SESSION_set_cipher(s, suite) == 1 &&
      SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) == 1)
    return s;
  SSL_SESSION_free(s);
  return nullptr;
}

LOOM_COMPILED_ONCE int offer_psk(SSL* ssl, const EVP_MD* md, const unsigned char** id,
                                 std::size_t* idlen, SSL_SESSION** sess) {
  SSL_SESSION* s = psk_session(ssl);
  if (!s)
    return 0; // fails the handshake
  if (md && md != SSL_CIPHER_get_handshake_digest(SSL_SESSION_get0_cipher(s))) {
    SSL_SESSION_free(s); // a retry for another hash: no PSK fits it
    *sess = nullptr;
    *id = nullptr;
    *idlen = 0;
    return 1;
  }
  *sess = s;
  *id = reinterpret_cast<const unsigned char*>(tls_psk_identity.data());
  *idlen = tls_psk_identity.size();
  return 1;
}

LOOM_COMPILED_ONCE int find_psk(SSL* ssl, const unsigned char* id, std::size_t idlen,
                                SSL_SESSION** sess) {
  *sess = nullptr;
  if (idlen != tls_psk_identity.size() || std::memcmp(id, tls_psk_identity.data(), idlen) != 0)
    return 1;
  *sess = psk_session(ssl);
  return *sess ? 1 : 0;
}
} // namespace loom::net::detail

namespace loom::net {

LOOM_COMPILED_ONCE tls_context::tls_context(const tls_settings& settings,
                                            const std::optional<std::string>& token, tls_role role)
    : settings_(settings), role_(role),
      ctx_(role == tls_role::server ? asio::ssl::context::tls_server
                                    : asio::ssl::context::tls_client) {
  SSL_CTX* h = ctx_.native_handle();
  const bool by_token = settings.mode == tls_mode::token;
  if (SSL_CTX_set_min_proto_version(h, TLS1_3_VERSION) != 1 ||
      SSL_CTX_set_ciphersuites(h, by_token ? "TLS_AES_128_GCM_SHA256:"
                                             "TLS_CHACHA20_POLY1305_SHA256"
                                           : "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                                             "TLS_CHACHA20_POLY1305_SHA256") != 1)
    throw internal_error("OpenSSL refused loom's TLS 1.3 settings");
  SSL_CTX_set_options(h, SSL_OP_NO_TICKET);
  SSL_CTX_set_num_tickets(h, 0);
  if (by_token) {
    if (!token || token->empty())
      throw failed_precondition_error(
          "TLS keyed by the cluster token (LOOM_TLS=1, --tls) needs a cluster token: set "
          "LOOM_CLUSTER_TOKEN or LOOM_CLUSTER_TOKEN_FILE for every task and client "
          "(loom-launch generates one), or use certificates (--tls_cert, --tls_key, --tls_ca)");
    key_ = detail::derive_tls_key(*token);
    SSL_CTX_set_ex_data(h, detail::tls_key_slot(), &key_);
    if (role == tls_role::client)
      SSL_CTX_set_psk_use_session_callback(h, &detail::offer_psk);
    else
      SSL_CTX_set_psk_find_session_callback(h, &detail::find_psk);
    // A client's trust store is empty: a server that answers with a certificate instead
    // of the key is refused. (A server asks for no certificate: TLS 1.3 forbids it with a
    // PSK.)
    if (role == tls_role::client)
      ctx_.set_verify_mode(asio::ssl::verify_peer);
  } else if (settings.mode == tls_mode::certificates) {
    std::error_code ec;
    ctx_.use_certificate_chain_file(settings.cert_file, ec);
    if (ec)
      throw file_error("certificate", "LOOM_TLS_CERT", "tls_cert", settings.cert_file, ec);
    ctx_.use_private_key_file(settings.key_file, asio::ssl::context::pem, ec);
    const bool mismatch =
        ec && ec.category() == asio::error::get_ssl_category() &&
        ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == X509_R_KEY_VALUES_MISMATCH;
    if (ec && !mismatch)
      throw file_error("private key", "LOOM_TLS_KEY", "tls_key", settings.key_file, ec);
    if (mismatch || SSL_CTX_check_private_key(h) != 1)
      throw invalid_argument_error("the TLS private key " + settings.key_file +
                                   " (LOOM_TLS_KEY, --tls_key) does not belong to the "
                                   "certificate " +
                                   settings.cert_file + " (LOOM_TLS_CERT, --tls_cert)");
    ctx_.load_verify_file(settings.ca_file, ec);
    if (ec)
      throw file_error("CA", "LOOM_TLS_CA", "tls_ca", settings.ca_file, ec);
    ctx_.set_verify_mode(asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert);
  } else {
    throw internal_error("a TLS context was made for settings without TLS");
  }
}

LOOM_COMPILED_ONCE auto tls_context::file_error(std::string_view what, std::string_view var,
                                                std::string_view flag, const std::string& path,
                                                const std::error_code& ec)
    -> invalid_argument_error {
  return invalid_argument_error("cannot load the TLS " + std::string(what) + " " + path + " (" +
                                std::string(var) + ", --" + std::string(flag) +
                                "): " + ec.message());
}

LOOM_COMPILED_ONCE tls_failure explain_tls_failure(const std::error_code& ec, SSL* ssl,
                                                   tls_mode mode) {
  if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated ||
      ec == asio::error::connection_reset || ec == asio::error::operation_aborted)
    return {error_code::unavailable,
            "the connection closed during the TLS handshake (" + ec.message() + ")"};
  if (ec.category() != asio::error::get_ssl_category())
    return {error_code::unavailable, ec.message()};
  const std::string openssl = " (OpenSSL: " + ec.message() + ")";
  const std::string same_settings =
      "give every task and client the same TLS settings (LOOM_TLS, or LOOM_TLS_CERT, "
      "LOOM_TLS_KEY and LOOM_TLS_CA; the flags --tls, --tls_cert, --tls_key, --tls_ca)";
  switch (ERR_GET_REASON(static_cast<unsigned long>(ec.value()))) {
  case SSL_R_WRONG_VERSION_NUMBER:
  case SSL_R_PACKET_LENGTH_TOO_LONG:
  case SSL_R_HTTP_REQUEST:
  case SSL_R_UNKNOWN_PROTOCOL:
    return {error_code::failed_precondition,
            "the peer answered in plain text: it does not use TLS, and this process does; " +
                same_settings + openssl};
  case SSL_R_SSLV3_ALERT_ILLEGAL_PARAMETER: // OpenSSL 3's alert for a binder that fails
    if (mode != tls_mode::token)
      break;
    [[fallthrough]];
  case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
  case SSL_R_BINDER_DOES_NOT_VERIFY:
    return {error_code::unauthenticated,
            "the TLS keys differ: the peer has another cluster token (TLS keyed by the "
            "cluster token)" +
                openssl};
  case SSL_R_CERTIFICATE_VERIFY_FAILED: {
    if (mode == tls_mode::token)
      return {error_code::unauthenticated,
              "the peer presented a certificate, but this process uses TLS keyed by the "
              "cluster token; " +
                  same_settings + openssl};
    const long v = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
    return {error_code::unauthenticated,
            "the peer's certificate failed verification against the CA (LOOM_TLS_CA, --tls_ca)" +
                (v != X509_V_OK ? std::string(": ") + X509_verify_cert_error_string(v) : "") +
                openssl};
  }
  case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
  case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
  case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
  case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
    return {error_code::unauthenticated,
            "the peer rejected this process's certificate (is it signed by the cluster's CA, "
            "the one in the peer's LOOM_TLS_CA?)" +
                openssl};
  case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
  case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
  case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE:
  case SSL_R_NO_SHARED_CIPHER:
  case SSL_R_NO_SUITABLE_SIGNATURE_ALGORITHM:
    return {error_code::unauthenticated,
            "the two sides found no common ground: one uses TLS keyed by the cluster token, "
            "the other TLS with certificates? " +
                same_settings + openssl};
  default: break;
  }
  return {error_code::unauthenticated, ec.message()};
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// Frames, the pure decoder, handshake records and the auth helpers (no sockets).
#include <doctest/doctest.h>

#include "net_test_util.hpp"

#include <loom/net/auth.hpp>
#include <loom/net/connection.hpp>
#include <loom/net/frame.hpp>

#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

using namespace loom;
using namespace loom::net;
using loom::net::testing::same_bytes;

namespace {

struct meta_t {
  std::string name;
  std::vector<std::int64_t> ids;
  double lr = 0;
  template <class A> void serialize(A& ar) { ar(name, ids, lr); }
};

std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

std::vector<any_tensor> one_of_each() {
  std::vector<any_tensor> v;
  v.push_back(any_tensor::from_vector<float>(shape{2, 3}, {1.5f, -2, 3, 4, 5, 6.25f}));
  v.push_back(any_tensor::from_vector<double>(shape{3}, {1e300, -0.0, 3.14159}));
  v.push_back(any_tensor::from_vector<std::int32_t>(shape{2, 2}, {-1, 2, 1 << 30, 7}));
  v.push_back(any_tensor::from_vector<std::int64_t>(shape{}, {std::int64_t(1) << 60}));
  v.push_back(any_tensor::from_vector<bool>(shape{4}, {true, false, false, true}));
  v.push_back(any_tensor(dtype::f32, shape{0, 5})); // empty
  return v;
}

std::string valid_frame() {
  envelope env;
  env.method = "apply_gradients";
  env.timeout_us = 1234;
  const auto t = one_of_each();
  return encode_frame(frame_kind::request, 77, env, t, meta_t{"w1", {1, 2, 3}, 0.5});
}

} // namespace

TEST_CASE("a frame round-trips metadata and tensors of every dtype but string") {
  const auto tensors = one_of_each();
  envelope env;
  env.method = "apply_gradients";
  env.timeout_us = 99;
  const std::string bytes =
      encode_frame(frame_kind::request, 77, env, tensors, meta_t{"w1", {1, 2, 3}, 0.5});
  const auto f = decode_frame(bytes_of(bytes));
  CHECK(f.header.kind == frame_kind::request);
  CHECK(f.header.request_id == 77);
  CHECK(f.frame_bytes == bytes.size());
  CHECK(f.meta.env.method == "apply_gradients");
  CHECK(f.meta.env.timeout_us == 99);
  CHECK(f.meta.env.ok());
  const auto m = decode_metadata<meta_t>(f.user_metadata(), "test");
  CHECK(m.name == "w1");
  CHECK(m.ids == std::vector<std::int64_t>{1, 2, 3});
  CHECK(m.lr == 0.5);
  REQUIRE(f.payloads.size() == tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i)
    CHECK(same_bytes(f.payloads[i], tensors[i]));
}

TEST_CASE("an error response carries its code and message") {
  envelope env;
  env.status = status_of(error_code::not_found);
  env.message = "no variable w9";
  const auto bytes = encode_frame(frame_kind::response, 5, env, {});
  const auto f = decode_frame(bytes_of(bytes));
  CHECK(!f.meta.env.ok());
  CHECK(f.meta.env.code() == error_code::not_found);
  CHECK(f.meta.env.message == "no variable w9");
  CHECK_THROWS_AS(throw_error(f.meta.env.code(), f.meta.env.message), not_found_error);
}

TEST_CASE("string tensors are refused as payloads with a clear error") {
  std::vector<any_tensor> t{any_tensor(dtype::string, shape{2})};
  try {
    (void)encode_frame(frame_kind::request, 1, envelope{}, t);
    FAIL("no error");
  } catch (const invalid_argument_error& e) {
    CHECK(std::string(e.what()).find("metadata") != std::string::npos);
  }
  std::vector<any_tensor> none{any_tensor{}};
  CHECK_THROWS_AS((void)encode_frame(frame_kind::request, 1, envelope{}, none),
                  invalid_argument_error);
}

TEST_CASE("the header decoder rejects bad magic, versions, kinds and oversized lengths") {
  const std::string good = valid_frame();
  frame_limits lim;
  auto mutate = [&](std::size_t at, unsigned char v) {
    std::string s = good;
    s[at] = static_cast<char>(v);
    return s;
  };
  CHECK_THROWS_AS(parse_header(bytes_of(mutate(0, 'X')), lim), data_loss_error);
  CHECK_THROWS_AS(parse_header(bytes_of(mutate(4, 2)), lim), unimplemented_error);
  CHECK_THROWS_AS(parse_header(bytes_of(mutate(5, 99)), lim), unimplemented_error);
  CHECK_THROWS_AS(parse_header(bytes_of(good.substr(0, 10)), lim), data_loss_error);

  std::string big = good;
  net::detail::patch_u32(big, 16, 0x7fffffff); // metadata length
  CHECK_THROWS_AS(parse_header(bytes_of(big), lim), resource_exhausted_error);
  std::string many = good;
  net::detail::patch_u32(many, 20, 1u << 30); // payload count
  CHECK_THROWS_AS(parse_header(bytes_of(many), lim), resource_exhausted_error);

  frame_limits small;
  small.max_frame_bytes = 100;
  CHECK_THROWS_AS(decode_frame(bytes_of(good), small), resource_exhausted_error);
  frame_limits meta_small;
  meta_small.max_metadata_bytes = 10;
  CHECK_THROWS_AS(decode_frame(bytes_of(good), meta_small), resource_exhausted_error);
}

TEST_CASE("payload descriptors are checked before anything is allocated") {
  envelope env;
  env.method = "m";
  std::vector<any_tensor> t{any_tensor::from_vector<float>(shape{2}, {1, 2})};
  const std::string good = encode_frame(frame_kind::request, 1, env, t);
  // Descriptor layout: after header (24) + method (2 + 1) + status (4) + msg len (4) + timeout (8).
  const std::size_t d = header_size + 3 + 4 + 4 + 8;
  auto with = [&](std::size_t at, std::uint64_t v, int n) {
    std::string s = good;
    for (int i = 0; i < n; ++i)
      s[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
    return s;
  };
  CHECK_THROWS_AS(decode_frame(bytes_of(with(d, 5, 1))), data_loss_error);       // string dtype
  CHECK_THROWS_AS(decode_frame(bytes_of(with(d, 77, 1))), data_loss_error);      // unknown dtype
  CHECK_THROWS_AS(decode_frame(bytes_of(with(d + 1, 200, 1))), data_loss_error); // rank
  CHECK_THROWS_AS(decode_frame(bytes_of(with(d + 4, std::uint64_t(-3), 8))),
                  data_loss_error); // negative dim
  CHECK_THROWS_AS(decode_frame(bytes_of(with(d + 4, std::uint64_t(1) << 40, 8))),
                  resource_exhausted_error); // 2^40 floats: over 1 GiB
  CHECK_THROWS_AS(decode_frame(bytes_of(with(d + 12, 12, 8))), data_loss_error); // byte length
  CHECK_THROWS_AS(decode_frame(bytes_of(good.substr(0, good.size() - 1))), data_loss_error);

  std::vector<any_tensor> b{any_tensor::from_vector<bool>(shape{2}, {true, false})};
  std::string bad_bool = encode_frame(frame_kind::request, 1, env, b);
  bad_bool.back() = 7;
  CHECK_THROWS_AS(decode_frame(bytes_of(bad_bool)), data_loss_error);
}

TEST_CASE("the decoder survives random and mutated bytes") {
  // Every input either decodes into a valid frame or throws a loom::error:
  // no crash, no other exception, no huge allocation (ASan builds check that too).
  std::mt19937_64 rng(20240501);
  const std::string seed = valid_frame();
  std::vector<std::string> seeds{seed, encode(hello_msg{}), encode(auth_result_msg{3, "x"})};
  int valid = 0, errors = 0;
  for (int iter = 0; iter < 30000; ++iter) {
    std::string s;
    if (iter % 5 == 0) {
      s.resize(rng() % 200);
      for (auto& c : s)
        c = static_cast<char>(rng());
      if (s.size() >= 4 && rng() % 2)
        std::memcpy(s.data(), "LOOM\x01", 5 <= s.size() ? 5 : 4);
    } else {
      s = seeds[rng() % seeds.size()];
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        switch (rng() % 4) {
        case 0: s[rng() % s.size()] = static_cast<char>(rng()); break;
        case 1: s.resize(rng() % (s.size() + 1)); break;
        case 2: s.insert(rng() % (s.size() + 1), 1, static_cast<char>(rng())); break;
        case 3: // a length field set to something extreme
          if (s.size() >= header_size)
            net::detail::patch_u32(s, 16 + 4 * (rng() % 2), static_cast<std::uint32_t>(rng()));
          break;
        }
        if (s.empty())
          s = seeds[0];
      }
    }
    try {
      const auto f = decode_frame(bytes_of(s));
      CHECK(f.frame_bytes <= s.size());
      if (is_handshake_kind(f.header.kind)) {
        try {
          switch (f.header.kind) {
          case frame_kind::hello: (void)decode_hello(bytes_of(f.metadata)); break;
          case frame_kind::challenge: (void)decode_challenge(bytes_of(f.metadata)); break;
          case frame_kind::auth: (void)decode_auth(bytes_of(f.metadata)); break;
          default: (void)decode_auth_result(bytes_of(f.metadata)); break;
          }
        } catch (const loom::error&) {
        }
      }
      ++valid;
    } catch (const loom::error&) {
      ++errors;
    }
  }
  CHECK(valid > 0);
  CHECK(errors > 0);
  CHECK(valid + errors == 30000);
}

TEST_CASE("handshake records round-trip") {
  hello_msg h{connection_role::bulk, true, 0x1122334455667788ull, random_nonce()};
  const auto hf = decode_frame(bytes_of(encode(h)));
  CHECK(hf.header.kind == frame_kind::hello);
  const auto h2 = decode_hello(bytes_of(hf.metadata));
  CHECK(h2.role == connection_role::bulk);
  CHECK(h2.has_token);
  CHECK(h2.client_id == h.client_id);
  CHECK(h2.client_nonce == h.client_nonce);

  auth_result_msg r{status_of(error_code::unauthenticated), "wrong token"};
  const auto rf = decode_frame(bytes_of(encode(r)));
  const auto r2 = decode_auth_result(bytes_of(rf.metadata));
  CHECK(r2.status == r.status);
  CHECK(r2.message == "wrong token");
}

TEST_CASE("HMAC-SHA256 matches RFC 4231 and proofs depend on the token") {
  // RFC 4231, test case 2.
  const auto d = hmac_sha256("Jefe", "what do ya want for nothing?");
  const unsigned char expect[32] = {0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e,
                                    0x6a, 0x04, 0x24, 0x26, 0x08, 0x95, 0x75, 0xc7,
                                    0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27, 0x39, 0x83,
                                    0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
  CHECK(std::memcmp(d.data(), expect, 32) == 0);

  const auto nc = random_nonce(), ns = random_nonce();
  CHECK(nc != ns);
  CHECK(equal_digests(client_proof("t", nc, ns, 1), client_proof("t", nc, ns, 1)));
  CHECK(!equal_digests(client_proof("t", nc, ns, 1), client_proof("u", nc, ns, 1)));
  CHECK(!equal_digests(client_proof("t", nc, ns, 1), server_proof("t", nc, ns, 1)));
  CHECK(!equal_digests(client_proof("t", nc, ns, 1), client_proof("t", nc, ns, 2)));
}

TEST_CASE("the cluster token comes from the options, LOOM_CLUSTER_TOKEN or a file") {
  const char* old_tok = std::getenv("LOOM_CLUSTER_TOKEN");
  const char* old_file = std::getenv("LOOM_CLUSTER_TOKEN_FILE");
  const std::string saved_tok = old_tok ? old_tok : "", saved_file = old_file ? old_file : "";
  ::unsetenv("LOOM_CLUSTER_TOKEN");
  ::unsetenv("LOOM_CLUSTER_TOKEN_FILE");

  CHECK(!token_from_environment());
  CHECK(resolve_token(std::string("abc")) == std::optional<std::string>("abc"));
  CHECK(!resolve_token(std::string("")));

  ::setenv("LOOM_CLUSTER_TOKEN", "from-env", 1);
  CHECK(resolve_token(std::nullopt) == std::optional<std::string>("from-env"));
  ::unsetenv("LOOM_CLUSTER_TOKEN");

  const std::string path = std::string(LOOM_TEST_BINARY_DIR) + "/token_test_file";
  { std::ofstream(path) << "from-file\n"; }
  ::setenv("LOOM_CLUSTER_TOKEN_FILE", path.c_str(), 1);
  CHECK(token_from_environment() == std::optional<std::string>("from-file"));
  ::setenv("LOOM_CLUSTER_TOKEN_FILE", (path + ".missing").c_str(), 1);
  try {
    (void)token_from_environment();
    FAIL("no error");
  } catch (const not_found_error& e) {
    CHECK(std::string(e.what()).find("token_test_file.missing") != std::string::npos);
  }
  std::remove(path.c_str());

  ::unsetenv("LOOM_CLUSTER_TOKEN_FILE");
  if (old_tok)
    ::setenv("LOOM_CLUSTER_TOKEN", saved_tok.c_str(), 1);
  if (old_file)
    ::setenv("LOOM_CLUSTER_TOKEN_FILE", saved_file.c_str(), 1);
}

TEST_CASE("addresses split into host and port") {
  CHECK(parse_host_port("127.0.0.1:2222").host == "127.0.0.1");
  CHECK(parse_host_port("127.0.0.1:2222").port == 2222);
  CHECK(parse_host_port("[::1]:80").host == "::1");
  CHECK(parse_host_port("localhost:0").port == 0);
  CHECK(join_address("::1", 5) == "[::1]:5");
  CHECK_THROWS_AS(parse_host_port("nohost"), invalid_argument_error);
  CHECK_THROWS_AS(parse_host_port("h:99999"), invalid_argument_error);
  CHECK_THROWS_AS(parse_host_port("h:12x"), invalid_argument_error);
  CHECK_THROWS_AS(parse_host_port(":12"), invalid_argument_error);
}

TEST_CASE("a split message decodes as its head and parts, and its flags are checked") {
  envelope env;
  env.method = "m";
  frame_limits lim;
  lim.max_payloads = 2;
  lim.max_frame_bytes = 1000;
  std::vector<any_tensor> t{any_tensor::from_vector<float>(shape{2}, {1, 2}),
                            any_tensor(dtype::f64, shape{300}),
                            any_tensor::from_vector<std::int32_t>(shape{3}, {7, 8, 9})};
  for (std::size_t i = 0; i < 300; ++i)
    t[1].flat<double>()[i] = static_cast<double>(i) / 3;
  out_frame m;
  const auto bytes = encode_message(m, frame_kind::request, 3, env, t, std::string("meta"), lim);
  CHECK(bytes == 8 + 2400 + 12);
  std::string wire;
  m.for_each_buffer(
      [&](const void* p, std::size_t n) { wire.append(static_cast<const char*>(p), n); });
  // The head: every descriptor and the metadata, no payload bytes.
  auto rest = bytes_of(wire);
  const auto head = decode_frame(rest, lim);
  CHECK(is_split_head(head.header));
  CHECK(head.meta.payloads.size() == 3);
  CHECK(head.meta.payload_bytes == bytes);
  CHECK(head.payloads.empty());
  CHECK(decode_metadata<std::string>(head.user_metadata(), "head") == "meta");
  // The parts: the payloads' bytes in order, each part within the frame limit.
  std::string joined;
  rest = rest.subspan(head.frame_bytes);
  int parts = 0;
  while (!rest.empty()) {
    const auto part = decode_frame(rest, lim);
    CHECK(is_part(part.header));
    CHECK(part.header.request_id == 3);
    CHECK(part.frame_bytes <= lim.max_frame_bytes);
    joined += part.part_bytes;
    rest = rest.subspan(part.frame_bytes);
    ++parts;
  }
  CHECK(parts == 5); // 2420 bytes in parts of 500
  std::string expect;
  for (const auto& x : t)
    expect.append(static_cast<const char*>(x.raw_data()), x.byte_size());
  CHECK(joined == expect);

  // Flags: unknown bits, both at once, closing on a request, flags on a cancel, payloads on a
  // part; closing on a response is its only place, and not with split or part.
  const std::string good = encode_frame(frame_kind::request, 1, env, {});
  for (std::uint16_t flags : {std::uint16_t{8}, std::uint16_t{3}, frame_flag_closing}) {
    std::string f = good;
    net::detail::patch_u16(f, 6, flags);
    CHECK_THROWS_AS(parse_header(bytes_of(f), {}), data_loss_error);
  }
  std::string closing = encode_frame(frame_kind::response, 1, env, {});
  net::detail::patch_u16(closing, 6, frame_flag_closing);
  CHECK(is_closing(parse_header(bytes_of(closing), {})));
  net::detail::patch_u16(closing, 6, frame_flag_closing | frame_flag_split);
  CHECK_THROWS_AS(parse_header(bytes_of(closing), {}), data_loss_error);
  std::string cancel = encode_frame(frame_kind::cancel, 1, env, {});
  net::detail::patch_u16(cancel, 6, frame_flag_split);
  CHECK_THROWS_AS(parse_header(bytes_of(cancel), {}), data_loss_error);
  std::string part_with_payloads = encode_frame(frame_kind::request, 1, env, t);
  net::detail::patch_u16(part_with_payloads, 6, frame_flag_part);
  CHECK_THROWS_AS(parse_header(bytes_of(part_with_payloads), {}), data_loss_error);
  // A split head declaring more than the message limit, before anything is allocated.
  frame_limits tight = lim;
  tight.max_message_bytes = 1000;
  CHECK_THROWS_AS(decode_frame(bytes_of(wire), tight), resource_exhausted_error);
}

TEST_CASE("a connection's writer drops what is pushed after its end of stream, as after its "
          "close") {
  // Written after the write side's shutdown, a frame (a pong, a late reply) would fail with
  // EPIPE, and the close that follows a failed write, with the peer's bytes unread, would be
  // a reset under what the peer had not yet received.
  asio::io_context io;
  transport socket(asio::make_strand(io));
  frame_writer writer(socket);
  writer.end();
  CHECK(writer.push(out_frame(encode_heartbeat(frame_kind::pong))) ==
        frame_writer::pushed::dropped);
  CHECK_FALSE(writer.writing());
  frame_writer closed(socket);
  CHECK(closed.close());
  CHECK(closed.push(out_frame(encode_heartbeat(frame_kind::pong))) ==
        frame_writer::pushed::dropped);
}

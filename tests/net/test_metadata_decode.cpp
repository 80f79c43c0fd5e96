// The cereal-decoded metadata of the loom.* RPCs (runtime/protocol.hpp), decoded as the
// task server and the client decode it (net::decode_metadata, deserialize_graph), against
// the inputs fuzz/rpc_metadata_fuzz found: a few bytes declaring a huge string, vector or
// tensor made the decoder allocate what they declared (terabytes, or gigabytes that
// succeed) before it read an element. Each must now fail with one clear error that names
// the declaration and its offset, having allocated no more than the bytes could fill.
#include <doctest/doctest.h>

#include <loom/api.hpp>
#include <loom/core/bounded_archive.hpp>
#include <loom/net/frame.hpp>
#include <loom/runtime/protocol.hpp>

#include <cstdint>
#include <string>
#include <string_view>

using namespace loom;

namespace {

// Little-endian portable binary, as PortableBinaryOutputArchive writes it: the
// byte-order flag (1: little-endian), then the values.
struct wire {
  std::string bytes = std::string(1, '\x01');
  wire& u8(std::uint8_t v) {
    bytes.push_back(static_cast<char>(v));
    return *this;
  }
  wire& u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i)
      bytes.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  wire& u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i)
      bytes.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
};

template <class T> std::string decode_error(std::string_view bytes) {
  try {
    (void)net::decode_metadata<T>(bytes, "a test frame");
  } catch (const invalid_argument_error& e) {
    return e.what();
  }
  return "(decoded)";
}

// A string_values of one string tensor of `dims` (positions: {0}), as
// run_graph and rendezvous_put carry them.
wire run_graph_with_tensor(std::uint8_t type, std::initializer_list<std::uint64_t> dims) {
  wire w;
  w.u64(7).u64(1);    // handle, step id
  w.u64(1).u32(0);    // positions: {0}
  w.u64(1).u8(1);     // values: one, present
  w.u8(type);         // dtype
  w.u64(dims.size()); // shape's dims
  for (auto d : dims)
    w.u64(d);
  return w;
}

struct with_bool {
  bool flag = false;
  template <class A> void serialize(A& ar) { ar(flag); }
};

} // namespace

TEST_CASE("metadata of every loom.* RPC still decodes as the client and the server encode it") {
  protocol::register_graph_request reg{"graph bytes", {1, 2}, {3}, {4, 5, 6}};
  protocol::rendezvous_put_request put;
  put.step_id = 9;
  put.keys = {"a;b", "c"};
  put.carries_value = {1, 0};
  std::vector<any_tensor> values{any_tensor::from_vector<std::string>(shape{2}, {"x", "yz"}),
                                 any_tensor::from_vector<float>(shape{1}, {1.5f})};
  put.strings = protocol::string_values::take(values);
  protocol::cluster_info_reply info{{{{"ps", {{0, "127.0.0.1:1"}}}}}, "ps", 0, 42, 1};

  std::string bytes;
  net::append_metadata(bytes, reg);
  const auto reg2 = net::decode_metadata<protocol::register_graph_request>(bytes, "t");
  CHECK(reg2.graph == reg.graph);
  CHECK(reg2.targets == reg.targets);
  bytes.clear();
  net::append_metadata(bytes, put);
  auto put2 = net::decode_metadata<protocol::rendezvous_put_request>(bytes, "t");
  CHECK(put2.keys == put.keys);
  CHECK(put2.carries_value == put.carries_value);
  std::move(put2.strings).restore(values);
  REQUIRE(values.size() == 2);
  CHECK(values[0].data<std::string>()[1] == "yz");
  bytes.clear();
  net::append_metadata(bytes, info);
  const auto info2 = net::decode_metadata<protocol::cluster_info_reply>(bytes, "t");
  CHECK(info2.cluster.jobs == info.cluster.jobs);
  CHECK(info2.instance == 42);
}

TEST_CASE("a declared string or vector longer than the metadata is refused before it is "
          "allocated") {
  SUBCASE("register_graph's graph: 10 bytes declaring a 2^48-byte string (the fuzzer's input)") {
    // Byte-order flag 0 (big-endian), then the string's size.
    const std::string found("\x00\x00\x01\xd9\x00\xd9\x00\x00\x00\x84", 10);
    const auto msg = decode_error<protocol::register_graph_request>(found);
    INFO(msg);
    CHECK(msg.find("register_graph_request") != std::string::npos);
    CHECK(
        msg.find("of 520072640593920 element(s) declared at offset 1, but only 1 byte(s) follow") !=
        std::string::npos);
  }
  SUBCASE("reset's containers: 2^40 strings") {
    const auto msg = decode_error<protocol::reset_request>(wire{}.u64(1ull << 40).bytes);
    INFO(msg);
    CHECK(msg.find("1099511627776 element(s) declared at offset 1") != std::string::npos);
  }
  SUBCASE("run_graph's string positions: 2^22 u32 (16 MiB) in 12 bytes") {
    const auto msg =
        decode_error<protocol::run_graph_request>(wire{}.u64(1).u64(2).u64(1ull << 22).bytes);
    CHECK(msg.find("4194304 element(s) declared at offset 17") != std::string::npos);
  }
  SUBCASE("rendezvous_put's keys: 2^20 strings, each of which would be allocated") {
    const auto msg =
        decode_error<protocol::rendezvous_put_request>(wire{}.u64(1).u64(1ull << 20).bytes);
    CHECK(msg.find("declared at offset 9") != std::string::npos);
  }
}

TEST_CASE("a tensor in the metadata is checked against the bytes that follow before it is "
          "allocated") {
  SUBCASE("f64 of 2^26 elements (512 MiB) declared with no element present") {
    const auto msg = decode_error<protocol::run_graph_request>(
        run_graph_with_tensor(static_cast<std::uint8_t>(dtype::f64), {1ull << 26}).bytes);
    INFO(msg);
    CHECK(msg.find("serialized tensor float64[67108864] of 67108864 elements, to start at offset "
                   "55, but only 0 bytes follow") != std::string::npos);
  }
  SUBCASE("dimensions whose product overflows 64 bits") {
    const auto msg = decode_error<protocol::run_graph_request>(
        run_graph_with_tensor(static_cast<std::uint8_t>(dtype::f32),
                              {1ull << 32, 1ull << 32, 1ull << 32})
            .bytes);
    INFO(msg);
    CHECK(msg.find("serialized tensor has an invalid shape") != std::string::npos);
  }
}

TEST_CASE("a bool in the metadata must be 0 or 1") {
  CHECK(net::decode_metadata<with_bool>(wire{}.u8(1).bytes, "t").flag);
  const auto msg = decode_error<with_bool>(wire{}.u8(2).bytes);
  INFO(msg);
  CHECK(msg.find("bool of byte value 2 at offset 1") != std::string::npos);
}

TEST_CASE("register_graph's graph: a node count past its bytes is refused before it is "
          "allocated") {
  // format version 1, then 2^40 nodes.
  const std::string bytes = wire{}.u32(1).u64(1ull << 40).bytes;
  try {
    (void)deserialize_graph(bytes);
    FAIL("decoded");
  } catch (const data_loss_error& e) {
    INFO(std::string(e.what()));
    CHECK(std::string(e.what()).find("1099511627776 element(s) declared at offset 5") !=
          std::string::npos);
  }
}

TEST_CASE("bounded_input_archive reads a big-endian sender's values") {
  // Byte-order flag 0: the values are big-endian.
  const std::string bytes("\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x01\x00\x02", 13);
  const auto v = loom::detail::bounded_decode<std::vector<std::uint16_t>>(bytes);
  CHECK(v == std::vector<std::uint16_t>{1, 2});
}

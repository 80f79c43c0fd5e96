// libFuzzer target for loom's frame decoder (include/loom/net/frame.hpp):
// header, envelope, payload descriptors, payload bytes and the handshake
// records. Every input must either decode or throw a loom::error; anything
// else (a crash, another exception, an oversized allocation, an ASan report)
// is a bug. Built with ASan and UBSan by a clang build (fuzz/CMakeLists.txt); corpus:
// fuzz/corpus/frame_decoder_fuzz; how to run it: docs/wire-protocol.md, "Fuzzing".
#include <loom/net/auth.hpp>
#include <loom/net/frame.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace loom::net;
  const auto bytes = std::as_bytes(std::span<const std::uint8_t>(data, size));
  frame_limits lim;
  lim.max_frame_bytes = 1u << 20; // keep allocations small while fuzzing
  try {
    const auto f = decode_frame(bytes, lim);
    const auto meta = std::as_bytes(std::span<const char>(f.metadata.data(), f.metadata.size()));
    switch (f.header.kind) {
    case frame_kind::hello: (void)decode_hello(meta); break;
    case frame_kind::challenge: (void)decode_challenge(meta); break;
    case frame_kind::auth: (void)decode_auth(meta); break;
    case frame_kind::auth_result: (void)decode_auth_result(meta); break;
    default: (void)f.user_metadata(); break;
    }
  } catch (const loom::error&) {
    // A clear error: fine.
  }
  return 0;
}

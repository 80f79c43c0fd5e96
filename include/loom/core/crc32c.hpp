// CRC-32C (Castagnoli) that can be extended over bytes that come in pieces, as
// TensorFlow's checkpoints need: a string tensor's checksum runs over its lengths, a
// checksum of them and then its strings (core/tensor_bundle.hpp). With SSE4.2 (loom's
// builds target x86-64-v3, which has it) the CPU's crc32 instruction does the work, at
// several GB/s, since a checkpoint's every byte is checksummed on save and on restore;
// elsewhere a byte-wise table (extend_bytewise, also the tests' reference for the
// instruction's). Every checksum of loom's files uses it: TFRecord and event files
// (core/tfrecord.hpp), TF's checkpoints and their LevelDB tables.
#pragma once

#include <loom/core/compiled_once.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace loom::detail::crc32c {

namespace detail {
inline constexpr std::uint32_t reflected_polynomial = 0x82f63b78u;

constexpr std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit)
      c = (c & 1) ? (c >> 1) ^ reflected_polynomial : c >> 1;
    table[i] = c;
  }
  return table;
}
inline constexpr std::array<std::uint32_t, 256> table = make_table();
} // namespace detail

// extend() a byte at a time through the table, whatever the CPU.
inline std::uint32_t extend_bytewise(std::uint32_t crc, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t state = ~crc;
  for (; n > 0; --n, ++p)
    state = detail::table[(state ^ *p) & 0xff] ^ (state >> 8);
  return ~state;
}

// The CRC-32C of (the bytes `crc` is the CRC of) followed by data[0, n).
LOOM_COMPILED_ONCE std::uint32_t extend(std::uint32_t crc, const void* data, std::size_t n);

inline std::uint32_t extend(std::uint32_t crc, std::string_view bytes) {
  return extend(crc, bytes.data(), bytes.size());
}
inline std::uint32_t value(std::string_view bytes) {
  return extend(0, bytes);
}

} // namespace loom::detail::crc32c

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail::crc32c {

LOOM_COMPILED_ONCE std::uint32_t extend(std::uint32_t crc, const void* data, std::size_t n) {
#if defined(__SSE4_2__)
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t state64 = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    state64 = _mm_crc32_u64(state64, word);
  }
  auto state = static_cast<std::uint32_t>(state64);
  for (; n > 0; --n, ++p)
    state = _mm_crc32_u8(state, *p);
  return ~state;
#else
  return extend_bytewise(crc, data, n);
#endif
}

} // namespace loom::detail::crc32c

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// The byte order of loom's frames (frame.hpp): little-endian integers appended to and
// patched in a frame being written, and a bounded reader over bytes received. Every read
// checks the remaining length first, so a length a peer declares can never make a
// decoder allocate more than the (already bounded) input holds.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace loom::net::detail {

LOOM_COMPILED_ONCE void put_u16(std::string& s, std::uint16_t v);
LOOM_COMPILED_ONCE void put_u32(std::string& s, std::uint32_t v);
LOOM_COMPILED_ONCE void put_u64(std::string& s, std::uint64_t v);
inline void patch_u16(std::string& s, std::size_t at, std::uint16_t v) {
  s[at] = static_cast<char>(v & 0xff);
  s[at + 1] = static_cast<char>(v >> 8);
}
LOOM_COMPILED_ONCE void patch_u32(std::string& s, std::size_t at, std::uint32_t v);
LOOM_COMPILED_ONCE std::uint64_t get_le(const unsigned char* p, int n) noexcept;

// Bounds-checked little-endian reader over the metadata bytes. Every read
// checks the remaining length first, so a declared length can never make it
// allocate more than the (already bounded) input holds.
class reader {
public:
  reader(std::span<const std::byte> b, std::string_view what) : b_(b), what_(what) {}

  std::size_t pos() const noexcept { return pos_; }
  std::size_t remaining() const noexcept { return b_.size() - pos_; }

  std::uint64_t uint(int n);
  std::uint8_t u8() { return static_cast<std::uint8_t>(uint(1)); }
  std::uint16_t u16() { return static_cast<std::uint16_t>(uint(2)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(uint(4)); }
  std::uint64_t u64() { return uint(8); }
  std::string str(std::size_t n) {
    need(n);
    std::string s(reinterpret_cast<const char*>(b_.data()) + pos_, n);
    pos_ += n;
    return s;
  }
  void bytes(void* out, std::size_t n) {
    need(n);
    std::memcpy(out, b_.data() + pos_, n);
    pos_ += n;
  }

private:
  void need(std::size_t n) const;
  std::span<const std::byte> b_;
  std::string_view what_;
  std::size_t pos_ = 0;
};

} // namespace loom::net::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net::detail {

LOOM_COMPILED_ONCE void put_u16(std::string& s, std::uint16_t v) {
  const char b[2] = {static_cast<char>(v & 0xff), static_cast<char>(v >> 8)};
  s.append(b, 2);
}

LOOM_COMPILED_ONCE void put_u32(std::string& s, std::uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i)
    b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  s.append(b, 4);
}

LOOM_COMPILED_ONCE void put_u64(std::string& s, std::uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i)
    b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  s.append(b, 8);
}

LOOM_COMPILED_ONCE void patch_u32(std::string& s, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i)
    s[at + static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
}

LOOM_COMPILED_ONCE std::uint64_t get_le(const unsigned char* p, int n) noexcept {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

LOOM_COMPILED_ONCE std::uint64_t reader::uint(int n) {
  need(static_cast<std::size_t>(n));
  const auto v = get_le(reinterpret_cast<const unsigned char*>(b_.data()) + pos_, n);
  pos_ += static_cast<std::size_t>(n);
  return v;
}

LOOM_COMPILED_ONCE void reader::need(std::size_t n) const {
  if (n > remaining())
    throw data_loss_error("corrupt " + std::string(what_) + ": needs " + std::to_string(n) +
                          " more byte(s) at offset " + std::to_string(pos_) + ", only " +
                          std::to_string(remaining()) + " left");
}

} // namespace loom::net::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// TFRecord framing, the container of TensorBoard's event files (TF's
// io/record_writer.cc):
//
//   uint64  length of the data, little-endian
//   uint32  masked CRC-32C of those 8 bytes
//   bytes   data
//   uint32  masked CRC-32C of the data
//
// The CRC-32C (Castagnoli) is core/crc32c.hpp's, the one every checksum of loom's
// files uses (the CPU's crc32 instruction where there is one). The mask is TF's
// (core/lib/hash/crc32c.h): a CRC of data that holds CRCs is weak, so the
// stored value is rotated right by 15 bits plus a constant.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/crc32c.hpp>
#include <loom/core/error.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::tfrecord {

inline constexpr std::uint32_t crc_mask_delta = 0xa282ead8u;

inline std::uint32_t mask(std::uint32_t crc) noexcept {
  return ((crc >> 15) | (crc << 17)) + crc_mask_delta;
}
inline std::uint32_t unmask(std::uint32_t masked) noexcept {
  const std::uint32_t rot = masked - crc_mask_delta;
  return (rot >> 17) | (rot << 15);
}

inline std::uint32_t masked_crc32c(std::string_view bytes) {
  return mask(loom::detail::crc32c::value(bytes));
}

namespace detail {
template <class U> void append_le(std::string& out, U v) {
  for (std::size_t i = 0; i < sizeof(U); ++i)
    out.push_back(static_cast<char>(v >> (8 * i) & 0xff));
}
template <class U> U read_le(std::string_view in) {
  U v = 0;
  for (std::size_t i = 0; i < sizeof(U); ++i)
    v |= static_cast<U>(static_cast<U>(static_cast<std::uint8_t>(in[i])) << (8 * i));
  return v;
}
} // namespace detail

inline constexpr std::size_t header_bytes = 12; // length + its CRC
inline constexpr std::size_t footer_bytes = 4;  // the data's CRC

// One record, framed.
LOOM_COMPILED_ONCE std::string frame(std::string_view data);

// Every record of a file's bytes, each CRC checked. `what` (the file's name)
// is in the errors: a torn last record (a writer that died mid-write) or a
// CRC that does not match is data_loss_error naming the record and offset.
LOOM_COMPILED_ONCE std::vector<std::string> read_all(std::string_view bytes,
                                                     const std::string& what);

} // namespace loom::tfrecord

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::tfrecord {

LOOM_COMPILED_ONCE std::string frame(std::string_view data) {
  std::string out;
  out.reserve(header_bytes + data.size() + footer_bytes);
  detail::append_le(out, static_cast<std::uint64_t>(data.size()));
  detail::append_le(out, masked_crc32c(std::string_view(out).substr(0, 8)));
  out.append(data);
  detail::append_le(out, masked_crc32c(data));
  return out;
}

LOOM_COMPILED_ONCE std::vector<std::string> read_all(std::string_view bytes,
                                                     const std::string& what) {
  std::vector<std::string> records;
  std::size_t at = 0;
  while (at < bytes.size()) {
    const std::string where =
        what + ": record " + std::to_string(records.size()) + " at byte " + std::to_string(at);
    if (bytes.size() - at < header_bytes)
      throw data_loss_error(where + ": the file ends inside the record's header");
    const std::string_view header = bytes.substr(at, header_bytes);
    if (masked_crc32c(header.substr(0, 8)) != detail::read_le<std::uint32_t>(header.substr(8)))
      throw data_loss_error(where + ": the length's CRC does not match");
    const auto length = detail::read_le<std::uint64_t>(header);
    if (length > bytes.size() - at - header_bytes ||
        bytes.size() - at - header_bytes - length < footer_bytes)
      throw data_loss_error(where + ": the record declares " + std::to_string(length) +
                            " bytes, more than the file holds");
    const std::string_view data = bytes.substr(at + header_bytes, length);
    if (masked_crc32c(data) !=
        detail::read_le<std::uint32_t>(bytes.substr(at + header_bytes + length)))
      throw data_loss_error(where + ": the data's CRC does not match");
    records.emplace_back(data);
    at += header_bytes + length + footer_bytes;
  }
  return records;
}

} // namespace loom::tfrecord

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

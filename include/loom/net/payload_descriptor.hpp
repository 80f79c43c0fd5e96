// Payload descriptors (frame.hpp; docs/wire-protocol.md): one per payload in the
// metadata, after the envelope, saying what its raw bytes after the metadata are:
//
//   dtype u8, rank u8, reserved u16, rank x dim i64, byte length u64
//
// parse_descriptors() checks each against the limits, and that its length is its
// shape's, before a receiver allocates a tensor for it; validate_payload_bytes() checks
// the bytes themselves where a dtype constrains them. String tensors are never payloads
// (their bytes are not contiguous): encoding one throws invalid_argument_error, and a
// descriptor naming dtype string is data loss.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/dtype.hpp>
#include <loom/core/error.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/tensor.hpp>
#include <loom/net/wire_bytes.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace loom::net {

inline constexpr int max_payload_rank = 32;

// One payload as the frame describes it.
struct payload_info {
  dtype type = dtype::f32;
  loom::shape shape;
  std::uint64_t bytes = 0;
};

// Appends the descriptors of `payloads`; returns their bytes in all. Throws
// invalid_argument_error for a string or empty tensor, or one over max_payload_rank.
LOOM_COMPILED_ONCE std::uint64_t append_descriptors(std::string& out,
                                                    std::span<const any_tensor> payloads);

// Reads `n` descriptors into `out`; returns their bytes in all. Each is checked as it
// is read: against `limit` bytes for the `unit` ("frame" or "message") of which `before`
// bytes are taken already, and its length against its shape's. Throws data_loss_error or
// resource_exhausted_error.
LOOM_COMPILED_ONCE std::uint64_t parse_descriptors(detail::reader& r, std::uint32_t n,
                                                   std::uint64_t limit, std::uint64_t before,
                                                   const char* unit,
                                                   std::vector<payload_info>& out);

// Checks payload bytes whose values are constrained (bool must be 0 or 1).
LOOM_COMPILED_ONCE void validate_payload_bytes(const payload_info& p, const void* data,
                                               std::size_t index);

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net {

LOOM_COMPILED_ONCE std::uint64_t append_descriptors(std::string& out,
                                                    std::span<const any_tensor> payloads) {
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < payloads.size(); ++i) {
    const auto& t = payloads[i];
    if (t.empty())
      throw invalid_argument_error("payload " + std::to_string(i) + " is an empty tensor");
    if (t.type() == dtype::string)
      throw invalid_argument_error(
          "payload " + std::to_string(i) + " is a string tensor (" + t.describe() +
          "); strings are not sent as payloads: put them in the metadata struct");
    if (t.rank() > max_payload_rank)
      throw invalid_argument_error("payload " + std::to_string(i) + " has rank " +
                                   std::to_string(t.rank()) + " (limit " +
                                   std::to_string(max_payload_rank) + ")");
    out.push_back(static_cast<char>(t.type()));
    out.push_back(static_cast<char>(t.rank()));
    detail::put_u16(out, 0);
    for (auto d : t.shape().dims())
      detail::put_u64(out, static_cast<std::uint64_t>(d));
    detail::put_u64(out, t.byte_size());
    total += t.byte_size();
  }
  return total;
}

LOOM_COMPILED_ONCE std::uint64_t parse_descriptors(detail::reader& r, std::uint32_t n,
                                                   std::uint64_t limit, std::uint64_t before,
                                                   const char* unit,
                                                   std::vector<payload_info>& out) {
  std::uint64_t total = 0;
  out.reserve(std::min<std::size_t>(n, r.remaining() / 12));
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::string where = "payload " + std::to_string(i);
    const std::uint8_t t = r.u8();
    if (t > static_cast<std::uint8_t>(dtype::string))
      throw data_loss_error(where + ": unknown dtype tag " + std::to_string(t));
    if (t == static_cast<std::uint8_t>(dtype::string))
      throw data_loss_error(where + ": string tensors are not sent as payloads");
    const std::uint8_t rank = r.u8();
    if (rank > max_payload_rank)
      throw data_loss_error(where + ": rank " + std::to_string(rank) + " (limit " +
                            std::to_string(max_payload_rank) + ")");
    (void)r.u16(); // reserved
    const auto type = static_cast<dtype>(t);
    const std::uint64_t elem = size_of(type);
    std::vector<std::int64_t> dims(rank);
    std::uint64_t count = 1;
    const std::uint64_t cap = limit / elem; // most elements any payload may hold
    for (std::uint8_t d = 0; d < rank; ++d) {
      const auto v = static_cast<std::int64_t>(r.u64());
      if (v < 0)
        throw data_loss_error(where + ": negative dimension " + std::to_string(v));
      const auto uv = static_cast<std::uint64_t>(v);
      if (uv != 0 && count > cap / uv)
        throw resource_exhausted_error(where + ": shape too large for the " + unit + " limit of " +
                                       std::to_string(limit) + " bytes");
      count *= uv;
      dims[d] = v;
    }
    const std::uint64_t bytes = r.u64();
    if (bytes != count * elem)
      throw data_loss_error(where + ": declares " + std::to_string(bytes) + " bytes, but " +
                            std::string(to_string(type)) + " of " + std::to_string(count) +
                            " elements needs " + std::to_string(count * elem));
    total += bytes; // each <= limit (<= 2^63), checked as it grows: no overflow
    if (before + total > limit)
      throw resource_exhausted_error(
          std::string(unit) + " of at least " + std::to_string(before + total) +
          " bytes exceeds the limit of " + std::to_string(limit) + " bytes");
    out.push_back(payload_info{type, loom::shape(std::move(dims)), bytes});
  }
  return total;
}

LOOM_COMPILED_ONCE void validate_payload_bytes(const payload_info& p, const void* data,
                                               std::size_t index) {
  if (p.type != dtype::boolean)
    return;
  const auto* b = static_cast<const unsigned char*>(data);
  for (std::uint64_t i = 0; i < p.bytes; ++i)
    if (b[i] > 1)
      throw data_loss_error("payload " + std::to_string(index) + ": bool element " +
                            std::to_string(i) + " has byte value " + std::to_string(b[i]));
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

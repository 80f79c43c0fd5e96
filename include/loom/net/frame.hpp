// Frames of loom's message layer (docs/wire-protocol.md).
//
// A frame is a fixed 24-byte header, then `metadata_bytes` of metadata, then
// `payload_count` tensor payloads as raw bytes:
//
//   header   magic "LOOM" | version u8 | kind u8 | flags u16 | request id u64 |
//            metadata bytes u32 | payload count u32            (little-endian)
//   metadata (request, response, cancel)
//            envelope: method (u16 length + bytes), status u32 (0 = ok, else
//            1 + loom::error_code), message (u32 length + bytes), timeout in
//            microseconds u64;
//            one descriptor per payload: dtype u8, rank u8, reserved u16,
//            rank x dim i64, byte length u64;
//            the caller's metadata: its struct in cereal portable binary.
//            (handshake kinds carry their own fixed records; see auth.hpp)
//   payloads the tensors' bytes, back to back, each exactly as described.
//
// One header per part of the format:
// - frame_header.hpp: the header's layout, kinds, flags and limits, and its checks;
// - envelope.hpp: the layer's own metadata, and what a status means (loom's exceptions);
// - payload_descriptor.hpp: a payload's descriptor, its checks, and a payload's bytes';
// - frame_metadata.hpp: the metadata as a whole, the caller's (cereal) included;
// - out_frame.hpp: a message to send, with its gather list, split into a head and parts
//   where it passes the per-frame limits;
// - wire_bytes.hpp: the little-endian integers and the bounded reader under them all.
//
// Everything here is pure (no sockets): parse_header() and parse_metadata()
// check every length against frame_limits BEFORE anything is allocated, so a
// receiver can allocate each destination tensor from the descriptors and read
// the bytes straight into its buffer. decode_frame() runs the whole decoder
// over one byte span (the fuzz target and the tests use it); encode_frame() is
// its inverse for one frame.
//
// Strings: string tensors are never payloads (their bytes are not contiguous);
// put strings in the metadata struct. Encoding a string tensor throws
// invalid_argument_error, and a descriptor naming dtype string is data loss.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/net/envelope.hpp>
#include <loom/net/frame_header.hpp>
#include <loom/net/frame_metadata.hpp>
#include <loom/net/out_frame.hpp>
#include <loom/net/payload_descriptor.hpp>
#include <loom/net/wire_bytes.hpp>

#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::net {

// A whole frame decoded from one contiguous byte span.
struct decoded_frame {
  frame_header header;
  frame_meta meta;                  // empty for handshake kinds
  std::string metadata;             // the raw metadata bytes
  std::vector<any_tensor> payloads; // empty for a split head (its descriptors are in meta)
  std::string part_bytes;           // a part's bytes
  std::size_t frame_bytes = 0;      // bytes the frame occupies in the input

  std::string_view user_metadata() const {
    return std::string_view(metadata).substr(meta.user_offset, meta.user_bytes);
  }
};

// Runs the decoder over `bytes`, which must hold at least one whole frame.
// Throws a loom::error (data_loss, unimplemented, resource_exhausted) on any
// malformed input; never allocates more than the input and the limits allow.
LOOM_COMPILED_ONCE decoded_frame decode_frame(std::span<const std::byte> bytes,
                                              const frame_limits& lim = {});

// A whole frame in one byte string (tests and the fuzz corpus).
template <class Meta = empty>
std::string encode_frame(frame_kind kind, std::uint64_t request_id, const envelope& env,
                         std::span<const any_tensor> payloads, const Meta& meta = {}) {
  std::string out;
  encode_head(out, kind, request_id, env, payloads, meta);
  for (const auto& t : payloads)
    out.append(static_cast<const char*>(t.raw_data()), t.byte_size());
  return out;
}

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net {

LOOM_COMPILED_ONCE decoded_frame decode_frame(std::span<const std::byte> bytes,
                                              const frame_limits& lim) {
  decoded_frame f;
  f.header = parse_header(bytes, lim);
  const std::size_t avail = bytes.size() - header_size;
  if (f.header.metadata_bytes > avail)
    throw data_loss_error("truncated frame: " + std::to_string(f.header.metadata_bytes) +
                          " metadata bytes declared, " + std::to_string(avail) + " present");
  const auto meta = bytes.subspan(header_size, f.header.metadata_bytes);
  f.metadata.assign(reinterpret_cast<const char*>(meta.data()), meta.size());
  std::size_t pos = header_size + meta.size();
  if (!is_handshake_kind(f.header.kind)) {
    f.meta = parse_metadata(f.header, meta, lim);
    if (is_split_head(f.header)) { // its payloads come in the parts
      f.frame_bytes = pos;
      return f;
    }
    if (f.meta.payload_bytes > bytes.size() - pos)
      throw data_loss_error("truncated frame: " + std::to_string(f.meta.payload_bytes) +
                            " payload bytes declared, " + std::to_string(bytes.size() - pos) +
                            " present");
    if (is_part(f.header)) { // raw bytes of a split message (part_bytes)
      f.part_bytes.assign(reinterpret_cast<const char*>(bytes.data() + pos), f.meta.payload_bytes);
      f.frame_bytes = pos + f.meta.payload_bytes;
      return f;
    }
    f.payloads.reserve(f.meta.payloads.size());
    for (std::size_t i = 0; i < f.meta.payloads.size(); ++i) {
      const auto& p = f.meta.payloads[i];
      validate_payload_bytes(p, bytes.data() + pos, i);
      any_tensor t(p.type, p.shape);
      if (p.bytes)
        std::memcpy(t.raw_data(), bytes.data() + pos, p.bytes);
      pos += p.bytes;
      f.payloads.push_back(std::move(t));
    }
  }
  f.frame_bytes = pos;
  return f;
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// A frame's metadata (frame.hpp; docs/wire-protocol.md), for request, response and cancel
// frames: the envelope (envelope.hpp), one descriptor per payload (payload_descriptor.hpp),
// then the caller's metadata, its struct in cereal portable binary. (Handshake kinds carry
// their own fixed records: auth.hpp. A part of a split message carries an envelope and
// its byte count: out_frame.hpp.)
//
// parse_metadata() checks it all against the limits before a receiver allocates anything;
// encode_head() writes a frame's header and metadata, the payloads' bytes left where they
// are. The caller's metadata is decoded only when the caller asks (decode_metadata),
// with an archive that never allocates more than the bytes received can fill.
#pragma once

#include <loom/core/bounded_archive.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/net/envelope.hpp>
#include <loom/net/frame_header.hpp>
#include <loom/net/payload_descriptor.hpp>
#include <loom/net/wire_bytes.hpp>

#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/string.hpp> // the common metadata members, so callers need not
#include <cereal/types/vector.hpp> // include them for a std::string or std::vector field

#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <ostream>
#include <span>
#include <streambuf>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <vector>

namespace loom::net {

// What parse_metadata() found: the envelope, the payload descriptors, and where
// the caller's metadata lies inside the metadata bytes.
struct frame_meta {
  envelope env;
  std::vector<payload_info> payloads;
  std::size_t user_offset = 0;
  std::size_t user_bytes = 0;
  std::uint64_t payload_bytes = 0; // sum of payloads[i].bytes; a part's n
};

namespace detail {

// A streambuf appending to a std::string (cereal writes the caller's metadata
// straight after the envelope, without an intermediate buffer).
class string_appender : public std::streambuf {
public:
  explicit string_appender(std::string& s) : s_(s) {}

protected:
  std::streamsize xsputn(const char* p, std::streamsize n) override {
    s_.append(p, static_cast<std::size_t>(n));
    return n;
  }
  int_type overflow(int_type c) override {
    if (!traits_type::eq_int_type(c, traits_type::eof()))
      s_.push_back(traits_type::to_char_type(c));
    return traits_type::not_eof(c);
  }

private:
  std::string& s_;
};

} // namespace detail

// No metadata: zero bytes on the wire, no cereal involved.
struct empty {
  template <class Archive> void serialize(Archive&) {}
};

// Metadata that is already encoded (sent as is, e.g. forwarded bytes).
struct raw_metadata {
  std::string_view bytes;
};

// Appends the caller's metadata in cereal portable binary.
template <class T> void append_metadata(std::string& out, const T& value) {
  if constexpr (std::is_same_v<T, empty>) {
    return;
  } else if constexpr (std::is_same_v<T, raw_metadata>) {
    out.append(value.bytes);
  } else {
    detail::string_appender buf(out);
    std::ostream os(&buf);
    cereal::PortableBinaryOutputArchive ar(os);
    ar(value);
  }
}

// Decodes the caller's metadata; `what` names the frame in the error.
template <class T> T decode_metadata(std::string_view bytes, const std::string& what) {
  if constexpr (std::is_same_v<T, empty>) {
    return T{};
  } else {
    // bounded_input_archive, not cereal's PortableBinaryInputArchive: a peer's
    // declared sizes must not allocate more than the bytes it sent can fill.
    T value{};
    try {
      loom::detail::bounded_input_archive ar(bytes);
      ar(value);
    } catch (const std::exception& e) {
      throw invalid_argument_error("cannot decode the metadata of " + what + " (" +
                                   std::to_string(bytes.size()) + " bytes) as " + typeid(T).name() +
                                   ": " + e.what());
    }
    return value;
  }
}

// Parses the metadata of a request, response or cancel frame: the envelope,
// then one descriptor per payload, checking each against the limits and the
// total frame size (a split head's: the message limits) before the caller
// allocates anything. A part's metadata is its envelope and its byte count.
LOOM_COMPILED_ONCE frame_meta parse_metadata(const frame_header& h, std::span<const std::byte> meta,
                                             const frame_limits& lim);

// Encodes header + envelope + descriptors + the caller's metadata into `out`
// (cleared first); the payload bytes are NOT copied: send them from the tensors.
// Returns the number of payload bytes that follow.
template <class Meta>
std::uint64_t encode_head(std::string& out, frame_kind kind, std::uint64_t request_id,
                          const envelope& env, std::span<const any_tensor> payloads,
                          const Meta& meta) {
  out.clear();
  if (payloads.size() > std::numeric_limits<std::uint32_t>::max())
    throw invalid_argument_error("too many payloads");
  begin_head(out, kind, request_id, static_cast<std::uint32_t>(payloads.size()));
  append_envelope(out, env);
  const auto total = append_descriptors(out, payloads);
  append_metadata(out, meta);
  finish_head(out, 0);
  return total;
}

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net {

LOOM_COMPILED_ONCE frame_meta parse_metadata(const frame_header& h, std::span<const std::byte> meta,
                                             const frame_limits& lim) {
  if (is_handshake_kind(h.kind))
    throw internal_error("parse_metadata called on a handshake frame");
  if (meta.size() != h.metadata_bytes)
    throw data_loss_error("frame metadata is " + std::to_string(meta.size()) +
                          " bytes, the header declares " + std::to_string(h.metadata_bytes));
  detail::reader r(meta, "frame metadata");
  frame_meta m;
  m.env = parse_envelope(r, lim);

  const std::uint64_t fixed = header_size + h.metadata_bytes;
  if (is_part(h)) {
    const std::uint64_t n = r.u64();
    if (r.remaining() != 0)
      throw data_loss_error("a part frame with " + std::to_string(r.remaining()) +
                            " metadata bytes after its length");
    if (n == 0)
      throw data_loss_error("a part frame of 0 bytes");
    if (n > lim.max_frame_bytes - fixed)
      throw resource_exhausted_error("part frame of " + std::to_string(fixed + n) +
                                     " bytes exceeds the limit of " +
                                     std::to_string(lim.max_frame_bytes) + " bytes");
    m.payload_bytes = n;
    m.user_offset = r.pos();
    return m;
  }
  // A frame's payloads follow it; a split head's come in parts, bounded by the message limit.
  const bool split = is_split_head(h);
  const std::uint64_t limit = split ? lim.max_message_bytes : lim.max_frame_bytes;
  const std::uint64_t before = split ? 0 : fixed;
  const char* unit = split ? "message" : "frame";
  m.payload_bytes = parse_descriptors(r, h.payload_count, limit, before, unit, m.payloads);
  m.user_offset = r.pos();
  m.user_bytes = r.remaining();
  return m;
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

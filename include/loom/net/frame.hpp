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
// A message over the per-frame limits (more than max_payloads tensors, or more
// than max_frame_bytes in all) travels as a split head and its parts, back to
// back on one connection (flags below): the head carries the envelope, every
// descriptor and the caller's metadata, bounded by the message limits instead;
// each part carries the next bytes of the payloads, so a receiver still reads
// them straight into the destination tensors, allocating each as its bytes come.
//
// Everything here is pure (no sockets): parse_header() and parse_metadata()
// check every length against frame_limits BEFORE anything is allocated, so a
// receiver can allocate each destination tensor from the descriptors and read
// the bytes straight into its buffer. decode_frame() runs the whole decoder
// over one byte span (the fuzz target and the tests use it).
//
// Strings: string tensors are never payloads (their bytes are not contiguous);
// put strings in the metadata struct. Encoding a string tensor throws
// invalid_argument_error, and a descriptor naming dtype string is data loss.
#pragma once

#include <loom/core/bounded_archive.hpp>
#include <loom/core/dtype.hpp>
#include <loom/core/error.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/tensor.hpp>

#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/string.hpp> // the common metadata members, so callers need not
#include <cereal/types/vector.hpp> // include them for a std::string or std::vector field

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
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

inline constexpr std::uint8_t protocol_version = 1;
inline constexpr std::size_t header_size = 24;
inline constexpr std::array<char, 4> frame_magic = {'L', 'O', 'O', 'M'};
inline constexpr int max_payload_rank = 32;

enum class frame_kind : std::uint8_t {
  request = 1,
  response = 2,
  cancel = 3,
  // Liveness (cluster/liveness_settings.hpp): a header alone (request id 0, no metadata, no
  // payloads), after the handshake. A ping is answered with a pong by the connection itself,
  // on its io thread, never by a handler; both only show that the peer is alive.
  ping = 4,
  pong = 5,
  hello = 16,       // client -> server: role, client id, nonce
  challenge = 17,   // server -> client: nonce, server proof
  auth = 18,        // client -> server: client proof
  auth_result = 19, // server -> client: ok or an error
};

// Flags of request and response frames (0 on every other kind).
//   split:   the head of a split message; no payload bytes follow it.
//   part:    metadata is an envelope (empty method) and u64 n; the n bytes that follow are
//            the next bytes of the split message's payloads, concatenated in order.
//   closing: on a response only: the server closes the connection after it (it refused a
//            request it could not read whole, and discards what follows on the connection),
//            so the client sends nothing more on it. Without it the client's next call could
//            go out on the connection before its close arrives, and fail as lost.
inline constexpr std::uint16_t frame_flag_split = 0x1;
inline constexpr std::uint16_t frame_flag_part = 0x2;
inline constexpr std::uint16_t frame_flag_closing = 0x4;

// Bytes of payload a part carries (less where the frame limit is lower).
inline constexpr std::uint64_t split_part_bytes = std::uint64_t{64} << 20;

constexpr bool is_known_kind(std::uint8_t k) noexcept {
  return (k >= 1 && k <= 5) || (k >= 16 && k <= 19);
}
constexpr bool is_handshake_kind(frame_kind k) noexcept {
  return static_cast<std::uint8_t>(k) >= 16;
}

constexpr std::string_view to_string(frame_kind k) noexcept {
  switch (k) {
  case frame_kind::request: return "request";
  case frame_kind::response: return "response";
  case frame_kind::cancel: return "cancel";
  case frame_kind::ping: return "ping";
  case frame_kind::pong: return "pong";
  case frame_kind::hello: return "hello";
  case frame_kind::challenge: return "challenge";
  case frame_kind::auth: return "auth";
  case frame_kind::auth_result: return "auth_result";
  }
  return "?";
}

// Bounds every receiver enforces before it allocates anything. The per-frame bounds
// decide when a sender splits a message; the message bounds are what one message may
// carry in all (a split message's tensors are allocated as their bytes arrive).
struct frame_limits {
  std::uint32_t max_metadata_bytes = 64u << 20;             // 64 MiB
  std::uint32_t max_payloads = 1024;                        // tensors per frame
  std::uint64_t max_frame_bytes = 1ull << 30;               // header + metadata + payloads: 1 GiB
  std::uint32_t max_method_bytes = 256;                     // method name
  std::uint32_t max_handshake_bytes = 1024;                 // metadata of a handshake frame
  std::uint32_t max_message_payloads = 1u << 20;            // tensors per (split) message
  std::uint64_t max_message_bytes = std::uint64_t{1} << 40; // payload bytes per message: 1 TiB
};

struct frame_header {
  std::uint8_t version = protocol_version;
  frame_kind kind = frame_kind::request;
  std::uint16_t flags = 0;
  std::uint64_t request_id = 0;
  std::uint32_t metadata_bytes = 0;
  std::uint32_t payload_count = 0;
};

// One payload as the frame describes it.
struct payload_info {
  dtype type = dtype::f32;
  loom::shape shape;
  std::uint64_t bytes = 0;
};

// The layer's own part of the metadata of request, response and cancel frames.
struct envelope {
  std::string method;
  std::uint32_t status = 0; // 0: ok; otherwise 1 + static_cast<uint32_t>(error_code)
  std::string message;      // the error message when status != 0
  std::uint64_t timeout_us = 0;

  bool ok() const noexcept { return status == 0; }
  error_code code() const noexcept { return static_cast<error_code>(status - 1); }
};

constexpr bool is_split_head(const frame_header& h) noexcept {
  return (h.flags & frame_flag_split) != 0;
}
constexpr bool is_part(const frame_header& h) noexcept {
  return (h.flags & frame_flag_part) != 0;
}
constexpr bool is_closing(const frame_header& h) noexcept {
  return (h.flags & frame_flag_closing) != 0;
}

// What parse_metadata() found: the envelope, the payload descriptors, and where
// the caller's metadata lies inside the metadata bytes.
struct frame_meta {
  envelope env;
  std::vector<payload_info> payloads;
  std::size_t user_offset = 0;
  std::size_t user_bytes = 0;
  std::uint64_t payload_bytes = 0; // sum of payloads[i].bytes; a part's n
};

inline constexpr std::uint32_t max_status =
    static_cast<std::uint32_t>(error_code::unauthenticated) + 1;

inline std::uint32_t status_of(error_code c) noexcept {
  return static_cast<std::uint32_t>(c) + 1;
}

// Throws the loom error subclass matching `code` (so callers can catch e.g. unavailable_error).
[[noreturn]] inline void throw_error(error_code code, const std::string& message) {
  switch (code) {
  case error_code::cancelled: throw cancelled_error(message);
  case error_code::invalid_argument: throw invalid_argument_error(message);
  case error_code::deadline_exceeded: throw deadline_exceeded_error(message);
  case error_code::not_found: throw not_found_error(message);
  case error_code::already_exists: throw already_exists_error(message);
  case error_code::permission_denied: throw permission_denied_error(message);
  case error_code::resource_exhausted: throw resource_exhausted_error(message);
  case error_code::failed_precondition: throw failed_precondition_error(message);
  case error_code::aborted: throw aborted_error(message);
  case error_code::out_of_range: throw out_of_range_error(message);
  case error_code::unimplemented: throw unimplemented_error(message);
  case error_code::internal: throw internal_error(message);
  case error_code::unavailable: throw unavailable_error(message);
  case error_code::data_loss: throw data_loss_error(message);
  case error_code::unauthenticated: throw unauthenticated_error(message);
  case error_code::unknown: break;
  }
  throw error(error_code::unknown, message);
}

inline std::exception_ptr make_error(error_code code, const std::string& message) {
  try {
    throw_error(code, message);
  } catch (...) {
    return std::current_exception();
  }
}

namespace detail {

inline void put_u16(std::string& s, std::uint16_t v) {
  const char b[2] = {static_cast<char>(v & 0xff), static_cast<char>(v >> 8)};
  s.append(b, 2);
}
inline void put_u32(std::string& s, std::uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i)
    b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  s.append(b, 4);
}
inline void put_u64(std::string& s, std::uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i)
    b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  s.append(b, 8);
}
inline void patch_u16(std::string& s, std::size_t at, std::uint16_t v) {
  s[at] = static_cast<char>(v & 0xff);
  s[at + 1] = static_cast<char>(v >> 8);
}
inline void patch_u32(std::string& s, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i)
    s[at + static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
}
inline std::uint64_t get_le(const unsigned char* p, int n) noexcept {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

// Bounds-checked little-endian reader over the metadata bytes. Every read
// checks the remaining length first, so a declared length can never make it
// allocate more than the (already bounded) input holds.
class reader {
public:
  reader(std::span<const std::byte> b, std::string_view what) : b_(b), what_(what) {}

  std::size_t pos() const noexcept { return pos_; }
  std::size_t remaining() const noexcept { return b_.size() - pos_; }

  std::uint64_t uint(int n) {
    need(static_cast<std::size_t>(n));
    const auto v = get_le(reinterpret_cast<const unsigned char*>(b_.data()) + pos_, n);
    pos_ += static_cast<std::size_t>(n);
    return v;
  }
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
  void need(std::size_t n) const {
    if (n > remaining())
      throw data_loss_error("corrupt " + std::string(what_) + ": needs " + std::to_string(n) +
                            " more byte(s) at offset " + std::to_string(pos_) + ", only " +
                            std::to_string(remaining()) + " left");
  }
  std::span<const std::byte> b_;
  std::string_view what_;
  std::size_t pos_ = 0;
};

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
      bounded_input_archive ar(bytes);
      ar(value);
    } catch (const std::exception& e) {
      throw invalid_argument_error("cannot decode the metadata of " + what + " (" +
                                   std::to_string(bytes.size()) + " bytes) as " + typeid(T).name() +
                                   ": " + e.what());
    }
    return value;
  }
}

// ---------------------------------------------------------------------------
// Decoding (pure, bounded)
// ---------------------------------------------------------------------------

// True when the bytes start with the magic (then bytes 8..15 are a request id).
inline bool has_magic(std::span<const std::byte> b) noexcept {
  return b.size() >= 4 && std::memcmp(b.data(), frame_magic.data(), 4) == 0;
}

// The request id of a header whose other fields may be invalid (for error replies).
inline std::uint64_t peek_request_id(std::span<const std::byte> b) noexcept {
  if (b.size() < 16)
    return 0;
  return detail::get_le(reinterpret_cast<const unsigned char*>(b.data()) + 8, 8);
}

// Parses and validates the fixed header. Throws data_loss_error (not a loom
// frame), unimplemented_error (unknown version or kind) or
// resource_exhausted_error (a declared length over the limits).
inline frame_header parse_header(std::span<const std::byte> b, const frame_limits& lim) {
  if (b.size() < header_size)
    throw data_loss_error("truncated frame header: " + std::to_string(b.size()) + " of " +
                          std::to_string(header_size) + " bytes");
  if (!has_magic(b))
    throw data_loss_error("not a loom frame (bad magic)");
  const auto* p = reinterpret_cast<const unsigned char*>(b.data());
  frame_header h;
  h.version = p[4];
  if (h.version != protocol_version)
    throw unimplemented_error("frame version " + std::to_string(h.version) +
                              " is not supported (this build speaks version " +
                              std::to_string(protocol_version) + ")");
  if (!is_known_kind(p[5]))
    throw unimplemented_error("unknown frame kind " + std::to_string(p[5]));
  h.kind = static_cast<frame_kind>(p[5]);
  h.flags = static_cast<std::uint16_t>(detail::get_le(p + 6, 2));
  h.request_id = detail::get_le(p + 8, 8);
  h.metadata_bytes = static_cast<std::uint32_t>(detail::get_le(p + 16, 4));
  h.payload_count = static_cast<std::uint32_t>(detail::get_le(p + 20, 4));
  if (h.flags != 0) {
    if (h.kind != frame_kind::request && h.kind != frame_kind::response)
      throw data_loss_error("a " + std::string(to_string(h.kind)) + " frame with flags " +
                            std::to_string(h.flags) + " (must be 0)");
    const std::uint16_t kind_flags = h.flags & static_cast<std::uint16_t>(~frame_flag_closing);
    if (kind_flags != 0 && kind_flags != frame_flag_split && kind_flags != frame_flag_part)
      throw data_loss_error("unknown frame flags " + std::to_string(h.flags));
    if (is_closing(h) && (h.kind != frame_kind::response || kind_flags != 0))
      throw data_loss_error("frame flags " + std::to_string(h.flags) +
                            ": only a whole response may say that the connection closes");
    if (is_part(h) && h.payload_count != 0)
      throw data_loss_error("a part frame declares " + std::to_string(h.payload_count) +
                            " payloads (must be 0)");
  }
  if ((h.kind == frame_kind::ping || h.kind == frame_kind::pong) &&
      (h.metadata_bytes != 0 || h.payload_count != 0))
    throw data_loss_error("a " + std::string(to_string(h.kind)) + " frame declares " +
                          std::to_string(h.metadata_bytes) + " metadata bytes and " +
                          std::to_string(h.payload_count) + " payloads (must be 0 and 0)");
  if (is_handshake_kind(h.kind)) {
    if (h.payload_count != 0)
      throw data_loss_error("a " + std::string(to_string(h.kind)) + " frame declares " +
                            std::to_string(h.payload_count) + " payloads (must be 0)");
    if (h.metadata_bytes > lim.max_handshake_bytes)
      throw resource_exhausted_error("a " + std::string(to_string(h.kind)) + " frame declares " +
                                     std::to_string(h.metadata_bytes) + " metadata bytes (limit " +
                                     std::to_string(lim.max_handshake_bytes) + ")");
  }
  if (h.metadata_bytes > lim.max_metadata_bytes)
    throw resource_exhausted_error("frame declares " + std::to_string(h.metadata_bytes) +
                                   " metadata bytes (limit " +
                                   std::to_string(lim.max_metadata_bytes) + ")");
  if (is_split_head(h) ? h.payload_count > lim.max_message_payloads
                       : h.payload_count > lim.max_payloads)
    throw resource_exhausted_error(
        std::string(is_split_head(h) ? "message" : "frame") + " declares " +
        std::to_string(h.payload_count) + " payloads (limit " +
        std::to_string(is_split_head(h) ? lim.max_message_payloads : lim.max_payloads) + ")");
  if (header_size + h.metadata_bytes > lim.max_frame_bytes)
    throw resource_exhausted_error("frame declares " +
                                   std::to_string(header_size + h.metadata_bytes) +
                                   " bytes (limit " + std::to_string(lim.max_frame_bytes) + ")");
  return h;
}

// Parses the metadata of a request, response or cancel frame: the envelope,
// then one descriptor per payload, checking each against the limits and the
// total frame size (a split head's: the message limits) before the caller
// allocates anything. A part's metadata is its envelope and its byte count.
inline frame_meta parse_metadata(const frame_header& h, std::span<const std::byte> meta,
                                 const frame_limits& lim) {
  if (is_handshake_kind(h.kind))
    throw internal_error("parse_metadata called on a handshake frame");
  if (meta.size() != h.metadata_bytes)
    throw data_loss_error("frame metadata is " + std::to_string(meta.size()) +
                          " bytes, the header declares " + std::to_string(h.metadata_bytes));
  detail::reader r(meta, "frame metadata");
  frame_meta m;
  const std::uint16_t method_len = r.u16();
  if (method_len > lim.max_method_bytes)
    throw data_loss_error("method name of " + std::to_string(method_len) + " bytes (limit " +
                          std::to_string(lim.max_method_bytes) + ")");
  m.env.method = r.str(method_len);
  m.env.status = r.u32();
  if (m.env.status > max_status)
    throw data_loss_error("unknown status " + std::to_string(m.env.status) + " in frame");
  const std::uint32_t msg_len = r.u32();
  m.env.message = r.str(msg_len); // bounded by the metadata size
  m.env.timeout_us = r.u64();

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
  std::uint64_t total = 0;
  m.payloads.reserve(std::min<std::size_t>(h.payload_count, r.remaining() / 12));
  for (std::uint32_t i = 0; i < h.payload_count; ++i) {
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
    m.payloads.push_back(payload_info{type, loom::shape(std::move(dims)), bytes});
  }
  m.payload_bytes = total;
  m.user_offset = r.pos();
  m.user_bytes = r.remaining();
  return m;
}

// Checks payload bytes whose values are constrained (bool must be 0 or 1).
inline void validate_payload_bytes(const payload_info& p, const void* data, std::size_t index) {
  if (p.type != dtype::boolean)
    return;
  const auto* b = static_cast<const unsigned char*>(data);
  for (std::uint64_t i = 0; i < p.bytes; ++i)
    if (b[i] > 1)
      throw data_loss_error("payload " + std::to_string(index) + ": bool element " +
                            std::to_string(i) + " has byte value " + std::to_string(b[i]));
}

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
inline decoded_frame decode_frame(std::span<const std::byte> bytes, const frame_limits& lim = {}) {
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

// ---------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------

// Starts a frame: the header with placeholder lengths. finish_head() patches them.
inline void begin_head(std::string& out, frame_kind kind, std::uint64_t request_id,
                       std::uint32_t payload_count, std::uint16_t flags = 0) {
  out.append(frame_magic.data(), 4);
  out.push_back(static_cast<char>(protocol_version));
  out.push_back(static_cast<char>(kind));
  detail::put_u16(out, flags);
  detail::put_u64(out, request_id);
  detail::put_u32(out, 0); // metadata bytes, patched
  detail::put_u32(out, payload_count);
}

// A ping or pong frame: the header alone.
inline std::string encode_heartbeat(frame_kind kind) {
  std::string out;
  begin_head(out, kind, 0, 0);
  return out;
}

inline void finish_head(std::string& out, std::size_t start) {
  const std::size_t meta = out.size() - start - header_size;
  if (meta > std::numeric_limits<std::uint32_t>::max())
    throw resource_exhausted_error("frame metadata of " + std::to_string(meta) + " bytes");
  detail::patch_u32(out, start + 16, static_cast<std::uint32_t>(meta));
}

// Appends the envelope and the descriptors of `payloads`. Throws
// invalid_argument_error for a string or empty tensor.
inline std::uint64_t append_envelope(std::string& out, const envelope& env,
                                     std::span<const any_tensor> payloads) {
  if (env.method.size() > std::numeric_limits<std::uint16_t>::max())
    throw invalid_argument_error("method name of " + std::to_string(env.method.size()) + " bytes");
  detail::put_u16(out, static_cast<std::uint16_t>(env.method.size()));
  out.append(env.method);
  detail::put_u32(out, env.status);
  detail::put_u32(out,
                  static_cast<std::uint32_t>(std::min<std::size_t>(env.message.size(), 1u << 20)));
  out.append(env.message, 0, std::min<std::size_t>(env.message.size(), 1u << 20));
  detail::put_u64(out, env.timeout_us);
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
  const auto total = append_envelope(out, env, payloads);
  append_metadata(out, meta);
  finish_head(out, 0);
  return total;
}

// A message to send: the heads of its frames, back to back, and the tensors whose bytes
// follow them. A message in one frame is `head`, then each payload whole; a split
// message lists its pieces (the head of each frame, then the ranges of the payloads it
// carries). Tensor bytes are never copied.
struct out_frame {
  struct piece {
    std::size_t source; // 0: head; i + 1: payloads[i]
    std::size_t offset, bytes;
  };
  out_frame() = default;
  explicit out_frame(std::string h) : head(std::move(h)) {} // a frame without payloads

  std::string head;
  std::vector<any_tensor> payloads;
  std::vector<piece> pieces;
  std::size_t offset = 0; // bytes already written

  std::size_t bytes() const {
    std::size_t n = head.size();
    for (const auto& t : payloads)
      n += t.byte_size();
    return n;
  }
  std::size_t buffer_count() const { return pieces.empty() ? 1 + payloads.size() : pieces.size(); }
  // Calls add(pointer, length) for each non-empty buffer in order.
  template <class F> void for_each_buffer(F&& add) const {
    if (pieces.empty()) {
      add(static_cast<const void*>(head.data()), head.size());
      for (const auto& t : payloads)
        if (t.byte_size())
          add(t.raw_data(), t.byte_size());
      return;
    }
    for (const auto& p : pieces)
      add(p.source == 0
              ? static_cast<const void*>(head.data() + p.offset)
              : static_cast<const void*>(
                    static_cast<const char*>(payloads[p.source - 1].raw_data()) + p.offset),
          p.bytes);
  }
};

// Encodes a request or response with `payloads` into `f`, split into a head and parts
// where it passes the per-frame limits. Returns the payload bytes. Throws
// resource_exhausted_error past the message limits or the metadata limit.
template <class Meta>
std::uint64_t encode_message(out_frame& f, frame_kind kind, std::uint64_t request_id,
                             const envelope& env, std::vector<any_tensor> payloads,
                             const Meta& meta, const frame_limits& lim) {
  f = out_frame{};
  const std::uint64_t bytes = encode_head(f.head, kind, request_id, env, payloads, meta);
  f.payloads = std::move(payloads);
  const auto n = f.payloads.size();
  if (n <= lim.max_payloads && f.head.size() + bytes <= lim.max_frame_bytes)
    return bytes;
  const auto what = [&] {
    return env.method.empty() ? std::string("a response") : "'" + env.method + "'";
  };
  if (f.head.size() - header_size > lim.max_metadata_bytes)
    throw resource_exhausted_error(
        what() + ": metadata of " + std::to_string(f.head.size() - header_size) +
        " bytes exceeds the limit of " + std::to_string(lim.max_metadata_bytes));
  if (n > lim.max_message_payloads)
    throw resource_exhausted_error(what() + ": " + std::to_string(n) +
                                   " tensors exceed the limit of " +
                                   std::to_string(lim.max_message_payloads) + " per message");
  if (bytes > lim.max_message_bytes)
    throw resource_exhausted_error(what() + ": " + std::to_string(bytes) +
                                   " payload bytes exceed the limit of " +
                                   std::to_string(lim.max_message_bytes) + " per message");
  detail::patch_u16(f.head, 6, frame_flag_split);
  f.pieces.push_back({0, 0, f.head.size()});
  const std::uint64_t part = std::min<std::uint64_t>(split_part_bytes, lim.max_frame_bytes / 2);
  std::size_t t = 0;      // the payload the next byte belongs to
  std::uint64_t in_t = 0; // bytes of it already in a part
  for (std::uint64_t sent = 0; sent < bytes;) {
    const std::uint64_t take_part = std::min(part, bytes - sent);
    const std::size_t at = f.head.size();
    begin_head(f.head, kind, request_id, 0, frame_flag_part);
    append_envelope(f.head, envelope{}, {});
    detail::put_u64(f.head, take_part);
    finish_head(f.head, at);
    f.pieces.push_back({0, at, f.head.size() - at});
    for (std::uint64_t left = take_part; left > 0;) {
      const std::uint64_t size = f.payloads[t].byte_size();
      if (in_t == size) {
        ++t;
        in_t = 0;
        continue;
      }
      const std::uint64_t take = std::min(left, size - in_t);
      f.pieces.push_back({t + 1, static_cast<std::size_t>(in_t), static_cast<std::size_t>(take)});
      in_t += take;
      left -= take;
    }
    sent += take_part;
  }
  return bytes;
}

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

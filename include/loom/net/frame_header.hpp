// A frame's fixed 24-byte header (frame.hpp; docs/wire-protocol.md): its layout, the
// kinds and flags of frames, the limits every receiver enforces, and its checks.
//
//   magic "LOOM" | version u8 | kind u8 | flags u16 | request id u64 |
//   metadata bytes u32 | payload count u32            (little-endian)
//
// parse_header() checks every declared length against frame_limits before a receiver
// allocates anything; begin_head() and finish_head() write one (the metadata's length
// patched in once it is known).
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/net/wire_bytes.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>

namespace loom::net {

inline constexpr std::uint8_t protocol_version = 1;
inline constexpr std::size_t header_size = 24;
inline constexpr std::array<char, 4> frame_magic = {'L', 'O', 'O', 'M'};

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

constexpr bool is_split_head(const frame_header& h) noexcept {
  return (h.flags & frame_flag_split) != 0;
}
constexpr bool is_part(const frame_header& h) noexcept {
  return (h.flags & frame_flag_part) != 0;
}
constexpr bool is_closing(const frame_header& h) noexcept {
  return (h.flags & frame_flag_closing) != 0;
}

// True when the bytes start with the magic (then bytes 8..15 are a request id).
inline bool has_magic(std::span<const std::byte> b) noexcept {
  return b.size() >= 4 && std::memcmp(b.data(), frame_magic.data(), 4) == 0;
}

// The request id of a header whose other fields may be invalid (for error replies).
LOOM_COMPILED_ONCE std::uint64_t peek_request_id(std::span<const std::byte> b) noexcept;

// Parses and validates the fixed header. Throws data_loss_error (not a loom
// frame), unimplemented_error (unknown version or kind) or
// resource_exhausted_error (a declared length over the limits).
LOOM_COMPILED_ONCE frame_header parse_header(std::span<const std::byte> b, const frame_limits& lim);

// Starts a frame: the header with placeholder lengths. finish_head() patches them.
LOOM_COMPILED_ONCE void begin_head(std::string& out, frame_kind kind, std::uint64_t request_id,
                                   std::uint32_t payload_count, std::uint16_t flags = 0);

// A ping or pong frame: the header alone.
inline std::string encode_heartbeat(frame_kind kind) {
  std::string out;
  begin_head(out, kind, 0, 0);
  return out;
}

LOOM_COMPILED_ONCE void finish_head(std::string& out, std::size_t start);

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net {

LOOM_COMPILED_ONCE std::uint64_t peek_request_id(std::span<const std::byte> b) noexcept {
  if (b.size() < 16)
    return 0;
  return detail::get_le(reinterpret_cast<const unsigned char*>(b.data()) + 8, 8);
}

LOOM_COMPILED_ONCE frame_header parse_header(std::span<const std::byte> b,
                                             const frame_limits& lim) {
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

LOOM_COMPILED_ONCE void begin_head(std::string& out, frame_kind kind, std::uint64_t request_id,
                                   std::uint32_t payload_count, std::uint16_t flags) {
  out.append(frame_magic.data(), 4);
  out.push_back(static_cast<char>(protocol_version));
  out.push_back(static_cast<char>(kind));
  detail::put_u16(out, flags);
  detail::put_u64(out, request_id);
  detail::put_u32(out, 0); // metadata bytes, patched
  detail::put_u32(out, payload_count);
}

LOOM_COMPILED_ONCE void finish_head(std::string& out, std::size_t start) {
  const std::size_t meta = out.size() - start - header_size;
  if (meta > std::numeric_limits<std::uint32_t>::max())
    throw resource_exhausted_error("frame metadata of " + std::to_string(meta) + " bytes");
  detail::patch_u32(out, start + 16, static_cast<std::uint32_t>(meta));
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

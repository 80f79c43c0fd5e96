// The envelope (frame.hpp; docs/wire-protocol.md): the message layer's own part of the
// metadata of request, response and cancel frames, first in their metadata:
//
//   method (u16 length + bytes), status u32 (0 = ok, else 1 + loom::error_code),
//   message (u32 length + bytes), timeout in microseconds u64
//
// and what a status means on the receiving side: the loom exception of its error code.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/net/frame_header.hpp>
#include <loom/net/wire_bytes.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <string>

namespace loom::net {

// The layer's own part of the metadata of request, response and cancel frames.
struct envelope {
  std::string method;
  std::uint32_t status = 0; // 0: ok; otherwise 1 + static_cast<uint32_t>(error_code)
  std::string message;      // the error message when status != 0
  std::uint64_t timeout_us = 0;

  bool ok() const noexcept { return status == 0; }
  error_code code() const noexcept { return static_cast<error_code>(status - 1); }
};

inline constexpr std::uint32_t max_status =
    static_cast<std::uint32_t>(error_code::unauthenticated) + 1;

inline std::uint32_t status_of(error_code c) noexcept {
  return static_cast<std::uint32_t>(c) + 1;
}

// Throws the loom error subclass matching `code` (so callers can catch e.g. unavailable_error).
[[noreturn]] LOOM_COMPILED_ONCE void throw_error(error_code code, const std::string& message);

inline std::exception_ptr make_error(error_code code, const std::string& message) {
  try {
    throw_error(code, message);
  } catch (...) {
    return std::current_exception();
  }
}

// Appends the envelope (a message over 1 MiB is cut there). Throws invalid_argument_error
// for a method name over 64 KiB.
LOOM_COMPILED_ONCE void append_envelope(std::string& out, const envelope& env);

// Reads the envelope at the start of a frame's metadata; throws data_loss_error for a
// method name over the limit or a status no error code has.
LOOM_COMPILED_ONCE envelope parse_envelope(detail::reader& r, const frame_limits& lim);

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net {

LOOM_COMPILED_ONCE void throw_error(error_code code, const std::string& message) {
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

LOOM_COMPILED_ONCE void append_envelope(std::string& out, const envelope& env) {
  if (env.method.size() > std::numeric_limits<std::uint16_t>::max())
    throw invalid_argument_error("method name of " + std::to_string(env.method.size()) + " bytes");
  detail::put_u16(out, static_cast<std::uint16_t>(env.method.size()));
  out.append(env.method);
  detail::put_u32(out, env.status);
  detail::put_u32(out,
                  static_cast<std::uint32_t>(std::min<std::size_t>(env.message.size(), 1u << 20)));
  out.append(env.message, 0, std::min<std::size_t>(env.message.size(), 1u << 20));
  detail::put_u64(out, env.timeout_us);
}

LOOM_COMPILED_ONCE envelope parse_envelope(detail::reader& r, const frame_limits& lim) {
  envelope env;
  const std::uint16_t method_len = r.u16();
  if (method_len > lim.max_method_bytes)
    throw data_loss_error("method name of " + std::to_string(method_len) + " bytes (limit " +
                          std::to_string(lim.max_method_bytes) + ")");
  env.method = r.str(method_len);
  env.status = r.u32();
  if (env.status > max_status)
    throw data_loss_error("unknown status " + std::to_string(env.status) + " in frame");
  const std::uint32_t msg_len = r.u32();
  env.message = r.str(msg_len); // bounded by the metadata size
  env.timeout_us = r.u64();
  return env;
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// A message to send (frame.hpp; docs/wire-protocol.md): out_frame, its frames' heads and a
// gather list of the bytes that follow them, written with one scatter-gather write each
// time the socket takes some (frame_writer.hpp), tensor bytes never copied; and
// encode_message(), which makes one.
//
// A message over the per-frame limits (more than max_payloads tensors, or more than
// max_frame_bytes in all) travels as a split head and its parts, back to back on one
// connection (frame_flag_split, frame_flag_part): the head carries the envelope, every
// descriptor and the caller's metadata, bounded by the message limits instead; each part
// carries the next bytes of the payloads (split_part_bytes at the most), so a receiver
// still reads them straight into the destination tensors, allocating each as its bytes
// come.
#pragma once

#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/net/envelope.hpp>
#include <loom/net/frame_header.hpp>
#include <loom/net/frame_metadata.hpp>
#include <loom/net/wire_bytes.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace loom::net {

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
    append_envelope(f.head, envelope{});
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

} // namespace loom::net

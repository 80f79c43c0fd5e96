// The sending half of a connection (connection.hpp): its queue of frames, the lock that
// makes sending thread-safe, and whether the connection is closed (a closed connection
// drops what it is given, so the flag lives with the queue it guards).
//
// send() first tries a non-blocking sendmsg() of the whole frame from the calling thread
// (no thread hop for small frames; plain TCP only), and queues whatever did not fit; the
// connection then writes the queue on its strand, in order, several frames per
// scatter-gather call. A write of more buffers than one sendmsg takes (64) copies its
// small ones into one contiguous run first (gather_list), so a message of many small
// tensors is one sendmsg too.
//
// The writer starts no asynchronous operation itself: it says what to write next
// (next()), and the connection, which owns the strand and the object's lifetime, does
// the async_write and reports back (written()). So this file holds state and decisions
// only, and every handler that keeps the connection alive is in connection.hpp.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/net/frame.hpp>
#include <loom/net/transport.hpp>

#include <asio/buffer.hpp>

#if defined(__unix__) || defined(__APPLE__)
#include <cerrno>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#define LOOM_NET_DIRECT_SEND 1
#endif

#include <algorithm>
#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace loom::net {

namespace detail {
// The buffers of one write, at most max_buffers of them where that is possible: one
// sendmsg takes at most 64 (asio's limit too), and a message of many small tensors would
// otherwise take several. When more buffers are added than that, runs of small ones
// (under coalesce_below bytes) are copied into one contiguous staging buffer, up to
// staging_bytes in all; large buffers are never copied.
class gather_list {
public:
  static constexpr std::size_t max_buffers = 64;
  static constexpr std::size_t coalesce_below = 16u << 10;
  static constexpr std::size_t staging_bytes = 256u << 10;

  // Collects the buffers that add_all(add) passes to add(pointer, length), in order.
  template <class AddAll> void build(AddAll&& add_all) {
    raw_.clear();
    add_all([&](const void* p, std::size_t len) {
      if (len > 0)
        raw_.push_back({static_cast<const char*>(p), len});
    });
    out_.clear();
    if (raw_.size() <= max_buffers) {
      for (const auto& r : raw_)
        out_.emplace_back(r.p, r.len);
      return;
    }
    staging_.clear();
    staging_.reserve(staging_bytes); // never outgrown: pointers into it stay valid
    bool in_run = false;             // the last entry of out_ is a run in staging_
    for (const auto& r : raw_) {
      if (r.len < coalesce_below && staging_.size() + r.len <= staging_bytes) {
        const std::size_t at = staging_.size();
        staging_.append(r.p, r.len);
        if (in_run)
          out_.back() = asio::const_buffer(out_.back().data(), out_.back().size() + r.len);
        else
          out_.emplace_back(staging_.data() + at, r.len);
        in_run = true;
      } else {
        out_.emplace_back(r.p, r.len);
        in_run = false;
      }
    }
  }
  // The buffers to write (the first max_buffers of them are one sendmsg).
  const std::vector<asio::const_buffer>& buffers() const noexcept { return out_; }

private:
  struct raw_buffer {
    const char* p;
    std::size_t len;
  };
  std::vector<raw_buffer> raw_;
  std::vector<asio::const_buffer> out_;
  std::string staging_;
};
} // namespace detail

class frame_writer {
public:
  // What push() did with a frame.
  enum class pushed {
    dropped, // the connection is closed, or its end of stream sent
    sent,    // written whole from the calling thread
    start,   // queued, and no write was under way: the caller runs next() on the strand
    queued,  // queued behind a write under way, which will take it
  };

  // What the connection does next (next()).
  struct step {
    enum kind {
      stop,  // closed, or nothing to write
      write, // async_write buffers(), then call written()
      close, // the queue is flushed and a close waited for it: close with reason
    } what = stop;
    std::string reason;
    bool linger = false;
  };

  explicit frame_writer(transport& io) : io_(io) {}
  frame_writer(const frame_writer&) = delete;
  frame_writer& operator=(const frame_writer&) = delete;

  // Thread-safe.
  pushed push(out_frame&& f);

  bool closed() const {
    std::lock_guard lk(mu_);
    return closed_;
  }
  // True while frames wait in the queue (an async write is under way).
  bool writing() const {
    std::lock_guard lk(mu_);
    return writing_ && !closed_;
  }

  // What close_after_flush() asks of the caller.
  enum class flush_close { nothing, later, now };
  // Thread-safe. `later`: next() says `close` once the queue is written; `now`: nothing is
  // queued, close at once; `nothing`: already closed.
  flush_close close_after_flush(std::string reason, bool linger);

  // Marks the connection closed: every later push() drops its frame. False when it already
  // was (the caller's close is not the first).
  bool close() {
    std::lock_guard lk(mu_);
    return !std::exchange(closed_, true);
  }
  // The connection's end of stream is sent (its write side shut down): every later push()
  // drops its frame. Written, it would fail (EPIPE), and the close that follows a failed
  // write, with the peer's bytes still unread, would be a reset, destroying what the peer
  // has not yet received of the frames before the end.
  void end() {
    std::lock_guard lk(mu_);
    ended_ = true;
  }
  // After close() and the socket's: drops what was queued.
  void clear() {
    std::lock_guard lk(mu_);
    queue_.clear();
    writing_ = false;
  }

  // Runs f(closed) under the writer's lock when no write is under way, so that nothing is
  // sent while f runs (moving the socket to another thread). False without calling f when a
  // write is under way.
  template <class F> bool when_idle(F&& f) {
    std::lock_guard lk(mu_);
    if (writing_ && !closed_)
      return false;
    return f(closed_);
  }

  // ---- strand only ----

  // The next batch: frames while their buffers fit one sendmsg (at least one frame; the
  // gather list copies the small buffers of one with more).
  step next();
  // The batch's buffers, valid until the next call of next().
  const std::vector<asio::const_buffer>& buffers() const noexcept { return out_gather_.buffers(); }
  // The batch was written. False when the connection closed meanwhile.
  bool written();

private:
#ifdef LOOM_NET_DIRECT_SEND
  // Under mu_: writes as much of f as the socket takes without blocking.
  // True when all of it went out.
  bool direct_send(out_frame& f) {
    const auto fd = io_.socket().native_handle();
    const std::size_t total = f.bytes();
    while (f.offset < total) {
      gather_.build([&](auto&& add) { buffers_from(f, f.offset, add); });
      const auto& bufs = gather_.buffers();
      iovec iov[detail::gather_list::max_buffers];
      const std::size_t n = std::min(bufs.size(), detail::gather_list::max_buffers);
      for (std::size_t i = 0; i < n; ++i) {
        iov[i].iov_base = const_cast<void*>(bufs[i].data());
        iov[i].iov_len = bufs[i].size();
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = n;
      int flags = MSG_DONTWAIT;
#ifdef MSG_NOSIGNAL
      flags |= MSG_NOSIGNAL;
#endif
      const auto w = ::sendmsg(fd, &msg, flags);
      if (w < 0) {
        if (errno == EINTR)
          continue;
        return false; // EAGAIN, or an error the async path will report
      }
      f.offset += static_cast<std::size_t>(w);
    }
    return true;
  }
#endif

  // Passes add(pointer, length) the bytes of f from byte `skip` on, buffer by buffer.
  template <class Add> static void buffers_from(const out_frame& f, std::size_t skip, Add& add) {
    f.for_each_buffer([&](const void* p, std::size_t len) {
      if (skip >= len) {
        skip -= len;
        return;
      }
      add(static_cast<const char*>(p) + skip, len - skip);
      skip = 0;
    });
  }

  transport& io_; // the connection's; direct_send() writes to its socket
  mutable std::mutex mu_;
  bool closed_ = false, ended_ = false, writing_ = false, close_after_flush_ = false,
       linger_ = false;
  std::string close_reason_;
  std::deque<out_frame> queue_;
  detail::gather_list gather_;     // direct_send()'s (under mu_)
  detail::gather_list out_gather_; // strand only: the async write's buffers
  std::size_t batch_ = 0;          // strand only
};

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net {

LOOM_COMPILED_ONCE auto frame_writer::push(out_frame&& f) -> pushed {
  std::lock_guard lk(mu_);
  if (closed_ || ended_)
    return pushed::dropped;
  const bool idle = !writing_;
  if (idle) {
#ifdef LOOM_NET_DIRECT_SEND
    if (!io_.secure() && direct_send(f))
      return pushed::sent;
#endif
    writing_ = true;
  }
  queue_.push_back(std::move(f));
  return idle ? pushed::start : pushed::queued;
}

LOOM_COMPILED_ONCE auto frame_writer::close_after_flush(std::string reason, bool linger)
    -> flush_close {
  std::lock_guard lk(mu_);
  if (closed_)
    return flush_close::nothing;
  if (!writing_)
    return flush_close::now;
  close_after_flush_ = true;
  linger_ = linger;
  close_reason_ = std::move(reason);
  return flush_close::later;
}

LOOM_COMPILED_ONCE auto frame_writer::next() -> step {
  std::lock_guard lk(mu_);
  if (closed_)
    return {};
  if (queue_.empty()) {
    writing_ = false;
    if (!std::exchange(close_after_flush_, false))
      return {};
    return {step::close, close_reason_, linger_};
  }
  batch_ = 0;
  std::size_t count = 0;
  for (const auto& f : queue_) {
    if (batch_ > 0 && count + f.buffer_count() > detail::gather_list::max_buffers)
      break;
    count += f.buffer_count();
    ++batch_;
  }
  out_gather_.build([&](auto&& add) {
    for (std::size_t i = 0; i < batch_; ++i)
      buffers_from(queue_[i], queue_[i].offset, add);
  });
  return {step::write, {}, false};
}

LOOM_COMPILED_ONCE bool frame_writer::written() {
  std::lock_guard lk(mu_);
  if (closed_)
    return false;
  for (std::size_t i = 0; i < batch_ && !queue_.empty(); ++i)
    queue_.pop_front();
  return true;
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

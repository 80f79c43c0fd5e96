// net::call_handle: a call in flight on a channel (channel.hpp), as call_async returns it.
// Its state is the call's (call_table.hpp); the channel it came from is held weakly, so a
// handle that outlives its channel still waits, expires and cancels (without the channel's
// connections to drive or to tell).
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/net/call_table.hpp>
#include <loom/net/channel_core.hpp>
#include <loom/net/response.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace loom::net {

// A call in flight. get() waits for the response (at most until the call's
// deadline) and throws the call's error; cancel() gives up on it.
class call_handle {
public:
  call_handle() = default;
  call_handle(std::shared_ptr<detail::call_state> st, std::weak_ptr<detail::channel_core> ch,
              std::chrono::microseconds spin = {})
      : st_(std::move(st)), ch_(std::move(ch)), spin_(spin) {}

  bool valid() const noexcept { return static_cast<bool>(st_); }
  std::uint64_t id() const noexcept { return st_->id; }

  // Waits up to d (never past the call's deadline); true when the call completed.
  template <class Rep, class Period> bool wait_for(std::chrono::duration<Rep, Period> d) {
    const auto until =
        std::min(std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(d),
                 st_->deadline);
    if (auto ch = ch_.lock(); ch && ch->lead(*st_, until) && !st_->done_flag.load()) {
      if (std::chrono::steady_clock::now() >= st_->deadline) {
        expire();
        return true;
      }
      return false;
    }
    std::unique_lock lk(st_->m);
    if (st_->cv.wait_until(lk, until, [&] { return st_->done; }))
      return true;
    lk.unlock();
    if (std::chrono::steady_clock::now() >= st_->deadline) {
      expire();
      return true;
    }
    return false;
  }

  bool done();

  // True once the call has completed with an error (reading what has arrived
  // first); never waits. For watching a call another thread will get().
  bool failed() {
    if (!done())
      return false;
    std::lock_guard lk(st_->m);
    return static_cast<bool>(st_->error);
  }

  // Waits for the response; throws deadline_exceeded_error (naming the method
  // and the peer), cancelled_error, unavailable_error, or the server's error.
  response get();

  void cancel() {
    if (auto ch = ch_.lock())
      ch->cancel(*st_);
    else
      st_->finish_cancelled();
  }

private:
  void expire() {
    if (auto ch = ch_.lock())
      ch->expire(*st_);
    else
      st_->finish_expired();
  }

  std::shared_ptr<detail::call_state> st_;
  std::weak_ptr<detail::channel_core> ch_;
  std::chrono::microseconds spin_{0};
};

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net {

LOOM_COMPILED_ONCE bool call_handle::done() {
  if (auto ch = ch_.lock(); ch && !st_->done_flag.load())
    ch->lead(*st_, std::chrono::steady_clock::time_point::min()); // what has arrived
  {
    std::lock_guard lk(st_->m);
    if (st_->done)
      return true;
  }
  if (std::chrono::steady_clock::now() >= st_->deadline) {
    expire();
    return true;
  }
  return false;
}

LOOM_COMPILED_ONCE auto call_handle::get() -> response {
  // The common synchronous call: no thread drives the connections, so this
  // one reads its own reply (and hands on any other it meets).
  if (auto ch = ch_.lock(); ch && !st_->done_flag.load(std::memory_order_acquire))
    ch->lead(*st_, st_->deadline);
  if (spin_.count() > 0 && !st_->done_flag.load(std::memory_order_acquire)) {
    const auto until = std::chrono::steady_clock::now() + spin_;
    do
      std::this_thread::yield();
    while (!st_->done_flag.load(std::memory_order_acquire) &&
           std::chrono::steady_clock::now() < until);
  }
  {
    std::unique_lock lk(st_->m);
    if (!st_->cv.wait_until(lk, st_->deadline, [&] { return st_->done; })) {
      lk.unlock();
      expire();
    }
  }
  std::lock_guard lk(st_->m);
  if (st_->error)
    std::rethrow_exception(st_->error);
  return std::move(st_->result);
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// The io threads of loom's message layer: a pool of io_contexts for a
// server's connections, or one context driven on demand for a channel's.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/net/log.hpp>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace loom::net::detail {

// A pool of io_contexts, each run by one thread (so Asio never wakes a second
// thread per event); connections are spread over them round-robin.
// shutdown() lets the threads finish the outstanding work (callers close their
// sockets first), joins them, and from then on runs anything posted late
// inline, so nothing is left in a queue holding a connection (no leak, no cycle).
//
// On demand (a channel's runtime: one context): the context is driven by
// whoever needs it, one thread at a time (the "leader"). A caller blocked on a
// reply drives it itself (lead()), so the thread the kernel wakes when the
// reply arrives is the one that wants it: no hand-off from an io thread, one
// thread switch per round trip less. The io thread drives it only while a
// caller is not and there is work nobody waits for: something posted (a write
// the socket could not take at once, a close, a handshake) or while busy()
// (calls in flight, connecting). Otherwise it sleeps on a condition variable,
// out of epoll, so a reply does not wake it too. A connection closed while
// nobody drives the context is noticed by the next call's poll_idle().
class io_runtime {
public:
  // on_demand_busy: drive the context on demand (one thread); it returns true
  // while work is outstanding that the io thread must drive the context for
  // even when no caller waits.
  io_runtime(int threads, log_fn log, std::function<bool()> on_demand_busy = {});
  io_runtime(const io_runtime&) = delete;
  io_runtime& operator=(const io_runtime&) = delete;
  ~io_runtime() { shutdown(); }

  // The first context (acceptor, resolver).
  asio::io_context& context() noexcept { return *ctxs_.front(); }
  // The contexts, one per io thread, by index.
  std::size_t size() const noexcept { return ctxs_.size(); }
  asio::io_context& context_at(std::size_t i) noexcept { return *ctxs_[i]; }
  std::size_t index_of(const asio::io_context& ctx) const noexcept;

  // The context for the next connection.
  asio::io_context& next_context() noexcept {
    return *ctxs_[next_.fetch_add(1, std::memory_order_relaxed) % ctxs_.size()];
  }

  void shutdown();

  // Runs f on the strand (inline if already there); after shutdown, inline.
  template <class Strand, class F> void run_on(const Strand& strand, F&& f) {
    if (strand.running_in_this_thread()) {
      f();
      return;
    }
    std::unique_lock lk(m_);
    if (joined_) {
      lk.unlock();
      f();
      return;
    }
    asio::post(strand, std::forward<F>(f));
    if (on_demand_) {
      wanted_ = true; // a leader polls it before letting go; else the io thread runs it
      if (leader_ == leader::none) {
        lk.unlock();
        cv_.notify_one();
      }
    }
  }

  // On demand: drives the context from the calling thread until done() or
  // `until` (just what is ready when `until` has passed). False, without
  // waiting, when another thread drives it (or the runtime is stopping): the
  // caller then waits for that thread to complete its call.
  template <class Done> bool lead(Done&& done, std::chrono::steady_clock::time_point until) {
    if (!on_demand_)
      return false;
    {
      std::lock_guard lk(m_);
      if (leader_ != leader::none || shutting_down_)
        return false;
      leader_ = leader::caller;
    }
    auto& ctx = context();
    while (!done() && !stopping_.load(std::memory_order_acquire)) {
      try {
        if (std::chrono::steady_clock::now() >= until) {
          ctx.poll();
          break;
        }
        ctx.run_one_until(until);
      } catch (const std::exception& e) {
        log_line(log_, std::string("unexpected exception in an io handler: ") + e.what());
      }
    }
    release(ctx);
    return true;
  }

  // Wakes a caller that drives the context (its call was completed from
  // another thread: cancelled, stopped).
  void wake_leader() {
    std::lock_guard lk(m_);
    if (leader_ == leader::caller)
      asio::post(context(), [] {});
  }

private:
  enum class leader { none, io, caller };

  void run(asio::io_context& ctx);

  // The io thread of an on-demand runtime: sleeps until wanted, drives the
  // context while there is work, lets go. Returns at shutdown (run() drains).
  void run_on_demand(asio::io_context& ctx);

  // The leader lets go: first runs what was posted while it led, then hands
  // the context to the io thread if work remains that nobody waits for.
  void release(asio::io_context& ctx);

  log_fn log_;
  const bool on_demand_;
  const std::function<bool()> busy_;
  std::vector<std::unique_ptr<asio::io_context>> ctxs_;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> works_;
  std::vector<std::thread> threads_;
  std::atomic<std::size_t> next_{0};
  std::mutex m_;
  std::condition_variable cv_;
  bool shutting_down_ = false, joined_ = false;
  bool wanted_ = false;          // on demand: something was posted since the last poll
  leader leader_ = leader::none; // on demand: who drives the context now
  std::atomic<bool> stopping_{false};
};

} // namespace loom::net::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net::detail {

LOOM_COMPILED_ONCE io_runtime::io_runtime(int threads, log_fn log,
                                          std::function<bool()> on_demand_busy)
    : log_(std::move(log)), on_demand_(static_cast<bool>(on_demand_busy)),
      busy_(std::move(on_demand_busy)) {
  const std::size_t n = threads > 1 && !on_demand_ ? static_cast<std::size_t>(threads) : 1;
  for (std::size_t i = 0; i < n; ++i) {
    ctxs_.push_back(std::make_unique<asio::io_context>(1));
    works_.emplace_back(asio::make_work_guard(*ctxs_.back()));
  }
  threads_.reserve(n);
  for (std::size_t i = 0; i < n; ++i)
    threads_.emplace_back([this, i] {
      if (on_demand_)
        run_on_demand(*ctxs_[i]);
      run(*ctxs_[i]);
    });
}

LOOM_COMPILED_ONCE std::size_t io_runtime::index_of(const asio::io_context& ctx) const noexcept {
  for (std::size_t i = 0; i < ctxs_.size(); ++i)
    if (ctxs_[i].get() == &ctx)
      return i;
  return 0;
}

LOOM_COMPILED_ONCE void io_runtime::shutdown() {
  {
    std::lock_guard lk(m_);
    if (shutting_down_)
      return;
    shutting_down_ = true;
    stopping_.store(true, std::memory_order_release);
    if (leader_ == leader::caller) // wake it so it sees stopping_ and returns
      asio::post(context(), [] {});
  }
  cv_.notify_all();
  works_.clear();
  for (auto& t : threads_) {
    if (!t.joinable())
      continue;
    if (t.get_id() == std::this_thread::get_id()) {
      // stop() from inside a handler: that thread cannot join itself.
      log_line(log_, "stop() called from an io thread; that thread finishes on its own");
      t.detach();
    } else {
      t.join();
    }
  }
  {
    std::lock_guard lk(m_);
    joined_ = true;
  }
  for (auto& c : ctxs_) {
    c->restart();
    c->poll();
  }
}

LOOM_COMPILED_ONCE void io_runtime::run(asio::io_context& ctx) {
  for (;;) {
    try {
      ctx.run();
      return;
    } catch (const std::exception& e) {
      log_line(log_, std::string("unexpected exception in an io thread: ") + e.what());
    }
  }
}

LOOM_COMPILED_ONCE void io_runtime::run_on_demand(asio::io_context& ctx) {
  std::unique_lock lk(m_);
  for (;;) {
    cv_.wait(lk, [&] { return shutting_down_ || (wanted_ && leader_ == leader::none); });
    if (shutting_down_)
      return;
    leader_ = leader::io;
    lk.unlock();
    while (!stopping_.load(std::memory_order_acquire)) {
      try {
        if (ctx.poll_one() > 0)
          continue;
        if (busy_()) {
          ctx.run_one_for(std::chrono::milliseconds(100));
          continue;
        }
      } catch (const std::exception& e) {
        log_line(log_, std::string("unexpected exception in an io thread: ") + e.what());
        continue;
      }
      break;
    }
    release(ctx);
    lk.lock();
  }
}

LOOM_COMPILED_ONCE void io_runtime::release(asio::io_context& ctx) {
  for (;;) {
    {
      std::lock_guard lk(m_);
      if (!wanted_ || shutting_down_) {
        leader_ = leader::none;
        break;
      }
      wanted_ = false;
    }
    try {
      ctx.poll();
    } catch (const std::exception& e) {
      log_line(log_, std::string("unexpected exception in an io handler: ") + e.what());
    }
  }
  if (busy_()) {
    {
      std::lock_guard lk(m_);
      wanted_ = true;
    }
    cv_.notify_one();
  }
}

} // namespace loom::net::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

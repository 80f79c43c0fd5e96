// The calls a channel has in flight (channel_core.hpp): each call's state, shared by its
// waiter (call_handle.hpp) and whoever completes it (the thread that reads its reply, a
// lost connection, a deadline, a cancel), and the table of them by request id.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/net/envelope.hpp>
#include <loom/net/response.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace loom::net::detail {

// One call: completed exactly once (finish()), by whichever thread gets there first.
struct call_state {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::atomic<bool> done_flag{false}; // done, readable without the mutex (spin-wait)
  std::exception_ptr error;
  net::response result;

  std::string method;
  std::uint64_t id = 0;
  std::chrono::steady_clock::time_point deadline;
  std::chrono::milliseconds timeout{0};
  std::vector<any_tensor> dest;
  std::shared_ptr<const std::string> peer; // "ps task 0 at 127.0.0.1:1234"

  // Completes the call once; false if it was already complete.
  bool finish(std::exception_ptr e, net::response* r = nullptr);
  // The two ways a caller ends its own call, worded the same whether the channel is
  // still there to end it or the handle outlived it.
  bool finish_expired() {
    return finish(
        make_error(error_code::deadline_exceeded, describe() + " did not complete within " +
                                                      std::to_string(timeout.count()) + " ms"));
  }
  bool finish_cancelled() {
    return finish(make_error(error_code::cancelled, describe() + " was cancelled"));
  }
  std::string describe() const { return "call '" + method + "' to " + *peer; }
};

// The calls in flight by request id, and the earliest of their deadlines (so a call
// submitted finds the expired ones without a scan while none has expired).
//
// Not thread-safe: the channel guards it with the mutex that guards its connections, so
// that a lost connection and the calls it fails change together.
class call_table {
public:
  using clock = std::chrono::steady_clock;
  using call_ptr = std::shared_ptr<call_state>;

  bool empty() const noexcept { return calls_.empty(); }
  std::size_t size() const noexcept { return calls_.size(); }

  // Adds st; false when a call with its request id is in flight already.
  bool add(const call_ptr& st) {
    if (!calls_.emplace(st->id, st).second)
      return false;
    min_deadline_ = std::min(min_deadline_, st->deadline);
    return true;
  }

  // The call with request id `id`, or null; it stays in flight.
  call_state* find(std::uint64_t id) const {
    auto it = calls_.find(id);
    return it == calls_.end() ? nullptr : it->second.get();
  }

  // Takes the call with request id `id` out (its reply came), or null.
  call_ptr take(std::uint64_t id);

  // Takes st out if it is still the call under its id (a retry may reuse the id).
  void remove(const call_state& st);

  // Takes every call out (the channel stopped, or lost its connection).
  std::vector<call_ptr> take_all();

  // The request ids of the calls in flight.
  std::vector<std::uint64_t> ids() const {
    std::vector<std::uint64_t> out;
    out.reserve(calls_.size());
    for (const auto& [id, st] : calls_)
      out.push_back(id);
    return out;
  }

  // Takes out the calls whose deadline has passed, into `expired`.
  void take_expired(clock::time_point now, std::vector<call_ptr>& expired);

private:
  std::unordered_map<std::uint64_t, call_ptr> calls_;
  clock::time_point min_deadline_ = clock::time_point::max();
};

} // namespace loom::net::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net::detail {

LOOM_COMPILED_ONCE bool call_state::finish(std::exception_ptr e, net::response* r) {
  {
    std::lock_guard lk(m);
    if (done)
      return false;
    done = true;
    error = std::move(e);
    if (r)
      result = std::move(*r);
    done_flag.store(true, std::memory_order_release);
  }
  cv.notify_all();
  return true;
}

LOOM_COMPILED_ONCE auto call_table::take(std::uint64_t id) -> call_ptr {
  auto it = calls_.find(id);
  if (it == calls_.end())
    return nullptr;
  auto st = std::move(it->second);
  calls_.erase(it);
  return st;
}

LOOM_COMPILED_ONCE void call_table::remove(const call_state& st) {
  auto it = calls_.find(st.id);
  if (it != calls_.end() && it->second.get() == &st)
    calls_.erase(it);
}

LOOM_COMPILED_ONCE auto call_table::take_all() -> std::vector<call_ptr> {
  std::vector<call_ptr> calls;
  calls.reserve(calls_.size());
  for (auto& [id, st] : calls_)
    calls.push_back(st);
  calls_.clear();
  min_deadline_ = clock::time_point::max();
  return calls;
}

LOOM_COMPILED_ONCE void call_table::take_expired(clock::time_point now,
                                                 std::vector<call_ptr>& expired) {
  if (now < min_deadline_)
    return;
  auto next = clock::time_point::max();
  for (auto it = calls_.begin(); it != calls_.end();) {
    if (it->second->deadline <= now) {
      expired.push_back(std::move(it->second));
      it = calls_.erase(it);
    } else {
      next = std::min(next, it->second->deadline);
      ++it;
    }
  }
  min_deadline_ = next;
}

} // namespace loom::net::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

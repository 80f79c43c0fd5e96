// The one mechanism behind every stage that works ahead on threads of its own
// (map with num_parallel_calls > 1, prefetch, a parallel interleave's cycle):
// `workers` threads pull elements from the input in order, apply a function,
// and put the results into slots that the consumer takes in the same order.
//
// Bound: at most `capacity` slots exist at once, counting those whose function
// is still running, so the stage holds at most `capacity` results (of the
// function) beyond what the consumer has taken. The input is read by one worker
// at a time (iterators are not thread-safe); the functions run concurrently.
//
// An error from the input or the function is kept in its slot and thrown by the
// consumer's next() in order; the workers carry on after it, so an
// ignore_errors() downstream skips it. The threads start at the first next()
// (so a restore() lands first) and stop and are joined when the buffer is
// destroyed.
#pragma once

#include <loom/core/error.hpp>
#include <loom/data/iterator_state.hpp>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <istream>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace loom::data::detail {

template <class Input, class Fn, class Out> class parallel_buffer {
public:
  parallel_buffer(Input input, Fn fn, std::size_t workers, std::size_t capacity)
      : s_(std::make_unique<shared>(std::move(input), std::move(fn), workers, capacity)) {}
  parallel_buffer(parallel_buffer&&) noexcept = default;
  parallel_buffer& operator=(parallel_buffer&& other) noexcept {
    if (this != &other) {
      stop();
      s_ = std::move(other.s_);
    }
    return *this;
  }
  ~parallel_buffer() { stop(); }

  std::optional<Out> next() {
    shared& s = *s_;
    if (s.threads.empty())
      for (std::size_t i = 0; i < s.workers; ++i)
        s.threads.emplace_back([&s] { s.work(); });
    std::unique_lock lock(s.m);
    s.consumer_cv.wait(lock, [&] { return !s.slots.empty() && s.slots.front().ready; });
    slot& front = s.slots.front();
    if (front.end)
      return std::nullopt; // kept: every later call ends too
    std::optional<Out> out = std::move(front.value);
    const std::exception_ptr error = front.error;
    s.slots.pop_front();
    lock.unlock();
    s.worker_cv.notify_all();
    if (error)
      std::rethrow_exception(error);
    return out;
  }

  // Waits until no worker is pulling or computing, then writes the finished
  // results (an error as its code and message) and the input's state.
  void save(std::ostream& out) {
    shared& s = *s_;
    std::unique_lock lock(s.m);
    ++s.pausing;
    s.consumer_cv.wait(lock, [&] { return s.busy == 0; });
    state::put_u64(out, s.slots.size());
    for (const slot& r : s.slots) {
      state::put_u64(out, r.end ? 0 : r.error ? 1 : 2);
      if (r.error)
        put_error(out, r.error);
      else if (!r.end)
        state::put_element(out, *r.value);
    }
    s.input.save(out);
    --s.pausing;
    lock.unlock();
    s.worker_cv.notify_all();
  }
  void restore(std::istream& in) {
    shared& s = *s_;
    const std::uint64_t n = state::get_u64(in);
    if (n > s.capacity)
      throw invalid_argument_error("iterator state: " + std::to_string(n) +
                                   " buffered elements saved, the buffer holds " +
                                   std::to_string(s.capacity));
    s.slots.clear();
    for (std::uint64_t i = 0; i < n; ++i) {
      slot& r = s.slots.emplace_back();
      r.ready = true;
      switch (state::get_u64(in)) {
      case 0: r.end = true; break;
      case 1: r.error = get_error(in); break;
      default: r.value = state::get_element<Out>(in);
      }
    }
    s.input_done = !s.slots.empty() && s.slots.back().end;
    s.input.restore(in);
  }

private:
  void stop() noexcept {
    if (!s_)
      return;
    {
      std::lock_guard lock(s_->m);
      s_->stop = true;
    }
    s_->worker_cv.notify_all();
    for (auto& t : s_->threads)
      t.join();
    s_.reset();
  }

  struct slot {
    bool ready = false, end = false;
    std::optional<Out> value;
    std::exception_ptr error;
  };

  struct shared {
    shared(Input i, Fn f, std::size_t w, std::size_t c)
        : input(std::move(i)), fn(std::move(f)), workers(w), capacity(c) {}

    void work() {
      for (;;) {
        // input_order: one worker pulls at a time, and takes its slot while
        // pulling, so the slots are in the input's order.
        std::unique_lock order(input_order);
        std::unique_lock lock(m);
        worker_cv.wait(
            lock, [&] { return stop || (!input_done && pausing == 0 && slots.size() < capacity); });
        if (stop)
          return;
        slot& mine = slots.emplace_back(); // a deque's push_back keeps references
        ++busy;
        lock.unlock();
        std::optional<decltype(input.next())> pulled;
        std::exception_ptr error;
        try {
          pulled.emplace(input.next());
        } catch (...) {
          error = std::current_exception();
        }
        order.unlock();
        std::optional<Out> result;
        const bool end = !error && !pulled->has_value();
        if (!error && !end) {
          try {
            result.emplace(fn(std::move(**pulled)));
          } catch (...) {
            error = std::current_exception();
          }
        }
        lock.lock();
        mine.value = std::move(result);
        mine.error = error;
        mine.end = end;
        mine.ready = true;
        if (end)
          input_done = true;
        --busy;
        lock.unlock();
        consumer_cv.notify_all();
      }
    }

    Input input;
    Fn fn;
    std::size_t workers, capacity;
    std::mutex input_order, m;
    std::condition_variable worker_cv, consumer_cv;
    std::deque<slot> slots;
    bool stop = false, input_done = false;
    int busy = 0, pausing = 0;
    std::vector<std::thread> threads;
  };

  static void put_error(std::ostream& out, const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const loom::error& err) {
      state::put_u64(out, static_cast<std::uint64_t>(err.code()));
      state::put_string(out, err.message());
    } catch (const std::exception& err) {
      state::put_u64(out, static_cast<std::uint64_t>(error_code::unknown));
      state::put_string(out, err.what());
    }
  }
  static std::exception_ptr get_error(std::istream& in) {
    const auto code = static_cast<error_code>(state::get_u64(in));
    return std::make_exception_ptr(loom::error(code, state::get_string(in)));
  }

  std::unique_ptr<shared> s_;
};

} // namespace loom::data::detail

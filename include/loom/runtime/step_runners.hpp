// Threads for a task's work that may wait (runtime/task_server.hpp): the
// io threads never wait, so what could is handed to these.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/runtime/thread_role.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace loom::detail {

// Threads for what may wait and must not wait on an io thread: steps with
// blocking kernels, sends that must connect first, the ends of steps whose
// sends are not yet acknowledged. A job never waits for a free thread (it
// could be waiting for a job queued behind it): one is started whenever the
// queued jobs outnumber the idle threads, and idle ones are reused.
class step_runners {
public:
  step_runners() = default;
  step_runners(const step_runners&) = delete;
  step_runners& operator=(const step_runners&) = delete;
  ~step_runners() { stop(); }

  // False once stopped.
  bool submit(std::function<void()> fn);

  // Runs what is queued, then joins every thread.
  void stop();

private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  int idle_ = 0;
  bool stopping_ = false;
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE bool step_runners::submit(std::function<void()> fn) {
  std::lock_guard lock(mu_);
  if (stopping_)
    return false;
  queue_.push_back(std::move(fn));
  // Not `idle_ == 0`: an idle thread that was notified counts as idle until
  // it wakes, so two jobs submitted before it does would share it, and the
  // second would wait for the first to end (a take_gradient waited for a
  // barrier_wait that waited for it, until the barrier's timeout).
  if (queue_.size() > static_cast<std::size_t>(idle_))
    threads_.emplace_back([this] { loop(); });
  else
    cv_.notify_one();
  return true;
}

LOOM_COMPILED_ONCE void step_runners::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable())
      t.join();
}

LOOM_COMPILED_ONCE void step_runners::loop() {
  this_thread_role() = "runner";
  std::unique_lock lock(mu_);
  for (;;) {
    ++idle_;
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    --idle_;
    if (queue_.empty())
      return; // stopping
    auto fn = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    fn();
    lock.lock();
  }
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

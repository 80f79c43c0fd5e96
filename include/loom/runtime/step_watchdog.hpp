// Steps that wait for tensors from other tasks, watched so that none waits
// forever: when a step's deadline passes, or its `alive` check turns false
// (the client's connection closed; for a client in this process, another
// task's part of the step failed), the watchdog aborts it, which fails its
// _recvs. Checked every 200 ms: a closed connection gives no event of its
// own, and a deadline is a timer anyway. The thread starts on the first watch.
#pragma once

#include <loom/core/compiled_once.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace loom::detail {

class step_watchdog {
public:
  using clock = std::chrono::steady_clock;
  // Aborts `step`, saying why.
  using abort_fn = std::function<void(std::uint64_t step, const std::string& why)>;

  explicit step_watchdog(abort_fn abort) : abort_(std::move(abort)) {}
  step_watchdog(const step_watchdog&) = delete;
  step_watchdog& operator=(const step_watchdog&) = delete;
  ~step_watchdog() { stop(); }

  // Watches `step` until unwatch(step); `alive` is called under the
  // watchdog's lock, `lost` says why the step ends when it returns false.
  void watch(std::uint64_t step, clock::time_point deadline, std::function<bool()> alive,
             std::string lost);

  void unwatch(std::uint64_t step) {
    std::lock_guard lock(mu_);
    watched_.erase(step);
  }

  // Stops watching and joins the thread. Idempotent.
  void stop();

private:
  struct watched {
    clock::time_point deadline;
    std::function<bool()> alive;
    std::string lost;
  };

  void loop();

  abort_fn abort_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::uint64_t, watched> watched_;
  std::thread thread_;
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE void step_watchdog::watch(std::uint64_t step, clock::time_point deadline,
                                             std::function<bool()> alive, std::string lost) {
  std::lock_guard lock(mu_);
  watched_.insert_or_assign(step, watched{deadline, std::move(alive), std::move(lost)});
  if (!thread_.joinable() && !stopping_)
    thread_ = std::thread([this] { loop(); });
}

LOOM_COMPILED_ONCE void step_watchdog::stop() {
  std::thread t;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    t.swap(thread_);
  }
  cv_.notify_all();
  if (t.joinable())
    t.join();
}

LOOM_COMPILED_ONCE void step_watchdog::loop() {
  std::unique_lock lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return stopping_; })) {
    std::vector<std::pair<std::uint64_t, std::string>> expired;
    const auto now = clock::now();
    for (auto it = watched_.begin(); it != watched_.end();) {
      if (now >= it->second.deadline)
        expired.emplace_back(it->first, "the step's deadline passed");
      else if (!it->second.alive())
        expired.emplace_back(it->first, it->second.lost);
      else {
        ++it;
        continue;
      }
      it = watched_.erase(it);
    }
    lock.unlock();
    for (auto& [step, why] : expired)
      abort_(step, why);
    lock.lock();
  }
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

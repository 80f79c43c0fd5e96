// The rendezvous of one task: where a _send from another task leaves a tensor
// for the _recv with the same (step id, key), whichever of the two comes first
// (TF's Rendezvous). A tensor crosses the network once: the sender pushes it
// with its _send, and the receiving task's recv takes it from here.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/runtime/executor.hpp>

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace loom::detail {

class rendezvous_table {
public:
  using done_fn = step_rendezvous::recv_done;

  // A value for (step, key). Dropped when the step was aborted.
  void put(step_id step, const std::string& key, any_tensor value);

  // Calls done once the value for (step, key) is here, or the step is aborted.
  void recv(step_id step, const std::string& key, done_fn done);

  // Calls fn(reason) once if `step` is aborted or the table closes before
  // forget(id), at once if that already happened (then returns 0). fn runs
  // under the table's lock (see step_cancellation).
  std::uint64_t on_abort(step_id step, kernels::step_cancellation::callback fn);
  void forget(std::uint64_t id) {
    std::lock_guard lock(mu_);
    watchers_.erase(id);
  }

  // Fails every recv waiting in `step` (and any later one) with `reason`.
  void abort(step_id step, const std::string& reason);

  // Fails every waiting recv and every later one: the task is stopping.
  void close(const std::string& reason);

  // Forgets whatever a finished step left behind.
  void end_step(std::uint64_t step);

private:
  static constexpr std::size_t max_remembered_aborts = 4096;
  struct entry {
    std::optional<any_tensor> value;
    done_fn waiter;
  };
  std::mutex mu_;
  std::map<std::pair<std::uint64_t, std::string>, entry> entries_;
  struct watcher {
    step_id step;
    kernels::step_cancellation::callback fn;
  };
  std::map<std::uint64_t, watcher> watchers_;
  std::uint64_t last_watch_ = 0;
  std::map<std::uint64_t, std::string> aborted_;
  std::deque<std::uint64_t> aborted_order_;
  std::optional<std::string> closed_;
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE void rendezvous_table::put(step_id step, const std::string& key,
                                              any_tensor value) {
  done_fn waiter;
  {
    std::lock_guard lock(mu_);
    if (closed_ || aborted_.count(step))
      return;
    auto& e = entries_[{step, key}];
    if (e.value)
      throw already_exists_error("rendezvous: a second value for key '" + key + "' in step " +
                                 std::to_string(step));
    if (!e.waiter) {
      e.value = std::move(value);
      return;
    }
    waiter = std::move(e.waiter);
    entries_.erase({step, key});
  }
  waiter(std::move(value), nullptr);
}

LOOM_COMPILED_ONCE void rendezvous_table::recv(step_id step, const std::string& key, done_fn done) {
  any_tensor value;
  std::exception_ptr error;
  {
    std::lock_guard lock(mu_);
    if (closed_) {
      error = std::make_exception_ptr(unavailable_error(*closed_));
    } else if (auto a = aborted_.find(step); a != aborted_.end()) {
      error = std::make_exception_ptr(aborted_error(a->second));
    } else {
      auto& e = entries_[{step, key}];
      if (!e.value) {
        e.waiter = std::move(done);
        return;
      }
      value = std::move(*e.value);
      entries_.erase({step, key});
    }
  }
  done(std::move(value), error);
}

LOOM_COMPILED_ONCE std::uint64_t
rendezvous_table::on_abort(step_id step, kernels::step_cancellation::callback fn) {
  std::lock_guard lock(mu_);
  if (closed_) {
    fn(*closed_);
    return 0;
  }
  if (auto a = aborted_.find(step); a != aborted_.end()) {
    fn(a->second);
    return 0;
  }
  const std::uint64_t id = ++last_watch_;
  watchers_.emplace(id, watcher{step, std::move(fn)});
  return id;
}

LOOM_COMPILED_ONCE void rendezvous_table::abort(step_id step, const std::string& reason) {
  std::vector<done_fn> waiters;
  {
    std::lock_guard lock(mu_);
    if (!aborted_.emplace(step, reason).second)
      return;
    for (auto it = watchers_.begin(); it != watchers_.end();) {
      if (it->second.step != step) {
        ++it;
        continue;
      }
      it->second.fn(reason);
      it = watchers_.erase(it);
    }
    aborted_order_.push_back(step);
    if (aborted_order_.size() > max_remembered_aborts) {
      aborted_.erase(aborted_order_.front());
      aborted_order_.pop_front();
    }
    for (auto it = entries_.lower_bound({step, std::string()});
         it != entries_.end() && it->first.first == step;) {
      if (it->second.waiter)
        waiters.push_back(std::move(it->second.waiter));
      it = entries_.erase(it);
    }
  }
  for (auto& w : waiters)
    w({}, std::make_exception_ptr(aborted_error(reason)));
}

LOOM_COMPILED_ONCE void rendezvous_table::close(const std::string& reason) {
  std::vector<done_fn> waiters;
  {
    std::lock_guard lock(mu_);
    closed_ = reason;
    for (auto& [id, w] : watchers_)
      w.fn(reason);
    watchers_.clear();
    for (auto& [k, e] : entries_)
      if (e.waiter)
        waiters.push_back(std::move(e.waiter));
    entries_.clear();
  }
  for (auto& w : waiters)
    w({}, std::make_exception_ptr(unavailable_error(reason)));
}

LOOM_COMPILED_ONCE void rendezvous_table::end_step(std::uint64_t step) {
  std::lock_guard lock(mu_);
  for (auto it = entries_.lower_bound({step, std::string()});
       it != entries_.end() && it->first.first == step;)
    it = entries_.erase(it);
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

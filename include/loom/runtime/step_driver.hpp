// How a step of a registered partition runs on its task: the one way, whether a
// master's request asked for it (on the io thread that received the request) or
// a session in this process did (on the session's own thread). TF's Worker does
// this in DoRunGraph, with the executor's RunAsync.
//
// Which thread runs what is the whole difficulty, and three rules decide it:
// - An io thread never waits: what it would wait for (a tensor, a send's
//   acknowledgement, a peer's handshake) may need that very thread. So a step
//   started on one runs until it waits for a tensor, and goes on on the io
//   thread that receives it (start_plan); its end, which waits for its sends to
//   be acknowledged, moves to a runner thread when they are not yet.
// - A partition with blocking kernels (a sync-replicas queue, a barrier) waits
//   inside a kernel, so it runs to its end on a thread that may wait: a runner,
//   or the session's own thread.
// - A step that may wait is watched (runtime/step_watchdog.hpp): past its
//   deadline, or once its client is gone, the watchdog aborts it, because
//   nobody else would stop it waiting.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/runtime/executor.hpp>
#include <loom/runtime/graph_manager.hpp>
#include <loom/runtime/remote_worker.hpp>
#include <loom/runtime/rendezvous.hpp>
#include <loom/runtime/step_runners.hpp>
#include <loom/runtime/step_tracer.hpp>
#include <loom/runtime/step_transfers.hpp>
#include <loom/runtime/step_watchdog.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace loom::detail {

struct step_run_options {
  using clock = std::chrono::steady_clock;
  // The step fails with deadline_exceeded past it; `timeout` is what the error says.
  clock::time_point deadline = clock::time_point::max();
  std::chrono::milliseconds timeout{0};
  // Polled while the step waits: false ends it, saying `unwanted` (the client that started
  // it disconnected; another task's part of it failed).
  std::function<bool()> wanted{};
  std::string unwanted{};
  // The caller's thread may wait (a session's own thread), and run() returns only once
  // `done` ran; else (an io thread) run() returns as soon as the step waits.
  bool caller_may_wait = false;
  // Records the step's items, where given; the caller keeps it until `done`.
  step_tracer* tracer = nullptr;
};

// Called once, with the step's fetched values (in the order of the partition's request)
// or the error that ended it, naming the task.
using step_done_fn = std::function<void(std::vector<any_tensor> fetched, std::exception_ptr)>;

class step_driver {
public:
  using clock = std::chrono::steady_clock;

  // `task` names the task in errors. The others are the task's, and outlive the driver.
  step_driver(std::string task, const kernels::cpu_device& device,
              kernels::resource_access& resources, rendezvous_table& table, worker_cache& peers,
              step_runners& runners, step_watchdog& watchdog)
      : task_(std::move(task)), device_(device), resources_(resources), table_(table),
        peers_(peers), runners_(runners), watchdog_(watchdog) {}

  // Runs step `step` of `part` with `feeds` (in the order of its fed nodes); calls `done`
  // once. Throws (without calling done) only where the step could not start: the task is
  // shutting down.
  void run(std::shared_ptr<registered_partition> part, step_id step, std::vector<any_tensor> feeds,
           step_run_options o, step_done_fn done);

private:
  // Where a started step's plan ended: its fetches, or the error that ended it.
  struct plan_end {
    std::vector<any_tensor> fetched;
    std::exception_ptr error;
  };

  // A step aborted by the watchdog past its deadline fails as a call past its deadline.
  std::exception_ptr past_deadline(std::exception_ptr error, clock::time_point deadline,
                                   std::chrono::milliseconds timeout) const;

  // Runs one step of `part` to its end on this thread; returns its fetches. On failure
  // the step is aborted here and on its peers, and the error names this task.
  std::vector<any_tensor> execute(registered_partition& part, step_id step,
                                  std::vector<any_tensor> feeds, step_tracer* tracer);

  // Starts one step of `part` (not one that blocks): it runs on this thread until it
  // waits for a tensor, then on the thread that delivers it. `ended` is called once, on
  // the thread that ran the plan last, often an io thread, which must not wait:
  // end_started() ends the step on a thread that may.
  void start(registered_partition& part, std::vector<any_tensor> feeds, step_transfers& transfers,
             std::function<void(plan_end)> ended, step_tracer* tracer);

  // Ends a started step as execute() would: returns its fetches or throws the error
  // naming this task. Waits for the step's sends to be acknowledged.
  std::vector<any_tensor> end_started(registered_partition& part, step_id step,
                                      step_transfers& transfers, plan_end& end);

  // A step that ran: waits until what it sent was delivered, ends it in the rendezvous.
  void end_step(step_id step, step_transfers& transfers) {
    transfers.wait_sent();
    table_.end_step(step);
  }

  // A step of `part` that failed with `e`: aborted here and on its peers. Returns the
  // error to report, naming this task.
  std::exception_ptr step_failed(registered_partition& part, step_id step,
                                 step_transfers& transfers, std::exception_ptr e);

  // A failed partition aborts its step here and on the tasks it exchanges
  // tensors with: a peer waiting for a tensor this partition will never send
  // must not wait for it forever (the master hears of the failure only once
  // the other partitions answer).
  void fail_step(registered_partition& part, step_id step, step_transfers& transfers,
                 const std::string& reason) noexcept;

  std::string task_;
  const kernels::cpu_device& device_;
  kernels::resource_access& resources_;
  rendezvous_table& table_;
  worker_cache& peers_;
  step_runners& runners_;
  step_watchdog& watchdog_;
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE void step_driver::run(std::shared_ptr<registered_partition> part, step_id step,
                                         std::vector<any_tensor> feeds, step_run_options o,
                                         step_done_fn done) {
  const bool watched = part->may_wait;
  if (watched)
    watchdog_.watch(
        step, o.deadline, o.wanted ? o.wanted : [] { return true; }, o.unwanted);
  auto finish = [this, step, watched, deadline = o.deadline, timeout = o.timeout,
                 done = std::move(done)](std::vector<any_tensor> out, std::exception_ptr error) {
    if (watched)
      watchdog_.unwatch(step);
    done(std::move(out), past_deadline(error, deadline, timeout));
  };
  const bool here = o.caller_may_wait && (part->p.blocks() || !part->may_wait);
  if (here) { // to its end on this thread
    std::vector<any_tensor> out;
    std::exception_ptr error;
    try {
      out = execute(*part, step, std::move(feeds), o.tracer);
    } catch (...) {
      error = std::current_exception();
    }
    finish(std::move(out), error);
    return;
  }
  if (part->p.blocks()) { // to its end on a runner: its kernels wait
    auto job = std::make_shared<std::vector<any_tensor>>(std::move(feeds));
    if (!runners_.submit(
            [this, part, step, job, tracer = o.tracer, finish = std::move(finish)]() mutable {
              std::vector<any_tensor> out;
              std::exception_ptr error;
              try {
                out = execute(*part, step, std::move(*job), tracer);
              } catch (...) {
                error = std::current_exception();
              }
              finish(std::move(out), error);
            })) {
      if (watched)
        watchdog_.unwatch(step);
      throw unavailable_error(task_ + " is shutting down");
    }
    return;
  }
  // Here until it waits for a tensor, then where its tensors arrive.
  auto transfers = std::make_shared<step_transfers>(table_, peers_, runners_, step);
  if (o.caller_may_wait) { // this thread waits for the plan's end, and ends the step
    std::promise<plan_end> ended;
    std::future<plan_end> plan_ended = ended.get_future();
    std::vector<any_tensor> out;
    std::exception_ptr error;
    try {
      start(
          *part, std::move(feeds), *transfers,
          [&ended](plan_end end) { ended.set_value(std::move(end)); }, o.tracer);
      plan_end end = plan_ended.get();
      out = end_started(*part, step, *transfers, end);
    } catch (...) {
      error = std::current_exception();
    }
    finish(std::move(out), error);
    return;
  }
  // Shared, not copied into each continuation: the catch below may need it too.
  auto ends = std::make_shared<decltype(finish)>(std::move(finish));
  try {
    start(
        *part, std::move(feeds), *transfers,
        [this, part, step, transfers, ends](plan_end end) {
          // Ending waits for the sends' acknowledgements: where it would, on a runner
          // thread, not on the io thread that may be here.
          const bool end_here = end.error || transfers->sends_delivered();
          std::function<void()> answer = [this, part, step, transfers, ends,
                                          end = std::move(end)]() mutable {
            std::vector<any_tensor> out;
            std::exception_ptr error;
            try {
              out = end_started(*part, step, *transfers, end);
            } catch (...) {
              error = std::current_exception();
            }
            (*ends)(std::move(out), error);
          };
          if (end_here || !runners_.submit(answer))
            answer();
        },
        o.tracer);
  } catch (...) { // the plan did not start (its feeds): its callback never runs
    (*ends)({}, step_failed(*part, step, *transfers, std::current_exception()));
  }
}

LOOM_COMPILED_ONCE auto step_driver::past_deadline(std::exception_ptr error,
                                                   clock::time_point deadline,
                                                   std::chrono::milliseconds timeout) const
    -> std::exception_ptr {
  if (!error || timeout.count() <= 0 || clock::now() < deadline)
    return error;
  try {
    std::rethrow_exception(error);
  } catch (const aborted_error& e) {
    return std::make_exception_ptr(
        deadline_exceeded_error(task_ + ": the step did not complete within " +
                                std::to_string(timeout.count()) + " ms (" + e.message() + ")"));
  } catch (...) {
    return error;
  }
}

LOOM_COMPILED_ONCE auto step_driver::execute(registered_partition& part, step_id step,
                                             std::vector<any_tensor> feeds, step_tracer* tracer)
    -> std::vector<any_tensor> {
  step_transfers transfers(table_, peers_, runners_, step);
  try {
    std::vector<any_tensor> out = run_plan(part.p, part.caches, part.g, std::move(feeds), device_,
                                           resources_, &transfers, tracer);
    end_step(step, transfers);
    return out;
  } catch (...) {
    std::rethrow_exception(step_failed(part, step, transfers, std::current_exception()));
  }
}

LOOM_COMPILED_ONCE void step_driver::start(registered_partition& part,
                                           std::vector<any_tensor> feeds, step_transfers& transfers,
                                           std::function<void(plan_end)> ended,
                                           step_tracer* tracer) {
  start_plan(
      part.p, part.caches, part.g, std::move(feeds), device_, resources_, transfers,
      [ended = std::move(ended)](std::vector<any_tensor>& fetched, std::exception_ptr error) {
        ended({std::move(fetched), error});
      },
      tracer);
}

LOOM_COMPILED_ONCE auto step_driver::end_started(registered_partition& part, step_id step,
                                                 step_transfers& transfers, plan_end& end)
    -> std::vector<any_tensor> {
  try {
    if (end.error)
      std::rethrow_exception(end.error);
    end_step(step, transfers);
    return std::move(end.fetched);
  } catch (...) {
    std::rethrow_exception(step_failed(part, step, transfers, std::current_exception()));
  }
}

LOOM_COMPILED_ONCE auto step_driver::step_failed(registered_partition& part, step_id step,
                                                 step_transfers& transfers, std::exception_ptr e)
    -> std::exception_ptr {
  error_code code = error_code::internal;
  std::string what;
  try {
    std::rethrow_exception(e);
  } catch (const error& x) {
    code = x.code();
    what = x.message();
  } catch (const std::exception& x) {
    what = x.what();
  } catch (...) {
    what = "an unknown exception";
  }
  const std::string reason = task_ + ": " + what;
  fail_step(part, step, transfers, reason);
  try {
    net::throw_error(code, reason);
  } catch (...) {
    return std::current_exception();
  }
}

LOOM_COMPILED_ONCE void step_driver::fail_step(registered_partition& part, step_id step,
                                               step_transfers& transfers,
                                               const std::string& reason) noexcept {
  transfers.cancel_sends();
  table_.abort(step, reason);
  for (const std::string& peer : part.peers) {
    try {
      remote_worker& w = peers_.worker(peer);
      auto abort = [&w, step, reason] { w.abort_step(step, reason); };
      // Connecting waits: not on a thread that may be an io thread.
      if (w.connected() || !runners_.submit(abort))
        abort();
    } catch (...) {
    }
  }
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

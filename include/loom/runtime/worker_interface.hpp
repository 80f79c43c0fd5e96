// What a master asks of a cluster task (TF's WorkerInterface): who it is,
// register, run and deregister graph partitions, abort a step, clear resource
// containers, stop serving. Two implementations: a remote one over the message
// layer (runtime/remote_worker.hpp), and the task's own worker service in the
// same process (runtime/in_process_worker.hpp), which a session whose target serves here runs
// its partition through on its own thread, feeds and fetches handed over in
// memory (TF's LocalMaster/LocalWorker).
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/graph/graph.hpp>
#include <loom/runtime/interfaces.hpp>
#include <loom/runtime/protocol.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace loom::detail {

// A step of a partition that a worker started: get() waits for its fetched
// values (or throws the task's error). An in-process worker's step runs in
// get(), on the caller's thread (runs_on_caller()): a master starts the remote
// ones first and runs it while they run. One allocation per step: the
// worker's own state (a remote call's handle, or the deferred run).
class pending_run {
public:
  struct state {
    virtual ~state() = default;
    virtual std::vector<any_tensor> get() = 0;
    // True once the step is known to have failed; never waits.
    virtual bool failed() { return false; }
    virtual bool runs_on_caller() const noexcept { return false; }
  };

  pending_run() = default;
  explicit pending_run(std::unique_ptr<state> s) : state_(std::move(s)) {}

  bool valid() const noexcept { return static_cast<bool>(state_); }
  bool runs_on_caller() const noexcept { return state_ && state_->runs_on_caller(); }
  bool failed() const { return state_ && state_->failed(); }
  // Once: the state goes with the values.
  std::vector<any_tensor> get() { return std::unique_ptr<state>(std::move(state_))->get(); }

private:
  std::unique_ptr<state> state_;
};

struct run_graph_options {
  // The step fails with deadline_exceeded past it (0: no limit).
  std::chrono::milliseconds timeout{0};
  // For a step run on the caller's thread: polled while it waits for tensors,
  // true when another task's part of the step failed (nobody else would tell
  // the caller's thread to stop waiting).
  std::function<bool()> others_failed{};
  // Where given, the task traces the step (run_options' trace_level::full) and
  // get() leaves its trace here.
  task_trace* trace = nullptr;
};

class worker_interface {
public:
  virtual ~worker_interface() = default;

  virtual protocol::cluster_info_reply cluster_info() = 0;
  // Registers `partition` (fetching, feeding and running what `req` names, as
  // node ids of the partition) and returns its handle.
  virtual std::uint64_t register_graph(const graph& partition, const run_request& req) = 0;
  // Drops a registered partition. Best effort: returns what waits for the
  // answer, or nothing where the task is not reachable without dialling it.
  virtual std::function<void()> deregister_graph(std::uint64_t handle) noexcept = 0;
  // Starts one step of partition `handle`; feeds in the order of its req.fed.
  virtual pending_run run_graph(std::uint64_t handle, step_id step, std::vector<any_tensor> feeds,
                                const run_graph_options& o) = 0;
  // Fails step `step` here (its waiting _recvs); best effort.
  virtual void abort_step(step_id step, const std::string& reason) noexcept = 0;
  // Clears the named resource containers (all when empty), connecting and
  // answering before `deadline`.
  virtual void reset(const std::vector<std::string>& containers,
                     std::chrono::steady_clock::time_point deadline) = 0;
  // Stops the task serving (its server's join() returns), connecting and
  // answering before `deadline`.
  virtual void shutdown(std::chrono::steady_clock::time_point deadline) = 0;
};

// The workers of the task servers in this process, by their servers' instance
// ids (cluster_info_reply::instance): how a session made from a target string
// finds that its target serves in its own process. A lookup, as TF's
// LocalMaster registry is, because a target is a string a user may type; it
// holds the workers weakly, and a worker whose server stopped says so.
class local_workers {
public:
  static void add(std::uint64_t instance, std::weak_ptr<worker_interface> w) {
    std::lock_guard lock(mu());
    table()[instance] = std::move(w);
  }
  static void remove(std::uint64_t instance) {
    std::lock_guard lock(mu());
    table().erase(instance);
  }
  static std::shared_ptr<worker_interface> find(std::uint64_t instance);

private:
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::map<std::uint64_t, std::weak_ptr<worker_interface>>& table() {
    static std::map<std::uint64_t, std::weak_ptr<worker_interface>> t;
    return t;
  }
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE auto local_workers::find(std::uint64_t instance)
    -> std::shared_ptr<worker_interface> {
  std::lock_guard lock(mu());
  auto it = table().find(instance);
  return it == table().end() ? nullptr : it->second.lock();
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

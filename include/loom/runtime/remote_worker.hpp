// A cluster task reached over the message layer (TF's GrpcRemoteWorker), and
// the cache of them one process keeps (TF's WorkerCache): one channel per
// task, opened on first use, shared by a session's master (partitions, steps)
// and a task server's steps (tensors and aborts sent to their peers).
#pragma once

#include <loom/cluster/cluster_spec.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/device_spec.hpp>
#include <loom/graph/serialize.hpp>
#include <loom/net/rpc.hpp>
#include <loom/runtime/protocol.hpp>
#include <loom/runtime/worker_interface.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace loom::detail {

// "/job:ps/replica:0/task:1" for (ps, 1): how tasks are named in device
// strings, partitions and messages.
inline std::string task_name(const std::string& job, int task) {
  return "/job:" + job + "/replica:0/task:" + std::to_string(task);
}

class remote_worker final : public worker_interface {
public:
  remote_worker(const std::string& address, net::channel_options o)
      : channel_(address, std::move(o)) {}

  // Whether the channel is up: a call then never waits to connect, so it may
  // be made from an io thread.
  bool connected() const noexcept { return channel_.connected(); }
  void stop() { channel_.stop(); }

  protocol::cluster_info_reply cluster_info() override {
    return channel_.call(protocol::cluster_info).metadata<protocol::cluster_info_reply>();
  }

  std::uint64_t register_graph(const graph& partition, const run_request& req) override;

  // Not dialled for: a task this process is not connected to has nothing of
  // its to drop, or is gone (a cluster shut down). Each answer is awaited for
  // a second at most.
  std::function<void()> deregister_graph(std::uint64_t handle) noexcept override;

  pending_run run_graph(std::uint64_t handle, step_id step, std::vector<any_tensor> feeds,
                        const run_graph_options& o) override;

  // Dials a task never reached (it may wait for a tensor of the step), but not
  // one whose connection was lost: it is gone or restarted, and has not the
  // step either way.
  void abort_step(step_id step, const std::string& reason) noexcept override;

  void reset(const std::vector<std::string>& containers,
             std::chrono::steady_clock::time_point deadline) override {
    channel_.call(protocol::reset, protocol::reset_request{containers}, {}, until(deadline));
  }

  void shutdown(std::chrono::steady_clock::time_point deadline) override {
    channel_.call(protocol::shutdown, net::empty{}, {}, until(deadline));
  }

  // Hands a step's tensors, keyed as its _recvs wait for them, to this task's
  // rendezvous; the handle completes when the task has them. The push side of
  // TF's RecvTensor, and not part of worker_interface: a task's tensors for
  // itself go to its own rendezvous table, never through a worker.
  net::call_handle put_tensors(protocol::rendezvous_put_request m, std::vector<any_tensor> values) {
    m.strings = protocol::string_values::take(values);
    return channel_.call_async(protocol::rendezvous_put, std::move(m), std::move(values));
  }

private:
  static net::call_options until(std::chrono::steady_clock::time_point deadline) {
    net::call_options co;
    co.deadline = deadline;
    return co;
  }

  struct pending_call final : pending_run::state {
    pending_call(net::call_handle c, task_trace* t) : call(std::move(c)), trace(t) {}
    std::vector<any_tensor> get() override;
    bool failed() override { return call.failed(); }
    net::call_handle call;
    task_trace* trace; // null: not traced
  };

  net::channel channel_;
};

// The remote workers of a cluster's tasks, by task name, each connected on
// first use with the same options (named after its task).
class worker_cache {
public:
  worker_cache(cluster_spec cluster, net::channel_options o)
      : cluster_(std::move(cluster)), options_(std::move(o)) {}

  worker_cache(const worker_cache&) = delete;
  worker_cache& operator=(const worker_cache&) = delete;

  const cluster_spec& cluster() const noexcept { return cluster_; }

  // Task `task` ("/job:ps/replica:0/task:0"): invalid_argument_error when the
  // cluster has no such task.
  remote_worker& worker(const std::string& task);

  // Every task of the cluster, by name, in the cluster spec's order.
  std::vector<std::string> tasks() const;

  void stop() {
    std::lock_guard lock(mu_);
    for (auto& [name, w] : workers_)
      w->stop();
  }

private:
  cluster_spec cluster_;
  net::channel_options options_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<remote_worker>> workers_;
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE std::uint64_t remote_worker::register_graph(const graph& partition,
                                                               const run_request& req) {
  protocol::register_graph_request m;
  m.graph = serialize_graph(partition);
  m.fetches.assign(req.fetches.begin(), req.fetches.end());
  m.fed.assign(req.fed.begin(), req.fed.end());
  m.targets.assign(req.targets.begin(), req.targets.end());
  return channel_.call(protocol::register_graph, m)
      .metadata<protocol::register_graph_reply>()
      .handle;
}

LOOM_COMPILED_ONCE auto remote_worker::deregister_graph(std::uint64_t handle) noexcept
    -> std::function<void()> {
  try {
    net::call_options co;
    co.timeout = std::chrono::seconds(1);
    co.dial = false;
    net::call_handle c = channel_.call_async(protocol::deregister_graph,
                                             protocol::deregister_graph_request{handle}, {}, co);
    return [c]() mutable {
      try {
        c.get();
      } catch (...) {
      }
    };
  } catch (...) {
    return {};
  }
}

LOOM_COMPILED_ONCE auto remote_worker::run_graph(std::uint64_t handle, step_id step,
                                                 std::vector<any_tensor> feeds,
                                                 const run_graph_options& o) -> pending_run {
  protocol::run_graph_request m{handle, step};
  m.strings = protocol::string_values::take(feeds);
  m.trace = o.trace != nullptr;
  net::call_options co;
  if (o.timeout.count() > 0)
    co.timeout = o.timeout;
  return pending_run(std::make_unique<pending_call>(
      channel_.call_async(protocol::run_graph, std::move(m), std::move(feeds), co), o.trace));
}

LOOM_COMPILED_ONCE void remote_worker::abort_step(step_id step,
                                                  const std::string& reason) noexcept {
  try {
    net::call_options co;
    co.dial = !channel_.ever_connected();
    channel_.call_async(protocol::abort_step, protocol::abort_step_request{step, reason}, {}, co);
  } catch (...) { // the task may be the one that failed
  }
}

LOOM_COMPILED_ONCE auto remote_worker::pending_call::get() -> std::vector<any_tensor> {
  net::response res = call.get();
  auto reply = res.metadata<protocol::run_graph_reply>();
  std::move(reply.strings).restore(res.payloads);
  if (trace && !reply.trace.empty())
    *trace = std::move(reply.trace.front());
  return std::move(res.payloads);
}

LOOM_COMPILED_ONCE auto worker_cache::worker(const std::string& task) -> remote_worker& {
  std::lock_guard lock(mu_);
  auto it = workers_.find(task);
  if (it != workers_.end())
    return *it->second;
  const device_spec d = device_spec::from_string(task);
  if (!d.job() || !d.task() || !cluster_.has_task(*d.job(), *d.task()))
    throw invalid_argument_error("no task named '" + task + "' in the cluster");
  net::channel_options o = options_;
  o.peer_name = *d.job() + " task " + std::to_string(*d.task());
  auto w = std::make_unique<remote_worker>(cluster_.task_address(*d.job(), *d.task()), o);
  return *workers_.emplace(task, std::move(w)).first->second;
}

LOOM_COMPILED_ONCE auto worker_cache::tasks() const -> std::vector<std::string> {
  std::vector<std::string> out;
  for (const auto& j : cluster_.jobs())
    for (int t : cluster_.task_indices(j))
      out.push_back(detail::task_name(j, t));
  return out;
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// The master of a session on a cluster target (TF's MasterSession). It runs in
// the client's process: it asks the target task for the cluster, places the
// nodes a request needs, partitions them per task, registers each partition
// with its task once per graph version and request, and runs steps: every
// task runs its partition concurrently under one step id, and tensors that
// cross tasks move between the tasks directly, once.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/runtime/interfaces.hpp>
#include <loom/runtime/partition.hpp>
#include <loom/runtime/protocol.hpp>
#include <loom/runtime/remote_worker.hpp>
#include <loom/runtime/step_tracer.hpp>
#include <loom/runtime/trace_alignment.hpp>
#include <loom/runtime/worker_interface.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace loom::detail {

// A session's target -> "host:port". Accepted: a server's target()
// ("loom://host:port"), TF's form ("grpc://host:port", so strings carried over
// from a TF program work) and a bare "host:port".
LOOM_COMPILED_ONCE std::string target_address(const std::string& target);

class cluster_master final : public master_interface {
public:
  using clock = std::chrono::steady_clock;

  cluster_master(std::string target, cluster_session_options o = {});

  cluster_master(const cluster_master&) = delete;
  cluster_master& operator=(const cluster_master&) = delete;

  // Deregisters the session's graphs from their tasks (TF's MasterSession::Close
  // does): a task keeps a registered partition, its plan and what the plan
  // keeps until told, and a long-lived ps serves many sessions.
  ~cluster_master() { forget_registrations(); }

  const cluster_spec& cluster() const noexcept { return workers_->cluster(); }
  // The target's task: where nodes without a device run (TF places them on the master's task).
  std::string default_task() const { return detail::task_name(job_, task_); }

  // Runs one step: `feeds` in the order of req.fed; returns the fetched values in
  // the order of req.fetches. The other tasks' partitions start first; the
  // target's own, when the target serves in this process, then runs on this
  // thread, its feeds and fetches handed over in memory. A traced step
  // (`trace` given) asks every task for its trace and puts them on this
  // process's clock (trace_alignment.hpp).
  std::vector<any_tensor> run(const graph& g, const run_request& req, std::vector<any_tensor> feeds,
                              step_stats* trace) override;

  // Clears resource containers on every task (TF's Session.reset), all asked
  // at once; throws the first failure, naming every task not reset.
  void reset(const std::vector<std::string>& containers, clock::time_point deadline);

  // Tells every task (of `jobs`, when given) to stop serving, all at once:
  // their join() returns. A task not reached by `deadline` is reported, not
  // waited for longer.
  shutdown_report shutdown_cluster(const std::vector<std::string>& jobs,
                                   clock::time_point deadline);

  // Asks every task (of `jobs`, when given) whether it serves, all at once;
  // a task not connected within the session's connect_timeout did not.
  ping_report ping(const std::vector<std::string>& jobs);

private:
  struct task_failure {
    std::string task;
    error_code code;
    std::string message;
  };

  // The cluster's tasks of `jobs` (all when empty), in the cluster's order.
  std::vector<std::string> tasks_of(const std::vector<std::string>& jobs) const;

  // Sorts `tasks` by on_each_task's outcome: those that did not fail, and
  // "<task>: <why>" for those that did (both in `tasks`' order).
  static void split(const std::vector<std::string>& tasks, const std::vector<task_failure>& failed,
                    std::vector<std::string>& ok, std::vector<std::string>& not_ok);

  // Calls `call` on the worker of every task in `tasks` at once, each on a
  // thread of its own (connecting waits), and returns the tasks whose call
  // threw, with what it threw, in `tasks`' order.
  template <class F>
  std::vector<task_failure> on_each_task(const std::vector<std::string>& tasks, F call) {
    std::vector<std::optional<task_failure>> outcome(tasks.size());
    std::vector<std::thread> threads;
    threads.reserve(tasks.size());
    for (std::size_t i = 0; i < tasks.size(); ++i)
      threads.emplace_back([&, i] {
        try {
          call(worker(tasks[i]));
        } catch (const error& e) {
          outcome[i] = task_failure{tasks[i], e.code(), e.message()};
        } catch (const std::exception& e) {
          outcome[i] = task_failure{tasks[i], error_code::internal, e.what()};
        } catch (...) {
          outcome[i] = task_failure{tasks[i], error_code::unknown, "an unknown exception"};
        }
      });
    for (auto& t : threads)
      t.join();
    std::vector<task_failure> failed;
    for (auto& o : outcome)
      if (o)
        failed.push_back(std::move(*o));
    return failed;
  }

  struct part_handle {
    std::string task;
    std::uint64_t handle = 0;
    // Its fetches' and feeds' positions in the request's fetches and fed nodes.
    std::vector<std::size_t> fetch_at, fed_at;
  };
  struct registered {
    std::vector<part_handle> parts;
  };

  // Whether p is an `aborted` error (a restarted task, or another task's failure).
  static bool is_abort(const std::exception_ptr& p);

  // The worker of `task`: the target's own where it serves in this process.
  worker_interface& worker(const std::string& task) {
    if (local_ && task == default_task())
      return *local_;
    return workers_->worker(task);
  }

  void abort_step(const registered& r, step_id step, const std::string& reason) {
    for (const auto& p : r.parts)
      worker(p.task).abort_step(step, reason);
  }

  // The tasks whose GPUs a node asks for: its request's task; every task of
  // its request's job when it names no task; the target when it names no job.
  // A job or task the cluster lacks is left to the placer's error.
  std::set<std::string> tasks_asked_for_gpus(const std::vector<node_def>& nodes) const;

  // How many GPUs `task` can place nodes on: the target's from its
  // cluster_info at construction, another task's from its own (checked_info).
  int gpus_of(const std::string& task) {
    return task == default_task() ? target_gpus_ : checked_info(task).gpus;
  }

  // What `task` says of itself (cluster_info), asked once, and checked: the
  // server at the address this session's cluster spec gives for the task
  // must be that task. A host list that names another task's address (ps
  // hosts pasted in another order, a worker's port in the ps list) fails
  // here, before a partition is registered with the wrong task; TF would
  // place the variables there.
  protocol::cluster_info_reply checked_info(const std::string& task);

  // Tells each task of `regs` to drop its partitions. Best effort: a task
  // that is gone, or that restarted, has nothing to drop, and one this process
  // is not connected to is not dialled for it. Called under mu_, it only
  // starts the calls: the caller waits for them with await_quietly after
  // releasing mu_, so that other steps do not wait on a slow task's answer.
  std::vector<std::function<void()>>
  send_deregistrations(const std::vector<std::shared_ptr<registered>>& regs) noexcept;

  // Waits for the answers (each times out after a second; they run
  // concurrently), ignoring failures.
  static void await_quietly(std::vector<std::function<void()>>& waits) noexcept {
    for (auto& w : waits)
      w();
  }

  std::vector<std::shared_ptr<registered>> all_registered() const {
    std::vector<std::shared_ptr<registered>> out;
    for (const auto& [key, r] : registered_)
      out.push_back(r);
    return out;
  }

  // Drops every registration (deregistering them) so that each request's next
  // run registers it again, with tasks asked again who they are (one may have
  // restarted); a step still running one keeps its reference.
  void forget_registrations();

  // The request's partitions, registered with their tasks on its first run.
  // Shared: a step keeps its registration while another thread drops it.
  std::shared_ptr<registered> registration(const graph& g, const run_request& req);

  std::string target_;
  cluster_session_options options_;
  placement_log placement_log_{options_.placement_log}; // each line once for the graph
  std::string job_;
  int task_ = 0;
  int target_gpus_ = 0;
  std::unique_ptr<worker_cache> workers_;
  // The target's worker when it serves in this process (null otherwise).
  std::shared_ptr<worker_interface> local_;
  // Other tasks' cluster_info, asked before the first registration with them.
  std::map<std::string, protocol::cluster_info_reply> task_info_;
  std::mutex mu_;
  std::mt19937_64 step_ids_;
  std::map<std::string, std::shared_ptr<registered>> registered_;
  std::uint64_t registered_version_ = 0;
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE std::string target_address(const std::string& target) {
  const auto wrong = [&](const std::string& what) {
    return invalid_argument_error("session target '" + target + "': " + what +
                                  "; expected \"loom://host:port\" (or TF's "
                                  "\"grpc://host:port\", or \"host:port\")");
  };
  std::string address = target;
  if (const auto end = address.find("://"); end != std::string::npos) {
    const std::string scheme = address.substr(0, end);
    if (scheme != "loom" && scheme != "grpc")
      throw wrong("the scheme '" + scheme + "://' is not one");
    address = address.substr(end + 3);
  }
  host_port hp;
  try {
    hp = parse_host_port(address); // the cluster spec's address rules
  } catch (const invalid_argument_error& e) {
    throw wrong(e.message());
  }
  if (hp.port == 0)
    throw wrong("port 0 is no server's port");
  return address;
}

LOOM_COMPILED_ONCE cluster_master::cluster_master(std::string target, cluster_session_options o)
    : target_(std::move(target)), options_(std::move(o)) {
  net::channel_options co;
  co.token = options_.token;
  co.tls = options_.tls;
  co.liveness = options_.liveness;
  co.connect_timeout = options_.connect_timeout;
  if (options_.quiet)
    co.log = [](std::string_view) {};
  protocol::cluster_info_reply info;
  {
    net::channel_options first = co;
    first.peer_name = "session target " + target_;
    remote_worker target_task(detail::target_address(target_), first);
    info = target_task.cluster_info();
    target_task.stop();
  }
  job_ = info.job;
  task_ = info.task;
  target_gpus_ = info.gpus;
  workers_ = std::make_unique<worker_cache>(info.cluster.spec(), co);
  local_ = local_workers::find(info.instance);
  std::random_device rd;
  step_ids_.seed((static_cast<std::uint64_t>(rd()) << 32) ^ rd());
}

LOOM_COMPILED_ONCE auto cluster_master::run(const graph& g, const run_request& req,
                                            std::vector<any_tensor> feeds, step_stats* trace)
    -> std::vector<any_tensor> {
  const std::shared_ptr<registered> reg = registration(g, req);
  const registered& r = *reg;
  step_id step;
  {
    std::lock_guard lock(mu_);
    step = step_ids_();
  }
  // Every task's part starts; the target's own, where it serves in this
  // process, runs on this thread below (runs_on_caller) while the others run.
  std::vector<pending_run> runs(r.parts.size());
  std::vector<any_tensor> fetched(req.fetches.size());
  run_graph_options ro;
  ro.timeout = options_.step_timeout;
  ro.others_failed = [&runs] {
    return std::any_of(runs.begin(), runs.end(), [](const pending_run& p) {
      return p.valid() && !p.runs_on_caller() && p.failed();
    });
  };
  // A traced step: each task's trace, and when its request went and its answer came.
  std::vector<timed_task_trace> traces(trace ? r.parts.size() : 0);
  const std::int64_t start = trace ? steady_now_ns() : 0;
  for (std::size_t i = 0; i < r.parts.size(); ++i) {
    const part_handle& p = r.parts[i];
    std::vector<any_tensor> fed;
    fed.reserve(p.fed_at.size());
    for (std::size_t at : p.fed_at)
      fed.push_back(feeds[at]);
    if (!trace) {
      runs[i] = worker(p.task).run_graph(p.handle, step, std::move(fed), ro);
      continue;
    }
    run_graph_options traced = ro;
    traced.trace = &traces[i].trace;
    traces[i].task = p.task;
    traces[i].sent_ns = steady_now_ns();
    runs[i] = worker(p.task).run_graph(p.handle, step, std::move(fed), traced);
  }
  std::exception_ptr first;
  bool aborted = false;
  auto collect = [&](std::size_t i) {
    try {
      std::vector<any_tensor> out = runs[i].get();
      const part_handle& p = r.parts[i];
      if (trace) {
        traces[i].answer_ns = steady_now_ns();
        if (traces[i].trace.answered_ns == 0)
          throw internal_error(p.task + " answered a traced step without its trace");
      }
      if (out.size() != p.fetch_at.size())
        throw internal_error(p.task + " returned " + std::to_string(out.size()) +
                             " fetches, expected " + std::to_string(p.fetch_at.size()));
      for (std::size_t k = 0; k < p.fetch_at.size(); ++k)
        fetched[p.fetch_at[k]] = std::move(out[k]);
    } catch (const error& e) {
      // A task's own failure beats the aborts it causes elsewhere.
      if (!first || (e.code() != error_code::aborted && is_abort(first)))
        first = std::current_exception();
      if (!aborted) {
        aborted = true;
        abort_step(r, step, e.message());
      }
    }
  };
  for (std::size_t i = 0; i < runs.size(); ++i)
    if (runs[i].runs_on_caller())
      collect(i);
  for (std::size_t i = 0; i < runs.size(); ++i)
    if (runs[i].valid())
      collect(i);
  if (first) {
    // A task that restarted answers `aborted` for a graph it no longer has
    // (so does every task of a step that another task's failure aborted),
    // and it has lost the session's other graphs too: the next run of each
    // request registers it again. TF's plain session keeps failing until it
    // is made again; this costs a registration per request after a step
    // that failed anyway.
    if (is_abort(first))
      forget_registrations();
    std::rethrow_exception(first);
  }
  if (trace)
    *trace = align_step_trace(step, start, steady_now_ns(), std::move(traces));
  return fetched;
}

LOOM_COMPILED_ONCE void cluster_master::reset(const std::vector<std::string>& containers,
                                              clock::time_point deadline) {
  const auto failed =
      on_each_task(workers_->tasks(), [&](worker_interface& w) { w.reset(containers, deadline); });
  if (failed.empty())
    return;
  std::string which;
  for (const auto& f : failed)
    which += (which.empty() ? "" : "; ") + f.task + ": " + f.message;
  std::rethrow_exception(
      net::make_error(failed.front().code, "session::reset: " + std::to_string(failed.size()) +
                                               " of " + std::to_string(workers_->tasks().size()) +
                                               " task(s) were not reset: " + which));
}

LOOM_COMPILED_ONCE auto cluster_master::shutdown_cluster(const std::vector<std::string>& jobs,
                                                         clock::time_point deadline)
    -> shutdown_report {
  const std::vector<std::string> tasks = tasks_of(jobs);
  shutdown_report report;
  split(tasks, on_each_task(tasks, [&](worker_interface& w) { w.shutdown(deadline); }),
        report.stopped, report.unreachable);
  return report;
}

LOOM_COMPILED_ONCE auto cluster_master::ping(const std::vector<std::string>& jobs) -> ping_report {
  const std::vector<std::string> tasks = tasks_of(jobs);
  ping_report report;
  split(tasks, on_each_task(tasks, [](worker_interface& w) { (void)w.cluster_info(); }),
        report.answered, report.unreachable);
  return report;
}

LOOM_COMPILED_ONCE auto cluster_master::tasks_of(const std::vector<std::string>& jobs) const
    -> std::vector<std::string> {
  std::vector<std::string> tasks;
  for (const auto& t : workers_->tasks())
    if (jobs.empty() ||
        std::find(jobs.begin(), jobs.end(), *device_spec::from_string(t).job()) != jobs.end())
      tasks.push_back(t);
  return tasks;
}

LOOM_COMPILED_ONCE void cluster_master::split(const std::vector<std::string>& tasks,
                                              const std::vector<task_failure>& failed,
                                              std::vector<std::string>& ok,
                                              std::vector<std::string>& not_ok) {
  auto next = failed.begin(); // in `tasks`' order
  for (const auto& t : tasks) {
    if (next != failed.end() && next->task == t)
      not_ok.push_back(t + ": " + (next++)->message);
    else
      ok.push_back(t);
  }
}

LOOM_COMPILED_ONCE bool cluster_master::is_abort(const std::exception_ptr& p) {
  try {
    std::rethrow_exception(p);
  } catch (const error& e) {
    return e.code() == error_code::aborted;
  } catch (...) {
    return false;
  }
}

LOOM_COMPILED_ONCE auto
cluster_master::tasks_asked_for_gpus(const std::vector<node_def>& nodes) const
    -> std::set<std::string> {
  std::set<std::string> out;
  for (const node_def& n : nodes) {
    if (n.requested_device.empty())
      continue;
    const device_spec d = device_spec::from_string(n.requested_device);
    if (!d.is_gpu())
      continue;
    if (!d.job())
      out.insert(default_task());
    else if (!cluster().has_job(*d.job()))
      continue;
    else if (d.task()) {
      if (cluster().has_task(*d.job(), *d.task()))
        out.insert(detail::task_name(*d.job(), *d.task()));
    } else {
      for (int t : cluster().task_indices(*d.job()))
        out.insert(detail::task_name(*d.job(), t));
    }
  }
  return out;
}

LOOM_COMPILED_ONCE auto cluster_master::checked_info(const std::string& task)
    -> protocol::cluster_info_reply {
  {
    std::lock_guard lock(mu_);
    if (auto it = task_info_.find(task); it != task_info_.end())
      return it->second;
  }
  auto info = worker(task).cluster_info();
  const device_spec want = device_spec::from_string(task);
  if (info.job != *want.job() || info.task != *want.task())
    throw invalid_argument_error(
        *want.job() + " task " + std::to_string(*want.task()) + " is at " +
        cluster().task_address(*want.job(), *want.task()) +
        " by the cluster spec of session target " + target_ + ", but the server there is " +
        info.job + " task " + std::to_string(info.task) +
        ": the tasks were started with different host lists (every task needs the same "
        "--ps_hosts and --worker_hosts, in the same order)");
  std::lock_guard lock(mu_);
  task_info_.emplace(task, info);
  return info;
}

LOOM_COMPILED_ONCE auto
cluster_master::send_deregistrations(const std::vector<std::shared_ptr<registered>>& regs) noexcept
    -> std::vector<std::function<void()>> {
  std::vector<std::function<void()>> waits;
  for (const auto& r : regs)
    for (const part_handle& p : r->parts) {
      try {
        if (auto wait = worker(p.task).deregister_graph(p.handle))
          waits.push_back(std::move(wait));
      } catch (...) {
      }
    }
  return waits;
}

LOOM_COMPILED_ONCE void cluster_master::forget_registrations() {
  std::vector<std::function<void()>> calls;
  {
    std::lock_guard lock(mu_);
    calls = send_deregistrations(all_registered());
    registered_.clear();
    task_info_.clear();
  }
  await_quietly(calls);
}

LOOM_COMPILED_ONCE auto cluster_master::registration(const graph& g, const run_request& req)
    -> std::shared_ptr<registered> {
  const std::string key = req.key(g.version());
  {
    std::vector<std::function<void()>> calls;
    std::unique_lock lock(mu_);
    if (g.version() != registered_version_) {
      // Partitions of an older graph version are stale.
      calls = send_deregistrations(all_registered());
      registered_.clear();
      registered_version_ = g.version();
    }
    if (auto it = registered_.find(key); it != registered_.end())
      return it->second;
    lock.unlock();
    await_quietly(calls);
  }
  std::set<node_id> ref_only;
  std::vector<node_def> nodes = nodes_to_place(g, req, ref_only);
  const placer_options po =
      session_placement(options_.allow_soft_placement, options_.log_device_placement,
                        options_.device_filters, default_task() + "/device:CPU:0");
  // The devices: every task's CPU, and the GPUs of the tasks that nodes ask
  // for a GPU on. TF's master lists every task's devices when its session
  // is made; this one asks a task only when the graph names a GPU there, so
  // a task the graph does not name may be down at no cost.
  std::vector<device_spec> devices = cluster().devices();
  for (const std::string& task : tasks_asked_for_gpus(nodes)) {
    const int gpus = gpus_of(task);
    for (int i = 0; i < gpus; ++i)
      devices.push_back(device_spec::from_string(task + "/device:GPU:" + std::to_string(i)));
  }
  place(nodes, devices, po, placement_log_);
  auto reg = std::make_shared<registered>();
  std::vector<graph_partition> partitions = partition_graph(g, req, nodes, ref_only);
  for (const graph_partition& p : partitions) // every task checked before any registers
    if (p.task != default_task())
      checked_info(p.task);
  for (graph_partition& p : partitions) {
    const run_request rr{p.fetches, p.targets, p.fed};
    const std::uint64_t handle =
        worker(p.task).register_graph(detail::graph_from_image(std::move(p.image)), rr);
    reg->parts.push_back({p.task, handle, std::move(p.fetch_at), std::move(p.fed_at)});
  }
  std::vector<std::function<void()>> calls;
  std::shared_ptr<registered> kept;
  {
    std::lock_guard lock(mu_);
    auto [it, inserted] = registered_.emplace(key, reg);
    if (!inserted) // another thread registered the request meanwhile: keep one
      calls = send_deregistrations({reg});
    kept = it->second;
  }
  await_quietly(calls);
  return kept;
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

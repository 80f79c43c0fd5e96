// A task of a cluster serving (TF's GrpcServer, behind loom::server): it owns
// the task's parts and puts them together. Its resource containers (the task's
// variables, shared by every session and client that reaches it), the
// rendezvous where its steps' tensors meet, the message layer's server and its
// connections to the other tasks; the graph manager (the partitions masters
// registered), the step driver (how a step of one runs) and the worker service
// (the calls a master makes, turned into theirs), which a session in this
// process reaches through its in-process worker.
#pragma once

#include <loom/cluster/cluster_spec.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/kernels/cpu/cpu_pool.hpp>
#include <loom/net/listen_address.hpp>
#include <loom/net/rpc.hpp>
#include <loom/runtime/executor.hpp>
#include <loom/runtime/graph_manager.hpp>
#include <loom/runtime/in_process_worker.hpp>
#include <loom/runtime/interfaces.hpp>
#include <loom/runtime/protocol.hpp>
#include <loom/runtime/remote_worker.hpp>
#include <loom/runtime/rendezvous.hpp>
#include <loom/runtime/resource_manager.hpp>
#include <loom/runtime/step_driver.hpp>
#include <loom/runtime/step_runners.hpp>
#include <loom/runtime/step_watchdog.hpp>
#include <loom/runtime/worker_interface.hpp>
#include <loom/runtime/worker_service.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>

namespace loom::detail {

class task_server final : public server_interface {
public:
  // Serves task `task` of job `job` at its address in `cluster` at once.
  // Throws unavailable_error (the port is taken, the host cannot be bound),
  // not_found_error (no such job or task) or failed_precondition_error (an
  // address beyond loopback without a token), each naming the task.
  task_server(cluster_spec cluster, std::string job, int task, server_options o = {});

  task_server(const task_server&) = delete;
  task_server& operator=(const task_server&) = delete;
  ~task_server() override { stop(); }

  // What a session connects to: "loom://host:port".
  std::string target() const override { return "loom://" + cluster_.task_address(job_, task_); }
  const cluster_spec& cluster() const noexcept override { return cluster_; }
  const std::string& job_name() const noexcept override { return job_; }
  int task_index() const noexcept override { return task_; }
  resource_manager& resources() noexcept override { return resources_; }

  // Graph partitions sessions have registered here and not deregistered.
  std::size_t registered_graphs() override { return graphs_.size(); }

  transfer_counts received() const noexcept override {
    return {service_->received_messages(), service_->received_tensors()};
  }

  // Blocks until the cluster is shut down (a client's shutdown call) or
  // stop() is called, then stops serving. Shut down by a client, it first
  // answers the calls in flight (at most answer_grace): a worker whose last
  // call, counting itself done, ran as its chief shut the cluster down must
  // learn that it ran, not retry it against a ps that is gone.
  void join() override {
    bool asked = false;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_; });
      asked = asked_;
    }
    stop_serving(asked ? answer_grace : std::chrono::milliseconds{});
  }

  // Stops serving: steps in flight fail, join() returns. Idempotent.
  void stop() override { stop_serving({}); }

private:
  using clock = std::chrono::steady_clock;

  std::string describe() const { return detail::task_name(job_, task_); }

  // The message layer's options carrying `limits`; invalid_argument_error naming the limit
  // and this task where one is below 1 or accept_backoff exceeds max_accept_backoff (a
  // zero would refuse every peer, or re-arm accept without pause).
  net::rpc_server_options rpc_options(const server_limits& limits) const;

  protocol::cluster_info_reply cluster_info() const {
    return {protocol::cluster_def::of(cluster_), job_, task_, instance_, gpu_count()};
  }

  // Stops serving once join() sees it; `why` ends the line saying so (a task
  // that stops serving always tells who stopped it).
  void shut_down_as(const std::string& why);

  // stop(), answering the calls in flight first for at most `grace` (join()).
  void stop_serving(std::chrono::milliseconds grace);
  static constexpr std::chrono::milliseconds answer_grace{2000};

  std::string job_;
  int task_;
  server_options options_;
  cluster_spec cluster_;
  kernels::cpu_pool cpu_; // the intra-op pool its steps' CPU kernels run on
  resource_manager resources_;
  rendezvous_table table_;
  // Ends the steps that wait too long (step_watchdog.hpp).
  detail::step_watchdog watchdog_{[this](std::uint64_t step, const std::string& why) {
    table_.abort(step, describe() + ": " + why);
  }};
  std::unique_ptr<worker_cache> peers_;
  std::unique_ptr<net::rpc_server> rpc_;
  std::uint64_t instance_ = 0;   // tells a session in this process that its target is this server
  detail::step_runners runners_; // steps that wait for tensors
  graph_manager graphs_{describe()};
  std::unique_ptr<step_driver> driver_;
  std::unique_ptr<worker_service> service_;
  std::shared_ptr<in_process_worker> local_worker_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool asked_ = false; // by a client's shutdown call (shut_down_as), not stop()
  std::once_flag stopped_;
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE task_server::task_server(cluster_spec cluster, std::string job, int task,
                                            server_options o)
    : job_(std::move(job)), task_(task), options_(std::move(o)),
      cpu_(detail::intra_op_threads(options_.intra_op_threads)) {
  const std::string& address = cluster.task_address(job_, task_);
  host_port hp = parse_host_port(address);
  net::rpc_server_options so = rpc_options(options_.limits);
  so.port = hp.port;
  so.advertised_host = hp.host; // how errors and logs name it: where the others reach it
  so.token = options_.token;
  so.tls = options_.tls;
  so.liveness = options_.liveness;
  so.allow_insecure = options_.allow_insecure;
  so.log = options_.log;
  so.threads = 2;
  try {
    so.host = net::choose_listen_host(cluster, job_, task_, options_.bind, options_.resolve_timeout,
                                      options_.log);
    rpc_ = std::make_unique<net::rpc_server>(so);
  } catch (const error& e) {
    net::throw_error(e.code(),
                     "cannot serve " + describe() + " at " + address + ": " + e.message());
  }
  if (hp.port == 0) { // the OS chose: the cluster learns the real port
    auto def = protocol::cluster_def::of(cluster);
    def.jobs[job_][task_] = (address.front() == '[' ? "[" + hp.host + "]" : hp.host) + ":" +
                            std::to_string(rpc_->port());
    cluster = def.spec();
  }
  cluster_ = std::move(cluster);
  net::channel_options peer_options;
  peer_options.token = options_.token;
  peer_options.tls = options_.tls;
  peer_options.liveness = options_.liveness;
  peer_options.log = options_.log;
  peers_ = std::make_unique<worker_cache>(cluster_, peer_options);
  std::random_device rd;
  instance_ = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  driver_ = std::make_unique<step_driver>(describe(), cpu_.device(), resources_, table_, *peers_,
                                          runners_, watchdog_);
  service_ = std::make_unique<worker_service>(
      describe(), graphs_, *driver_, table_, resources_,
      worker_service::task_calls{[this] { return cluster_info(); },
                                 [this](const std::string& why) { shut_down_as(why); }});
  service_->install(*rpc_);
  local_worker_ = std::make_shared<in_process_worker>(*service_, describe());
  local_workers::add(instance_, local_worker_);
}

LOOM_COMPILED_ONCE void task_server::stop_serving(std::chrono::milliseconds grace) {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  std::call_once(stopped_, [&] {
    watchdog_.stop();
    if (rpc_)
      rpc_->stop(grace);
    table_.close(describe() + " stopped");
    if (peers_)
      peers_->stop();
    if (local_worker_) { // after the table closed: runs in flight end
      local_workers::remove(instance_);
      local_worker_->detach();
    }
    runners_.stop();
  });
}

LOOM_COMPILED_ONCE auto task_server::rpc_options(const server_limits& limits) const
    -> net::rpc_server_options {
  const auto at_least_one = [&](const char* name, auto value) {
    if (value < decltype(value){1})
      throw invalid_argument_error("server_options.limits." + std::string(name) + " of " +
                                   describe() + " must be at least 1, not 0");
  };
  at_least_one("max_pending_bytes_per_connection", limits.max_pending_bytes_per_connection);
  at_least_one("max_pending_bytes", limits.max_pending_bytes);
  at_least_one("max_handshaking_connections", limits.max_handshaking_connections);
  at_least_one("max_connections", limits.max_connections);
  const auto at_least_one_ms = [&](const char* name, std::chrono::milliseconds value) {
    if (value.count() < 1)
      throw invalid_argument_error("server_options.limits." + std::string(name) + " of " +
                                   describe() + " must be at least 1 ms, not " +
                                   std::to_string(value.count()) + " ms");
  };
  at_least_one_ms("handshake_timeout", limits.handshake_timeout);
  at_least_one_ms("idle_eviction_grace", limits.idle_eviction_grace);
  at_least_one_ms("accept_backoff", limits.accept_backoff);
  at_least_one_ms("max_accept_backoff", limits.max_accept_backoff);
  if (limits.accept_backoff > limits.max_accept_backoff)
    throw invalid_argument_error("server_options.limits.accept_backoff of " + describe() + " (" +
                                 std::to_string(limits.accept_backoff.count()) +
                                 " ms) exceeds its max_accept_backoff (" +
                                 std::to_string(limits.max_accept_backoff.count()) + " ms)");
  net::rpc_server_options so;
  so.max_pending_bytes_per_connection = limits.max_pending_bytes_per_connection;
  so.max_pending_bytes = limits.max_pending_bytes;
  so.max_handshaking_connections = limits.max_handshaking_connections;
  so.handshake_timeout = limits.handshake_timeout;
  so.max_connections = limits.max_connections;
  so.idle_eviction_grace = limits.idle_eviction_grace;
  so.accept_backoff = limits.accept_backoff;
  so.max_accept_backoff = limits.max_accept_backoff;
  return so;
}

LOOM_COMPILED_ONCE void task_server::shut_down_as(const std::string& why) {
  net::log_line(options_.log, describe() + ": shutting down, as " + why, logging::level::info);
  {
    std::lock_guard lock(mu_);
    stopping_ = asked_ = true;
  }
  cv_.notify_all(); // join() stops the server from its own thread
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

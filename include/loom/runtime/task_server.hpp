// A task of a cluster serving (TF's GrpcServer, behind loom::server): it hosts
// the task's resource containers (its variables, shared by every session and
// client that reaches it), registers and runs graph partitions for masters,
// and moves tensors to the other tasks.
#pragma once

#include <loom/cluster/cluster_spec.hpp>
#include <loom/graph/serialize.hpp>
#include <loom/kernels/cpu/cpu_pool.hpp>
#include <loom/net/listen_address.hpp>
#include <loom/net/rpc.hpp>
#include <loom/runtime/executor.hpp>
#include <loom/runtime/interfaces.hpp>
#include <loom/runtime/protocol.hpp>
#include <loom/runtime/remote_worker.hpp>
#include <loom/runtime/rendezvous.hpp>
#include <loom/runtime/resource_manager.hpp>
#include <loom/runtime/step_runners.hpp>
#include <loom/runtime/step_tracer.hpp>
#include <loom/runtime/step_transfers.hpp>
#include <loom/runtime/step_watchdog.hpp>
#include <loom/runtime/worker_interface.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

namespace loom::detail {

class task_server final : public server_interface {
public:
  // Serves task `task` of job `job` at its address in `cluster` at once.
  // Throws unavailable_error (the port is taken, the host cannot be bound),
  // not_found_error (no such job or task) or failed_precondition_error (an
  // address beyond loopback without a token), each naming the task.
  task_server(cluster_spec cluster, std::string job, int task, server_options o = {})
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
      so.host = net::choose_listen_host(cluster, job_, task_, options_.bind,
                                        options_.resolve_timeout, options_.log);
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
    local_worker_ = std::make_shared<in_process_worker>(*this);
    local_workers::add(instance_, local_worker_);
    install_handlers();
  }

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
  std::size_t registered_graphs() override {
    std::lock_guard lock(mu_);
    return partitions_.size();
  }

  transfer_counts received() const noexcept override {
    return {received_messages_.load(std::memory_order_relaxed),
            received_tensors_.load(std::memory_order_relaxed)};
  }

  // Blocks until the cluster is shut down (a client's shutdown call) or
  // stop() is called, then stops serving.
  void join() override {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_; });
    }
    stop();
  }

  // Stops serving: steps in flight fail, join() returns. Idempotent.
  void stop() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    std::call_once(stopped_, [&] {
      watchdog_.stop();
      if (rpc_)
        rpc_->stop();
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

private:
  using clock = std::chrono::steady_clock;

  // This task's worker for a session in this process whose target it is
  // (worker_interface.hpp): the calls a remote master makes, made directly,
  // and the steps run on the session's thread. It outlives the server where a
  // session holds it: stop() detaches it, waiting for the calls in flight, and
  // later calls fail saying the task stopped.
  class in_process_worker final : public worker_interface {
  public:
    explicit in_process_worker(task_server& s) : server_(&s), name_(s.describe()) {}

    void detach() {
      std::unique_lock lock(mu_);
      server_ = nullptr;
    }

    protocol::cluster_info_reply cluster_info() override {
      std::shared_lock lock(mu_);
      return live().cluster_info();
    }
    std::uint64_t register_graph(const graph& partition, const run_request& req) override {
      std::shared_lock lock(mu_);
      return live().add_partition(partition, req);
    }
    std::function<void()> deregister_graph(std::uint64_t handle) noexcept override {
      std::shared_lock lock(mu_);
      if (server_)
        server_->remove_partition(handle);
      return {};
    }
    pending_run run_graph(std::uint64_t handle, std::uint64_t step, std::vector<any_tensor> feeds,
                          const run_graph_options& o) override {
      return pending_run(std::make_unique<deferred_run>(*this, handle, step, std::move(feeds), o));
    }
    void abort_step(std::uint64_t step, const std::string& reason) noexcept override {
      std::shared_lock lock(mu_);
      if (server_)
        server_->table_.abort(step, reason);
    }
    void reset(const std::vector<std::string>& containers,
               std::chrono::steady_clock::time_point) override {
      std::shared_lock lock(mu_);
      live().resources_.reset(containers);
    }
    void shutdown(std::chrono::steady_clock::time_point) override {
      std::shared_lock lock(mu_);
      live().shut_down_as("a session in this process asked");
    }

  private:
    // A step run by get(), on the caller's thread.
    struct deferred_run final : pending_run::state {
      deferred_run(in_process_worker& w, std::uint64_t handle, std::uint64_t step,
                   std::vector<any_tensor> feeds, run_graph_options o)
          : worker(w), handle(handle), step(step), feeds(std::move(feeds)), options(std::move(o)) {}
      std::vector<any_tensor> get() override {
        std::shared_lock lock(worker.mu_);
        return worker.live().run_in_process(handle, step, std::move(feeds), options.timeout,
                                            options.others_failed, options.trace);
      }
      bool runs_on_caller() const noexcept override { return true; }

      in_process_worker& worker;
      std::uint64_t handle, step;
      std::vector<any_tensor> feeds;
      run_graph_options options;
    };

    task_server& live() const {
      if (!server_)
        throw unavailable_error(name_ + " (the session's target, in this process) stopped");
      return *server_;
    }

    std::shared_mutex mu_; // held shared by a call in flight, so the server outlives it
    task_server* server_;
    std::string name_;
  };

  struct partition {
    graph g;
    std::unique_ptr<plan> p;
    std::vector<node_id> fetches, fed;
    bool may_wait = false;       // has a _recv or a blocking kernel
    std::set<std::string> peers; // tasks it sends to or receives from
  };

  std::string describe() const { return detail::task_name(job_, task_); }

  // The message layer's options carrying `limits`; invalid_argument_error naming the limit
  // and this task where one is below 1 or accept_backoff exceeds max_accept_backoff (a
  // zero would refuse every peer, or re-arm accept without pause).
  net::rpc_server_options rpc_options(const server_limits& limits) const {
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

  void install_handlers() {
    rpc_->handle(protocol::cluster_info,
                 [this](net::request, net::responder r) { r.reply(cluster_info()); });
    rpc_->handle(protocol::register_graph, [this](net::request req, net::responder r) {
      auto m = req.metadata<protocol::register_graph_request>();
      run_request rr;
      rr.fetches.assign(m.fetches.begin(), m.fetches.end());
      rr.fed.assign(m.fed.begin(), m.fed.end());
      rr.targets.assign(m.targets.begin(), m.targets.end());
      r.reply(protocol::register_graph_reply{add_partition(deserialize_graph(m.graph), rr)});
    });
    rpc_->handle(protocol::deregister_graph, [this](net::request req, net::responder r) {
      remove_partition(req.metadata<protocol::deregister_graph_request>().handle);
      r.reply();
    });
    rpc_->handle(protocol::run_graph, [this](net::request req, net::responder r) {
      auto m = req.metadata<protocol::run_graph_request>();
      // A traced step's clock starts before anything of it runs here.
      auto tracer = m.trace ? std::make_shared<step_tracer>() : nullptr;
      this_thread_role() = "io";
      std::move(m.strings).restore(req.payloads());
      std::shared_ptr<partition> part = find_partition(m.handle, req.payloads().size());
      const auto timeout = req.timeout();
      const auto deadline = timeout.count() > 0 ? clock::now() + timeout : clock::time_point::max();
      // A partition without blocking kernels runs here until it waits for a
      // tensor, and goes on on the io thread that receives it (start()).
      if (!part->p->blocks()) {
        auto responder = std::make_shared<net::responder>(std::move(r));
        const bool watched = part->may_wait;
        if (watched)
          watchdog_.watch(
              m.step_id, deadline, [responder] { return responder->peer_connected(); },
              "the client that started the step disconnected");
        auto transfers =
            std::make_shared<detail::step_transfers>(table_, *peers_, runners_, m.step_id);
        start(
            *part, std::move(req.payloads()), *transfers,
            [this, part, transfers, responder, watched, tracer, step = m.step_id](plan_end end) {
              // Ending waits for the sends' acknowledgements: where it would,
              // on a runner thread, not on the io thread that may be here.
              const bool here = end.error || transfers->sends_delivered();
              std::function<void()> answer = [this, part, transfers, responder, watched, tracer,
                                              step, end = std::move(end)]() mutable {
                std::vector<any_tensor> out;
                std::exception_ptr error;
                try {
                  out = end_started(*part, step, *transfers, end);
                } catch (...) {
                  error = std::current_exception();
                }
                if (watched)
                  watchdog_.unwatch(step);
                reply(*responder, std::move(out), error, tracer.get());
              };
              if (here || !runners_.submit(answer))
                answer();
            },
            tracer.get());
        return;
      }
      // One with blocking kernels must not wait on an io thread: what it waits
      // for arrives on them.
      // std::function needs a copyable callable: the responder moves into a shared_ptr.
      auto job = std::make_shared<std::tuple<std::vector<any_tensor>, net::responder>>(
          std::move(req.payloads()), std::move(r));
      watchdog_.watch(
          m.step_id, deadline, [job] { return std::get<1>(*job).peer_connected(); },
          "the client that started the step disconnected");
      if (!runners_.submit([this, part, step = m.step_id, job, tracer] {
            run_partition(*part, step, std::move(std::get<0>(*job)), std::get<1>(*job),
                          tracer.get());
            watchdog_.unwatch(step);
          })) {
        watchdog_.unwatch(m.step_id);
        throw unavailable_error(describe() + " is shutting down");
      }
    });
    rpc_->handle(protocol::rendezvous_put, [this](net::request req, net::responder r) {
      auto m = req.metadata<protocol::rendezvous_put_request>();
      std::move(m.strings).restore(req.payloads());
      std::vector<any_tensor>& values = req.payloads();
      const auto carried = std::count(m.carries_value.begin(), m.carries_value.end(), 1);
      if (m.carries_value.size() != m.keys.size() ||
          static_cast<std::size_t>(carried) != values.size())
        throw data_loss_error(describe() + ": a rendezvous message of step " +
                              std::to_string(m.step_id) + " has " + std::to_string(m.keys.size()) +
                              " keys, " + std::to_string(carried) + " of them with values, and " +
                              std::to_string(values.size()) + " values");
      received_messages_.fetch_add(1, std::memory_order_relaxed);
      this_thread_role() = "io"; // a step waiting for these values goes on here
      received_tensors_.fetch_add(m.keys.size(), std::memory_order_relaxed);
      // Acknowledged first: a put may run the rest of a step here (start()),
      // and the sender need not wait for that.
      r.reply();
      std::size_t next = 0;
      detail::arrival_batch batch; // the step goes on once, with all of them
      try {
        for (std::size_t i = 0; i < m.keys.size(); ++i)
          table_.put(m.step_id, m.keys[i],
                     m.carries_value[i] ? std::move(values[next++]) : any_tensor{});
      } catch (const error& e) { // a second value for a key: the step cannot go on
        table_.abort(m.step_id, describe() + ": " + e.message());
      }
      batch.run();
    });
    rpc_->handle(protocol::abort_step, [this](net::request req, net::responder r) {
      auto m = req.metadata<protocol::abort_step_request>();
      table_.abort(m.step_id, m.reason);
      r.reply();
    });
    rpc_->handle(protocol::reset, [this](net::request req, net::responder r) {
      resources_.reset(req.metadata<protocol::reset_request>().containers);
      r.reply();
    });
    rpc_->handle(protocol::shutdown, [this](net::request req, net::responder r) {
      r.reply();
      shut_down_as(req.peer() + " asked");
    });
  }

  protocol::cluster_info_reply cluster_info() const {
    return {protocol::cluster_def::of(cluster_), job_, task_, instance_, gpu_count()};
  }

  // A partition a master registers: planned once here, run by handle.
  std::uint64_t add_partition(graph g, const run_request& rr) {
    auto part = std::make_shared<partition>();
    part->g = std::move(g);
    part->p = std::make_unique<plan>(part->g, rr);
    part->fetches = rr.fetches;
    part->fed = rr.fed;
    for (const auto& s : part->p->steps()) {
      const node_def& n = part->g.node(s.id);
      part->may_wait =
          part->may_wait || s.k == plan::step::kind::recv ||
          (s.k == plan::step::kind::kernel && op_registry::instance().find(n.op).blocking);
      if (s.k == plan::step::kind::recv)
        part->peers.insert(n.attr<std::string>("src_task"));
      else if (s.k == plan::step::kind::send)
        part->peers.insert(n.attr<std::string>("dst_task"));
    }
    std::lock_guard lock(mu_);
    const std::uint64_t handle = ++next_handle_;
    partitions_.emplace(handle, std::move(part));
    return handle;
  }

  void remove_partition(std::uint64_t handle) {
    std::lock_guard lock(mu_);
    partitions_.erase(handle);
  }

  // Stops serving once join() sees it; `why` ends the line saying so (a task
  // that stops serving always tells who stopped it).
  void shut_down_as(const std::string& why) {
    net::log_line(options_.log, describe() + ": shutting down, as " + why, logging::level::info);
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all(); // join() stops the server from its own thread
  }

  std::shared_ptr<partition> find_partition(std::uint64_t handle, std::size_t feeds) {
    std::shared_ptr<partition> part;
    {
      std::lock_guard lock(mu_);
      auto it = partitions_.find(handle);
      if (it == partitions_.end())
        // Aborted, as TF's worker says: the task restarted since the session
        // registered the graph, and a recreated session registers it again.
        throw aborted_error(describe() + " has no registered graph " + std::to_string(handle) +
                            " (the task restarted since the session registered it)");
      part = it->second;
    }
    if (feeds != part->fed.size())
      throw invalid_argument_error(describe() + ": a step of graph " + std::to_string(handle) +
                                   " needs " + std::to_string(part->fed.size()) + " feeds, got " +
                                   std::to_string(feeds));
    return part;
  }

  // Three ways to run a step of a partition, one per thread it may run on:
  // - execute(): to its end on this thread, which may wait (a runner thread for
  //   a partition with blocking kernels; a session's thread).
  // - start() + end_started(): on the io thread that received the request until
  //   it waits for a tensor, then on the io threads that deliver them, never
  //   waiting (a partition without blocking kernels: no thread per step); its
  //   end, which may wait for acknowledgements, moves to a runner if need be.
  // - run_in_process(): a session's own thread, which picks one of the two and
  //   is watched, because nobody else would stop it waiting.
  // They share the step's ending (end_step, step_failed), not its threads.

  // A step of a partition for a session in this process, on its thread.
  // While it waits, the watchdog ends it when its deadline passes (it fails
  // as a remote call past its deadline does) or when `others_failed` says
  // another task's part of the step failed: this thread is the client's, so
  // nobody else would tell it.
  // `trace`, where given, receives the step's trace.
  std::vector<any_tensor> run_in_process(std::uint64_t handle, std::uint64_t step,
                                         std::vector<any_tensor> feeds,
                                         std::chrono::milliseconds timeout,
                                         const std::function<bool()>& others_failed,
                                         task_trace* trace) {
    std::optional<step_tracer> tracer;
    if (trace) {
      tracer.emplace();
      this_thread_role() = "client";
    }
    step_tracer* const traced = tracer ? &*tracer : nullptr;
    std::shared_ptr<partition> part = find_partition(handle, feeds.size());
    if (!part->may_wait) {
      auto out = execute(*part, step, std::move(feeds), traced);
      if (trace)
        *trace = tracer->finish();
      return out;
    }
    const auto deadline = timeout.count() > 0 ? clock::now() + timeout : clock::time_point::max();
    watchdog_.watch(
        step, deadline, [&others_failed] { return !others_failed(); },
        "another task's part of the step failed");
    try {
      std::vector<any_tensor> out;
      if (part->p->blocks()) {
        out = execute(*part, step, std::move(feeds), traced);
      } else {
        // Its kernels run where its tensors arrive (start()); this thread
        // waits for the plan's end and ends the step itself.
        detail::step_transfers transfers(table_, *peers_, runners_, step);
        auto ended = std::make_shared<std::promise<plan_end>>();
        auto plan_ended = ended->get_future();
        start(
            *part, std::move(feeds), transfers,
            [ended](plan_end end) { ended->set_value(std::move(end)); }, traced);
        plan_end end = plan_ended.get();
        out = end_started(*part, step, transfers, end);
      }
      watchdog_.unwatch(step);
      if (trace)
        *trace = tracer->finish();
      return out;
    } catch (const aborted_error& e) {
      watchdog_.unwatch(step);
      if (timeout.count() <= 0 || clock::now() < deadline)
        throw;
      throw deadline_exceeded_error(describe() + ": the step did not complete within " +
                                    std::to_string(timeout.count()) + " ms (" + e.message() + ")");
    } catch (...) {
      watchdog_.unwatch(step);
      throw;
    }
  }

  void run_partition(partition& part, std::uint64_t step, std::vector<any_tensor> feeds,
                     net::responder& r, step_tracer* tracer) {
    std::vector<any_tensor> out;
    std::exception_ptr error;
    try {
      out = execute(part, step, std::move(feeds), tracer);
    } catch (...) {
      error = std::current_exception();
    }
    reply(r, std::move(out), error, tracer);
  }

  // Answers a run_graph request: the fetches, and a traced step's trace, taken
  // last so that the step's every node is inside its time here.
  static void reply(net::responder& r, std::vector<any_tensor> out, std::exception_ptr failure,
                    step_tracer* tracer) {
    if (failure) {
      try {
        std::rethrow_exception(failure);
      } catch (const error& e) {
        r.fail(e.code(), e.message());
      }
      return;
    }
    protocol::run_graph_reply fetched;
    fetched.strings = protocol::string_values::take(out);
    if (tracer)
      fetched.trace.push_back(tracer->finish());
    r.reply(std::move(fetched), std::move(out));
  }

  // Runs one step of `part` on this thread; returns its fetches. On failure
  // the step is aborted here and on its peers, and the error names this task.
  std::vector<any_tensor> execute(partition& part, std::uint64_t step,
                                  std::vector<any_tensor> feeds, step_tracer* tracer) {
    detail::step_transfers transfers(table_, *peers_, runners_, step);
    try {
      std::vector<any_tensor> values = fed_values(part, std::move(feeds));
      run_plan(*part.p, part.g, values, cpu_.device(), resources_, &transfers, tracer);
      return end_step(part, step, transfers, values);
    } catch (...) {
      std::rethrow_exception(step_failed(part, step, transfers, std::current_exception()));
    }
  }

  // Where a started step's plan ended: its values, or the error that ended it.
  struct plan_end {
    std::vector<any_tensor> values;
    std::exception_ptr error;
  };

  // Starts one step of `part` (start_plan; not for a partition that blocks):
  // it runs on this thread until it waits for a tensor, then on the thread
  // that delivers it. `ended` is called once, on the thread that ran the plan
  // last, often an io thread, which must not wait: end_started() then ends the
  // step on a thread that may.
  void start(const partition& part, std::vector<any_tensor> feeds,
             detail::step_transfers& transfers, std::function<void(plan_end)> ended,
             step_tracer* tracer) {
    start_plan(
        *part.p, part.g, fed_values(part, std::move(feeds)), cpu_.device(), resources_, transfers,
        [ended = std::move(ended)](std::vector<any_tensor>& values, std::exception_ptr error) {
          ended({std::move(values), error});
        },
        tracer);
  }

  // Ends a started step as execute() would: returns its fetches or throws the
  // error naming this task. Waits for the step's sends to be acknowledged.
  std::vector<any_tensor> end_started(const partition& part, std::uint64_t step,
                                      detail::step_transfers& transfers, plan_end& end) {
    try {
      if (end.error)
        std::rethrow_exception(end.error);
      return end_step(part, step, transfers, end.values);
    } catch (...) {
      std::rethrow_exception(step_failed(part, step, transfers, std::current_exception()));
    }
  }

  static std::vector<any_tensor> fed_values(const partition& part, std::vector<any_tensor> feeds) {
    std::vector<any_tensor> values(part.g.size());
    for (std::size_t i = 0; i < part.fed.size(); ++i)
      values[static_cast<std::size_t>(part.fed[i])] = std::move(feeds[i]);
    return values;
  }

  // A step that ran: waits until what it sent was delivered, ends it in the
  // rendezvous, returns its fetches.
  std::vector<any_tensor> end_step(const partition& part, std::uint64_t step,
                                   detail::step_transfers& transfers,
                                   std::vector<any_tensor>& values) {
    transfers.wait_sent();
    table_.end_step(step);
    std::vector<any_tensor> out;
    out.reserve(part.fetches.size());
    for (node_id f : part.fetches)
      out.push_back(values[static_cast<std::size_t>(f)]); // a node may be fetched twice
    return out;
  }

  // A step of `part` that failed with `e`: aborted here and on its peers.
  // Returns the error to report, naming this task.
  std::exception_ptr step_failed(const partition& part, std::uint64_t step,
                                 detail::step_transfers& transfers, std::exception_ptr e) {
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
    const std::string reason = describe() + ": " + what;
    fail_step(part, step, transfers, reason);
    try {
      net::throw_error(code, reason);
    } catch (...) {
      return std::current_exception();
    }
  }

  // A failed partition aborts its step here and on the tasks it exchanges
  // tensors with: a peer waiting for a tensor this partition will never send
  // must not wait for it forever (the master hears of the failure only once
  // the other partitions answer).
  void fail_step(const partition& part, std::uint64_t step, detail::step_transfers& transfers,
                 const std::string& reason) noexcept {
    transfers.cancel_sends();
    table_.abort(step, reason);
    for (const std::string& peer : part.peers) {
      try {
        remote_worker& w = peers_->worker(peer);
        auto abort = [&w, step, reason] { w.abort_step(step, reason); };
        // Connecting waits: not on a thread that may be an io thread.
        if (w.connected() || !runners_.submit(abort))
          abort();
      } catch (...) {
      }
    }
  }

  std::string job_;
  int task_;
  server_options options_;
  cluster_spec cluster_;
  cpu_pool cpu_; // the intra-op pool its steps' CPU kernels run on
  resource_manager resources_;
  rendezvous_table table_;
  // Ends the steps that wait too long (step_watchdog.hpp).
  detail::step_watchdog watchdog_{[this](std::uint64_t step, const std::string& why) {
    table_.abort(step, describe() + ": " + why);
  }};
  std::unique_ptr<worker_cache> peers_;
  std::unique_ptr<net::rpc_server> rpc_;
  std::uint64_t instance_ = 0; // tells a session in this process that its target is this server
  std::atomic<std::uint64_t> received_messages_{0}, received_tensors_{0};
  std::shared_ptr<in_process_worker> local_worker_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::once_flag stopped_;
  std::map<std::uint64_t, std::shared_ptr<partition>> partitions_;
  std::uint64_t next_handle_ = 0;
  detail::step_runners runners_; // steps that wait for tensors
};

} // namespace loom::detail

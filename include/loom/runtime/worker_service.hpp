// A task's worker service (TF's WorkerService with its Worker): the calls a
// master makes of the task, each turned into a call of the task's own parts.
// Registering and deregistering partitions go to the graph manager
// (runtime/graph_manager.hpp), running a step to the step driver
// (runtime/step_driver.hpp), tensors put and steps aborted to the rendezvous
// (runtime/rendezvous.hpp), and resetting containers to the resources. A master
// reaches it over the message layer (install()), and a session in this process
// directly (runtime/in_process_worker.hpp).
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/graph/serialize.hpp>
#include <loom/net/rpc.hpp>
#include <loom/runtime/graph_manager.hpp>
#include <loom/runtime/protocol.hpp>
#include <loom/runtime/rendezvous.hpp>
#include <loom/runtime/resource_manager.hpp>
#include <loom/runtime/step_driver.hpp>
#include <loom/runtime/step_tracer.hpp>
#include <loom/runtime/thread_role.hpp>
#include <loom/runtime/worker_interface.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::detail {

class worker_service {
public:
  using clock = std::chrono::steady_clock;

  // What the service asks of its task: who it is, and to stop serving (saying why).
  struct task_calls {
    std::function<protocol::cluster_info_reply()> cluster_info;
    std::function<void(const std::string& why)> shut_down;
  };

  // `task` names the task in errors. The parts are the task's, and outlive the service.
  worker_service(std::string task, graph_manager& graphs, step_driver& driver,
                 rendezvous_table& table, resource_manager& resources, task_calls calls)
      : task_(std::move(task)), graphs_(graphs), driver_(driver), table_(table),
        resources_(resources), calls_(std::move(calls)) {}
  worker_service(const worker_service&) = delete;
  worker_service& operator=(const worker_service&) = delete;

  // Serves the protocol's worker calls (runtime/protocol.hpp) on `rpc`.
  void install(net::rpc_server& rpc);

  // The calls, made directly by a session in this process (in_process_worker).
  protocol::cluster_info_reply cluster_info() const { return calls_.cluster_info(); }
  std::uint64_t register_graph(graph partition, const run_request& req) {
    return graphs_.add(std::move(partition), req);
  }
  void deregister_graph(std::uint64_t handle) { graphs_.remove(handle); }
  void abort_step(step_id step, const std::string& reason) noexcept { table_.abort(step, reason); }
  void reset(const std::vector<std::string>& containers) { resources_.reset(containers); }
  void shutdown(const std::string& why) { calls_.shut_down(why); }

  // A step of partition `handle` on the calling thread (a session's own): returns its
  // fetches. While it waits, the watchdog ends it past o.timeout, or when
  // o.others_failed says another task's part of the step failed: this thread is the
  // client's, so nobody else would tell it. A traced step leaves its trace in *o.trace.
  std::vector<any_tensor> run_graph_here(std::uint64_t handle, step_id step,
                                         std::vector<any_tensor> feeds, const run_graph_options& o);

  // What this task received from other tasks' _sends: messages, and the tensors in them.
  std::uint64_t received_messages() const noexcept {
    return received_messages_.load(std::memory_order_relaxed);
  }
  std::uint64_t received_tensors() const noexcept {
    return received_tensors_.load(std::memory_order_relaxed);
  }

private:
  // A master's step of a partition, on the io thread that received the request: the
  // driver runs it here until it waits, and the answer goes when it ends.
  void run_graph(net::request req, net::responder r);

  // Answers a run_graph request: the fetches, and a traced step's trace, taken
  // last so that the step's every node is inside its time here.
  static void reply(net::responder& r, std::vector<any_tensor> out, std::exception_ptr failure,
                    step_tracer* tracer);

  // Another task's _sends of one step, as one message: into the rendezvous.
  void put_tensors(net::request req, net::responder r);

  std::string task_;
  graph_manager& graphs_;
  step_driver& driver_;
  rendezvous_table& table_;
  resource_manager& resources_;
  task_calls calls_;
  std::atomic<std::uint64_t> received_messages_{0}, received_tensors_{0};
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE void worker_service::install(net::rpc_server& rpc) {
  rpc.handle(protocol::cluster_info,
             [this](net::request, net::responder r) { r.reply(cluster_info()); });
  rpc.handle(protocol::register_graph, [this](net::request req, net::responder r) {
    auto m = req.metadata<protocol::register_graph_request>();
    run_request rr;
    rr.fetches.assign(m.fetches.begin(), m.fetches.end());
    rr.fed.assign(m.fed.begin(), m.fed.end());
    rr.targets.assign(m.targets.begin(), m.targets.end());
    r.reply(protocol::register_graph_reply{register_graph(deserialize_graph(m.graph), rr)});
  });
  rpc.handle(protocol::deregister_graph, [this](net::request req, net::responder r) {
    deregister_graph(req.metadata<protocol::deregister_graph_request>().handle);
    r.reply();
  });
  rpc.handle(protocol::run_graph, [this](net::request req, net::responder r) {
    run_graph(std::move(req), std::move(r));
  });
  rpc.handle(protocol::rendezvous_put, [this](net::request req, net::responder r) {
    put_tensors(std::move(req), std::move(r));
  });
  rpc.handle(protocol::abort_step, [this](net::request req, net::responder r) {
    auto m = req.metadata<protocol::abort_step_request>();
    abort_step(m.step_id, m.reason);
    r.reply();
  });
  rpc.handle(protocol::reset, [this](net::request req, net::responder r) {
    reset(req.metadata<protocol::reset_request>().containers);
    r.reply();
  });
  rpc.handle(protocol::shutdown, [this](net::request req, net::responder r) {
    r.reply();
    shutdown(req.peer() + " asked");
  });
}

LOOM_COMPILED_ONCE auto worker_service::run_graph_here(std::uint64_t handle, step_id step,
                                                       std::vector<any_tensor> feeds,
                                                       const run_graph_options& o)
    -> std::vector<any_tensor> {
  std::optional<step_tracer> tracer;
  if (o.trace) {
    tracer.emplace();
    this_thread_role() = "client";
  }
  std::shared_ptr<registered_partition> part = graphs_.find(handle, feeds.size());
  step_run_options so;
  if (o.timeout.count() > 0) {
    so.deadline = clock::now() + o.timeout;
    so.timeout = o.timeout;
  }
  if (part->may_wait && o.others_failed) { // what the watchdog asks (step_driver.hpp)
    so.wanted = [&others_failed = o.others_failed] { return !others_failed(); };
    so.unwanted = "another task's part of the step failed";
  }
  so.caller_may_wait = true;
  so.tracer = tracer ? &*tracer : nullptr;
  std::vector<any_tensor> fetched;
  std::exception_ptr error;
  driver_.run(std::move(part), step, std::move(feeds), std::move(so),
              [&](std::vector<any_tensor> out, std::exception_ptr e) {
                fetched = std::move(out);
                error = e;
              });
  if (error)
    std::rethrow_exception(error);
  if (o.trace)
    *o.trace = tracer->finish();
  return fetched;
}

LOOM_COMPILED_ONCE void worker_service::run_graph(net::request req, net::responder r) {
  auto m = req.metadata<protocol::run_graph_request>();
  // A traced step's clock starts before anything of it runs here.
  auto tracer = m.trace ? std::make_shared<step_tracer>() : nullptr;
  this_thread_role() = "io";
  std::move(m.strings).restore(req.payloads());
  std::shared_ptr<registered_partition> part = graphs_.find(m.handle, req.payloads().size());
  auto responder = std::make_shared<net::responder>(std::move(r));
  step_run_options so;
  if (const auto timeout = req.timeout(); timeout.count() > 0) {
    so.deadline = clock::now() + timeout;
    so.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  }
  if (part->may_wait) { // what the watchdog asks (step_driver.hpp)
    so.wanted = [responder] { return responder->peer_connected(); };
    so.unwanted = "the client that started the step disconnected";
  }
  so.tracer = tracer.get();
  driver_.run(std::move(part), m.step_id, std::move(req.payloads()), std::move(so),
              [responder, tracer](std::vector<any_tensor> out, std::exception_ptr error) {
                reply(*responder, std::move(out), error, tracer.get());
              });
}

LOOM_COMPILED_ONCE void worker_service::reply(net::responder& r, std::vector<any_tensor> out,
                                              std::exception_ptr failure, step_tracer* tracer) {
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

LOOM_COMPILED_ONCE void worker_service::put_tensors(net::request req, net::responder r) {
  auto m = req.metadata<protocol::rendezvous_put_request>();
  std::move(m.strings).restore(req.payloads());
  std::vector<any_tensor>& values = req.payloads();
  const auto carried = std::count(m.carries_value.begin(), m.carries_value.end(), 1);
  if (m.carries_value.size() != m.keys.size() || static_cast<std::size_t>(carried) != values.size())
    throw data_loss_error(task_ + ": a rendezvous message of step " + std::to_string(m.step_id) +
                          " has " + std::to_string(m.keys.size()) + " keys, " +
                          std::to_string(carried) + " of them with values, and " +
                          std::to_string(values.size()) + " values");
  received_messages_.fetch_add(1, std::memory_order_relaxed);
  this_thread_role() = "io"; // a step waiting for these values goes on here
  received_tensors_.fetch_add(m.keys.size(), std::memory_order_relaxed);
  // Acknowledged first: a put may run the rest of a step here (start_plan),
  // and the sender need not wait for that.
  r.reply();
  std::size_t next = 0;
  detail::arrival_batch batch; // the step goes on once, with all of them
  try {
    for (std::size_t i = 0; i < m.keys.size(); ++i)
      table_.put(m.step_id, m.keys[i],
                 m.carries_value[i] ? std::move(values[next++]) : any_tensor{});
  } catch (const error& e) { // a second value for a key: the step cannot go on
    table_.abort(m.step_id, task_ + ": " + e.message());
  }
  batch.run();
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

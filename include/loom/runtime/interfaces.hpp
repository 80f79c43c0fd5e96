// The runtime's seams, as TensorFlow's distributed runtime has them: a session
// runs steps through a master (MasterInterface: a local one in its own
// process, or the cluster master that partitions the graph over a cluster's
// tasks), and a program serves a cluster task through a server
// (ServerInterface). The API (loom::session, loom::server) holds these
// interfaces only; their implementations (runtime/local_master.hpp,
// runtime/master.hpp, runtime/task_server.hpp: the executor, the placer, the
// message layer, Asio) are compiled once per program and reached through the
// runtime_factory they register, as TF's SessionFactory and ServerFactory are.
// So a unit that builds and runs graphs never compiles the runtime itself.
#pragma once

#include <loom/cluster/cluster_spec.hpp>
#include <loom/cluster/liveness_settings.hpp>
#include <loom/cluster/tls_settings.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/graph/graph.hpp>
#include <loom/runtime/step_stats.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

namespace detail {
class resource_manager;
}

struct session_options {
  // Threads of the intra-op pool; 0 means LOOM_INTRA_OP_THREADS where it is set
  // (loom-launch sets each task's share of the host's cores), else one per CPU
  // the process may run on (its affinity mask).
  int intra_op_threads = 0;
  // Run fusable elementwise regions as their primitive ops, as a process
  // without the regions' instantiations does (for tests and comparisons).
  bool disable_fusion = false;
  // TF's ConfigProto options over this process's devices,
  // /job:localhost/replica:0/task:0/device:CPU:0 and, where a GPU backend is
  // linked in (loom/kernels/cuda/backend.hpp) and finds GPUs, .../device:GPU:i. A node
  // whose device request names another device (a GPU this process lacks, a ps
  // task), or a GPU for an op without a GPU kernel, fails the run naming it and
  // the available devices, unless allow_soft_placement runs it on the CPU and
  // says so on placement_log. A node without a request runs on the CPU.
  bool allow_soft_placement = false;
  bool log_device_placement = false;
  // Where the placer's lines go; null: the library's logger (core/log.hpp).
  std::ostream* placement_log = nullptr;
  // A step whose every node runs on one GPU is recorded into a CUDA graph at its third run
  // and replayed by one launch from then on (runtime/captured_step.hpp says when it cannot
  // be); false: its kernels are launched one by one, every run.
  bool gpu_graphs = true;
};

// The options of a session on a cluster, and of the calls a client makes of a
// whole cluster (session::reset, session::shutdown_cluster).
struct cluster_session_options {
  bool allow_soft_placement = false;
  bool log_device_placement = false;
  std::vector<std::string> device_filters{};
  std::optional<std::string> token{};
  // TLS to the cluster's tasks (cluster/tls_settings.hpp); nullopt: LOOM_TLS, LOOM_TLS_CERT...
  std::optional<tls_settings> tls{};
  // How long to wait for the target and the other tasks to come up; for reset
  // and shutdown_cluster, the deadline of the whole call.
  std::chrono::milliseconds connect_timeout{30000};
  // A step that takes longer fails with deadline_exceeded (0: no limit).
  std::chrono::milliseconds step_timeout{0};
  // How soon a task that stopped answering fails the calls to it with unavailable
  // (cluster/liveness_settings.hpp); nullopt: LOOM_HEARTBEAT_TIMEOUT, else 6 s.
  std::optional<liveness_settings> liveness{};
  // No "waiting for <task>" lines while connecting, and no line from
  // shutdown_cluster about tasks it could not reach (its report still says).
  // Errors still say everything.
  bool quiet = false;
  // Where the placer's lines go; null: the library's logger (core/log.hpp).
  std::ostream* placement_log = nullptr;
};

// What session::shutdown_cluster did: the tasks that were told to stop, and
// those it could not reach before its deadline (gone already, never started,
// or cut off), each as "<task>: <why>".
struct shutdown_report {
  std::vector<std::string> stopped;
  std::vector<std::string> unreachable;
  bool all_stopped() const noexcept { return unreachable.empty(); }
};

// What session::ping_cluster found: the tasks that answered, and those that
// did not before its deadline, each as "<task>: <why>".
struct ping_report {
  std::vector<std::string> answered;
  std::vector<std::string> unreachable;
};

// Where a session runs: a server's target() ("loom://host:port"). A type of
// its own, not a bare string, so `session(g, {.intra_op_threads = 2})` stays
// unambiguous.
struct session_target {
  std::string address;
  session_target(std::string a) : address(std::move(a)) {}
  session_target(const char* a) : address(a) {}
};

// What a task's server lets its peers hold (docs/wire-protocol.md, "Hostile peers"): the
// message layer's limits (net::rpc_server_options, whose defaults these are), for the
// operator of a ps shared by many clients or reachable by untrusted ones. Every count and
// duration must be at least 1; the server refuses others, naming the limit.
struct server_limits {
  // Memory held for frames not yet received in full, charged as the bytes arrive. A
  // message that would hold more than the first on one connection is refused; a read that
  // would pass the second evicts peers stalled in the middle of a frame, else closes its
  // own connection; each with resource_exhausted naming the limit.
  std::uint64_t max_pending_bytes_per_connection = std::uint64_t{2} << 30; // 2 GiB
  std::uint64_t max_pending_bytes = std::uint64_t{4} << 30;                // 4 GiB
  // Connections accepted whose handshake has not finished; past this many the oldest is
  // closed. A handshake not finished within handshake_timeout is closed too.
  std::size_t max_handshaking_connections = 128;
  std::chrono::milliseconds handshake_timeout{10000};
  // Connections past the handshake (a client holds two: control and bulk). At the cap the
  // client idle the longest (nothing received for idle_eviction_grace, no request
  // unanswered) is closed to make room; failing that a newcomer is refused with
  // resource_exhausted naming max_connections.
  std::size_t max_connections = 4096;
  std::chrono::milliseconds idle_eviction_grace{5000};
  // After a failed accept (out of file descriptors) the next waits accept_backoff,
  // doubling up to max_accept_backoff.
  std::chrono::milliseconds accept_backoff{10};
  std::chrono::milliseconds max_accept_backoff{1000};
};

struct server_options {
  // The cluster token; nullopt: LOOM_CLUSTER_TOKEN or LOOM_CLUSTER_TOKEN_FILE.
  std::optional<std::string> token{};
  // Serve beyond loopback without a token (also LOOM_ALLOW_INSECURE=1).
  bool allow_insecure = false;
  // TLS for the task's connections, served and made (cluster/tls_settings.hpp); nullopt:
  // LOOM_TLS, LOOM_TLS_CERT... (which the cluster flags --tls, --tls_cert... set).
  std::optional<tls_settings> tls{};
  // The address to listen on (net/listen_address.hpp); nullopt: LOOM_BIND (--bind), else
  // every interface, or the task's loopback address where the whole cluster is on this
  // host's loopback. The others reach the task at its cluster-spec address either way.
  std::optional<std::string> bind{};
  // How long the task's own cluster-spec host name may take to resolve (a Kubernetes pod's
  // name, published after the pod starts) before the server fails naming it.
  std::chrono::milliseconds resolve_timeout{std::chrono::minutes(2)};
  // How soon a peer that stopped answering fails the task's calls to it (its steps'
  // transfers), and the keepalive on its connections (cluster/liveness_settings.hpp);
  // nullopt: LOOM_HEARTBEAT_TIMEOUT, else 6 s.
  std::optional<liveness_settings> liveness{};
  // Threads of the intra-op pool that kernels use; 0: LOOM_INTRA_OP_THREADS
  // where it is set, else one per CPU the process may run on (its affinity mask).
  int intra_op_threads = 0;
  // Where the task's log lines go; empty: the library's logger (core/log.hpp).
  std::function<void(std::string_view)> log{};
  // What the task's peers may hold: memory, connections, the pace of accepting.
  server_limits limits{};
};

// The seams themselves: the runtime's, not the user's.
namespace detail {

// The id of one run of a request (a "step", as TF names it; a plan's unit of work
// is an item, runtime/plan.hpp): the same on every task the request's partitions
// run on, so that their transfers meet in the rendezvous.
using step_id = std::uint64_t;

// What one step computes: the nodes whose values it returns, the nodes it only
// runs, and the nodes whose values the caller feeds.
struct run_request {
  std::vector<node_id> fetches;
  std::vector<node_id> targets;
  std::vector<node_id> fed;

  // What a master caches a request's plan or partitions under, with the
  // graph version it was made for.
  std::string key(std::uint64_t graph_version) const;
};

// Runs a session's steps (TF's MasterInterface, with the master session it
// creates folded in: one per loom::session).
class master_interface {
public:
  virtual ~master_interface() = default;
  // Runs `req` on `g`: `feeds` are the values of req.fed's nodes, in its order;
  // returns the values of req.fetches, in its order. `trace`, where given,
  // receives the step's stats (run_options' trace_level::full).
  virtual std::vector<any_tensor> run(const graph& g, const run_request& req,
                                      std::vector<any_tensor> feeds, step_stats* trace) = 0;
};

// A cluster task serving (TF's ServerInterface); loom::server holds one.
class server_interface {
public:
  // What this task received from other tasks' _sends: messages, and the
  // tensors (control edges included) in them.
  struct transfer_counts {
    std::uint64_t messages = 0, tensors = 0;
  };

  virtual ~server_interface() = default;
  virtual std::string target() const = 0;
  virtual const cluster_spec& cluster() const noexcept = 0;
  virtual const std::string& job_name() const noexcept = 0;
  virtual int task_index() const noexcept = 0;
  virtual resource_manager& resources() noexcept = 0;
  virtual std::size_t registered_graphs() = 0;
  virtual transfer_counts received() const noexcept = 0;
  virtual void join() = 0;
  virtual void stop() = 0;
};

// Makes the runtime's masters and servers, and carries the calls a client
// makes of a whole cluster. One is registered per program by the runtime's
// implementation (runtime/linked_runtime.hpp), which loom::kernels compiles.
class runtime_factory {
public:
  virtual ~runtime_factory() = default;
  virtual std::unique_ptr<master_interface> local_master(const session_options& o) = 0;
  virtual std::unique_ptr<master_interface> cluster_master(const std::string& target,
                                                           cluster_session_options o) = 0;
  virtual std::unique_ptr<server_interface> server(cluster_spec cluster, std::string job, int task,
                                                   server_options o) = 0;
  virtual void reset(const std::string& target, const std::vector<std::string>& containers,
                     cluster_session_options o) = 0;
  virtual shutdown_report shutdown_cluster(const std::string& target,
                                           const std::vector<std::string>& jobs,
                                           cluster_session_options o) = 0;
  virtual ping_report ping_cluster(const std::string& target, const std::vector<std::string>& jobs,
                                   cluster_session_options o) = 0;

  // The registered factory; an error saying how to link one where none is.
  static runtime_factory& linked() {
    if (runtime_factory* f = slot())
      return *f;
    throw failed_precondition_error(
        "loom: this program has no runtime linked in (the executor, master and server that run "
        "graphs): link its target with the CMake target loom::kernels, or include "
        "<loom/loom.hpp> in one of its units when building without loom::kernels");
  }
  // Called by the implementation once, before main().
  static bool install(runtime_factory& f) noexcept {
    slot() = &f;
    return true;
  }

private:
  static runtime_factory*& slot() noexcept {
    static runtime_factory* f = nullptr;
    return f;
  }
};

} // namespace detail

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE std::string run_request::key(std::uint64_t graph_version) const {
  std::string k = std::to_string(graph_version) + "|";
  for (auto v : {&fetches, &targets, &fed}) {
    for (node_id id : *v)
      k += std::to_string(id) + ",";
    k += "|";
  }
  return k;
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

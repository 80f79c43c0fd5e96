// loom-server: serves any task of a cluster, for graphs built by any client.
// It never saw the clients' C++ types: it runs partitions through its kernel
// registry, and fused regions through their primitive ops.
//
//   loom-server --ps_hosts=h1:2222 --worker_hosts=h2:2222,h3:2222 --job_name=ps --task_index=0
//   TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}' loom-server
//   srun -n 3 loom-server --jobs=ps:1,worker:2 --port_base=2222
// (the cluster resolver, loom/cluster/cluster_resolver.hpp; docs/deploying.md).
//
// --tls (TLS keyed by the cluster token) or --tls_cert/--tls_key/--tls_ca (TLS with
// certificates) encrypt its connections, as every cluster program's (docs/deploying.md).
//
// Flags such as --max_connections and --max_pending_bytes set what its peers may hold
// (loom::server_limits; docs/wire-protocol.md, "Hostile peers").
//
// It serves until a client shuts the cluster down (session::shutdown_cluster)
// and then exits 0.
#include <loom/loom.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

int main(int argc, char** argv) try {
  loom::flags flags("Serves one task of a loom cluster until the cluster is shut down.");
  loom::define_cluster_flags(flags, {.job_name_help = "The job of this task (ps, worker, ...)"});
  flags.define_int(
      "intra_op_threads", 0,
      "Threads for kernels (0: LOOM_INTRA_OP_THREADS, else one per CPU it may run on)");
  // What peers may hold (loom::server_limits; docs/wire-protocol.md, "Hostile peers").
  const loom::server_limits defaults;
  flags
      .define_int("max_pending_bytes_per_connection",
                  static_cast<std::int64_t>(defaults.max_pending_bytes_per_connection),
                  "Bytes one connection may hold for a frame not yet received in full")
      .define_int("max_pending_bytes", static_cast<std::int64_t>(defaults.max_pending_bytes),
                  "Bytes all connections together may hold for frames not yet received")
      .define_int("max_handshaking_connections",
                  static_cast<std::int64_t>(defaults.max_handshaking_connections),
                  "Connections in their handshake; past it the oldest is closed")
      .define_int("handshake_timeout_ms", defaults.handshake_timeout.count(),
                  "A connection that has not finished its handshake by then is closed")
      .define_int("max_connections", static_cast<std::int64_t>(defaults.max_connections),
                  "Connections past the handshake (two per client); past it the idlest "
                  "client gives way, or a newcomer is refused")
      .define_int("idle_eviction_grace_ms", defaults.idle_eviction_grace.count(),
                  "How long a client must have sent nothing before it may give way")
      .define_int("accept_backoff_ms", defaults.accept_backoff.count(),
                  "The pause after a failed accept (out of descriptors), doubling")
      .define_int("max_accept_backoff_ms", defaults.max_accept_backoff.count(),
                  "The longest pause after failed accepts");
  if (!flags.parse(argc, argv))
    return 0;
  // Each limit is a count or a duration of at least 1: a zero would refuse every peer.
  const auto limit = [&](const char* name) {
    const std::int64_t v = flags.get_int(name);
    if (v < 1)
      throw loom::invalid_argument_error("--" + std::string(name) + " must be at least 1, not " +
                                         std::to_string(v));
    return v;
  };
  loom::server_options options;
  try {
    auto& l = options.limits;
    l.max_pending_bytes_per_connection =
        static_cast<std::uint64_t>(limit("max_pending_bytes_per_connection"));
    l.max_pending_bytes = static_cast<std::uint64_t>(limit("max_pending_bytes"));
    l.max_handshaking_connections = static_cast<std::size_t>(limit("max_handshaking_connections"));
    l.handshake_timeout = std::chrono::milliseconds(limit("handshake_timeout_ms"));
    l.max_connections = static_cast<std::size_t>(limit("max_connections"));
    l.idle_eviction_grace = std::chrono::milliseconds(limit("idle_eviction_grace_ms"));
    l.accept_backoff = std::chrono::milliseconds(limit("accept_backoff_ms"));
    l.max_accept_backoff = std::chrono::milliseconds(limit("max_accept_backoff_ms"));
    if (l.accept_backoff > l.max_accept_backoff)
      throw loom::invalid_argument_error("--accept_backoff_ms (" +
                                         std::to_string(l.accept_backoff.count()) +
                                         ") exceeds --max_accept_backoff_ms (" +
                                         std::to_string(l.max_accept_backoff.count()) + ")");
  } catch (const loom::invalid_argument_error& e) {
    std::cerr << "loom-server: " << e.message() << "\n";
    return 2;
  }

  const auto role = loom::resolve_cluster(flags);
  if (role.cluster.empty()) {
    std::cerr << "loom-server: give the cluster with --ps_hosts/--worker_hosts, TF_CONFIG, or "
                 "start it under srun or mpirun with --jobs\n";
    return 2;
  }
  if (role.job_name.empty()) {
    std::cerr << "loom-server: --job_name is required\n";
    return 2;
  }
  const std::string& job = role.job_name;
  const int task = role.task_index;
  const auto& cluster = role.cluster;
  options.intra_op_threads = static_cast<int>(flags.get_int("intra_op_threads"));
  loom::server server(cluster, job, task, options);
  const loom::tls_settings tls = loom::tls_settings_from_environment(); // what the server uses
  std::printf("loom-server: serving /job:%s/task:%d at %s%s\n", job.c_str(), task,
              server.target().c_str(), tls.enabled() ? (" (" + tls.describe() + ")").c_str() : "");
  std::fflush(stdout);
  server.join();
  return 0;
} catch (const loom::error& e) {
  // A task that fails to start or to serve says so as a log line: with the time and, once
  // its server named it, the task (core/log.hpp). Usage errors above are the command's own.
  loom::logging::error(e.what());
  return 1;
}

// loom-server: serves any task of a cluster, for graphs built by any client.
// It never saw the clients' C++ types: it runs partitions through its kernel
// registry, and fused regions through their primitive ops.
//
//   loom-server --ps_hosts=h1:2222 --worker_hosts=h2:2222,h3:2222 --job_name=ps --task_index=0
//   TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}' loom-server
//
// It serves until a client shuts the cluster down (session::shutdown_cluster)
// and then exits 0.
#include <loom/loom.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) try {
  loom::flags flags("Serves one task of a loom cluster until the cluster is shut down.");
  flags.define_string("ps_hosts", "", "Comma-separated host:port of the ps tasks")
      .define_string("worker_hosts", "", "Comma-separated host:port of the worker tasks")
      .define_string("job_name", "", "The job of this task (ps, worker, ...)")
      .define_int("task_index", 0, "The index of this task within its job")
      .define_int("intra_op_threads", 0, "Threads for kernels (0: one per core)");
  if (!flags.parse(argc, argv))
    return 0;

  loom::cluster_spec cluster;
  std::string job = flags.get_string("job_name");
  int task = static_cast<int>(flags.get_int("task_index"));
  if (!flags.get_string("ps_hosts").empty() || !flags.get_string("worker_hosts").empty()) {
    cluster = loom::cluster_spec::from_flags(flags.get_string("ps_hosts"),
                                             flags.get_string("worker_hosts"));
  } else if (const auto config = loom::tf_config_from_env()) {
    cluster = config->cluster;
    if (job.empty()) {
      job = config->task_type;
      task = config->task_index;
    }
  } else {
    std::cerr << "loom-server: give the cluster with --ps_hosts/--worker_hosts or TF_CONFIG\n";
    return 2;
  }
  if (job.empty()) {
    std::cerr << "loom-server: --job_name is required\n";
    return 2;
  }
  loom::server_options options;
  options.intra_op_threads = static_cast<int>(flags.get_int("intra_op_threads"));
  loom::server server(cluster, job, task, options);
  std::printf("loom-server: serving /job:%s/task:%d at %s\n", job.c_str(), task,
              server.target().c_str());
  std::fflush(stdout);
  server.join();
  return 0;
} catch (const loom::error& e) {
  std::cerr << "loom-server: " << e.what() << "\n";
  return 1;
}

// An in-process cluster for tests: `ps` ps tasks and `workers` workers, each a
// loom::server on its own free loopback port, all served by this process.
#pragma once

#include <loom/api.hpp>

#include <support/process.hpp>

#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace loom::testing {

struct local_cluster {
  loom::cluster_spec spec;
  std::vector<std::unique_ptr<loom::server>> servers;

  // free_ports' ports are free when it returns, not when the servers bind them: a test
  // process beside this one may take one meanwhile (an outgoing connection's ephemeral
  // port), and the server then cannot listen. Such a cluster is started again on new ports.
  local_cluster(int ps, int workers) {
    for (int attempt = 1;; ++attempt) {
      try {
        start(ps, workers);
        return;
      } catch (const loom::unavailable_error& e) {
        servers.clear();
        if (attempt == 5 ||
            std::string_view(e.what()).find("cannot listen on") == std::string_view::npos)
          throw;
      }
    }
  }
  loom::server& ps(int i) { return *servers[static_cast<std::size_t>(i)]; }
  // The first worker's target: where a test's session usually runs.
  std::string target() { return worker(0).target(); }
  loom::server& worker(int i) {
    return *servers[servers.size() - workers_count() + static_cast<std::size_t>(i)];
  }
  std::size_t workers_count() const { return static_cast<std::size_t>(spec.num_tasks("worker")); }

private:
  void start(int ps, int workers) {
    auto ports = free_ports(static_cast<std::size_t>(ps + workers));
    std::vector<std::string> ps_hosts, worker_hosts;
    for (int i = 0; i < ps + workers; ++i)
      (i < ps ? ps_hosts : worker_hosts)
          .push_back("127.0.0.1:" + std::to_string(ports[static_cast<std::size_t>(i)]));
    spec = loom::cluster_spec{{"ps", loom::cluster_spec::job_def(ps_hosts)},
                              {"worker", loom::cluster_spec::job_def(worker_hosts)}};
    for (int i = 0; i < ps; ++i)
      servers.push_back(std::make_unique<loom::server>(spec, "ps", i));
    for (int i = 0; i < workers; ++i)
      servers.push_back(std::make_unique<loom::server>(spec, "worker", i));
  }
};

// Task 0 of job ps served by another process (`server_bin`: loom-server), so
// that it can be killed, and worker 0 served by this one.
struct ps_process_cluster {
  std::vector<std::uint16_t> ports = free_ports(2);
  std::string ps_host = "127.0.0.1:" + std::to_string(ports[0]);
  std::string worker_host = "127.0.0.1:" + std::to_string(ports[1]);
  child ps;
  std::unique_ptr<loom::server> worker;

  explicit ps_process_cluster(const std::string& server_bin)
      : ps(server_bin, {"--ps_hosts=" + ps_host, "--worker_hosts=" + worker_host, "--job_name=ps",
                        "--task_index=0"}) {
    if (!ps.wait_for_output("serving /job:ps/task:0"))
      throw std::runtime_error("the ps process did not start serving: " + ps.report());
    worker = std::make_unique<loom::server>(loom::cluster_spec::from_flags(ps_host, worker_host),
                                            "worker", 0);
  }
};

// Session options that keep the placement log out of the test output.
inline loom::cluster_session_options quiet() {
  static std::ostringstream sink;
  loom::cluster_session_options o;
  o.placement_log = &sink;
  return o;
}

} // namespace loom::testing

// Seed 003, "Sharing State Across Sessions Using Resource Containers": a
// variable x lives in a resource container on the ps task, not in a session,
// so a client that initializes and increments it through server A prints 1.0
// and a second client through server B prints 2.0. Variable scopes keep two
// problems' x apart; session::reset clears a container on every task.
//
// The cluster (1 ps, 2 workers A and B), one process per task:
//   shared_state --ps_hosts=H:P --worker_hosts=H:A,H:B --job_name=ps --task_index=0
//   shared_state --ps_hosts=H:P --worker_hosts=H:A,H:B --job_name=worker --task_index=0
//   shared_state --ps_hosts=H:P --worker_hosts=H:A,H:B --job_name=worker --task_index=1
// The seed's simple_client, one process per run:
//   shared_state --target=loom://H:A --init      # problem1/x = 1.0
//   shared_state --target=loom://H:B             # problem1/x = 2.0
//   shared_state --target=loom://H:B --problem=problem2 --container=experiment --init
//   shared_state --target=loom://H:A --reset --container=experiment
//   shared_state --target=loom://H:A --shutdown  # every task exits 0
// With no --job_name and no --target, this process runs the whole story: the
// three tasks as server objects on free loopback ports and each client as a
// session of its own.
#include <loom/loom.hpp>

#include <asio/ip/tcp.hpp>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace {

std::string free_loopback_hosts(int n) {
  asio::io_context io;
  std::vector<asio::ip::tcp::acceptor> open; // open until all are chosen: no port twice
  std::string hosts;
  for (int i = 0; i < n; ++i) {
    open.emplace_back(io, asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    hosts +=
        (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(open.back().local_endpoint().port());
  }
  return hosts;
}

// The seed's simple_client.py: x = Variable(0.0); increment_x = assign(x, x + 1).
void simple_client(const std::string& target, const std::string& problem,
                   const std::string& container, bool init) {
  loom::graph g;
  auto scope = loom::variable_scope(g, problem); // keeps problem1/x and problem2/x apart
  auto on_ps = g.device(loom::replica_device_setter({.ps_tasks = 1}));
  auto x = loom::get_variable<float, 0>(g, "x", loom::shape{}, loom::constant_initializer{0},
                                        {.container = container});
  auto increment_x = x.assign(x + 1.0f);

  loom::session sess(g, target);
  if (init)
    sess.run(x.initializer());
  sess.run(increment_x);
  const float value = sess.run(x);
  std::printf("%s = %.1f (container '%s', through %s)\n", g.node(x.id()).name.c_str(),
              static_cast<double>(value), container.c_str(), target.c_str());
  std::fflush(stdout);
}

void reset(const std::string& target, const std::string& container) {
  loom::session::reset(target, {container});
  std::printf("reset container '%s' on every task\n", container.c_str());
  std::fflush(stdout);
}

// Every step of the story in one process.
void demo() {
  const auto cluster =
      loom::cluster_spec::from_flags(free_loopback_hosts(1), free_loopback_hosts(2));
  loom::server ps(cluster, "ps", 0);
  loom::server a(cluster, "worker", 0);
  loom::server b(cluster, "worker", 1);
  std::printf("cluster %s\n", cluster.to_string().c_str());
  simple_client(a.target(), "problem1", "", true);           // 1.0
  simple_client(b.target(), "problem1", "", false);          // 2.0: the same x, on the ps
  simple_client(b.target(), "problem2", "experiment", true); // another x: 1.0
  reset(a.target(), "experiment");
  try {
    simple_client(a.target(), "problem2", "experiment", false);
  } catch (const loom::error& e) {
    std::printf("after the reset: %s\n", e.what());
  }
  simple_client(a.target(), "problem1", "", false); // 3.0: the default container was kept
  loom::session::shutdown_cluster(a.target());
  ps.join();
  a.join();
  b.join();
}

} // namespace

int main(int argc, char** argv) try {
  loom::flags flags("Seed 003: a variable on the ps, shared by clients of different servers.");
  loom::define_cluster_flags(flags, {.job_name_help = "ps or worker: serve that task; empty: "
                                                      "a client (--target) or the demo"});
  flags.define_string("target", "", "Run the client through this server (\"loom://host:port\")")
      .define_bool("init", false, "Client: run x's initializer first")
      .define_string("problem", "problem1", "Client: the variable scope of x")
      .define_string("container", "", "Client: the resource container of x")
      .define_bool("reset", false, "Client: clear --container on every task instead of running")
      .define_bool("shutdown", false, "Client: shut the cluster down instead of running");
  if (!flags.parse(argc, argv))
    return 0;

  const auto role = loom::resolve_cluster(flags);
  const std::string& job = role.job_name;
  const std::string target = flags.get_string("target");
  if (!job.empty()) {
    loom::server server(role.cluster, job, role.task_index);
    std::printf("serving /job:%s/task:%d at %s\n", job.c_str(), server.task_index(),
                server.target().c_str());
    std::fflush(stdout);
    server.join();
    return 0;
  }
  if (target.empty()) {
    demo();
    return 0;
  }
  if (flags.get_bool("shutdown")) {
    loom::session::shutdown_cluster(target);
    std::printf("cluster shut down\n");
  } else if (flags.get_bool("reset")) {
    reset(target, flags.get_string("container"));
  } else {
    simple_client(target, flags.get_string("problem"), flags.get_string("container"),
                  flags.get_bool("init"));
  }
  return 0;
} catch (const loom::error& e) {
  std::cerr << "shared_state: " << e.what() << "\n";
  return 1;
}

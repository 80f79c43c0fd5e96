// Seed 001 (the "Distributed TensorFlow" notebook): a local server says hello;
// then a cluster of 2 ps and 3 workers, ops pinned across its tasks with device
// scopes, and variables spread over the ps tasks by replica_device_setter,
// with log_device_placement showing where every node went.
//
// By default this process runs all five tasks as server objects, like the
// notebook does, on ports the OS chose (or on --ps_hosts/--worker_hosts). The
// tasks can also be separate processes, with a client that drives them and
// shuts the cluster down at the end:
//
//   pinning --ps_hosts=H:P,H:P --worker_hosts=H:P,H:P,H:P --job_name=ps --task_index=0
//   ...                                                   (one per task)
//   pinning --ps_hosts=H:P,H:P --worker_hosts=H:P,H:P,H:P --job_name=client
#include <loom/loom.hpp>

#include <asio/ip/tcp.hpp>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace {

// "127.0.0.1:p" for n ports that are free now: every acceptor stays open until
// all are chosen, so no port comes twice.
std::vector<std::string> free_loopback_addresses(int n) {
  asio::io_context io;
  std::vector<asio::ip::tcp::acceptor> open;
  std::vector<std::string> addresses;
  for (int i = 0; i < n; ++i) {
    open.emplace_back(io, asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    addresses.push_back("127.0.0.1:" + std::to_string(open.back().local_endpoint().port()));
  }
  return addresses;
}

double value(float v) {
  return static_cast<double>(v);
}

// The notebook's cells 3-4: a string constant evaluated through a local server.
void hello() {
  auto server = loom::server::create_local_server();
  loom::graph g;
  auto c = loom::constant(g, "Hello distributed loom!");
  loom::session sess(g, server->target());
  std::string greeting = sess.run(c);
  std::printf("local server %s: %s\n", server->target().c_str(), greeting.c_str());
  std::fflush(stdout);
}

// Cells 7-8: a on the ps, b on some worker, c on worker 1; c = a + (a + 2) = 4.
void pin_across_tasks(const std::string& target, const loom::cluster_session_options& options) {
  loom::graph g;
  auto a =
      g.on("/job:ps", [&] { return loom::variable<float, 0>(g, "a", loom::constant(g, 1.0f)); });
  auto b = g.on("/job:worker", [&] { return loom::named(a + 2.0f, "b"); });
  auto c = g.on("/job:worker/task:1", [&] { return loom::named(a + b, "c"); });

  loom::session sess(g, target, options);
  sess.run(a.initializer());
  std::printf("c = %.1f\n", value(sess.run(c)));
  std::fflush(stdout);
}

// Cell 10: replica_device_setter over 2 ps tasks; inner scopes override the
// worker task and the device type.
void replica_setter(const std::string& target, const loom::cluster_session_options& options) {
  loom::graph g;
  auto scope = g.device(loom::replica_device_setter(
      {.ps_tasks = 2, .ps_device = "/job:ps", .worker_device = "/job:worker"}));
  loom::variable<float, 0> v1(g, "v1", loom::constant(g, 1.0f)); // /job:ps/task:0
  loom::variable<float, 0> v2(g, "v2", loom::constant(g, 2.0f)); // /job:ps/task:1
  loom::variable<float, 0> v3(g, "v3", loom::constant(g, 3.0f)); // /job:ps/task:0
  auto s = loom::named(v1 + v2, "s");                            // /job:worker (task:0)
  auto [p1, p2] = g.on("/task:1", [&] {
    auto p1 = loom::named(2.0f * s, "p1");                                 // /job:worker/task:1
    auto p2 = g.on("/cpu:0", [&] { return loom::named(3.0f * s, "p2"); }); // .../task:1/cpu:0
    return std::make_pair(p1, p2);
  });

  loom::session sess(g, target, options);
  sess.run(loom::global_variables_initializer(g));
  auto [r1, r2, r3, rs, rp1, rp2] = sess.run(loom::fetches(v1, v2, v3, s, p1, p2));
  std::printf("v1 = %.1f, v2 = %.1f, v3 = %.1f, s = %.1f, p1 = %.1f, p2 = %.1f\n", value(r1),
              value(r2), value(r3), value(rs), value(rp1), value(rp2));
  std::fflush(stdout);
}

void client(const loom::cluster_spec& cluster) {
  // The notebook's sessions talk to ps task 0 ("grpc://127.0.0.1:2221").
  const std::string target = "loom://" + cluster.task_address("ps", 0);
  loom::cluster_session_options options;
  options.log_device_placement = true;
  options.placement_log = &std::cout;
  std::printf("session target %s\n", target.c_str());
  pin_across_tasks(target, options);
  replica_setter(target, options);
  std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) try {
  loom::flags flags("Seed 001: a local server, then pinning ops across a 2 ps + 3 worker "
                    "cluster.");
  // No hosts: free loopback ports for the 2 ps tasks and 3 workers.
  loom::define_cluster_flags(
      flags, {.job_name_help = "ps or worker: serve that one task; client: drive a cluster "
                               "served elsewhere; empty: run every task in this process"});
  if (!flags.parse(argc, argv))
    return 0;

  const auto role = loom::resolve_cluster(flags);
  const std::string& job = role.job_name;
  auto cluster = role.cluster;
  if (job.empty() && !cluster.has_job("ps"))
    cluster.add_job("ps", free_loopback_addresses(2));
  if (job.empty() && !cluster.has_job("worker"))
    cluster.add_job("worker", free_loopback_addresses(3));

  if (job == "ps" || job == "worker") {
    loom::server server(cluster, job, role.task_index);
    std::printf("serving /job:%s/task:%d at %s\n", job.c_str(), server.task_index(),
                server.target().c_str());
    std::fflush(stdout);
    server.join();
    return 0;
  }
  if (job != "client" && !job.empty())
    throw loom::invalid_argument_error("--job_name=" + job +
                                       ": expected ps, worker, client or nothing");

  if (job.empty())
    hello();
  std::printf("cluster %s\n", cluster.to_string().c_str());
  std::vector<std::unique_ptr<loom::server>> tasks; // the notebook's cell 6
  if (job.empty())
    for (const std::string j : {"ps", "worker"})
      for (int t : cluster.task_indices(j))
        tasks.push_back(std::make_unique<loom::server>(cluster, j, t));

  client(cluster);

  loom::session::shutdown_cluster("loom://" + cluster.task_address("ps", 0));
  for (auto& t : tasks)
    t->join();
  return 0;
} catch (const loom::error& e) {
  std::cerr << "pinning: " << e.what() << "\n";
  return 1;
}

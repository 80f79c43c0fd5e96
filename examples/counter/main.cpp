// Seed 000: a ps holds a counter variable; a worker increments it through
// assign, one step a time, and prints 1, 2, 3, ... One binary runs as either
// task:
//
//   counter --ps_hosts=127.0.0.1:2222 --worker_hosts=127.0.0.1:2223 --job_name=ps
//   counter --ps_hosts=127.0.0.1:2222 --worker_hosts=127.0.0.1:2223 --job_name=worker
//           --max_steps=5
//
// When the worker is done it shuts the cluster down, so the ps exits 0 too
// (TF's ps would serve forever).
#include <loom/loom.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

int main(int argc, char** argv) try {
  loom::flags flags("Seed 000: a worker increments a counter that lives on a ps.");
  loom::define_cluster_flags(
      flags,
      {.ps_hosts = "127.0.0.1:1057", .worker_hosts = "127.0.0.1:1829", .job_name = "worker"});
  flags.define_int("max_steps", 0, "Increments before the worker stops (0: forever)")
      .define_int("sleep_ms", 0, "Pause between increments (the seed sleeps 1000)");
  if (!flags.parse(argc, argv))
    return 0;

  const auto role = loom::resolve_cluster(flags).require_task();
  const auto& cluster = role.cluster;
  const std::string& job = role.job_name;
  const int task = role.task_index;
  loom::server server(cluster, job, task);
  if (job == "ps") {
    server.join();
    return 0;
  }
  std::printf("%s\n", server.target().c_str());

  loom::graph g;
  auto c = [&] {
    auto _ = g.device("/job:ps/task:0");
    return loom::get_variable<float, 0>(g, "myc", loom::shape{}, loom::constant_initializer{0});
  }();
  auto train_op = c.assign(c + 1.0f);

  loom::session sess(g, server.target());
  sess.run(c.initializer());
  const auto max_steps = flags.get_int("max_steps");
  for (std::int64_t step = 1; max_steps == 0 || step <= max_steps; ++step) {
    const float value = sess.run(train_op);
    std::printf("%g\n", static_cast<double>(value));
    std::fflush(stdout);
    if (flags.get_int("sleep_ms") > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(flags.get_int("sleep_ms")));
  }
  loom::session::shutdown_cluster(server.target());
  return 0;
} catch (const loom::error& e) {
  std::cerr << "counter: " << e.what() << "\n";
  return 1;
}

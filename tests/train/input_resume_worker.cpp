// A ps or the one worker of test_input_iterator's killed-worker case: the worker
// trains on batches of 4 of range(0, 100000) read in the step through an iterator,
// checkpoints every 5 global steps, prints the first element it reads after it
// starts and each step's global step, and stops at global step 30. Killed and
// started again while the ps keeps the variables, it joins them and its input goes on
// from the last checkpoint's position.
#include <loom/data/pipeline.hpp>
#include <loom/loom.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

int main(int argc, char** argv) try {
  loom::flags flags("test_input_iterator's ps or worker");
  loom::define_cluster_flags(flags, {.ps_hosts = "", .worker_hosts = "", .task_index = 0});
  flags.define_string("checkpoint_dir", "", "Where the worker saves its checkpoints");
  if (!flags.parse(argc, argv))
    return 0;
  const auto role = loom::resolve_cluster(flags).require_task();
  loom::server server(role.cluster, role.job_name, role.task_index);
  if (role.job_name == "ps") {
    server.join();
    return 0;
  }
  loom::graph g;
  std::optional<loom::operation> train;
  std::optional<loom::output<std::int64_t, 1>> batch;
  {
    auto _ = g.device(loom::make_replica_device_setter(
        role.cluster, {.ps_device = "/job:ps/cpu:0", .worker_device = "/job:worker/task:0"}));
    auto step = loom::create_global_step(g);
    auto it = loom::make_one_shot_iterator(g, loom::data::range(0, 100000) | loom::data::batch(4) |
                                                  loom::data::prefetch(2));
    batch = it.get_next();
    train = loom::group(g, *batch, step.assign_add(std::int64_t{1}));
  }
  std::ostringstream placements;
  loom::monitored_session_options o;
  o.master = server.target();
  o.checkpoint_dir = flags.get_string("checkpoint_dir");
  o.save_checkpoint_secs = 0;
  o.save_checkpoint_steps = 5;
  o.hooks = {std::make_shared<loom::stop_at_step_hook>(30)};
  o.config.placement_log = &placements;
  loom::monitored_training_session s(g, o);
  bool first = true;
  while (!s.should_stop()) {
    auto [_, x] = s.run(loom::fetches(*train, *batch));
    if (first)
      std::printf("first element read: %lld\n", static_cast<long long>(x(0)));
    first = false;
    std::printf("global step %lld \n", static_cast<long long>(s.global_step()));
    std::fflush(stdout);
    // Slow enough that the test kills it mid-epoch, between checkpoints.
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  s.close();
  return 0;
} catch (const std::exception& e) {
  std::cerr << "input_resume_worker: " << e.what() << "\n";
  return 1;
}

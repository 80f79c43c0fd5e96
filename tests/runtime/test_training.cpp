// Distributed training end to end (seed 002): examples/mnist_replica as real
// processes on loopback, async and with synchronous replicas, with a worker
// killed, and with the ps killed and restarted (mid-run, and while a worker
// waits for the chief). Each case checks the exit of
// every process, so none is left behind (a child's destructor kills it).
//
// Every case needs examples/mnist_replica and Fashion-MNIST: with either
// missing it fails at once, saying what to do (require_prerequisites); built
// without examples on purpose, every case is skipped (needs_examples).
#include "training_cluster.hpp"

using namespace loom::testing::training;

TEST_CASE("async, 1 ps + 2 workers: a non-chief waits for the chief, both train, one global "
          "step per worker step, every task exits 0" *
          lt::needs_examples()) {
  require_prerequisites();
  cluster_flags cf(1, 2);
  temp_dir dir;
  lt::child ps(replica(), cf.task("ps", 0));
  lt::child w1(replica(), args(cf.task("worker", 1), common(dir, "1500")));
  REQUIRE_MESSAGE(w1.wait_for_output("waiting for the chief to initialize", 60s), w1.report());
  // The chief traces its step 50 (--trace_step): its Chrome trace holds the ps's and its own
  // task, and the tensors between them (tests/runtime/test_timeline.cpp checks a trace in full).
  const std::string trace = (dir.path / "step50.trace.json").string();
  lt::child w0(replica(), args(cf.task("worker", 0), common(dir, "1500"), "--trace_step=50",
                               "--trace_file=" + trace));
  expect_exit(w0, 0, 300s);
  expect_exit(w1, 0, 60s);
  expect_exit(ps, 0, 60s);
  CHECK(contains(w0.output(), "wrote the trace of local step 50 to " + trace));
  {
    std::ifstream in(trace);
    const std::string json{std::istreambuf_iterator<char>(in), {}};
    CHECK(contains(json, R"("args":{"name":"/job:ps/replica:0/task:0"})"));
    CHECK(contains(json, R"("args":{"name":"/job:worker/replica:0/task:0"})"));
    CHECK(contains(json, R"("cat":"transfer","ph":"s")"));
    CHECK(contains(json, R"("cat":"transfer","ph":"f")"));
  }
  // Async: every worker step adds one to the global step.
  CHECK(final_global_step(w0.output()) == local_steps(w0.output()) + local_steps(w1.output()));
  CHECK(final_global_step(w0.output()) >= 1500);
  CHECK(test_accuracy(w0.output()) >= 0.80);
  CHECK(test_accuracy(w1.output()) >= 0.80);
  // The chief's summaries for TensorBoard, in --checkpoint_dir (no --logdir given).
  check_event_file_tags(dir, {"loss", "accuracy", "examples/s", "hid_w", "sm_w"});
}

TEST_CASE("sync replicas, 1 ps + 2 workers: one global step per aggregated update, no worker "
          "runs ahead" *
          lt::needs_examples()) {
  require_prerequisites();
  cluster_flags cf(1, 2);
  temp_dir dir;
  lt::child ps(replica(), cf.task("ps", 0));
  lt::child w0(replica(), args(cf.task("worker", 0), common(dir, "800"), "--sync_replicas"));
  lt::child w1(replica(), args(cf.task("worker", 1), common(dir, "800"), "--sync_replicas"));
  expect_exit(w0, 0, 300s);
  expect_exit(w1, 0, 60s);
  expect_exit(ps, 0, 60s);
  // Both gradients go into every update: each worker's steps are the
  // updates it took part in, and the global step counts updates.
  // Every update needs both gradients and a worker waits for the update of
  // its step before its next one: each worker took part in every update.
  CHECK(final_global_step(w0.output()) == 800);
  check_took_part_in_every_update(w0, 800);
  check_took_part_in_every_update(w1, 800);
  CHECK(test_accuracy(w0.output()) >= 0.80);
}

TEST_CASE("backup workers: 3 workers aggregate 2, one is killed mid-run, training finishes" *
          lt::needs_examples()) {
  require_prerequisites();
  cluster_flags cf(1, 3);
  temp_dir dir;
  auto flags = [&](int task) {
    // The chief would wait up to 120 s for the killed worker to say it is done.
    return args(cf.task("worker", task), common(dir, "1000", "120"), "--sync_replicas",
                "--replicas_to_aggregate=2");
  };
  lt::child ps(replica(), cf.task("ps", 0));
  lt::child w0(replica(), flags(0));
  lt::child w1(replica(), flags(1));
  lt::child w2(replica(), flags(2));
  // Killed mid-run: after its 100th step (it has sent gradients), with about 570 of
  // its steps still to go. A fixed sleep after "Training begins" was not mid-run on a
  // loaded machine: the whole run takes under 2 s, and worker 2 had finished once.
  REQUIRE_MESSAGE(w2.wait_for_output("Worker 2: step 100 ", 120s),
                  (w2.report() + "\n" + ps.report() + "\n" + w0.report() + "\n" + w1.report()));
  w2.kill(); // SIGKILL
  expect_exit(w1, 0, 300s);
  // Once worker 1 has exited no other worker answers: the chief stops waiting
  // for the killed one at once (two checks, each at most 2 s), not after 120 s.
  expect_exit(w0, 0, 30s);
  expect_exit(ps, 0, 60s);
  CHECK(final_global_step(w0.output()) == 1000);
  CHECK_MESSAGE(contains(w0.output(), "2 of 3 worker(s) finished and no other worker answers ("),
                w0.output());
  CHECK_MESSAGE(contains(w0.output(), "/job:worker/replica:0/task:2: "), w0.output());
}

TEST_CASE("sync replicas without backups: a worker killed mid-run and restarted rejoins, and "
          "training finishes" *
          lt::needs_examples()) {
  require_prerequisites();
  cluster_flags cf(1, 2);
  temp_dir dir;
  auto flags = [&](int task) {
    return args(cf.task("worker", task), common(dir, "800"), "--sync_replicas");
  };
  lt::child ps(replica(), cf.task("ps", 0));
  lt::child w0(replica(), flags(0));
  std::optional<lt::child> w1(std::in_place, replica(), flags(1));
  REQUIRE_MESSAGE(w1->wait_for_output("Training begins", 120s),
                  (w1->report() + "\n" + w0.report()));
  std::this_thread::sleep_for(1s); // mid-run
  w1->kill();                      // SIGKILL: every update now waits for its gradient
  w1.emplace(replica(), flags(1)); // the same task, restarted before the barrier's deadline
  expect_exit(w0, 0, 300s);
  expect_exit(*w1, 0, 60s);
  expect_exit(ps, 0, 60s);
  CHECK(final_global_step(w0.output()) == 800);
  CHECK_FALSE(contains(w0.output(), "not every worker finished"));
}

TEST_CASE("the ps is killed and restarted: the chief restores the last checkpoint and training "
          "finishes, losing at most the steps since it" *
          lt::needs_examples()) {
  require_prerequisites();
  cluster_flags cf(1, 1);
  temp_dir dir;
  const auto worker_flags = args(cf.task("worker", 0), common(dir, "2500"),
                                 "--save_checkpoint_steps=200", "--save_checkpoint_secs=0");
  auto ps = std::make_unique<lt::child>(replica(), cf.task("ps", 0));
  lt::child w0(replica(), worker_flags);
  // A checkpoint past step 400 (the step read with a run may lag the run's
  // own update, so the exact numbers saved depend on timing).
  const auto deadline = std::chrono::steady_clock::now() + 180s;
  while (true) {
    const auto saved = captured(w0.output(), "model.ckpt-([0-9]+) ");
    if (!saved.empty() && saved.back() >= 400)
      break;
    REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, w0.report());
    std::this_thread::sleep_for(50ms);
  }
  ps->kill();
  ps.reset();
  const auto saved_before = captured(w0.output(), "model.ckpt-([0-9]+) ");
  lt::child ps2(replica(), cf.task("ps", 0));
  expect_exit(w0, 0, 300s);
  expect_exit(ps2, 0, 60s);
  const std::string out = w0.output();
  INFO(out);
  CHECK(contains(out, "recreating the session"));
  const auto restored = captured(out, "restored [^\n]*model.ckpt-([0-9]+)");
  REQUIRE(restored.size() == 1);
  // The checkpoint restored is the last one saved before the kill (or a
  // later one, saved while the ps was going down), so the steps lost are at
  // most the checkpoint interval.
  CHECK(restored[0] >= saved_before.back());
  CHECK(final_global_step(out) >= 2500);
}

TEST_CASE("a worker waiting for the chief outlives a restart of the ps" * lt::needs_examples()) {
  require_prerequisites();
  cluster_flags cf(1, 2);
  temp_dir dir;
  auto ps = std::make_unique<lt::child>(replica(), cf.task("ps", 0));
  lt::child w1(replica(), args(cf.task("worker", 1), common(dir, "300")));
  REQUIRE_MESSAGE(w1.wait_for_output("waiting for the chief to initialize", 60s), w1.report());
  ps->kill();
  ps.reset();
  // The worker's next readiness check fails (the ps is gone, or restarted and
  // no longer knows the worker's graph); it recreates its session and waits on.
  REQUIRE_MESSAGE(w1.wait_for_output("creating the session failed", 60s), w1.report());
  lt::child ps2(replica(), cf.task("ps", 0));
  lt::child w0(replica(), args(cf.task("worker", 0), common(dir, "300")));
  expect_exit(w0, 0, 300s);
  expect_exit(w1, 0, 60s);
  expect_exit(ps2, 0, 60s);
  CHECK(final_global_step(w0.output()) >= 300);
}

TEST_CASE("sync replicas: a worker that loses the chief exits with a clear error, not a hang" *
          lt::needs_examples()) {
  require_prerequisites();
  cluster_flags cf(1, 2);
  temp_dir dir;
  // The barrier timeout also bounds how long worker 1's first step may wait for the chief's
  // update loop to start: 3 s once tripped there while the CI machine was compiling.
  auto flags = [&](int task) {
    return args(cf.task("worker", task), common(dir, "100000"), "--sync_replicas",
                "--barrier_timeout_secs=10");
  };
  lt::child ps(replica(), cf.task("ps", 0));
  lt::child w0(replica(), flags(0));
  lt::child w1(replica(), flags(1));
  REQUIRE_MESSAGE(w1.wait_for_output("Worker 1: step 100 ", 120s), w1.report());
  w0.kill(); // SIGKILL: the chief and its update loop are gone
  expect_exit(w1, 1, 60s);
  INFO(w1.output());
  // Worker 1's gradient arrived and waits; the chief's (task 0) never will.
  CHECK(contains(w1.output(), "waited 10000 ms for the update of step "));
  CHECK(contains(w1.output(), "the gradients of 1 of the 2 replica(s) it aggregates arrived "
                              "(from /job:worker/task:1); not sent: /job:worker/task:0"));
}

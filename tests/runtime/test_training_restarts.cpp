// Distributed training that never gives up (issue #20): examples/mnist_replica's ps killed
// and restarted again and again, async and with synchronous replicas, a sync chief killed
// and restarted, and two ps of which one restarts with the chief. A CTest entry of its own
// (training_restarts) in test_training_processes.
#include "training_cluster.hpp"

using namespace loom::testing::training;

// -- Recovery that never gives up, and a restarted sync chief (issue #20) --------------------

namespace {

// How often the long recovery runs kill a task: `shortened` in ctest, `full` with
// LOOM_FULL_RECOVERY_RUNS=1 in the environment (docs/training.md gives the command).
int kills(int shortened, int full) {
  const char* e = std::getenv("LOOM_FULL_RECOVERY_RUNS");
  return e && std::string(e) == "1" ? full : shortened;
}

// Every match's first group, as an integer, in `text` from `from` on.
std::vector<long long> captured_from(const std::string& text, std::size_t from,
                                     const std::string& pattern) {
  return captured(text.substr(std::min(from, text.size())), pattern);
}

// Every checkpoint in `dir` reads back with each checksum holding.
void check_every_checkpoint_intact(const temp_dir& dir) {
  const auto files = loom::detail::checkpoint_files_in(dir.path.string());
  CHECK(!files.empty());
  for (const auto& f : files) {
    INFO(f);
    if (std::filesystem::exists(loom::tensor_bundle::index_path(f))) { // TF's format
      const loom::tensor_bundle::reader r(f);
      for (const auto* e : r.entries())
        CHECK_NOTHROW(r.read_tensor(e->key)); // each checked against its CRC-32C
    } else {
      CHECK(loom::checkpoint_reader(f).all_ok());
    }
  }
}

// Kills the ps task (SIGKILL) `n` times and starts it again at once on the same port, the
// k-th time once the chief's logged global step is an interval and a varied part of one past
// its last restore (so kills land anywhere in a checkpoint interval, and training advances
// between them by one to two intervals). Returns the steps each kill lost: the highest global
// step the chief had logged before it, less the step it restored.
std::vector<long long> kill_ps_repeatedly(const cluster_flags& cf, std::unique_ptr<lt::child>& ps,
                                          lt::child& chief, int n, long long interval) {
  std::vector<long long> lost;
  for (int k = 1; k <= n; ++k) {
    const auto deadline = std::chrono::steady_clock::now() + 180s;
    for (;;) {
      const std::string out = chief.output();
      const auto restored = captured(out, "restored [^\n]*model.ckpt-([0-9]+)");
      const long long from = restored.empty() ? 0 : restored.back();
      const auto r = out.rfind("restored ");
      long long logged = 0;
      for (long long g : captured_from(out, r == std::string::npos ? 0 : r, "global step ([0-9]+)"))
        logged = std::max(logged, g);
      if (logged >= from + interval + (37 * k) % (interval * 8 / 10)) // lost: at most 0.8 + lag
        break;
      REQUIRE_MESSAGE(chief.running(), "training ended before kill " << k << " of " << n
                                                                     << ": raise train_steps\n"
                                                                     << chief.report());
      REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, chief.report());
      std::this_thread::sleep_for(10ms);
    }
    ps->kill();
    const std::string before = chief.output();
    long long seen = 0;
    for (long long g : captured(before, "global step ([0-9]+)"))
      seen = std::max(seen, g);
    ps = std::make_unique<lt::child>(replica(), cf.task("ps", 0));
    const auto restored_before = captured(before, "restored [^\n]*model.ckpt-([0-9]+)").size();
    REQUIRE_MESSAGE(chief.wait_for_output("recreating the session", 60s), chief.report());
    for (;;) {
      const auto restored = captured(chief.output(), "restored [^\n]*model.ckpt-([0-9]+)");
      if (restored.size() > restored_before) {
        lost.push_back(seen - restored.back());
        break;
      }
      REQUIRE_MESSAGE(chief.running(), chief.report());
      REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline + 60s, chief.report());
      std::this_thread::sleep_for(20ms);
    }
  }
  return lost;
}

void report_kills(const char* run, const std::vector<long long>& lost, long long interval,
                  std::chrono::steady_clock::time_point began) {
  long long most = 0;
  std::string each;
  for (long long l : lost) {
    most = std::max(most, l);
    each += (each.empty() ? "" : " ") + std::to_string(l);
  }
  MESSAGE(std::string(run)
          << ": " << lost.size() << " ps kills survived in "
          << std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count()
          << " s; steps lost per kill (as last logged): " << each << " (at most " << most
          << ", the checkpoint interval " << interval << ")");
  for (long long l : lost)
    CHECK(l <= interval);
}

} // namespace

// 1 ps + 2 workers training while the ps is SIGKILLed and restarted on its port n times:
// training finishes, every process exits 0, each kill loses at most a checkpoint interval,
// and every checkpoint is intact.
static void train_through_ps_kills(const char* mode, int n, std::vector<std::string> extra_flags) {
  constexpr long long interval = 100;
  cluster_flags cf(1, 2);
  temp_dir dir;
  const auto began = std::chrono::steady_clock::now();
  extra_flags.insert(extra_flags.end(),
                     {"--save_checkpoint_steps=100", "--save_checkpoint_secs=0", "--log_every=20"});
  auto flags = [&](int task) {
    return args(args(cf.task("worker", task), common(dir, std::to_string((2 * n + 4) * interval))),
                extra_flags);
  };
  auto ps = std::make_unique<lt::child>(replica(), cf.task("ps", 0));
  lt::child w0(replica(), flags(0));
  lt::child w1(replica(), flags(1));
  const auto lost = kill_ps_repeatedly(cf, ps, w0, n, interval);
  expect_exit(w0, 0, 300s);
  expect_exit(w1, 0, 60s);
  expect_exit(*ps, 0, 60s);
  report_kills(mode, lost, interval, began);
  CHECK(final_global_step(w0.output()) >= (2 * n + 4) * interval);
  check_every_checkpoint_intact(dir);
}

TEST_CASE("async, 1 ps + 2 workers: the ps killed and restarted again and again, training "
          "finishes, each kill loses at most a checkpoint interval, every checkpoint is intact" *
          lt::needs_examples()) {
  require_prerequisites();
  train_through_ps_kills("async", kills(3, 20), {});
}

TEST_CASE("sync replicas, 1 ps + 2 workers: the ps killed and restarted again and again, "
          "training finishes, each kill loses at most a checkpoint interval" *
          lt::needs_examples()) {
  require_prerequisites();
  train_through_ps_kills("sync", kills(2, 10), {"--sync_replicas"});
}

TEST_CASE("sync replicas: the chief killed and restarted with the same flags joins the variables "
          "the ps holds, and every worker goes on to the end" *
          lt::needs_examples()) {
  require_prerequisites();
  cluster_flags cf(1, 2);
  temp_dir dir;
  auto flags = [&](int task) {
    return args(cf.task("worker", task), common(dir, "600"), "--sync_replicas",
                "--save_checkpoint_steps=100", "--save_checkpoint_secs=0", "--log_every=20");
  };
  lt::child ps(replica(), cf.task("ps", 0));
  std::optional<lt::child> w0(std::in_place, replica(), flags(0));
  lt::child w1(replica(), flags(1));
  // Mid-interval: the ps's global step is past the last checkpoint.
  REQUIRE_MESSAGE(w1.wait_for_output("Worker 1: step 160 ", 120s), w1.report());
  w0->kill();
  w0.emplace(replica(), flags(0));
  expect_exit(*w0, 0, 300s);
  expect_exit(w1, 0, 60s);
  expect_exit(ps, 0, 60s);
  INFO(w0->output());
  INFO(w1.output());
  CHECK(contains(w0->output(), "joining them, not restoring or initializing"));
  CHECK_FALSE(contains(w0->output(), "restored "));
  // Worker 1's wait at the barrier began before the new chief's reset: it started again.
  CHECK(contains(w1.output(), "the chief reset the update barrier"));
  CHECK(final_global_step(w0->output()) >= 600);
}

TEST_CASE("sync replicas, 2 ps: the chief and the ps of half the variables killed and restarted; "
          "the chief restores a checkpoint older than the other ps's step, resets the "
          "accumulators and the barrier to it, and every worker goes on to the end" *
          lt::needs_examples()) {
  require_prerequisites();
  cluster_flags cf(2, 2);
  temp_dir dir;
  // A barrier left at ps 0's step would stall every worker: let that fail in 30 s, not 120.
  auto flags = [&](int task) {
    return args(cf.task("worker", task), common(dir, "600"), "--sync_replicas",
                "--save_checkpoint_steps=100", "--save_checkpoint_secs=0", "--log_every=20",
                "--barrier_timeout_secs=30");
  };
  lt::child ps0(replica(), cf.task("ps", 0));
  std::optional<lt::child> ps1(std::in_place, replica(), cf.task("ps", 1));
  std::optional<lt::child> w0(std::in_place, replica(), flags(0));
  lt::child w1(replica(), flags(1));
  REQUIRE_MESSAGE(w1.wait_for_output("Worker 1: step 160 ", 120s), w1.report());
  w0->kill();
  ps1->kill();
  long long seen = 0;
  for (long long g : captured(w1.output(), "global step ([0-9]+)"))
    seen = std::max(seen, g);
  ps1.emplace(replica(), cf.task("ps", 1));
  w0.emplace(replica(), flags(0));
  expect_exit(*w0, 0, 300s);
  expect_exit(w1, 0, 60s);
  expect_exit(ps0, 0, 60s);
  expect_exit(*ps1, 0, 60s);
  INFO(w0->output());
  INFO(w1.output());
  const auto restored = captured(w0->output(), "restored [^\n]*model.ckpt-([0-9]+)");
  REQUIRE(restored.size() == 1);
  CHECK(restored[0] < seen); // older than what ps 0 held
  CHECK(final_global_step(w0->output()) >= 600);
}

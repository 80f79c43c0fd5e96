// Liveness in real processes (#21 item 3): examples/mnist_replica's ps frozen with SIGSTOP
// (its sockets stay open, its kernel still acknowledges, nothing answers) while the worker
// trains. The worker's step fails with unavailable naming the ps within the heartbeat
// timeout (LOOM_HEARTBEAT_TIMEOUT=1 here; 6 s by default), not at the 5-minute call
// deadline; after SIGCONT its monitored session recovers and the run finishes.
#include <support/examples.hpp>
#include <support/launchers.hpp>
#include <support/process.hpp>

#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace lt = loom::testing;
using namespace std::chrono_literals;

TEST_CASE("liveness: a ps frozen with SIGSTOP fails the worker's step with unavailable naming "
          "it; after SIGCONT the monitored session recovers" *
          lt::needs_examples()) {
  const std::string replica = lt::example("mnist_replica");
  const lt::cluster_flags cluster(1, 1);
  const lt::temp_dir dir("loom-liveness-");
  auto env = lt::without_launcher_environment();
  env["LOOM_HEARTBEAT_TIMEOUT"] = "1";
  const auto args = [&](const std::string& job) {
    auto a = cluster.task(job, 0);
    for (const std::string& f :
         {std::string("--train_steps=3000"), std::string("--log_every=500"),
          std::string("--save_summaries_steps=0"), "--checkpoint_dir=" + dir.path().string(),
          std::string("--shutdown_wait_secs=30")})
      a.push_back(f);
    return a;
  };
  lt::child ps(replica, args("ps"), env);
  lt::child worker(replica, args("worker"), env);
  REQUIRE_MESSAGE(worker.wait_for_output("Training begins", 120s), worker.report());
  std::this_thread::sleep_for(300ms);

  REQUIRE(::kill(ps.pid(), SIGSTOP) == 0);
  const auto frozen = std::chrono::steady_clock::now();
  const bool noticed = worker.wait_for_output("recreating the session (recovery 1)", 60s);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - frozen).count();
  REQUIRE(::kill(ps.pid(), SIGCONT) == 0);
  REQUIRE_MESSAGE(noticed, worker.report());
  MESSAGE("the worker's step failed " << secs << " s after the ps froze (heartbeat timeout 1 s)");
  const std::string ps_task = "ps task 0 at " + cluster.address("ps", 0);
  const std::string out = worker.output();
  const auto at = out.find("Worker 0: step failed (unavailable: ");
  REQUIRE_MESSAGE(at != std::string::npos, worker.report());
  const std::string line = out.substr(at, out.find('\n', at) - at);
  CHECK_MESSAGE(
      line.find(ps_task + " stopped answering: no heartbeat for 1 s") != std::string::npos, line);

  lt::expect_exit(worker, 0, 180s);
  CHECK_MESSAGE(worker.output().find("Worker 0: test accuracy = ") != std::string::npos,
                worker.report());
  lt::expect_exit(ps, 0, 60s);
}

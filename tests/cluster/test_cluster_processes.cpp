// The cluster resolver in real processes: examples/mnist_replica's ps and two workers
// started as srun would start them, with Slurm's variables and no cluster flags, on
// loopback ports the OS chose.
#include <support/examples.hpp>
#include <support/process.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace lt = loom::testing;
using namespace std::chrono_literals;

TEST_CASE("mnist_replica under srun: 1 ps + 2 workers from Slurm's variables and --jobs alone" *
          lt::needs_examples()) {
  const std::string replica = lt::example("mnist_replica");
  const std::uint16_t port_base = lt::free_port_run(3);
  const auto dir =
      std::filesystem::temp_directory_path() / ("loom-cluster-slurm-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  struct remove_dir {
    std::filesystem::path p;
    ~remove_dir() {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
  } cleanup{dir};

  // What srun -n 3 on one node exports (the node's name is its address here), and nothing
  // of the other sources.
  const auto slurm_env = [&](int rank) {
    return lt::env_overrides{{"SLURM_PROCID", std::to_string(rank)},
                             {"SLURM_LOCALID", std::to_string(rank)},
                             {"SLURM_NTASKS", "3"},
                             {"SLURM_STEP_NODELIST", "127.0.0.1"},
                             {"SLURM_STEP_TASKS_PER_NODE", "3(x1)"},
                             {"SLURMD_NODENAME", "127.0.0.1"},
                             {"TF_CONFIG", std::nullopt},
                             {"OMPI_COMM_WORLD_RANK", std::nullopt},
                             {"PMI_RANK", std::nullopt}};
  };
  // The same command line for every task, as srun gives it.
  const std::vector<std::string> args{"--jobs=ps:1,worker:2",
                                      "--port_base=" + std::to_string(port_base),
                                      "--train_steps=300",
                                      "--log_every=100",
                                      "--checkpoint_dir=" + dir.string(),
                                      "--shutdown_wait_secs=30"};
  lt::child ps(replica, args, slurm_env(0));
  lt::child w0(replica, args, slurm_env(1));
  lt::child w1(replica, args, slurm_env(2));
  lt::expect_exit(w0, 0, 300s);
  lt::expect_exit(w1, 0, 60s);
  lt::expect_exit(ps, 0, 60s);
  // Rank 0 is the ps, ranks 1 and 2 workers 0 and 1 (the chief is worker 0).
  CHECK_MESSAGE(ps.output().find("job name = ps\ntask index = 0\n") != std::string::npos,
                ps.report());
  CHECK_MESSAGE(w0.output().find("job name = worker\ntask index = 0\n") != std::string::npos,
                w0.report());
  CHECK_MESSAGE(w0.output().find("Worker 0: Initializing session...") != std::string::npos,
                w0.report());
  CHECK_MESSAGE(w1.output().find("job name = worker\ntask index = 1\n") != std::string::npos,
                w1.report());
  CHECK_MESSAGE(w1.output().find("Worker 1: test accuracy = ") != std::string::npos, w1.report());
}

// A real MPI launcher (#21 item 6): Debian's Open MPI `mpirun -np 3` starts
// examples/mnist_replica's 1 ps + 2 workers on this machine with no cluster flags: each
// task learns its rank from Open MPI's variables (OMPI_COMM_WORLD_RANK, _SIZE,
// _LOCAL_RANK), the hosts from --hosts (MPI does not export them) and the jobs from
// --jobs. mnist_replica does not link MPI; mpirun only launches it. As root, mpirun
// needs --allow-run-as-root; --oversubscribe places 3 ranks on fewer cores.
//
// Every process of the run carries the run's directory in its command line and must be
// gone at the end. Without mpirun the case prints "skipped: " and why, which CTest
// reports as skipped (SKIP_REGULAR_EXPRESSION).
#include <support/examples.hpp>
#include <support/launchers.hpp>
#include <support/process.hpp>
#include <support/skip.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

namespace lt = loom::testing;
using namespace std::chrono_literals;

} // namespace

TEST_CASE("mpirun -np 3: mnist_replica's 1 ps + 2 workers from Open MPI's ranks, --jobs and "
          "--hosts" *
          lt::needs_examples()) {
  const std::string replica = lt::example("mnist_replica");
  const std::string mpirun = lt::find_program("mpirun");
  if (mpirun.empty())
    return lt::skip_case("mpirun is not installed (Debian's openmpi-bin; tools/setup.sh "
                         "installs it)");
  const lt::temp_dir dir("loom-mpirun-");
  lt::reaper reaper(dir.path().string());
  std::vector<lt::marked_process> left;
  {
    const std::uint16_t port_base = lt::free_port_run(3);
    std::vector<std::string> args{"-np", "3", "--oversubscribe", "--tag-output"};
    if (::geteuid() == 0)
      args.push_back("--allow-run-as-root");
    args.insert(args.end(),
                {replica, "--jobs=ps:1,worker:2", "--hosts=127.0.0.1:3",
                 "--port_base=" + std::to_string(port_base), "--train_steps=300", "--log_every=100",
                 "--checkpoint_dir=" + (dir / "ckpt"), "--shutdown_wait_secs=30"});
    lt::child run(mpirun, args, lt::without_launcher_environment());
    const auto st = run.wait(240s);
    const std::string out = run.output();
    std::cout << "mpirun's output:\n" << out << std::flush;
    INFO(run.report());
    REQUIRE_MESSAGE(st.has_value(), "mpirun did not exit within 240 s");
    CHECK(st->success());
    // --tag-output labels each line [job,rank]<stdout>: rank 0 is the ps, ranks 1 and 2
    // workers 0 (the chief) and 1.
    const auto tag = [](int rank) { return "[1," + std::to_string(rank) + "]<stdout>:"; };
    for (const auto& [rank, job, index] :
         {std::tuple{0, "ps", 0}, std::tuple{1, "worker", 0}, std::tuple{2, "worker", 1}}) {
      CHECK(lt::has_line_starting(out, tag(rank) + "job name = " + job + "\n"));
      CHECK(lt::has_line_starting(out, tag(rank) + "task index = " + std::to_string(index) + "\n"));
    }
    for (int rank : {1, 2}) {
      const std::string worker = "Worker " + std::to_string(rank - 1);
      const auto acc = lt::accuracy_after(out, tag(rank) + worker + ": test accuracy = ");
      REQUIRE_MESSAGE(acc.has_value(), worker << " printed no test accuracy");
      CHECK(*acc > 0.5); // 300 async steps of the seed's MLP: about 0.8
    }
    left = reaper.reap();
  }
  CHECK_MESSAGE(left.empty(), "processes of the run were still running after mpirun exited "
                              "(now killed):\n"
                                  << lt::describe(left));
}

// A real scheduler (#21 item 6): Debian's Slurm on this machine, one node, its daemons
// started by the test from a config it writes into a temporary directory (munged with
// its own key and socket, slurmctld, slurmd; ProctrackType=proctrack/linuxproc and
// TaskPlugin=task/none, so no cgroups are needed), then examples/mnist_replica through
// `srun -n 3 -O` (3 tasks on however few cores, overcommitted) with no cluster flags:
// each task learns its task and the cluster from Slurm's variables alone, with
// --jobs=ps:1,worker:2 and a --port_base, as TF's SlurmClusterResolver.
//
// The daemons are stopped by their PIDs (SIGTERM, then SIGKILL), and every process of
// the run (the tasks, slurmstepd) is found by the run's directory and must be gone.
// Where the daemons cannot start (Slurm or munge not installed, not root, a daemon that
// exits), the case prints "skipped: " and the daemon's own error, which CTest reports
// as skipped (SKIP_REGULAR_EXPRESSION).
#include <support/examples.hpp>
#include <support/launchers.hpp>
#include <support/process.hpp>
#include <support/skip.hpp>

#include <doctest/doctest.h>

#include <netdb.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace {

namespace lt = loom::testing;
using namespace std::chrono_literals;

// munged, slurmctld and slurmd for one test, each a child of the test, in the
// foreground (-F, -D) so that their errors are in their output.
class single_node_slurm {
public:
  explicit single_node_slurm(const lt::temp_dir& dir) : dir_(dir) {}
  single_node_slurm(const single_node_slurm&) = delete;
  single_node_slurm& operator=(const single_node_slurm&) = delete;
  ~single_node_slurm() { stop(); }

  // The environment every Slurm command of this cluster needs.
  lt::env_overrides environment() const {
    auto env = lt::without_launcher_environment();
    env["SLURM_CONF"] = conf_;
    return env;
  }

  // The node's name (this machine's host name, as slurmd registers it).
  const std::string& node() const noexcept { return node_; }

  // Starts the daemons and waits until the node is idle; "" then, else why not.
  std::string start() {
    for (const char* p : {"munged", "slurmctld", "slurmd", "srun", "sinfo"})
      if (lt::find_program(p).empty())
        return std::string(p) +
               " is not installed (Debian's munge, slurmctld, slurmd and slurm-client; "
               "tools/setup.sh installs them)";
    if (::geteuid() != 0)
      return "slurmd must run as root to start jobs (this test runs as uid " +
             std::to_string(::geteuid()) + ")";
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0')
      return "gethostname failed";
    node_ = host;
    node_ = node_.substr(0, node_.find('.')); // slurmd registers the short name
    // The tasks' addresses are <node>:<port> (SLURM_STEP_NODELIST names the node).
    addrinfo* found = nullptr;
    if (::getaddrinfo(node_.c_str(), nullptr, nullptr, &found) != 0)
      return "this host's name \"" + node_ +
             "\" does not resolve, and the tasks' addresses are <name>:<port> (add it to "
             "/etc/hosts)";
    ::freeaddrinfo(found);

    if (const std::string why = start_munged(); !why.empty())
      return why;
    write_config();
    const auto env = environment();
    slurmctld_.emplace(lt::find_program("slurmctld"),
                       std::vector<std::string>{"-D", "-i", "-f", conf_}, env);
    slurmd_.emplace(lt::find_program("slurmd"),
                    std::vector<std::string>{"-D", "-f", conf_, "-N", node_}, env);
    // The node turns idle once slurmd has registered with slurmctld.
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    std::string last;
    while (std::chrono::steady_clock::now() < deadline) {
      for (auto* d : {&*slurmctld_, &*slurmd_})
        if (!d->running())
          return "a daemon exited: " + d->report();
      lt::child sinfo(lt::find_program("sinfo"), {"-h", "-N", "-o", "%T"}, env);
      sinfo.wait(10s);
      last = sinfo.output();
      if (last.rfind("idle", 0) == 0)
        return "";
      std::this_thread::sleep_for(200ms);
    }
    return "the node did not turn idle within 30 s (sinfo: " + last + ")\nslurmctld:\n" +
           lt::last_lines(slurmctld_->output(), 15) + "slurmd:\n" +
           lt::last_lines(slurmd_->output(), 15);
  }

  // Stops slurmd, slurmctld and munged by their PIDs, in that order.
  void stop() {
    for (auto* d : {&slurmd_, &slurmctld_, &munged_})
      if (*d)
        lt::stop_daemon(**d);
  }

  std::string logs() const {
    std::string out;
    if (slurmctld_)
      out += "slurmctld:\n" + lt::last_lines(slurmctld_->output(), 30);
    if (slurmd_)
      out += "slurmd:\n" + lt::last_lines(slurmd_->output(), 30);
    return out;
  }

private:
  // munged with a key of its own and a socket in the run's directory: the test neither
  // needs nor touches a munged the machine may run.
  std::string start_munged() {
    const std::string key = dir_ / "munge.key";
    {
      std::ofstream out(key, std::ios::binary);
      std::random_device rd;
      for (int i = 0; i < 1024; ++i)
        out.put(static_cast<char>(rd() & 0xff));
    }
    std::filesystem::permissions(key, std::filesystem::perms::owner_read,
                                 std::filesystem::perm_options::replace);
    socket_ = dir_ / "munge.socket";
    munged_.emplace(lt::find_program("munged"),
                    std::vector<std::string>{"-F", "--force", "--key-file=" + key,
                                             "--socket=" + socket_,
                                             "--pid-file=" + (dir_ / "munged.pid"),
                                             "--log-file=" + (dir_ / "munged.log"),
                                             "--seed-file=" + (dir_ / "munged.seed")},
                    lt::without_launcher_environment());
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!std::filesystem::exists(socket_)) {
      if (!munged_->running() || std::chrono::steady_clock::now() > deadline) {
        std::ifstream log(dir_ / "munged.log");
        const std::string text((std::istreambuf_iterator<char>(log)),
                               std::istreambuf_iterator<char>());
        return "munged did not start: " + munged_->report() + "\nmunged.log:\n" +
               lt::last_lines(text, 10);
      }
      std::this_thread::sleep_for(50ms);
    }
    return "";
  }

  void write_config() {
    const auto ports = lt::free_ports(2);
    conf_ = dir_ / "slurm.conf";
    for (const char* d : {"state", "spool"})
      std::filesystem::create_directories(dir_.path() / d);
    const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
    std::ofstream out(conf_);
    out << "# Written by tests/cluster/test_slurm.cpp for one run.\n"
        << "ClusterName=loomtest\n"
        << "SlurmctldHost=" << node_ << "(127.0.0.1)\n"
        << "SlurmctldPort=" << ports[0] << "\n"
        << "SlurmdPort=" << ports[1] << "\n"
        << "SlurmUser=root\nSlurmdUser=root\n"
        << "AuthType=auth/munge\nCredType=cred/munge\n"
        << "AuthInfo=socket=" << socket_ << "\n"
        << "StateSaveLocation=" << (dir_ / "state") << "\n"
        << "SlurmdSpoolDir=" << (dir_ / "spool") << "\n"
        << "SlurmctldPidFile=" << (dir_ / "slurmctld.pid") << "\n"
        << "SlurmdPidFile=" << (dir_ / "slurmd.pid") << "\n"
        << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
        << "JobAcctGatherType=jobacct_gather/none\n"
        << "AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n"
        << "SwitchType=switch/none\nMpiDefault=none\nMailProg=/bin/true\n"
        << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
        << "ReturnToService=2\n"
        << "NodeName=" << node_ << " NodeAddr=127.0.0.1 CPUs=" << cpus << " State=UNKNOWN\n"
        << "PartitionName=loomtest Nodes=" << node_ << " Default=YES MaxTime=10 State=UP\n";
  }

  const lt::temp_dir& dir_;
  std::string node_;
  std::string conf_;
  std::string socket_;
  std::optional<lt::child> munged_, slurmctld_, slurmd_;
};

} // namespace

TEST_CASE("srun -n 3 -O on a single-node Slurm: mnist_replica's 1 ps + 2 workers from "
          "Slurm's variables and --jobs alone" *
          lt::needs_examples()) {
  const std::string replica = lt::example("mnist_replica");
  const lt::temp_dir dir("loom-slurm-");
  lt::reaper reaper(dir.path().string());
  std::vector<lt::marked_process> left;
  {
    single_node_slurm slurm(dir);
    if (const std::string why = slurm.start(); !why.empty())
      return lt::skip_case("Slurm's daemons could not start: " + why);
    const std::uint16_t port_base = lt::free_port_run(3);
    // The same command for every task, as srun gives it; -l labels each line with the
    // task's rank.
    lt::child srun(lt::find_program("srun"),
                   {"-n", "3", "-O", "-l", "--kill-on-bad-exit=1", "--time=5", "-J", "mnist",
                    replica, "--jobs=ps:1,worker:2", "--port_base=" + std::to_string(port_base),
                    "--train_steps=300", "--log_every=100", "--checkpoint_dir=" + (dir / "ckpt"),
                    "--shutdown_wait_secs=30"},
                   slurm.environment());
    const auto st = srun.wait(240s);
    const std::string out = srun.output();
    std::cout << "srun's output:\n" << out << std::flush;
    INFO(srun.report() << "\n" << slurm.logs());
    REQUIRE_MESSAGE(st.has_value(), "srun did not exit within 240 s");
    CHECK(st->success());
    // Rank 0 is the ps, ranks 1 and 2 workers 0 (the chief) and 1, each on the node
    // Slurm named.
    for (const auto& [rank, job, index] :
         {std::tuple{0, "ps", 0}, std::tuple{1, "worker", 0}, std::tuple{2, "worker", 1}}) {
      const std::string label = std::to_string(rank) + ": ";
      CHECK(lt::has_line_starting(out, label + "job name = " + job + "\n"));
      CHECK(lt::has_line_starting(out, label + "task index = " + std::to_string(index) + "\n"));
    }
    CHECK(lt::has_line_starting(out, "1: Worker 0: Initializing session..."));
    CHECK(lt::has_line_starting(out, "2: Worker 1: Waiting for session to be initialized..."));
    for (const std::string worker : {"1: Worker 0", "2: Worker 1"}) {
      const auto acc = lt::accuracy_after(out, worker + ": test accuracy = ");
      REQUIRE_MESSAGE(acc.has_value(), worker << " printed no test accuracy");
      CHECK(*acc > 0.5); // 300 async steps of the seed's MLP: about 0.8
    }
    slurm.stop();
    left = reaper.reap();
  }
  CHECK_MESSAGE(left.empty(), "processes of the run were still running after the daemons "
                              "stopped (now killed):\n"
                                  << lt::describe(left));
}

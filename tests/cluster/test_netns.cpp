// Tasks on real hosts (#21 item 5): each task of examples/mnist_replica runs in a network
// namespace of its own, a host with one interface (eth0) and one address from the
// documentation range 192.0.2.0/24 (RFC 5737), its cable a veth pair to a bridge that
// sits in one more namespace, the switch. Nothing is added to this machine's own network
// namespace: the tasks can reach each other and no other address.
//
// - netns (CTest): the ps and two workers with a cluster token (LOOM_CLUSTER_TOKEN_FILE);
//   a worker without the token refuses to start, one with a wrong token is refused by the
//   ps; worker 1's cable is pulled for 10 s in the middle of training (its port on the
//   switch down) and the run must finish: worker 1 resumes, or fails with a clear error
//   while the rest finishes; and the ps's cable pulled with default options: each worker's
//   step fails with unavailable naming the ps ("stopped answering: no heartbeat for 6 s"),
//   the seconds from the pull printed (#21's bar: 10 s), and once the cable is back the
//   workers' monitored sessions recover and the run finishes.
// - netns_netem (CTest, `--no-skip -tc='*tc netem*'`): training through tc netem's 2 ms
//   delay and 1 % loss on every host's eth0. A kernel without sch_netem is a skip, with
//   tc's error.
// - the figures (by hand: LOOM_NETNS_FIGURES=1 test_netns -tc='*figures*'): full runs
//   with no netem, 2 ms delay, and 2 ms + 1 % loss (examples/s, test accuracy);
//   LOOM_NETNS_TRAIN_STEPS (default 12000) sizes them.
//
// Needs root and iproute2 (ip, tc); where a namespace cannot be made the case prints
// "skipped: " and ip's error, which CTest reports as skipped. The namespaces carry this
// process's PID in their names and are deleted when the case ends, passed or failed; a
// run that was killed leaves its namespaces to the next run, which deletes those of dead
// PIDs.
#include <support/examples.hpp>
#include <support/launchers.hpp>
#include <support/process.hpp>
#include <support/skip.hpp>

#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace {

namespace lt = loom::testing;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

// Runs a command to its end; "" when it succeeded, else the command and its output.
std::string run_command(const std::string& program, const std::vector<std::string>& args) {
  lt::child c(program, args);
  const auto st = c.wait(20s);
  if (st && st->success())
    return "";
  return c.report();
}

// Three hosts (namespaces <name>-h0..h2, 192.0.2.1..3 on their eth0) and a switch
// (<name>-sw, a bridge br0 with ports p0..p2). Deleted by the destructor.
class netns_lab {
public:
  static constexpr int hosts = 3;

  netns_lab() {
    static int made = 0;
    name_ = std::string(prefix) + std::to_string(::getpid()) + "-" + std::to_string(made++);
  }
  netns_lab(const netns_lab&) = delete;
  netns_lab& operator=(const netns_lab&) = delete;
  ~netns_lab() {
    for (auto it = made_.rbegin(); it != made_.rend(); ++it)
      run_command(ip_, {"netns", "del", *it});
  }

  // Makes the namespaces and links; "" then, else why not (ip's error).
  std::string create() {
    ip_ = lt::find_program("ip");
    tc_ = lt::find_program("tc");
    if (ip_.empty() || tc_.empty())
      return "ip or tc is not installed (Debian's iproute2; tools/setup.sh installs it)";
    if (::geteuid() != 0)
      return "network namespaces need root (this test runs as uid " + std::to_string(::geteuid()) +
             ")";
    delete_stale();
    if (auto why = add_namespace(switch_ns()); !why.empty())
      return why;
    if (auto why = ip({"-n", switch_ns(), "link", "add", "br0", "type", "bridge"}); !why.empty())
      return why;
    if (auto why = ip({"-n", switch_ns(), "link", "set", "br0", "up"}); !why.empty())
      return why;
    for (int i = 0; i < hosts; ++i) {
      const std::string h = host(i), port = "p" + std::to_string(i);
      for (const auto& why :
           {add_namespace(h),
            ip({"-n", switch_ns(), "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", h}),
            ip({"-n", h, "addr", "add", address(i) + "/24", "dev", "eth0"}),
            ip({"-n", h, "link", "set", "lo", "up"}), ip({"-n", h, "link", "set", "eth0", "up"}),
            ip({"-n", switch_ns(), "link", "set", port, "master", "br0", "up"})})
        if (!why.empty())
          return why;
    }
    return "";
  }

  std::string host(int i) const { return name_ + "-h" + std::to_string(i); }
  static std::string address(int i) { return "192.0.2." + std::to_string(i + 1); }

  // Pulls (or plugs back) host i's cable: its port on the switch down (up). The host's
  // eth0 keeps its address and routes, as a host whose cable is pulled.
  void set_cable(int i, bool plugged) {
    const std::string why =
        ip({"-n", switch_ns(), "link", "set", "p" + std::to_string(i), plugged ? "up" : "down"});
    REQUIRE_MESSAGE(why.empty(), why);
  }

  // tc netem `spec` (as "delay 2ms loss 1%") on every host's eth0; "" when the kernel
  // took it, else tc's error.
  std::string netem(const std::string& spec) {
    for (int i = 0; i < hosts; ++i) {
      std::vector<std::string> args{"-n",  host(i), "qdisc", "replace",
                                    "dev", "eth0",  "root",  "netem"};
      std::istringstream words(spec);
      for (std::string w; words >> w;)
        args.push_back(w);
      if (auto why = run_command(tc_, args); !why.empty())
        return why;
    }
    return "";
  }

  // The command line that runs `program args` in host i (ip netns exec execs it: the
  // child's PID is the program's).
  std::vector<std::string> in_host(int i, const std::string& program,
                                   std::vector<std::string> args) const {
    std::vector<std::string> out{"netns", "exec", host(i), program};
    out.insert(out.end(), args.begin(), args.end());
    return out;
  }
  const std::string& ip_program() const noexcept { return ip_; }

private:
  static constexpr const char* prefix = "loomtest-";

  std::string switch_ns() const { return name_ + "-sw"; }
  std::string ip(const std::vector<std::string>& args) const { return run_command(ip_, args); }

  std::string add_namespace(const std::string& ns) {
    if (auto why = ip({"netns", "add", ns}); !why.empty())
      return why;
    made_.push_back(ns);
    return "";
  }

  // Namespaces of earlier runs whose process is gone (killed before its destructor ran).
  void delete_stale() const {
    lt::child list(ip_, {"netns", "list"});
    list.wait(10s);
    std::istringstream lines(list.output());
    for (std::string line; std::getline(lines, line);) {
      const std::string ns = line.substr(0, line.find(' '));
      if (ns.rfind(prefix, 0) != 0)
        continue;
      const std::string pid =
          ns.substr(std::string_view(prefix).size(), ns.find('-', std::string_view(prefix).size()) -
                                                         std::string_view(prefix).size());
      if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos)
        continue;
      if (::kill(static_cast<pid_t>(std::stol(pid)), 0) != 0 && errno == ESRCH)
        run_command(ip_, {"netns", "del", ns});
    }
  }

  std::string name_;
  std::string ip_, tc_;
  std::vector<std::string> made_;
};

// mnist_replica's tasks on the lab's hosts: the ps on host 0, worker i on host i + 1,
// every task given the cluster by flags (as by hand on real hosts) and the token file.
class replica_tasks {
public:
  replica_tasks(const netns_lab& lab, const lt::temp_dir& dir)
      : lab_(lab), dir_(dir), replica_(lt::example("mnist_replica")) {
    token_file_ = dir / "token";
    std::random_device rd;
    std::ofstream out(token_file_);
    for (int i = 0; i < 4; ++i)
      out << std::hex << rd();
    out.close();
    std::filesystem::permissions(token_file_, std::filesystem::perms::owner_read,
                                 std::filesystem::perm_options::replace);
  }

  // The environment of a task that has the token.
  lt::env_overrides with_token() const {
    auto env = lt::without_launcher_environment();
    env["LOOM_CLUSTER_TOKEN_FILE"] = token_file_;
    return env;
  }

  lt::child start(const std::string& job, int index, const lt::env_overrides& env,
                  std::vector<std::string> extra = {}) const {
    const int host = job == "ps" ? 0 : index + 1;
    std::vector<std::string> args{"--ps_hosts=" + netns_lab::address(0) + ":2222",
                                  "--worker_hosts=" + netns_lab::address(1) + ":2222," +
                                      netns_lab::address(2) + ":2222",
                                  "--job_name=" + job,
                                  "--task_index=" + std::to_string(index),
                                  "--checkpoint_dir=" + (dir_ / "ckpt"),
                                  "--save_summaries_steps=0",
                                  "--log_every=100",
                                  "--shutdown_wait_secs=60"};
    args.insert(args.end(), extra.begin(), extra.end());
    return lt::child(lab_.ip_program(), lab_.in_host(host, replica_, args), env);
  }

private:
  const netns_lab& lab_;
  const lt::temp_dir& dir_;
  std::string replica_;
  std::string token_file_;
};

std::optional<double> number_after(const std::string& text, const std::string& words) {
  const auto at = text.find(words);
  if (at == std::string::npos)
    return std::nullopt;
  return std::strtod(text.c_str() + at + words.size(), nullptr);
}

// A worker's examples/s, from "Training elapsed time: 12.3 s (4567 examples/s on this worker)".
std::optional<double> examples_per_sec(const std::string& text) {
  const auto at = text.find(" examples/s on this worker");
  const auto open = at == std::string::npos ? at : text.rfind('(', at);
  if (open == std::string::npos)
    return std::nullopt;
  return std::strtod(text.c_str() + open + 1, nullptr);
}

// A task's error line ("mnist_replica: ..."), or its last lines.
std::string error_line(const std::string& output) {
  const auto at = output.find("mnist_replica: ");
  if (at == std::string::npos)
    return lt::last_lines(output, 3);
  return output.substr(at, output.find('\n', at) - at);
}

// One training run of 1 ps + 2 workers in the lab; the workers' outputs after they exit.
struct run_result {
  double seconds = 0;
  std::string ps, w0, w1;
};

run_result train(const netns_lab& lab, const lt::temp_dir& dir, std::vector<std::string> extra,
                 std::chrono::seconds limit) {
  replica_tasks tasks(lab, dir);
  const auto env = tasks.with_token();
  const auto begin = clock_type::now();
  lt::child ps = tasks.start("ps", 0, env);
  lt::child w0 = tasks.start("worker", 0, env, extra);
  lt::child w1 = tasks.start("worker", 1, env, extra);
  lt::expect_exit(w0, 0, limit);
  lt::expect_exit(w1, 0, 60s);
  lt::expect_exit(ps, 0, 60s);
  return {std::chrono::duration<double>(clock_type::now() - begin).count(), ps.output(),
          w0.output(), w1.output()};
}

// The liveness case measures the default options: the test's own environment must not
// change them.
void env_must_not_set_liveness(const lt::env_overrides& env) {
  REQUIRE_MESSAGE(std::getenv("LOOM_HEARTBEAT_TIMEOUT") == nullptr,
                  "unset LOOM_HEARTBEAT_TIMEOUT: the case measures the default");
  REQUIRE(env.count("LOOM_HEARTBEAT_TIMEOUT") == 0);
}

std::int64_t env_int(const char* name, std::int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

} // namespace

TEST_CASE("network namespaces: the cluster token on real interfaces, and a worker's cable "
          "pulled for 10 s" *
          lt::needs_examples()) {
  netns_lab lab;
  if (const std::string why = lab.create(); !why.empty())
    return lt::skip_case("cannot make network namespaces: " + why);
  const lt::temp_dir dir("loom-netns-");
  replica_tasks tasks(lab, dir);
  lt::child ps = tasks.start("ps", 0, tasks.with_token());

  {
    // Without a token, a task refuses to serve on 192.0.2.3.
    lt::child no_token = tasks.start("worker", 1, lt::without_launcher_environment());
    lt::expect_exit(no_token, 1, 60s);
    CHECK_MESSAGE(no_token.output().find("LOOM_CLUSTER_TOKEN") != std::string::npos,
                  no_token.report());
    // With a wrong token it serves, and the ps refuses it.
    auto wrong = lt::without_launcher_environment();
    wrong["LOOM_CLUSTER_TOKEN"] = "not-the-cluster-token";
    lt::child wrong_token = tasks.start("worker", 1, wrong, {"--train_steps=300"});
    lt::expect_exit(wrong_token, 1, 120s);
    CHECK_MESSAGE(wrong_token.output().find("token") != std::string::npos, wrong_token.report());
    std::cout << "without the token: " << error_line(no_token.output())
              << "\nwith a wrong token: " << error_line(wrong_token.output()) << std::endl;
  }

  // Worker 1's cable is pulled for 10 s once it trains. With synchronous replicas no
  // update completes without its gradients, so the others cannot finish while it is cut
  // off (in async training the chief could end the run meanwhile, however fast it runs).
  const std::vector<std::string> extra{"--sync_replicas", "--train_steps=300"};
  lt::child w0 = tasks.start("worker", 0, tasks.with_token(), extra);
  lt::child w1 = tasks.start("worker", 1, tasks.with_token(), extra);
  REQUIRE_MESSAGE(w1.wait_for_output("Training begins", 120s), w1.report());
  lab.set_cable(2, false);
  std::this_thread::sleep_for(10s);
  lab.set_cable(2, true);
  const auto plugged = clock_type::now();
  lt::expect_exit(w0, 0, 120s);
  const auto st = w1.wait(60s);
  REQUIRE_MESSAGE(st.has_value(), "worker 1 neither resumed nor failed: " << w1.report());
  const double after = std::chrono::duration<double>(clock_type::now() - plugged).count();
  if (st->success()) {
    CHECK_MESSAGE(w1.output().find("Worker 1: test accuracy = ") != std::string::npos, w1.report());
    std::cout << "worker 1 resumed after its cable was plugged back; it exited 0 " << after
              << " s later" << std::endl;
  } else {
    // Failing is allowed, but with one clear line that says what.
    CHECK_MESSAGE(st->exited, w1.report());
    CHECK_MESSAGE(w1.output().find("mnist_replica: ") != std::string::npos, w1.report());
    std::cout << "worker 1 failed: " << error_line(w1.output()) << std::endl;
  }
  CHECK_MESSAGE(w0.output().find("Worker 0: test accuracy = ") != std::string::npos, w0.report());
  lt::expect_exit(ps, 0, 60s);
}

TEST_CASE("network namespaces: a ps's cable pulled: each worker's clear error within the "
          "liveness timeout (default options), and the run finishes once it is back" *
          lt::needs_examples()) {
  netns_lab lab;
  if (const std::string why = lab.create(); !why.empty())
    return lt::skip_case("cannot make network namespaces: " + why);
  const lt::temp_dir dir("loom-netns-psdown-");
  replica_tasks tasks(lab, dir);
  const auto env = tasks.with_token();
  env_must_not_set_liveness(env);
  const std::vector<std::string> extra{"--train_steps=3000"};
  lt::child ps = tasks.start("ps", 0, env);
  lt::child w0 = tasks.start("worker", 0, env, extra);
  lt::child w1 = tasks.start("worker", 1, env, extra);
  REQUIRE_MESSAGE(w0.wait_for_output("Training begins", 120s), w0.report());
  REQUIRE_MESSAGE(w1.wait_for_output("Training begins", 120s), w1.report());
  std::this_thread::sleep_for(1s);
  const std::size_t seen0 = w0.output().size(), seen1 = w1.output().size();
  lab.set_cable(0, false);
  const auto pulled = clock_type::now();
  // Each worker's first failed step after the pull: "Worker i: step failed (...)".
  std::optional<double> failed0, failed1;
  while ((!failed0 || !failed1) && clock_type::now() - pulled < 60s) {
    for (auto [w, seen, failed] :
         {std::tuple{&w0, seen0, &failed0}, std::tuple{&w1, seen1, &failed1}})
      if (!*failed && w->output().find(": step failed (", seen) != std::string::npos)
        *failed = std::chrono::duration<double>(clock_type::now() - pulled).count();
    std::this_thread::sleep_for(50ms);
  }
  lab.set_cable(0, true);
  for (const auto& each : {std::tuple{&w0, seen0, &failed0, "worker 0"},
                           std::tuple{&w1, seen1, &failed1, "worker 1"}}) {
    // Named copies, not structured bindings: clang 14 cannot capture those in doctest's
    // message lambdas.
    lt::child* const w = std::get<0>(each);
    const std::size_t seen = std::get<1>(each);
    const std::optional<double>* const failed = std::get<2>(each);
    const std::string name = std::get<3>(each);
    const std::string out = w->output();
    const auto at = out.find(": step failed (", seen);
    REQUIRE_MESSAGE(at != std::string::npos, name << " said nothing within 60 s: " << w->report());
    const std::string line =
        out.substr(out.rfind('\n', at) + 1, out.find('\n', at) - out.rfind('\n', at) - 1);
    std::cout << "ps cable pulled: " << name << "'s clear error " << **failed
              << " s after the pull: " << line << std::endl;
    CHECK_MESSAGE(line.find("(unavailable: ") != std::string::npos, line);
    CHECK_MESSAGE(
        line.find("ps task 0 at 192.0.2.1:2222 stopped answering: no heartbeat for 6 s") !=
            std::string::npos,
        line);
  }
  // Back on the wire: both recover (recreating their sessions) and the run ends.
  lt::expect_exit(w0, 0, 180s);
  lt::expect_exit(w1, 0, 60s);
  lt::expect_exit(ps, 0, 60s);
  CHECK_MESSAGE(w0.output().find("Worker 0: test accuracy = ") != std::string::npos, w0.report());
}

TEST_CASE("network namespaces: training through tc netem's 2 ms delay and 1 % loss" *
          doctest::skip(true)) {
  if (lt::no_examples)
    return lt::skip_case("built without examples (LOOM_BUILD_EXAMPLES=OFF)");
  netns_lab lab;
  if (const std::string why = lab.create(); !why.empty())
    return lt::skip_case("cannot make network namespaces: " + why);
  if (const std::string why = lab.netem("delay 2ms loss 1%"); !why.empty())
    return lt::skip_case("tc netem is not available (a kernel without sch_netem): " + why);
  const lt::temp_dir dir("loom-netem-");
  const run_result r = train(lab, dir, {"--train_steps=300"}, 180s);
  for (const std::string* out : {&r.w0, &r.w1}) {
    const std::string worker = out == &r.w0 ? "Worker 0" : "Worker 1";
    const auto acc = number_after(*out, worker + ": test accuracy = ");
    REQUIRE_MESSAGE(acc.has_value(), *out);
    CHECK(*acc > 0.5);
  }
}

TEST_CASE("network namespaces, figures: full runs under delay and loss (LOOM_NETNS_FIGURES=1)" *
          doctest::skip(std::getenv("LOOM_NETNS_FIGURES") == nullptr)) {
  if (lt::no_examples)
    return lt::skip_case("built without examples (LOOM_BUILD_EXAMPLES=OFF)");
  const std::int64_t steps = env_int("LOOM_NETNS_TRAIN_STEPS", 12000);
  for (const std::string condition : {"", "delay 2ms", "delay 2ms loss 1%"}) {
    netns_lab lab;
    if (const std::string why = lab.create(); !why.empty())
      return lt::skip_case("cannot make network namespaces: " + why);
    const std::string label = condition.empty() ? "no netem" : "netem " + condition;
    if (!condition.empty())
      if (const std::string why = lab.netem(condition); !why.empty()) {
        std::cout << label << ": not measured, tc netem is not available: " << why << std::endl;
        continue;
      }
    const lt::temp_dir dir("loom-netns-figures-");
    // make demo's run: Adam at 0.001 (mnist_replica's default, the seed's 0.01, ends lower).
    const run_result r =
        train(lab, dir, {"--train_steps=" + std::to_string(steps), "--learning_rate=0.001"}, 1800s);
    const double e0 = examples_per_sec(r.w0).value_or(0), e1 = examples_per_sec(r.w1).value_or(0);
    std::cout << label << ": " << steps << " global steps, " << e0 + e1 << " examples/s (" << e0
              << " + " << e1 << "), test accuracy "
              << number_after(r.w0, "Worker 0: test accuracy = ").value_or(-1) << " and "
              << number_after(r.w1, "Worker 1: test accuracy = ").value_or(-1) << ", " << r.seconds
              << " s from start to the last exit" << std::endl;
  }
}

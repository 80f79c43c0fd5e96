// Tasks on real hosts (#21 item 5): each task of examples/mnist_replica (or examples/ctr)
// runs in a network namespace of its own, a host with one interface (eth0, a TUN device) and
// one address from the documentation range 192.0.2.0/24 (RFC 5737). The hosts' network is
// tests/support/link_emulator, a router in user space that every host's eth0 is attached to:
// it forwards each packet to the host of its destination after the delay, jitter, loss,
// bandwidth and reordering it is told (netem's words), or drops it while a host is cut off (a
// pulled cable). It needs no kernel qdisc (this machine's kernel has no sch_netem). Nothing is
// added to this machine's own network namespace: the tasks can reach each other and no other
// address.
//
// - netns (CTest):
//   - the link emulator itself: a TCP round trip through 20 ms of delay takes 40 ms, a
//     100 % loss or a cut host lets no connection through, a plugged one does again, and an
//     8 Mbit/s cap sends 1 MB in about a second;
//   - the ps and two workers with a cluster token (LOOM_CLUSTER_TOKEN_FILE): a worker
//     without the token refuses to start, one with a wrong token is refused by the ps;
//     worker 1's cable is pulled for 10 s in the middle of training and the run must
//     finish: worker 1 resumes, or fails with a clear error while the rest finishes;
//   - the ps's cable pulled with default options: each worker's step fails with unavailable
//     naming the ps ("stopped answering: no heartbeat for 6 s"), the seconds from the pull
//     printed (#21's bar: 10 s), and once the cable is back the workers' monitored sessions
//     recover and the run finishes;
//   - 300 steps through 2 ms of delay and 1 % loss on every link: both workers reach their
//     accuracy and no step fails (no recovery: the liveness timeout never fires on a lossy
//     but connected link).
// - the figures (by hand: LOOM_NETNS_FIGURES=1 test_netns -tc='*figures*'): mnist_replica
//   and ctr under no impairment, 2 ms delay, 2 ms + 1 % loss, 10 ms + 5 % loss and a
//   100 Mbit/s cap (examples/s, test accuracy or AUC, recoveries, the packets lost);
//   LOOM_NETNS_TRAIN_STEPS and LOOM_NETNS_CTR_STEPS size them, LOOM_NETNS_CONDITIONS and
//   LOOM_NETNS_EXAMPLES choose some, and LOOM_NETNS_TCP_CC sets the hosts' TCP congestion
//   control (as reno; default the kernel's).
//
// Needs root, iproute2 (ip) and /dev/net/tun; where a namespace or a device cannot be made
// the case prints "skipped: " and the error, which CTest reports as skipped. The namespaces
// carry this process's PID in their names and are deleted when the case ends, passed or
// failed; a run that was killed leaves its namespaces to the next run, which deletes those of
// dead PIDs.
#include <support/examples.hpp>
#include <support/launchers.hpp>
#include <support/process.hpp>
#include <support/skip.hpp>

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
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

// Three hosts (namespaces <name>-h0..h2, 192.0.2.1..3 on their eth0, a TUN device each) and
// the link emulator routing between them. Deleted by the destructor.
class netns_lab {
public:
  static constexpr int hosts = 3;

  netns_lab() : dir_("loom-netns-lab-") {
    static int made = 0;
    name_ = std::string(prefix) + std::to_string(::getpid()) + "-" + std::to_string(made++);
  }
  netns_lab(const netns_lab&) = delete;
  netns_lab& operator=(const netns_lab&) = delete;
  ~netns_lab() {
    emulator_.reset(); // before the devices it serves go
    for (auto it = made_.rbegin(); it != made_.rend(); ++it)
      run_command(ip_, {"netns", "del", *it});
  }

  // Makes the namespaces, their devices and the emulator; "" then, else why not.
  std::string create() {
    ip_ = lt::find_program("ip");
    if (ip_.empty())
      return "ip is not installed (Debian's iproute2; tools/setup.sh installs it)";
    if (::geteuid() != 0)
      return "network namespaces need root (this test runs as uid " + std::to_string(::geteuid()) +
             ")";
    if (::access("/dev/net/tun", R_OK | W_OK) != 0)
      return "/dev/net/tun is missing (a kernel without TUN, or a container without the device)";
    delete_stale();
    std::vector<std::string> routes;
    for (int i = 0; i < hosts; ++i) {
      const std::string h = host(i);
      for (const auto& why :
           {add_namespace(h), ip({"-n", h, "tuntap", "add", "dev", "eth0", "mode", "tun"}),
            ip({"-n", h, "addr", "add", address(i) + "/24", "dev", "eth0"}),
            ip({"-n", h, "link", "set", "lo", "up"}), ip({"-n", h, "link", "set", "eth0", "up"})})
        if (!why.empty())
          return why;
      // LOOM_NETNS_TCP_CC: the hosts' TCP congestion control (default: the kernel's).
      if (const char* cc = std::getenv("LOOM_NETNS_TCP_CC"))
        if (auto why = run_command(
                ip_, {"netns", "exec", h, "sh", "-c",
                      std::string("echo ") + cc + " > /proc/sys/net/ipv4/tcp_congestion_control"});
            !why.empty())
          return why;
      routes.insert(routes.end(), {"--host", h + "=" + address(i)});
    }
    const std::string fifo = dir_ / "control";
    if (::mkfifo(fifo.c_str(), 0600) != 0)
      return "mkfifo " + fifo + ": " + std::strerror(errno);
    routes.insert(routes.end(), {"--control", fifo});
    emulator_.emplace(LOOM_LINK_EMULATOR, routes);
    if (!emulator_->wait_for_output("ready", 20s))
      return "the link emulator did not start: " + emulator_->report();
    control_ = fifo;
    return "";
  }

  std::string host(int i) const { return name_ + "-h" + std::to_string(i); }
  static std::string address(int i) { return "192.0.2." + std::to_string(i + 1); }

  // Pulls (or plugs back) host i's cable: the emulator drops every packet to or from it.
  // The host's eth0 keeps its address and routes, as a host whose cable is pulled.
  void set_cable(int i, bool plugged) { tell((plugged ? "plug " : "cut ") + std::to_string(i)); }

  // Every link's impairment from now on, in netem's words ("delay 2ms loss 1%"; "": none).
  void impair(const std::string& spec) { tell("set " + spec); }

  // What the emulator counted so far.
  struct link_stats {
    std::uint64_t forwarded = 0, lost = 0, partitioned = 0, queue_full = 0;
  };
  link_stats stats() {
    const std::size_t from = emulator_->output().size();
    tell("stats");
    const std::string out = emulator_->output();
    const auto at = out.find("stats: ", from);
    REQUIRE_MESSAGE(at != std::string::npos, emulator_->report());
    auto count = [&](const std::string& name) {
      const auto k = out.find(" " + name + "=", at);
      REQUIRE_MESSAGE(k != std::string::npos, emulator_->report());
      return std::strtoull(out.c_str() + k + name.size() + 2, nullptr, 10);
    };
    return {count("forwarded"), count("lost"), count("partitioned"), count("queue_full")};
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

  // The hosts' TCP congestion control (BBR, CUBIC and Reno share a lossy link differently).
  std::string congestion_control() const {
    lt::child c(ip_,
                {"netns", "exec", host(0), "cat", "/proc/sys/net/ipv4/tcp_congestion_control"});
    c.wait(10s);
    std::string out = c.output();
    out.erase(out.find_last_not_of(" \n") + 1);
    return out;
  }

private:
  static constexpr const char* prefix = "loomtest-";

  std::string ip(const std::vector<std::string>& args) const { return run_command(ip_, args); }

  // One command to the emulator, returning once it took effect.
  void tell(const std::string& command) {
    REQUIRE(emulator_.has_value());
    {
      std::ofstream out(control_);
      out << command << "\n";
    }
    const std::string done = "done " + std::to_string(++commands_) + ": " + command;
    REQUIRE_MESSAGE(emulator_->wait_for_output(done, 10s),
                    "the link emulator did not take '" << command << "': " << emulator_->report());
  }

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
  std::string ip_;
  std::vector<std::string> made_;
  lt::temp_dir dir_;
  std::string control_;
  std::optional<lt::child> emulator_;
  std::uint64_t commands_ = 0;
};

// An example's tasks (mnist_replica's unless told) on the lab's hosts: the ps on host 0,
// worker i on host i + 1, every task given the cluster by flags (as by hand on real hosts)
// and the token file.
class replica_tasks {
public:
  replica_tasks(const netns_lab& lab, const lt::temp_dir& dir,
                const char* example = "mnist_replica")
      : lab_(lab), dir_(dir), replica_(lt::example(example)) {
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
std::string error_line(const std::string& output, const std::string& example = "mnist_replica") {
  const auto at = output.find(example + ": ");
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
                 std::chrono::seconds limit, const char* example = "mnist_replica") {
  replica_tasks tasks(lab, dir, example);
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

// The lines where a task's monitored session recreated its session after a failed step
// ("... failed (...); recreating the session (recovery N)").
std::vector<std::string> recovery_lines(const std::string& output) {
  std::vector<std::string> lines;
  for (auto at = output.find("; recreating the session"); at != std::string::npos;
       at = output.find("; recreating the session", at + 1)) {
    const auto begin = output.rfind('\n', at) + 1;
    lines.push_back(output.substr(begin, output.find('\n', at) - begin));
  }
  return lines;
}
std::size_t recoveries(const std::string& output) {
  return recovery_lines(output).size();
}

// A TCP socket made in host i's namespace (a socket keeps the namespace it was made in), on
// a thread of its own so that the test's threads stay where they are.
int socket_in(const netns_lab& lab, int i) {
  int fd = -1;
  std::string why;
  std::thread([&] {
    const std::string path = "/run/netns/" + lab.host(i);
    const int ns = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0 || ::setns(ns, CLONE_NEWNET) != 0) {
      why = "cannot enter " + path + ": " + std::strerror(errno);
    } else {
      fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    if (ns >= 0)
      ::close(ns);
  }).join();
  REQUIRE_MESSAGE(fd >= 0, why);
  return fd;
}

sockaddr_in address_of(int host, std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, netns_lab::address(host).c_str(), &a.sin_addr);
  return a;
}

// Connects fd to host:port within `limit`; false when it did not.
bool connect_within(int fd, int host, std::uint16_t port, std::chrono::milliseconds limit) {
  const int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  const sockaddr_in a = address_of(host, port);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS)
    return false;
  pollfd p{fd, POLLOUT, 0};
  int err = -1;
  socklen_t len = sizeof err;
  const bool done = ::poll(&p, 1, static_cast<int>(limit.count())) == 1 &&
                    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
  ::fcntl(fd, F_SETFL, flags);
  return done;
}

// A server socket listening in one host, and a client from another with the server's end
// of their connection (connect_pair); all three closed by the destructor.
struct tcp_pair {
  int server = -1, client = -1, accepted = -1;
  ~tcp_pair() {
    for (int fd : {server, client, accepted})
      if (fd >= 0)
        ::close(fd);
  }
};

std::unique_ptr<tcp_pair> listen_on(const netns_lab& lab, int host, std::uint16_t port) {
  auto p = std::make_unique<tcp_pair>();
  p->server = socket_in(lab, host);
  const int one = 1;
  ::setsockopt(p->server, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const sockaddr_in a = address_of(host, port);
  REQUIRE(::bind(p->server, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(p->server, 4) == 0);
  return p;
}

bool connect_pair(const netns_lab& lab, tcp_pair& p, int from, int host, std::uint16_t port,
                  std::chrono::milliseconds limit) {
  if (p.client >= 0)
    ::close(p.client);
  if (p.accepted >= 0)
    ::close(p.accepted);
  p.accepted = -1;
  p.client = socket_in(lab, from);
  if (!connect_within(p.client, host, port, limit))
    return false;
  p.accepted = ::accept4(p.server, nullptr, nullptr, SOCK_CLOEXEC);
  const int one = 1;
  ::setsockopt(p.accepted, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return p.accepted >= 0;
}

// The median of 5 round trips of one byte, client -> server -> client, in milliseconds.
double median_round_trip_ms(const tcp_pair& p) {
  std::vector<double> ms;
  for (int i = 0; i < 5; ++i) {
    char b = 'p';
    const auto t = clock_type::now();
    REQUIRE(::write(p.client, &b, 1) == 1);
    REQUIRE(::read(p.accepted, &b, 1) == 1);
    REQUIRE(::write(p.accepted, &b, 1) == 1);
    REQUIRE(::read(p.client, &b, 1) == 1);
    ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[2];
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

TEST_CASE("network namespaces: the link emulator delays, drops, partitions and caps as told") {
  netns_lab lab;
  if (const std::string why = lab.create(); !why.empty())
    return lt::skip_case("cannot make network namespaces: " + why);
  auto pair = listen_on(lab, 1, 7000);

  // One-way delay on every link: a round trip crosses two.
  lab.impair("delay 20ms");
  REQUIRE(connect_pair(lab, *pair, 2, 1, 7000, 5s));
  const double rtt = median_round_trip_ms(*pair);
  std::cout << "round trip through 20 ms of delay each way: " << rtt << " ms" << std::endl;
  CHECK(rtt >= 39.5);
  CHECK(rtt < 75);
  lab.impair("");
  CHECK(median_round_trip_ms(*pair) < 20);

  // Every packet lost: no connection.
  const auto before = lab.stats();
  lab.impair("loss 100%");
  CHECK_FALSE(connect_pair(lab, *pair, 2, 1, 7000, 500ms));
  CHECK(lab.stats().lost > before.lost);

  // Host 2 cut off, then plugged back.
  lab.impair("");
  lab.set_cable(2, false);
  CHECK_FALSE(connect_pair(lab, *pair, 2, 1, 7000, 500ms));
  CHECK(lab.stats().partitioned > before.partitioned);
  REQUIRE(connect_pair(lab, *pair, 0, 1, 7000, 5s)); // the others still talk
  lab.set_cable(2, true);
  REQUIRE(connect_pair(lab, *pair, 2, 1, 7000, 5s));

  // 8 Mbit/s: 1 MB takes about a second.
  lab.impair("rate 8mbit");
  std::vector<char> data(1 << 20, 'x');
  const auto t = clock_type::now();
  std::thread reader([&] {
    std::vector<char> in(1 << 16);
    std::size_t got = 0;
    while (got < data.size()) {
      const ssize_t n = ::read(pair->accepted, in.data(), in.size());
      if (n <= 0)
        break;
      got += static_cast<std::size_t>(n);
    }
  });
  std::size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::write(pair->client, data.data() + sent, data.size() - sent);
    REQUIRE(n > 0);
    sent += static_cast<std::size_t>(n);
  }
  reader.join();
  const double secs = std::chrono::duration<double>(clock_type::now() - t).count();
  std::cout << "1 MiB through 8 Mbit/s: " << secs << " s" << std::endl;
  CHECK(secs > 1.0); // 1 MiB and the headers at 1 MB/s
  CHECK(secs < 3.0);
}

TEST_CASE("network namespaces: 300 steps through 2 ms of delay and 1 % loss: no recovery" *
          lt::needs_examples()) {
  netns_lab lab;
  if (const std::string why = lab.create(); !why.empty())
    return lt::skip_case("cannot make network namespaces: " + why);
  lab.impair("delay 2ms loss 1%");
  const lt::temp_dir dir("loom-netns-lossy-");
  const run_result r = train(lab, dir, {"--train_steps=300"}, 180s);
  const auto stats = lab.stats();
  std::cout << "2 ms + 1 % loss: " << stats.forwarded << " packets forwarded, " << stats.lost
            << " lost" << std::endl;
  CHECK(stats.lost > 0);
  for (const std::string* out : {&r.w0, &r.w1}) {
    const std::string worker = out == &r.w0 ? "Worker 0" : "Worker 1";
    const auto acc = number_after(*out, worker + ": test accuracy = ");
    REQUIRE_MESSAGE(acc.has_value(), *out);
    CHECK(*acc > 0.5);
    CHECK_MESSAGE(recoveries(*out) == 0, *out);
  }
}

TEST_CASE("network namespaces, figures: full runs under delay, loss and a bandwidth cap "
          "(LOOM_NETNS_FIGURES=1)" *
          doctest::skip(std::getenv("LOOM_NETNS_FIGURES") == nullptr)) {
  if (lt::no_examples)
    return lt::skip_case("built without examples (LOOM_BUILD_EXAMPLES=OFF)");
  struct example_run {
    const char* example;
    std::vector<std::string> args;
    const char* score; // "Worker i: <score> = "
  };
  const std::int64_t steps = env_int("LOOM_NETNS_TRAIN_STEPS", 12000),
                     ctr_steps = env_int("LOOM_NETNS_CTR_STEPS", 3000);
  const std::vector<example_run> runs{
      // make demo's runs: Adam at 0.001 (mnist_replica's default, the seed's 0.01, ends lower).
      {"mnist_replica",
       {"--train_steps=" + std::to_string(steps), "--learning_rate=0.001"},
       "test accuracy"},
      {"ctr", {"--train_steps=" + std::to_string(ctr_steps), "--log_every=500"}, "test AUC"}};
  // LOOM_NETNS_CONDITIONS ("delay 2ms;rate 100mbit"; "none" for no impairment) and
  // LOOM_NETNS_EXAMPLES ("ctr") choose some of them.
  std::vector<std::string> conditions{"", "delay 2ms", "delay 2ms loss 1%", "delay 10ms loss 5%",
                                      "rate 100mbit"};
  if (const char* chosen = std::getenv("LOOM_NETNS_CONDITIONS")) {
    conditions.clear();
    std::istringstream list(chosen);
    for (std::string c; std::getline(list, c, ';');)
      conditions.push_back(c == "none" ? "" : c);
  }
  const char* examples = std::getenv("LOOM_NETNS_EXAMPLES");
  for (const example_run& run : runs)
    for (const std::string& condition : conditions) {
      if (examples && std::string(examples).find(run.example) == std::string::npos)
        continue;
      netns_lab lab;
      if (const std::string why = lab.create(); !why.empty())
        return lt::skip_case("cannot make network namespaces: " + why);
      lab.impair(condition);
      const lt::temp_dir dir("loom-netns-figures-");
      const run_result r = train(lab, dir, run.args, 3600s, run.example);
      const auto stats = lab.stats();
      const double e0 = examples_per_sec(r.w0).value_or(0), e1 = examples_per_sec(r.w1).value_or(0);
      const std::string score = std::string(": ") + run.score + " = ";
      std::cout << run.example << ", " << (condition.empty() ? "no impairment" : condition)
                << " (TCP " << lab.congestion_control() << "): " << e0 + e1 << " examples/s (" << e0
                << " + " << e1 << "), " << run.score << " "
                << number_after(r.w0, "Worker 0" + score).value_or(-1) << " and "
                << number_after(r.w1, "Worker 1" + score).value_or(-1) << ", "
                << recoveries(r.w0) + recoveries(r.w1) << " recoveries, " << stats.lost
                << " packets lost and " << stats.queue_full << " dropped by a full link of "
                << stats.forwarded + stats.lost + stats.queue_full << ", " << r.seconds
                << " s from start to the last exit" << std::endl;
      for (const std::string* out : {&r.w0, &r.w1})
        for (const std::string& line : recovery_lines(*out))
          std::cout << "  recovery: " << line << std::endl;
    }
}

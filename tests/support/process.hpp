// Child processes for tests (POSIX only): spawn a program with arguments and
// environment overrides, collect its stdout and stderr (together, in order of
// writing) through a pipe, wait for a string in that output or for the exit
// with a timeout, kill it with SIGKILL. A `child` is its own RAII guard: its
// destructor kills and reaps the process, so a failing CHECK or an exception
// never leaves a process behind. Children also get SIGKILL if the test process
// dies (PR_SET_PDEATHSIG; spawn them from the test's main thread, since the
// signal follows the thread that forked).
//
//   auto ports = loom::testing::free_ports(2);
//   loom::testing::child ps(examples_dir + "/counter", {"--job_name=ps", ...});
//   REQUIRE(ps.wait_for_output("listening", 30s));
//   auto st = ps.wait(60s);      // std::optional<exit_status>, nullopt on timeout
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace loom::testing {

using namespace std::chrono_literals;

inline std::runtime_error sys_error(const std::string& what) {
  return std::runtime_error(what + ": " + std::strerror(errno));
}

// n distinct loopback ports that were free a moment ago: every socket stays
// bound until all n are chosen, so the OS never hands out one port twice.
inline std::vector<std::uint16_t> free_ports(std::size_t n) {
  std::vector<int> fds;
  std::vector<std::uint16_t> ports;
  auto close_all = [&] {
    for (int fd : fds)
      ::close(fd);
  };
  for (std::size_t i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      close_all();
      throw sys_error("free_ports: socket");
    }
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof addr;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      close_all();
      throw sys_error("free_ports: bind/getsockname");
    }
    ports.push_back(ntohs(addr.sin_port));
  }
  close_all();
  return ports;
}

// The lowest port the OS hands out on its own (bind to port 0, or connect), from
// /proc/sys/net/ipv4/ip_local_port_range; 32768, Linux's default, where it cannot be read.
inline std::uint16_t ephemeral_port_floor() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  long low = 0;
  if (range >> low && low > 1024 && low <= 65535)
    return static_cast<std::uint16_t>(low);
  return 32768;
}

// The first of n consecutive loopback ports that were all free a moment ago (a rank
// launcher's tasks on one host listen on --port_base plus their index on the host).
// The OS cannot choose a run, so this one is drawn at random from the 8192 ports below the
// OS's ephemeral range and checked by binding every port of it: a run inside that range
// would be a target for every outgoing connection on the host (the OS gives connect() the
// ports of the other parity than bind(0)'s, and a run holds both), and a test beside this
// one connecting while the run's tasks start could take a port before its task binds it.
inline std::uint16_t free_port_run(int n) {
  const int ceiling = ephemeral_port_floor();
  const int floor = std::max(1024, ceiling - 8192);
  if (n < 1 || ceiling - floor < n)
    throw std::invalid_argument("free_port_run: no room for " + std::to_string(n) +
                                " ports below the ephemeral range");
  std::mt19937 pick(std::random_device{}());
  std::uniform_int_distribution<int> first_of(floor, ceiling - n);
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int first = first_of(pick);
    std::vector<int> fds;
    bool all_free = true;
    for (int i = 0; i < n && all_free; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        for (int f : fds)
          ::close(f);
        throw sys_error("free_port_run: socket");
      }
      fds.push_back(fd);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<std::uint16_t>(first + i));
      all_free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    }
    for (int fd : fds)
      ::close(fd);
    if (all_free)
      return static_cast<std::uint16_t>(first);
  }
  throw std::runtime_error("free_port_run: no run of " + std::to_string(n) +
                           " free loopback ports in 100 tries between " + std::to_string(floor) +
                           " and " + std::to_string(ceiling - 1));
}

// "127.0.0.1:p1,127.0.0.1:p2" for --ps_hosts / --worker_hosts.
inline std::string loopback_hosts(const std::vector<std::uint16_t>& ports) {
  std::string out;
  for (std::uint16_t p : ports)
    out += (out.empty() ? "" : ",") + ("127.0.0.1:" + std::to_string(p));
  return out;
}

// How a child ended.
struct exit_status {
  bool exited = false; // normal exit: `code` is the status
  int code = -1;
  int signal = 0; // killed by this signal when !exited

  bool success() const noexcept { return exited && code == 0; }
  std::string to_string() const {
    return exited ? "exit code " + std::to_string(code)
                  : "killed by signal " + std::to_string(signal);
  }
};

// Environment changes for a child: a value sets the variable, nullopt removes it.
using env_overrides = std::map<std::string, std::optional<std::string>>;

class child {
public:
  // Starts `program` with `args` (argv[1..]) and the test's environment
  // changed by `env`. Throws std::runtime_error when it cannot start (a
  // missing program shows as exit code 127 with a message in the output).
  child(std::string program, std::vector<std::string> args = {}, env_overrides env = {})
      : program_(std::move(program)) {
    std::vector<std::string> argv_s{program_};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<std::string> env_s;
    for (char** e = environ; e && *e; ++e) {
      std::string_view kv(*e);
      const std::string key(kv.substr(0, kv.find('=')));
      if (!env.count(key))
        env_s.emplace_back(kv);
    }
    for (auto& [k, v] : env)
      if (v)
        env_s.push_back(k + "=" + *v);
    // Everything the child needs is built before fork: after it, only
    // async-signal-safe calls.
    std::vector<char*> argv, envp;
    for (auto& s : argv_s)
      argv.push_back(s.data());
    argv.push_back(nullptr);
    for (auto& s : env_s)
      envp.push_back(s.data());
    envp.push_back(nullptr);
    command_ = describe(argv_s);

    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0)
      throw sys_error("pipe2");
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      throw sys_error("fork");
    }
    if (pid == 0) { // the child
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent)
        ::_exit(126);                // the test died before prctl
      ::dup2(fds[1], STDOUT_FILENO); // dup2 clears O_CLOEXEC on 1 and 2
      ::dup2(fds[1], STDERR_FILENO);
      const int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0)
        ::dup2(devnull, STDIN_FILENO);
      ::execve(argv[0], argv.data(), envp.data());
      static const char msg[] = "process.hpp: execve failed\n";
      [[maybe_unused]] auto w = ::write(STDERR_FILENO, msg, sizeof msg - 1);
      ::_exit(127);
    }
    pid_ = pid;
    ::close(fds[1]);
    reader_ = std::thread([this, fd = fds[0]] { read_all(fd); });
  }

  child(const child&) = delete;
  child& operator=(const child&) = delete;
  ~child() {
    kill();
    if (reader_.joinable())
      reader_.join();
  }

  pid_t pid() const noexcept { return pid_; }
  // The command line, for messages.
  const std::string& command() const noexcept { return command_; }

  // Everything the child wrote so far (stdout and stderr together).
  std::string output() const {
    std::lock_guard lock(mu_);
    return output_;
  }

  // Waits until the output contains `needle`; false when the child's output
  // ended (it exited) or `timeout` passed first.
  bool wait_for_output(std::string_view needle, std::chrono::milliseconds timeout = 60s) const {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] {
      return output_.find(needle) != std::string::npos || eof_;
    }) && output_.find(needle) != std::string::npos;
  }

  // Waits for the exit (and the end of its output); nullopt when `timeout`
  // passed first (the child keeps running).
  std::optional<exit_status> wait(std::chrono::milliseconds timeout = 120s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!status_) {
      if (!try_reap()) {
        if (std::chrono::steady_clock::now() >= deadline)
          return std::nullopt;
        std::this_thread::sleep_for(5ms); // polls waitpid; the child's exit is the condition
      }
    }
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return eof_; });
    return status_;
  }

  bool running() { return !status_ && !try_reap(); }

  // SIGKILL (if still running) and reap. Idempotent.
  void kill() noexcept {
    if (status_ || pid_ <= 0)
      return;
    ::kill(pid_, SIGKILL);
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    set_status(st);
  }

  // The command, its status and its output, for a failing check's message.
  std::string report() const {
    return command_ + "\n  status: " + (status_ ? status_->to_string() : "running") +
           "\n  output:\n" + output();
  }

private:
  static std::string describe(const std::vector<std::string>& argv) {
    std::string s;
    for (auto& a : argv)
      s += (s.empty() ? "" : " ") + a;
    return s;
  }

  bool try_reap() {
    if (status_)
      return true;
    int st = 0;
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      set_status(st);
      return true;
    }
    return false;
  }

  void set_status(int st) {
    exit_status s;
    if (WIFEXITED(st)) {
      s.exited = true;
      s.code = WEXITSTATUS(st);
    } else if (WIFSIGNALED(st)) {
      s.signal = WTERMSIG(st);
    }
    status_ = s;
  }

  void read_all(int fd) {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        break;
      {
        std::lock_guard lock(mu_);
        output_.append(buf, static_cast<std::size_t>(n));
      }
      cv_.notify_all();
    }
    ::close(fd);
    {
      std::lock_guard lock(mu_);
      eof_ = true;
    }
    cv_.notify_all();
  }

  std::string program_;
  std::string command_;
  pid_t pid_ = -1;
  std::optional<exit_status> status_; // touched by the owning thread only
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::string output_;
  bool eof_ = false;
  std::thread reader_;
};

} // namespace loom::testing

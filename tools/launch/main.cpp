// loom-launch: starts a local cluster of any cluster binary with one command.
//
//   loom-launch --ps 1 --workers 2 [--host 127.0.0.1] [--grace_secs 10] -- BINARY [ARGS...]
//
// It picks ps+workers distinct free ports on --host, then starts every task (ps tasks first,
// then workers) as BINARY ARGS... --ps_hosts=... --worker_hosts=... --job_name=...
// --task_index=..., and prints each line a task writes with its job and task in front
// ("[ps:0] ", "[worker:1] "; stdout to stdout, stderr to stderr). When the chief (worker 0)
// exits 0 the others get --grace_secs to exit on their own before they are stopped; when
// a task fails, or on SIGINT/SIGTERM, every task gets SIGTERM, then SIGKILL after
// --grace_secs. Every task is reaped, and gets SIGKILL if loom-launch dies
// (PR_SET_PDEATHSIG). The exit status is the chief's, a failing task's (128+signal for a
// signal), 130/143 for SIGINT/SIGTERM, 2 for bad usage, 127 for a binary that cannot run.
//
// The cluster is authenticated: unless the user set LOOM_CLUSTER_TOKEN or
// LOOM_CLUSTER_TOKEN_FILE (then theirs is kept) or gave --no_token, loom-launch generates a
// random token and puts it in every task's environment as LOOM_CLUSTER_TOKEN, never on a
// command line (which any local user can read in /proc/PID/cmdline), so other users of the
// machine cannot connect to the tasks' ports. With --tls the tasks also encrypt their
// connections with TLS keyed by that token (LOOM_TLS=1 in their environment; TLS with
// certificates comes from the user's own LOOM_TLS_CERT, LOOM_TLS_KEY and LOOM_TLS_CA, which
// the tasks inherit).
//
// The tasks share the host's cores: each gets its share for its kernels' pool
// (LOOM_INTRA_OP_THREADS = max(1, cores / tasks) in its environment, unless the user set it).
//
// POSIX (Linux) only; it includes no loom header but the flag parser, and OpenSSL for the
// token's random bytes.
#include <loom/cluster/environment.hpp>
#include <loom/core/flags.hpp>

#include <openssl/rand.h>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

constexpr int exit_usage = 2;
constexpr int exit_cannot_execute = 127;
constexpr std::size_t max_line = 1 << 20; // a longer line is printed in pieces
constexpr std::int64_t max_tasks = 1000;

constexpr std::string_view usage_text =
    R"(usage: loom-launch [--ps N] [--workers N] [--host ADDR] [--grace_secs S] [--no_token]
                   [--tls] -- BINARY [ARGS...]

Starts a local cluster of BINARY: N ps tasks and N worker tasks on free ports of ADDR, each
run as  BINARY ARGS... --ps_hosts=h:p,... --worker_hosts=h:p,... --job_name=ps|worker
--task_index=I  (ps tasks first, then workers). Every line a task writes is printed with its
job and task in front, "[ps:0] ..." or "[worker:1] ..." (stdout to stdout, stderr to stderr).

  --ps N          ps tasks (default 1; 0 allowed)
  --workers N     worker tasks, at least 1; worker 0 is the chief (default 1)
  --host ADDR     the address the tasks listen on (default 127.0.0.1)
  --grace_secs S  seconds between SIGTERM and SIGKILL when tasks are stopped, and the
                  seconds the others get to exit on their own after the chief exits 0
                  (default 10)
  --no_token      start the cluster without a cluster token (any local user can then
                  connect to its tasks and run requests)
  --tls           encrypt the tasks' connections with TLS keyed by the cluster token
                  (LOOM_TLS=1 in each task's environment; for clusters whose traffic
                  crosses networks others can read). For TLS with certificates, set
                  LOOM_TLS_CERT, LOOM_TLS_KEY and LOOM_TLS_CA: the tasks inherit them
  --help          this text

The cluster is authenticated: every task gets a random cluster token, generated for this
cluster, in its environment (LOOM_CLUSTER_TOKEN; never on its command line), and its servers
refuse peers without it. When LOOM_CLUSTER_TOKEN or LOOM_CLUSTER_TOKEN_FILE is already set,
the tasks use that token instead: set one yourself to connect other processes (a client, a
task started by hand) to the cluster.

The tasks share this host's cores: each gets its share for its kernels' threads,
LOOM_INTRA_OP_THREADS = max(1, cores / tasks) in its environment, unless you set
LOOM_INTRA_OP_THREADS yourself (a task's own --intra_op_threads wins over both), and
OMP_WAIT_POLICY=passive unless you set it (oneDNN's threads then sleep between regions
rather than spin on cores the other tasks need).

When the chief exits 0, the others get --grace_secs to exit, then stragglers are stopped.
When a task fails, or on SIGINT/SIGTERM, every task gets SIGTERM, then SIGKILL.
Exit status: the chief's (0) when the cluster finishes; a failing task's status
(128+signal when a signal ended it); 130 on SIGINT, 143 on SIGTERM; 2 for bad usage;
127 when BINARY cannot be executed.
)";

// ---------------------------------------------------------------------------------------------
// Output: whole writes, never interleaved mid-line (one thread writes everything).
// ---------------------------------------------------------------------------------------------
void write_all(int fd, std::string_view data) {
  const char* p = data.data();
  std::size_t n = data.size();
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) { // a non-blocking stdout: wait for room
        pollfd pfd{fd, POLLOUT, 0};
        ::poll(&pfd, 1, 1000);
        continue;
      }
      return; // EPIPE and the like: the reader is gone, drop the output
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void say(const std::string& message) {
  write_all(STDERR_FILENO, "loom-launch: " + message + "\n");
}

std::string format_secs(double secs) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%gs", secs);
  return buf;
}

// ---------------------------------------------------------------------------------------------
// Signals arrive through a self-pipe, so the main loop handles them between polls.
// ---------------------------------------------------------------------------------------------
int signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  const int saved = errno;
  const auto byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t w = ::write(signal_pipe[1], &byte, 1);
  errno = saved;
}

constexpr int handled_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

void install_signal_handlers() {
  if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::perror("loom-launch: pipe2");
    std::exit(1);
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : handled_signals)
    ::sigaction(sig, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN); // a closed stdout must not kill the launcher (and its tasks)
}

// ---------------------------------------------------------------------------------------------
// Ports and the binary
// ---------------------------------------------------------------------------------------------

// n distinct free ports on `host`: all n sockets are bound before any is closed.
std::vector<std::uint16_t> free_ports(const std::string& host, std::size_t n) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0 || !found) {
    say("--host=" + host + ": not an IPv4 address or a known host name (" + ::gai_strerror(rc) +
        ")");
    std::exit(exit_usage);
  }
  sockaddr_in addr{};
  std::memcpy(&addr, found->ai_addr, sizeof addr);
  ::freeaddrinfo(found);

  std::vector<int> fds;
  std::vector<std::uint16_t> ports;
  auto fail = [&](const char* what) {
    say(std::string("cannot pick a free port on ") + host + ": " + what + ": " +
        std::strerror(errno));
    for (int fd : fds)
      ::close(fd);
    std::exit(exit_usage);
  };
  for (std::size_t i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      fail("socket");
    fds.push_back(fd);
    addr.sin_port = 0;
    socklen_t len = sizeof addr;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
      fail("bind");
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      fail("getsockname");
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : fds)
    ::close(fd);
  return ports;
}

bool executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// The path execv runs for `binary` (searched in PATH when it has no '/'), or an error text.
std::optional<std::string> resolve_binary(const std::string& binary, std::string& error) {
  auto why = [](const std::string& path) -> std::string {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
      return std::strerror(errno);
    if (S_ISDIR(st.st_mode))
      return "is a directory";
    if (!S_ISREG(st.st_mode))
      return "not a regular file";
    return "not executable (permission denied)";
  };
  if (binary.find('/') != std::string::npos) {
    if (executable_file(binary))
      return binary;
    error = why(binary);
    return std::nullopt;
  }
  const char* path_env = std::getenv("PATH");
  const std::string path = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= path.size()) {
    const std::size_t end = std::min(path.find(':', start), path.size());
    std::string dir = path.substr(start, end - start);
    if (dir.empty())
      dir = ".";
    const std::string candidate = dir + "/" + binary;
    if (executable_file(candidate))
      return candidate;
    start = end + 1;
  }
  error = "not found in PATH";
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Tasks
// ---------------------------------------------------------------------------------------------
struct stream {
  int fd = -1;     // read end of the task's pipe, -1 once closed
  int out_fd = -1; // where its lines go
  std::string pending;
};

struct task {
  std::string job;
  int index = 0;
  std::string prefix; // "[worker:1] "
  pid_t pid = -1;
  bool reaped = false;
  int wait_status = 0;
  bool term_sent = false; // loom-launch asked it to stop: its status is not a failure
  stream out, err;

  std::string name() const { return job + ":" + std::to_string(index); }
  bool chief() const { return job == "worker" && index == 0; }
};

// Prints the complete lines of `s` (and, at the end of the stream, the rest) with `prefix`.
void emit_lines(stream& s, const std::string& prefix, bool at_end) {
  std::string batch;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t nl = s.pending.find('\n', begin);
    if (nl == std::string::npos)
      break;
    batch += prefix;
    batch.append(s.pending, begin, nl + 1 - begin);
    begin = nl + 1;
  }
  s.pending.erase(0, begin);
  if (!s.pending.empty() && (at_end || s.pending.size() >= max_line)) {
    batch += prefix;
    batch += s.pending;
    batch += '\n';
    s.pending.clear();
  }
  if (!batch.empty())
    write_all(s.out_fd, batch);
}

void close_stream(stream& s, const std::string& prefix) {
  emit_lines(s, prefix, true);
  ::close(s.fd);
  s.fd = -1;
}

// Reads what is there now (the fd is non-blocking); closes the stream at its end.
void read_available(stream& s, const std::string& prefix) {
  char buf[65536];
  while (s.fd >= 0) {
    const ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n > 0) {
      s.pending.append(buf, static_cast<std::size_t>(n));
      emit_lines(s, prefix, false);
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    close_stream(s, prefix); // end of stream or a read error
  }
}

std::string describe_status(int wait_status) {
  if (WIFEXITED(wait_status))
    return "exited with status " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    const char* text = ::strsignal(sig);
    return "was killed by signal " + std::to_string(sig) + " (" + (text ? text : "?") + ")";
  }
  return "ended with wait status " + std::to_string(wait_status);
}

int exit_code_of(int wait_status) {
  if (WIFEXITED(wait_status))
    return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status))
    return 128 + WTERMSIG(wait_status);
  return 1;
}

const char* signal_name(int sig) {
  switch (sig) {
  case SIGINT: return "SIGINT";
  case SIGTERM: return "SIGTERM";
  case SIGHUP: return "SIGHUP";
  default: return "a signal";
  }
}

class launcher {
public:
  launcher(std::string binary, std::string path, std::vector<std::string> args, double grace)
      : binary_(std::move(binary)), path_(std::move(path)), args_(std::move(args)), grace_(grace) {}

  // Starts every task; when one cannot be started, stops those already started (run() then
  // reaps them and returns 127).
  void start(const std::string& ps_hosts, const std::string& worker_hosts, std::int64_t n_ps,
             std::int64_t n_workers) {
    tasks_.reserve(static_cast<std::size_t>(n_ps + n_workers));
    for (std::int64_t i = 0; i < n_ps + n_workers; ++i) {
      task t;
      t.job = i < n_ps ? "ps" : "worker";
      t.index = static_cast<int>(i < n_ps ? i : i - n_ps);
      t.prefix = "[" + t.name() + "] ";
      tasks_.push_back(std::move(t));
    }
    for (task& t : tasks_) {
      std::vector<std::string> argv = {binary_};
      argv.insert(argv.end(), args_.begin(), args_.end());
      argv.push_back("--ps_hosts=" + ps_hosts);
      argv.push_back("--worker_hosts=" + worker_hosts);
      argv.push_back("--job_name=" + t.job);
      argv.push_back("--task_index=" + std::to_string(t.index));
      if (!spawn(t, argv)) {
        for (task& rest : tasks_)
          if (rest.pid <= 0)
            rest.reaped = true; // never started
        final_code_ = exit_cannot_execute;
        begin_stop();
        return;
      }
    }
  }

  // Runs until every task is reaped; returns loom-launch's exit status.
  int run() {
    while (std::any_of(tasks_.begin(), tasks_.end(), [](const task& t) { return !t.reaped; })) {
      std::vector<pollfd> fds{{signal_pipe[0], POLLIN, 0}};
      std::vector<stream*> streams{nullptr};
      for (task& t : tasks_)
        for (stream* s : {&t.out, &t.err})
          if (s->fd >= 0) {
            fds.push_back({s->fd, POLLIN, 0});
            streams.push_back(s);
          }
      int timeout_ms = -1;
      if (deadline_) {
        const auto left =
            std::chrono::ceil<std::chrono::milliseconds>(*deadline_ - clock_type::now());
        timeout_ms = static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 60'000));
      }
      const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
      if (ready < 0 && errno != EINTR) {
        std::perror("loom-launch: poll");
        stop_now();
      }
      if (ready > 0) {
        for (std::size_t i = 1; i < fds.size(); ++i)
          if (fds[i].revents != 0)
            read_available(*streams[i], owner_prefix(*streams[i]));
        if (fds[0].revents != 0)
          handle_signals();
      }
      reap();
      check_deadline();
    }
    // Every task is gone; print what is left in the pipes (a grandchild that still holds
    // one open is not waited for).
    for (task& t : tasks_)
      for (stream* s : {&t.out, &t.err})
        if (s->fd >= 0) {
          read_available(*s, t.prefix);
          if (s->fd >= 0)
            close_stream(*s, t.prefix);
        }
    return final_code_;
  }

private:
  enum class phase { running, draining, stopping };

  bool spawn(task& t, const std::vector<std::string>& argv_s) {
    int out[2], err[2], exec_err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 ||
        ::pipe2(exec_err, O_CLOEXEC) != 0) {
      say("cannot start " + t.name() + ": pipe2: " + std::strerror(errno));
      return false;
    }
    std::vector<char*> argv;
    for (const std::string& a : argv_s)
      argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);

    // No handler may run in the child before exec (it would write to our signal pipe).
    sigset_t all, old;
    sigfillset(&all);
    ::sigprocmask(SIG_BLOCK, &all, &old);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) { // the child: async-signal-safe calls only
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent)
        ::_exit(exit_cannot_execute); // loom-launch died before prctl
      ::setpgid(0, 0);                // its own group: stopping a task reaches its children
      for (int sig : handled_signals)
        ::signal(sig, SIG_DFL);
      ::signal(SIGPIPE, SIG_DFL);
      ::sigprocmask(SIG_SETMASK, &old, nullptr);
      const int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0)
        ::dup2(devnull, STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO); // dup2 clears O_CLOEXEC on the copies
      ::dup2(err[1], STDERR_FILENO);
      ::execv(path_.c_str(), argv.data());
      const int e = errno;
      [[maybe_unused]] const ssize_t w = ::write(exec_err[1], &e, sizeof e);
      ::_exit(exit_cannot_execute);
    }
    const int fork_errno = errno;
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
    ::close(out[1]);
    ::close(err[1]);
    ::close(exec_err[1]);
    if (pid < 0) {
      ::close(out[0]);
      ::close(err[0]);
      ::close(exec_err[0]);
      say("cannot start " + t.name() + ": fork: " + std::strerror(fork_errno));
      t.reaped = true;
      return false;
    }
    ::setpgid(pid, pid); // also here, so a signal right after fork reaches the group
    t.pid = pid;
    t.out = {out[0], STDOUT_FILENO, {}};
    t.err = {err[0], STDERR_FILENO, {}};
    ::fcntl(out[0], F_SETFL, O_NONBLOCK);
    ::fcntl(err[0], F_SETFL, O_NONBLOCK);

    // exec_err closes (0 bytes) when execv succeeds, or carries its errno.
    int e = 0;
    ssize_t n;
    do {
      n = ::read(exec_err[0], &e, sizeof e);
    } while (n < 0 && errno == EINTR);
    ::close(exec_err[0]);
    if (n == static_cast<ssize_t>(sizeof e)) {
      t.term_sent = true; // its exit status is this error, already reported
      say("cannot execute '" + binary_ + "' for " + t.name() + ": " + std::strerror(e));
      return false;
    }
    return true;
  }

  std::string owner_prefix(const stream& s) const {
    for (const task& t : tasks_)
      if (&t.out == &s || &t.err == &s)
        return t.prefix;
    return {};
  }

  void signal_task(task& t, int sig) {
    if (t.reaped || t.pid <= 0)
      return; // a reaped pid may belong to someone else by now
    // The task's process group (its children too); the task alone if that fails.
    if (::kill(-t.pid, sig) != 0)
      ::kill(t.pid, sig);
  }

  // SIGTERM to every running task; SIGKILL after the grace period.
  void begin_stop() {
    phase_ = phase::stopping;
    for (task& t : tasks_)
      if (!t.reaped) {
        signal_task(t, SIGTERM);
        t.term_sent = true;
      }
    deadline_ = clock_type::now() + grace_duration();
  }

  void stop_now() {
    phase_ = phase::stopping;
    kill_sent_ = true;
    deadline_.reset();
    for (task& t : tasks_)
      if (!t.reaped) {
        t.term_sent = true;
        signal_task(t, SIGKILL);
      }
  }

  clock_type::duration grace_duration() const {
    return std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(grace_));
  }

  std::string running_names() const {
    std::string names;
    for (const task& t : tasks_)
      if (!t.reaped)
        names += (names.empty() ? "" : ", ") + t.name();
    return names;
  }

  void handle_signals() {
    unsigned char buf[64];
    for (;;) {
      const ssize_t n = ::read(signal_pipe[0], buf, sizeof buf);
      if (n <= 0)
        return;
      for (ssize_t i = 0; i < n; ++i) {
        const int sig = buf[i];
        if (sig == SIGCHLD)
          continue; // reap() runs after every poll
        if (phase_ != phase::stopping) {
          final_code_ = 128 + sig;
          say(std::string("got ") + signal_name(sig) +
              "; stopping every task (SIGTERM, SIGKILL after " + format_secs(grace_) + ")");
          begin_stop();
        } else if (!kill_sent_) {
          say(std::string("got ") + signal_name(sig) + " again; sending SIGKILL to " +
              running_names());
          stop_now();
        }
      }
    }
  }

  void reap() {
    // All first, then what their ends mean: the chief and a ps that ended together are both
    // gone when the chief's end is handled.
    std::vector<task*> ended;
    for (task& t : tasks_) {
      if (t.reaped || t.pid <= 0)
        continue;
      int st = 0;
      pid_t r;
      do {
        r = ::waitpid(t.pid, &st, WNOHANG);
      } while (r < 0 && errno == EINTR);
      if (r == t.pid || (r < 0 && errno == ECHILD)) {
        t.reaped = true;
        t.wait_status = st;
        // Its output comes before anything said about its end.
        read_available(t.out, t.prefix);
        read_available(t.err, t.prefix);
        ended.push_back(&t);
      }
    }
    for (task* t : ended)
      task_exited(*t);
  }

  void task_exited(task& t) {
    const int code = exit_code_of(t.wait_status);
    if (t.term_sent || phase_ == phase::stopping)
      return; // stopped by loom-launch, or ended while every task is being stopped
    const bool others =
        std::any_of(tasks_.begin(), tasks_.end(), [](const task& o) { return !o.reaped; });
    if (code != 0) {
      final_code_ = code;
      say(t.name() + " " + describe_status(t.wait_status) +
          (phase_ == phase::draining ? " after the chief finished" : "") +
          (others ? "; stopping " + running_names() : ""));
      begin_stop();
      return;
    }
    if (t.chief() && phase_ == phase::running) {
      final_code_ = 0;
      if (others) {
        say("the chief worker:0 exited with status 0; waiting up to " + format_secs(grace_) +
            " for " + running_names() + " to exit");
        phase_ = phase::draining;
        deadline_ = clock_type::now() + grace_duration();
      }
    }
    // Another task that exits 0 is fine (a ps that saw the chief's shutdown first, a worker
    // that is done): the chief's exit decides.
  }

  void check_deadline() {
    if (!deadline_ || clock_type::now() < *deadline_)
      return;
    if (phase_ == phase::draining) {
      say(running_names() + " still running " + format_secs(grace_) +
          " after the chief finished; stopping (SIGTERM)");
      begin_stop();
      return;
    }
    if (phase_ == phase::stopping && !kill_sent_) {
      const std::string names = running_names();
      if (!names.empty())
        say(names + " still running " + format_secs(grace_) + " after SIGTERM; sending SIGKILL");
      stop_now();
    }
  }

  std::string binary_; // as the user gave it (argv[0] of every task)
  std::string path_;   // what execv runs
  std::vector<std::string> args_;
  double grace_;
  std::vector<task> tasks_;
  phase phase_ = phase::running;
  std::optional<clock_type::time_point> deadline_;
  bool kill_sent_ = false;
  int final_code_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The cluster token
// ---------------------------------------------------------------------------------------------
constexpr std::size_t token_bytes = 32; // 256 bits, written as 64 hex digits

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

// A fresh random token (OpenSSL's RAND_bytes, the generator of the handshake's nonces), or
// nullopt when OpenSSL cannot produce one.
std::optional<std::string> random_token() {
  unsigned char bytes[token_bytes];
  if (RAND_bytes(bytes, static_cast<int>(sizeof bytes)) != 1)
    return std::nullopt;
  static constexpr char hex[] = "0123456789abcdef";
  std::string token;
  token.reserve(2 * sizeof bytes);
  for (unsigned char b : bytes) {
    token += hex[b >> 4];
    token += hex[b & 0xf];
  }
  return token;
}

// Gives the tasks their token through loom-launch's own environment, which every task
// inherits (a command line is readable by every local user, an environment only by its
// owner); returns how the banner describes it, or nullopt after saying what went wrong.
std::optional<std::string> arrange_token(bool no_token) {
  const bool user_token = env_set("LOOM_CLUSTER_TOKEN");
  const bool user_file = env_set("LOOM_CLUSTER_TOKEN_FILE");
  if (no_token) {
    if (user_token || user_file) {
      say(std::string("--no_token, but ") +
          (user_token ? "LOOM_CLUSTER_TOKEN" : "LOOM_CLUSTER_TOKEN_FILE") +
          " is set: unset it, or drop --no_token to use it");
      return std::nullopt;
    }
    return std::string("without a cluster token (--no_token): any local user can connect to "
                       "its tasks and run requests");
  }
  if (user_token)
    return std::string("authenticated with your LOOM_CLUSTER_TOKEN");
  if (user_file)
    return "authenticated with the token in your LOOM_CLUSTER_TOKEN_FILE (" +
           std::string(std::getenv("LOOM_CLUSTER_TOKEN_FILE")) + ")";
  const auto token = random_token();
  if (!token) {
    say("cannot generate a cluster token: OpenSSL's RAND_bytes failed (give one in "
        "LOOM_CLUSTER_TOKEN, or start the cluster with --no_token)");
    return std::nullopt;
  }
  if (::setenv("LOOM_CLUSTER_TOKEN", token->c_str(), 1) != 0) {
    say(std::string("cannot set LOOM_CLUSTER_TOKEN: ") + std::strerror(errno));
    return std::nullopt;
  }
  return std::string("authenticated with a cluster token generated for it (LOOM_CLUSTER_TOKEN "
                     "in each task's environment)");
}

// Gives each task its share of this host's cores for its kernels (LOOM_INTRA_OP_THREADS in
// loom-launch's environment, which the tasks inherit): every task sizing its pool to all
// the cores would oversubscribe them with the others'. A value the user set is kept, and a
// task's own --intra_op_threads (or session option) wins over it. Returns how the banner
// describes it, or nullopt after saying what went wrong.
std::optional<std::string> arrange_threads(std::int64_t tasks) {
  if (env_set("LOOM_INTRA_OP_THREADS"))
    return "each task's kernels use your LOOM_INTRA_OP_THREADS=" +
           std::string(std::getenv("LOOM_INTRA_OP_THREADS")) + " thread(s)";
  const long cores = loom::detail::schedulable_cpus(); // taskset, cgroup cpusets
  const long threads = std::max(1L, cores / static_cast<long>(tasks));
  if (::setenv("LOOM_INTRA_OP_THREADS", std::to_string(threads).c_str(), 1) != 0) {
    say(std::string("cannot set LOOM_INTRA_OP_THREADS: ") + std::strerror(errno));
    return std::nullopt;
  }
  // The tasks share these cores: oneDNN's OpenMP threads (the CPU's convolutions) wait
  // for their next region asleep rather than spinning on a core another task needs
  // (examples/cnn: 0.68x TF's examples/s spinning, 0.98x asleep, docs/benchmarks.md).
  // libgomp reads it when it loads, so only the environment can set it; a value the user
  // set is kept.
  if (!env_set("OMP_WAIT_POLICY") && ::setenv("OMP_WAIT_POLICY", "passive", 1) != 0) {
    say(std::string("cannot set OMP_WAIT_POLICY: ") + std::strerror(errno));
    return std::nullopt;
  }
  return "each task's kernels use " + std::to_string(threads) + " thread(s), its share of " +
         std::to_string(cores) + " core(s) (LOOM_INTRA_OP_THREADS)";
}

int usage_error(const std::string& message) {
  say(message);
  write_all(STDERR_FILENO, "run 'loom-launch --help' for usage\n");
  return exit_usage;
}

} // namespace

int main(int argc, char** argv) {
  // loom-launch's own flags come before "--", the cluster binary and its arguments after.
  int split = argc;
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--") {
      split = i;
      break;
    }
  for (int i = 1; i < split; ++i)
    if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") {
      write_all(STDOUT_FILENO, usage_text);
      return 0;
    }

  loom::flags flags("Starts a local cluster of a cluster binary.");
  flags.define_int("ps", 1, "ps tasks")
      .define_int("workers", 1, "worker tasks (worker 0 is the chief)")
      .define_string("host", "127.0.0.1", "the address the tasks listen on")
      .define_float("grace_secs", 10, "seconds between SIGTERM and SIGKILL")
      .define_bool("no_token", false, "start the cluster without a cluster token")
      .define_bool("tls", false, "encrypt the tasks' connections (TLS keyed by the token)");
  try {
    std::vector<const char*> own(argv, argv + split);
    flags.parse(static_cast<int>(own.size()), own.data());
  } catch (const loom::error& e) {
    return usage_error(
        std::string(e.what()) +
        (split == argc ? " (the cluster binary and its arguments go after --)" : ""));
  }
  if (split == argc || split + 1 == argc)
    return usage_error("no cluster binary: give it and its arguments after --, e.g. "
                       "loom-launch --ps 1 --workers 2 -- ./build/examples/counter");

  const std::int64_t n_ps = flags.get_int("ps");
  const std::int64_t n_workers = flags.get_int("workers");
  const double grace = flags.get_float("grace_secs");
  const std::string host = flags.get_string("host");
  if (n_ps < 0)
    return usage_error("--ps=" + std::to_string(n_ps) + ": the number of ps tasks must be >= 0");
  if (n_workers < 1)
    return usage_error("--workers=" + std::to_string(n_workers) +
                       ": a cluster needs at least one worker (worker 0 is the chief)");
  if (n_ps + n_workers > max_tasks)
    return usage_error("--ps + --workers = " + std::to_string(n_ps + n_workers) + ": at most " +
                       std::to_string(max_tasks) + " tasks");
  if (!(grace >= 0) || grace > 86400)
    return usage_error("--grace_secs=" + std::to_string(grace) + ": must be in [0, 86400]");
  if (host.empty())
    return usage_error("--host must not be empty");

  const std::string binary = argv[split + 1];
  std::vector<std::string> args(argv + split + 2, argv + argc);
  for (const std::string& a : args)
    for (const char* own : {"--ps_hosts", "--worker_hosts", "--job_name", "--task_index"})
      if (a == own || a.rfind(std::string(own) + "=", 0) == 0)
        return usage_error("'" + a + "' among the cluster binary's arguments: loom-launch sets " +
                           own + " for every task itself");
  std::string why;
  const auto path = resolve_binary(binary, why);
  if (!path) {
    say("cannot execute '" + binary + "': " + why);
    return exit_cannot_execute;
  }

  const auto token_note = arrange_token(flags.get_bool("no_token"));
  if (!token_note)
    return exit_usage;
  std::string tls_note;
  if (flags.get_bool("tls")) {
    if (flags.get_bool("no_token"))
      return usage_error("--tls keys TLS by the cluster token, and --no_token leaves the cluster "
                         "without one: drop one of them");
    if (::setenv("LOOM_TLS", "1", 1) != 0) {
      say(std::string("cannot set LOOM_TLS: ") + std::strerror(errno));
      return exit_usage;
    }
    tls_note = ", encrypted with TLS keyed by that token (LOOM_TLS=1)";
  }
  if (env_set("LOOM_TLS_CERT")) // certificates win over the token's key (tls_settings.hpp)
    tls_note = ", encrypted with TLS and your certificates (LOOM_TLS_CERT)";

  const auto threads_note = arrange_threads(n_ps + n_workers);
  if (!threads_note)
    return exit_usage;

  install_signal_handlers();
  const auto ports = free_ports(host, static_cast<std::size_t>(n_ps + n_workers));
  std::string ps_hosts, worker_hosts;
  for (std::size_t i = 0; i < ports.size(); ++i) {
    std::string& list = i < static_cast<std::size_t>(n_ps) ? ps_hosts : worker_hosts;
    list += (list.empty() ? "" : ",") + host + ":" + std::to_string(ports[i]);
  }
  say("starting " + std::to_string(n_ps) + " ps and " + std::to_string(n_workers) +
      " worker task(s) of " + binary + " with --ps_hosts=" + ps_hosts + " --worker_hosts=" +
      worker_hosts + "; the cluster is " + *token_note + tls_note + "; " + *threads_note);

  launcher l(binary, *path, std::move(args), grace);
  l.start(ps_hosts, worker_hosts, n_ps, n_workers);
  return l.run();
}

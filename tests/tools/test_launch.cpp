// loom-launch end to end: it runs fake_cluster_task (tests/tools/fake_task.cpp) as a local
// cluster, and the tests check the prefixed output and the flags each task got, the exit
// status in each ending (chief done, a task failing, a task ignoring SIGTERM, SIGINT/SIGTERM
// to the launcher, the launcher killed), that no task outlives it (each fake task prints its
// pid), and the bad-input messages. The token tests run real loom-server tasks: a client
// without the cluster's token is refused, the tasks' own token (read from their environment,
// never their command line) works.
#include "support/process.hpp"

#include <loom/loom.hpp>

#include <doctest/doctest.h>

#include <sched.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace lt = loom::testing;
using namespace std::chrono_literals;

const std::string launch_bin = LOOM_LAUNCH_BIN;
const std::string fake_bin = LOOM_FAKE_TASK_BIN;
const std::string server_bin = LOOM_SERVER_BIN;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    out.push_back(line);
  return out;
}

// A fresh, empty directory under the test's binary directory.
std::string fresh_dir(const std::string& name) {
  static std::atomic<int> counter{0};
  const auto dir =
      std::filesystem::path(LOOM_TEST_BINARY_DIR) /
      ("launch_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// The pid each fake task printed ("[job:i] fake job=J task=I pid=P ..."), by "job:i".
// (No std::regex on whole lines: libstdc++'s recursion overflows on the long ones.)
std::map<std::string, pid_t> task_pids(const std::string& output) {
  std::map<std::string, pid_t> pids;
  for (const auto& line : lines_of(output)) {
    const auto close = line.find("] fake job=");
    const auto at = line.find(" pid=");
    if (line.empty() || line[0] != '[' || close == std::string::npos || at == std::string::npos)
      continue;
    pids[line.substr(1, close - 1)] = static_cast<pid_t>(std::stol(line.substr(at + 5)));
  }
  return pids;
}

// True when `pid` no longer exists (a zombie counts as gone when `zombie_ok`: a task
// reparented to an init that does not reap).
bool gone(pid_t pid, bool zombie_ok = false) {
  if (::kill(pid, 0) != 0)
    return errno == ESRCH;
  if (!zombie_ok)
    return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close_paren = text.rfind(')');
  return close_paren != std::string::npos && close_paren + 2 < text.size() &&
         text[close_paren + 2] == 'Z';
}

// Every task in `expected` printed its pid, and none of them exists any more.
void expect_all_gone(const std::string& output, const std::vector<std::string>& expected,
                     bool zombie_ok = false, std::chrono::milliseconds patience = 0ms) {
  const auto pids = task_pids(output);
  INFO(output);
  for (const auto& name : expected) {
    const auto it = pids.find(name);
    REQUIRE_MESSAGE(it != pids.end(), name << " printed no pid");
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (!gone(it->second, zombie_ok) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(10ms);
    CHECK_MESSAGE(gone(it->second, zombie_ok), name << " (pid " << it->second << ") is left");
  }
}

lt::exit_status expect_exit(lt::child& c, int code, std::chrono::milliseconds timeout = 60s) {
  const auto st = c.wait(timeout);
  INFO(c.report());
  REQUIRE_MESSAGE(st.has_value(), "loom-launch did not exit in time");
  CHECK(st->exited);
  CHECK(st->code == code);
  return *st;
}

std::vector<std::string> launch_args(int ps, int workers, double grace,
                                     std::vector<std::string> task_args) {
  std::vector<std::string> args = {
      "--ps",         std::to_string(ps),    "--workers", std::to_string(workers),
      "--grace_secs", std::to_string(grace), "--",        fake_bin};
  args.insert(args.end(), task_args.begin(), task_args.end());
  return args;
}

std::vector<std::string> names(int ps, int workers) {
  std::vector<std::string> out;
  for (int i = 0; i < ps; ++i)
    out.push_back("ps:" + std::to_string(i));
  for (int i = 0; i < workers; ++i)
    out.push_back("worker:" + std::to_string(i));
  return out;
}

void wait_ready(const lt::child& c, const std::vector<std::string>& tasks) {
  for (const auto& t : tasks)
    REQUIRE_MESSAGE(c.wait_for_output("[" + t + "] fake ready " + t + "\n", 60s), c.report());
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep))
    out.push_back(part);
  return out;
}

} // namespace

TEST_CASE("loom-launch: every task gets its flags, every line its prefix, whole") {
  const std::string dir = fresh_dir("lines");
  const std::string marker = dir + "/chief_done";
  lt::child launch(launch_bin,
                   launch_args(1, 2, 30,
                               {"--marker=" + marker, "--extra=hello world", "--chatter=40",
                                "--long_line=100000", "--tail=tail-without-newline"}));
  const auto started = std::chrono::steady_clock::now();
  expect_exit(launch, 0);
  const auto elapsed = std::chrono::steady_clock::now() - started;
  const std::string out = launch.output();
  INFO(out);

  // The ps exits once the chief is done: nobody is stopped, long before the grace period.
  CHECK_FALSE(contains(out, "still running"));
  CHECK(elapsed < 25s);

  std::set<std::string> ports;
  std::string ps_hosts, worker_hosts;
  for (const auto& t : names(1, 2)) {
    const auto job = t.substr(0, t.find(':'));
    const auto index = t.substr(t.find(':') + 1);
    const std::regex start("^\\[" + job + ":" + index + "\\] fake job=" + job + " task=" + index +
                           " pid=\\d+ ps_hosts=(\\S*) worker_hosts=(\\S*) args=(.*)$");
    bool found = false;
    for (const auto& line : lines_of(out)) {
      std::smatch m;
      if (line.size() > 4096 || !std::regex_match(line, m, start))
        continue;
      found = true;
      // The user's arguments first (one argument with a space stays one), then the cluster's.
      CHECK(contains(m[3], "--marker=" + marker + " --extra=hello world --chatter=40"));
      CHECK(contains(m[3], "--ps_hosts=" + std::string(m[1]) +
                               " --worker_hosts=" + std::string(m[2]) + " --job_name=" + job +
                               " --task_index=" + index));
      if (ps_hosts.empty()) {
        ps_hosts = m[1];
        worker_hosts = m[2];
      }
      CHECK(m[1] == ps_hosts); // every task sees the same cluster
      CHECK(m[2] == worker_hosts);
    }
    CHECK_MESSAGE(found, t << " printed no start line");
    CHECK(contains(out, "[" + t + "] fake stderr " + t + "\n")); // stderr, prefixed too
    CHECK(contains(out, "[" + t + "] tail-without-newline\n"));  // the last, unfinished line
    // The 100000-character line, written in pieces while the others write, is one line.
    std::string long_line = "L" + t + ":";
    long_line.resize(100000, 'x');
    CHECK(contains(out, "\n[" + t + "] " + long_line + "\n"));
    for (int k = 0; k < 40; ++k)
      CHECK(contains(out, "\n[" + t + "] chatter " + t + " " + std::to_string(k) + " end\n"));
  }
  // One ps and two workers, all on distinct loopback ports.
  const auto ps = split(ps_hosts, ',');
  const auto workers = split(worker_hosts, ',');
  REQUIRE(ps.size() == 1);
  REQUIRE(workers.size() == 2);
  for (const auto& h : {ps[0], workers[0], workers[1]}) {
    CHECK(h.rfind("127.0.0.1:", 0) == 0);
    const int port = std::stoi(h.substr(h.find(':') + 1));
    CHECK(port > 0);
    CHECK(port < 65536);
    ports.insert(h);
  }
  CHECK(ports.size() == 3);

  // Every line is one task's (with its own name after the prefix) or the launcher's.
  const std::set<std::string> known = {"ps:0", "worker:0", "worker:1"};
  for (const auto& line : lines_of(out)) {
    if (line.rfind("loom-launch: ", 0) == 0)
      continue;
    const auto close = line.find("] ");
    REQUIRE_MESSAGE((!line.empty() && line[0] == '[' && close != std::string::npos),
                    "a line without a prefix: " << line.substr(0, 200));
    const std::string name = line.substr(1, close - 1);
    REQUIRE_MESSAGE(known.count(name) == 1, "a line without a prefix: " << line.substr(0, 200));
    const std::string rest = line.substr(close + 2);
    CHECK_FALSE(contains(rest, "[ps:"));
    CHECK_FALSE(contains(rest, "[worker:"));
    if (rest.rfind("chatter ", 0) == 0 || rest.rfind("fake ready ", 0) == 0 ||
        rest.rfind("fake stderr ", 0) == 0)
      CHECK_MESSAGE(contains(rest, " " + name + (rest[0] == 'c' ? " " : "")), line);
    if (rest.rfind("L", 0) == 0)
      CHECK(rest.rfind("L" + name + ":", 0) == 0);
  }
  expect_all_gone(out, names(1, 2));
  std::filesystem::remove_all(dir);
}

TEST_CASE("loom-launch: after the chief exits 0, stragglers are stopped after the grace period") {
  // Without --marker a ps serves until it is stopped (TF's ps never exits on its own). The
  // chief exits once every task is up (so the ps tasks handle SIGTERM).
  const std::string dir = fresh_dir("stragglers");
  lt::child launch(launch_bin, launch_args(2, 2, 2, {"--ready_dir=" + dir, "--tasks=4"}));
  expect_exit(launch, 0);
  const std::string out = launch.output();
  INFO(out);
  CHECK(contains(out, "the chief worker:0 exited with status 0"));
  CHECK(contains(out, "ps:0, ps:1 still running 2s after the chief finished"));
  CHECK(contains(out, "[ps:0] fake got SIGTERM"));
  CHECK(contains(out, "[ps:1] fake got SIGTERM"));
  CHECK_FALSE(contains(out, "[worker:1] fake got SIGTERM")); // it had finished on its own
  CHECK_FALSE(contains(out, "SIGKILL"));
  expect_all_gone(out, names(2, 2));
  std::filesystem::remove_all(dir);
}

TEST_CASE("loom-launch: a failing task stops the cluster and gives its status") {
  const std::string dir = fresh_dir("fail");
  const std::vector<std::string> common = {"--forever", "--ready_dir=" + dir, "--tasks=4"};
  struct failure {
    std::string flag, task;
    int code;
    std::string message;
  };
  const failure cases[] = {
      {"--fail_task=worker:1", "worker:1", 3, "worker:1 exited with status 3; stopping "},
      {"--signal_task=ps:0", "ps:0", 128 + SIGUSR1,
       "ps:0 was killed by signal " + std::to_string(SIGUSR1)},
      {"--fail_task=worker:0", "worker:0", 3, "worker:0 exited with status 3"},
  };
  for (const auto& f : cases) {
    CAPTURE(f.flag);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    auto args = common;
    args.push_back(f.flag);
    lt::child launch(launch_bin, launch_args(1, 3, 20, args));
    const auto started = std::chrono::steady_clock::now();
    expect_exit(launch, f.code);
    const std::string out = launch.output();
    INFO(out);
    CHECK(contains(out, "loom-launch: " + f.message));
    CHECK(std::chrono::steady_clock::now() - started < 15s); // SIGTERM sufficed
    for (const auto& t : names(1, 3))
      if (t != f.task)
        CHECK_MESSAGE(contains(out, "[" + t + "] fake got SIGTERM"), t);
    CHECK_FALSE(contains(out, "[" + f.task + "] fake got SIGTERM"));
    expect_all_gone(out, names(1, 3));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("loom-launch: a task that ignores SIGTERM gets SIGKILL after the grace period") {
  const std::string dir = fresh_dir("hang");
  lt::child launch(launch_bin, launch_args(1, 2, 1,
                                           {"--forever", "--ready_dir=" + dir, "--tasks=3",
                                            "--hang=ps:0", "--fail_task=worker:1"}));
  const auto started = std::chrono::steady_clock::now();
  expect_exit(launch, 3);
  const auto elapsed = std::chrono::steady_clock::now() - started;
  const std::string out = launch.output();
  INFO(out);
  CHECK(contains(out, "[ps:0] fake ignoring SIGTERM"));
  CHECK(contains(out, "[worker:0] fake got SIGTERM"));
  CHECK(contains(out, "loom-launch: ps:0 still running 1s after SIGTERM; sending SIGKILL"));
  CHECK(elapsed >= 1s);
  CHECK(elapsed < 30s);
  expect_all_gone(out, names(1, 2));
  std::filesystem::remove_all(dir);
}

TEST_CASE("loom-launch: SIGINT or SIGTERM to the launcher stops every task") {
  struct signal_case {
    int sig;
    int code;
    std::string name;
    std::vector<std::string> extra;
  };
  const signal_case cases[] = {
      {SIGINT, 130, "SIGINT", {}},
      {SIGTERM, 143, "SIGTERM", {}},
      {SIGINT, 130, "SIGINT", {"--hang=worker:1"}},
  };
  for (const auto& s : cases) {
    CAPTURE(s.name);
    CAPTURE(s.extra.size());
    std::vector<std::string> args = {"--forever"};
    args.insert(args.end(), s.extra.begin(), s.extra.end());
    lt::child launch(launch_bin, launch_args(1, 2, 1, args));
    wait_ready(launch, names(1, 2));
    REQUIRE(::kill(launch.pid(), s.sig) == 0);
    expect_exit(launch, s.code);
    const std::string out = launch.output();
    INFO(out);
    CHECK(contains(out, "loom-launch: got " + s.name + "; stopping every task"));
    for (const auto& t : names(1, 2))
      if (s.extra.empty() || t != "worker:1")
        CHECK_MESSAGE(contains(out, "[" + t + "] fake got SIGTERM"), t);
    if (!s.extra.empty())
      CHECK(contains(out, "loom-launch: worker:1 still running 1s after SIGTERM; sending SIGKILL"));
    expect_all_gone(out, names(1, 2));
  }
}

TEST_CASE("loom-launch: killing the launcher kills its tasks (PR_SET_PDEATHSIG)") {
  lt::child launch(launch_bin, launch_args(1, 2, 10, {"--forever"}));
  wait_ready(launch, names(1, 2));
  launch.kill(); // SIGKILL: no chance to stop anything itself
  // The tasks are reparented (and maybe never reaped): a zombie counts as gone.
  expect_all_gone(launch.output(), names(1, 2), /*zombie_ok=*/true, 10s);
}

TEST_CASE("loom-launch: bad input gives one clear message") {
  struct bad {
    std::vector<std::string> args;
    int code;
    std::string message;
  };
  const std::string not_executable = std::string(LOOM_TEST_SOURCE_DIR) + "/CMakeLists.txt";
  const bad cases[] = {
      {{}, 2, "no cluster binary"},
      {{"--ps", "1", "--workers", "2"}, 2, "no cluster binary"},
      {{"--ps", "1", "--"}, 2, "no cluster binary"},
      {{"--ps", "1", fake_bin}, 2, "the cluster binary and its arguments go after --"},
      {{"--workers", "0", "--", fake_bin}, 2, "--workers=0: a cluster needs at least one worker"},
      {{"--ps", "-1", "--", fake_bin}, 2, "--ps=-1: the number of ps tasks must be >= 0"},
      {{"--ps", "x", "--", fake_bin}, 2, "--ps=x"},
      {{"--grace_secs", "-1", "--", fake_bin}, 2, "--grace_secs"},
      {{"--bogus", "--", fake_bin}, 2, "unknown flag --bogus"},
      {{"--", fake_bin, "--job_name=ps"}, 2, "loom-launch sets --job_name"},
      {{"--", "/nonexistent/cluster_binary"},
       127,
       "cannot execute '/nonexistent/cluster_binary': No such file or directory"},
      {{"--", not_executable}, 127, "cannot execute '" + not_executable + "': not executable"},
      {{"--", "no-such-loom-cluster-binary"},
       127,
       "cannot execute 'no-such-loom-cluster-binary': not found in PATH"},
  };
  for (const auto& b : cases) {
    std::string joined;
    for (const auto& a : b.args)
      joined += " " + a;
    CAPTURE(joined);
    lt::child launch(launch_bin, b.args);
    expect_exit(launch, b.code, 30s);
    const std::string out = launch.output();
    INFO(out);
    CHECK(out.rfind("loom-launch: ", 0) == 0);
    CHECK(contains(out, b.message));
    CHECK_FALSE(contains(out, "starting")); // nothing was started
    CHECK(task_pids(out).empty());
  }

  lt::child help(launch_bin, {"--ps", "2", "--help", "--", fake_bin});
  expect_exit(help, 0, 30s);
  CHECK(contains(help.output(), "usage: loom-launch [--ps N] [--workers N]"));
  CHECK(task_pids(help.output()).empty());
}

// ---------------------------------------------------------------------------------------------
// The cluster token
// ---------------------------------------------------------------------------------------------
namespace {

// A /proc file of `pid` whose entries are separated by NULs (cmdline, environ).
std::vector<std::string> proc_entries(pid_t pid, const std::string& file) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + file, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return split(text, '\0');
}

std::optional<std::string> env_of(pid_t pid, const std::string& name) {
  for (const auto& kv : proc_entries(pid, "environ"))
    if (kv.rfind(name + "=", 0) == 0)
      return kv.substr(name.size() + 1);
  return std::nullopt;
}

// The processes whose parent is `parent` (loom-launch's tasks).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos)
      continue;
    std::ifstream stat(entry.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const auto close_paren = text.rfind(')');
    if (close_paren == std::string::npos)
      continue;
    std::istringstream rest(text.substr(close_paren + 2));
    std::string state;
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent)
      out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

bool is_hex_token(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// No token and no token file in the environment loom-launch (or a task) starts with.
lt::env_overrides without_token(lt::env_overrides env = {}) {
  env.emplace("LOOM_CLUSTER_TOKEN", std::nullopt);
  env.emplace("LOOM_CLUSTER_TOKEN_FILE", std::nullopt);
  return env;
}

// The LOOM_CLUSTER_TOKEN of every fake task of a running launch (nullopt: none), after
// checking that it is on no task's command line and not in the launch's output.
std::map<std::string, std::optional<std::string>> task_tokens(const lt::child& launch, int ps,
                                                              int workers) {
  std::map<std::string, std::optional<std::string>> tokens;
  const auto pids = task_pids(launch.output());
  for (const auto& t : names(ps, workers)) {
    const auto it = pids.find(t);
    REQUIRE_MESSAGE(it != pids.end(), t << " printed no pid");
    tokens[t] = env_of(it->second, "LOOM_CLUSTER_TOKEN");
    if (tokens[t]) {
      for (const auto& arg : proc_entries(it->second, "cmdline"))
        CHECK_MESSAGE(!contains(arg, *tokens[t]), t << "'s command line holds the token");
      CHECK_FALSE(contains(launch.output(), *tokens[t])); // nor is it printed
    }
  }
  return tokens;
}

// "[ps:0] loom-server: serving /job:ps/task:0 at loom://127.0.0.1:P" -> "loom://127.0.0.1:P".
std::string served_target(const lt::child& c, const std::string& prefix, const std::string& job,
                          int task) {
  const std::string line =
      prefix + "loom-server: serving /job:" + job + "/task:" + std::to_string(task) + " at ";
  REQUIRE_MESSAGE(c.wait_for_output(line, 60s), c.report());
  const std::string out = c.output();
  const auto at = out.find(line) + line.size();
  return out.substr(at, out.find('\n', at) - at);
}

loom::cluster_session_options client_with(std::string token) {
  loom::cluster_session_options o;
  o.token = std::move(token); // "" = none, whatever the test's environment holds
  o.connect_timeout = 10s;
  o.quiet = true;
  return o;
}

// One increment of a counter on /job:ps/task:0 (or on the only task when `on_ps` is false)
// through `target`; throws what the session throws.
float increment(const std::string& target, const std::string& token, bool on_ps) {
  loom::graph g;
  auto c = [&] {
    auto _ = g.device(on_ps ? "/job:ps/task:0" : "/job:worker/task:0");
    return loom::get_variable<float, 0>(g, "counter", loom::shape{}, loom::constant_initializer{0});
  }();
  auto step = c.assign(c + 1.0f);
  loom::session sess(g, target, client_with(token));
  sess.run(c.initializer());
  return static_cast<float>(sess.run(step));
}

// Runs `call` and checks that it fails as a client without the right token does.
template <class F> void expect_refused(F&& call, const std::string& what) {
  CAPTURE(what);
  try {
    call();
    FAIL("a client without the cluster token was served");
  } catch (const loom::error& e) {
    INFO(e.what());
    CHECK(e.code() == loom::error_code::unauthenticated);
    CHECK(contains(e.what(), "token"));
  }
}

} // namespace

TEST_CASE("loom-launch: a generated token in every task's environment, on no command line") {
  std::set<std::string> seen;
  for (int run = 0; run < 2; ++run) {
    lt::child launch(launch_bin, launch_args(1, 2, 1, {"--forever"}), without_token());
    wait_ready(launch, names(1, 2));
    const auto tokens = task_tokens(launch, 1, 2);
    INFO(launch.output());
    CHECK(contains(launch.output(), "the cluster is authenticated with a cluster token "
                                    "generated for it"));
    for (const auto& [t, token] : tokens) {
      REQUIRE_MESSAGE(token.has_value(), t << " has no LOOM_CLUSTER_TOKEN");
      CHECK(is_hex_token(*token));
      CHECK(*token == *tokens.begin()->second); // one token per cluster
    }
    seen.insert(*tokens.begin()->second);
    REQUIRE(::kill(launch.pid(), SIGTERM) == 0);
    expect_exit(launch, 143);
    expect_all_gone(launch.output(), names(1, 2));
  }
  CHECK(seen.size() == 2); // a fresh token for every cluster
}

TEST_CASE("loom-launch: each task's kernels get its share of the host's cores, or the user's "
          "LOOM_INTRA_OP_THREADS") {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(::sched_getaffinity(0, sizeof set, &set) == 0);
  const int cores = CPU_COUNT(&set); // the tasks inherit this process's affinity
  const std::string share = std::to_string(std::max(1, cores / 3));
  struct threads_case {
    std::optional<std::string> user;
    std::string want, banner;
  };
  const threads_case cases[] = {
      {std::nullopt, share,
       "each task's kernels use " + share + " thread(s), its share of " + std::to_string(cores) +
           " core(s) (LOOM_INTRA_OP_THREADS)"},
      {"5", "5", "each task's kernels use your LOOM_INTRA_OP_THREADS=5 thread(s)"}};
  for (const auto& c : cases) {
    CAPTURE(c.want);
    lt::child launch(launch_bin, launch_args(1, 2, 1, {"--forever"}),
                     {{"LOOM_INTRA_OP_THREADS", c.user}});
    wait_ready(launch, names(1, 2));
    INFO(launch.output());
    CHECK(contains(launch.output(), c.banner));
    const auto pids = task_pids(launch.output());
    for (const auto& t : names(1, 2)) {
      const auto it = pids.find(t);
      REQUIRE_MESSAGE(it != pids.end(), t << " printed no pid");
      CHECK_MESSAGE(env_of(it->second, "LOOM_INTRA_OP_THREADS") == c.want, t);
    }
    REQUIRE(::kill(launch.pid(), SIGTERM) == 0);
    expect_exit(launch, 143);
    expect_all_gone(launch.output(), names(1, 2));
  }
}

TEST_CASE("loom-launch: the user's token or token file is kept; --no_token starts without one") {
  const std::string dir = fresh_dir("token");
  const std::string token_file = dir + "/token";
  std::ofstream(token_file) << "file-secret\n";
  struct token_case {
    std::string name;
    lt::env_overrides env;
    std::vector<std::string> launch_flags;
    std::optional<std::string> task_token, task_token_file;
    std::string banner;
  };
  const token_case cases[] = {
      {"LOOM_CLUSTER_TOKEN",
       without_token({{"LOOM_CLUSTER_TOKEN", "user-secret"}}),
       {},
       "user-secret",
       std::nullopt,
       "the cluster is authenticated with your LOOM_CLUSTER_TOKEN"},
      {"LOOM_CLUSTER_TOKEN_FILE",
       without_token({{"LOOM_CLUSTER_TOKEN_FILE", token_file}}),
       {},
       std::nullopt,
       token_file,
       "the cluster is authenticated with the token in your LOOM_CLUSTER_TOKEN_FILE"},
      {"--no_token",
       without_token(),
       {"--no_token"},
       std::nullopt,
       std::nullopt,
       "the cluster is without a cluster token (--no_token)"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    auto args = launch_args(1, 1, 1, {"--forever"});
    args.insert(args.begin(), c.launch_flags.begin(), c.launch_flags.end());
    lt::child launch(launch_bin, args, c.env);
    wait_ready(launch, names(1, 1));
    const auto tokens = task_tokens(launch, 1, 1);
    const auto pids = task_pids(launch.output());
    INFO(launch.output());
    CHECK(contains(launch.output(), c.banner));
    for (const auto& [t, token] : tokens) {
      CAPTURE(t);
      CHECK(token == c.task_token);
      CHECK(env_of(pids.at(t), "LOOM_CLUSTER_TOKEN_FILE") == c.task_token_file);
    }
    REQUIRE(::kill(launch.pid(), SIGTERM) == 0);
    expect_exit(launch, 143);
    expect_all_gone(launch.output(), names(1, 1));
  }

  // --no_token beside a token the user set is a contradiction, not a guess.
  auto args = launch_args(1, 1, 1, {});
  args.insert(args.begin(), "--no_token");
  lt::child both(launch_bin, args, without_token({{"LOOM_CLUSTER_TOKEN", "user-secret"}}));
  expect_exit(both, 2, 30s);
  CHECK(contains(both.output(), "--no_token, but LOOM_CLUSTER_TOKEN is set"));
  CHECK(task_pids(both.output()).empty());
  std::filesystem::remove_all(dir);
}

TEST_CASE("loom-launch --tls: LOOM_TLS=1 beside the token in every task's environment") {
  auto args = launch_args(1, 2, 1, {"--forever"});
  args.insert(args.begin(), "--tls");
  lt::child launch(launch_bin, args, without_token({{"LOOM_TLS", std::nullopt}}));
  wait_ready(launch, names(1, 2));
  INFO(launch.output());
  CHECK(contains(launch.output(), "encrypted with TLS keyed by that token (LOOM_TLS=1)"));
  const auto pids = task_pids(launch.output());
  for (const auto& t : names(1, 2)) {
    REQUIRE_MESSAGE(pids.count(t), t << " printed no pid");
    CHECK_MESSAGE(env_of(pids.at(t), "LOOM_TLS") == std::optional<std::string>("1"), t);
    CHECK_MESSAGE(env_of(pids.at(t), "LOOM_CLUSTER_TOKEN").has_value(), t);
  }
  REQUIRE(::kill(launch.pid(), SIGTERM) == 0);
  expect_exit(launch, 143);
  expect_all_gone(launch.output(), names(1, 2));

  // TLS keyed by the token without a token is a contradiction: a usage error, no task.
  args = launch_args(1, 1, 1, {});
  args.insert(args.begin(), {"--tls", "--no_token"});
  lt::child both(launch_bin, args, without_token());
  expect_exit(both, 2, 30s);
  CHECK(contains(both.output(), "--tls keys TLS by the cluster token, and --no_token"));
  CHECK(task_pids(both.output()).empty());
}

TEST_CASE("loom-launch: a launched cluster refuses a client without its token") {
  lt::child launch(launch_bin,
                   {"--ps", "1", "--workers", "1", "--grace_secs", "5", "--", server_bin},
                   without_token());
  const std::string ps = served_target(launch, "[ps:0] ", "ps", 0);
  const std::string worker = served_target(launch, "[worker:0] ", "worker", 0);
  INFO(launch.report());

  for (const std::string& token : {std::string(), std::string("not-the-cluster-token")}) {
    CAPTURE(token);
    for (const auto& target : {ps, worker}) {
      expect_refused([&] { increment(target, token, true); }, "an op through " + target);
      expect_refused([&] { loom::session::shutdown_cluster(target, {}, client_with(token)); },
                     "loom.shutdown through " + target);
    }
  }
  // Refused peers changed nothing: the tasks still serve, with their own token.
  const auto tasks = children_of(launch.pid());
  REQUIRE(tasks.size() == 2);
  std::optional<std::string> token;
  for (pid_t pid : tasks) {
    const auto t = env_of(pid, "LOOM_CLUSTER_TOKEN");
    REQUIRE(t.has_value());
    CHECK(is_hex_token(*t));
    for (const auto& arg : proc_entries(pid, "cmdline"))
      CHECK_FALSE(contains(arg, *t));
    token = t;
  }
  CHECK(increment(worker, *token, true) == 1.0f);
  CHECK(increment(worker, *token, true) == 1.0f); // initialized again, then one step
  const auto report = loom::session::shutdown_cluster(worker, {}, client_with(*token));
  CHECK(report.all_stopped());
  expect_exit(launch, 0);
  const std::string out = launch.output();
  CHECK_FALSE(contains(out, *token));
  CHECK_FALSE(contains(out, "without a cluster token"));
  for (pid_t pid : tasks)
    CHECK(gone(pid, true));
}

TEST_CASE("loom-server started by hand (TF_CONFIG) reads its token from LOOM_CLUSTER_TOKEN_FILE") {
  const std::string dir = fresh_dir("token_file");
  const std::string token_file = dir + "/cluster.token";
  std::ofstream(token_file) << "secret-from-a-file\n"; // trailing whitespace is trimmed
  ::chmod(token_file.c_str(), 0600);
  // A one-task cluster on a port the OS chooses, as Slurm or Kubernetes starts a task.
  const std::string tf_config =
      R"({"cluster": {"worker": ["127.0.0.1:0"]}, "task": {"type": "worker", "index": 0}})";
  lt::child server(
      server_bin, {},
      without_token({{"TF_CONFIG", tf_config}, {"LOOM_CLUSTER_TOKEN_FILE", token_file}}));
  const std::string target = served_target(server, "", "worker", 0);
  INFO(server.report());
  expect_refused([&] { increment(target, "", false); }, "an op without a token");
  expect_refused([&] { loom::session::shutdown_cluster(target, {}, client_with("")); },
                 "loom.shutdown without a token");
  CHECK(increment(target, "secret-from-a-file", false) == 1.0f);
  CHECK(
      loom::session::shutdown_cluster(target, {}, client_with("secret-from-a-file")).all_stopped());
  expect_exit(server, 0);
  CHECK_FALSE(contains(server.output(), "without a cluster token"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a tokenless server says once that any local user can connect") {
  const std::string tf_config =
      R"({"cluster": {"worker": ["127.0.0.1:0"]}, "task": {"type": "worker", "index": 0}})";
  lt::child server(server_bin, {}, without_token({{"TF_CONFIG", tf_config}}));
  const std::string target = served_target(server, "", "worker", 0);
  CHECK(increment(target, "", false) == 1.0f);
  CHECK(loom::session::shutdown_cluster(target, {}, client_with("")).all_stopped());
  expect_exit(server, 0);
  const std::string out = server.output();
  INFO(out);
  const std::string line = "loom: serving 127.0.0.1:" + target.substr(target.rfind(':') + 1) +
                           " without a cluster token: any local user can connect";
  CHECK(contains(out, line));
  CHECK(out.find("without a cluster token") == out.rfind("without a cluster token")); // once
}

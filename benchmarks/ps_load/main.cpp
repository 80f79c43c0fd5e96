// One ps variable under load from client processes (issue #20 item 10), in full; the test
// (tests/distributed/test_ps_load.cpp, ctest ps_load) runs it shortened. The program runs
// itself as every process: --role=ps serves the ps task (a loom::server on 127.0.0.1, port
// chosen by the OS, with a cluster token), and the client roles of tests/support/ps_load.hpp
// each run in a process of their own, on loopback. Parts:
//   1. baseline: `clients` processes making raw RPC round trips to the ps for
//      --baseline_seconds (loom.cluster_info, answered by the task itself: the message layer,
//      the connection and the io threads, without a graph, a partition or a kernel);
//   2. one client running assign_add(1) for --baseline_seconds (the step's latency);
//   3. the load: `clients` processes running assign_add(1) on one int64 variable for
//      --seconds while --readers more read it. The final value must equal the sum of the
//      increments whose run returned (acknowledged), with no run failed and every client's
//      own adds returning strictly increasing values (else the program exits 1);
//   4. --sessions sessions opened and closed one after another (a quarter to warm up): the
//      ps's RSS (/proc/<pid>/status) after the warm-up and after the rest.
// Printed: medians over the 1-second windows of each part (this machine is small and noisy)
// and the load's ratios to both baselines, measured in the same run against the same ps.
// The ratio to part 1 says what share of the message layer's round trips a graph step keeps;
// to part 2, how far 16 clients scale over one.
//
// Flags: --seconds (60), --baseline_seconds (10), --clients (16), --readers (4), --sessions
// (400); --smoke: every part at its smallest (4 clients, 1 s, 40 sessions), a test that it
// still runs (ctest bench_ps_load_smoke) whose figures mean nothing.
#include <support/process.hpp>
#include <support/ps_load.hpp>

#include <loom/loom.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace lt = loom::testing;
namespace pl = loom::testing::ps_load;
using namespace std::chrono_literals;

std::string self_path() {
  char buf[4096];
  const auto n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0)
    throw std::runtime_error("ps_load: cannot read /proc/self/exe");
  return std::string(buf, static_cast<std::size_t>(n));
}

std::string fresh_token() {
  std::random_device rd;
  std::string t = "ps-load-";
  for (int i = 0; i < 4; ++i)
    t += std::to_string(rd());
  return t;
}

long rss_kib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0)
      return std::stol(line.substr(6));
  throw std::runtime_error("ps_load: no VmRSS in /proc/" + std::to_string(pid) + "/status");
}

// The ps process of this run and how its clients reach it.
struct ps_process {
  std::string token = fresh_token();
  lt::env_overrides env{{"LOOM_CLUSTER_TOKEN", token}, {"LOOM_CLUSTER_TOKEN_FILE", std::nullopt}};
  lt::child process{self_path(), {"--role=ps"}, env};
  std::string target;

  ps_process() {
    if (!process.wait_for_output("ps_load ps serving ", 30s))
      throw std::runtime_error("the ps did not start: " + process.report());
    std::smatch m;
    const std::string out = process.output();
    if (!std::regex_search(out, m, std::regex("serving (loom://[0-9.]+:[0-9]+)")))
      throw std::runtime_error("no target in the ps's output: " + out);
    target = m[1];
  }
  loom::cluster_session_options options() const {
    auto o = pl::client_options();
    o.token = token;
    return o;
  }
  std::int64_t counter() const {
    pl::counter_graph m;
    loom::session sess(m.g, target, options());
    return sess.run(m.counter);
  }
};

struct part_result {
  std::vector<pl::role_result> clients;
  std::uint64_t acknowledged = 0, failed = 0, anomalies = 0;
  std::string first_error;
  double median_per_second = 0, mean_per_second = 0;
};

// Runs `n` clients of `role` (and `readers` readers beside them) for `seconds`, all starting
// at once; sums their counts per 1-second window (of the first role only).
// `lead`: time for them all to start and connect before their loops begin.
part_result run_clients(const ps_process& ps, const std::string& role, int n, int readers,
                        double seconds, std::chrono::milliseconds lead,
                        part_result* reads = nullptr) {
  const auto start_at = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch() + lead)
                            .count();
  std::vector<std::unique_ptr<lt::child>> children;
  for (int i = 0; i < n + readers; ++i)
    children.push_back(std::make_unique<lt::child>(
        self_path(),
        std::vector<std::string>{"--role=" + std::string(i < n ? role : "read"),
                                 "--target=" + ps.target, "--seconds=" + std::to_string(seconds),
                                 "--start_at_ms=" + std::to_string(start_at)},
        ps.env));
  part_result main, side;
  for (int i = 0; i < n + readers; ++i) {
    auto& c = *children[static_cast<std::size_t>(i)];
    const auto st = c.wait(std::chrono::milliseconds(static_cast<long>(seconds * 1000) + 120000));
    if (!st || !st->success())
      throw std::runtime_error("a client failed: " + c.report());
    auto& into = i < n ? main : side;
    into.clients.push_back(pl::parse_result(c.output()));
  }
  for (part_result* p : {&main, &side}) {
    std::vector<std::uint64_t> windows;
    for (const auto& r : p->clients) {
      p->acknowledged += r.acknowledged;
      p->failed += r.failed;
      p->anomalies += r.anomalies;
      if (p->first_error.empty())
        p->first_error = r.first_error;
      windows.resize(std::max(windows.size(), r.per_second.size()));
      for (std::size_t w = 0; w < r.per_second.size(); ++w)
        windows[w] += r.per_second[w];
    }
    if (!windows.empty()) {
      std::vector<std::uint64_t> sorted = windows;
      std::nth_element(sorted.begin(), sorted.begin() + static_cast<long>(sorted.size() / 2),
                       sorted.end());
      p->median_per_second = static_cast<double>(sorted[sorted.size() / 2]);
    }
    p->mean_per_second = static_cast<double>(p->acknowledged) / seconds;
  }
  if (reads)
    *reads = side;
  return main;
}

pl::role_result run_sessions(const ps_process& ps, int count) {
  lt::child c(self_path(),
              {"--role=sessions", "--target=" + ps.target, "--count=" + std::to_string(count)},
              ps.env);
  const auto st = c.wait(600s);
  if (!st || !st->success())
    throw std::runtime_error("the sessions client failed: " + c.report());
  return pl::parse_result(c.output());
}

int serve_ps() {
  loom::server ps(loom::cluster_spec{{"ps", loom::cluster_spec::job_def({"127.0.0.1:0"})}}, "ps",
                  0);
  std::printf("ps_load ps serving %s\n", ps.target().c_str());
  std::fflush(stdout);
  ps.join();
  return 0;
}

} // namespace

int main(int argc, char** argv) try {
  loom::flags flags("One ps variable under load from client processes (issue #20 item 10).");
  flags.define_string("role", "", "Internal: ps, increment, read, sessions or ping")
      .define_string("target", "", "Internal: the ps's target")
      .define_int("start_at_ms", 0, "Internal: when a client's loop starts")
      .define_int("count", 0, "Internal: sessions a sessions client opens")
      .define_float("seconds", 60, "How long the load runs")
      .define_float("baseline_seconds", 10, "How long each baseline runs")
      .define_int("clients", 16, "Client processes running assign_add (and the raw baseline)")
      .define_int("readers", 4, "Client processes reading the variable beside them")
      .define_int("sessions", 400, "Sessions opened and closed (a quarter to warm up)")
      .define_bool("smoke", false, "Every part at its smallest; the figures mean nothing");
  if (!flags.parse(argc, argv))
    return 0;
  const std::string role = flags.get_string("role");
  if (role == "ps")
    return serve_ps();
  if (!role.empty()) {
    pl::role_args a;
    a.role = role;
    a.target = flags.get_string("target");
    a.seconds = flags.get_float("seconds");
    a.start_at_ms = flags.get_int("start_at_ms");
    a.count = static_cast<int>(flags.get_int("count"));
    std::printf("%s\n", pl::run_role(a).line().c_str());
    return 0;
  }

  const bool smoke = flags.get_bool("smoke");
  const double seconds = smoke ? 1 : flags.get_float("seconds");
  const double baseline_seconds = smoke ? 1 : flags.get_float("baseline_seconds");
  const int clients = smoke ? 4 : static_cast<int>(flags.get_int("clients"));
  const int readers = smoke ? 1 : static_cast<int>(flags.get_int("readers"));
  const int sessions = smoke ? 40 : static_cast<int>(flags.get_int("sessions"));
  if (seconds <= 0 || baseline_seconds <= 0 || clients < 1 || readers < 0 || sessions < 4)
    throw loom::invalid_argument_error("ps_load: --seconds and --baseline_seconds must be > 0, "
                                       "--clients >= 1, --readers >= 0, --sessions >= 4");

  ps_process ps;
  {
    pl::counter_graph m;
    loom::session sess(m.g, ps.target, ps.options());
    sess.run(m.counter.initializer());
  }
  std::printf("ps_load: one ps process (loom::server, token, loopback) at %s, %u cores\n",
              ps.target.c_str(), std::thread::hardware_concurrency());

  const auto lead = smoke ? 1000ms : 3000ms;
  const auto raw = run_clients(ps, "ping", clients, 0, baseline_seconds, lead);
  std::printf("1. raw RPC round trips, %d clients, %.0f s: median %.0f/s (mean %.0f/s)\n", clients,
              baseline_seconds, raw.median_per_second, raw.mean_per_second);
  const auto one = run_clients(ps, "increment", 1, 0, baseline_seconds, lead);
  std::printf("2. assign_add(1), 1 client, %.0f s: median %.0f ops/s (mean %.0f)\n",
              baseline_seconds, one.median_per_second, one.mean_per_second);
  part_result reads;
  const auto load = run_clients(ps, "increment", clients, readers, seconds, lead, &reads);
  std::printf("3. assign_add(1), %d clients + %d readers, %.0f s: median %.0f ops/s (mean %.0f), "
              "reads median %.0f/s\n",
              clients, readers, seconds, load.median_per_second, load.mean_per_second,
              reads.median_per_second);

  const std::int64_t final_value = ps.counter();
  const std::uint64_t expected = one.acknowledged + load.acknowledged;
  const bool exact = final_value == static_cast<std::int64_t>(expected);
  const bool clean = one.failed + load.failed + reads.failed == 0 &&
                     one.anomalies + load.anomalies + reads.anomalies == 0;
  std::printf("   final value %lld, acknowledged increments %llu (parts 2 and 3): %s; failed runs "
              "%llu, out-of-order values %llu\n",
              static_cast<long long>(final_value), static_cast<unsigned long long>(expected),
              exact ? "equal" : "DIFFERENT",
              static_cast<unsigned long long>(one.failed + load.failed + reads.failed),
              static_cast<unsigned long long>(one.anomalies + load.anomalies + reads.anomalies));
  if (!load.first_error.empty() || !reads.first_error.empty())
    std::printf("   first failure: %s\n",
                (load.first_error.empty() ? reads.first_error : load.first_error).c_str());

  const int warm_up = sessions / 4;
  const auto first = run_sessions(ps, warm_up);
  const long rss_warm = rss_kib(ps.process.pid());
  const auto rest = run_sessions(ps, sessions - warm_up);
  const long rss_after = rss_kib(ps.process.pid());
  const bool sessions_ok = first.failed + rest.failed == 0;
  std::printf("4. %d sessions opened and closed: ps RSS after %d %ld KiB, after %d %ld KiB: "
              "growth %ld KiB (%.0f bytes a session)%s\n",
              sessions, warm_up, rss_warm, sessions, rss_after, rss_after - rss_warm,
              static_cast<double>(rss_after - rss_warm) * 1024.0 / (sessions - warm_up),
              sessions_ok ? "" : (", FAILED: " + first.first_error + rest.first_error).c_str());

  std::printf("\nratios (medians of 1-s windows, same run, same ps)\n");
  std::printf("  %d clients assign_add / %d clients raw RPC round trips: %.3f\n", clients, clients,
              load.median_per_second / raw.median_per_second);
  std::printf("  %d clients assign_add / 1 client assign_add:            %.3f\n", clients,
              load.median_per_second / one.median_per_second);

  loom::session::shutdown_cluster(ps.target, {}, ps.options());
  const auto st = ps.process.wait(30s);
  if (!st || !st->success())
    std::printf("the ps did not exit 0 after shutdown: %s\n", ps.process.report().c_str());
  return exact && clean && sessions_ok && st && st->success() ? 0 : 1;
} catch (const std::exception& e) {
  std::cerr << "ps_load: " << e.what() << "\n";
  return 1;
}

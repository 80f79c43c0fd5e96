// Parameter-server transfers through loom's whole stack (session -> master ->
// net -> server -> executor -> kernels) against raw TCP on the same loopback,
// in one run. The cluster (2 ps tasks, 4 workers) runs in this process as
// loom::server objects on 127.0.0.1 ports picked free first; clients are
// loom::session objects on a worker's target(), so every tensor goes over TCP.
//
//   1. scalar round trip: raw ping-pong vs (a) assign_add on the ps (one RPC a
//      step), (b) seed 000's c.assign(c + 1) with the add on the worker.
//      Target: (a) <= 2.0 x raw.
//   2. 64 MB: push (assign from a placeholder on the ps), pull (fetch), and
//      both, vs raw TCP 64 MB one way / echoed. Target: >= 0.9 x raw bytes/s.
//      The same push, pull and round trip on a second cluster (a ps and a worker)
//      whose connections use TLS keyed by the cluster token (net/tls.hpp), beside
//      plain TCP: what encryption costs.
//   3. 4 workers x 8 variables (1 MB, 16 MB) over 2 ps tasks with
//      replica_device_setter, each step pushing and pulling all 8; aggregate
//      bytes/s against part 2's raw TCP echo (one connection).
//   4. ps-lite's test_benchmark goodput, 8 * len * keys * rounds / ns Gbit/s,
//      for push, pull and push-pull, 4 keys over 2 ps tasks, beside raw TCP
//      moving len * keys bytes one way and echoed at each size (tools/plots.py
//      draws the table: docs/benchmarks.md, Plots).
//
// `ps_transfer --quick` runs fewer repetitions; `--smoke` runs every part once
// at its smallest size (1 MB variables in 3, 4 KB in 4) with the fewest warm-up
// calls, a test that they still run (ctest bench_ps_transfer_smoke) whose
// figures mean nothing; `--only=N` runs part N alone (with the raw baselines it
// compares against), for profiling.
#include "../bench_util.hpp"
#include "../raw_tcp.hpp"

#include <loom/loom.hpp>
#include <loom/net/rpc.hpp>

#include <sched.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using clk = std::chrono::steady_clock;
using loom::node_id;

double since(clk::time_point t0) {
  return std::chrono::duration<double>(clk::now() - t0).count();
}

std::string join(const std::vector<std::string>& v, std::size_t from, std::size_t to) {
  std::string s;
  for (std::size_t i = from; i < to; ++i)
    s += (s.empty() ? "" : ",") + v[i];
  return s;
}

loom::any_tensor pattern(std::int64_t n, float seed) {
  loom::any_tensor t(loom::dtype::f32, loom::shape{n});
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < n; ++i)
    p[i] = seed + static_cast<float>(i % 1000003);
  return t;
}

bool same_bytes(const loom::any_tensor& a, const loom::any_tensor& b) {
  return a.byte_size() == b.byte_size() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.byte_size()) == 0;
}

double gbytes(double bytes, double s) {
  return bytes / s / 1e9;
}

struct tput_row {
  std::string name;
  double seconds; // per operation
  double bytes;   // moved per operation
};

// Time, GB/s, and bytes/s relative to the row's baseline (by index).
void print_tput(const std::string& title, const std::vector<tput_row>& rows,
                const std::vector<std::size_t>& base) {
  std::printf("\n%s\n", title.c_str());
  std::printf("%-52s %11s %9s %9s\n", "case", "median ms", "GB/s", "vs raw");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const auto& b = rows[base[i]];
    std::printf("%-52s %11.2f %9.2f %9.3f\n", r.name.c_str(), r.seconds * 1e3,
                gbytes(r.bytes, r.seconds),
                gbytes(r.bytes, r.seconds) / gbytes(b.bytes, b.seconds));
  }
}

// A graph of `keys` float variables of `elems` elements each, named
// prefix/k<i>, placed by replica_device_setter over `ps_tasks` ps tasks, each
// with a placeholder beside it (so fed bytes go client -> ps once) and an
// assign from that placeholder.
struct kv_graph {
  loom::graph g;
  std::vector<node_id> vars, placeholders, pushes;

  kv_graph(const std::string& prefix, int keys, std::int64_t elems, int ps_tasks) {
    auto setter = g.device(loom::replica_device_setter({.ps_tasks = ps_tasks}));
    for (int i = 0; i < keys; ++i) {
      // random_uniform: an initializer without a constant of the full size in the graph
      loom::variable<float, 1> v(g, prefix + "/k" + std::to_string(i), loom::shape{elems},
                                 loom::random_uniform_initializer{});
      auto beside = g.device(v.node().requested_device);
      loom::placeholder<float, 1> ph(g, loom::shape{elems}, prefix + "/in" + std::to_string(i));
      vars.push_back(v.id());
      placeholders.push_back(ph.id());
      pushes.push_back(v.assign(ph).id());
    }
  }

  std::vector<std::pair<node_id, loom::any_tensor>>
  feeds(const std::vector<loom::any_tensor>& values) const {
    std::vector<std::pair<node_id, loom::any_tensor>> f;
    for (std::size_t i = 0; i < placeholders.size(); ++i)
      f.emplace_back(placeholders[i], values[i]);
    return f;
  }
};

// Sets the CPU affinity of every thread of this process: all on `cpu`, or
// (cpu < 0) on every CPU again. Threads started later inherit their creator's.
void pin_all_threads(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int n = static_cast<int>(std::thread::hardware_concurrency());
  for (int c = 0; c < n; ++c)
    if (cpu < 0 || c == cpu)
      CPU_SET(c, &set);
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
    ::sched_setaffinity(static_cast<pid_t>(std::stol(e.path().filename().string())), sizeof set,
                        &set);
}

// Median seconds per call of each case, the cases interleaved: every
// repetition times `inner` calls of each in turn, so a burst of load from
// other processes on this shared machine falls on baselines and loom alike.
struct timed_case {
  std::function<void()> fn;
  int inner = 1;
};
std::vector<double> interleaved_medians(const std::vector<timed_case>& cases, int reps) {
  std::vector<std::vector<double>> t(cases.size());
  for (int r = 0; r < reps; ++r)
    for (std::size_t c = 0; c < cases.size(); ++c) {
      const auto t0 = clk::now();
      for (int i = 0; i < cases[c].inner; ++i)
        cases[c].fn();
      t[c].push_back(since(t0) / cases[c].inner);
    }
  std::vector<double> med;
  for (auto& v : t) {
    std::sort(v.begin(), v.end());
    med.push_back(v[v.size() / 2]);
  }
  return med;
}

// Runs `once` for about `seconds` (calibrated on a short run first) in three
// chunks of equal rounds; returns the rounds of a chunk and the median chunk's
// elapsed ns (a median, so a burst of load on this shared machine does not
// decide a figure).
struct chunked_rounds {
  long rounds = 0; // per chunk
  double ns = 0;   // median chunk
};
template <class F> chunked_rounds timed_rounds(F&& once, double seconds) {
  once(); // warm up: registration, first allocations
  long n = 0;
  auto t0 = clk::now();
  do {
    once();
    ++n;
  } while (since(t0) < seconds / 5);
  const double per = since(t0) / static_cast<double>(n);
  chunked_rounds r;
  r.rounds = std::max<long>(1, static_cast<long>(seconds / 3 / per));
  std::vector<double> ns;
  for (int c = 0; c < 3; ++c) {
    t0 = clk::now();
    for (long i = 0; i < r.rounds; ++i)
      once();
    ns.push_back(since(t0) * 1e9);
  }
  std::sort(ns.begin(), ns.end());
  r.ns = ns[1];
  return r;
}

} // namespace

int main(int argc, char** argv) try {
  bool quick = false, smoke = false;
  int only = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick")
      quick = true;
    else if (a == "--smoke")
      smoke = true;
    else if (a.rfind("--only=", 0) == 0)
      only = std::stoi(a.substr(7));
    else {
      std::fprintf(stderr, "usage: ps_transfer [--quick | --smoke] [--only=1|2|3|4]\n");
      return 2;
    }
  }
  const auto want = [&](int part) { return only == 0 || only == part; };
  const int small_reps = smoke ? 1 : quick ? 5 : 101; // short and many: latency here is bimodal
  const int bulk_reps = smoke ? 1 : quick ? 3 : 11;
  // Calls per timed repetition, and warm-up calls.
  const auto calls = [&](int n) { return smoke ? 1 : n; };
  const auto run_start = clk::now();

  // ---- the cluster: ps0, ps1, worker0..3 in this process ----
  const auto addrs = loom::bench::raw::free_addresses(6);
  const auto cluster = loom::cluster_spec::from_flags(join(addrs, 0, 2), join(addrs, 2, 6));
  std::vector<std::unique_ptr<loom::server>> ps, workers;
  for (int t = 0; t < 2; ++t)
    ps.push_back(std::make_unique<loom::server>(cluster, "ps", t));
  for (int t = 0; t < 4; ++t)
    workers.push_back(std::make_unique<loom::server>(cluster, "worker", t));
  const std::string ps0 = "/job:ps/task:0";
  // The TLS cluster of part 2: a ps and a worker, TLS keyed by a token of this run.
  const std::string tls_token = "ps_transfer-tls-token";
  std::vector<std::unique_ptr<loom::server>> tls_tasks;
  if (want(2)) {
    const auto tls_addrs = loom::bench::raw::free_addresses(2);
    const auto tls_cluster = loom::cluster_spec::from_flags(tls_addrs[0], tls_addrs[1]);
    loom::server_options o;
    o.token = tls_token;
    o.tls = loom::tls_settings::keyed_by_token();
    tls_tasks.push_back(std::make_unique<loom::server>(tls_cluster, "ps", 0, o));
    tls_tasks.push_back(std::make_unique<loom::server>(tls_cluster, "worker", 0, o));
  }
  std::printf("loom ps_transfer: in-process cluster ps=%s worker=%s, loopback TCP, %u hardware "
              "threads\n",
              join(addrs, 0, 2).c_str(), join(addrs, 2, 6).c_str(),
              std::thread::hardware_concurrency());

  // ================= 1. scalar round trip =================
  if (want(1)) {
    loom::bench::raw::exchange ping(64, 64);
    loom::net::rpc_server srv(loom::net::rpc_server_options{});
    srv.handle("echo", [](loom::net::request req, loom::net::responder r) {
      r.reply(loom::net::empty{}, std::move(req.payloads()));
    });
    loom::net::channel ch("127.0.0.1:" + std::to_string(srv.port()));
    const auto scalar = loom::any_tensor::scalar<float>(1.f);
    const auto echo = [&] { (void)ch.call("echo", loom::net::empty{}, {scalar}); };

    loom::graph g;
    auto c = g.on(ps0, [&] {
      return loom::get_variable<float, 0>(g, "counter", loom::shape{},
                                          loom::constant_initializer{0});
    });
    auto inc_ps = g.on(ps0, [&] { return c.assign_add(1.0f); }); // op and constant on the ps
    auto inc_seed = c.assign(c + 1.0f);                          // seed 000: the add on the worker
    loom::session sess(g, workers[0]->target());
    sess.run(c.initializer());
    long count = 0;
    const auto step_a_once = [&] {
      (void)sess.run(inc_ps);
      ++count;
    };
    const auto step_b_once = [&] {
      (void)sess.run(inc_seed);
      ++count;
    };
    for (int i = 0; i < calls(100); ++i) {
      echo();
      step_a_once();
      step_b_once();
    }
    const std::vector<timed_case> cases{{[&] { ping.once(); }, calls(100)},
                                        {echo, calls(60)},
                                        {step_a_once, calls(60)},
                                        {step_b_once, calls(20)}};
    // A wake-up across CPUs costs 40-80 us on this VM (the idle vCPU is halted)
    // against ~7 us on the same CPU, and the scheduler places each case's
    // threads its own way for a whole run: figures with every thread on CPU 0
    // compare like with like (each hop a context switch); the scheduler's own
    // placement is printed after them.
    pin_all_threads(0);
    const auto m = interleaved_medians(cases, small_reps);
    pin_all_threads(-1);
    const auto free_m = interleaved_medians(cases, small_reps);
    const double raw_pp = m[0], rpc_echo = m[1], step_a = m[2], step_b = m[3];
    const float got = sess.run(c);
    if (got != static_cast<float>(count)) {
      std::fprintf(stderr, "ps_transfer: the counter is %g after %ld increments\n",
                   static_cast<double>(got), count);
      return 1;
    }
    loom::bench::print_table(
        "1. scalar round trip (float scalar variable on /job:ps/task:0; session on worker 0;\n"
        "   every thread of the process on CPU 0)",
        {{"raw TCP ping-pong, 64 B each way (baseline)", raw_pp},
         {"loom net::channel echo of a scalar tensor", rpc_echo},
         {"(a) sess.run(c.assign_add(1)), all on the ps", step_a},
         {"(b) seed 000: c.assign(c + 1), add on worker", step_b}});
    // torch.distributed.rpc's figure for the same op on these machines: a
    // reference only, not measured by this program.
    std::printf("%-44s %14s %10s\n", "torch.distributed.rpc (NOT measured here)", "~250", "ref");
    std::printf("target (a) <= 2.0 x raw: %.2f x -> %s\n", step_a / raw_pp,
                step_a / raw_pp <= 2.0 ? "met" : "MISSED");
    std::printf("threads placed by the scheduler (us): raw %.1f, echo %.1f, (a) %.1f, (b) %.1f; "
                "(a) / raw %.2f\n",
                free_m[0] * 1e6, free_m[1] * 1e6, free_m[2] * 1e6, free_m[3] * 1e6,
                free_m[2] / free_m[0]);
  }

  // ================= 2. 64 MB =================
  constexpr std::int64_t big_elems = 16 << 20;
  constexpr double big_bytes = 4.0 * big_elems;
  double raw_one = 0, raw_echo = 0;
  std::optional<loom::bench::raw::exchange> bulk_one, bulk_echo;
  if (want(2) || want(3) || want(4)) {
    bulk_one.emplace(64u << 20, 1);
    bulk_echo.emplace(64u << 20, 64u << 20);
  }
  const timed_case raw_one_case{[&] { bulk_one->once(); }};
  const timed_case raw_echo_case{[&] { bulk_echo->once(); }};
  if (!want(2) && bulk_one) {
    const auto m = interleaved_medians({raw_one_case, raw_echo_case}, bulk_reps);
    raw_one = m[0];
    raw_echo = m[1];
  }
  if (want(2)) {
    double push_s = 0, pull_s = 0, rt_s = 0, pushpull_s = 0;
    double tls_push_s = 0, tls_pull_s = 0, tls_rt_s = 0;
    {
      loom::graph g;
      auto _ = g.device(ps0);
      loom::variable<float, 1> v(g, "big", loom::shape{big_elems},
                                 loom::random_uniform_initializer{});
      loom::placeholder<float, 1> ph(g, loom::shape{big_elems}, "big_in");
      auto push = v.assign(ph);
      loom::session sess(g, workers[0]->target());
      loom::cluster_session_options tls_options;
      tls_options.token = tls_token;
      tls_options.tls = loom::tls_settings::keyed_by_token();
      loom::session tls_sess(g, tls_tasks[1]->target(), tls_options);
      const loom::tensor<float, 1> data =
          loom::tensor<float, 1>::from(pattern(big_elems, 0.5f), "64 MB source");
      const auto push_once = [&] { sess.run(loom::as_operation(push), {loom::feed(ph, data)}); };
      const auto pull_once = [&] { return sess.run(v); };
      const auto tls_push_once = [&] {
        tls_sess.run(loom::as_operation(push), {loom::feed(ph, data)});
      };
      const auto tls_pull_once = [&] { return tls_sess.run(v); };
      push_once();
      tls_push_once();
      if (!same_bytes(pull_once().value(), data.value()) ||
          !same_bytes(tls_pull_once().value(), data.value())) {
        std::fprintf(stderr, "ps_transfer: the 64 MB read back differs from what was written\n");
        return 1;
      }
      std::printf("\n64 MB read-back check: the bytes fetched equal the bytes assigned (plain "
                  "and TLS)\n");
      const auto m = interleaved_medians({raw_one_case,
                                          raw_echo_case,
                                          {push_once},
                                          {[&] { (void)pull_once(); }},
                                          {[&] {
                                            push_once();
                                            (void)pull_once();
                                          }},
                                          {[&] { (void)sess.run(push, {loom::feed(ph, data)}); }},
                                          {tls_push_once},
                                          {[&] { (void)tls_pull_once(); }},
                                          {[&] {
                                            tls_push_once();
                                            (void)tls_pull_once();
                                          }}},
                                         bulk_reps);
      raw_one = m[0];
      raw_echo = m[1];
      push_s = m[2];
      pull_s = m[3];
      rt_s = m[4];
      pushpull_s = m[5];
      tls_push_s = m[6];
      tls_pull_s = m[7];
      tls_rt_s = m[8];
    }
    loom::session::reset(workers[0]->target());
    print_tput("2. 64 MB float tensor, client <-> variable on /job:ps/task:0",
               {{"raw TCP 64 MB one way, 1 B ack (baseline)", raw_one, big_bytes},
                {"raw TCP 64 MB each way (baseline)", raw_echo, 2 * big_bytes},
                {"push: assign from a placeholder on the ps", push_s, big_bytes},
                {"pull: fetch the variable", pull_s, big_bytes},
                {"round trip: push, then pull", rt_s, 2 * big_bytes},
                {"push-pull in one run: fetch the assign", pushpull_s, 2 * big_bytes},
                {"TLS push (keyed by the cluster token)", tls_push_s, big_bytes},
                {"TLS pull", tls_pull_s, big_bytes},
                {"TLS round trip: push, then pull", tls_rt_s, 2 * big_bytes}},
               {0, 1, 0, 0, 1, 1, 0, 0, 1});
    const double worst = std::min({raw_one / push_s, raw_one / pull_s, raw_echo / rt_s});
    std::printf("target >= 0.9 x raw bytes/s: push %.2f, pull %.2f, round trip %.2f -> %s\n",
                raw_one / push_s, raw_one / pull_s, raw_echo / rt_s,
                worst >= 0.9 ? "met" : "MISSED");
    std::printf("TLS / plain TCP bytes/s (same run, interleaved): push %.3f, pull %.3f, round "
                "trip %.3f\n",
                push_s / tls_push_s, pull_s / tls_pull_s, rt_s / tls_rt_s);
  }

  bulk_one.reset(); // 384 MB of raw buffers
  bulk_echo.reset();

  // ================= 3. 4 workers x 8 variables over 2 ps tasks =================
  if (want(3)) {
    std::printf("\n3. 4 workers x 8 variables, replica_device_setter over 2 ps tasks; a step "
                "pushes and pulls all 8\n");
    std::printf("%-12s %7s %11s %14s %16s\n", "variable", "steps", "median s", "aggregate GB/s",
                "vs raw echo (2.)");
    const std::vector<std::int64_t> sizes_mb =
        smoke ? std::vector<std::int64_t>{1} : std::vector<std::int64_t>{1, 16};
    for (const std::int64_t mb : sizes_mb) {
      const std::int64_t elems = mb << 18;
      const int steps = quick || smoke ? 1 : (mb == 1 ? 24 : 2);
      const int reps = quick || smoke ? 1 : 5;
      constexpr int n_workers = 4, keys = 8;
      std::barrier sync(n_workers + 1);
      std::vector<std::thread> threads;
      std::vector<std::string> errors(n_workers);
      for (int w = 0; w < n_workers; ++w)
        threads.emplace_back([&, w] {
          bool failed = false;
          try {
            kv_graph kv("w" + std::to_string(mb) + "mb", keys, elems, 2);
            loom::session sess(kv.g, workers[static_cast<std::size_t>(w)]->target());
            std::vector<loom::any_tensor> src;
            for (int k = 0; k < keys; ++k)
              src.push_back(pattern(elems, static_cast<float>(w * 8 + k)));
            const auto feeds = kv.feeds(src);
            const auto step = [&] {
              sess.run_nodes({}, kv.pushes, feeds);
              (void)sess.run_nodes(kv.vars, {});
            };
            step();
            for (int r = 0; r < reps; ++r) {
              sync.arrive_and_wait();
              for (int s = 0; s < steps; ++s)
                step();
              sync.arrive_and_wait();
            }
          } catch (const std::exception& e) {
            errors[static_cast<std::size_t>(w)] = e.what();
            failed = true;
          }
          if (failed)
            sync.arrive_and_drop(); // the others stop waiting for this thread
        });
      std::vector<double> t;
      for (int r = 0; r < reps; ++r) {
        sync.arrive_and_wait();
        const auto t0 = clk::now();
        sync.arrive_and_wait();
        t.push_back(since(t0));
      }
      for (auto& th : threads)
        th.join();
      for (const auto& e : errors)
        if (!e.empty())
          throw std::runtime_error("a worker failed: " + e);
      std::sort(t.begin(), t.end());
      const double med = t[t.size() / 2];
      const double bytes = 2.0 * n_workers * keys * steps * static_cast<double>(elems) * 4;
      std::printf("%-12s %7d %11.3f %14.2f %16.3f\n", (std::to_string(mb) + " MB").c_str(),
                  steps * n_workers, med, gbytes(bytes, med),
                  gbytes(bytes, med) / gbytes(2 * big_bytes, raw_echo));
      loom::session::reset(workers[0]->target());
    }
  }

  // ================= 4. ps-lite test_benchmark goodput =================
  if (want(4)) {
    std::printf("\n4. ps-lite test_benchmark goodput: 8 * len * keys * rounds / elapsed_ns Gbit/s, "
                "keys = 4 variables over 2 ps tasks, one worker session; median of 3 chunks;\n"
                "   raw: raw TCP moving len * keys bytes one way (1 B back), raw-echo: each way "
                "(counted once, as push-pull), in the same run\n");
    std::printf("%-8s %10s %8s %10s %8s %10s %8s %10s %10s\n", "len", "push", "rounds", "pull",
                "rounds", "push-pull", "rounds", "raw", "raw-echo");
    const double budget = smoke ? 0 : quick ? 0.1 : 0.6; // 0: one calibration round
    const std::vector<std::int64_t> lens =
        smoke
            ? std::vector<std::int64_t>{4LL << 10}
            : std::vector<std::int64_t>{4LL << 10, 40LL << 10, 400LL << 10, 4LL << 20, 40LL << 20};
    for (const std::int64_t len : lens) {
      constexpr int keys = 4;
      const std::int64_t elems = len / 4;
      kv_graph kv("pslite" + std::to_string(len), keys, elems, 2);
      loom::session sess(kv.g, workers[0]->target());
      std::vector<loom::any_tensor> src;
      for (int k = 0; k < keys; ++k)
        src.push_back(pattern(elems, static_cast<float>(k)));
      const auto feeds = kv.feeds(src);
      const auto push = timed_rounds([&] { sess.run_nodes({}, kv.pushes, feeds); }, budget);
      const auto pull = timed_rounds([&] { (void)sess.run_nodes(kv.vars, {}); }, budget);
      const auto both = timed_rounds([&] { (void)sess.run_nodes(kv.pushes, {}, feeds); }, budget);
      const auto raw_bytes = static_cast<std::size_t>(len) * keys;
      chunked_rounds raw, raw_echo;
      {
        loom::bench::raw::exchange one_way(raw_bytes, 1);
        raw = timed_rounds([&] { one_way.once(); }, budget);
      }
      {
        loom::bench::raw::exchange echo(raw_bytes, raw_bytes);
        raw_echo = timed_rounds([&] { echo.once(); }, budget);
      }
      const auto gbit = [&](const chunked_rounds& r) {
        return 8.0 * static_cast<double>(len) * keys * static_cast<double>(r.rounds) / r.ns;
      };
      const std::string name =
          len >= (1 << 20) ? std::to_string(len >> 20) + " MB" : std::to_string(len >> 10) + " KB";
      std::printf("%-8s %10.3f %8ld %10.3f %8ld %10.3f %8ld %10.3f %10.3f\n", name.c_str(),
                  gbit(push), 3 * push.rounds, gbit(pull), 3 * pull.rounds, gbit(both),
                  3 * both.rounds, gbit(raw), gbit(raw_echo));
    }
    std::printf("raw TCP 64 MB one way in the same run: %.3f Gbit/s (ps-lite counts push-pull "
                "bytes once)\n",
                8.0 * big_bytes / raw_one / 1e9);
  }

  loom::session::shutdown_cluster(workers[0]->target());
  for (auto& s : tls_tasks) // stopped here: the TLS cluster had its own sessions only
    s->stop();
  for (auto& s : ps)
    s->join();
  for (auto& s : workers)
    s->join();
  std::printf("\ntotal %.1f s\n", since(run_start));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "ps_transfer: %s\n", e.what());
  return 1;
}

// What tracing a step costs (#22 item 3): the seed's MLP step (784 -> 100 ->
// 10, Adam, batch 100 of random data) run untraced and with
// run_options{.trace_level = trace_level::full}, alternating, in the same run:
//
//   local     a session in this process (one task: the executor's per-node
//             recording alone)
//   cluster   an in-process cluster of 1 ps + 1 worker on loopback TCP, the
//             session on the worker (the ps's trace crosses in its answer,
//             and the master aligns the clocks)
//
// Each round runs `steps` untraced steps then `steps` traced ones, each timed
// alone; it prints the median step of each kind and their ratio, and the time
// loom::timeline takes to write the traced step's Chrome trace.
//
// Compiled with -DLOOM_STEP_TRACE_UNTRACED_ONLY it runs untraced steps alone
// (rounds x steps of them), so that it also compiles against headers from
// before tracing: the before and after of the untraced step. Built by hand against each
// tree's include/ with the build's flags and run alternately, e.g.
//   g++ -std=c++20 -O2 -DNDEBUG -march=x86-64-v3 -DEIGEN_FAST_MATH=0 -DASIO_STANDALONE
//     -DASIO_DISABLE_VARIABLE_TEMPLATES -DLOOM_STEP_TRACE_UNTRACED_ONLY -I<tree>/include
//     -Itests -isystem /usr/include/eigen3 benchmarks/step_trace/main.cpp
//     -lz -lssl -lcrypto -l:libfarmhash.a -lpthread
// (docs/benchmarks.md, "Tracing a step", has the figures).
//
//   step_trace [--rounds=50] [--steps=10]
//   step_trace --smoke     one round of two steps each: a test that it still runs
//                          (ctest bench_step_trace_smoke); its figures mean nothing
#include "../bench_util.hpp"

#include <loom/loom.hpp>

#include <support/cluster.hpp>

#include "../../examples/common/seed_mlp.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr int batch = 100, hidden = 100;

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

struct model {
  loom::graph g;
  std::unique_ptr<loom::examples::seed_mlp> mlp;
  std::optional<loom::operation> train;
  loom::tensor<float, 2> x{loom::shape{batch, 784}};
  loom::tensor<float, 2> y{loom::shape{batch, 10}, 0.f};

  explicit model(bool on_ps) {
    g.set_random_seed(1);
    auto build = [&] {
      mlp = std::make_unique<loom::examples::seed_mlp>(g, hidden);
      train = loom::adam_optimizer{0.001}.minimize(mlp->cross_entropy);
    };
    if (on_ps) {
      auto _ = g.device(loom::replica_device_setter({.ps_tasks = 1}));
      build();
    } else {
      build();
    }
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(0, 1);
    for (auto& v : x.flat())
      v = u(rng);
    for (int i = 0; i < batch; ++i)
      y(i, static_cast<int>(rng() % 10)) = 1.f;
  }
  loom::feed_dict feeds() const { return {{mlp->x, x}, {mlp->y_, y}}; }
};

struct result {
  double untraced = 0, traced = 0, timeline = 0;
  std::size_t nodes = 0;
};

result measure(loom::session& s, const model& m, int rounds, int steps) {
  using clock = std::chrono::steady_clock;
  const auto feeds = m.feeds();
  for (int i = 0; i < 5; ++i) // warm-up: registration, plans, first allocations
    s.run(*m.train, feeds);
  std::vector<double> untraced;
#ifdef LOOM_STEP_TRACE_UNTRACED_ONLY
  for (int r = 0; r < rounds * steps; ++r) {
    const auto a = clock::now();
    s.run(*m.train, feeds);
    untraced.push_back(std::chrono::duration<double>(clock::now() - a).count());
  }
  return {median(untraced), 0, 0, 0};
#else
  std::vector<double> traced, timeline;
  loom::run_metadata md;
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < steps; ++i) {
      const auto a = clock::now();
      s.run(*m.train, feeds);
      untraced.push_back(std::chrono::duration<double>(clock::now() - a).count());
    }
    for (int i = 0; i < steps; ++i) {
      const auto a = clock::now();
      s.run(*m.train, feeds, {.trace_level = loom::trace_level::full}, &md);
      traced.push_back(std::chrono::duration<double>(clock::now() - a).count());
    }
    const auto a = clock::now();
    const std::string json = loom::timeline(md).chrome_trace_json();
    timeline.push_back(std::chrono::duration<double>(clock::now() - a).count());
  }
  result out{median(untraced), median(traced), median(timeline), 0};
  for (const auto& t : md.step_stats.tasks)
    out.nodes += t.node_stats.size();
  return out;
#endif
}

void print(const char* what, const result& r) {
  if (r.traced == 0) // untraced only
    std::printf("%-8s %14.1f\n", what, r.untraced * 1e6);
  else
    std::printf("%-8s %14.1f %14.1f %10.3f %12.1f %8zu\n", what, r.untraced * 1e6, r.traced * 1e6,
                r.traced / r.untraced, r.timeline * 1e6, r.nodes);
}

} // namespace

int main(int argc, char** argv) try {
  int rounds = 50, steps = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--smoke")
      rounds = 1, steps = 2;
    else if (a.starts_with("--rounds="))
      rounds = std::atoi(argv[i] + 9);
    else if (a.starts_with("--steps="))
      steps = std::atoi(argv[i] + 8);
    else {
      std::fprintf(stderr, "step_trace: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (rounds < 1 || steps < 1) {
    std::fprintf(stderr, "step_trace: --rounds and --steps must be at least 1\n");
    return 2;
  }
  std::printf("The seed's MLP step (batch %d, Adam), untraced and traced (trace_level::full), "
              "%d rounds of %d steps each, alternating; medians of single steps\n",
              batch, rounds, steps);
  std::printf("%-8s %14s %14s %10s %12s %8s\n", "case", "untraced us", "traced us", "ratio",
              "timeline us", "nodes");
  {
    model m(false);
    loom::session s(m.g);
    s.run(loom::global_variables_initializer(m.g));
    print("local", measure(s, m, rounds, steps));
  }
  {
    loom::testing::local_cluster cluster(1, 1);
    model m(true);
    loom::session s(m.g, cluster.target(), loom::testing::quiet());
    s.run(loom::global_variables_initializer(m.g));
    print("cluster", measure(s, m, rounds, steps));
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "step_trace: %s\n", e.what());
  return 1;
}

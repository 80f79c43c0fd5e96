// The seed's MLP training step on a GPU: loom against PyTorch on the same GPU, in the same
// run (issue #5: loom's step at most PyTorch eager's; issue #51: at most PyTorch's step
// captured in a CUDA graph, with fused Adam and pinned host batches).
//
// Both sides run 784 -> hidden (relu) -> 10 softmax, the cross entropy
// -sum(y_ * log(clip(y, 1e-10, 1))), Adam, fp32 (no TF32), each step's batch
// copied from host memory and the loss fetched (which waits for the step).
// loom's step runs three ways, alternated: fed pageable batches (as PyTorch eager's), batches
// in page-locked memory (loom::pinned_tensor, as PyTorch's captured step's), and the latter in
// a session with session_options::gpu_graphs off (each kernel launched, every step). The first
// two replay the step as one CUDA graph from its third run on (runtime/captured_step.hpp).
// loom places every node, the variables included, on /gpu:0; PyTorch's side is
// torch_step.py beside this file, run with `python3`, which also measures the two ceilings
// of the step's floor: the fp32 matrix rate and the pinned host-to-device rate.
//
//   gpu_step [--batch=1024] [--hidden=1024] [--steps=200] [--reps=7] [--python=python3]
//            [--torch_step=<this directory>/torch_step.py] [--smoke]
//
// --smoke: batch 100, hidden 100, 1 step x 1 repetition after 1 warm-up step unless given, a
// test that both sides still run (ctest bench_gpu_step_smoke, skipped without a GPU); its
// figures mean nothing.
//
// Without a GPU it prints that it skipped and exits 0; without PyTorch it
// prints loom's time alone. Exit status 1 when loom's step could not run.
//
// Compiled by nvcc (benchmarks/CMakeLists.txt), so the graph built here has
// GPU kernels for its fused elementwise regions (kernels/cuda/fused.cuh); the
// table says how many of them do.
#include "../bench_util.hpp"

#include <loom/loom.hpp>

#include "../../examples/common/seed_mlp.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#ifndef LOOM_TORCH_STEP
#define LOOM_TORCH_STEP "torch_step.py"
#endif

namespace {

// What torch_step.py reports; a field it did not print stays negative.
struct torch_figures {
  double eager_s = -1;          // the eager step, seconds
  double graph_s = -1;          // the captured step, seconds
  double fp32_flops_per_s = -1; // the fp32 matrix rate
  double h2d_bytes_per_s = -1;  // host (pinned) to device
};

torch_figures run_torch_step(const std::string& python, const std::string& script, long batch,
                             long hidden, int steps, int reps) {
  const std::string cmd = python + " " + script + " --batch " + std::to_string(batch) +
                          " --hidden " + std::to_string(hidden) + " --steps " +
                          std::to_string(steps) + " --reps " + std::to_string(reps) + " 2>&1";
  torch_figures f;
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p)
    return f;
  char line[4096];
  std::string output;
  while (std::fgets(line, sizeof line, p)) {
    output += line;
    std::sscanf(line, "torch_step_seconds %lf", &f.eager_s);
    std::sscanf(line, "torch_graph_step_seconds %lf", &f.graph_s);
    std::sscanf(line, "fp32_matmul_flops_per_s %lf", &f.fp32_flops_per_s);
    std::sscanf(line, "h2d_bytes_per_s %lf", &f.h2d_bytes_per_s);
  }
  ::pclose(p);
  if (f.eager_s < 0 || f.graph_s < 0 || f.fp32_flops_per_s < 0 || f.h2d_bytes_per_s < 0)
    std::printf("PyTorch baseline incomplete:\n%s\n", output.c_str());
  return f;
}

// Where loom's step goes: the same step fed batches already on the GPU (the difference is
// the batch's upload), and one traced step's host time by op (launches and the executor's
// work; the GPU runs behind them until the loss's fetch waits).
template <class Train>
void diagnose(loom::session& sess, const Train& train_step, loom::examples::seed_mlp& model,
              const std::vector<loom::tensor<float, 2>>& xs,
              const std::vector<loom::tensor<float, 2>>& ys, int reps, int steps) {
  std::vector<loom::tensor<float, 2>> gxs, gys;
  for (std::size_t b = 0; b < xs.size(); ++b) {
    gxs.push_back(loom::tensor<float, 2>::from(
        loom::kernels::at_location(xs[b].value(), loom::memory_location::gpu(0))));
    gys.push_back(loom::tensor<float, 2>::from(
        loom::kernels::at_location(ys[b].value(), loom::memory_location::gpu(0))));
  }
  std::size_t i = 0;
  volatile float sink = 0;
  auto step = [&] {
    auto [_, loss] = sess.run(loom::fetches(train_step, model.cross_entropy),
                              {{model.x, gxs[i % 4]}, {model.y_, gys[i % 4]}});
    sink = loss;
    ++i;
  };
  for (int w = 0; w < 5; ++w)
    step();
  std::printf("diagnose: the step with its batches on the GPU: %.4f ms\n",
              loom::bench::median_seconds(step, reps, steps) * 1e3);
  for (int t = 0; t < 3; ++t) {
    loom::run_metadata meta;
    const auto start = std::chrono::steady_clock::now();
    sess.run(loom::fetches(train_step, model.cross_entropy),
             {{model.x, xs[t % 4]}, {model.y_, ys[t % 4]}},
             loom::run_options{.trace_level = loom::trace_level::full}, &meta);
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::map<std::string, std::pair<int, double>> by_op;
    double in_items = 0;
    std::int64_t first = 0, last = 0;
    std::size_t nodes = 0;
    for (const auto& task : meta.step_stats.tasks)
      for (const auto& n : task.node_stats) {
        auto& [count, seconds] = by_op[n.op];
        ++count;
        seconds += static_cast<double>(n.end_ns - n.start_ns) * 1e-9;
        in_items += static_cast<double>(n.end_ns - n.start_ns) * 1e-9;
        first = nodes == 0 ? n.start_ns : std::min(first, n.start_ns);
        last = std::max(last, n.end_ns);
        ++nodes;
      }
    std::printf("diagnose: traced step %d: %.4f ms wall, %zu items, %.4f ms in them, "
                "%.4f ms from the first item's start to the last's end\n",
                t, wall * 1e3, nodes, in_items * 1e3, static_cast<double>(last - first) * 1e-6);
    if (t == 2)
      for (const auto& [op, cs] : by_op)
        std::printf("  %-28s %4d x  %.4f ms\n", op.c_str(), cs.first, cs.second * 1e3);
  }
}

} // namespace

int main(int argc, char** argv) try {
  loom::flags flags("The seed's MLP step on a GPU, loom vs PyTorch eager.");
  flags.define_int("batch", 1024, "Examples per step")
      .define_int("hidden", 1024, "Hidden units")
      .define_int("steps", 200, "Steps per timed repetition")
      .define_int("reps", 7, "Timed repetitions (the median is reported)")
      .define_string("python", "python3", "The Python with PyTorch")
      .define_string("torch_step", LOOM_TORCH_STEP, "PyTorch's side of the comparison")
      .define_bool("smoke", false, "The smallest run: the seed's sizes, one step")
      .define_bool("diagnose", false,
                   "Also: the step with its batches already on the GPU, and one traced step's "
                   "host time by op");
  if (!flags.parse(argc, argv))
    return 0;
  if (loom::gpu_count() == 0) {
    std::printf("gpu_step: no CUDA device (or a build without CUDA); skipped\n");
    return 0;
  }
  const bool smoke = flags.get_bool("smoke");
  // A flag given on the command line wins over the smoke run's value.
  const auto int_flag = [&](const char* name, std::int64_t smoke_value) {
    return smoke && !flags.is_set(name) ? smoke_value : flags.get_int(name);
  };
  const auto batch = int_flag("batch", 100);
  const auto hidden = int_flag("hidden", 100);
  const int steps = static_cast<int>(int_flag("steps", 1));
  const int reps = static_cast<int>(int_flag("reps", 1));
  const int warm_up = smoke ? 1 : 20;

  loom::graph g;
  g.set_random_seed(1);
  auto on_gpu = g.device("/gpu:0");
  loom::examples::seed_mlp model(g, hidden);
  auto train_step = loom::adam_optimizer{0.001}.minimize(model.cross_entropy);
  loom::session sess(g);
  sess.run(loom::global_variables_initializer(g));
  // The same step launched kernel by kernel, as before CUDA graphs (session_options).
  loom::session launching(g, loom::session_options{.gpu_graphs = false});
  launching.run(loom::global_variables_initializer(g));

  // A few host batches, rotated: random pixels and one-hot labels (never zeros).
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::uniform_int_distribution<int> label(0, 9);
  std::vector<loom::tensor<float, 2>> xs, ys;
  for (int b = 0; b < 4; ++b) {
    loom::tensor<float, 2> x(loom::shape{batch, 784}), y(loom::shape{batch, 10}, 0.0f);
    for (std::int64_t i = 0; i < batch * 784; ++i)
      x.data()[i] = pixel(rng);
    for (std::int64_t i = 0; i < batch; ++i)
      y(i, label(rng)) = 1.0f;
    xs.push_back(std::move(x));
    ys.push_back(std::move(y));
  }
  // The same batches in page-locked memory, as PyTorch's captured step has them.
  std::vector<loom::tensor<float, 2>> pinned_xs, pinned_ys;
  for (int b = 0; b < 4; ++b) {
    pinned_xs.push_back(loom::pinned_tensor<float, 2>(xs[b].shape()));
    pinned_ys.push_back(loom::pinned_tensor<float, 2>(ys[b].shape()));
    std::copy(xs[b].flat().begin(), xs[b].flat().end(), pinned_xs[b].flat().begin());
    std::copy(ys[b].flat().begin(), ys[b].flat().end(), pinned_ys[b].flat().begin());
  }
  int i = 0;
  volatile float sink = 0;
  const auto step_on = [&](loom::session& s, const std::vector<loom::tensor<float, 2>>& x,
                           const std::vector<loom::tensor<float, 2>>& y) {
    return [&, s = &s, x = &x, y = &y] {
      auto [_, loss] = s->run(loom::fetches(train_step, model.cross_entropy),
                              {{model.x, (*x)[i % 4]}, {model.y_, (*y)[i % 4]}});
      sink = loss;
      ++i;
    };
  };
  const auto step = step_on(sess, xs, ys);
  const auto pinned_step = step_on(sess, pinned_xs, pinned_ys);
  const auto launched_step = step_on(launching, pinned_xs, pinned_ys);
  for (int w = 0; w < warm_up; ++w) { // warm up: plans, cuBLAS, the allocator's cache
    step();
    pinned_step();
    launched_step();
  }
  const auto [loom_s, loom_pinned_s, loom_launched_s] =
      loom::bench::alternated_median_seconds(reps, steps, step, pinned_step, launched_step);
  if (flags.get_bool("diagnose"))
    diagnose(sess, train_step, model, xs, ys, reps, steps);
  const torch_figures torch = run_torch_step(
      flags.get_string("python"), flags.get_string("torch_step"), batch, hidden, steps, reps);
  int gpu_regions = 0;
  for (const loom::detail::fusion_candidate& f : g.fusions())
    gpu_regions += loom::kernels::fused_kernel_registry::instance().find_gpu(f.key) != nullptr;

  // The floor: the step's matrix products at the measured fp32 rate (forward x W1 and h W2;
  // backward dW1, dW2 and dh: x's gradient is not needed) plus its batch at the measured
  // host-to-device rate. Adam and the elementwise work are left out: a lower bound.
  const double b = static_cast<double>(batch), h = static_cast<double>(hidden);
  const double flops = 2 * b * (2 * 784 * h + 3 * h * 10);
  const double batch_bytes = b * (784 + 10) * sizeof(float);
  const double floor_s = torch.fp32_flops_per_s > 0 && torch.h2d_bytes_per_s > 0
                             ? flops / torch.fp32_flops_per_s + batch_bytes / torch.h2d_bytes_per_s
                             : -1;

  std::printf("\ngpu_step: batch %lld, hidden %lld, %d steps x %d repetitions (median)\n",
              static_cast<long long>(batch), static_cast<long long>(hidden), steps, reps);
  std::printf("fused elementwise regions with a GPU kernel: %d of %zu\n", gpu_regions,
              g.fusions().size());
  if (floor_s > 0)
    std::printf("floor: %.3f GFLOP at %.1f TFLOP/s (fp32) + %.2f MB at %.1f GB/s (pinned "
                "host to device) = %.4f ms\n",
                flops / 1e9, torch.fp32_flops_per_s / 1e12, batch_bytes / 1e6,
                torch.h2d_bytes_per_s / 1e9, floor_s * 1e3);
  const auto ratio = [](double num, double den) {
    return num > 0 && den > 0 ? std::to_string(num / den) : std::string("-");
  };
  std::printf("%-30s %10s %12s %14s %10s\n", "case", "ms/step", "vs eager", "vs captured",
              "vs floor");
  const auto row = [&](const char* name, double s) {
    if (s > 0)
      std::printf("%-30s %10.4f %12s %14s %10s\n", name, s * 1e3, ratio(s, torch.eager_s).c_str(),
                  ratio(s, torch.graph_s).c_str(), ratio(s, floor_s).c_str());
  };
  row("PyTorch eager", torch.eager_s);
  row("PyTorch captured, fused Adam", torch.graph_s);
  row("loom session", loom_s);
  row("loom session, pinned batches", loom_pinned_s);
  row("  the same, no CUDA graph", loom_launched_s);
  if (torch.eager_s > 0)
    std::printf("target: loom's step at most PyTorch eager's: %s\n",
                loom_s <= torch.eager_s ? "MET" : "MISSED");
  if (torch.graph_s > 0)
    std::printf("target: loom's step (pinned batches) at most PyTorch's captured step: %s\n",
                loom_pinned_s <= torch.graph_s ? "MET" : "MISSED");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gpu_step: %s\n", e.what());
  return 1;
}

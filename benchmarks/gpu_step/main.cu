// The seed's MLP training step on a GPU: loom against PyTorch eager on the same
// GPU, in the same run (issue #5: loom's step time at most PyTorch's).
//
// Both sides run 784 -> hidden (relu) -> 10 softmax, the cross entropy
// -sum(y_ * log(clip(y, 1e-10, 1))), Adam, fp32 (no TF32), each step's batch
// copied from host memory and the loss fetched (which waits for the step).
// loom places every node, the variables included, on /gpu:0; PyTorch's side is
// torch_step.py beside this file, run with `python3`.
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

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#ifndef LOOM_TORCH_STEP
#define LOOM_TORCH_STEP "torch_step.py"
#endif

namespace {

// The median seconds per step PyTorch reports, or a negative number.
double torch_step_seconds(const std::string& python, const std::string& script, long batch,
                          long hidden, int steps, int reps) {
  const std::string cmd = python + " " + script + " --batch " + std::to_string(batch) +
                          " --hidden " + std::to_string(hidden) + " --steps " +
                          std::to_string(steps) + " --reps " + std::to_string(reps) + " 2>&1";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p)
    return -1;
  char line[4096];
  double seconds = -1;
  std::string output;
  while (std::fgets(line, sizeof line, p)) {
    output += line;
    std::sscanf(line, "torch_step_seconds %lf", &seconds);
  }
  ::pclose(p);
  if (seconds < 0)
    std::printf("PyTorch baseline unavailable:\n%s\n", output.c_str());
  return seconds;
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
      .define_bool("smoke", false, "The smallest run: the seed's sizes, one step");
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
  int i = 0;
  volatile float sink = 0;
  auto step = [&] {
    auto [_, loss] = sess.run(loom::fetches(train_step, model.cross_entropy),
                              {{model.x, xs[i % 4]}, {model.y_, ys[i % 4]}});
    sink = loss;
    ++i;
  };
  for (int w = 0; w < warm_up; ++w) // warm up: plans, cuBLAS, the allocator's cache
    step();
  const double loom_s = loom::bench::median_seconds(step, reps, steps);
  const double torch_s = torch_step_seconds(
      flags.get_string("python"), flags.get_string("torch_step"), batch, hidden, steps, reps);
  int gpu_regions = 0;
  for (const loom::detail::fusion_candidate& f : g.fusions())
    gpu_regions += loom::kernels::fused_kernel_registry::instance().find_gpu(f.key) != nullptr;

  std::printf("\ngpu_step: batch %lld, hidden %lld, %d steps x %d repetitions (median)\n",
              static_cast<long long>(batch), static_cast<long long>(hidden), steps, reps);
  std::printf("fused elementwise regions with a GPU kernel: %d of %zu\n", gpu_regions,
              g.fusions().size());
  std::printf("%-28s %14s %12s\n", "case", "ms/step", "vs PyTorch");
  if (torch_s > 0)
    std::printf("%-28s %14.4f %12.3f\n", "PyTorch eager", torch_s * 1e3, 1.0);
  std::printf("%-28s %14.4f %12s\n", "loom session", loom_s * 1e3,
              torch_s > 0 ? std::to_string(loom_s / torch_s).c_str() : "-");
  if (torch_s > 0)
    std::printf("target: loom's step at most PyTorch's: %s\n",
                loom_s <= torch_s ? "MET" : "MISSED");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gpu_step: %s\n", e.what());
  return 1;
}

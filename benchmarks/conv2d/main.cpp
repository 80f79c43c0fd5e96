// conv2d forward, its input gradient and its filter gradient alone, on the shapes of
// examples/cnn's two convolutions (batch 50, NHWC, 5x5, SAME), in GFLOP/s; with --tf the
// same three in TensorFlow (tf.nn.conv2d and tf.gradients in a tf.compat.v1 session, from
// PyPI into build/tf-venv, on this machine in the same run) and loom's ratio to it.
//
// With --gpu, the same three on /gpu:0, against PyTorch's (cuDNN, `cudnn.benchmark` on, TF32
// off on both, channels-last as loom's NHWC) run by the `python3` that has PyTorch: the GPU
// machines this is measured on have PyTorch and no TensorFlow. The inputs live on the GPU
// (variables there); each pass's output is reduced to a scalar and fetched, on both sides,
// so that a time covers the GPU's work and not only its launch.
//
//   conv2d [--tf] [--gpu [--python=python3]] [--reps=N] [--threads=N]
#include <loom/loom.hpp>

#include "../bench_util.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct conv_shape {
  const char* name;
  std::int64_t batch, size, in, out, k;
  double flops() const { // multiply-adds of one pass, twice
    return 2.0 * static_cast<double>(batch * size * size * out * k * k * in);
  }
};

const std::vector<conv_shape> shapes{{"conv1 50x28x28x1 * 5x5x1x32", 50, 28, 1, 32, 5},
                                     {"conv2 50x14x14x32 * 5x5x32x64", 50, 14, 32, 64, 5}};

loom::tensor<float, 4> random_tensor(const loom::shape& s, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(static_cast<std::size_t>(s.num_elements()));
  for (float& x : v)
    x = static_cast<float>(rng() >> 40) * 0x1.0p-24f - 0.5f;
  return loom::tensor<float, 4>(s, v);
}

// Median seconds of forward, input gradient and filter gradient in loom.
std::vector<double> loom_times(const conv_shape& c, int reps, int threads) {
  loom::graph g;
  loom::placeholder<float, 4> x(g, loom::shape{c.batch, c.size, c.size, c.in}, "x");
  loom::placeholder<float, 4> f(g, loom::shape{c.k, c.k, c.in, c.out}, "f");
  loom::placeholder<float, 4> dy(g, loom::shape{c.batch, c.size, c.size, c.out}, "dy");
  auto y = loom::conv2d(x, f);
  const auto grads = loom::gradients(g, {y.id()}, {x.id(), f.id()}, {dy.id()});
  loom::session s(g, loom::session_options{.intra_op_threads = threads});
  const auto xv = random_tensor(x.shape(), 1), fv = random_tensor(f.shape(), 2),
             dv = random_tensor(dy.shape(), 3);
  const loom::feed_dict feeds{{x, xv}, {f, fv}, {dy, dv}};
  std::vector<double> out;
  out.push_back(loom::bench::median_seconds([&] { s.run(y, feeds); }, reps));
  for (loom::node_id grad : grads) {
    const loom::output<float, 4> d(g, grad);
    out.push_back(loom::bench::median_seconds([&] { s.run(d, feeds); }, reps));
  }
  return out;
}

// The same three on /gpu:0: inputs in variables there, each pass reduced to a scalar and
// fetched (the fetch waits for the GPU).
std::vector<double> loom_gpu_times(const conv_shape& c, int reps) {
  loom::graph g;
  auto on_gpu = g.device("/gpu:0");
  loom::variable<float, 4> x(
      g, "x", loom::constant(g, random_tensor(loom::shape{c.batch, c.size, c.size, c.in}, 1)));
  loom::variable<float, 4> f(
      g, "f", loom::constant(g, random_tensor(loom::shape{c.k, c.k, c.in, c.out}, 2)));
  loom::variable<float, 4> dy(
      g, "dy", loom::constant(g, random_tensor(loom::shape{c.batch, c.size, c.size, c.out}, 3)));
  auto y = loom::conv2d(x, f);
  const auto grads = loom::gradients(g, {y.id()}, {x.id(), f.id()}, {dy.id()});
  std::vector<loom::output<float, 0>> sums{loom::reduce_sum(y)};
  for (loom::node_id grad : grads)
    sums.push_back(loom::reduce_sum(loom::output<float, 4>(g, grad)));
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  std::vector<double> out;
  for (const auto& sum : sums) {
    for (int w = 0; w < 3; ++w) // cuBLAS's handle, the allocator's cache
      s.run(sum);
    out.push_back(loom::bench::median_seconds([&] { s.run(sum); }, reps));
  }
  return out;
}

const char* torch_script = R"PY(
import sys, time
import torch
batch, size, cin, cout, k, reps = (int(v) for v in sys.argv[1:7])
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
dev = torch.device("cuda:0")
cl = torch.channels_last
x = torch.rand(batch, cin, size, size, device=dev).to(memory_format=cl) - 0.5
w = torch.rand(cout, cin, k, k, device=dev).to(memory_format=cl) - 0.5
dy = torch.rand(batch, cout, size, size, device=dev).to(memory_format=cl) - 0.5
pad = k // 2
passes = (lambda: torch.nn.functional.conv2d(x, w, padding=pad),
          lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, padding=pad),
          lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, padding=pad))
for p in passes:
    for _ in range(3):
        p().sum().item()
    times = []
    for _ in range(reps):
        a = time.perf_counter(); p().sum().item(); times.append(time.perf_counter() - a)
    print(sorted(times)[len(times) // 2])
)PY";

const char* tf_script = R"PY(
import sys, time
import numpy as np
import tensorflow.compat.v1 as tf
tf.disable_eager_execution()
batch, size, cin, cout, k, reps, threads = (int(v) for v in sys.argv[1:8])
x = tf.placeholder(tf.float32, [batch, size, size, cin])
f = tf.placeholder(tf.float32, [k, k, cin, cout])
dy = tf.placeholder(tf.float32, [batch, size, size, cout])
y = tf.nn.conv2d(x, f, [1, 1, 1, 1], "SAME")
dx, df = tf.gradients(y, [x, f], dy)
rng = np.random.RandomState(0)
feeds = {x: rng.rand(batch, size, size, cin).astype(np.float32),
         f: rng.rand(k, k, cin, cout).astype(np.float32),
         dy: rng.rand(batch, size, size, cout).astype(np.float32)}
config = tf.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=1)
with tf.Session(config=config) as s:
    for t in (y, dx, df):
        s.run(t, feeds)
        times = []
        for _ in range(reps):
            a = time.perf_counter(); s.run(t, feeds); times.append(time.perf_counter() - a)
        print(sorted(times)[len(times) // 2])
)PY";

// The numbers a peer's script printed, one a line; other lines (a framework's own log
// lines on the same stream) are skipped.
std::vector<double> times_in(const std::string& output) {
  std::vector<double> times;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    char* end = nullptr;
    const double t = std::strtod(line.c_str(), &end);
    if (end != line.c_str() && *end == '\0')
      times.push_back(t);
  }
  return times;
}

// Times of PyTorch's three passes (the script's lines), or none when it failed.
std::vector<double> torch_times(const std::string& python, const std::string& script,
                                const conv_shape& c, int reps) {
  std::ostringstream cmd;
  cmd << loom::bench::shell_quote(python) << " " << loom::bench::shell_quote(script) << " "
      << c.batch << " " << c.size << " " << c.in << " " << c.out << " " << c.k << " " << reps;
  const auto r = loom::bench::run_command(cmd.str());
  std::vector<double> theirs = times_in(r.output);
  if (r.status != 0 || theirs.size() != 3) {
    std::printf("PyTorch unavailable:\n%s\n", r.output.c_str());
    theirs.clear();
  }
  return theirs;
}

int gpu_main(const std::string& python, int reps) {
  if (loom::gpu_count() == 0) {
    std::printf("conv2d --gpu: no CUDA device (or a build without CUDA); skipped\n");
    return 0;
  }
  const std::filesystem::path script =
      std::filesystem::temp_directory_path() / "loom-conv2d-torch.py";
  std::FILE* out = std::fopen(script.c_str(), "w");
  if (!out || std::fputs(torch_script, out) < 0 || std::fclose(out) != 0) {
    std::fprintf(stderr, "conv2d --gpu: cannot write %s\n", script.c_str());
    return 1;
  }
  std::printf("%-32s %-16s %10s %10s %10s %12s\n", "shape (gpu:0)", "pass", "loom ms", "GFLOP/s",
              "torch ms", "loom/torch");
  const char* passes[] = {"forward", "input gradient", "filter gradient"};
  for (const conv_shape& c : shapes) {
    const auto mine = loom_gpu_times(c, reps);
    const auto theirs = torch_times(python, script.string(), c, reps);
    for (int p = 0; p < 3; ++p) {
      std::printf("%-32s %-16s %10.3f %10.1f", c.name, passes[p], mine[p] * 1e3,
                  c.flops() / mine[p] / 1e9);
      if (!theirs.empty())
        std::printf(" %10.3f %12.2f", theirs[p] * 1e3, theirs[p] / mine[p]);
      std::printf("\n");
    }
  }
  std::printf("(loom/torch: PyTorch's time over loom's; above 1, loom is faster; each time "
              "includes a scalar's fetch)\n");
  return 0;
}

} // namespace

int main(int argc, char** argv) try {
  loom::flags flags("conv2d and its gradients alone, loom against TensorFlow.");
  flags.define_bool("tf", false, "Also run TensorFlow (PyPI, in build/tf-venv) on the same shapes")
      .define_bool("gpu", false, "On /gpu:0, against PyTorch's (cuDNN) on the same GPU")
      .define_string("python", "python3", "With --gpu: the Python that has PyTorch")
      .define_int("reps", 20, "Repetitions of each pass (the median is reported)")
      .define_int("threads", 2, "Intra-op threads of each (loom's pool and TF's)");
  if (!flags.parse(argc, argv))
    return 0;
  const int reps = static_cast<int>(flags.get_int("reps"));
  const int threads = static_cast<int>(flags.get_int("threads"));
  const bool with_tf = flags.get_bool("tf");
  if (flags.get_bool("gpu"))
    return gpu_main(flags.get_string("python"), reps);
  namespace fs = std::filesystem;
  const fs::path venv = fs::path(LOOM_BUILD_DIR) / "tf-venv";
  const std::string python = (venv / "bin" / "python").string();
  if (with_tf &&
      loom::bench::run_command(loom::bench::shell_quote(python) + " -c 'import tensorflow'")
              .status != 0) {
    std::printf("installing tensorflow-cpu 2.15.1 from PyPI into %s ...\n", venv.c_str());
    const auto r = loom::bench::run_command(
        "python3 -m venv " + loom::bench::shell_quote(venv.string()) + " && " +
        loom::bench::shell_quote((venv / "bin" / "pip").string()) +
        " install -q tensorflow-cpu==2.15.1");
    if (r.status != 0) {
      std::fprintf(stderr, "conv2d --tf: cannot install TensorFlow:\n%s", r.output.c_str());
      return 1;
    }
  }
  const fs::path script = fs::temp_directory_path() / "loom-conv2d-bench.py";
  if (with_tf) {
    std::FILE* out = std::fopen(script.c_str(), "w");
    if (!out || std::fputs(tf_script, out) < 0 || std::fclose(out) != 0) {
      std::fprintf(stderr, "conv2d --tf: cannot write %s\n", script.c_str());
      return 1;
    }
  }
  std::printf("%-32s %-16s %10s %10s %10s %10s\n", "shape", "pass", "loom ms", "GFLOP/s", "TF ms",
              "loom/TF");
  const char* passes[] = {"forward", "input gradient", "filter gradient"};
  for (const conv_shape& c : shapes) {
    const auto mine = loom_times(c, reps, threads);
    std::vector<double> theirs;
    if (with_tf) {
      std::ostringstream cmd;
      cmd << loom::bench::shell_quote(python) << " " << loom::bench::shell_quote(script.string())
          << " " << c.batch << " " << c.size << " " << c.in << " " << c.out << " " << c.k << " "
          << reps << " " << threads;
      const auto r = loom::bench::run_command("TF_CPP_MIN_LOG_LEVEL=2 " + cmd.str());
      theirs = times_in(r.output);
      if (r.status != 0 || theirs.size() != 3) {
        std::fprintf(stderr, "conv2d --tf: TensorFlow failed:\n%s", r.output.c_str());
        return 1;
      }
    }
    for (int p = 0; p < 3; ++p) {
      std::printf("%-32s %-16s %10.2f %10.1f", c.name, passes[p], mine[p] * 1e3,
                  c.flops() / mine[p] / 1e9);
      if (with_tf)
        std::printf(" %10.2f %10.2f", theirs[p] * 1e3, theirs[p] / mine[p]);
      std::printf("\n");
    }
  }
  if (with_tf)
    std::printf("(loom/TF: TF's time over loom's; above 1, loom is faster)\n");
  return 0;
} catch (const loom::error& e) {
  std::fprintf(stderr, "conv2d: %s\n", e.what());
  return 1;
}

// A small training run that writes TensorBoard event files for
// tests/train/tensorboard_test.sh: a regression on an in-process cluster
// (1 ps, 1 worker) under monitored_training_session, its loss and weights
// summarized every few steps by a summary_saver_hook, and a value computed on
// the host (examples/s) added to the same writer. It writes what it logged,
// from the run's own fetches, to <out>/expected.tsv, so that TensorBoard's
// reader is checked against the run and not against loom's writer:
//   every <N>                     the hook's every_n_steps
//   loss <global step> <value>    the loss fetched with every step
//   host <tag> <step> <value>     each value added on the host
//   weights <count>               elements in the weights histogram
// Usage: test_tensorboard_run <logdir> <out dir>
#include <loom/api.hpp>

#include <support/cluster.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <random>
#include <sstream>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " <logdir> <out dir>\n";
    return 2;
  }
  constexpr int features = 16, batch = 32, steps = 300, every = 10;
  loom::testing::local_cluster cluster(1, 1);
  loom::graph g;
  std::optional<loom::variable<std::int64_t, 0>> step;
  std::optional<loom::variable<float, 2>> w;
  loom::placeholder<float, 2> x(g, loom::shape{batch, features}, "x");
  loom::placeholder<float, 2> y(g, loom::shape{batch, 1}, "y");
  std::optional<loom::output<float, 0>> loss;
  std::optional<loom::operation> train;
  {
    auto _ = g.device(loom::replica_device_setter({.ps_tasks = 1}));
    step = loom::create_global_step(g);
    w.emplace(g, "w", loom::shape{features, 1}, loom::zeros_initializer{});
    loss = loom::lower(loom::reduce_mean(loom::square(loom::matmul(x, *w) - y)));
    train = loom::gradient_descent_optimizer{0.02}.minimize(*loss, *step);
  }
  {
    auto _ = g.name_scope("train");
    loom::scalar_summary("loss", *loss);
    loom::histogram_summary("weights", *w);
  }
  auto hook = std::make_shared<loom::summary_saver_hook>(
      loom::summary_saver_options{.logdir = argv[1], .every_n_steps = every});
  std::ostringstream placement_log;
  loom::monitored_session_options o;
  o.master = cluster.worker(0).target();
  o.config.placement_log = &placement_log;
  o.shutdown_cluster = false;
  o.hooks = {std::make_shared<loom::stop_at_step_hook>(steps)};
  o.chief_only_hooks = {hook};

  std::ofstream expected(std::string(argv[2]) + "/expected.tsv");
  expected << std::setprecision(9); // a float read back is the same float
  expected << "every\t" << every << "\nweights\t" << features << "\n";
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> w_true(features);
  for (int j = 0; j < features; ++j)
    w_true[j] = static_cast<float>(j % 5) - 2.0f;
  loom::monitored_training_session s(g, o);
  // One worker: the global step after the k-th run is k (s.global_step() is
  // the step read with the run, which may miss the run's own update).
  std::int64_t global_step = 0;
  while (!s.should_stop()) {
    std::vector<float> xs(batch * features), ys(batch);
    for (int i = 0; i < batch; ++i) {
      float dot = 0;
      for (int j = 0; j < features; ++j) {
        xs[i * features + j] = normal(rng);
        dot += xs[i * features + j] * w_true[j];
      }
      ys[i] = dot + 0.3f * normal(rng);
    }
    const auto started = std::chrono::steady_clock::now();
    auto [l, t] = s.run(loom::fetches(*loss, *train),
                        {{x, loom::tensor<float, 2>::from(
                                 loom::any_tensor::from_vector(loom::shape{batch, features}, xs))},
                         {y, loom::tensor<float, 2>::from(
                                 loom::any_tensor::from_vector(loom::shape{batch, 1}, ys))}});
    (void)t;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    ++global_step;
    expected << "loss\t" << global_step << "\t" << l.item() << "\n";
    if (global_step % 50 == 0) {
      const double rate = std::round(batch / secs);
      hook->writer().add_scalar("examples_per_sec", rate, global_step);
      expected << "host\texamples_per_sec\t" << global_step << "\t" << rate << "\n";
    }
  }
  s.close();
  return 0;
}

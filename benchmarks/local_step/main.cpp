// One training step of the seed's MLP (784 -> 100 -> 10, relu, softmax, the
// clipped-log cross entropy, Adam; batch 100) through a loom session against
// the same step written by hand with Eigen matrices (../mlp_eigen_step.hpp),
// in the same run.
//
//   local_step [REPETITIONS=30]   each repetition times 20 steps of each
//   local_step --smoke            one repetition of one step each: a test that the steps
//                                 still run (ctest bench_local_step_smoke); its figures mean
//                                 nothing
#include "../bench_util.hpp"
#include "../mlp_eigen_step.hpp"

#include <loom/data/mnist.hpp>
#include <loom/loom.hpp>

#include <Eigen/Dense>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string_view>

namespace {

namespace mlp = loom::bench::mlp;
using mlp::classes;
using mlp::hidden;
using mlp::in_dim;
using mlp::matrix;
constexpr int batch = 100, pool = 8;

} // namespace

int main(int argc, char** argv) {
  const bool smoke = argc > 1 && std::string_view(argv[1]) == "--smoke";
  const int reps = smoke ? 1 : argc > 1 ? std::atoi(argv[1]) : 30;
  const int inner = smoke ? 1 : 20;
  const int warm_up = smoke ? 1 : 20;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0, 1);
  std::vector<loom::tensor<float, 2>> xs, ys;
  std::vector<matrix> exs, eys;
  for (int k = 0; k < pool; ++k) {
    loom::tensor<float, 2> x(loom::shape{batch, in_dim}), y(loom::shape{batch, classes}, 0.f);
    for (auto& v : x.flat())
      v = u(rng);
    for (int i = 0; i < batch; ++i)
      y(i, static_cast<int>(rng() % classes)) = 1.f;
    exs.push_back(Eigen::Map<const matrix>(x.data(), batch, in_dim));
    eys.push_back(Eigen::Map<const matrix>(y.data(), batch, classes));
    xs.push_back(x);
    ys.push_back(y);
  }

  // loom: the graph of examples/mnist_local.
  loom::graph g;
  g.set_random_seed(1);
  using loom::shape;
  loom::variable<float, 2> w1(g, "hid_w", shape{in_dim, hidden},
                              loom::truncated_normal_initializer{.stddev = 1.0 / 28});
  loom::variable<float, 1> b1(g, "hid_b", shape{hidden}, loom::zeros_initializer{});
  loom::variable<float, 2> w2(g, "sm_w", shape{hidden, classes},
                              loom::truncated_normal_initializer{.stddev = 0.1});
  loom::variable<float, 1> b2(g, "sm_b", shape{classes}, loom::zeros_initializer{});
  loom::placeholder<float, 2> x(g, shape{-1, in_dim}, "x");
  loom::placeholder<float, 2> y_(g, shape{-1, classes}, "y_");
  auto y = loom::softmax(loom::xw_plus_b(loom::relu(loom::xw_plus_b(x, w1, b1)), w2, b2));
  auto loss = loom::lower(-loom::reduce_sum(y_ * loom::log(loom::clip_by_value(y, 1e-10, 1.0))));
  auto train = loom::adam_optimizer{0.001}.minimize(loss);
  loom::session sess(g);
  sess.run(loom::global_variables_initializer(g));
  loom::session sess1(g, {.intra_op_threads = 1});
  sess1.run(loom::global_variables_initializer(g));

  mlp::eigen_mlp ref(rng);
  int k = 0;
  auto loom_step = [&] {
    ++k;
    auto [_, l] = sess.run(loom::fetches(train, loss), {{x, xs[k % pool]}, {y_, ys[k % pool]}});
    (void)l;
  };
  int k1 = 0;
  auto loom_step1 = [&] {
    ++k1;
    auto [_, l] = sess1.run(loom::fetches(train, loss), {{x, xs[k1 % pool]}, {y_, ys[k1 % pool]}});
    (void)l;
  };
  int e = 0;
  volatile float sink = 0;
  auto eigen_step = [&] {
    ++e;
    sink = ref.step(exs[e % pool], eys[e % pool]);
  };
  for (int i = 0; i < warm_up; ++i) { // warm up: plans, caches, allocator
    loom_step();
    loom_step1();
    eigen_step();
  }
  const auto [eigen_s, loom_s, loom1_s] =
      loom::bench::alternated_median_seconds(reps, inner, eigen_step, loom_step, loom_step1);
  loom::bench::print_table("local_step: one MLP training step (784-100-10, batch 100, Adam)",
                           {{"hand-written Eigen step (baseline)", eigen_s},
                            {"loom session step", loom_s},
                            {"loom session step, 1 intra-op thread", loom1_s}});
  std::printf("\nloom / Eigen = %.3f (target <= 1.15); %d repetitions of %d steps, medians\n",
              loom_s / eigen_s, reps, inner);
  return 0;
}

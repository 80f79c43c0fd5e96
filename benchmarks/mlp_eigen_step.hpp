// The seed's MLP training step written by hand with Eigen matrices: 784 -> 100
// relu -> 10 softmax, the clipped-log cross entropy summed over the batch
// (reduce_sum), Adam. The baseline of benchmarks/local_step and
// benchmarks/train_throughput: the same math as loom's graph, op for op.
#pragma once

#include <Eigen/Dense>

#include <cmath>
#include <random>
#include <utility>

namespace loom::bench::mlp {

constexpr int in_dim = 784, hidden = 100, classes = 10;

using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using vector = Eigen::Matrix<float, 1, Eigen::Dynamic>;

struct adam_param {
  matrix w, m, v;
  explicit adam_param(matrix init)
      : w(std::move(init)), m(matrix::Zero(w.rows(), w.cols())),
        v(matrix::Zero(w.rows(), w.cols())) {}
  void apply(const matrix& g, float lr_t) {
    constexpr float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g.cwiseProduct(g);
    w.array() -= lr_t * m.array() / (v.array().sqrt() + eps);
  }
};

// One forward + backward + Adam step per call of step(x, labels), with x
// [batch, in_dim] and one-hot labels [batch, classes] (matrices or maps of a
// tensor's row-major buffer).
struct eigen_mlp {
  adam_param w1, b1, w2, b2;
  double beta1_power = 1, beta2_power = 1;
  float lr = 0.001f;
  explicit eigen_mlp(std::mt19937& rng)
      : w1(random(in_dim, hidden, rng)), b1(matrix::Zero(1, hidden)),
        w2(random(hidden, classes, rng)), b2(matrix::Zero(1, classes)) {}
  static matrix random(int r, int c, std::mt19937& rng) {
    std::normal_distribution<float> d(0, 0.05f);
    matrix m(r, c);
    for (int i = 0; i < m.size(); ++i)
      m.data()[i] = d(rng);
    return m;
  }

  float step(const Eigen::Ref<const matrix>& x, const Eigen::Ref<const matrix>& labels) {
    // forward
    matrix h_lin = x * w1.w;
    h_lin.rowwise() += Eigen::Map<const vector>(b1.w.data(), hidden);
    matrix h = h_lin.cwiseMax(0.f);
    matrix z = h * w2.w;
    z.rowwise() += Eigen::Map<const vector>(b2.w.data(), classes);
    matrix y = (z.colwise() - z.rowwise().maxCoeff()).array().exp();
    y.array().colwise() /= y.rowwise().sum().array();
    matrix clipped = y.cwiseMax(1e-10f).cwiseMin(1.f);
    const float loss = -(labels.array() * clipped.array().log()).sum();
    // backward
    matrix dy =
        (y.array() >= 1e-10f && y.array() <= 1.f).select(-labels.array() / clipped.array(), 0.f);
    matrix dz =
        y.array() * (dy.colwise() - (dy.array() * y.array()).rowwise().sum().matrix()).array();
    matrix dw2 = h.transpose() * dz;
    matrix db2 = dz.colwise().sum();
    matrix dh = (dz * w2.w.transpose()).array() * (h_lin.array() > 0.f).cast<float>();
    matrix dw1 = x.transpose() * dh;
    matrix db1 = dh.colwise().sum();
    // Adam
    beta1_power *= 0.9;
    beta2_power *= 0.999;
    const auto lr_t = static_cast<float>(lr * std::sqrt(1 - beta2_power) / (1 - beta1_power));
    w1.apply(dw1, lr_t);
    b1.apply(db1, lr_t);
    w2.apply(dw2, lr_t);
    b2.apply(db2, lr_t);
    return loss;
  }
};

} // namespace loom::bench::mlp

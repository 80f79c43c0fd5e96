// loom::layers (dense, conv2d, the poolings, flatten, dropout, batch and layer
// normalization, embedding) named and computed as tf.layers does, with regularizers and the
// update ops of batch normalization; the variance-scaling initializers' spread; loom::metrics
// (mean, accuracy, precision, recall, auc) over several batches, their reset, and their
// variables kept out of checkpoints.
#include <doctest/doctest.h>
#include <support/messages.hpp>

#include <loom/loom.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

using loom::graph;
using loom::shape;
using loom::tensor;
using loom::testing::contains;
using loom::testing::message_of;

namespace {
std::vector<double> values_in(const loom::any_tensor& t) {
  const auto f = t.flat<double>();
  return std::vector<double>(f.begin(), f.end());
}
template <int R> std::vector<double> values_in(const tensor<double, R>& t) {
  return values_in(t.value());
}
} // namespace

TEST_CASE("dense: TF's variable names, x w + b, an activation and a regularizer") {
  graph g;
  loom::placeholder<double, 2> x(g, shape{-1, 3}, "x");
  auto y = loom::layers::dense(x, 2, {.kernel_regularizer = loom::l2_regularizer(0.5)},
                               loom::activations::relu);
  auto z = loom::layers::dense(y, 4, {.use_bias = false});
  CHECK(g.try_find("dense/kernel"));
  CHECK(g.try_find("dense/bias"));
  CHECK(g.try_find("dense_1/kernel"));
  CHECK(!g.try_find("dense_1/bias"));
  CHECK(z.shape() == shape{-1, 4});
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  const auto w = values_in(s.run_nodes({g.find("dense/kernel")}, {}, {})[0]);
  const auto xv = tensor<double, 2>(shape{2, 3}, {1, -2, 0.5, 0, 1, 1});
  const auto got = values_in(s.run(y, {{x, xv}}));
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 2; ++c) {
      double sum = 0; // the bias starts at zero
      for (int k = 0; k < 3; ++k)
        sum +=
            xv.flat()[static_cast<std::size_t>(r * 3 + k)] * w[static_cast<std::size_t>(k * 2 + c)];
      CHECK(got[static_cast<std::size_t>(r * 2 + c)] == doctest::Approx(std::max(sum, 0.0)));
    }
  double squares = 0;
  for (double v : w)
    squares += v * v;
  CHECK(s.run(loom::get_regularization_loss(g)).flat()[0] ==
        doctest::Approx(0.5 * squares / 2).epsilon(1e-6));
  CHECK(contains(message_of<loom::invalid_argument_error>([&] { loom::layers::dense(x, 0); }),
                 "0 units"));
}

TEST_CASE("conv2d, pooling and flatten layers: shapes and names as tf.layers'") {
  graph g;
  loom::placeholder<float, 4> images(g, shape{-1, 28, 28, 1}, "images");
  auto c1 = loom::layers::conv2d(images, 32, {5, 5}, {.padding = "SAME"}, loom::activations::relu);
  auto p1 = loom::layers::max_pooling2d(c1, {2, 2}, {2, 2});
  auto c2 = loom::layers::conv2d(p1, 64, {5, 5}, {.padding = "SAME"});
  auto p2 = loom::layers::average_pooling2d(c2, {2, 2}, {2, 2});
  auto flat = loom::layers::flatten(p2);
  CHECK(c1.shape() == shape{-1, 28, 28, 32});
  CHECK(p2.shape() == shape{-1, 7, 7, 64});
  CHECK(flat.shape() == shape{-1, 7 * 7 * 64});
  CHECK(g.node(g.find("conv2d_1/kernel")).shape == shape{5, 5, 32, 64});
  CHECK(g.node(g.find("conv2d/bias")).shape == shape{32});
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  CHECK(s.run(flat, {{images, tensor<float, 4>(shape{2, 28, 28, 1}, 0.5f)}}).shape() ==
        shape{2, 3136});
}

TEST_CASE("separable_conv2d: a depthwise then a pointwise convolution, tf.layers' names") {
  graph g;
  loom::placeholder<float, 4> images(g, shape{-1, 4, 4, 2}, "images");
  auto y = loom::layers::separable_conv2d(images, 3, {3, 3},
                                          {.depth_multiplier = 2,
                                           .depthwise_initializer = loom::ones_initializer{},
                                           .pointwise_initializer = loom::ones_initializer{}});
  auto y2 = loom::layers::separable_conv2d(y, 5, {1, 1}, {.padding = "SAME", .use_bias = false});
  CHECK(y.shape() == shape{-1, 2, 2, 3});
  CHECK(y2.shape() == shape{-1, 2, 2, 5});
  CHECK(g.node(g.find("separable_conv2d/depthwise_kernel")).shape == shape{3, 3, 2, 2});
  CHECK(g.node(g.find("separable_conv2d/pointwise_kernel")).shape == shape{1, 1, 4, 3});
  CHECK(g.node(g.find("separable_conv2d/bias")).shape == shape{3});
  CHECK(g.node(g.find("separable_conv2d_1/pointwise_kernel")).shape == shape{1, 1, 3, 5});
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  // Each depthwise output sums a 3x3 window of 0.5s (4.5); the pointwise sums 4 channels.
  const auto got = s.run(y, {{images, tensor<float, 4>(shape{1, 4, 4, 2}, 0.5f)}});
  for (float v : got.flat())
    CHECK(v == doctest::Approx(18.f));
}

TEST_CASE("batch_normalization: batch statistics and update ops while training, averages after") {
  graph g;
  loom::placeholder<double, 2> x(g, shape{-1, 2}, "x");
  loom::placeholder<bool, 0> training(g, shape{}, "training");
  auto y = loom::layers::batch_normalization(x, training, {.momentum = 0.9, .epsilon = 1e-9});
  const auto& updates = g.collection(loom::collection::update_ops);
  REQUIRE(updates.size() == 2);
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  const auto xv = tensor<double, 2>(shape{4, 2}, {1, 10, 2, 20, 3, 30, 4, 40});
  // Training: each column to mean 0 and variance 1.
  const auto got = values_in(s.run(y, {{x, xv}, {training, true}}));
  for (int c = 0; c < 2; ++c) {
    double mean = 0, var = 0;
    for (int r = 0; r < 4; ++r)
      mean += got[static_cast<std::size_t>(r * 2 + c)] / 4;
    for (int r = 0; r < 4; ++r)
      var += std::pow(got[static_cast<std::size_t>(r * 2 + c)] - mean, 2) / 4;
    CHECK(std::abs(mean) < 1e-9);
    CHECK(var == doctest::Approx(1.0));
  }
  std::vector<loom::node_id> fetch(updates.begin(), updates.end());
  s.run_nodes(fetch, {},
              {{x.id(), xv.value()}, {training.id(), loom::any_tensor::scalar<bool>(true)}});
  const auto moving_mean =
      values_in(s.run_nodes({g.find("batch_normalization/moving_mean")}, {}, {})[0]);
  CHECK(moving_mean[0] == doctest::Approx(0.1 * 2.5));
  CHECK(moving_mean[1] == doctest::Approx(0.1 * 25));
  const auto moving_var =
      values_in(s.run_nodes({g.find("batch_normalization/moving_variance")}, {}, {})[0]);
  CHECK(moving_var[0] == doctest::Approx(0.9 + 0.1 * 1.25));
  // Not training: the updates leave the averages, and y uses them.
  s.run_nodes(fetch, {},
              {{x.id(), xv.value()}, {training.id(), loom::any_tensor::scalar<bool>(false)}});
  CHECK(values_in(s.run_nodes({g.find("batch_normalization/moving_mean")}, {}, {})[0]) ==
        moving_mean);
  const auto inference = values_in(s.run(y, {{x, xv}, {training, false}}));
  CHECK(inference[0] == doctest::Approx((1 - 0.25) / std::sqrt(moving_var[0] + 1e-9)));
}

TEST_CASE("batch_normalization of NHWC images moves the variance toward the unbiased one, as TF") {
  graph g;
  loom::placeholder<double, 4> x(g, shape{-1, 2, 1, 1}, "x");
  auto y = loom::layers::batch_normalization(x, true, {.momentum = 0.5});
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  const auto xv = tensor<double, 4>(shape{2, 2, 1, 1}, {1, 2, 3, 6});
  const auto& updates = g.collection(loom::collection::update_ops);
  std::vector<loom::node_id> fetch(updates.begin(), updates.end());
  fetch.push_back(y.id());
  s.run_nodes(fetch, {}, {{x.id(), xv.value()}});
  // One channel over n = 4 values: mean 3, variance 3.5, unbiased 14 / 3.
  const auto moving_var =
      values_in(s.run_nodes({g.find("batch_normalization/moving_variance")}, {}, {})[0]);
  CHECK(moving_var[0] == doctest::Approx(0.5 + 0.5 * 14.0 / 3));
  const auto moving_mean =
      values_in(s.run_nodes({g.find("batch_normalization/moving_mean")}, {}, {})[0]);
  CHECK(moving_mean[0] == doctest::Approx(1.5));
}

TEST_CASE("layer_normalization and an embedding layer") {
  graph g;
  loom::placeholder<double, 2> x(g, shape{-1, 4}, "x");
  auto y = loom::layers::layer_normalization(x, 1e-12);
  loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
  auto rows = loom::layers::embedding<double>(ids, 10, 3);
  CHECK(rows.shape() == shape{-1, 3});
  CHECK(g.node(g.find("embedding/embeddings")).shape == shape{10, 3});
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  const auto got = values_in(s.run(y, {{x, tensor<double, 2>(shape{1, 4}, {1, 2, 3, 4})}}));
  const double sd = std::sqrt(1.25);
  CHECK(got[0] == doctest::Approx(-1.5 / sd));
  CHECK(got[3] == doctest::Approx(1.5 / sd));
  CHECK(s.run(rows, {{ids, tensor<std::int64_t, 1>(shape{2}, {3, 9})}}).shape() == shape{2, 3});
}

TEST_CASE("variance-scaling initializers draw with TF's spread") {
  graph g;
  auto he = loom::get_variable<double, 2>(g, "he", shape{200, 300}, loom::he_normal_initializer{});
  auto glorot = loom::get_variable<double, 2>(g, "glorot", shape{200, 300},
                                              loom::glorot_normal_initializer{});
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  auto variance = [&](const auto& v) {
    const auto t = values_in(s.run_nodes({v.id()}, {}, {})[0]);
    double sum = 0;
    for (double e : t)
      sum += e * e;
    return sum / static_cast<double>(t.size());
  };
  CHECK(variance(he) == doctest::Approx(2.0 / 200).epsilon(0.05));
  CHECK(variance(glorot) == doctest::Approx(2.0 / 500).epsilon(0.05));
}

TEST_CASE("metrics accumulate over batches, reset, and stay out of checkpoints") {
  graph g;
  loom::placeholder<std::int64_t, 1> labels(g, shape{-1}, "labels");
  loom::placeholder<std::int64_t, 1> predicted(g, shape{-1}, "predicted");
  loom::placeholder<bool, 1> truth(g, shape{-1}, "truth");
  loom::placeholder<double, 1> scores(g, shape{-1}, "scores");
  auto acc = loom::metrics::accuracy(labels, predicted);
  auto prec = loom::metrics::precision(truth, loom::greater(scores, 0.5));
  auto rec = loom::metrics::recall(truth, loom::greater(scores, 0.5));
  auto roc = loom::metrics::auc(truth, scores, 5);
  auto mean = loom::metrics::mean(scores);
  CHECK(g.collection(loom::collection::global_variables).empty());
  CHECK(g.collection(loom::collection::local_variables).size() == 12);
  loom::session s(g);
  s.run(loom::local_variables_initializer(g));
  const std::vector<bool> t1{true, false, true, false}, t2{true, true};
  const std::vector<double> p1{0.9, 0.6, 0.4, 0.1}, p2{0.8, 0.3};
  auto feed = [&](const std::vector<std::int64_t>& l, const std::vector<std::int64_t>& p,
                  const std::vector<bool>& t, const std::vector<double>& sc) {
    const auto n = static_cast<std::int64_t>(l.size());
    REQUIRE(t.size() == l.size());
    tensor<bool, 1> tt(shape{n});
    for (std::size_t i = 0; i < t.size(); ++i)
      tt.data()[i] = t[i];
    return loom::feed_dict{{labels, tensor<std::int64_t, 1>(shape{n}, l)},
                           {predicted, tensor<std::int64_t, 1>(shape{n}, p)},
                           {truth, tt},
                           {scores, tensor<double, 1>(shape{n}, sc)}};
  };
  const auto all = loom::group(g, acc.update, prec.update, rec.update, roc.update, mean.update);
  s.run(all, feed({1, 2, 3, 4}, {1, 2, 0, 0}, t1, p1));
  s.run(all, feed({5, 6}, {5, 0}, t2, p2));
  CHECK(s.run(acc.value).flat()[0] == doctest::Approx(3.0 / 6));
  // Positives by score > 0.5: 0.9 (true), 0.6 (false), 0.8 (true): tp 2, fp 1, fn 2.
  CHECK(s.run(prec.value).flat()[0] == doctest::Approx(2.0 / 3));
  CHECK(s.run(rec.value).flat()[0] == doctest::Approx(2.0 / 4));
  CHECK(s.run(mean.value).flat()[0] == doctest::Approx((0.9 + 0.6 + 0.4 + 0.1 + 0.8 + 0.3) / 6));
  // auc by TF's formula at thresholds -1e-7, 0.25, 0.5, 0.75, 1 + 1e-7.
  const std::vector<double> th{-1e-7, 0.25, 0.5, 0.75, 1 + 1e-7};
  const std::vector<bool> t{true, false, true, false, true, true};
  const std::vector<double> p{0.9, 0.6, 0.4, 0.1, 0.8, 0.3};
  std::vector<double> x, y;
  for (double thr : th) {
    double tp = 0, fn = 0, tn = 0, fp = 0;
    for (std::size_t i = 0; i < t.size(); ++i) {
      const bool pos = p[i] > thr;
      (t[i] ? (pos ? tp : fn) : (pos ? fp : tn)) += 1;
    }
    y.push_back((tp + 1e-6) / (tp + fn + 1e-6));
    x.push_back(fp / (fp + tn + 1e-6));
  }
  double want = 0;
  for (std::size_t i = 0; i + 1 < th.size(); ++i)
    want += (x[i] - x[i + 1]) * (y[i] + y[i + 1]) / 2;
  CHECK(s.run(roc.value).flat()[0] == doctest::Approx(want).epsilon(1e-12));
  s.run(acc.reset);
  CHECK(s.run(acc.value).flat()[0] == 0.0);
  CHECK(contains(
      message_of<loom::invalid_argument_error>([&] { loom::metrics::auc(truth, scores, 1); }),
      "num_thresholds 1 must be 2 or more"));
}

TEST_CASE("exact_auc: the Mann-Whitney statistic over every batch, ties half, reset") {
  graph g;
  loom::placeholder<bool, 1> truth(g, shape{-1}, "truth");
  loom::placeholder<double, 1> scores(g, shape{-1}, "scores");
  auto exact = loom::metrics::exact_auc(truth, scores);
  auto fine = loom::metrics::auc(truth, scores, 5001);
  loom::session s(g);
  s.run(loom::local_variables_initializer(g));
  auto feed = [&](const std::vector<bool>& t, const std::vector<double>& sc) {
    const auto n = static_cast<std::int64_t>(t.size());
    tensor<bool, 1> tt(shape{n});
    for (std::size_t i = 0; i < t.size(); ++i)
      tt.data()[i] = t[i];
    return loom::feed_dict{{truth, tt}, {scores, tensor<double, 1>(shape{n}, sc)}};
  };
  CHECK(s.run(exact.value).flat()[0] == 0.0); // nothing seen yet
  // Positives 0.9, 0.4, 0.8 against negatives 0.1, 0.4: 5 pairs ordered, 1 tied, of 6.
  s.run(exact.update, feed({true, false, true}, {0.9, 0.1, 0.4}));
  s.run(exact.update, feed({false, true}, {0.4, 0.8}));
  CHECK(s.run(exact.value).flat()[0] == doctest::Approx(5.5 / 6));
  s.run(exact.reset);
  CHECK(s.run(exact.value).flat()[0] == 0.0);
  // On scores without ties, the thresholded form with fine thresholds agrees.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<bool> t;
  std::vector<double> sc;
  for (int i = 0; i < 500; ++i) {
    sc.push_back(u(rng));
    t.push_back(u(rng) < sc.back()); // positives score higher on the whole
  }
  s.run(loom::group(g, exact.update, fine.update), feed(t, sc));
  const double e = s.run(exact.value).flat()[0];
  CHECK(e > 0.7);
  CHECK(e == doctest::Approx(s.run(fine.value).flat()[0]).epsilon(1e-3));
  // Initializing the local variables forgets the pairs, as it resets every metric.
  s.run(loom::local_variables_initializer(g));
  s.run(exact.update, feed({true, false}, {0.2, 0.7}));
  CHECK(s.run(exact.value).flat()[0] == 0.0);
  CHECK(contains(message_of<loom::invalid_argument_error>(
                     [&] { s.run(exact.update, feed({true}, {std::nan("")})); }),
                 "prediction 0 is NaN"));
}

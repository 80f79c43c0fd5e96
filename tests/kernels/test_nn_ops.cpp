// fused_batch_norm (the batch's moments and TF's reported variance, the inference form, its
// errors), dropout (a seeded mask of the input's run-time shape, inverted scaling, nothing while
// not training, a rate outside [0, 1) refused), leaky_relu and l2_loss.
#include <doctest/doctest.h>
#include <support/messages.hpp>

#include <loom/loom.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

using loom::graph;
using loom::shape;
using loom::tensor;
using loom::testing::contains;
using loom::testing::message_of;

TEST_CASE("dropout keeps 1 - rate of the elements, scaled, over a batch of any size") {
  graph g;
  loom::placeholder<float, 2> x(g, shape{-1, 1000}, "x");
  loom::placeholder<bool, 0> training(g, shape{}, "training");
  auto dropped = loom::dropout(x, 0.3, 7);
  auto switched = loom::dropout(x, 0.3, 8, training);
  loom::session s(g);
  const auto ones = tensor<float, 2>(shape{20, 1000}, 1.f);
  const auto got = s.run(dropped, {{x, ones}});
  REQUIRE(got.shape() == shape{20, 1000});
  std::int64_t kept = 0;
  for (float v : got.flat()) {
    CHECK((v == 0.f || std::abs(v - 1.f / 0.7f) < 1e-6f));
    kept += v != 0.f;
  }
  // 20 000 draws at p = 0.7: the count is within 5 standard deviations (65) of 14 000.
  CHECK(std::abs(kept - 14000) < 330);
  // Another step draws another mask.
  const auto again = s.run(dropped, {{x, ones}});
  CHECK(std::vector<float>(again.flat().begin(), again.flat().end()) !=
        std::vector<float>(got.flat().begin(), got.flat().end()));
  const auto off = s.run(switched, {{x, ones}, {training, false}});
  for (float v : off.flat())
    CHECK(v == 1.f);
  const auto on = s.run(switched, {{x, ones}, {training, true}});
  CHECK(std::count(on.flat().begin(), on.flat().end(), 0.f) > 0);
  CHECK(loom::dropout(x, 0.5, std::nullopt, false).id() == x.id());
  CHECK(contains(message_of<loom::invalid_argument_error>([&] { loom::dropout(x, 1.0); }),
                 "rate 1.000000 is outside [0, 1)"));
  CHECK(contains(message_of<loom::invalid_argument_error>([&] { loom::dropout(x, -0.1); }),
                 "is outside [0, 1)"));
}

TEST_CASE("the same seeds give the same dropout masks in two graphs") {
  auto mask = [] {
    graph g;
    g.set_random_seed(42);
    loom::placeholder<double, 1> x(g, shape{-1}, "x");
    loom::session s(g);
    const auto t = s.run(loom::dropout(x, 0.5, 3), {{x, tensor<double, 1>(shape{64}, 1.0)}});
    return std::vector<double>(t.flat().begin(), t.flat().end());
  };
  CHECK(mask() == mask());
}

TEST_CASE("leaky_relu and l2_loss") {
  graph g;
  loom::placeholder<double, 1> x(g, shape{4}, "x");
  loom::session s(g);
  const auto xv = tensor<double, 1>(shape{4}, {-2, -0.5, 0, 3});
  const auto y = s.run(loom::lower(loom::leaky_relu(x, 0.1)), {{x, xv}});
  CHECK(std::vector<double>(y.flat().begin(), y.flat().end()) ==
        std::vector<double>{-0.2, -0.05, 0, 3});
  auto [dx] = loom::gradients(loom::reduce_sum(loom::leaky_relu(x, 0.1)), x);
  const auto d = s.run(dx, {{x, xv}});
  CHECK(std::vector<double>(d.flat().begin(), d.flat().end()) ==
        std::vector<double>{0.1, 0.1, 0.1, 1});
  CHECK(s.run(loom::l2_loss(x), {{x, xv}}).flat()[0] == doctest::Approx(0.5 * (4 + 0.25 + 9)));
}

TEST_CASE("batch_matmul against per-batch products, broadcast batches, and its errors") {
  graph g;
  loom::placeholder<double, 3> a(g, shape{-1, 2, 3}, "a");
  loom::placeholder<double, 2> b(g, shape{3, 2}, "b");
  loom::placeholder<double, 3> bt(g, shape{4, 2, 3}, "bt");
  auto ab = loom::batch_matmul(a, b);
  auto abt = loom::batch_matmul(a, bt, false, true);
  CHECK(ab.shape() == shape{-1, 2, 2});
  loom::session s(g);
  std::vector<double> av(24), bv(6), btv(24);
  for (std::size_t i = 0; i < av.size(); ++i)
    av[i] = static_cast<double>(i % 7) - 3;
  for (std::size_t i = 0; i < bv.size(); ++i)
    bv[i] = static_cast<double>(i) * 0.5 - 1;
  for (std::size_t i = 0; i < btv.size(); ++i)
    btv[i] = static_cast<double>(i % 5) - 2;
  const auto at = tensor<double, 3>(shape{4, 2, 3}, av);
  const auto got = s.run(ab, {{a, at}, {b, tensor<double, 2>(shape{3, 2}, bv)}});
  const auto got_t = s.run(abt, {{a, at}, {bt, tensor<double, 3>(shape{4, 2, 3}, btv)}});
  REQUIRE(got.shape() == shape{4, 2, 2});
  for (int n = 0; n < 4; ++n)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) {
        double want = 0, want_t = 0;
        for (int k = 0; k < 3; ++k) {
          want += av[static_cast<std::size_t>(n * 6 + i * 3 + k)] *
                  bv[static_cast<std::size_t>(k * 2 + j)];
          want_t += av[static_cast<std::size_t>(n * 6 + i * 3 + k)] *
                    btv[static_cast<std::size_t>(n * 6 + j * 3 + k)];
        }
        CHECK(got.flat()[static_cast<std::size_t>(n * 4 + i * 2 + j)] == doctest::Approx(want));
        CHECK(got_t.flat()[static_cast<std::size_t>(n * 4 + i * 2 + j)] == doctest::Approx(want_t));
      }
  loom::placeholder<double, 3> wrong(g, shape{4, 4, 2}, "wrong");
  CHECK(contains(message_of<loom::invalid_argument_error>([&] { loom::batch_matmul(a, wrong); }),
                 "the inner dimensions 3 and 4 differ"));
  loom::placeholder<double, 3> other_batch(g, shape{3, 3, 2}, "other_batch");
  CHECK(contains(
      message_of<loom::invalid_argument_error>([&] { loom::batch_matmul(bt, other_batch); }),
      "batch dimensions 4 and 3 do not broadcast"));
}

TEST_CASE_TEMPLATE("fused_batch_norm: the batch's statistics, TF's reported variance, inference", T,
                   float, double) {
  graph g;
  loom::placeholder<T, 2> x(g, shape{-1, 2}, "x");
  const auto scale = loom::constant(g, tensor<T, 1>(shape{2}, {T(2), T(1)}));
  const auto offset = loom::constant(g, tensor<T, 1>(shape{2}, {T(0.5), T(0)}));
  auto [y, mean, variance] = loom::fused_batch_norm(x, scale, offset, 1e-3);
  auto inference =
      loom::fused_batch_norm(x, scale, offset, mean * T(0) + T(1), variance * T(0) + T(3), 1e-3);
  loom::session s(g);
  const auto xv = tensor<T, 2>(shape{4, 2}, {1, 10, 2, 20, 3, 30, 4, 40});
  const auto got = s.run(y, {{x, xv}});
  const auto m = s.run(mean, {{x, xv}});
  const auto v = s.run(variance, {{x, xv}});
  // Columns: mean 2.5 and 25, variance 1.25 and 125 (reported times 4 / 3).
  CHECK(m.flat()[0] == doctest::Approx(2.5));
  CHECK(m.flat()[1] == doctest::Approx(25));
  CHECK(v.flat()[0] == doctest::Approx(1.25 * 4 / 3));
  CHECK(v.flat()[1] == doctest::Approx(125.0 * 4 / 3));
  for (int r = 0; r < 4; ++r) {
    const double x0 = r + 1, x1 = 10.0 * (r + 1);
    CHECK(got.flat()[static_cast<std::size_t>(2 * r)] ==
          doctest::Approx(2 * (x0 - 2.5) / std::sqrt(1.25 + 1e-3) + 0.5).epsilon(1e-5));
    CHECK(got.flat()[static_cast<std::size_t>(2 * r + 1)] ==
          doctest::Approx((x1 - 25) / std::sqrt(125 + 1e-3)).epsilon(1e-5));
  }
  const auto inf = s.run(inference.y, {{x, xv}});
  CHECK(inf.flat()[0] == doctest::Approx(2 * (1 - 1) / std::sqrt(3 + 1e-3) + 0.5));
  CHECK(inf.flat()[1] == doctest::Approx((10 - 1) / std::sqrt(3 + 1e-3)).epsilon(1e-5));
}

TEST_CASE("fused_batch_norm over NHWC: every channel's statistics over batch, height and width") {
  graph g;
  loom::placeholder<float, 4> x(g, shape{-1, 5, 7, 3}, "x");
  const auto ones = loom::constant(g, tensor<float, 1>(shape{3}, 1.f));
  const auto zeros = loom::constant(g, tensor<float, 1>(shape{3}, 0.f));
  auto [y, mean, variance] = loom::fused_batch_norm(x, ones, zeros, 1e-5);
  tensor<float, 4> xv(shape{6, 5, 7, 3});
  for (std::size_t e = 0; e < xv.flat().size(); ++e) // channel c: large offset, spread c + 1
    xv.data()[e] = static_cast<float>(1000.0 * (e % 3) + (e % 3 + 1) * std::sin(double(e)));
  loom::session s(g, loom::session_options{.intra_op_threads = 2});
  const auto got = s.run(y, {{x, xv}});
  const auto m = s.run(mean, {{x, xv}});
  for (std::size_t c = 0; c < 3; ++c) {
    double sum = 0, squares = 0, n = 0;
    for (std::size_t e = c; e < xv.flat().size(); e += 3, ++n)
      sum += xv.data()[e];
    for (std::size_t e = c; e < xv.flat().size(); e += 3)
      squares += std::pow(xv.data()[e] - sum / n, 2);
    CHECK(m.flat()[c] == doctest::Approx(sum / n).epsilon(1e-6));
    double y_sum = 0, y_squares = 0;
    for (std::size_t e = c; e < xv.flat().size(); e += 3)
      y_sum += got.flat()[e], y_squares += std::pow(got.flat()[e], 2);
    CHECK(std::abs(y_sum / n) < 1e-4);
    CHECK(y_squares / n == doctest::Approx(squares / n / (squares / n + 1e-5)).epsilon(1e-4));
  }
}

TEST_CASE("fused_batch_norm's errors name the node and the shapes") {
  graph g;
  loom::placeholder<float, 4> x(g, shape{-1, 4, 4, 3}, "images");
  const auto three = loom::constant(g, tensor<float, 1>(shape{3}, 1.f));
  const auto four = loom::constant(g, tensor<float, 1>(shape{4}, 1.f));
  CHECK(contains(
      message_of<loom::invalid_argument_error>([&] { loom::fused_batch_norm(x, four, three); }),
      "must be a vector of 3 float32"));
  CHECK(contains(message_of<loom::invalid_argument_error>(
                     [&] { loom::fused_batch_norm(x, three, three, 0.0); }),
                 "must be positive"));
  loom::placeholder<float, 4> unknown(g, shape{-1, 4, 4, -1}, "unknown_channels");
  CHECK(contains(message_of<loom::invalid_argument_error>(
                     [&] { loom::fused_batch_norm(unknown, three, three); }),
                 "unknown_channels"));
  // A per-channel input known only when it runs, of the wrong length.
  loom::placeholder<float, 1> scale(g, shape{-1}, "scale");
  auto bn = loom::fused_batch_norm(x, scale, three).y;
  loom::session s(g);
  CHECK(contains(message_of<loom::invalid_argument_error>([&] {
                   s.run(bn, {{x, tensor<float, 4>(shape{1, 4, 4, 3}, 1.f)},
                              {scale, tensor<float, 1>(shape{2}, 1.f)}});
                 }),
                 "the scale of shape [2] must be [3], one per channel"));
}

// Reverse-mode autodiff: the gradient of every differentiable op against
// central finite differences in double (inputs from a seeded RNG, away from
// kinks), broadcasting, reductions, softmax and the cross-entropies, matmul
// with transposes, reshape, the MNIST cross-entropy, accumulation of adjoints,
// second-order gradients and what gradients() returns for an unrelated x.
#include <doctest/doctest.h>

#include <loom/loom.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

using loom::any_tensor;
using loom::graph;
using loom::node_id;
using loom::shape;
using loom::tensor;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

using feeds_t = std::vector<std::pair<node_id, any_tensor>>;

std::mt19937_64& rng() {
  static std::mt19937_64 r(20240607);
  return r;
}

// Values in [lo, hi) that keep at least `margin` away from every kink.
any_tensor random_tensor(const shape& s, double lo, double hi, std::vector<double> kinks = {},
                         double margin = 0.05) {
  std::uniform_real_distribution<double> d(lo, hi);
  any_tensor t(loom::dtype::f64, s);
  for (double& v : t.flat<double>()) {
    bool ok = false;
    while (!ok) {
      v = d(rng());
      ok = std::all_of(kinks.begin(), kinks.end(),
                       [&](double k) { return std::abs(v - k) >= margin; });
    }
  }
  return t;
}

double sum_of(const any_tensor& t) {
  double s = 0;
  for (double v : t.flat<double>())
    s += v;
  return s;
}

// Checks the gradient of sum(y) with respect to each x (a node fed with the
// given value) against central differences; `others` feeds the rest.
void check_gradients(graph& g, node_id y, const feeds_t& xs, const feeds_t& others = {},
                     double tol = 1e-6) {
  std::vector<node_id> ids;
  for (const auto& [id, v] : xs)
    ids.push_back(id);
  const std::vector<node_id> grads = loom::gradients(g, {y}, ids);
  REQUIRE(grads.size() == xs.size());
  for (node_id d : grads)
    REQUIRE(d != loom::no_node);

  loom::session s(g, loom::session_options{.intra_op_threads = 2});
  feeds_t all = others;
  for (const auto& x : xs)
    all.push_back(x);
  const std::vector<any_tensor> analytic = s.run_nodes(grads, {}, all);

  auto f = [&](std::size_t which, std::size_t element, double delta) {
    feeds_t fd = others;
    for (std::size_t k = 0; k < xs.size(); ++k) {
      any_tensor v = xs[k].second.clone();
      if (k == which)
        v.flat<double>()[element] += delta;
      fd.emplace_back(xs[k].first, std::move(v));
    }
    return sum_of(s.run_nodes({y}, {}, fd)[0]);
  };
  for (std::size_t k = 0; k < xs.size(); ++k) {
    INFO("gradient with respect to '" << g.node(xs[k].first).name << "' of '" << g.node(y).name
                                      << "'");
    REQUIRE(analytic[k].type() == loom::dtype::f64);
    REQUIRE(analytic[k].shape() == xs[k].second.shape());
    const auto values = xs[k].second.flat<double>();
    for (std::size_t e = 0; e < values.size(); ++e) {
      const double h = 1e-5 * std::max(1.0, std::abs(values[e]));
      const double numeric = (f(k, e, h) - f(k, e, -h)) / (2 * h);
      const double a = analytic[k].flat<double>()[e];
      INFO("element " << e << ": analytic " << a << ", numeric " << numeric);
      CHECK(std::abs(a - numeric) <= tol * std::max({1.0, std::abs(a), std::abs(numeric)}));
    }
  }
}

node_id placeholder(graph& g, const shape& s, const std::string& name) {
  return g.add_node("placeholder", {}, {{"dtype", loom::dtype::f64}, {"shape", s}}, name);
}

// sum(y * w) for fixed random weights w, so that no gradient is trivially ones.
node_id weighted(graph& g, node_id y, feeds_t& others) {
  const shape s = g.node(y).shape;
  node_id w = placeholder(g, s, "weights");
  others.emplace_back(w, random_tensor(s, -1, 1));
  return loom::detail::build::mul(g, y, w);
}

} // namespace

TEST_CASE("unary elementwise ops") {
  struct unary {
    const char* op;
    double lo, hi;
    std::vector<double> kinks;
  };
  for (const unary& u :
       {unary{"neg", -2, 2, {}}, unary{"exp", -2, 2, {}}, unary{"log", 0.2, 3, {}},
        unary{"sqrt", 0.2, 3, {}}, unary{"square", -2, 2, {}}, unary{"abs", -2, 2, {0}},
        unary{"relu", -2, 2, {0}}, unary{"sigmoid", -3, 3, {}}, unary{"tanh", -2, 2, {}},
        unary{"reciprocal", 0.3, 2, {}}, unary{"identity", -2, 2, {}}, unary{"rsqrt", 0.3, 2, {}},
        unary{"elu", -2, 2, {0}}, unary{"softplus", -3, 3, {}}, unary{"cos", -3, 3, {}},
        unary{"sin", -3, 3, {}}}) {
    INFO("op " << u.op);
    graph g;
    feeds_t others;
    const node_id x = placeholder(g, shape{3, 4}, "x");
    const node_id y = weighted(g, g.add_node(u.op, {x}), others);
    check_gradients(g, y, {{x, random_tensor(shape{3, 4}, u.lo, u.hi, u.kinks)}}, others);
  }
}

TEST_CASE("binary elementwise ops, with every kind of broadcasting") {
  struct shapes {
    shape a, b;
  };
  for (const char* op : {"add", "sub", "mul", "div", "maximum", "minimum", "pow"}) {
    for (const shapes& sh :
         {shapes{shape{3, 4}, shape{3, 4}}, shapes{shape{3, 4}, shape{4}},
          shapes{shape{3, 4}, shape{3, 1}}, shapes{shape{}, shape{3, 4}},
          shapes{shape{2, 1, 3}, shape{4, 1}}, shapes{shape{1, 4}, shape{3, 1}}}) {
      INFO("op " << op << " on " << sh.a.to_string() << " and " << sh.b.to_string());
      graph g;
      feeds_t others;
      const node_id a = placeholder(g, sh.a, "a");
      const node_id b = placeholder(g, sh.b, "b");
      const node_id y = weighted(g, g.add_node(op, {a, b}), others);
      const bool choose = std::string(op) == "maximum" || std::string(op) == "minimum";
      // For maximum/minimum, a on the 0.05 + 0.1 k grid and b on the 0.1 k grid never tie.
      auto av = random_tensor(sh.a, -2, 2);
      auto bv = random_tensor(sh.b, std::string(op) == "div" ? 0.5 : -2, 2);
      if (std::string(op) == "pow") // a positive base, where the exponent has a gradient
        av = random_tensor(sh.a, 0.3, 2);
      if (choose) {
        for (double& v : av.flat<double>())
          v = std::round(v * 10) / 10 + 0.05;
        for (double& v : bv.flat<double>())
          v = std::round(v * 10) / 10;
      }
      check_gradients(g, y, {{a, av}, {b, bv}}, others);
    }
  }
}

TEST_CASE("broadcast adjoints are sums over the broadcast dimensions") {
  graph g;
  loom::placeholder<double, 2> a(g, shape{3, 4}, "a");
  loom::placeholder<double, 1> row(g, shape{4}, "row");
  loom::placeholder<double, 2> col(g, shape{3, 1}, "col");
  auto [d_row] = loom::gradients(loom::reduce_sum(a + row), row);
  auto [d_col, d_a] = loom::gradients(loom::reduce_sum(a * col), col, a);
  loom::session s(g, loom::session_options{.intra_op_threads = 2});
  tensor<double, 2> av(shape{3, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  const loom::feed_dict feeds{{a, av},
                              {row, tensor<double, 1>(shape{4}, {1, 1, 1, 1})},
                              {col, tensor<double, 2>(shape{3, 1}, {1, 2, 3})}};
  auto [gr, gc, ga] = s.run(loom::fetches(d_row, d_col, d_a), feeds);
  REQUIRE(gr.shape() == shape{4});
  for (int j = 0; j < 4; ++j)
    CHECK(gr(j) == 3.0); // one per row
  REQUIRE(gc.shape() == shape{3, 1});
  CHECK(gc(0, 0) == 10.0); // the rows of a summed
  CHECK(gc(1, 0) == 26.0);
  CHECK(gc(2, 0) == 42.0);
  CHECK(ga(2, 3) == 3.0);
}

TEST_CASE("clip_by_value, where and cast") {
  SUBCASE("clip_by_value: inside the bounds dy, outside zero; the bounds get none") {
    graph g;
    feeds_t others;
    const node_id x = placeholder(g, shape{4, 5}, "x");
    const node_id lo = loom::detail::build::scalar(g, loom::dtype::f64, -0.5);
    const node_id hi = loom::detail::build::scalar(g, loom::dtype::f64, 0.5);
    const node_id y = weighted(g, g.add_node("clip_by_value", {x, lo, hi}), others);
    check_gradients(g, y, {{x, random_tensor(shape{4, 5}, -1.5, 1.5, {-0.5, 0.5})}}, others);
    CHECK(loom::gradients(g, {y}, {lo})[0] == loom::no_node);
  }
  SUBCASE("where") {
    graph g;
    feeds_t others;
    const node_id a = placeholder(g, shape{3, 3}, "a");
    const node_id b = placeholder(g, shape{3, 3}, "b");
    const node_id c = loom::detail::constant_node(
        g, any_tensor::from_vector<bool>(
               shape{3, 3}, {true, false, true, true, true, false, false, false, true}));
    const node_id y = weighted(g, g.add_node("select", {c, a, b}), others);
    check_gradients(
        g, y, {{a, random_tensor(shape{3, 3}, -1, 1)}, {b, random_tensor(shape{3, 3}, -1, 1)}},
        others);
  }
  SUBCASE("cast: float to double and back passes the adjoint through") {
    graph g;
    loom::placeholder<float, 1> xf(g, shape{3}, "xf");
    auto w = loom::constant(g, tensor<double, 1>(shape{3}, {0.5, -2.0, 4.0}));
    auto [dx] = loom::gradients(loom::reduce_sum(loom::cast<double>(xf) * w), xf);
    static_assert(std::is_same_v<decltype(dx), loom::output<float, 1>>);
    loom::session s(g, loom::session_options{.intra_op_threads = 2});
    auto got = s.run(dx, {{xf, tensor<float, 1>(shape{3}, {1.f, 2.f, 3.f})}});
    CHECK(got(0) == 0.5f);
    CHECK(got(1) == -2.0f);
    CHECK(got(2) == 4.0f);
  }
}

TEST_CASE("matmul with the four transpose combinations, and xw_plus_b") {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      INFO("transpose_a " << ta << " transpose_b " << tb);
      graph g;
      feeds_t others;
      const shape sa = ta ? shape{4, 3} : shape{3, 4};
      const shape sb = tb ? shape{2, 4} : shape{4, 2};
      const node_id a = placeholder(g, sa, "a");
      const node_id b = placeholder(g, sb, "b");
      const node_id m = g.add_node("matmul", {a, b}, {{"transpose_a", ta}, {"transpose_b", tb}});
      CHECK(g.node(m).shape == shape{3, 2});
      const node_id y = weighted(g, m, others);
      check_gradients(g, y, {{a, random_tensor(sa, -1, 1)}, {b, random_tensor(sb, -1, 1)}}, others);
    }
  graph g;
  feeds_t others;
  const node_id x = placeholder(g, shape{5, 3}, "x");
  const node_id w = placeholder(g, shape{3, 2}, "w");
  const node_id b = placeholder(g, shape{2}, "b");
  const node_id y = weighted(g, g.add_node("xw_plus_b", {x, w, b}), others);
  check_gradients(g, y,
                  {{x, random_tensor(shape{5, 3}, -1, 1)},
                   {w, random_tensor(shape{3, 2}, -1, 1)},
                   {b, random_tensor(shape{2}, -1, 1)}},
                  others);
}

TEST_CASE("reductions over axes, with and without keepdims") {
  struct reduction {
    std::vector<std::int64_t> axes;
    bool keep;
  };
  for (const char* op : {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"})
    for (const reduction& r :
         {reduction{{}, false}, reduction{{}, true}, reduction{{0}, false}, reduction{{1}, true},
          reduction{{2}, false}, reduction{{-1}, true}, reduction{{0, 2}, false},
          reduction{{0, 2}, true}, reduction{{1, 2}, false}}) {
      INFO(op << " over " << r.axes.size() << " axes, keepdims " << r.keep);
      graph g;
      feeds_t others;
      const node_id x = placeholder(g, shape{2, 3, 4}, "x");
      const node_id red = g.add_node(op, {x}, {{"axes", r.axes}, {"keepdims", r.keep}});
      const node_id y = weighted(g, red, others);
      check_gradients(g, y, {{x, random_tensor(shape{2, 3, 4}, -2, 2)}}, others);
    }
}

TEST_CASE("softmax, log_softmax and the cross-entropies") {
  for (const char* op : {"softmax", "log_softmax"})
    for (const shape& s : {shape{5}, shape{3, 4}, shape{2, 2, 3}}) {
      INFO(op << " of " << s.to_string());
      graph g;
      feeds_t others;
      const node_id x = placeholder(g, s, "x");
      const node_id y = weighted(g, g.add_node(op, {x}), others);
      check_gradients(g, y, {{x, random_tensor(s, -3, 3)}}, others);
    }
  SUBCASE("softmax_cross_entropy_with_logits: labels and logits") {
    graph g;
    feeds_t others;
    const node_id labels = placeholder(g, shape{3, 4}, "labels");
    const node_id logits = placeholder(g, shape{3, 4}, "logits");
    const node_id y =
        weighted(g, g.add_node("softmax_cross_entropy_with_logits", {labels, logits}), others);
    // Labels are a distribution per row (TF's logits gradient, softmax - labels,
    // assumes it); the loss is linear in them, so perturbing them is fine.
    any_tensor lv = random_tensor(shape{3, 4}, 0.1, 1);
    auto l = lv.flat<double>();
    for (std::size_t r = 0; r < 3; ++r) {
      double total = 0;
      for (std::size_t j = 0; j < 4; ++j)
        total += l[r * 4 + j];
      for (std::size_t j = 0; j < 4; ++j)
        l[r * 4 + j] /= total;
    }
    check_gradients(g, y, {{labels, lv}, {logits, random_tensor(shape{3, 4}, -3, 3)}}, others);
  }
  SUBCASE("sparse_softmax_cross_entropy_with_logits: logits") {
    graph g;
    feeds_t others;
    const node_id labels =
        loom::detail::constant_node(g, any_tensor::from_vector<std::int64_t>(shape{3}, {2, 0, 3}));
    const node_id logits = placeholder(g, shape{3, 4}, "logits");
    const node_id y = weighted(
        g, g.add_node("sparse_softmax_cross_entropy_with_logits", {labels, logits}), others);
    check_gradients(g, y, {{logits, random_tensor(shape{3, 4}, -3, 3)}}, others);
  }
}

TEST_CASE("reshape, with a static and with a run-time shape") {
  {
    graph g;
    feeds_t others;
    const node_id x = placeholder(g, shape{2, 6}, "x");
    const node_id y = weighted(
        g, g.add_node("reshape", {x}, {{"dims", std::vector<std::int64_t>{3, -1}}}), others);
    CHECK(g.node(y).shape == shape{3, 4});
    check_gradients(g, y, {{x, random_tensor(shape{2, 6}, -1, 1)}}, others);
  }
  {
    // x's batch dimension is unknown: the gradient reshapes to x's run-time shape.
    graph g;
    loom::placeholder<double, 2> x(g, shape{-1, 6}, "x");
    auto r = loom::reshape(x, {-1, 3});
    auto w = loom::constant(g, tensor<double, 2>(shape{1, 3}, {1, 2, 3}));
    auto [dx] = loom::gradients(loom::reduce_sum(loom::square(r) * w), x);
    loom::session s(g, loom::session_options{.intra_op_threads = 2});
    auto xv = tensor<double, 2>(shape{2, 6}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
    auto got = s.run(dx, {{x, xv}});
    REQUIRE(got.shape() == shape{2, 6});
    for (int i = 0; i < 12; ++i)
      CHECK(got.flat()[static_cast<std::size_t>(i)] == 2.0 * (i + 1) * (1 + i % 3));
  }
}

TEST_CASE("the MNIST cross-entropy expression") {
  graph g;
  loom::placeholder<double, 2> x(g, shape{4, 6}, "x");
  loom::placeholder<double, 2> y_(g, shape{4, 3}, "y_");
  loom::placeholder<double, 2> hid_w(g, shape{6, 5}, "hid_w");
  loom::placeholder<double, 1> hid_b(g, shape{5}, "hid_b");
  loom::placeholder<double, 2> sm_w(g, shape{5, 3}, "sm_w");
  loom::placeholder<double, 1> sm_b(g, shape{3}, "sm_b");
  auto hid = loom::relu(loom::xw_plus_b(x, hid_w, hid_b));
  auto y = loom::softmax(loom::xw_plus_b(hid, sm_w, sm_b));
  auto cross_entropy =
      loom::lower(-loom::reduce_sum(y_ * loom::log(loom::clip_by_value(y, 1e-10, 1.0))));

  // Keep relu's inputs away from zero: x w + b with b well away from the sums' range.
  any_tensor xv = random_tensor(shape{4, 6}, -1, 1);
  any_tensor hwv = random_tensor(shape{6, 5}, -0.3, 0.3);
  any_tensor hbv = any_tensor::from_vector<double>(shape{5}, {2.5, -2.5, 2.5, -2.5, 2.5});
  any_tensor labels =
      any_tensor::from_vector<double>(shape{4, 3}, {1, 0, 0, 0, 1, 0, 0, 0, 1, 0.5, 0.5, 0});
  check_gradients(g, cross_entropy.id(),
                  {{hid_w.id(), hwv},
                   {hid_b.id(), hbv},
                   {sm_w.id(), random_tensor(shape{5, 3}, -1, 1)},
                   {sm_b.id(), random_tensor(shape{3}, -1, 1)}},
                  {{x.id(), xv}, {y_.id(), labels}});
}

TEST_CASE("a node used twice accumulates both adjoints") {
  graph g;
  loom::placeholder<double, 1> x(g, shape{3}, "x");
  auto sq = x * x;
  auto [d] = loom::gradients(loom::reduce_sum(sq), x);
  loom::session s(g, loom::session_options{.intra_op_threads = 2});
  auto got = s.run(d, {{x, tensor<double, 1>(shape{3}, {1.5, -2, 4})}});
  CHECK(got(0) == 3.0);
  CHECK(got(1) == -4.0);
  CHECK(got(2) == 8.0);

  // e = exp(x) feeds three consumers.
  feeds_t others;
  const node_id xp = placeholder(g, shape{2, 3}, "xp");
  const node_id e = g.add_node("exp", {xp});
  const node_id y =
      loom::detail::build::add(g, loom::detail::build::mul(g, e, e), g.add_node("sigmoid", {e}));
  check_gradients(g, weighted(g, y, others), {{xp, random_tensor(shape{2, 3}, -1, 1)}}, others);
}

TEST_CASE("second-order gradients pass through the gradient ops") {
  // d/dx of sum(v * d/dx sum(w * f(x))) against differences of the first gradient.
  for (const char* op : {"square", "sigmoid", "exp", "tanh"}) {
    INFO("op " << op);
    graph g;
    feeds_t others;
    const node_id x = placeholder(g, shape{2, 3}, "x");
    const node_id y = weighted(g, g.add_node(op, {x}), others);
    const node_id dx = loom::gradients(g, {y}, {x})[0];
    check_gradients(g, weighted(g, dx, others), {{x, random_tensor(shape{2, 3}, -1, 1)}}, others);
  }
  // Through broadcasting (sum_to_shape) and a mean (reduce_grad).
  graph g;
  feeds_t others;
  const node_id a = placeholder(g, shape{3, 4}, "a");
  const node_id b = placeholder(g, shape{4}, "b");
  const node_id prod = g.add_node("mul", {g.add_node("square", {a}), b});
  const node_id m = g.add_node("reduce_mean", {prod}, {{"axes", std::vector<std::int64_t>{0}}});
  const node_id y = weighted(g, m, others);
  const auto first = loom::gradients(g, {y}, {a, b});
  const node_id z = loom::detail::build::add(
      g, loom::detail::build::op(g, "reduce_sum", {weighted(g, first[0], others)}),
      loom::detail::build::op(g, "reduce_sum", {weighted(g, first[1], others)}));
  check_gradients(
      g, z, {{a, random_tensor(shape{3, 4}, -1, 1)}, {b, random_tensor(shape{4}, -1, 1)}}, others);
}

TEST_CASE("grad_ys seeds the adjoint of y") {
  graph g;
  loom::placeholder<double, 1> x(g, shape{2}, "x");
  auto y = loom::lower(x * 3.0);
  auto seed = loom::constant(g, tensor<double, 1>(shape{2}, {2, -1}));
  const node_id d = loom::gradients(g, {y.id()}, {x.id()}, {seed.id()})[0];
  loom::session s(g, loom::session_options{.intra_op_threads = 2});
  auto got = s.run(loom::output<double, 1>(g, d), {{x, tensor<double, 1>(shape{2}, {7, 7})}});
  CHECK(got(0) == 6.0);
  CHECK(got(1) == -3.0);
  auto two_seeds = [&] { loom::gradients(g, {y.id()}, {x.id()}, {seed.id(), seed.id()}); };
  CHECK_THROWS_AS(two_seeds(), loom::invalid_argument_error);
}

TEST_CASE("a y that does not depend on x has no gradient") {
  graph g;
  loom::placeholder<double, 1> x(g, shape{3}, "x");
  loom::placeholder<double, 1> other(g, shape{3}, "other");
  auto y = loom::lower(loom::reduce_sum(loom::exp(other)));
  // Untyped: no_node, as TF returns None.
  CHECK(loom::gradients(g, {y.id()}, {x.id()})[0] == loom::no_node);
  const auto both = loom::gradients(g, {y.id()}, {x.id(), other.id()});
  CHECK(both[0] == loom::no_node);
  CHECK(both[1] != loom::no_node);
  // Through an integer path there is no gradient either (argmax, then a cast).
  auto through_int =
      loom::lower(loom::reduce_sum(loom::cast<double>(loom::argmax(loom::reshape(x, {1, 3}), 1))));
  CHECK(loom::gradients(g, {through_int.id()}, {x.id()})[0] == loom::no_node);
  // Typed: an error that names y and x.
  std::string msg;
  try {
    (void)loom::gradients(y, x);
  } catch (const loom::invalid_argument_error& e) {
    msg = e.what();
  }
  CHECK(contains(msg, "'" + y.name() + "'"));
  CHECK(contains(msg, "'x'"));
}

// -- the index ops of sparse models (graph/ops/array.hpp) --------------------------

namespace {

node_id ids_constant(graph& g, const shape& s, const std::vector<std::int64_t>& v) {
  return loom::detail::constant_node(g, any_tensor::from_vector<std::int64_t>(s, v));
}

} // namespace

TEST_CASE("gather: params get a sparse gradient, dense where it is read") {
  struct gather_case {
    shape params;
    shape ids;
    std::vector<std::int64_t> id_values;
    std::int64_t axis;
  };
  for (const gather_case& c :
       {gather_case{shape{5, 3}, shape{4}, {4, 0, 4, 2}, 0},    // a repeated id
        gather_case{shape{5, 3}, shape{2, 2}, {1, 3, 3, 0}, 0}, // ids of rank 2
        gather_case{shape{2, 4, 3}, shape{3}, {3, 0, 3}, 1},    // along a middle axis
        gather_case{shape{6}, shape{3}, {5, 5, 1}, 0}}) {       // a vector
    INFO("params " << c.params.to_string() << ", ids " << c.ids.to_string() << ", axis " << c.axis);
    graph g;
    feeds_t others;
    const node_id params = placeholder(g, c.params, "params");
    const node_id ids = ids_constant(g, c.ids, c.id_values);
    const node_id gathered = g.add_node("gather", {params, ids}, {{"axis", c.axis}});
    const node_id y = weighted(g, gathered, others);
    const node_id dparams = loom::gradients(g, {y}, {params}).front();
    CHECK(g.node(dparams).op == "indexed_slices"); // sparse in the graph
    check_gradients(g, y, {{params, random_tensor(c.params, -1, 1)}}, others);
  }
}

TEST_CASE("two gathers of one tensor: one sparse gradient, their rows joined") {
  graph g;
  feeds_t others;
  const node_id params = placeholder(g, shape{6, 2}, "params");
  const node_id a = g.add_node("gather", {params, ids_constant(g, shape{3}, {1, 5, 1})});
  const node_id b = g.add_node(
      "gather",
      {params, loom::detail::constant_node(g, any_tensor::from_vector<std::int32_t>(
                                                  shape{2, 2}, {5, 0, 2, 2}))}); // int32 ids
  const node_id y = loom::detail::build::add(
      g, loom::detail::build::op(g, "reduce_sum", {weighted(g, a, others)}),
      loom::detail::build::op(g, "reduce_sum", {weighted(g, b, others)}));
  const node_id dparams = loom::gradients(g, {y}, {params}).front();
  CHECK(g.node(dparams).op == "indexed_slices");
  check_gradients(g, y, {{params, random_tensor(shape{6, 2}, -1, 1)}}, others);
}

TEST_CASE("unsorted_segment_sum: the gradient gathers dy, and a dropped id gets none") {
  graph g;
  feeds_t others;
  const node_id data = placeholder(g, shape{5, 2}, "data");
  const node_id ids = ids_constant(g, shape{5}, {2, 0, -1, 2, 3});
  const node_id count = loom::detail::scalar_node(g, std::int64_t{4});
  const node_id sums = g.add_node("unsorted_segment_sum", {data, ids, count});
  CHECK(g.node(sums).shape == shape{4, 2});
  const node_id y = weighted(g, sums, others);
  check_gradients(g, y, {{data, random_tensor(shape{5, 2}, -1, 1)}}, others);
}

TEST_CASE("concat along each axis: each input gets its part of dy") {
  for (std::int64_t axis : {0, 1, -1}) {
    INFO("axis " << axis);
    graph g;
    feeds_t others;
    const node_id a = placeholder(g, shape{2, 3}, "a");
    const node_id b = placeholder(g, shape{2, 3}, "b");
    const node_id c = placeholder(g, shape{2, 3}, "c");
    const node_id joined = g.add_node("concat", {a, b, c}, {{"axis", axis}});
    CHECK(g.node(joined).shape == (axis == 0 ? shape{6, 3} : shape{2, 9}));
    const node_id y = weighted(g, joined, others);
    check_gradients(g, y,
                    {{a, random_tensor(shape{2, 3}, -1, 1)},
                     {b, random_tensor(shape{2, 3}, -1, 1)},
                     {c, random_tensor(shape{2, 3}, -1, 1)}},
                    others);
  }
}

TEST_CASE("add_n: each input gets dy, an input given twice gets it twice") {
  graph g;
  feeds_t others;
  const node_id a = placeholder(g, shape{2, 3}, "a");
  const node_id b = placeholder(g, shape{2, 3}, "b");
  const node_id c = placeholder(g, shape{2, 3}, "c");
  const node_id sum = g.add_node("add_n", {a, b, a, c});
  CHECK(g.node(sum).shape == shape{2, 3});
  const node_id y = weighted(g, sum, others);
  check_gradients(g, y,
                  {{a, random_tensor(shape{2, 3}, -1, 1)},
                   {b, random_tensor(shape{2, 3}, -1, 1)},
                   {c, random_tensor(shape{2, 3}, -1, 1)}},
                  others);
}

TEST_CASE("sigmoid_cross_entropy_with_logits: labels and logits, and TF's gradient at 0") {
  graph g;
  feeds_t others;
  loom::placeholder<double, 2> labels(g, shape{3, 4}, "labels");
  loom::placeholder<double, 2> logits(g, shape{3, 4}, "logits");
  const node_id loss = loom::lower(loom::sigmoid_cross_entropy_with_logits(labels, logits)).id();
  const node_id y = weighted(g, loss, others);
  check_gradients(g, y,
                  {{labels.id(), random_tensor(shape{3, 4}, 0, 1)},
                   {logits.id(), random_tensor(shape{3, 4}, -4, 4, {0.0})}},
                  others);
  // At logits 0 the gradient is sigmoid(0) - z = 0.5 - z (not -z).
  const node_id dlogits = loom::gradients(g, {loss}, {logits.id()}).front();
  loom::session s(g);
  const auto z = any_tensor::from_vector<double>(shape{3, 4}, std::vector<double>(12, 0.25));
  const auto at_zero = any_tensor::from_vector<double>(shape{3, 4}, std::vector<double>(12, 0.0));
  const auto d = s.run_nodes({dlogits, loss}, {}, {{labels.id(), z}, {logits.id(), at_zero}});
  for (double v : d[0].flat<double>())
    CHECK(v == doctest::Approx(0.25));
  for (double v : d[1].flat<double>())
    CHECK(v == doctest::Approx(std::log(2.0)));
}

TEST_CASE("dynamic_stitch: each data input gets the rows of dy its indices name") {
  graph g;
  feeds_t others;
  const node_id a = placeholder(g, shape{2, 3}, "a");
  const node_id b = placeholder(g, shape{3, 3}, "b");
  const node_id at_a =
      loom::detail::constant_node(g, any_tensor::from_vector<std::int32_t>(shape{2}, {4, 0}));
  const node_id at_b =
      loom::detail::constant_node(g, any_tensor::from_vector<std::int32_t>(shape{3}, {1, 3, 2}));
  const node_id merged = g.add_node("dynamic_stitch", {a, b, at_a, at_b}, {{"N", std::int64_t{2}}});
  const node_id y = weighted(
      g, g.add_node("reshape", {merged}, {{"dims", std::vector<std::int64_t>{5, 3}}}), others);
  check_gradients(g, y,
                  {{a, random_tensor(shape{2, 3}, -1, 1)}, {b, random_tensor(shape{3, 3}, -1, 1)}},
                  others);
}

TEST_CASE("gather_shards: each shard's rows get the rows of dy its slots name, summed") {
  // Slots k * 2 + p name row k of shard p; rows named twice get both adjoints.
  graph g;
  feeds_t others;
  const node_id a = placeholder(g, shape{3, 2}, "a");
  const node_id b = placeholder(g, shape{2, 2}, "b");
  const node_id slots = loom::detail::constant_node(
      g, any_tensor::from_vector<std::int64_t>(shape{6}, {2, 1, 4, 2, 3, 0}));
  const node_id rows = g.add_node("gather_shards", {slots, a, b}, {{"N", std::int64_t{2}}});
  const node_id y = weighted(g, rows, others);
  check_gradients(g, y,
                  {{a, random_tensor(shape{3, 2}, -1, 1)}, {b, random_tensor(shape{2, 2}, -1, 1)}},
                  others);
}

TEST_CASE("the routing of a lookup over shards: every shard gets the rows of its ids, summed") {
  // embedding_lookup's routing (detail::sharded_rows) with a gather from each shard where
  // a lookup has a resource_gather from a variable: repeated ids, ids of rank 2.
  for (const char* strategy : {"mod", "div"}) {
    INFO(strategy);
    graph g;
    feeds_t others;
    const std::vector<node_id> parts{placeholder(g, shape{4, 3}, "part_0"),
                                     placeholder(g, shape{3, 3}, "part_1")};
    const node_id ids = loom::detail::constant_node(
        g, any_tensor::from_vector<std::int64_t>(shape{2, 3}, {6, 1, 6, 0, 3, 1}));
    const loom::attr_map route{{"num_shards", std::int64_t{2}},
                               {"strategy", std::string(strategy)},
                               {"rows", std::int64_t{7}}};
    const node_id rows =
        loom::detail::sharded_rows(g, ids, route, 3, "test", [&](std::int64_t p, node_id distinct) {
          return g.add_node("gather", {parts[static_cast<std::size_t>(p)], distinct});
        });
    const node_id y = weighted(
        g, g.add_node("reshape", {rows}, {{"dims", std::vector<std::int64_t>{2, 3, 3}}}), others);
    check_gradients(g, y,
                    {{parts[0], random_tensor(shape{4, 3}, -1, 1)},
                     {parts[1], random_tensor(shape{3, 3}, -1, 1)}},
                    others);
  }
}

TEST_CASE("embedding_lookup_sparse: the gradient of each combiner reaches the table") {
  for (const auto how : {loom::combiner::sum, loom::combiner::mean, loom::combiner::sqrtn}) {
    INFO("combiner " << static_cast<int>(how));
    graph g;
    feeds_t others;
    loom::placeholder<double, 2> table(g, shape{5, 2}, "table");
    const loom::sparse_tensor<std::int64_t> ids{
        loom::constant(g, tensor<std::int64_t, 2>(shape{5, 2}, {0, 0, 0, 1, 2, 0, 2, 1, 2, 2})),
        loom::constant(g, tensor<std::int64_t, 1>(shape{5}, {1, 3, 4, 1, 1})),
        loom::constant(g, tensor<std::int64_t, 1>(shape{2}, {3, 3}))};
    const loom::sparse_tensor<double> weights{
        ids.indices, loom::constant(g, tensor<double, 1>(shape{5}, {2, 1, 1, 0.5, 0.5})),
        ids.dense_shape};
    const node_id combined = loom::embedding_lookup_sparse(table, ids, weights, how).id();
    // [batch, 2], the batch known when it runs: given here for the weights.
    const node_id y = weighted(
        g, g.add_node("reshape", {combined}, {{"dims", std::vector<std::int64_t>{3, 2}}}), others);
    check_gradients(g, y, {{table.id(), random_tensor(shape{5, 2}, -1, 1)}}, others);
  }
}

TEST_CASE("transpose, strided_slice (every mask), pad, tile, expand_dims and squeeze") {
  struct strided_case {
    const char* what;
    shape x;
    std::string op;
    loom::attr_map attrs;
  };
  using v = std::vector<std::int64_t>;
  const std::vector<strided_case> cases{
      {"transpose", shape{2, 3, 4}, "transpose", {{"perm", v{2, 0, 1}}}},
      {"slice with steps",
       shape{4, 5},
       "strided_slice",
       {{"begin", v{1, 0}}, {"end", v{4, 5}}, {"strides", v{2, 2}}}},
      {"backward with a new axis and a shrunk one",
       shape{4, 5},
       "strided_slice",
       {{"begin", v{-1, 0, 2}},
        {"end", v{0, 0, 3}},
        {"strides", v{-1, 1, 1}},
        {"begin_mask", std::int64_t{1}},
        {"end_mask", std::int64_t{1}},
        {"new_axis_mask", std::int64_t{2}},
        {"shrink_axis_mask", std::int64_t{4}}}},
      {"ellipsis",
       shape{2, 3, 4},
       "strided_slice",
       {{"begin", v{0, 1}},
        {"end", v{0, 3}},
        {"strides", v{1, 1}},
        {"ellipsis_mask", std::int64_t{1}}}},
      {"pad", shape{2, 3}, "pad", {{"paddings", v{1, 0, 2, 1}}}},
      {"tile", shape{2, 3}, "tile", {{"multiples", v{3, 2}}}},
      {"expand_dims", shape{2, 3}, "expand_dims", {{"axis", std::int64_t{1}}}},
      {"squeeze", shape{2, 1, 3}, "squeeze", {{"axes", v{1}}}},
  };
  for (const strided_case& c : cases) {
    INFO(c.what);
    graph g;
    feeds_t others;
    const node_id x = placeholder(g, c.x, "x");
    std::vector<node_id> inputs{x};
    if (c.op == "pad")
      inputs.push_back(loom::detail::scalar_node(g, 0.5));
    const node_id y = weighted(g, g.add_node(c.op, inputs, c.attrs), others);
    check_gradients(g, y, {{x, random_tensor(c.x, -1, 1)}}, others);
  }
}

TEST_CASE("the gradients of strided ops on an input whose batch is known only when it runs") {
  graph g;
  loom::placeholder<double, 2> x(g, shape{-1, 3}, "x");
  auto w = loom::constant(g, tensor<double, 2>(shape{1, 6}, {1, 2, 3, 4, 5, 6}));
  // x[1:, :] tiled twice along the columns, then weighted: each element of x but the first
  // row gets the weights of its two copies.
  auto y = loom::tile(loom::slice(x, {1, 0}, {-1, -1}), {1, 2});
  auto [dx] = loom::gradients(loom::reduce_sum(y * w), x);
  loom::session s(g, loom::session_options{.intra_op_threads = 2});
  const auto got = s.run(dx, {{x, tensor<double, 2>(shape{3, 3}, 1.0)}});
  REQUIRE(got.shape() == shape{3, 3});
  CHECK(std::vector<double>(got.flat().begin(), got.flat().end()) ==
        std::vector<double>{0, 0, 0, 5, 7, 9, 5, 7, 9});
}

TEST_CASE("stack, unstack and split pass each part its share of dy") {
  graph g;
  feeds_t others;
  loom::placeholder<double, 2> x(g, shape{3, 4}, "x");
  const auto parts = loom::split(x, std::vector<std::int64_t>{1, 3}, 1);
  const auto rows = loom::unstack(parts[1], 0);
  auto restacked = loom::stack(std::vector<loom::output<double, 1>>{rows[2], rows[0]}, 1);
  const node_id y = weighted(g, restacked.id(), others);
  check_gradients(g, y, {{x.id(), random_tensor(shape{3, 4}, -1, 1)}}, others);
}

TEST_CASE("conv2d: the input and the filter, SAME and VALID, strided and dilated") {
  struct conv_grad_case {
    shape x, f;
    loom::attr_map attrs;
  };
  using v = std::vector<std::int64_t>;
  for (const conv_grad_case& c :
       {conv_grad_case{shape{2, 5, 4, 2},
                       shape{3, 2, 2, 3},
                       {{"strides", v{1, 1, 1, 1}}, {"padding", std::string("SAME")}}},
        conv_grad_case{shape{1, 6, 5, 2},
                       shape{2, 3, 2, 2},
                       {{"strides", v{1, 2, 2, 1}}, {"padding", std::string("VALID")}}},
        conv_grad_case{shape{1, 6, 6, 1},
                       shape{2, 2, 1, 2},
                       {{"strides", v{1, 1, 1, 1}},
                        {"dilations", v{1, 2, 2, 1}},
                        {"padding", std::string("SAME")}}},
        conv_grad_case{shape{2, 3, 3, 4},
                       shape{1, 1, 4, 2},
                       {{"strides", v{1, 1, 1, 1}}, {"padding", std::string("VALID")}}}}) {
    INFO("x " << c.x.to_string() << ", filter " << c.f.to_string());
    graph g;
    feeds_t others;
    const node_id x = placeholder(g, c.x, "x");
    const node_id f = placeholder(g, c.f, "f");
    const node_id y = weighted(g, g.add_node("conv2d", {x, f}, c.attrs), others);
    check_gradients(g, y, {{x, random_tensor(c.x, -1, 1)}, {f, random_tensor(c.f, -1, 1)}}, others);
  }
}

TEST_CASE("max_pool and avg_pool: VALID and SAME, overlapping windows") {
  using v = std::vector<std::int64_t>;
  for (const char* op : {"max_pool", "avg_pool"})
    for (const char* padding : {"VALID", "SAME"}) {
      INFO(op << ", " << padding);
      graph g;
      feeds_t others;
      const node_id x = placeholder(g, shape{2, 5, 4, 2}, "x");
      const node_id y = weighted(g,
                                 g.add_node(op, {x},
                                            {{"ksize", v{1, 3, 2, 1}},
                                             {"strides", v{1, 2, 1, 1}},
                                             {"padding", std::string(padding)}}),
                                 others);
      check_gradients(g, y, {{x, random_tensor(shape{2, 5, 4, 2}, -1, 1)}}, others);
    }
}

TEST_CASE("batch_matmul: the four adjoint combinations and broadcast batch dimensions") {
  struct bmm_case {
    shape a, b;
    bool adj_x, adj_y;
  };
  for (const bmm_case& c : {bmm_case{shape{2, 3, 4}, shape{2, 4, 5}, false, false},
                            bmm_case{shape{2, 4, 3}, shape{2, 4, 5}, true, false},
                            bmm_case{shape{2, 3, 4}, shape{2, 5, 4}, false, true},
                            bmm_case{shape{2, 4, 3}, shape{2, 5, 4}, true, true},
                            bmm_case{shape{3, 1, 2, 4}, shape{2, 4, 3}, false, false},
                            bmm_case{shape{2, 3, 4}, shape{4, 2}, false, false}}) {
    INFO(c.a.to_string() << " x " << c.b.to_string() << (c.adj_x ? " adj_x" : "")
                         << (c.adj_y ? " adj_y" : ""));
    graph g;
    feeds_t others;
    const node_id a = placeholder(g, c.a, "a");
    const node_id b = placeholder(g, c.b, "b");
    const node_id y = weighted(
        g, g.add_node("batch_matmul", {a, b}, {{"adj_x", c.adj_x}, {"adj_y", c.adj_y}}), others);
    check_gradients(g, y, {{a, random_tensor(c.a, -1, 1)}, {b, random_tensor(c.b, -1, 1)}}, others);
  }
}

TEST_CASE("a DIN-style attention over a multi-hot field: masked softmax and two batch_matmuls") {
  // history [batch, len, dim] of embedded ids, some positions padding (mask false); query
  // [batch, dim]: scores = history . query, padding masked out, softmax over the length,
  // the weighted sum of the history.
  graph g;
  feeds_t others;
  loom::placeholder<double, 3> history(g, shape{2, 4, 3}, "history");
  loom::placeholder<double, 2> query(g, shape{2, 3}, "query");
  loom::placeholder<bool, 2> mask(g, shape{2, 4}, "mask");
  auto scores = loom::reshape(loom::batch_matmul(history, loom::expand_dims(query, -1)),
                              std::array<std::int64_t, 2>{2, 4});
  auto masked = loom::where(mask, scores, scores * 0.0 - 1e9);
  auto weights = loom::softmax(masked);
  auto pooled = loom::squeeze(loom::batch_matmul(loom::expand_dims(weights, 1), history), 1);
  loom::tensor<bool, 2> m(shape{2, 4});
  for (int i = 0; i < 8; ++i)
    m.data()[i] = !(i == 3 || i == 6 || i == 7); // example 0 has 3 ids, example 1 two
  others.emplace_back(mask.id(), m.value());
  const node_id y = weighted(g, pooled.id(), others);
  check_gradients(g, y,
                  {{history.id(), random_tensor(shape{2, 4, 3}, -1, 1)},
                   {query.id(), random_tensor(shape{2, 3}, -1, 1)}},
                  others);
}

TEST_CASE("reduce_prod with zeros: TF's exclusive products, no division") {
  // One zero in a row: the zero's gradient is the product of the others; two zeros: all zero.
  any_tensor x = any_tensor::from_vector<double>(
      shape{3, 4}, {0.5, 0.0, -1.5, 2.0, 0.0, 1.25, 0.0, -0.75, 1.5, -0.5, 2.0, 0.8});
  for (const auto& axes : {std::vector<std::int64_t>{1}, std::vector<std::int64_t>{}}) {
    graph g;
    feeds_t others;
    const node_id xp = placeholder(g, shape{3, 4}, "x");
    const node_id red = g.add_node("reduce_prod", {xp}, {{"axes", axes}, {"keepdims", false}});
    check_gradients(g, weighted(g, red, others), {{xp, x}}, others);
  }
}

TEST_CASE("gather_nd: params get dy scattered back, repeated tuples summed") {
  struct gather_nd_case {
    shape params, indices;
    std::vector<std::int64_t> values;
  };
  for (const gather_nd_case& c :
       {gather_nd_case{shape{4, 3}, shape{3, 2}, {1, 2, 3, 0, 1, 2}}, // elements, one twice
        gather_nd_case{shape{4, 3}, shape{3, 1}, {2, 0, 2}},          // rows, one twice
        gather_nd_case{shape{2, 3, 2}, shape{2, 2, 2}, {0, 1, 1, 2, 1, 0, 0, 1}}}) {
    INFO("params " << c.params.to_string() << ", indices " << c.indices.to_string());
    graph g;
    feeds_t others;
    const node_id params = placeholder(g, c.params, "params");
    const node_id indices = ids_constant(g, c.indices, c.values);
    const node_id y = weighted(g, g.add_node("gather_nd", {params, indices}), others);
    check_gradients(g, y, {{params, random_tensor(c.params, -1, 1)}}, others);
  }
}

TEST_CASE("top_k: the values' gradient goes back to their positions") {
  for (std::int64_t k : {1, 3, 5}) {
    INFO("k " << k);
    graph g;
    feeds_t others;
    const node_id x = placeholder(g, shape{3, 5}, "x");
    const node_id at = g.add_node("top_k_indices", {x}, {{"k", k}, {"sorted", true}});
    const node_id values = g.add_node("top_k_values", {x, at});
    // Distinct values at least 0.1 apart, so that no step of the differences reorders them.
    any_tensor xv(loom::dtype::f64, shape{3, 5});
    const double base[] = {0.3, -1.2, 2.5, 0.9, -0.4};
    for (int r = 0; r < 3; ++r)
      for (int j = 0; j < 5; ++j)
        xv.data<double>()[r * 5 + j] = base[(j + r) % 5] * (1 + 0.1 * r);
    check_gradients(g, weighted(g, values, others), {{x, xv}}, others);
  }
}

TEST_CASE("depthwise_conv2d: the input and the filter, SAME and VALID, strided and dilated") {
  struct depthwise_case {
    shape x, f;
    loom::attr_map attrs;
  };
  using v = std::vector<std::int64_t>;
  for (const depthwise_case& c :
       {depthwise_case{shape{2, 5, 4, 2},
                       shape{3, 2, 2, 1},
                       {{"strides", v{1, 1, 1, 1}}, {"padding", std::string("SAME")}}},
        depthwise_case{shape{1, 6, 5, 2},
                       shape{2, 3, 2, 2},
                       {{"strides", v{1, 2, 2, 1}}, {"padding", std::string("VALID")}}},
        depthwise_case{shape{1, 6, 6, 1},
                       shape{2, 2, 1, 3},
                       {{"strides", v{1, 1, 1, 1}},
                        {"dilations", v{1, 2, 2, 1}},
                        {"padding", std::string("SAME")}}}}) {
    INFO("x " << c.x.to_string() << ", filter " << c.f.to_string());
    graph g;
    feeds_t others;
    const node_id x = placeholder(g, c.x, "x");
    const node_id f = placeholder(g, c.f, "f");
    const node_id y = weighted(g, g.add_node("depthwise_conv2d", {x, f}, c.attrs), others);
    check_gradients(g, y, {{x, random_tensor(c.x, -1, 1)}, {f, random_tensor(c.f, -1, 1)}}, others);
  }
}

TEST_CASE("fused_batch_norm: training through the batch's moments, and inference") {
  for (const shape& xs : {shape{5, 3}, shape{2, 3, 2, 4}}) {
    const std::int64_t c = xs[xs.rank() - 1];
    INFO("x " << xs.to_string());
    {
      // Training: y's gradient reaches x directly and through the mean and the variance.
      graph g;
      feeds_t others;
      const node_id x = placeholder(g, xs, "x");
      const node_id scale = placeholder(g, shape{c}, "scale");
      const node_id offset = placeholder(g, shape{c}, "offset");
      const node_id moments = g.add_node("batch_norm_moments", {x});
      const node_id mean = loom::detail::channel_row(g, moments, 0);
      const node_id variance = loom::detail::channel_row(g, moments, 1);
      const node_id bn =
          g.add_node("fused_batch_norm", {x, scale, offset, mean, variance}, {{"epsilon", 1e-3}});
      const node_id y = weighted(g, bn, others);
      check_gradients(g, y,
                      {{x, random_tensor(xs, -2, 2)},
                       {scale, random_tensor(shape{c}, 0.5, 2)},
                       {offset, random_tensor(shape{c}, -1, 1)}},
                      others, 1e-5);
    }
    {
      // Inference: given mean and variance (the moving averages), each with its gradient.
      graph g;
      feeds_t others;
      const node_id x = placeholder(g, xs, "x");
      const node_id scale = placeholder(g, shape{c}, "scale");
      const node_id offset = placeholder(g, shape{c}, "offset");
      const node_id mean = placeholder(g, shape{c}, "mean");
      const node_id variance = placeholder(g, shape{c}, "variance");
      const node_id y = weighted(
          g,
          g.add_node("fused_batch_norm", {x, scale, offset, mean, variance}, {{"epsilon", 0.01}}),
          others);
      check_gradients(g, y,
                      {{x, random_tensor(xs, -2, 2)},
                       {scale, random_tensor(shape{c}, 0.5, 2)},
                       {offset, random_tensor(shape{c}, -1, 1)},
                       {mean, random_tensor(shape{c}, -1, 1)},
                       {variance, random_tensor(shape{c}, 0.5, 2)}},
                      others);
    }
    {
      // The moments alone, every row (the reported variance's n / (n - 1) included).
      graph g;
      feeds_t others;
      const node_id x = placeholder(g, xs, "x");
      const node_id y = weighted(g, g.add_node("batch_norm_moments", {x}), others);
      check_gradients(g, y, {{x, random_tensor(xs, -2, 2)}}, others);
    }
  }
}

TEST_CASE("the batch_normalization layer: its gradient while training, through its flag") {
  graph g;
  feeds_t others;
  loom::placeholder<double, 4> x(g, shape{2, 3, 2, 2}, "x");
  loom::placeholder<bool, 0> training(g, shape{}, "training");
  auto bn = loom::layers::batch_normalization(x, training, {.epsilon = 1e-2});
  others.emplace_back(training.id(), any_tensor::scalar<bool>(true));
  // Read by the inference branch only; fed rather than initialized.
  others.emplace_back(g.find("batch_normalization/moving_mean"), random_tensor(shape{2}, -1, 1));
  others.emplace_back(g.find("batch_normalization/moving_variance"), random_tensor(shape{2}, 1, 2));
  const node_id y = weighted(g, bn.id(), others);
  check_gradients(g, y,
                  {{x.id(), random_tensor(shape{2, 3, 2, 2}, -2, 2)},
                   {g.find("batch_normalization/gamma"), random_tensor(shape{2}, 0.5, 2)},
                   {g.find("batch_normalization/beta"), random_tensor(shape{2}, -1, 1)}},
                  others, 1e-5);
}

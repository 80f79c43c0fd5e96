// The CPU kernels of every registered op, checked against values computed by
// hand in the test: elementwise ops (typed over the dtypes they support) with
// every kind of broadcasting, fused regions against their primitive ops,
// matmul and xw_plus_b, reductions, softmax and the cross-entropies, argmax,
// reshape, identity, the assign family, constants, fills and the seeded
// random sources.
#include <doctest/doctest.h>
#include <support/messages.hpp>

#include <loom/loom.hpp>
// Internals under test: the executor's plans and the random kernels' rounding.
#include <loom/kernels/cpu/gemm.hpp>
#include <loom/kernels/cpu/random.hpp>
#include <loom/runtime/executor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

using loom::graph;
using loom::node_id;
using loom::shape;
using loom::tensor;

namespace {

using loom::testing::contains;
using loom::testing::message_of;

loom::session_options opts() {
  return {.intra_op_threads = 2};
}

// Relative tolerance for comparing computed floating values.
template <class T> double tolerance() {
  return std::is_same_v<T, float> ? 2e-6 : 1e-13;
}

template <class T> void check_close(T got, double expected, double tol = tolerance<T>()) {
  if constexpr (std::is_floating_point_v<T>)
    CHECK(static_cast<double>(got) == doctest::Approx(expected).epsilon(tol));
  else
    CHECK(got == static_cast<T>(expected));
}

template <class T, int R>
void check_values(const tensor<T, R>& got, const shape& s, const std::vector<double>& expected,
                  double tol = tolerance<T>()) {
  REQUIRE(got.shape() == s);
  REQUIRE(static_cast<std::size_t>(got.size()) == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("element " << i);
    check_close<T>(got.flat()[i], expected[i], tol);
  }
}

// Row-major index arithmetic for the broadcasting reference.
std::vector<std::int64_t> unravel(std::int64_t k, const shape& s) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(s.rank()));
  for (int i = s.rank() - 1; i >= 0; --i) {
    idx[static_cast<std::size_t>(i)] = k % s[i];
    k /= s[i];
  }
  return idx;
}
// The element of a tensor of shape `s` that broadcasting maps output index `out` to.
std::int64_t broadcast_source(const std::vector<std::int64_t>& out, const shape& s) {
  const int pad = static_cast<int>(out.size()) - s.rank();
  std::int64_t k = 0;
  for (int i = 0; i < s.rank(); ++i)
    k = k * s[i] + (s[i] == 1 ? 0 : out[static_cast<std::size_t>(i + pad)]);
  return k;
}

std::vector<double> iota_values(std::int64_t n, double start, double step) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = start + step * static_cast<double>(i);
  return v;
}

template <class T> std::vector<T> as(const std::vector<double>& v) {
  std::vector<T> out;
  for (double d : v)
    out.push_back(static_cast<T>(d));
  return out;
}

} // namespace

// -- elementwise -------------------------------------------------------------------------

TEST_CASE_TEMPLATE("elementwise arithmetic and comparisons", T, float, double, std::int32_t,
                   std::int64_t) {
  graph g;
  loom::session s(g, opts());
  const std::vector<T> av{1, -2, 3, -4, 5, 6}, bv{6, 5, -4, 3, 2, 6};
  auto a = loom::constant(g, tensor<T, 2>(shape{2, 3}, av));
  auto b = loom::constant(g, tensor<T, 2>(shape{2, 3}, bv));
  const shape s23{2, 3};
  auto expect = [&](auto f) {
    std::vector<double> out;
    for (std::size_t i = 0; i < av.size(); ++i)
      out.push_back(static_cast<double>(f(av[i], bv[i])));
    return out;
  };
  check_values(s.run(a + b), s23, expect([](T x, T y) { return T(x + y); }));
  check_values(s.run(a - b), s23, expect([](T x, T y) { return T(x - y); }));
  check_values(s.run(a * b), s23, expect([](T x, T y) { return T(x * y); }));
  check_values(s.run(a / b), s23, expect([](T x, T y) { return T(x / y); })); // ints truncate
  check_values(s.run(a * 3), s23, expect([](T x, T) { return T(x * 3); }));
  check_values(s.run(10 - a), s23, expect([](T x, T) { return T(10 - x); }));
  check_values(s.run(-a), s23, expect([](T x, T) { return T(-x); }));
  check_values(s.run(loom::square(a)), s23, expect([](T x, T) { return T(x * x); }));
  check_values(s.run(loom::abs(a)), s23, expect([](T x, T) { return T(x < 0 ? -x : x); }));
  check_values(s.run(loom::sign(a)), s23, expect([](T x, T) { return T(x < 0 ? -1 : x > 0); }));
  check_values(s.run(loom::relu(a)), s23, expect([](T x, T) { return T(x > 0 ? x : 0); }));
  check_values(s.run(loom::maximum(a, b)), s23, expect([](T x, T y) { return std::max(x, y); }));
  check_values(s.run(loom::minimum(a, b)), s23, expect([](T x, T y) { return std::min(x, y); }));
  check_values(s.run(loom::clip_by_value(a, T(-1), T(4))), s23,
               expect([](T x, T) { return std::clamp(x, T(-1), T(4)); }));
  // Bounds given as scalar graph nodes.
  auto lo = loom::constant(g, T(0));
  check_values(s.run(loom::clip_by_value(a, lo, T(2))), s23,
               expect([](T x, T) { return std::clamp(x, T(0), T(2)); }));

  check_values(s.run(a < b), s23, expect([](T x, T y) { return x < y; }));
  check_values(s.run(a <= b), s23, expect([](T x, T y) { return x <= y; }));
  check_values(s.run(a > b), s23, expect([](T x, T y) { return x > y; }));
  check_values(s.run(a >= b), s23, expect([](T x, T y) { return x >= y; }));
  check_values(s.run(loom::equal(a, b)), s23, expect([](T x, T y) { return x == y; }));
  check_values(s.run(loom::not_equal(a, b)), s23, expect([](T x, T y) { return x != y; }));
  check_values(s.run(loom::where(a < b, a, b)), s23,
               expect([](T x, T y) { return x < y ? x : y; }));
  auto cond = loom::constant(
      g, tensor<bool, 2>(shape{2, 3}, std::vector<bool>{true, false, false, true, true, false}));
  check_values(s.run(loom::where(cond, a, b)), s23,
               std::vector<double>{double(av[0]), double(bv[1]), double(bv[2]), double(av[3]),
                                   double(av[4]), double(bv[5])});
}

TEST_CASE_TEMPLATE("elementwise functions of floating types", T, float, double) {
  graph g;
  loom::session s(g, opts());
  const std::vector<double> xv{-2.5, -1.0, -0.25, 0.5, 1.0, 3.0};
  auto x = loom::constant(g, tensor<T, 1>(shape{6}, as<T>(xv)));
  const shape s6{6};
  auto expect = [&](auto f) {
    std::vector<double> out;
    for (double v : xv)
      out.push_back(f(static_cast<double>(static_cast<T>(v))));
    return out;
  };
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  check_values(s.run(loom::exp(x)), s6, expect([](double v) { return std::exp(v); }), tol);
  check_values(s.run(loom::log(loom::abs(x))), s6,
               expect([](double v) { return std::log(std::abs(v)); }), tol);
  check_values(s.run(loom::sqrt(loom::abs(x))), s6,
               expect([](double v) { return std::sqrt(std::abs(v)); }), tol);
  check_values(s.run(loom::sigmoid(x)), s6,
               expect([](double v) { return 1.0 / (1.0 + std::exp(-v)); }), tol);
  check_values(s.run(loom::tanh(x)), s6, expect([](double v) { return std::tanh(v); }), tol);
  check_values(s.run(loom::reciprocal(x)), s6, expect([](double v) { return 1.0 / v; }), tol);
}

TEST_CASE("cast between every pair of kinds") {
  graph g;
  loom::session s(g, opts());
  auto f = loom::constant(g, tensor<float, 1>(shape{4}, {2.75f, -2.75f, 0.0f, 1.5f}));
  auto i = loom::constant(g, tensor<std::int64_t, 1>(shape{4}, {-3, 0, 7, 1}));
  auto b =
      loom::constant(g, tensor<bool, 1>(shape{4}, std::vector<bool>{true, false, true, false}));
  check_values(s.run(loom::cast<std::int32_t>(f)), shape{4}, {2, -2, 0, 1}); // truncation
  check_values(s.run(loom::cast<double>(f)), shape{4}, {2.75, -2.75, 0.0, 1.5});
  check_values(s.run(loom::cast<bool>(f)), shape{4}, {1, 1, 0, 1});
  check_values(s.run(loom::cast<float>(i)), shape{4}, {-3, 0, 7, 1});
  check_values(s.run(loom::cast<std::int32_t>(i)), shape{4}, {-3, 0, 7, 1});
  check_values(s.run(loom::cast<double>(b)), shape{4}, {1, 0, 1, 0});
  check_values(s.run(loom::cast<std::int64_t>(b)), shape{4}, {1, 0, 1, 0});
  check_values(s.run(loom::cast<bool>(loom::cast<float>(f > 0.0f))), shape{4}, {1, 0, 0, 1});
  CHECK(loom::lower(loom::cast<double>(f)).node().attr<loom::dtype>("dst") == loom::dtype::f64);
}

TEST_CASE_TEMPLATE("broadcasting: scalar, row, column, rank 3", T, float, std::int32_t) {
  graph g;
  loom::session s(g, opts());
  struct case_t {
    shape sa, sb;
  };
  for (const case_t& c :
       {case_t{shape{2, 3}, shape{}}, case_t{shape{}, shape{2, 3}}, case_t{shape{2, 3}, shape{3}},
        case_t{shape{2, 3}, shape{2, 1}}, case_t{shape{3, 1}, shape{1, 4}},
        case_t{shape{2, 1, 3}, shape{4, 1}}, case_t{shape{4, 1}, shape{2, 1, 3}},
        case_t{shape{2, 3}, shape{1, 1}}, case_t{shape{2, 3}, shape{2, 3}}}) {
    INFO("shapes " << c.sa.to_string() << " and " << c.sb.to_string());
    const auto av = iota_values(c.sa.num_elements(), 1, 1);
    const auto bv = iota_values(c.sb.num_elements(), -2, 3);
    const node_id pa =
        g.add_node("placeholder", {}, {{"dtype", loom::dtype_of<T>}, {"shape", c.sa}});
    const node_id pb =
        g.add_node("placeholder", {}, {{"dtype", loom::dtype_of<T>}, {"shape", c.sb}});
    const shape out = loom::broadcast_shapes(c.sa, c.sb, "test");
    for (const char* op : {"add", "sub", "mul", "maximum"}) {
      INFO("op " << op);
      const node_id y = g.add_node(op, {pa, pb});
      CHECK(g.node(y).shape == out);
      auto got = s.run_nodes({y}, {},
                             {{pa, loom::any_tensor::from_vector<T>(c.sa, as<T>(av))},
                              {pb, loom::any_tensor::from_vector<T>(c.sb, as<T>(bv))}})[0];
      REQUIRE(got.shape() == out);
      for (std::int64_t k = 0; k < out.num_elements(); ++k) {
        const auto idx = unravel(k, out);
        const T x = static_cast<T>(av[static_cast<std::size_t>(broadcast_source(idx, c.sa))]);
        const T z = static_cast<T>(bv[static_cast<std::size_t>(broadcast_source(idx, c.sb))]);
        T expected{};
        if (std::string(op) == "add")
          expected = T(x + z);
        else if (std::string(op) == "sub")
          expected = T(x - z);
        else if (std::string(op) == "mul")
          expected = T(x * z);
        else
          expected = std::max(x, z);
        CHECK(got.template flat<T>()[static_cast<std::size_t>(k)] == expected);
      }
    }
  }
}

// -- fused regions ---------------------------------------------------------------------------

namespace {

std::size_t fused_items(const loom::detail::plan& p) {
  return static_cast<std::size_t>(std::count_if(p.items().begin(), p.items().end(), [](auto& s) {
    return s.k == loom::detail::plan::item::kind::fused;
  }));
}

} // namespace

TEST_CASE_TEMPLATE("a fused region computes what its primitive ops compute", T, float, double) {
  graph g;
  loom::placeholder<T, 2> x(g, shape{-1, -1}, "x");
  loom::placeholder<T, 2> y(g, shape{-1, -1}, "y");
  loom::placeholder<T, 1> r(g, shape{-1}, "r");
  auto tree = loom::lower(loom::relu(x * y + T(0.5)) - loom::exp(x) / (y * y + T(1)) +
                          loom::maximum(x, y) * loom::tanh(y));
  // The same tree with a row vector: needs general broadcasting.
  auto row_tree = loom::lower((x + r) * T(2) - loom::sigmoid(r));

  // The planner fuses each tree into one step, unless fusion is disabled.
  const loom::detail::run_request req{{tree.id()}, {}, {x.id(), y.id()}};
  CHECK(fused_items(loom::detail::plan(g, req)) == 1);
  CHECK(fused_items(loom::detail::plan(g, req, false)) == 0);
  CHECK(loom::detail::plan(g, req, false).items().size() >=
        loom::detail::plan(g, req).items().size() + 8);

  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> dist(-2, 2);
  const shape s{3, 5};
  std::vector<double> xv(15), yv(15), rv(5);
  for (auto& v : xv)
    v = dist(rng);
  for (auto& v : yv)
    v = dist(rng);
  for (auto& v : rv)
    v = dist(rng);
  const loom::feed_dict feeds{{x, tensor<T, 2>(s, as<T>(xv))},
                              {y, tensor<T, 2>(s, as<T>(yv))},
                              {r, tensor<T, 1>(shape{5}, as<T>(rv))}};

  loom::session fused(g, opts());
  loom::session plain(g, loom::session_options{.intra_op_threads = 2, .disable_fusion = true});
  auto f1 = fused.run(tree, feeds);
  auto p1 = plain.run(tree, feeds);
  auto f2 = fused.run(row_tree, feeds);
  auto p2 = plain.run(row_tree, feeds);
  std::vector<double> e1, e2;
  for (std::size_t i = 0; i < 15; ++i) {
    const double a = static_cast<T>(xv[i]), b = static_cast<T>(yv[i]),
                 c = static_cast<T>(rv[i % 5]);
    e1.push_back(std::max(a * b + 0.5, 0.0) - std::exp(a) / (b * b + 1) +
                 std::max(a, b) * std::tanh(b));
    e2.push_back((a + c) * 2 - 1 / (1 + std::exp(-c)));
  }
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  check_values(f1, s, e1, tol);
  check_values(p1, s, e1, tol);
  check_values(f2, s, e2, tol);
  check_values(p2, s, e2, tol);

  // Called directly, the fused kernel computes same-shape operands and declines
  // general broadcasting (the executor then runs the primitive ops).
  const loom::detail::fusion_candidate* row_region = nullptr;
  for (const auto& c : g.fusions())
    if (c.root == row_tree.id())
      row_region = &c;
  REQUIRE(row_region != nullptr);
  auto fn = loom::kernels::fused_kernel_registry::instance().find(row_region->key);
  REQUIRE(static_cast<bool>(fn));
  Eigen::ThreadPool pool(2);
  loom::kernels::cpu_device device(&pool, 2);
  const auto xt = loom::any_tensor::from_vector<T>(s, as<T>(xv));
  const auto rt = loom::any_tensor::from_vector<T>(shape{5}, as<T>(rv));
  const auto r_full = loom::any_tensor::from_vector<T>(s, as<T>(xv));
  const auto two = loom::any_tensor::scalar<T>(T(2));
  REQUIRE(row_region->leaves.size() == 4); // x, r, 2, r
  loom::any_tensor out;
  std::vector<const loom::any_tensor*> broadcast_leaves{&xt, &rt, &two, &rt};
  CHECK_FALSE(fn(device, broadcast_leaves, out, "row_tree"));
  std::vector<const loom::any_tensor*> same_leaves{&xt, &r_full, &two, &r_full};
  REQUIRE(fn(device, same_leaves, out, "row_tree"));
  REQUIRE(out.shape() == s);
  for (std::size_t i = 0; i < 15; ++i) {
    const double a = static_cast<T>(xv[i]);
    check_close<T>(out.template flat<T>()[i], (a + a) * 2 - 1 / (1 + std::exp(-a)), tol);
  }
}

// -- matmul ------------------------------------------------------------------------------------

namespace {

// op(a) x op(b) in double, a and b as stored (row-major).
std::vector<double> matmul_ref(const std::vector<double>& a, const shape& sa, bool ta,
                               const std::vector<double>& b, const shape& sb, bool tb) {
  const std::int64_t m = ta ? sa[1] : sa[0], k = ta ? sa[0] : sa[1], n = tb ? sb[0] : sb[1];
  auto A = [&](std::int64_t i, std::int64_t j) {
    return ta ? a[static_cast<std::size_t>(j * sa[1] + i)]
              : a[static_cast<std::size_t>(i * sa[1] + j)];
  };
  auto B = [&](std::int64_t i, std::int64_t j) {
    return tb ? b[static_cast<std::size_t>(j * sb[1] + i)]
              : b[static_cast<std::size_t>(i * sb[1] + j)];
  };
  std::vector<double> c(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t p = 0; p < k; ++p)
        c[static_cast<std::size_t>(i * n + j)] += A(i, p) * B(p, j);
  return c;
}

} // namespace

// The last two sizes are split over the session's 2 threads: [6, 700] by columns (more
// columns than rows), [400, 6] by rows (kernels/cpu/gemm.hpp).
TEST_CASE_TEMPLATE("matmul: the four transpose combinations, small and large", T, float, double) {
  graph g;
  loom::session s(g, opts());
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> dist(-1, 1);
  for (const auto& mkn :
       {std::array<std::int64_t, 3>{2, 3, 4}, std::array<std::int64_t, 3>{37, 19, 23},
        std::array<std::int64_t, 3>{6, 300, 700}, std::array<std::int64_t, 3>{400, 300, 6}}) {
    const std::int64_t m = mkn[0], k = mkn[1], n = mkn[2];
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        INFO("m k n " << m << " " << k << " " << n << " ta " << ta << " tb " << tb);
        const shape sa = ta ? shape{k, m} : shape{m, k};
        const shape sb = tb ? shape{n, k} : shape{k, n};
        std::vector<double> av(static_cast<std::size_t>(m * k)),
            bv(static_cast<std::size_t>(k * n));
        for (auto& v : av)
          v = static_cast<T>(dist(rng));
        for (auto& v : bv)
          v = static_cast<T>(dist(rng));
        auto a = loom::constant(g, tensor<T, 2>(sa, as<T>(av)));
        auto b = loom::constant(g, tensor<T, 2>(sb, as<T>(bv)));
        auto c = loom::matmul(a, b, ta, tb);
        CHECK(c.shape() == shape{m, n});
        check_values(s.run(c), shape{m, n}, matmul_ref(av, sa, ta, bv, sb, tb),
                     std::is_same_v<T, float> ? 1e-4 : 1e-12);
      }
  }
  // xw_plus_b: x [2, 3], w [3, 2], b [2].
  auto x = loom::constant(g, tensor<T, 2>(shape{2, 3}, {1, 2, 3, 4, 5, 6}));
  auto w = loom::constant(g, tensor<T, 2>(shape{3, 2}, {1, -1, 0, 2, 3, 1}));
  auto bias = loom::constant(g, tensor<T, 1>(shape{2}, {10, 20}));
  // [1*1+2*0+3*3, 1*-1+2*2+3*1] + b = [10+10, 6+20]; [4+0+18, -4+10+6] + b = [32, 32]
  check_values(s.run(loom::xw_plus_b(x, w, bias)), shape{2, 2}, {20, 26, 32, 32});
  // Empty inner dimension gives zeros.
  auto e1 = loom::constant(g, tensor<T, 2>(shape{2, 0}));
  auto e2 = loom::constant(g, tensor<T, 2>(shape{0, 3}));
  check_values(s.run(loom::matmul(e1, e2)), shape{2, 3}, {0, 0, 0, 0, 0, 0});
}

// A float product of m n k >= dnnl_gemm_min_macs is oneDNN's sgemm where loom has oneDNN
// (kernels/cpu/gemm.hpp), whose leading dimensions and transposes are its own: each
// combination, and xw_plus_b's bias, against the same product in double (Eigen's).
TEST_CASE("matmul: float products of oneDNN's size, every transpose, with a bias") {
  const std::int64_t m = 60, k = 1030, n = 1100; // three sizes: a swapped dimension shows
  REQUIRE(m * n * k >= loom::kernels::dnnl_gemm_min_macs);
  const std::int64_t ran_before = loom::kernels::dnnl_gemm_count();
  graph g;
  loom::session s(g, opts());
  std::mt19937_64 rng(12);
  std::uniform_real_distribution<float> dist(-1, 1);
  const auto values = [&](std::int64_t count) {
    std::vector<float> v(static_cast<std::size_t>(count));
    for (auto& x : v)
      x = dist(rng);
    return v;
  };
  const auto in_double = [](const std::vector<float>& v) {
    return std::vector<double>(v.begin(), v.end());
  };
  const std::vector<float> bias = values(n);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      INFO("ta " << ta << " tb " << tb);
      const shape sa = ta ? shape{k, m} : shape{m, k};
      const shape sb = tb ? shape{n, k} : shape{k, n};
      const std::vector<float> av = values(m * k), bv = values(k * n);
      const auto a = loom::constant(g, tensor<float, 2>(sa, av));
      const auto b = loom::constant(g, tensor<float, 2>(sb, bv));
      const auto a64 = loom::constant(g, tensor<double, 2>(sa, in_double(av)));
      const auto b64 = loom::constant(g, tensor<double, 2>(sb, in_double(bv)));
      const tensor<double, 2> want = s.run(loom::matmul(a64, b64, ta, tb));
      check_values(s.run(loom::matmul(a, b, ta, tb)), shape{m, n},
                   std::vector<double>(want.flat().begin(), want.flat().end()), 1e-4);
      if (ta || tb)
        continue;
      const auto with_bias =
          s.run(loom::xw_plus_b(a, b, loom::constant(g, tensor<float, 1>(shape{n}, bias))));
      std::vector<double> biased(want.flat().begin(), want.flat().end());
      for (std::size_t i = 0; i < biased.size(); ++i)
        biased[i] += bias[i % static_cast<std::size_t>(n)];
      check_values(with_bias, shape{m, n}, biased, 1e-4);
    }
#if defined(LOOM_HAVE_DNNL)
  CHECK(loom::kernels::dnnl_gemm_count() - ran_before == 5); // 4 products and xw_plus_b
#endif
}

// -- reductions ----------------------------------------------------------------------------------

namespace {

enum class reducer { sum, mean, max, min, prod };

// Reduces `values` of shape s over the axes in `mask`, in double.
std::vector<double> reduce_ref(const std::vector<double>& values, const shape& s,
                               const std::vector<int>& axes, reducer r, bool integer) {
  std::vector<char> mask(static_cast<std::size_t>(s.rank()), axes.empty() ? 1 : 0);
  for (int a : axes)
    mask[static_cast<std::size_t>(a < 0 ? a + s.rank() : a)] = 1;
  std::vector<std::int64_t> kept;
  for (int i = 0; i < s.rank(); ++i)
    if (!mask[static_cast<std::size_t>(i)])
      kept.push_back(s[i]);
  const shape out(kept);
  std::vector<double> acc(static_cast<std::size_t>(out.num_elements()), r == reducer::max   ? -1e300
                                                                        : r == reducer::min ? 1e300
                                                                        : r == reducer::prod ? 1.0
                                                                                             : 0.0);
  std::vector<int> count(acc.size(), 0);
  for (std::int64_t k = 0; k < s.num_elements(); ++k) {
    const auto idx = unravel(k, s);
    std::int64_t o = 0;
    for (int i = 0; i < s.rank(); ++i)
      if (!mask[static_cast<std::size_t>(i)])
        o = o * s[i] + idx[static_cast<std::size_t>(i)];
    auto& a = acc[static_cast<std::size_t>(o)];
    const double v = values[static_cast<std::size_t>(k)];
    a = r == reducer::max    ? std::max(a, v)
        : r == reducer::min  ? std::min(a, v)
        : r == reducer::prod ? a * v
                             : a + v;
    ++count[static_cast<std::size_t>(o)];
  }
  if (r == reducer::mean)
    for (std::size_t i = 0; i < acc.size(); ++i)
      acc[i] = integer ? std::trunc(acc[i] / count[i]) : acc[i] / count[i];
  return acc;
}

} // namespace

// add_n over enough elements to split into chunks on the pool, with input 0 a
// fed tensor (kept by the feed), a value add_n alone reads (which the kernel may
// sum into), and one value given twice (summing into it would read what it had
// written). The sums are checked, not which buffer they went to: a session does
// not show that.
TEST_CASE_TEMPLATE(
    "add_n: the inputs summed in order, whether input 0 is fed, read only here, or given twice", T,
    float, double, std::int32_t, std::int64_t) {
  graph g;
  loom::session s(g, opts());
  const std::int64_t n = 100003;
  loom::placeholder<T, 1> p(g, shape{-1}, "p"), q(g, shape{-1}, "q"), r(g, shape{-1}, "r");
  std::vector<T> pv, qv, rv;
  for (std::int64_t i = 0; i < n; ++i) {
    pv.push_back(static_cast<T>(i % 7 - 3));
    qv.push_back(static_cast<T>(i % 5));
    rv.push_back(static_cast<T>(-(i % 11)));
  }
  const loom::feed_dict feeds{{p, tensor<T, 1>(shape{n}, pv)},
                              {q, tensor<T, 1>(shape{n}, qv)},
                              {r, tensor<T, 1>(shape{n}, rv)}};
  const auto doubled = loom::lower(p * T(2)); // a value add_n alone reads
  const auto fresh = loom::add_n(std::vector{loom::lower(p), loom::lower(q), loom::lower(r)});
  const auto in_place = loom::add_n(std::vector{doubled, loom::lower(q), loom::lower(r)});
  const auto twice =
      loom::add_n(std::vector{loom::lower(p * T(3)), loom::lower(p * T(3)), loom::lower(q)});
  CHECK(twice.node().inputs[0] == twice.node().inputs[1]);
  for (const auto& [sum, weight] : {std::pair{fresh, 1}, std::pair{in_place, 2}}) {
    const auto got = s.run(sum, feeds);
    REQUIRE(got.shape() == shape{n});
    bool all = true;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      all =
          all && got.flat()[k] == static_cast<T>(static_cast<T>(T(weight) * pv[k] + qv[k]) + rv[k]);
    }
    CHECK(all);
  }
  const auto got = s.run(twice, feeds);
  bool all = true;
  for (std::size_t k = 0; k < static_cast<std::size_t>(n); ++k)
    all = all && got.flat()[k] == static_cast<T>(T(6) * pv[k] + qv[k]);
  CHECK(all);
  // One input is that input, as in TF.
  CHECK(loom::add_n(std::vector{loom::lower(p)}).id() == p.id());
}

TEST_CASE("add_n: inputs of different shapes are one error, when built and when run") {
  graph g;
  loom::session s(g);
  loom::placeholder<float, 1> a(g, shape{-1}, "a"), b(g, shape{-1}, "b");
  const auto sum = loom::add_n(std::vector{loom::lower(a), loom::lower(b)});
  CHECK(sum.node().shape == shape{-1});
  const auto ran = message_of<loom::invalid_argument_error>([&] {
    s.run(sum, {{a, tensor<float, 1>(shape{3}, {1, 2, 3})},
                {b, tensor<float, 1>(shape{4}, {1, 2, 3, 4})}});
  });
  INFO(ran);
  CHECK(contains(ran, "input 1 is float32[4] but input 0 is float32[3]; add_n sums tensors of one "
                      "dtype and shape"));
  loom::placeholder<float, 2> c(g, shape{2, -1}, "c"), d(g, shape{3, 2}, "d");
  const auto built = message_of<loom::invalid_argument_error>([&] {
    loom::add_n(std::vector{loom::lower(c), loom::lower(d)});
  });
  INFO(built);
  CHECK(contains(built, "cannot be added to input 0"));
  CHECK(contains(built, "shape [3, 2]"));
  CHECK(contains(message_of<loom::invalid_argument_error>(
                     [&] { loom::add_n(std::vector<loom::output<float, 1>>{}); }),
                 "loom::add_n: no tensors to add"));
}

TEST_CASE_TEMPLATE("reduce_sum, reduce_mean, reduce_max over axes, with keepdims", T, float, double,
                   std::int32_t, std::int64_t) {
  graph g;
  loom::session s(g, opts());
  const shape sx{2, 3, 4};
  std::vector<double> xv;
  for (int i = 0; i < 24; ++i)
    xv.push_back(static_cast<double>((i * 7) % 11) - 4);
  auto x = loom::constant(g, tensor<T, 3>(sx, as<T>(xv)));
  constexpr bool integer = std::is_integral_v<T>;
  const double tol = std::is_same_v<T, float> ? 1e-6 : 1e-13;

  auto check_all = [&](reducer r, auto&& all, auto&& all_keep, auto&& ax0, auto&& ax1, auto&& ax2,
                       auto&& axm1, auto&& ax02, auto&& ax02_keep, auto&& ax1_keep) {
    check_values(s.run(all), shape{}, reduce_ref(xv, sx, {}, r, integer), tol);
    check_values(s.run(all_keep), shape{1, 1, 1}, reduce_ref(xv, sx, {}, r, integer), tol);
    check_values(s.run(ax0), shape{3, 4}, reduce_ref(xv, sx, {0}, r, integer), tol);
    check_values(s.run(ax1), shape{2, 4}, reduce_ref(xv, sx, {1}, r, integer), tol);
    check_values(s.run(ax2), shape{2, 3}, reduce_ref(xv, sx, {2}, r, integer), tol);
    check_values(s.run(axm1), shape{2, 3}, reduce_ref(xv, sx, {2}, r, integer), tol);
    check_values(s.run(ax02), shape{3}, reduce_ref(xv, sx, {0, 2}, r, integer), tol);
    check_values(s.run(ax02_keep), shape{1, 3, 1}, reduce_ref(xv, sx, {0, 2}, r, integer), tol);
    check_values(s.run(ax1_keep), shape{2, 1, 4}, reduce_ref(xv, sx, {1}, r, integer), tol);
  };
  using loom::keepdims;
  SUBCASE("sum") {
    check_all(reducer::sum, loom::reduce_sum(x), loom::reduce_sum(x, keepdims),
              loom::reduce_sum(x, 0), loom::reduce_sum(x, 1), loom::reduce_sum(x, 2),
              loom::reduce_sum(x, -1), loom::reduce_sum(x, {0, 2}),
              loom::reduce_sum(x, {0, 2}, keepdims), loom::reduce_sum(x, 1, keepdims));
  }
  SUBCASE("mean") {
    check_all(reducer::mean, loom::reduce_mean(x), loom::reduce_mean(x, keepdims),
              loom::reduce_mean(x, 0), loom::reduce_mean(x, 1), loom::reduce_mean(x, 2),
              loom::reduce_mean(x, -1), loom::reduce_mean(x, {0, 2}),
              loom::reduce_mean(x, {0, 2}, keepdims), loom::reduce_mean(x, 1, keepdims));
  }
  SUBCASE("max") {
    check_all(reducer::max, loom::reduce_max(x), loom::reduce_max(x, keepdims),
              loom::reduce_max(x, 0), loom::reduce_max(x, 1), loom::reduce_max(x, 2),
              loom::reduce_max(x, -1), loom::reduce_max(x, {0, 2}),
              loom::reduce_max(x, {0, 2}, keepdims), loom::reduce_max(x, 1, keepdims));
  }
  SUBCASE("min") {
    check_all(reducer::min, loom::reduce_min(x), loom::reduce_min(x, keepdims),
              loom::reduce_min(x, 0), loom::reduce_min(x, 1), loom::reduce_min(x, 2),
              loom::reduce_min(x, -1), loom::reduce_min(x, {0, 2}),
              loom::reduce_min(x, {0, 2}, keepdims), loom::reduce_min(x, 1, keepdims));
  }
  SUBCASE("prod") {
    check_all(reducer::prod, loom::reduce_prod(x), loom::reduce_prod(x, keepdims),
              loom::reduce_prod(x, 0), loom::reduce_prod(x, 1), loom::reduce_prod(x, 2),
              loom::reduce_prod(x, -1), loom::reduce_prod(x, {0, 2}),
              loom::reduce_prod(x, {0, 2}, keepdims), loom::reduce_prod(x, 1, keepdims));
  }
  // An empty axis list reduces nothing (TF).
  CHECK(loom::reduce_sum(x, std::array<int, 0>{}).id() == x.id());
}

TEST_CASE("reduce_any and reduce_all of bools; every reduction's identity over nothing") {
  graph g;
  loom::session s(g, opts());
  loom::placeholder<bool, 2> b(g, shape{-1, 3}, "b");
  const tensor<bool, 2> bv(shape{2, 3}, std::vector<bool>{true, false, true, false, false, false});
  auto values = [](const auto& t) { return std::vector<bool>(t.flat().begin(), t.flat().end()); };
  CHECK(values(s.run(loom::reduce_any(b, 1), {{b, bv}})) == std::vector<bool>{true, false});
  CHECK(values(s.run(loom::reduce_all(b, 1), {{b, bv}})) == std::vector<bool>{false, false});
  CHECK(values(s.run(loom::reduce_any(b, 0), {{b, bv}})) == std::vector<bool>{true, false, true});
  CHECK(values(s.run(loom::reduce_all(b, 0, loom::keepdims), {{b, bv}})) ==
        std::vector<bool>{false, false, false});
  CHECK(s.run(loom::reduce_all(b, loom::keepdims), {{b, bv}}).shape() == shape{1, 1});
  CHECK(values(s.run(loom::reduce_any(b), {{b, bv}})) == std::vector<bool>{true});
  const tensor<bool, 2> all_true(shape{2, 3}, true);
  CHECK(values(s.run(loom::reduce_all(b), {{b, all_true}})) == std::vector<bool>{true});
  // Over nothing: TF's identities.
  const tensor<bool, 2> none(shape{0, 3}, false);
  CHECK(values(s.run(loom::reduce_all(b, 0), {{b, none}})) == std::vector<bool>{true, true, true});
  CHECK(values(s.run(loom::reduce_any(b), {{b, none}})) == std::vector<bool>{false});
  loom::placeholder<float, 1> e(g, shape{-1}, "e");
  loom::placeholder<std::int32_t, 1> ei(g, shape{-1}, "ei");
  const tensor<float, 1> empty(shape{0}, 0.f);
  const tensor<std::int32_t, 1> empty_i(shape{0}, 0);
  CHECK(s.run(loom::reduce_prod(e), {{e, empty}}).flat()[0] == 1.f);
  CHECK(s.run(loom::reduce_min(e), {{e, empty}}).flat()[0] ==
        std::numeric_limits<float>::infinity());
  CHECK(s.run(loom::reduce_min(ei), {{ei, empty_i}}).flat()[0] ==
        std::numeric_limits<std::int32_t>::max());
  // A numeric reduction of bools, and any/all of numbers, are refused by the graph too.
  const auto error = [](auto&& f) { return message_of<loom::invalid_argument_error>(f); };
  CHECK(contains(error([&] { g.add_node("reduce_any", {e.id()}); }),
                 "cannot reduce 'e' (placeholder) of dtype float32 (reduce_any reduces bools)"));
  CHECK(contains(error([&] { g.add_node("reduce_prod", {b.id()}); }),
                 "cannot reduce 'b' (placeholder) of dtype bool"));
}

// -- softmax and cross-entropies
// -------------------------------------------------------------------

namespace {

std::vector<double> log_softmax_ref(const std::vector<double>& z, std::int64_t cols) {
  std::vector<double> out(z.size());
  for (std::size_t r = 0; r < z.size() / static_cast<std::size_t>(cols); ++r) {
    const auto* row = &z[r * static_cast<std::size_t>(cols)];
    const double m = *std::max_element(row, row + cols);
    double sum = 0;
    for (std::int64_t j = 0; j < cols; ++j)
      sum += std::exp(row[j] - m);
    for (std::int64_t j = 0; j < cols; ++j)
      out[r * static_cast<std::size_t>(cols) + static_cast<std::size_t>(j)] =
          row[j] - m - std::log(sum);
  }
  return out;
}

} // namespace

TEST_CASE_TEMPLATE("softmax, log_softmax and the cross-entropies", T, float, double) {
  graph g;
  loom::session s(g, opts());
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  // The second row would overflow exp without the max subtraction.
  const std::vector<double> zv{1.0, 2.0, 0.5, 1000.0, 1001.0, 1002.0};
  auto z = loom::constant(g, tensor<T, 2>(shape{2, 3}, as<T>(zv)));
  const auto ls = log_softmax_ref(zv, 3);
  std::vector<double> sm;
  for (double v : ls)
    sm.push_back(std::exp(v));
  check_values(s.run(loom::softmax(z)), shape{2, 3}, sm, tol);
  check_values(s.run(loom::log_softmax(z)), shape{2, 3}, ls, tol);

  // Rank 1 and rank 3: the last axis.
  auto z1 = loom::constant(g, tensor<T, 1>(shape{3}, as<T>({1.0, 2.0, 0.5})));
  check_values(s.run(loom::softmax(z1)), shape{3}, {sm[0], sm[1], sm[2]}, tol);
  auto z3 = loom::constant(g, tensor<T, 3>(shape{2, 1, 3}, as<T>(zv)));
  check_values(s.run(loom::log_softmax(z3)), shape{2, 1, 3}, ls, tol);

  // Cross-entropy with a distribution as labels: -sum(labels * log_softmax).
  const std::vector<double> lv{0.2, 0.3, 0.5, 0.0, 1.0, 0.0};
  auto labels = loom::constant(g, tensor<T, 2>(shape{2, 3}, as<T>(lv)));
  std::vector<double> xent(2, 0.0);
  for (std::size_t i = 0; i < 6; ++i)
    xent[i / 3] -= lv[i] * ls[i];
  check_values(s.run(loom::softmax_cross_entropy_with_logits(labels, z)), shape{2}, xent, tol);

  // Sparse labels: -log_softmax at the label.
  auto classes = loom::constant(g, tensor<std::int64_t, 1>(shape{2}, {2, 0}));
  check_values(s.run(loom::sparse_softmax_cross_entropy_with_logits(classes, z)), shape{2},
               {-ls[2], -ls[3]}, tol);
  auto bad = loom::constant(g, tensor<std::int32_t, 1>(shape{2}, {0, 3}));
  auto bad_xent = loom::sparse_softmax_cross_entropy_with_logits(bad, z);
  auto msg = message_of<loom::invalid_argument_error>([&] { s.run(bad_xent); });
  CHECK(contains(msg, bad_xent.name()));
  CHECK(contains(msg, "label 3"));
  CHECK(contains(msg, "[2, 3]"));
}

// -- argmax, equal, reshape, identity
// ----------------------------------------------------------------

TEST_CASE_TEMPLATE("argmax and argmin: ties give the first index", T, float, double, std::int32_t,
                   std::int64_t) {
  graph g;
  loom::session s(g, opts());
  auto x = loom::constant(g, tensor<T, 2>(shape{2, 3}, {3, 1, 3, 0, 5, 5}));
  auto am1 = s.run(loom::argmax(x, 1));
  static_assert(std::is_same_v<decltype(am1), tensor<std::int64_t, 1>>);
  check_values(am1, shape{2}, {0, 1});
  check_values(s.run(loom::argmax(x, 0)), shape{3}, {0, 1, 1});
  check_values(s.run(loom::argmax(x, -1)), shape{2}, {0, 1});
  check_values(s.run(loom::argmin(x, 1)), shape{2}, {1, 0});
  check_values(s.run(loom::argmin(x, 0)), shape{3}, {1, 0, 0});
  auto v = loom::constant(g, tensor<T, 1>(shape{4}, {2, 9, 9, -1}));
  CHECK(static_cast<std::int64_t>(s.run(loom::argmax(v, 0))) == 1);
}

TEST_CASE("equal over every dtype but string, bool included") {
  graph g;
  loom::session s(g, opts());
  auto b1 = loom::constant(g, tensor<bool, 1>(shape{3}, std::vector<bool>{true, false, true}));
  auto b2 = loom::constant(g, tensor<bool, 1>(shape{3}, std::vector<bool>{true, true, false}));
  check_values(s.run(loom::equal(b1, b2)), shape{3}, {1, 0, 0});
  check_values(s.run(loom::not_equal(b1, b2)), shape{3}, {0, 1, 1});
  auto i = loom::constant(g, tensor<std::int64_t, 1>(shape{3}, {4, 5, 6}));
  check_values(s.run(loom::equal(i, std::int64_t{5})), shape{3}, {0, 1, 0});
}

TEST_CASE("reshape and identity") {
  graph g;
  loom::session s(g, opts());
  const std::vector<double> xv{1, 2, 3, 4, 5, 6};
  auto x = loom::constant(g, tensor<float, 2>(shape{2, 3}, as<float>(xv)));
  check_values(s.run(loom::reshape(x, {3, 2})), shape{3, 2}, xv);
  check_values(s.run(loom::reshape(x, {-1})), shape{6}, xv);
  check_values(s.run(loom::reshape(x, {1, -1, 2})), shape{1, 3, 2}, xv);
  check_values(s.run(loom::named(x, "the_same")), shape{2, 3}, xv);

  loom::placeholder<float, 2> p(g, shape{-1, -1}, "p");
  auto flat = loom::reshape(p, {-1});
  CHECK(flat.shape() == shape{-1});
  auto fed = tensor<float, 2>(shape{2, 3}, as<float>(xv));
  check_values(s.run(flat, {{p, fed}}), shape{6}, xv);
  auto by4 = loom::reshape(p, {4, -1});
  auto msg = message_of<loom::invalid_argument_error>([&] { s.run(by4, {{p, fed}}); });
  CHECK(contains(msg, by4.name()));
  CHECK(contains(msg, "[2, 3]"));
  CHECK(contains(msg, "[4, -1]"));
}

// -- state
// ------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("assign, assign_add and assign_sub", T, float, double, std::int32_t,
                   std::int64_t) {
  graph g;
  loom::variable<T, 1> v(g, "v", shape{3}, loom::constant_initializer{2});
  auto set = v.assign(loom::constant(g, tensor<T, 1>(shape{3}, {1, 2, 3})));
  auto add = v.assign_add(loom::constant(g, tensor<T, 1>(shape{3}, {10, 20, 30})));
  auto sub = v.assign_sub(loom::constant(g, tensor<T, 1>(shape{3}, {1, 1, 1})));
  loom::variable<T, 0> c(g, "c", shape{}, loom::zeros_initializer{});
  auto inc = c.assign_add(5);
  loom::session s(g, opts());
  s.run(loom::global_variables_initializer(g));
  check_values(s.run(v), shape{3}, {2, 2, 2});
  const auto before = s.run(v);
  check_values(s.run(set), shape{3}, {1, 2, 3});
  check_values(s.run(add), shape{3}, {11, 22, 33});
  check_values(s.run(add), shape{3}, {21, 42, 63});
  check_values(s.run(sub), shape{3}, {20, 41, 62});
  check_values(s.run(v), shape{3}, {20, 41, 62});
  check_values(before, shape{3}, {2, 2, 2}); // a fetched value is a snapshot
  CHECK(static_cast<T>(s.run(inc)) == T(5));
  CHECK(static_cast<T>(s.run(inc)) == T(10));

  // Updating an uninitialized variable names it.
  loom::variable<T, 1> fresh(g, "fresh", shape{3}, loom::zeros_initializer{});
  auto bump = fresh.assign_add(loom::constant(g, tensor<T, 1>(shape{3}, {1, 1, 1})));
  auto msg = message_of<loom::failed_precondition_error>([&] { s.run(bump); });
  CHECK(contains(msg, bump.name()));
  CHECK(contains(msg, "'fresh'"));
}

TEST_CASE("constants of every dtype, strings included") {
  graph g;
  loom::session s(g, opts());
  auto hello = loom::constant(g, "hello");
  CHECK(s.run(hello).item() == "hello");
  auto words = loom::constant(g, tensor<std::string, 1>(shape{3}, {"a", "", "ccc"}));
  auto got = s.run(words);
  CHECK(got(0) == "a");
  CHECK(got(1).empty());
  CHECK(got(2) == "ccc");
  CHECK(static_cast<bool>(s.run(loom::constant(g, true))));
  CHECK(static_cast<std::int64_t>(s.run(loom::constant(g, std::int64_t{1} << 40))) ==
        std::int64_t{1} << 40);
  CHECK(static_cast<double>(s.run(loom::constant(g, 0.1))) == 0.1);
  CHECK(s.run(loom::named(words, "words_again"))(2) == "ccc");
}

TEST_CASE_TEMPLATE("fills: zeros, ones, constant, zeros_like, ones_like", T, float, double,
                   std::int32_t, std::int64_t) {
  graph g;
  loom::variable<T, 2> z(g, "z", shape{2, 2}, loom::zeros_initializer{});
  loom::variable<T, 2> o(g, "o", shape{2, 2}, loom::ones_initializer{});
  loom::variable<T, 1> k(g, "k", shape{3}, loom::constant_initializer{7});
  auto src = loom::constant(g, tensor<T, 2>(shape{2, 3}, {1, 2, 3, 4, 5, 6}));
  loom::output<T, 2> zl(g, loom::detail::build::zeros_like(g, src.id()));
  loom::output<T, 2> ol(g, loom::detail::build::ones_like(g, src.id()));
  loom::session s(g, opts());
  s.run(loom::global_variables_initializer(g));
  check_values(s.run(z), shape{2, 2}, {0, 0, 0, 0});
  check_values(s.run(o), shape{2, 2}, {1, 1, 1, 1});
  check_values(s.run(k), shape{3}, {7, 7, 7});
  check_values(s.run(zl), shape{2, 3}, {0, 0, 0, 0, 0, 0});
  check_values(s.run(ol), shape{2, 3}, {1, 1, 1, 1, 1, 1});
}

// -- random
// -------------------------------------------------------------------------------------------

namespace {

template <class T, int R> std::pair<double, double> mean_and_stddev(const tensor<T, R>& t) {
  const auto v = t.flat();
  double m = 0, q = 0;
  for (T x : v)
    m += static_cast<double>(x);
  m /= static_cast<double>(v.size());
  for (T x : v)
    q += (static_cast<double>(x) - m) * (static_cast<double>(x) - m);
  return {m, std::sqrt(q / static_cast<double>(v.size()))};
}

} // namespace

TEST_CASE_TEMPLATE("a uniform draw stays below its upper bound after rounding", T, float, double) {
  const double just_below_one = 1.0 - 0x1.0p-53;                 // the largest uniform01 draw
  CHECK(static_cast<float>(0.0 + 1.0 * just_below_one) == 1.0f); // what rounding alone gives
  CHECK(loom::kernels::uniform_in<T>(0.0, 1.0, just_below_one) < T(1));
  CHECK(loom::kernels::uniform_in<T>(5.0, 6.0, just_below_one) < T(6));
  CHECK(loom::kernels::uniform_in<T>(-2.0, 3.0, 0.0) == T(-2));
  CHECK(loom::kernels::uniform_in<T>(-2.0, 3.0, 0.5) == T(0.5));
}

TEST_CASE_TEMPLATE("seeded random sources and initializers", T, float, double) {
  graph g;
  g.set_random_seed(1234);
  auto u = loom::random_uniform<T, 1>(g, shape{4000}, -2.0, 3.0);
  auto n = loom::random_normal<T, 1>(g, shape{4000}, 1.0, 2.0);
  auto tn = loom::truncated_normal<T, 1>(g, shape{4000}, 0.5, 0.1);
  loom::variable<T, 2> glorot(g, "glorot", shape{20, 30}, loom::glorot_uniform_initializer{});
  loom::variable<T, 2> normal_init(g, "normal_init", shape{50, 40},
                                   loom::random_normal_initializer{.mean = 0, .stddev = 0.5});
  loom::variable<T, 1> uniform_init(g, "uniform_init", shape{1000},
                                    loom::random_uniform_initializer{.minval = 5, .maxval = 6});

  loom::session s(g, opts());
  s.run(loom::global_variables_initializer(g));
  const auto uv = s.run(u);
  CHECK(std::all_of(uv.flat().begin(), uv.flat().end(), [](T x) { return x >= -2 && x < 3; }));
  auto [um, us] = mean_and_stddev(uv);
  CHECK(std::abs(um - 0.5) < 0.1);
  CHECK(std::abs(us - 5 / std::sqrt(12.0)) < 0.1);

  const auto nv = s.run(n);
  auto [nm, ns] = mean_and_stddev(nv);
  CHECK(std::abs(nm - 1.0) < 0.15);
  CHECK(std::abs(ns - 2.0) < 0.15);

  // Truncated at two standard deviations: every value within, stddev ~0.88 of the normal's.
  const auto tv = s.run(tn);
  CHECK(std::all_of(tv.flat().begin(), tv.flat().end(), [](T x) {
    return x >= T(0.5 - 0.2) - T(1e-6) && x <= T(0.5 + 0.2) + T(1e-6);
  }));
  auto [tm, ts] = mean_and_stddev(tv);
  CHECK(std::abs(tm - 0.5) < 0.01);
  CHECK(std::abs(ts - 0.088) < 0.01);

  // Glorot uniform: limit sqrt(6 / (fan_in + fan_out)), and the draws span it.
  const double limit = std::sqrt(6.0 / 50.0);
  const auto gv = s.run(glorot);
  double largest = 0;
  for (T x : gv.flat()) {
    CHECK(std::abs(static_cast<double>(x)) <= limit);
    largest = std::max(largest, std::abs(static_cast<double>(x)));
  }
  CHECK(largest > 0.9 * limit);
  auto [gm, gs] = mean_and_stddev(gv);
  CHECK(std::abs(gm) < 0.05);
  CHECK(std::abs(gs - limit / std::sqrt(3.0)) < 0.03);

  auto [im, is] = mean_and_stddev(s.run(normal_init));
  CHECK(std::abs(im) < 0.05);
  CHECK(std::abs(is - 0.5) < 0.05);
  const auto iv = s.run(uniform_init);
  CHECK(std::all_of(iv.flat().begin(), iv.flat().end(), [](T x) { return x >= 5 && x < 6; }));

  // Each run draws new numbers; a new session with the same seeds repeats them.
  const auto uv2 = s.run(u);
  CHECK_FALSE(std::equal(uv.flat().begin(), uv.flat().end(), uv2.flat().begin()));
  loom::session again(g, opts());
  const auto uv3 = again.run(u);
  CHECK(std::equal(uv.flat().begin(), uv.flat().end(), uv3.flat().begin()));

  // The same graph seed in another graph gives the same numbers; another op seed does not.
  graph h;
  h.set_random_seed(1234);
  auto hu = loom::random_uniform<T, 1>(h, shape{4000}, -2.0, 3.0);
  auto hu_other = loom::random_uniform<T, 1>(h, shape{4000}, -2.0, 3.0, 99);
  loom::session hs(h, opts());
  const auto hv = hs.run(hu);
  CHECK(std::equal(uv.flat().begin(), uv.flat().end(), hv.flat().begin()));
  const auto hv_other = hs.run(hu_other);
  CHECK_FALSE(std::equal(uv.flat().begin(), uv.flat().end(), hv_other.flat().begin()));
}

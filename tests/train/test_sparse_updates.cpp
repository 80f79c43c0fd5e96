// Sparse updates: the gradient of an embedding lookup reaches every optimizer
// as rows and indices (an indexed_slices), and its sparse apply changes only
// the rows the step touched, of the variable and of its slots; on those rows it
// agrees with the dense apply of the same gradient. Adam's sparse path is
// TF's LazyAdam, and lazy(false) gives TF's AdamOptimizer. FTRL against TF's
// update written out.
#include <doctest/doctest.h>
#include <support/messages.hpp>

#include <loom/loom.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

using loom::graph;
using loom::shape;
using loom::tensor;
using loom::testing::contains;
using loom::testing::message_of;

namespace {

const tensor<double, 2> initial(shape{6, 3}, {0.1, -0.2, 0.3, 0.4, 0.5, -0.6, 0.7, 0.8, 0.9, -1.0,
                                              1.1, 1.2, 1.3, -1.4, 1.5, 1.6, 1.7, 1.8});

struct optimizer_case {
  const char* name;
  std::function<std::unique_ptr<loom::optimizer>()> make;
  bool untouched_rows_move_when_dense; // slots that decay without a gradient
};

std::vector<optimizer_case> optimizers() {
  return {
      {"gradient descent", [] { return std::make_unique<loom::gradient_descent_optimizer>(0.1); },
       false},
      {"momentum", [] { return std::make_unique<loom::momentum_optimizer>(0.1, 0.9); }, true},
      {"adagrad", [] { return std::make_unique<loom::adagrad_optimizer>(0.1); }, false},
      {"rmsprop", [] { return std::make_unique<loom::rmsprop_optimizer>(0.01, 0.9, 0.5); }, true},
      {"adam", [] { return std::make_unique<loom::adam_optimizer>(0.01); }, true},
      {"ftrl",
       [] {
         return std::make_unique<loom::ftrl_optimizer>(
             0.1, loom::ftrl_options{.l1_regularization_strength = 0.001,
                                     .l2_regularization_strength = 0.01,
                                     .l2_shrinkage_regularization_strength = 0.01});
       },
       true}, // dense FTRL recomputes every weight from its linear slot
  };
}

// The rows of v.
std::vector<double> row(const tensor<double, 2>& v, std::int64_t r) {
  return {v(r, 0), v(r, 1), v(r, 2)};
}

} // namespace

TEST_CASE("every optimizer's sparse apply changes only the touched rows, as the dense one does "
          "on them") {
  for (const optimizer_case& oc : optimizers()) {
    INFO(std::string(oc.name));
    graph g;
    loom::variable<double, 2> sparse_table(g, "sparse_table", loom::constant(g, initial));
    loom::variable<double, 2> dense_table(g, "dense_table", loom::constant(g, initial));
    loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
    loom::placeholder<double, 2> weights(g, shape{-1, 3}, "weights");
    // The same loss of both tables; the dense one's lookup reads a product
    // (x 1), whose gradient is dense.
    auto sparse_loss = loom::reduce_sum(loom::gather(sparse_table, ids) * weights);
    auto dense_loss = loom::reduce_sum(loom::gather(dense_table * 1.0, ids) * weights);
    auto opt = oc.make();
    auto train = opt->minimize(sparse_loss + dense_loss);
    // The sparse table's update is the sparse twin; the dense table's is not.
    bool saw_sparse = false, saw_dense = false;
    for (std::size_t i = 0; i < g.size(); ++i) {
      const auto& n = g.node(static_cast<loom::node_id>(i));
      saw_sparse |= n.op.rfind("sparse_apply_", 0) == 0;
      saw_dense |= n.op.rfind("apply_", 0) == 0;
    }
    CHECK(saw_sparse);
    CHECK(saw_dense);

    loom::session s(g);
    s.run(loom::global_variables_initializer(g));
    // Rows 1 and 3 in every step, repeated within a step.
    s.run(train, {{ids, tensor<std::int64_t, 1>(shape{3}, {3, 1, 3})},
                  {weights, tensor<double, 2>(shape{3, 3}, {1, 2, 3, -1, 0.5, 2, 0.25, 1, -2})}});
    s.run(train, {{ids, tensor<std::int64_t, 1>(shape{2}, {1, 3})},
                  {weights, tensor<double, 2>(shape{2, 3}, {0.5, -1, 1, 2, 2, -0.5})}});
    const auto sparse_after = s.run(sparse_table);
    const auto dense_after = s.run(dense_table);
    for (std::int64_t r : {1, 3})
      for (int k = 0; k < 3; ++k) {
        CHECK(sparse_after(r, k) == doctest::Approx(dense_after(r, k)).epsilon(1e-12));
        CHECK(sparse_after(r, k) != initial(r, k)); // it moved
      }
    for (std::int64_t r : {0, 2, 4, 5})
      CHECK(row(sparse_after, r) == row(initial, r)); // untouched, exactly
    if (!oc.untouched_rows_move_when_dense)
      for (std::int64_t r : {0, 2, 4, 5})
        CHECK(row(dense_after, r) == row(initial, r));
  }
}

TEST_CASE("every optimizer's sparse apply over many rows (duplicate ids, rows of 16, 1, 64 and "
          "3, split over the pool) agrees with the dense apply on the touched rows") {
  // Large enough that the apply splits its rows over the pool's threads in
  // chunks: the rows of a chunk's end, of duplicate ids, and of the last
  // chunk are where a faster path's slip would show. The row kernels (gather,
  // the apply's row blocks, the gradients' row sums) compile the usual widths
  // of an embedding row as constants (kernels/cpu/array.hpp with_row_width):
  // 16, 1 and 64 take those paths, 3 the general one.
  const std::int64_t rows = 3000, n = 4000;
  std::uint64_t state = 2026;
  const auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  std::vector<std::int64_t> id(static_cast<std::size_t>(n));
  for (auto& v : id) // half from a few hot rows (many duplicates), half from all
    v = static_cast<std::int64_t>(next() % 2 ? next() % 97 : next() % rows);
  std::vector<optimizer_case> cases = optimizers();
  cases.push_back({"momentum (nesterov)",
                   [] { return std::make_unique<loom::momentum_optimizer>(0.1, 0.9, true); },
                   true});
  for (const std::int64_t width : {16, 1, 64, 3}) {
    std::vector<double> start(static_cast<std::size_t>(rows * width)),
        w(static_cast<std::size_t>(n * width));
    for (auto& v : start)
      v = static_cast<double>(next() % 2001) / 1000.0 - 1.0;
    for (auto& v : w)
      v = static_cast<double>(next() % 2001) / 1000.0 - 1.0;
    const tensor<double, 2> init(shape{rows, width}, start);
    for (const optimizer_case& oc : cases) {
      INFO(std::string(oc.name) << ", rows of " << width);
      graph g;
      loom::variable<double, 2> sparse_table(g, "sparse_table", loom::constant(g, init));
      loom::variable<double, 2> dense_table(g, "dense_table", loom::constant(g, init));
      loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
      loom::placeholder<double, 2> weights(g, shape{-1, width}, "weights");
      auto loss = loom::reduce_sum(loom::gather(sparse_table, ids) * weights) +
                  loom::reduce_sum(loom::gather(dense_table * 1.0, ids) * weights);
      auto opt = oc.make();
      auto train = opt->minimize(loss);
      loom::session s(g);
      s.run(loom::global_variables_initializer(g));
      // The second step touches the same rows in the other order (the
      // optimizers whose dense apply moves untouched rows agree only on rows
      // every step touched).
      const std::vector<std::int64_t> reversed(id.rbegin(), id.rend());
      s.run(train, {{ids, tensor<std::int64_t, 1>(shape{n}, id)},
                    {weights, tensor<double, 2>(shape{n, width}, w)}});
      s.run(train, {{ids, tensor<std::int64_t, 1>(shape{n}, reversed)},
                    {weights, tensor<double, 2>(shape{n, width}, w)}});
      const auto sparse_after = s.run(sparse_table);
      const auto dense_after = s.run(dense_table);
      std::vector<bool> touched(static_cast<std::size_t>(rows), false);
      for (std::int64_t v : id)
        touched[static_cast<std::size_t>(v)] = true;
      int mismatched = 0, moved = 0, untouched_changed = 0;
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t k = 0; k < width; ++k) {
          const double got = sparse_after(r, k), was = init(r, k);
          if (!touched[static_cast<std::size_t>(r)]) {
            untouched_changed += got != was;
            continue;
          }
          mismatched += got != doctest::Approx(dense_after(r, k)).epsilon(1e-9);
          moved += got != was;
        }
      CHECK(mismatched == 0);
      CHECK(untouched_changed == 0); // exactly as they were
      CHECK(moved > 0);
    }
  }
}

TEST_CASE("adam lazy(false) applies a sparse gradient as TF's AdamOptimizer: every row's m and v "
          "decay") {
  graph g;
  loom::variable<double, 2> table(g, "table", loom::constant(g, initial));
  loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
  loom::adam_optimizer adam(0.01);
  adam.lazy(false);
  auto train = adam.minimize(loom::reduce_sum(loom::gather(table, ids)));
  for (std::size_t i = 0; i < g.size(); ++i)
    CHECK(g.node(static_cast<loom::node_id>(i)).op.rfind("sparse_apply_", 0) != 0);
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  s.run(train, {{ids, tensor<std::int64_t, 1>(shape{1}, std::int64_t{2})}});
  s.run(train, {{ids, tensor<std::int64_t, 1>(shape{1}, std::int64_t{4})}});
  const auto after = s.run(table);
  // Row 2's m carries into the second step, though row 4 had the gradient.
  CHECK(row(after, 2) != row(initial, 2));
  CHECK(after(2, 0) != doctest::Approx(initial(2, 0) - 0.01).epsilon(1e-9));
  CHECK(row(after, 0) == row(initial, 0)); // m = v = 0 there: unchanged
}

TEST_CASE("a sparse apply with a row outside the variable fails naming it; the variable is whole") {
  graph g;
  loom::variable<double, 2> table(g, "table", loom::constant(g, initial));
  loom::placeholder<double, 2> rows(g, shape{-1, 3}, "rows");
  loom::placeholder<std::int64_t, 1> at(g, shape{-1}, "at");
  const auto lr = loom::detail::scalar_node(g, 0.5);
  const auto update =
      g.add_node("sparse_apply_gradient_descent", {table.id(), lr, rows.id(), at.id()});
  loom::session s(g);
  s.run(table.initializer());
  const auto what = message_of<loom::invalid_argument_error>([&] {
    s.run_nodes(
        {}, {update},
        {{rows.id(), loom::any_tensor::from_vector<double>(shape{2, 3}, {1, 1, 1, 1, 1, 1})},
         {at.id(), loom::any_tensor::from_vector<std::int64_t>(shape{2}, {0, 6})}});
  });
  CHECK(contains(what, "id 6 (at position 1) is outside [0, 6) of variable 'table'"));
  const auto after = s.run(table);
  CHECK(row(after, 0) == row(initial, 0)); // nothing was written
  // Rows that do not fit the indices are refused when the graph is built.
  loom::placeholder<double, 2> wide(g, shape{-1, 4}, "wide");
  const auto misfit = message_of<loom::invalid_argument_error>([&] {
    g.add_node("sparse_apply_gradient_descent", {table.id(), lr, wide.id(), at.id()});
  });
  INFO(misfit);
  CHECK(contains(misfit, "into variable 'table' of shape [6, 3] need [?, 3]"));
}

namespace {

// TF's ApplyFtrlV2 for one element, in double, written out.
void ftrl_step(double& w, double& accum, double& linear, double grad, double lr, double l1,
               double l2, double shrinkage, double power) {
  const double n = accum + grad * grad;
  linear += grad + 2 * shrinkage * w - (std::pow(n, -power) - std::pow(accum, -power)) / lr * w;
  const double quadratic = std::pow(n, -power) / lr + 2 * l2;
  w = std::abs(linear) > l1 ? ((linear > 0 ? 1.0 : -1.0) * l1 - linear) / quadratic : 0.0;
  accum = n;
}

} // namespace

TEST_CASE("ftrl: TF's FTRL-Proximal update, with l1, l2, l2 shrinkage and a learning-rate power") {
  for (const double power : {-0.5, -0.3}) {
    INFO("learning_rate_power " << power);
    graph g;
    const std::vector<double> start{0.5, -0.3, 0.0}, grad{1.0, -2.0, 0.001};
    loom::variable<double, 1> v(g, "v", loom::constant(g, tensor<double, 1>(shape{3}, start)));
    const loom::ftrl_options o{.learning_rate_power = power,
                               .initial_accumulator_value = 0.1,
                               .l1_regularization_strength = 0.01,
                               .l2_regularization_strength = 0.1,
                               .l2_shrinkage_regularization_strength = 0.05};
    loom::ftrl_optimizer ftrl(0.2, o);
    auto train =
        ftrl.minimize(loom::reduce_sum(v * loom::constant(g, tensor<double, 1>(shape{3}, grad))));
    loom::session s(g);
    s.run(loom::global_variables_initializer(g));
    std::vector<double> w = start, accum(3, 0.1), linear(3, 0.0);
    for (int step = 0; step < 3; ++step) {
      s.run(train);
      for (std::size_t k = 0; k < 3; ++k)
        ftrl_step(w[k], accum[k], linear[k], grad[k], 0.2, 0.01, 0.1, 0.05, power);
    }
    const auto got = s.run(v);
    for (std::size_t k = 0; k < 3; ++k)
      CHECK(got(static_cast<std::int64_t>(k)) == doctest::Approx(w[k]).epsilon(1e-12));
    CHECK(w[2] == 0.0); // |linear| below l1: the weight is exactly zero (FTRL's sparsity)
  }
  CHECK(contains(message_of<loom::invalid_argument_error>(
                     [] { loom::ftrl_optimizer(0.1, {.learning_rate_power = 0.5}); }),
                 "learning_rate_power must be 0 or less"));
}

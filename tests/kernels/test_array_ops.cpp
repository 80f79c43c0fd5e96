// The index ops of sparse models (graph/ops/array.hpp) on the CPU: gather and
// resource_gather (from a variable, under its lock), the dense value of a
// sparse gradient, unsorted_segment_sum, unique, concat, the scatter updates;
// each bad id or shape
// one error naming the node, what it indexes, the id and its position.
#include <doctest/doctest.h>
#include <support/messages.hpp>

#include <loom/kernels/context.hpp>
#include <loom/kernels/cpu/parallel_for.hpp>
#include <loom/kernels/registry.hpp>
#include <loom/loom.hpp>
#include <loom/runtime/resource_manager.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

using loom::any_tensor;
using loom::graph;
using loom::shape;
using loom::tensor;
using loom::testing::contains;
using loom::testing::message_of;

namespace {

template <class T> std::vector<T> values_of(const any_tensor& t) {
  const auto f = t.flat<T>();
  return std::vector<T>(f.begin(), f.end());
}

any_tensor ids(const shape& s, const std::vector<std::int64_t>& v) {
  return any_tensor::from_vector<std::int64_t>(s, v);
}

} // namespace

TEST_CASE("gather takes rows, slices along an axis, and repeats ids") {
  graph g;
  loom::placeholder<float, 2> params(g, shape{3, 2}, "params");
  loom::placeholder<std::int64_t, 1> rows(g, shape{-1}, "rows");
  loom::placeholder<std::int32_t, 2> cols(g, shape{-1, -1}, "cols");
  auto by_row = loom::gather(params, rows);
  auto by_col = loom::gather(params, cols, 1);
  static_assert(decltype(by_col)::rank == 3);
  loom::session s(g);
  const auto p = tensor<float, 2>(shape{3, 2}, {0, 1, 10, 11, 20, 21});
  const auto got =
      s.run(by_row, {{params, p}, {rows, tensor<std::int64_t, 1>(shape{4}, {2, 0, 2, 1})}});
  CHECK(got.shape() == shape{4, 2});
  CHECK(std::vector<float>(got.flat().begin(), got.flat().end()) ==
        std::vector<float>{20, 21, 0, 1, 20, 21, 10, 11});
  const auto cols_got =
      s.run(by_col, {{params, p}, {cols, tensor<std::int32_t, 2>(shape{1, 2}, {1, 0})}});
  CHECK(cols_got.shape() == shape{3, 1, 2});
  CHECK(std::vector<float>(cols_got.flat().begin(), cols_got.flat().end()) ==
        std::vector<float>{1, 0, 11, 10, 21, 20});
}

TEST_CASE("gather of many ids, along axis 0 and 1, agrees with a reference (split over the pool "
          "in blocks that start inside an outer slice)") {
  // [outer, count, inner] = [3, 5000, 16]; gathering along axis 1 makes
  // blocks that start and end inside an outer slice.
  const std::int64_t outer = 3, count = 5000, inner = 16, n = 7001;
  std::vector<float> p(static_cast<std::size_t>(outer * count * inner));
  for (std::size_t k = 0; k < p.size(); ++k)
    p[k] = static_cast<float>(k);
  std::vector<std::int64_t> id(static_cast<std::size_t>(n));
  std::uint64_t state = 7;
  for (auto& v : id) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<std::int64_t>((state >> 33) % static_cast<std::uint64_t>(count));
  }
  graph g;
  loom::placeholder<float, 3> params(g, shape{outer, count, inner}, "params");
  loom::placeholder<std::int64_t, 1> at(g, shape{-1}, "at");
  auto along_1 = loom::gather(params, at, 1);
  loom::session s(g);
  const auto got = s.run(along_1, {{params, tensor<float, 3>(shape{outer, count, inner}, p)},
                                   {at, tensor<std::int64_t, 1>(shape{n}, id)}});
  REQUIRE(got.shape() == shape{outer, n, inner});
  int wrong = 0;
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t k = 0; k < n; ++k)
      for (std::int64_t j = 0; j < inner; ++j)
        wrong +=
            got(o, k, j) !=
            p[static_cast<std::size_t>((o * count + id[static_cast<std::size_t>(k)]) * inner + j)];
  CHECK(wrong == 0);
  // Axis 0 of the rows [outer * count, inner].
  graph g0;
  loom::placeholder<float, 2> table(g0, shape{outer * count, inner}, "table");
  loom::placeholder<std::int64_t, 1> at0(g0, shape{-1}, "at");
  auto along_0 = loom::gather(table, at0);
  loom::session s0(g0);
  const auto rows = s0.run(along_0, {{table, tensor<float, 2>(shape{outer * count, inner}, p)},
                                     {at0, tensor<std::int64_t, 1>(shape{n}, id)}});
  REQUIRE(rows.shape() == shape{n, inner});
  wrong = 0;
  for (std::int64_t k = 0; k < n; ++k)
    for (std::int64_t j = 0; j < inner; ++j)
      wrong +=
          rows(k, j) != p[static_cast<std::size_t>(id[static_cast<std::size_t>(k)] * inner + j)];
  CHECK(wrong == 0);
}

TEST_CASE("an id out of range fails the step naming the variable, the id and its position") {
  graph g;
  loom::variable<float, 2> table(g, "table", shape{4, 3}, loom::zeros_initializer{});
  loom::placeholder<std::int64_t, 1> id(g, shape{-1}, "id");
  auto rows = loom::gather(table, id);
  CHECK(rows.node().op == "resource_gather"); // from the variable, through its reference
  loom::session s(g);
  s.run(table.initializer());
  const auto too_big = message_of<loom::invalid_argument_error>([&] {
    s.run(rows, {{id, tensor<std::int64_t, 1>(shape{3}, {0, 4, 1})}});
  });
  CHECK(contains(too_big, "id 4 (at position 1) is outside [0, 4) of variable 'table'"));
  const auto negative = message_of<loom::invalid_argument_error>([&] {
    s.run(rows, {{id, tensor<std::int64_t, 1>(shape{2}, {-1, 0})}});
  });
  CHECK(contains(negative, "id -1 (at position 0) is outside [0, 4) of variable 'table'"));
  // The variable is whole afterwards, and a good step runs.
  CHECK(s.run(rows, {{id, tensor<std::int64_t, 1>(shape{1}, std::int64_t{3})}}).shape() ==
        shape{1, 3});
}

TEST_CASE("a gather from an uninitialized variable says so") {
  graph g;
  loom::variable<float, 2> table(g, "table", shape{4, 3}, loom::zeros_initializer{});
  auto rows =
      loom::gather(table, loom::constant(g, tensor<std::int64_t, 1>(shape{1}, std::int64_t{0})));
  loom::session s(g);
  const auto what = message_of<loom::failed_precondition_error>([&] { s.run(rows); });
  INFO(what);
  CHECK(contains(what, "uninitialized variable 'table'"));
}

TEST_CASE("the dense value of a sparse gradient sums the rows of repeated ids") {
  graph g;
  const auto values = loom::detail::constant_node(
      g, any_tensor::from_vector<double>(shape{3, 2}, {1, 2, 3, 4, 5, 6}));
  const auto slices = g.add_node(
      "indexed_slices", {values, loom::detail::constant_node(g, ids(shape{3}, {2, 0, 2}))},
      {{"axis", std::int64_t{0}}, {"dense_shape", std::vector<std::int64_t>{4, 2}}});
  loom::session s(g);
  const auto dense = s.run_nodes({slices}, {}).front();
  CHECK(dense.shape() == shape{4, 2});
  CHECK(values_of<double>(dense) == std::vector<double>{3, 4, 0, 0, 6, 8, 0, 0});
}

TEST_CASE("indexed_slices' kernel given neither a dense_shape nor a third input: one error") {
  // Graph inference refuses such a node; a kernel run on a hand-made one says what is missing.
  const any_tensor values = any_tensor::from_vector<double>(shape{1, 2}, {1, 2});
  const any_tensor indices = ids(shape{1}, {0});
  const std::array<const any_tensor*, 2> in{&values, &indices};
  loom::node_def n;
  n.op = "indexed_slices";
  n.name = "slices";
  n.attrs = {{"axis", std::int64_t{0}}};
  const loom::kernels::kernel_fn kernel = loom::kernels::kernel_registry::instance().find_for(
      n, loom::dtype::f64, loom::kernels::device_cpu);
  Eigen::ThreadPool pool(1);
  loom::kernels::cpu_device device(&pool, 1);
  loom::detail::resource_manager resources;
  loom::kernels::kernel_context c{n, in, {}, device, resources, {}, 0, nullptr, nullptr};
  const auto what = message_of<loom::invalid_argument_error>([&] { kernel(c); });
  INFO(what);
  CHECK(contains(what, "no dense shape: neither a 'dense_shape' attribute nor a third input"));
}

TEST_CASE("unsorted_segment_sum: rows summed per segment, negative ids dropped, a count known "
          "when the step runs") {
  graph g;
  loom::placeholder<float, 2> data(g, shape{-1, 2}, "data");
  loom::placeholder<std::int64_t, 1> segment(g, shape{-1}, "segment");
  loom::placeholder<std::int64_t, 0> count(g, shape{}, "count");
  auto sums = loom::unsorted_segment_sum(data, segment, count);
  auto fixed = loom::unsorted_segment_sum(data, segment, 3);
  CHECK(fixed.node().shape == shape{3, 2});
  loom::session s(g);
  const loom::feed_dict feeds{{data, tensor<float, 2>(shape{4, 2}, {1, 2, 3, 4, 5, 6, 7, 8})},
                              {segment, tensor<std::int64_t, 1>(shape{4}, {2, -1, 0, 2})},
                              {count, tensor<std::int64_t, 0>(3)}};
  const auto got = s.run(sums, feeds);
  CHECK(got.shape() == shape{3, 2});
  CHECK(std::vector<float>(got.flat().begin(), got.flat().end()) ==
        std::vector<float>{5, 6, 0, 0, 8, 10});
  loom::feed_dict beyond = feeds;
  beyond[2] = {count, tensor<std::int64_t, 0>(2)};
  CHECK(contains(message_of<loom::invalid_argument_error>([&] { s.run(sums, beyond); }),
                 "id 2 (at position 0) is outside [0, 2) of the segments"));
}

TEST_CASE("unique: distinct ids in first-seen order, and where each id went") {
  graph g;
  loom::placeholder<std::int64_t, 1> x(g, shape{-1}, "x");
  auto [values, index] = loom::unique(x);
  loom::session s(g);
  auto [v, i] = s.run(loom::fetches(values, index),
                      {{x, tensor<std::int64_t, 1>(shape{6}, {7, 3, 7, 9, 3, 7})}});
  CHECK(std::vector<std::int64_t>(v.flat().begin(), v.flat().end()) ==
        std::vector<std::int64_t>{7, 3, 9});
  CHECK(std::vector<std::int32_t>(i.flat().begin(), i.flat().end()) ==
        std::vector<std::int32_t>{0, 1, 0, 2, 1, 0});
  // ids == gather(values, index)
  auto back = loom::gather(values, index);
  const auto again = s.run(back, {{x, tensor<std::int64_t, 1>(shape{3}, {5, 5, 2})}});
  CHECK(std::vector<std::int64_t>(again.flat().begin(), again.flat().end()) ==
        std::vector<std::int64_t>{5, 5, 2});
}

TEST_CASE("concat joins along an axis; shapes that do not fit are one error") {
  graph g;
  loom::placeholder<float, 2> a(g, shape{-1, 2}, "a");
  loom::placeholder<float, 2> b(g, shape{-1, 1}, "b");
  auto joined = loom::concat(std::vector{loom::lower(a), loom::lower(b)}, 1);
  CHECK(joined.node().shape == shape{-1, 3});
  loom::session s(g);
  const auto got = s.run(joined, {{a, tensor<float, 2>(shape{2, 2}, {1, 2, 3, 4})},
                                  {b, tensor<float, 2>(shape{2, 1}, {9, 8})}});
  CHECK(std::vector<float>(got.flat().begin(), got.flat().end()) ==
        std::vector<float>{1, 2, 9, 3, 4, 8});
  const auto misfit = message_of<loom::invalid_argument_error>([&] {
    s.run(joined, {{a, tensor<float, 2>(shape{2, 2}, {1, 2, 3, 4})},
                   {b, tensor<float, 2>(shape{3, 1}, {9, 8, 7})}});
  });
  INFO(misfit);
  CHECK(contains(misfit, "cannot join shapes [2, 2] and [3, 1] along axis 1"));
  graph h;
  loom::placeholder<float, 2> c(h, shape{2, 2}, "c");
  loom::placeholder<float, 2> d(h, shape{3, 2}, "d");
  CHECK(contains(message_of<loom::invalid_argument_error>([&] {
                   loom::concat(std::vector{loom::lower(c), loom::lower(d)}, 1);
                 }),
                 "cannot be joined with"));
}

// Rows of an embedding's width (16: copied as a constant width), of 4 and of 3
// (the general copy), joined along axis 1 as a model joins its embeddings, and
// the gradient split back (concat_grad).
TEST_CASE("concat and its gradient over parts of constant and other row widths") {
  graph g;
  const std::vector<std::int64_t> widths{16, 4, 3};
  const std::int64_t rows = 5, total = 16 + 4 + 3;
  std::vector<loom::placeholder<float, 2>> parts;
  std::vector<loom::output<float, 2>> lowered;
  loom::feed_dict feeds;
  for (std::size_t p = 0; p < widths.size(); ++p) {
    parts.emplace_back(g, shape{-1, widths[p]}, "part_" + std::to_string(p));
    lowered.push_back(loom::lower(parts.back()));
    tensor<float, 2> v(shape{rows, widths[p]});
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < widths[p]; ++j)
        v(r, j) = static_cast<float>(100 * p + 10 * r + j);
    feeds.emplace_back(parts.back(), v);
  }
  const auto joined = loom::concat(lowered, 1);
  // d/d part of sum(joined * weight) is the part's columns of weight.
  tensor<float, 2> weight_value(shape{rows, total});
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < total; ++j)
      weight_value(r, j) = static_cast<float>(r * total + j);
  const auto weight = loom::constant(g, weight_value);
  const auto [d0, d1, d2] =
      loom::gradients(loom::reduce_sum(joined * weight), lowered[0], lowered[1], lowered[2]);
  loom::session s(g);
  const auto [got, g0, g1, g2] = s.run(loom::fetches(joined, d0, d1, d2), feeds);
  const std::vector<tensor<float, 2>> grads{g0, g1, g2};
  std::int64_t offset = 0;
  for (std::size_t p = 0; p < widths.size(); ++p) {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < widths[p]; ++j) {
        CHECK(got(r, offset + j) == static_cast<float>(100 * p + 10 * r + j));
        CHECK(grads[p](r, j) == weight_value(r, offset + j));
      }
    offset += widths[p];
  }
}

TEST_CASE("scatter_add, scatter_sub and scatter_update change rows in place; a bad index writes "
          "nothing") {
  graph g;
  loom::variable<float, 2> v(g, "v", loom::constant(g, tensor<float, 2>(shape{4, 2}, 1.0f)));
  loom::placeholder<std::int64_t, 1> at(g, shape{-1}, "at");
  loom::placeholder<float, 2> rows(g, shape{-1, 2}, "rows");
  auto added = loom::scatter_add(v, at, rows);
  auto taken = loom::scatter_sub(v, at, rows);
  auto set = loom::scatter_update(v, at, rows);
  CHECK(added.node().colocation_group == v.node().colocation());
  loom::session s(g);
  s.run(v.initializer());
  const loom::feed_dict twice_row_2{{at, tensor<std::int64_t, 1>(shape{3}, {2, 0, 2})},
                                    {rows, tensor<float, 2>(shape{3, 2}, {1, 2, 3, 4, 5, 6})}};
  auto got = s.run(added, twice_row_2);
  CHECK(std::vector<float>(got.flat().begin(), got.flat().end()) ==
        std::vector<float>{4, 5, 1, 1, 7, 9, 1, 1});
  got = s.run(taken, twice_row_2);
  CHECK(std::vector<float>(got.flat().begin(), got.flat().end()) ==
        std::vector<float>{1, 1, 1, 1, 1, 1, 1, 1});
  got = s.run(set, {{at, tensor<std::int64_t, 1>(shape{1}, std::int64_t{3})},
                    {rows, tensor<float, 2>(shape{1, 2}, {8, 9})}});
  CHECK(std::vector<float>(got.flat().begin(), got.flat().end()) ==
        std::vector<float>{1, 1, 1, 1, 1, 1, 8, 9});
  const auto what = message_of<loom::invalid_argument_error>([&] {
    s.run(added, {{at, tensor<std::int64_t, 1>(shape{2}, {0, 4})},
                  {rows, tensor<float, 2>(shape{2, 2}, {1, 1, 1, 1})}});
  });
  CHECK(contains(what, "id 4 (at position 1) is outside [0, 4) of variable 'v'"));
  got = s.run(v);
  CHECK(got(0, 0) == 1.0f); // nothing was written
  // Updates that do not fit the indices are refused when the graph is built.
  loom::placeholder<float, 2> wide(g, shape{-1, 3}, "wide");
  CHECK(contains(message_of<loom::invalid_argument_error>([&] { loom::scatter_add(v, at, wide); }),
                 "do not fit indices"));
}

namespace {

// Rows 0, 1 and 2 of a batch: ids {1, 3}, none, {4, 1, 1}.
loom::sparse_tensor<std::int64_t> multi_hot_ids(graph& g) {
  return {loom::constant(g, tensor<std::int64_t, 2>(shape{5, 2}, {0, 0, 0, 1, 2, 0, 2, 1, 2, 2})),
          loom::constant(g, tensor<std::int64_t, 1>(shape{5}, {1, 3, 4, 1, 1})),
          loom::constant(g, tensor<std::int64_t, 1>(shape{2}, {3, 3}))};
}

} // namespace

TEST_CASE("embedding_lookup_sparse: sum, mean and sqrtn of each row's embeddings, weighted or "
          "not; an empty row gives zeros") {
  graph g;
  std::vector<float> rows;
  for (int r = 0; r < 5; ++r) {
    rows.push_back(static_cast<float>(r));
    rows.push_back(10.0f * static_cast<float>(r));
  }
  loom::variable<float, 2> table(g, "table",
                                 loom::constant(g, tensor<float, 2>(shape{5, 2}, rows)));
  const auto ids = multi_hot_ids(g);
  const loom::sparse_tensor<float> weights{
      ids.indices, loom::constant(g, tensor<float, 1>(shape{5}, {2, 1, 1, 0.5f, 0.5f})),
      ids.dense_shape};
  loom::session s(g);
  s.run(table.initializer());
  struct expected {
    loom::combiner how;
    bool weighted;
    std::vector<float> values; // rows 0, 1, 2
  };
  const float r2 = std::sqrt(2.0f), r3 = std::sqrt(3.0f), r5 = std::sqrt(5.0f),
              r15 = std::sqrt(1.5f);
  for (const expected& e : {
           expected{loom::combiner::sum, false, {4, 40, 0, 0, 6, 60}},
           expected{loom::combiner::mean, false, {2, 20, 0, 0, 2, 20}},
           expected{loom::combiner::sqrtn, false, {4 / r2, 40 / r2, 0, 0, 6 / r3, 60 / r3}},
           expected{loom::combiner::sum, true, {5, 50, 0, 0, 5, 50}},
           expected{loom::combiner::mean, true, {5.0f / 3, 50.0f / 3, 0, 0, 2.5f, 25}},
           expected{loom::combiner::sqrtn, true, {5 / r5, 50 / r5, 0, 0, 5 / r15, 50 / r15}},
       }) {
    INFO("combiner " << static_cast<int>(e.how) << (e.weighted ? ", weighted" : ""));
    auto combined = loom::embedding_lookup_sparse(
        table, ids, e.weighted ? std::optional(weights) : std::nullopt, e.how);
    const auto got = s.run(combined);
    REQUIRE(got.shape() == shape{3, 2});
    for (std::size_t k = 0; k < 6; ++k)
      CHECK(got.flat()[k] == doctest::Approx(e.values[k]).epsilon(1e-6));
  }
}

TEST_CASE("a sparse tensor whose indices are out of order or outside its shape is one error") {
  graph g;
  loom::variable<float, 2> table(g, "table",
                                 loom::constant(g, tensor<float, 2>(shape{5, 2}, 1.0f)));
  const auto sp = loom::sparse_placeholder<std::int64_t>(g, "features");
  auto combined = loom::embedding_lookup_sparse(table, sp, std::nullopt, loom::combiner::sum);
  loom::session s(g);
  s.run(table.initializer());
  auto feed = [&](std::vector<std::int64_t> at) {
    const auto n = static_cast<std::int64_t>(at.size() / 2);
    return loom::feed_dict{
        {sp.indices, tensor<std::int64_t, 2>(shape{n, 2}, at)},
        {sp.values, tensor<std::int64_t, 1>(
                        shape{n}, std::vector<std::int64_t>(static_cast<std::size_t>(n), 1))},
        {sp.dense_shape, tensor<std::int64_t, 1>(shape{2}, {2, 3})}};
  };
  CHECK(s.run(combined, feed({0, 0, 0, 2, 1, 1})).shape() == shape{2, 2});
  const auto unordered = message_of<loom::invalid_argument_error>([&] {
    s.run(combined, feed({0, 2, 0, 1}));
  });
  CHECK(contains(unordered, "index 1 [0, 1] does not come after index 0 [0, 2] of sparse tensor "
                            "'features/values'"));
  const auto outside = message_of<loom::invalid_argument_error>([&] {
    s.run(combined, feed({0, 0, 2, 0}));
  });
  CHECK(contains(outside, "index 1 [2, 0] is outside the dense shape of sparse tensor "
                          "'features/values'"));
}

TEST_CASE("unique over many ids with collisions agrees with a reference, in first-seen order") {
  graph g;
  loom::placeholder<std::int64_t, 1> x(g, shape{-1}, "x");
  auto [values, index] = loom::unique(x);
  std::vector<std::int64_t> ids;
  std::uint64_t state = 12345;
  for (int k = 0; k < 20000; ++k) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    // Few distinct values, far apart and negative too: many probes per slot.
    ids.push_back(static_cast<std::int64_t>((state >> 33) % 997) * (std::int64_t{1} << 32) - 7);
  }
  std::vector<std::int64_t> want_values;
  std::vector<std::int32_t> want_index;
  std::map<std::int64_t, std::int32_t> seen;
  for (std::int64_t id : ids) {
    auto [it, fresh] = seen.emplace(id, static_cast<std::int32_t>(seen.size()));
    if (fresh)
      want_values.push_back(id);
    want_index.push_back(it->second);
  }
  loom::session s(g);
  auto [v, i] =
      s.run(loom::fetches(values, index),
            {{x, tensor<std::int64_t, 1>(shape{static_cast<std::int64_t>(ids.size())}, ids)}});
  CHECK(std::vector<std::int64_t>(v.flat().begin(), v.flat().end()) == want_values);
  CHECK(std::vector<std::int32_t>(i.flat().begin(), i.flat().end()) == want_index);
}

TEST_CASE("string_to_hash_bucket_fast puts strings in TF's buckets (FarmHash Fingerprint64)") {
  graph g;
  loom::placeholder<std::string, 1> s(g, shape{-1}, "s");
  auto buckets = loom::string_to_hash_bucket_fast(s, 3);
  auto wide = loom::string_to_hash_bucket_fast(s, std::int64_t{1} << 62);
  loom::session sess(g);
  const tensor<std::string, 1> words(shape{3}, {"Hello", "TensorFlow", "2.x"});
  // tf.strings.to_hash_bucket_fast(["Hello", "TensorFlow", "2.x"], 3) in TF's documentation.
  const auto got = sess.run(buckets, {{s, words}});
  CHECK(got(0) == 0);
  CHECK(got(1) == 2);
  CHECK(got(2) == 2);
  // Deterministic, and different strings spread over a large range.
  const auto a = sess.run(wide, {{s, words}});
  const auto b = sess.run(wide, {{s, words}});
  CHECK(a(0) == b(0));
  CHECK(a(0) != a(1));
  CHECK(a(1) != a(2));
}

TEST_CASE("string_to_hash_bucket_fast refuses zero buckets and non-strings, naming the node") {
  graph g;
  loom::placeholder<std::string, 1> s(g, shape{-1}, "s");
  const auto zero =
      message_of<loom::invalid_argument_error>([&] { loom::string_to_hash_bucket_fast(s, 0); });
  CHECK(contains(zero, "num_buckets is 0; it must be 1 or more"));
  loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
  const auto wrong = message_of<loom::invalid_argument_error>([&] {
    g.add_node("string_to_hash_bucket_fast", {ids.id()}, {{"num_buckets", std::int64_t{4}}});
  });
  CHECK(contains(wrong, "hashes strings, not int64 'ids' (placeholder)"));
}

TEST_CASE("embedding_lookup over 1 to 5 shards, 'mod' and 'div', returns each id's row") {
  // The shard routing (shard_unique, shard_slots) has a fast path for "mod"
  // over a power-of-two count of shards: every count and both strategies must
  // give the rows of the unsharded table, repeated ids included.
  constexpr std::int64_t rows = 11, dim = 2;
  const std::vector<std::int64_t> id_list{10, 0, 3, 3, 7, 1, 8, 2, 10, 5, 4, 9, 6};
  for (std::int64_t n = 1; n <= 5; ++n)
    for (const auto strategy : {loom::partition_strategy::mod, loom::partition_strategy::div}) {
      const bool div = strategy == loom::partition_strategy::div;
      INFO(n << " shard(s), " << (div ? "div" : "mod"));
      graph g;
      loom::placeholder<std::int64_t, 1> at(g, shape{-1}, "ids");
      std::vector<loom::variable<float, 2>> shards;
      std::vector<loom::output<float, 2>> fills;
      for (std::int64_t p = 0; p < n; ++p) {
        // Shard p holds the ids TF's strategy gives it; each row is (id, -id).
        std::vector<float> v;
        for (std::int64_t id = 0; id < rows; ++id)
          if (loom::detail::route_id(id, n, rows, div).shard == p) {
            v.push_back(static_cast<float>(id));
            v.push_back(static_cast<float>(-id));
          }
        const auto count = static_cast<std::int64_t>(v.size()) / dim;
        shards.emplace_back(g, "part_" + std::to_string(p), shape{count, dim},
                            loom::zeros_initializer{});
        fills.push_back(
            shards.back().assign(loom::constant(g, tensor<float, 2>(shape{count, dim}, v))));
      }
      auto looked_up = loom::embedding_lookup(
          std::vector<loom::output<float, 2>>(shards.begin(), shards.end()), at, strategy);
      loom::session s(g);
      for (std::size_t p = 0; p < shards.size(); ++p) {
        s.run(shards[p].initializer());
        s.run(fills[p]);
      }
      const auto got =
          s.run(looked_up, {{at, tensor<std::int64_t, 1>(
                                     shape{static_cast<std::int64_t>(id_list.size())}, id_list)}});
      std::vector<float> want;
      for (std::int64_t id : id_list) {
        want.push_back(static_cast<float>(id));
        want.push_back(static_cast<float>(-id));
      }
      CHECK(std::vector<float>(got.flat().begin(), got.flat().end()) == want);
    }
}

TEST_CASE("the routing over shards: each shard's distinct rows in first-seen order, each id's "
          "slot among them, and gather_shards' bad slots one error") {
  // 3 shards ("mod", rows 12): id 7 is row 2 of shard 1, id 4 row 1 of shard 1, id 9 row 3 of
  // shard 0, id 0 row 0 of shard 0, id 5 row 1 of shard 2. Slots are position * 3 + shard.
  graph g;
  loom::placeholder<std::int64_t, 1> x(g, shape{-1}, "x");
  const loom::attr_map route{{"num_shards", std::int64_t{3}},
                             {"strategy", std::string("mod")},
                             {"rows", std::int64_t{12}},
                             {"_what", std::string("the table")}};
  const loom::node_id slots = g.add_node("shard_slots", {x.id()}, route);
  std::vector<loom::node_id> distinct;
  for (std::int64_t p = 0; p < 3; ++p) {
    loom::attr_map a = route;
    a["shard"] = p;
    distinct.push_back(g.add_node("shard_unique", {x.id(), slots}, a));
  }
  loom::session s(g);
  const any_tensor feed = ids(shape{6}, {7, 9, 4, 7, 0, 5});
  const auto got =
      s.run_nodes({distinct[0], distinct[1], distinct[2], slots}, {}, {{x.id(), feed}});
  CHECK(values_of<std::int64_t>(got[0]) == std::vector<std::int64_t>{3, 0});
  CHECK(values_of<std::int64_t>(got[1]) == std::vector<std::int64_t>{2, 1});
  CHECK(values_of<std::int64_t>(got[2]) == std::vector<std::int64_t>{1});
  CHECK(values_of<std::int64_t>(got[3]) == std::vector<std::int64_t>{1, 0, 4, 1, 3, 2});
  const auto outside = message_of<loom::invalid_argument_error>([&] {
    s.run_nodes({slots}, {}, {{x.id(), ids(shape{2}, {3, 12})}});
  });
  CHECK(contains(outside, "id 12 (at position 1) is outside [0, 12) of the table"));

  // gather_shards puts rows back by slot; its gradient sums a shard's repeated slots.
  loom::placeholder<float, 2> a(g, shape{-1, 2}, "a");
  loom::placeholder<float, 2> b(g, shape{-1, 2}, "b");
  loom::placeholder<std::int64_t, 1> at(g, shape{-1}, "at");
  const loom::node_id rows =
      g.add_node("gather_shards", {at.id(), a.id(), b.id()}, {{"N", std::int64_t{2}}});
  loom::placeholder<float, 2> dy(g, shape{-1, 2}, "dy");
  const loom::node_id grad_b = g.add_node("gather_shards_grad", {dy.id(), at.id()},
                                          {{"N", std::int64_t{2}}, {"shard", std::int64_t{1}}});
  loom::session s2(g);
  const auto av = any_tensor::from_vector<float>(shape{2, 2}, {1, 2, 3, 4});
  const auto bv = any_tensor::from_vector<float>(shape{1, 2}, {5, 6});
  const auto back = s2.run_nodes(
      {rows, grad_b}, {},
      {{at.id(), ids(shape{3}, {1, 2, 1})},
       {a.id(), av},
       {b.id(), bv},
       {dy.id(), any_tensor::from_vector<float>(shape{3, 2}, {1, 1, 10, 10, 100, 100})}});
  CHECK(values_of<float>(back[0]) == std::vector<float>{5, 6, 3, 4, 5, 6});
  CHECK(back[1].shape() == shape{1, 2});
  CHECK(values_of<float>(back[1]) == std::vector<float>{101, 101});
  const auto past = message_of<loom::invalid_argument_error>([&] {
    s2.run_nodes({rows}, {}, {{at.id(), ids(shape{2}, {0, 3})}, {a.id(), av}, {b.id(), bv}});
  });
  CHECK(contains(past, "slot 3 (at position 1) names row 1 of shard 1, which has 1 rows"));
}

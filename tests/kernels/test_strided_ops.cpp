// The strided ops (graph/ops/strided.hpp), one_hot, range, gather_nd and top_k on the CPU:
// transpose, strided_slice with TF's masks (and slice, split, unstack, stack built on them), pad,
// tile, expand_dims and squeeze, each against values worked out by hand or a naive loop over
// indices; range's lengths, gather_nd's tuples, top_k's order with ties; each
// bad shape or spec one error naming the node and the shapes, at build time where the
// shapes are known and when the step runs otherwise.
#include <doctest/doctest.h>
#include <support/messages.hpp>

#include <loom/loom.hpp>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

using loom::any_tensor;
using loom::graph;
using loom::shape;
using loom::tensor;
using loom::testing::contains;
using loom::testing::message_of;

namespace {

template <class T, int R> std::vector<T> flat_values(const tensor<T, R>& t) {
  return std::vector<T>(t.flat().begin(), t.flat().end());
}

// 0, 1, 2, ... in a tensor of shape s.
template <class T = float, int R> tensor<T, R> iota_tensor(const shape& s) {
  std::vector<T> v(static_cast<std::size_t>(s.num_elements()));
  std::iota(v.begin(), v.end(), T(0));
  return tensor<T, R>(s, v);
}

// The row-major index of coordinates `at` in shape s.
std::int64_t offset_in(const shape& s, const std::vector<std::int64_t>& at) {
  std::int64_t o = 0;
  for (int d = 0; d < s.rank(); ++d)
    o = o * s[d] + at[static_cast<std::size_t>(d)];
  return o;
}

// Calls f(coordinates) for every index of s in row-major order.
template <class F> void for_each_index(const shape& s, F&& f) {
  std::vector<std::int64_t> at(static_cast<std::size_t>(s.rank()), 0);
  for (std::int64_t e = 0; e < s.num_elements(); ++e) {
    f(at);
    for (int d = s.rank() - 1; d >= 0; --d) {
      if (++at[static_cast<std::size_t>(d)] < s[d])
        break;
      at[static_cast<std::size_t>(d)] = 0;
    }
  }
}

} // namespace

TEST_CASE("transpose: every permutation of a rank-4 tensor against a naive loop") {
  const shape xs{2, 3, 4, 5};
  graph g;
  loom::placeholder<float, 4> x(g, xs, "x");
  const auto xv = iota_tensor<float, 4>(xs);
  std::array<int, 4> perm{0, 1, 2, 3};
  loom::session s(g);
  do {
    auto y = loom::transpose(x, perm);
    const auto got = s.run(y, {{x, xv}});
    std::vector<std::int64_t> out_dims;
    for (int p : perm)
      out_dims.push_back(xs[p]);
    REQUIRE(got.shape() == shape(out_dims));
    std::vector<float> want;
    for_each_index(shape(out_dims), [&](const std::vector<std::int64_t>& at) {
      std::vector<std::int64_t> src(4);
      for (std::size_t d = 0; d < 4; ++d)
        src[static_cast<std::size_t>(perm[d])] = at[d];
      want.push_back(static_cast<float>(offset_in(xs, src)));
    });
    CHECK(flat_values(got) == want);
  } while (std::next_permutation(perm.begin(), perm.end()));
  // The default reverses the dimensions; strings move too.
  loom::placeholder<std::string, 2> words(g, shape{2, 2}, "words");
  const auto t = s.run(loom::transpose(words),
                       {{words, tensor<std::string, 2>(shape{2, 2}, {"a", "b", "c", "d"})}});
  CHECK(flat_values(t) == std::vector<std::string>{"a", "c", "b", "d"});
}

TEST_CASE("strided_slice: TF's semantics for ranges, negative strides and indices, masks") {
  graph g;
  loom::placeholder<float, 2> m(g, shape{-1, 5}, "m"); // rows known only when the step runs
  loom::session s(g);
  const auto mv = iota_tensor<float, 2>(shape{4, 5});
  auto run = [&](const auto& y) { return s.run(y, {{m, mv}}); };

  // m[1:3, ::2]
  auto a = loom::strided_slice(m, {1, 0}, {3, 0}, {1, 2}, {.end_mask = 2});
  CHECK(a.shape() == shape{-1, 3});
  CHECK(flat_values(run(a)) == std::vector<float>{5, 7, 9, 10, 12, 14});
  // m[::-1, -1]: rows reversed, the last column (shrunk): rank 1
  auto b = loom::strided_slice<1>(m, {0, -1}, {0, 0}, {-1, 1},
                                  {.begin_mask = 1, .end_mask = 1, .shrink_axis_mask = 2});
  CHECK(flat_values(run(b)) == std::vector<float>{19, 14, 9, 4});
  // m[-2:, tf.newaxis, 3:1:-1]: a new axis, indices from the end, a backward range
  auto c = loom::strided_slice<3>(m, {-2, 0, 3}, {0, 0, 1}, {1, 1, -1},
                                  {.end_mask = 1, .new_axis_mask = 2});
  const auto cv = run(c);
  CHECK(cv.shape() == shape{2, 1, 2});
  CHECK(flat_values(cv) == std::vector<float>{13, 12, 18, 17});
  // m[..., 1]: an ellipsis takes the leading dimensions whole
  auto d = loom::strided_slice<1>(m, {0, 1}, {0, 2}, {1, 1},
                                  {.ellipsis_mask = 1, .shrink_axis_mask = 2});
  CHECK(flat_values(run(d)) == std::vector<float>{1, 6, 11, 16});
  // Out-of-range bounds are clamped (TF's); an empty range is an empty tensor.
  auto e = loom::strided_slice(m, {-100, 3}, {100, 100}, {1, 1});
  CHECK(run(e).shape() == shape{4, 2});
  auto f = loom::strided_slice(m, {3, 0}, {1, 5}, {1, 1});
  CHECK(run(f).shape() == shape{0, 5});
  // slice: begin and size, -1 for the rest
  auto sl = loom::slice(m, {1, 2}, {2, -1});
  CHECK(flat_values(run(sl)) == std::vector<float>{7, 8, 9, 12, 13, 14});
}

TEST_CASE("split, unstack and stack") {
  graph g;
  loom::placeholder<float, 2> m(g, shape{2, 6}, "m");
  loom::session s(g);
  const auto mv = iota_tensor<float, 2>(shape{2, 6});
  const auto parts = loom::split(m, std::vector<std::int64_t>{1, -1, 2}, 1);
  REQUIRE(parts.size() == 3);
  CHECK(parts[1].shape() == shape{2, 3});
  CHECK(flat_values(s.run(parts[2], {{m, mv}})) == std::vector<float>{4, 5, 10, 11});
  const auto halves = loom::split(m, 2, -1);
  CHECK(flat_values(s.run(halves[1], {{m, mv}})) == std::vector<float>{3, 4, 5, 9, 10, 11});
  const auto cols = loom::unstack(m, 1);
  REQUIRE(cols.size() == 6);
  CHECK(flat_values(s.run(cols[4], {{m, mv}})) == std::vector<float>{4, 10});
  auto back = loom::stack(cols, 1);
  CHECK(back.shape() == shape{2, 6});
  CHECK(flat_values(s.run(back, {{m, mv}})) == flat_values(mv));
  auto rows = loom::stack(std::vector<loom::output<float, 2>>{m, m}, 0);
  CHECK(rows.shape() == shape{2, 2, 6});

  CHECK(contains(message_of<loom::invalid_argument_error>([&] {
                   loom::split(m, std::vector<std::int64_t>{2, 2}, 1);
                 }),
                 "add up to 4, not dimension 1"));
  CHECK(contains(message_of<loom::invalid_argument_error>([&] { loom::split(m, 4, 1); }),
                 "4 equal parts of dimension 1"));
}

TEST_CASE("pad and tile against naive loops; expand_dims and squeeze share the buffer") {
  graph g;
  loom::placeholder<std::int32_t, 3> x(g, shape{2, 3, 2}, "x");
  loom::session s(g);
  const auto xv = iota_tensor<std::int32_t, 3>(shape{2, 3, 2});
  auto padded = loom::pad(x, {{{1, 0}, {0, 2}, {1, 1}}}, -7);
  const auto pv = s.run(padded, {{x, xv}});
  REQUIRE(pv.shape() == shape{3, 5, 4});
  std::vector<std::int32_t> want;
  for_each_index(pv.shape(), [&](const std::vector<std::int64_t>& at) {
    const std::int64_t i = at[0] - 1, j = at[1], k = at[2] - 1;
    const bool inside = i >= 0 && i < 2 && j < 3 && k >= 0 && k < 2;
    want.push_back(inside ? static_cast<std::int32_t>(offset_in(shape{2, 3, 2}, {i, j, k})) : -7);
  });
  CHECK(flat_values(pv) == want);

  auto tiled = loom::tile(x, {2, 1, 3});
  const auto tv = s.run(tiled, {{x, xv}});
  REQUIRE(tv.shape() == shape{4, 3, 6});
  want.clear();
  for_each_index(tv.shape(), [&](const std::vector<std::int64_t>& at) {
    want.push_back(
        static_cast<std::int32_t>(offset_in(shape{2, 3, 2}, {at[0] % 2, at[1], at[2] % 2})));
  });
  CHECK(flat_values(tv) == want);

  auto e = loom::expand_dims(x, -1);
  CHECK(e.shape() == shape{2, 3, 2, 1});
  auto sq = loom::squeeze(e, 3);
  CHECK(sq.shape() == shape{2, 3, 2});
  CHECK(flat_values(s.run(sq, {{x, xv}})) == flat_values(xv));
  loom::placeholder<float, 2> unknown(g, shape{-1, -1}, "unknown");
  auto e2 = loom::expand_dims(unknown, 1);
  CHECK(e2.shape() == shape{-1, 1, -1});
  CHECK(s.run(e2, {{unknown, tensor<float, 2>(shape{3, 2}, 1.f)}}).shape() == shape{3, 1, 2});
}

TEST_CASE("one_hot: each axis, int32 and int64 ids, ids outside the depth") {
  graph g;
  loom::placeholder<std::int64_t, 1> labels(g, shape{-1}, "labels");
  loom::placeholder<std::int32_t, 2> ids(g, shape{2, 2}, "ids");
  loom::session s(g);
  auto rows = loom::one_hot(labels, 3);
  CHECK(rows.shape() == shape{-1, 3});
  const auto rv = s.run(rows, {{labels, tensor<std::int64_t, 1>(shape{3}, {2, -1, 0})}});
  CHECK(flat_values(rv) == std::vector<float>{0, 0, 1, 0, 0, 0, 1, 0, 0});
  auto first = loom::one_hot<double>(ids, 3, 5.0, -1.0, 0);
  CHECK(first.shape() == shape{3, 2, 2});
  const auto fv = s.run(first, {{ids, tensor<std::int32_t, 2>(shape{2, 2}, {0, 2, 7, 1})}});
  CHECK(flat_values(fv) == std::vector<double>{5, -1, -1, -1, -1, -1, -1, 5, -1, 5, -1, -1});
  auto middle = loom::one_hot<std::int32_t>(ids, 2, 1, 0, 1);
  CHECK(middle.shape() == shape{2, 2, 2});
  const auto mv = s.run(middle, {{ids, tensor<std::int32_t, 2>(shape{2, 2}, {0, 1, 1, 1})}});
  CHECK(flat_values(mv) == std::vector<std::int32_t>{1, 0, 0, 1, 0, 0, 1, 1});
}

TEST_CASE("bad perms, specs, paddings, multiples, axes and depths: one error each") {
  graph g;
  loom::placeholder<float, 2> m(g, shape{3, 4}, "m");
  loom::placeholder<float, 2> rows(g, shape{-1, 4}, "rows");
  loom::placeholder<std::int64_t, 1> labels(g, shape{-1}, "labels");
  auto build_error = [](auto&& f) { return message_of<loom::invalid_argument_error>(f); };
  CHECK(contains(build_error([&] {
                   loom::transpose(m, {0, 0});
                 }),
                 "perm [0, 0] is not a permutation of the dimensions of an input of shape [3, 4]"));
  CHECK(contains(build_error([&] {
                   loom::strided_slice(m, {0, 0}, {1, 1}, {1, 0});
                 }),
                 "stride 0 in entry 1"));
  CHECK(contains(
      build_error([&] {
        loom::strided_slice<1>(m, {5, 0}, {6, 0}, {1, 1}, {.end_mask = 2, .shrink_axis_mask = 1});
      }),
      "index 5 of entry 0 is outside dimension 0 of an input of shape [3, 4]"));
  CHECK(contains(build_error([&] {
                   loom::strided_slice(m, {0, 0, 0}, {1, 1, 1}, {1, 1, 1});
                 }),
                 "indexes 3 dimensions of an input of shape [3, 4]"));
  CHECK(contains(build_error([&] {
                   loom::strided_slice(m, {0}, {1, 1}, {1});
                 }),
                 "must have one length"));
  CHECK(contains(build_error([&] {
                   loom::strided_slice(m, {0, 0}, {1, 0}, {1, 1}, {.shrink_axis_mask = 1});
                 }),
                 "not float32 of rank 2"));
  CHECK(contains(build_error([&] { loom::squeeze(m, 0); }), "cannot squeeze dimension 0"));
  CHECK(contains(build_error([&] { loom::expand_dims(m, 3); }), "axis 3 is outside [-3, 2]"));
  CHECK(contains(build_error([&] { loom::tile(m, {1, -2}); }), "multiples [1, -2]"));
  CHECK(contains(build_error([&] {
                   loom::pad(m, {{{0, 1}, {-1, 0}}});
                 }),
                 "paddings [0, 1, -1, 0] must be 2 pairs of non-negative numbers"));
  CHECK(contains(build_error([&] { loom::one_hot(labels, 0); }),
                 "depth 0; one_hot needs a depth of 1 or more"));
  // Known only when the step runs: the shrunk row of a batch too short for it.
  auto row =
      loom::strided_slice<1>(rows, {7, 0}, {8, 0}, {1, 1}, {.end_mask = 2, .shrink_axis_mask = 1});
  loom::session s(g);
  CHECK(contains(message_of<loom::invalid_argument_error>([&] {
                   s.run(row, {{rows, tensor<float, 2>(shape{2, 4}, 0.f)}});
                 }),
                 "index 7 of entry 0 is outside dimension 0 of an input of shape [2, 4]"));
}

TEST_CASE("range: TF's lengths for numbers and for scalars known when the step runs") {
  graph g;
  loom::session s(g);
  auto three = loom::range(g, 3, 18, 3);
  CHECK(three.shape() == shape{5});
  CHECK(flat_values(s.run(three)) == std::vector<int>{3, 6, 9, 12, 15});
  CHECK(flat_values(s.run(loom::range(g, std::int64_t{4}))) ==
        std::vector<std::int64_t>{0, 1, 2, 3});
  auto down = loom::range(g, 3.0, 1.0, -0.5);
  CHECK(down.shape() == shape{4});
  CHECK(flat_values(s.run(down)) == std::vector<double>{3, 2.5, 2, 1.5});
  auto frac = loom::range(g, 0.f, 1.f, 0.3f); // ceil(1 / 0.3) = 4 elements
  CHECK(frac.shape() == shape{4});
  const auto fv = flat_values(s.run(frac));
  REQUIRE(fv.size() == 4);
  CHECK(fv[3] == doctest::Approx(0.9f));
  CHECK(loom::range(g, 5, 5).shape() == shape{0});
  loom::placeholder<std::int64_t, 0> start(g, shape{}, "start"), limit(g, shape{}, "limit"),
      delta(g, shape{}, "delta");
  auto fed = loom::range(start, limit, delta);
  CHECK(fed.shape() == shape{-1});
  const tensor<std::int64_t, 0> two = 2, seven = 7, zero = 0;
  CHECK(flat_values(s.run(fed, {{start, two}, {limit, seven}, {delta, two}})) ==
        std::vector<std::int64_t>{2, 4, 6});
  CHECK(flat_values(
            s.run(fed, {{start, seven}, {limit, two}, {delta, tensor<std::int64_t, 0>(-2)}})) ==
        std::vector<std::int64_t>{7, 5, 3});
  auto error = [](auto&& f) { return message_of<loom::invalid_argument_error>(f); };
  CHECK(contains(error([&] { loom::range(g, 1, 5, 0); }),
                 "range(start 1, limit 5, delta 0): delta must not be 0"));
  CHECK(contains(error([&] { loom::range(g, 5, 1, 1); }),
                 "start must not exceed limit when delta is positive"));
  CHECK(contains(error([&] { loom::range(g, 1.0, 5.0, -1.0); }),
                 "start must not be below limit when delta is negative"));
  CHECK(contains(error([&] {
                   s.run(fed, {{start, two}, {limit, seven}, {delta, zero}});
                 }),
                 "range(start 2, limit 7, delta 0): delta must not be 0"));
}

TEST_CASE("gather_nd: elements, rows and a batch of tuples; an index outside params") {
  graph g;
  loom::placeholder<float, 2> m(g, shape{3, 2}, "m");
  loom::placeholder<std::int32_t, 2> pairs(g, shape{-1, 2}, "pairs");
  loom::placeholder<std::int64_t, 2> rows(g, shape{-1, 1}, "rows");
  loom::placeholder<double, 3> cube(g, shape{2, 2, 2}, "cube");
  loom::placeholder<std::int64_t, 3> batch(g, shape{2, 1, 2}, "batch");
  loom::session s(g);
  const auto mv = iota_tensor<float, 2>(shape{3, 2}); // [[0, 1], [2, 3], [4, 5]]
  auto elements = loom::gather_nd<2>(m, pairs);
  CHECK(elements.shape() == shape{-1});
  CHECK(flat_values(
            s.run(elements,
                  {{m, mv}, {pairs, tensor<std::int32_t, 2>(shape{3, 2}, {0, 0, 2, 1, 1, 0})}})) ==
        std::vector<float>{0, 5, 2});
  auto picked = loom::gather_nd<1>(m, rows);
  CHECK(picked.shape() == shape{-1, 2});
  CHECK(
      flat_values(s.run(picked, {{m, mv}, {rows, tensor<std::int64_t, 2>(shape{2, 1}, {2, 0})}})) ==
      std::vector<float>{4, 5, 0, 1});
  auto slices = loom::gather_nd<2>(cube, batch);
  CHECK(slices.shape() == shape{2, 1, 2});
  CHECK(flat_values(
            s.run(slices, {{cube, iota_tensor<double, 3>(shape{2, 2, 2})},
                           {batch, tensor<std::int64_t, 3>(shape{2, 1, 2}, {0, 1, 1, 0})}})) ==
        std::vector<double>{2, 3, 4, 5});
  auto error = [](auto&& f) { return message_of<loom::invalid_argument_error>(f); };
  CHECK(contains(
      error([&] {
        s.run(elements, {{m, mv}, {pairs, tensor<std::int32_t, 2>(shape{2, 2}, {0, 0, 3, 1})}});
      }),
      "indices[1] = [3, 1] does not index into params of shape [3, 2] (index 3 of "
      "dimension 0 is outside [0, 3))"));
  CHECK(contains(error([&] { loom::gather_nd<1>(m, pairs); }), "hold tuples of length 2, not 1"));
  loom::placeholder<std::int32_t, 2> triples(g, shape{4, 3}, "triples");
  CHECK(contains(error([&] {
                   g.add_node("gather_nd", {m.id(), triples.id()});
                 }),
                 "index tuples of length 3 (indices [4, 3]) index more dimensions than params "
                 "of shape [3, 2] have"));
}

TEST_CASE("top_k: the k largest of each row, ties by the lower position, as TF") {
  graph g;
  loom::placeholder<float, 2> x(g, shape{-1, 5}, "x");
  loom::placeholder<std::int64_t, 1> v(g, shape{3}, "v");
  loom::session s(g);
  const tensor<float, 2> xv(shape{2, 5}, {1, 3, 3, 2, 0, 5, -1, 5, 5, 4});
  auto [values, indices] = loom::top_k(x, 3);
  CHECK(values.shape() == shape{-1, 3});
  CHECK(indices.shape() == shape{-1, 3});
  CHECK(flat_values(s.run(values, {{x, xv}})) == std::vector<float>{3, 3, 2, 5, 5, 5});
  CHECK(flat_values(s.run(indices, {{x, xv}})) == std::vector<std::int32_t>{1, 2, 3, 0, 2, 3});
  auto [all, order] = loom::top_k(x, 5);
  CHECK(flat_values(s.run(order, {{x, xv}})) ==
        std::vector<std::int32_t>{1, 2, 3, 0, 4, 0, 2, 3, 4, 1});
  auto [largest, at] = loom::top_k(v);
  const tensor<std::int64_t, 1> vv(shape{3}, {4, 9, 1});
  CHECK(flat_values(s.run(largest, {{v, vv}})) == std::vector<std::int64_t>{9});
  CHECK(flat_values(s.run(at, {{v, vv}})) == std::vector<std::int32_t>{1});
  auto [none, none_at] = loom::top_k(x, 0);
  CHECK(s.run(none, {{x, xv}}).shape() == shape{2, 0});
  auto error = [](auto&& f) { return message_of<loom::invalid_argument_error>(f); };
  CHECK(
      contains(error([&] { loom::top_k(x, 6); }),
               "the input of shape [?, 5] has 5 entries in its last dimension, fewer than k = 6"));
  loom::placeholder<float, 1> row(g, shape{-1}, "row");
  auto [top2, top2_at] = loom::top_k(row, 2);
  CHECK(contains(error([&] {
                   s.run(top2, {{row, tensor<float, 1>(shape{1}, {1.f})}});
                 }),
                 "has 1 entries in its last dimension, fewer than k = 2"));
}

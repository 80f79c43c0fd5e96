// stack, unstack and split (tf.stack, tf.unstack, tf.split), built from the strided ops
// (graph/ops/strided.hpp) and concat as TF's Python builds them from its ops: they add no
// op, kernel or gradient of their own.
#pragma once

#include <loom/graph/ops/array.hpp>
#include <loom/graph/ops/strided.hpp>
#include <loom/graph/output.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

// The tensors stacked along a new dimension at axis (tf.stack): each one's dimension
// expanded there, then joined.
template <class T, int R>
output<T, R + 1> stack(const std::vector<output<T, R>>& values, std::int64_t axis = 0) {
  if (values.empty())
    throw invalid_argument_error("loom::stack: no tensors to stack");
  std::vector<output<T, R + 1>> expanded;
  for (const auto& v : values)
    expanded.push_back(expand_dims(v, axis));
  return concat(expanded, static_cast<int>(axis < 0 ? axis + R + 1 : axis));
}

// x split into `sizes` along axis (tf.split with sizes); one size may be -1, the rest.
template <expression E>
std::vector<output<value_type_of<E>, rank_of<E>>> split(const E& x, std::vector<std::int64_t> sizes,
                                                        std::int64_t axis = 0) {
  constexpr int R = rank_of<E>;
  static_assert(R >= 1, "loom::split: a scalar has no axis to split");
  auto lx = lower(x);
  const loom::shape& s = lx.shape();
  if (axis < -R || axis >= R)
    throw invalid_argument_error("loom::split: axis " + std::to_string(axis) + " of " +
                                 lx.node().describe() + " of shape " + s.to_string());
  const int a = static_cast<int>(axis < 0 ? axis + R : axis);
  const std::int64_t dim = s[a];
  std::int64_t known = 0, rest = -1;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == -1 && rest < 0)
      rest = static_cast<std::int64_t>(i);
    else if (sizes[i] < 0)
      throw invalid_argument_error("loom::split: sizes " + detail::dims_to_string(sizes) +
                                   " (one may be -1, the rest; the others must be >= 0)");
    else
      known += sizes[i];
  }
  if (dim < 0)
    throw invalid_argument_error("loom::split: dimension " + std::to_string(a) + " of " +
                                 lx.node().describe() + " (shape " + s.to_string() +
                                 ") must be known when the graph is built");
  if (rest >= 0 && known <= dim) {
    sizes[static_cast<std::size_t>(rest)] = dim - known;
    known = dim;
  }
  if (known != dim)
    throw invalid_argument_error("loom::split: sizes " + detail::dims_to_string(sizes) +
                                 " add up to " + std::to_string(known) + ", not dimension " +
                                 std::to_string(a) + " of " + lx.node().describe() + " of shape " +
                                 s.to_string());
  std::vector<output<value_type_of<E>, R>> parts;
  std::int64_t at = 0;
  for (std::int64_t size : sizes) {
    std::vector<std::int64_t> begin(R, 0), end(R, 0), strides(R, 1);
    begin[static_cast<std::size_t>(a)] = at;
    end[static_cast<std::size_t>(a)] = at + size;
    const std::int64_t whole = ((std::int64_t{1} << R) - 1) & ~(std::int64_t{1} << a);
    parts.push_back(
        strided_slice(lx, begin, end, strides, {.begin_mask = whole, .end_mask = whole}));
    at += size;
  }
  return parts;
}
// x split into num_splits equal parts along axis (tf.split with a count).
template <expression E>
std::vector<output<value_type_of<E>, rank_of<E>>> split(const E& x, int num_splits,
                                                        std::int64_t axis = 0) {
  constexpr int R = rank_of<E>;
  auto lx = lower(x);
  const int a = static_cast<int>(axis < 0 ? axis + R : axis);
  const std::int64_t dim = a >= 0 && a < R ? lx.shape()[a] : -1;
  if (num_splits <= 0 || (dim >= 0 && dim % num_splits != 0))
    throw invalid_argument_error("loom::split: " + std::to_string(num_splits) +
                                 " equal parts of dimension " + std::to_string(a) + " of " +
                                 lx.node().describe() + " of shape " + lx.shape().to_string());
  return split(lx,
               std::vector<std::int64_t>(static_cast<std::size_t>(num_splits),
                                         dim < 0 ? -1 : dim / num_splits),
               axis);
}

// x's slices along axis, each without that dimension (tf.unstack); the dimension must be
// known when the graph is built.
template <expression E>
std::vector<output<value_type_of<E>, rank_of<E> - 1>> unstack(const E& x, std::int64_t axis = 0) {
  constexpr int R = rank_of<E>;
  static_assert(R >= 1, "loom::unstack: a scalar has no axis");
  auto lx = lower(x);
  const int a = static_cast<int>(axis < 0 ? axis + R : axis);
  const std::int64_t dim = a >= 0 && a < R ? lx.shape()[a] : -1;
  if (dim < 0)
    throw invalid_argument_error("loom::unstack: axis " + std::to_string(axis) + " of " +
                                 lx.node().describe() + " of shape " + lx.shape().to_string() +
                                 " must be a dimension known when the graph is built");
  std::vector<output<value_type_of<E>, R - 1>> parts;
  for (std::int64_t k = 0; k < dim; ++k) {
    std::vector<std::int64_t> begin(R, 0), end(R, 0), strides(R, 1);
    begin[static_cast<std::size_t>(a)] = k;
    end[static_cast<std::size_t>(a)] = k + 1;
    const std::int64_t others = ((std::int64_t{1} << R) - 1) & ~(std::int64_t{1} << a);
    parts.push_back(strided_slice<R - 1>(
        lx, begin, end, strides,
        {.begin_mask = others, .end_mask = others, .shrink_axis_mask = std::int64_t{1} << a}));
  }
  return parts;
}

} // namespace loom

// Op definitions of top_k (TF's TopKV2), as three single-output ops: top_k_indices (int32: the
// positions of the k largest entries of each last-axis row, largest first, ties by the lower
// position first), top_k_values (the input at those positions) and top_k_grad (dy put back at
// those positions in zeros of the input's shape: the values' gradient). Kernels in
// kernels/cpu/top_k.hpp and kernels/cuda/top_k.cuh.
#pragma once

#include <loom/graph/builder.hpp>
#include <loom/graph/lower.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/ops/math.hpp>
#include <loom/graph/output.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace loom::detail {

// The input's shape with its last dimension k: the shape of top_k's outputs. The input needs
// rank 1 or more and at least k entries in a row (checked where the row's length is known).
inline loom::shape top_k_shape(const node_def& n, const loom::shape& x, std::int64_t k) {
  if (x.rank() < 1)
    throw invalid_argument_error("node " + n.describe() + ": the input of shape " + x.to_string() +
                                 " must have rank 1 or more (top_k works along "
                                 "the last dimension)");
  if (k < 0)
    throw invalid_argument_error("node " + n.describe() + ": k " + std::to_string(k) +
                                 " must not be negative");
  const std::int64_t cols = x[x.rank() - 1];
  if (cols >= 0 && cols < k)
    throw invalid_argument_error(
        "node " + n.describe() + ": the input of shape " + x.to_string() + " has " +
        std::to_string(cols) +
        " entries in its last dimension, fewer than k = " + std::to_string(k));
  std::vector<std::int64_t> d = x.dims();
  d.back() = k;
  return loom::shape(std::move(d));
}

// top_k_values and top_k_grad: indices of the shape top_k gives for x, int32.
inline void check_top_k_indices(const node_def& n, const loom::shape& x, const node_def& indices) {
  if (indices.type != dtype::i32)
    throw invalid_argument_error("node " + n.describe() + ": the indices " + indices.describe() +
                                 " must be int32 (top_k_indices'), not " +
                                 std::string(to_string(indices.type)));
  const loom::shape& s = indices.shape;
  bool fits = s.rank() == x.rank() && s.rank() >= 1;
  for (int a = 0; fits && a + 1 < s.rank(); ++a)
    fits = s[a] < 0 || x[a] < 0 || s[a] == x[a];
  if (!fits)
    throw invalid_argument_error("node " + n.describe() + ": indices of shape " + s.to_string() +
                                 " do not select along the last axis of an input of shape " +
                                 x.to_string());
}

#ifndef LOOM_COMPILED_KERNELS
inline bool register_top_k_ops() {
  auto& r = op_registry::instance();
  // Input x [..., n]; attrs "k", "sorted" (kept for TF's signature: the result is always
  // sorted, which TF's sorted=False allows). Not differentiable: its output is positions.
  r.add({.name = "top_k_indices",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               const dtype t = in[0]->type;
               if (t == dtype::boolean || t == dtype::string)
                 throw invalid_argument_error("node " + n.describe() + ": cannot rank " +
                                              in[0]->describe() + " of dtype " +
                                              std::string(to_string(t)));
               n.type = dtype::i32;
               n.shape = top_k_shape(n, in[0]->shape, n.attr<std::int64_t>("k"));
             },
         .gradient = [](graph&, const node_def&, node_id) { return std::vector{no_node}; }});
  // Inputs (x [..., n], indices [..., k]): out[..., j] = x[..., indices[..., j]].
  r.add(
      {.name = "top_k_values",
       .num_inputs = 2,
       .infer =
           [](node_def& n, const std::vector<const node_def*>& in) {
             check_top_k_indices(n, in[0]->shape, *in[1]);
             n.type = in[0]->type;
             n.shape = in[1]->shape;
           },
       .gradient =
           [](graph& g, const node_def& n, node_id dy) {
             return std::vector{g.add_node("top_k_grad", {dy, n.inputs[1], n.inputs[0]}), no_node};
           }});
  // Inputs (dy [..., k], indices [..., k], x [..., n]): zeros of x's shape with dy at the
  // positions (distinct within a row). Linear in dy: its gradient is top_k_values of ddx.
  r.add({.name = "top_k_grad",
         .num_inputs = 3,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               check_top_k_indices(n, in[2]->shape, *in[1]);
               if (!in[0]->shape.compatible_with(in[1]->shape))
                 throw invalid_argument_error(
                     "node " + n.describe() + ": dy of shape " + in[0]->shape.to_string() +
                     " does not match the indices of shape " + in[1]->shape.to_string());
               check_floating(n, in[0]->type);
               n.type = in[0]->type;
               n.shape = in[2]->shape;
             },
         .gradient =
             [](graph& g, const node_def& n, node_id ddx) {
               return std::vector{g.add_node("top_k_values", {ddx, n.inputs[1]}), no_node, no_node};
             }});
  return true;
}

inline const bool top_k_ops_registered = register_top_k_ops();
#endif

} // namespace loom::detail

namespace loom {

// The k largest entries of each row along the last axis and their positions (tf.nn.top_k):
// values [..., k] of x's dtype, largest first, and int32 indices [..., k]; equal entries keep
// the lower position first, as TF's. `sorted` is TF's flag; loom always returns the rows
// sorted (which TF's sorted=False permits). The values' gradient goes back to the positions.
template <expression X>
std::pair<output<value_type_of<X>, rank_of<X>>, output<std::int32_t, rank_of<X>>>
top_k(const X& x, std::int64_t k = 1, bool sorted = true) {
  static_assert(rank_of<X> >= 1,
                "loom::top_k: the input must have rank 1 or more (top_k works along the last "
                "dimension)");
  static_assert(numeric_type<value_type_of<X>>,
                "loom::top_k: the input must be numeric (float, double, int32 or int64)");
  auto lx = lower(x);
  graph g = lx.graph();
  const node_id indices = g.add_node("top_k_indices", {lx.id()}, {{"k", k}, {"sorted", sorted}});
  return {{g, g.add_node("top_k_values", {lx.id(), indices})}, {g, indices}};
}

} // namespace loom

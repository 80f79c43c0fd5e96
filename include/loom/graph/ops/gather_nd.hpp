// Op definitions of gather_nd (TF's GatherNd) and its gradient, gather_nd_grad (TF's
// ScatterNd of dy into zeros of params' shape, dense). Kernels in kernels/cpu/gather_nd.hpp
// and kernels/cuda/gather_nd.cuh, over the host checks of kernels/checks/gather_nd.hpp.
#pragma once

#include <loom/graph/builder.hpp>
#include <loom/graph/lower.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/ops/array.hpp>
#include <loom/graph/output.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace loom::detail {

// indices.shape[:-1] + params.shape[depth:]: gather_nd's shape, where depth is the length of
// an index tuple (indices' last dimension), at most params' rank.
inline loom::shape gather_nd_shape(const node_def& n, const loom::shape& params,
                                   const loom::shape& indices) {
  if (indices.rank() < 1)
    throw invalid_argument_error("node " + n.describe() + ": indices of shape " +
                                 indices.to_string() +
                                 " must have rank 1 or more (the last dimension indexes params)");
  const std::int64_t depth = indices[indices.rank() - 1];
  if (depth < 0)
    throw invalid_argument_error("node " + n.describe() + ": the last dimension of indices " +
                                 indices.to_string() +
                                 " (the length of an index tuple) must be known");
  if (depth > params.rank())
    throw invalid_argument_error("node " + n.describe() + ": index tuples of length " +
                                 std::to_string(depth) + " (indices " + indices.to_string() +
                                 ") index more dimensions than params of shape " +
                                 params.to_string() + " have");
  std::vector<std::int64_t> d(indices.dims().begin(), indices.dims().end() - 1);
  d.insert(d.end(), params.dims().begin() + depth, params.dims().end());
  return loom::shape(std::move(d));
}

#ifndef LOOM_COMPILED_KERNELS
inline bool register_gather_nd_ops() {
  auto& r = op_registry::instance();
  // Inputs (params, indices [..., depth]): out[i...] = params[indices[i..., :]]. An index
  // outside params is an error naming it and its position (TF's CPU kernel). Its gradient
  // w.r.t. params: dy scattered into zeros of params' shape, repeated indices summed.
  r.add({.name = "gather_nd",
         .num_inputs = 2,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               check_ids(n, *in[1], "indices");
               n.type = in[0]->type;
               n.shape = gather_nd_shape(n, in[0]->shape, in[1]->shape);
             },
         .gradient =
             [](graph& g, const node_def& n, node_id dy) {
               const node_id params = n.inputs[0], indices = n.inputs[1];
               const loom::shape& s = g.node(params).shape;
               node_id dx;
               if (s.fully_defined())
                 dx = g.add_node("gather_nd_grad", {dy, indices}, {{"shape", s.dims()}});
               else
                 dx = g.add_node("gather_nd_grad", {dy, indices, params});
               return std::vector{dx, no_node};
             }});
  // Inputs (dy, indices) and attr "shape", or (dy, indices, like): zeros of the shape (of
  // like's shape when the step runs) with dy's slices added at the index tuples. Linear in
  // dy: its own gradient is gather_nd of ddx.
  r.add({.name = "gather_nd_grad",
         .num_inputs = -1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               if (in.size() != 2 && in.size() != 3)
                 throw invalid_argument_error("node " + n.describe() +
                                              ": takes dy, indices and optionally a tensor of "
                                              "the output's shape");
               check_ids(n, *in[1], "indices");
               n.type = in[0]->type;
               n.shape = in.size() == 3 ? in[2]->shape
                                        : loom::shape(n.attr<std::vector<std::int64_t>>("shape"));
               const loom::shape want = gather_nd_shape(n, n.shape, in[1]->shape);
               if (!in[0]->shape.compatible_with(want))
                 throw invalid_argument_error("node " + n.describe() + ": dy of shape " +
                                              in[0]->shape.to_string() +
                                              " is not gather_nd's output " + want.to_string());
             },
         .gradient =
             [](graph& g, const node_def& n, node_id ddx) {
               std::vector<node_id> out(n.inputs.size(), no_node);
               out[0] = g.add_node("gather_nd", {ddx, n.inputs[1]});
               return out;
             }});
  return true;
}

inline const bool gather_nd_ops_registered = register_gather_nd_ops();
#endif

} // namespace loom::detail

namespace loom {

// Slices of params at index tuples (tf.gather_nd): indices [..., Depth] (int32 or int64), each
// row a tuple of Depth indices into params' first Depth dimensions; the result is
// indices.shape[:-1] + params.shape[Depth:]. Depth, the length of a tuple, is a template
// argument because it sets the result's rank: gather_nd<2>(m, pairs) takes elements of a
// matrix, gather_nd<1>(m, rows) its rows.
template <int Depth, expression P, expression I>
output<value_type_of<P>,
       (rank_of<I> >= 1 && Depth <= rank_of<P> ? rank_of<I> - 1 + rank_of<P> - Depth : 0)>
gather_nd(const P& params, const I& indices) {
  static_assert(std::is_same_v<value_type_of<I>, std::int32_t> ||
                    std::is_same_v<value_type_of<I>, std::int64_t>,
                "loom::gather_nd: the indices must be int32 or int64");
  static_assert(rank_of<I> >= 1,
                "loom::gather_nd: the indices must have rank 1 or more (index tuples along the "
                "last dimension)");
  static_assert(Depth >= 0 && Depth <= rank_of<P>,
                "loom::gather_nd: an index tuple (Depth) indexes at most params' rank dimensions");
  auto lp = lower(params);
  auto li = lower(indices);
  graph g = detail::common_graph("gather_nd", lp, li);
  const loom::shape& is = g.node(li.id()).shape;
  if (is[is.rank() - 1] >= 0 && is[is.rank() - 1] != Depth)
    throw invalid_argument_error("loom::gather_nd<" + std::to_string(Depth) +
                                 ">: indices of shape " + is.to_string() +
                                 " hold tuples of length " + std::to_string(is[is.rank() - 1]) +
                                 ", not " + std::to_string(Depth));
  return {g, g.add_node("gather_nd", {lp.id(), li.id()})};
}

} // namespace loom

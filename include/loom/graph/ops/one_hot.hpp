// Op definition of one_hot (TF's OneHot): ids as rows of on and off values, the
// classes of a label tensor as a model's targets. Kernels in kernels/cpu/one_hot.hpp and
// kernels/cuda/one_hot.cuh.
#pragma once

#include <loom/graph/builder.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/ops/array.hpp>
#include <loom/graph/output.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace loom::detail {

// one_hot's attributes: the depth (> 0) and the axis of the new dimension, in
// [-1, rank of the ids] (-1: last).
struct one_hot_attrs {
  std::int64_t depth;
  std::int64_t axis;
  explicit one_hot_attrs(const node_def& n)
      : depth(n.attr<std::int64_t>("depth")), axis(n.attr_or<std::int64_t>("axis", -1)) {}
};

// The output's shape: the ids' with the depth inserted at the axis.
inline loom::shape one_hot_shape(const node_def& n, const one_hot_attrs& a,
                                 const loom::shape& ids) {
  if (a.depth <= 0)
    throw invalid_argument_error("node " + n.describe() + ": depth " + std::to_string(a.depth) +
                                 "; one_hot needs a depth of 1 or more");
  if (a.axis < -1 || a.axis > ids.rank())
    throw invalid_argument_error("node " + n.describe() + ": axis " + std::to_string(a.axis) +
                                 " is outside [-1, " + std::to_string(ids.rank()) +
                                 "] for ids of shape " + ids.to_string());
  std::vector<std::int64_t> d = ids.dims();
  d.insert(a.axis < 0 ? d.end() : d.begin() + a.axis, a.depth);
  return loom::shape(std::move(d));
}

#ifndef LOOM_COMPILED_KERNELS
inline bool register_one_hot_op() {
  // Inputs (ids, on_value, off_value), attrs "depth", "axis": out[..., j, ...] is on_value
  // where the id is j, else off_value; an id outside [0, depth) gives a row of off_value
  // (TF's). Its kernel is chosen by the output's dtype. Not differentiable (TF's neither).
  op_registry::instance().add({.name = "one_hot",
                               .num_inputs = 3,
                               .infer =
                                   [](node_def& n, const std::vector<const node_def*>& in) {
                                     check_ids(n, *in[0], "ids");
                                     for (const node_def* v : {in[1], in[2]})
                                       if (v->shape.rank() != 0 || v->type != in[1]->type)
                                         throw invalid_argument_error(
                                             "node " + n.describe() +
                                             ": on_value and "
                                             "off_value must be scalars of one dtype; got " +
                                             in[1]->describe() + " and " + in[2]->describe());
                                     n.type = in[1]->type;
                                     n.shape = one_hot_shape(n, one_hot_attrs(n), in[0]->shape);
                                   },
                               .gradient =
                                   [](graph&, const node_def&, node_id) {
                                     return std::vector<node_id>{no_node, no_node, no_node};
                                   },
                               .type_input = -1});
  return true;
}

inline const bool one_hot_op_registered = register_one_hot_op();
#endif

} // namespace loom::detail

namespace loom {

// The ids as one-hot rows of dtype T (tf.one_hot): rank R + 1, the new dimension of
// `depth` at axis (-1: last); on_value where the class is the id, off_value elsewhere.
template <element_type T = float, expression I>
output<T, rank_of<I> + 1> one_hot(const I& ids, std::int64_t depth, T on_value = T(1),
                                  T off_value = T(0), std::int64_t axis = -1) {
  static_assert(std::is_same_v<value_type_of<I>, std::int32_t> ||
                    std::is_same_v<value_type_of<I>, std::int64_t>,
                "loom::one_hot: the ids must be int32 or int64");
  static_assert(numeric_type<T> || std::is_same_v<T, bool>,
                "loom::one_hot: the values must be numbers or bool");
  auto li = lower(ids);
  graph g = li.graph();
  return {g, g.add_node("one_hot",
                        {li.id(), loom::detail::scalar_node(g, on_value),
                         loom::detail::scalar_node(g, off_value)},
                        {{"depth", depth}, {"axis", axis}})};
}

} // namespace loom

// Op definitions of the scatter updates (TF's tf.scatter_add, scatter_sub,
// scatter_update): rows of a variable changed at indices, on the variable's
// task, in place. Kernels are in kernels/cpu/scatter.hpp.
#pragma once

#include <loom/graph/op_registry.hpp>
#include <loom/graph/ops/array.hpp>
#include <loom/graph/variables.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace loom::detail {

// Inputs (var, indices, updates): updates has the indices' shape followed by
// a row of the variable.
inline void infer_scatter(node_def& n, const std::vector<const node_def*>& in) {
  const node_def& var = *in[0];
  if (var.op != "variable")
    throw invalid_argument_error("node " + n.describe() + ": the first input " + var.describe() +
                                 " is not a variable");
  check_ids(n, *in[1], "indices");
  if (var.shape.rank() < 1)
    throw invalid_argument_error("node " + n.describe() + ": variable '" + var.name +
                                 "' is a scalar; a scatter changes rows");
  if (in[2]->type != var.type)
    throw invalid_argument_error("node " + n.describe() + ": updates " + in[2]->describe() +
                                 " are " + std::string(to_string(in[2]->type)) +
                                 ", but variable '" + var.name + "' is " +
                                 std::string(to_string(var.type)));
  const loom::shape want = gathered_shape(var.shape, in[1]->shape, 0);
  if (!in[2]->shape.compatible_with(want))
    throw invalid_argument_error(
        "node " + n.describe() + ": updates of shape " + in[2]->shape.to_string() +
        " do not fit indices of shape " + in[1]->shape.to_string() + " into variable '" + var.name +
        "' of shape " + var.shape.to_string() + " (expected " + want.to_string() + ")");
  n.type = var.type;
  n.shape = var.shape;
  n.colocation_group = var.colocation();
  n.attrs["_ref_name_0"] = var.name;
}

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_scatter_ops() {
  auto& r = op_registry::instance();
  for (const char* name : {"scatter_add", "scatter_sub", "scatter_update"})
    r.add({.name = name,
           .num_inputs = 3,
           .infer = infer_scatter,
           .stateful = true,
           .ref_inputs = 1u,
           .type_input = 2});
  return true;
}

inline const bool scatter_ops_registered = register_scatter_ops();
#endif

} // namespace loom::detail

namespace loom {

namespace detail {

template <element_type T, int R, expression I, expression U>
output<T, R> scatter(const char* op, const variable<T, R>& var, const I& indices,
                     const U& updates) {
  static_assert(R >= 1, "loom::scatter_*: the variable must have rows (rank 1 or more)");
  static_assert(id_type<value_type_of<I>>, "loom::scatter_*: the indices must be int32 or int64");
  static_assert(std::is_same_v<value_type_of<U>, T>,
                "loom::scatter_*: the updates must have the variable's dtype");
  static_assert(rank_of<U> == rank_of<I> + R - 1,
                "loom::scatter_*: the updates need the indices' shape followed by a row of the "
                "variable");
  auto li = lower(indices);
  auto lu = lower(updates);
  graph g = common_graph(op, var, li, lu);
  return {g, g.add_node(op, {var.id(), li.id(), lu.id()})};
}

} // namespace detail

// var[indices[i], ...] += updates[i, ...] (tf.scatter_add); repeated indices
// add up. It runs on the variable's task, under its lock, in place (as TF's
// does: copying a table to change a few rows would cost the table), and
// returns the variable's new value. An index outside its rows fails the step
// naming the variable, and nothing is written.
template <element_type T, int R, expression I, expression U>
output<T, R> scatter_add(const variable<T, R>& var, const I& indices, const U& updates) {
  return detail::scatter("scatter_add", var, indices, updates);
}
// var[indices[i], ...] -= updates[i, ...] (tf.scatter_sub).
template <element_type T, int R, expression I, expression U>
output<T, R> scatter_sub(const variable<T, R>& var, const I& indices, const U& updates) {
  return detail::scatter("scatter_sub", var, indices, updates);
}
// var[indices[i], ...] = updates[i, ...] (tf.scatter_update); of repeated
// indices, the last wins.
template <element_type T, int R, expression I, expression U>
output<T, R> scatter_update(const variable<T, R>& var, const I& indices, const U& updates) {
  return detail::scatter("scatter_update", var, indices, updates);
}

} // namespace loom

// Op definition of range (TF's Range): start, start + delta, ... up to limit (excluded). Its
// length is known when the graph is built where the three inputs are constants, else only
// when the step runs (shape [-1]). Kernels in kernels/cpu/range.hpp and
// kernels/cuda/range.cuh.
#pragma once

#include <loom/graph/builder.hpp>
#include <loom/graph/lower.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/output.hpp>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace loom::detail {

template <class T> std::string number_text(T v) {
  std::ostringstream s;
  s << +v;
  return s.str();
}

// The number of elements of range(start, limit, delta), TF's arithmetic: ceil((limit - start) /
// delta), with TF's refusals (a zero delta, a delta that moves away from the limit) as one
// error naming the node and the three values.
template <class T> std::int64_t range_length(const node_def& n, T start, T limit, T delta) {
  auto refuse = [&](const std::string& why) {
    return invalid_argument_error("node " + n.describe() + ": range(start " + number_text(start) +
                                  ", limit " + number_text(limit) + ", delta " +
                                  number_text(delta) + "): " + why);
  };
  if (delta == T(0))
    throw refuse("delta must not be 0");
  if (delta > T(0) && start > limit)
    throw refuse("start must not exceed limit when delta is positive");
  if (delta < T(0) && start < limit)
    throw refuse("start must not be below limit when delta is negative");
  if constexpr (std::is_integral_v<T>) {
    const auto span = static_cast<std::int64_t>(limit) - static_cast<std::int64_t>(start);
    const auto step = static_cast<std::int64_t>(delta);
    return (std::abs(span) + std::abs(step) - 1) / std::abs(step);
  } else {
    const double size = std::ceil(std::abs((static_cast<double>(limit) - start) / delta));
    if (!(size < 9.2e18))
      throw refuse("the length is not finite or exceeds int64");
    return static_cast<std::int64_t>(size);
  }
}

// range's inputs: three scalars of one numeric dtype.
inline void check_range_inputs(const node_def& n, const std::vector<const node_def*>& in) {
  const dtype t = in[0]->type;
  if (t != dtype::f32 && t != dtype::f64 && t != dtype::i32 && t != dtype::i64)
    throw invalid_argument_error("node " + n.describe() + ": start " + in[0]->describe() + " is " +
                                 std::string(to_string(t)) +
                                 "; range needs float32, float64, int32 or int64");
  const char* roles[] = {"start", "limit", "delta"};
  for (std::size_t i = 0; i < 3; ++i) {
    if (in[i]->type != t)
      throw invalid_argument_error("node " + n.describe() + ": " + roles[i] + " " +
                                   in[i]->describe() + " is " +
                                   std::string(to_string(in[i]->type)) + " but start is " +
                                   std::string(to_string(t)) + "; range needs one dtype");
    if (in[i]->shape.rank() != 0)
      throw invalid_argument_error("node " + n.describe() + ": " + roles[i] + " " +
                                   in[i]->describe() + " must be a scalar, got shape " +
                                   in[i]->shape.to_string());
  }
}

#ifndef LOOM_COMPILED_KERNELS
inline bool register_range_op() {
  // Inputs (start, limit, delta), scalars of one dtype. Not differentiable (TF's neither).
  op_registry::instance().add(
      {.name = "range",
       .num_inputs = 3,
       .infer =
           [](node_def& n, const std::vector<const node_def*>& in) {
             check_range_inputs(n, in);
             n.type = in[0]->type;
             n.shape = loom::shape{-1};
             if (in[0]->op != "constant" || in[1]->op != "constant" || in[2]->op != "constant")
               return;
             visit_dtype(n.type, [&]<class T>() {
               if constexpr (numeric_type<T>) {
                 auto v = [&](std::size_t i) {
                   return *in[i]->attr<any_tensor>("value").data<T>();
                 };
                 n.shape = loom::shape{range_length<T>(n, v(0), v(1), v(2))};
               }
             });
           },
       .gradient =
           [](graph&, const node_def&, node_id) {
             return std::vector<node_id>{no_node, no_node, no_node};
           }});
  return true;
}

inline const bool range_op_registered = register_range_op();
#endif

} // namespace loom::detail

namespace loom {

// start, start + delta, ... while below limit (above it for a negative delta), as tf.range: a
// vector whose length the graph knows. A zero delta, or one that moves away from limit, is an
// error naming the three values.
template <element_type T> output<T, 1> range(graph& g, T start, T limit, T delta) {
  static_assert(numeric_type<T>, "loom::range: start, limit and delta must be numbers");
  return {g, g.add_node("range",
                        {loom::detail::scalar_node(g, start), loom::detail::scalar_node(g, limit),
                         loom::detail::scalar_node(g, delta)})};
}
template <element_type T> output<T, 1> range(graph& g, T start, T limit) {
  return range(g, start, limit, T(1));
}
// tf.range(limit): 0, 1, ..., limit - 1.
template <element_type T> output<T, 1> range(graph& g, T limit) {
  return range(g, T(0), limit, T(1));
}

// range of three scalar expressions (a batch's size, say): its length is known when the step
// runs, shape [-1].
template <expression S, expression L, expression D>
output<value_type_of<S>, 1> range(const S& start, const L& limit, const D& delta) {
  static_assert(rank_of<S> == 0 && rank_of<L> == 0 && rank_of<D> == 0,
                "loom::range: start, limit and delta must be scalars (rank 0)");
  static_assert(std::is_same_v<value_type_of<S>, value_type_of<L>> &&
                    std::is_same_v<value_type_of<S>, value_type_of<D>>,
                "loom::range: start, limit and delta must have one dtype");
  static_assert(numeric_type<value_type_of<S>>,
                "loom::range: start, limit and delta must be numbers (not bool or string)");
  auto ls = lower(start);
  auto ll = lower(limit);
  auto ld = lower(delta);
  graph g = ls.graph();
  if (!(ll.graph() == g) || !(ld.graph() == g))
    throw invalid_argument_error("loom::range: the operands belong to different graphs");
  return {g, g.add_node("range", {ls.id(), ll.id(), ld.id()})};
}

} // namespace loom

// Untyped node construction, for code that builds graphs at run time (gradient
// functions, optimizers, the generic server): ops by id with node ids.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/lower.hpp>

#include <string>
#include <vector>

namespace loom::detail::build {

inline node_id op(graph& g, const std::string& op_id, std::vector<node_id> inputs,
                  attr_map attrs = {}) {
  return g.add_node(op_id, std::move(inputs), std::move(attrs));
}

// A scalar constant of dtype t with value v.
LOOM_COMPILED_ONCE node_id scalar(graph& g, dtype t, double v);

inline node_id add(graph& g, node_id a, node_id b) {
  return op(g, "add", {a, b});
}
inline node_id sub(graph& g, node_id a, node_id b) {
  return op(g, "sub", {a, b});
}
inline node_id mul(graph& g, node_id a, node_id b) {
  return op(g, "mul", {a, b});
}
inline node_id div(graph& g, node_id a, node_id b) {
  return op(g, "div", {a, b});
}
inline node_id neg(graph& g, node_id a) {
  return op(g, "neg", {a});
}
inline node_id zeros_like(graph& g, node_id a) {
  return op(g, "zeros_like", {a});
}
inline node_id ones_like(graph& g, node_id a) {
  return op(g, "ones_like", {a});
}
inline node_id select(graph& g, node_id c, node_id a, node_id b) {
  return op(g, "select", {c, a, b});
}
// dy reduced to x's shape: the adjoint of broadcasting x. Free when the shapes
// are statically equal.
LOOM_COMPILED_ONCE node_id sum_to(graph& g, node_id dy, node_id x);

} // namespace loom::detail::build

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail::build {

LOOM_COMPILED_ONCE node_id scalar(graph& g, dtype t, double v) {
  return visit_dtype(t, [&]<class T>() -> node_id {
    if constexpr (std::is_same_v<T, std::string>)
      throw invalid_argument_error("a numeric scalar of dtype string");
    else
      return loom::detail::scalar_node(g, static_cast<T>(v));
  });
}

LOOM_COMPILED_ONCE node_id sum_to(graph& g, node_id dy, node_id x) {
  const auto& sy = g.node(dy).shape;
  const auto& sx = g.node(x).shape;
  if (sy == sx && sx.fully_defined())
    return dy;
  return op(g, "sum_to_shape", {dy, x});
}

} // namespace loom::detail::build

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

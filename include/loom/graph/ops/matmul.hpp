// matmul (tf.matmul on matrices, with TF's transpose flags and _MatMulGrad) and
// xw_plus_b (tf.nn.xw_plus_b, one kernel): op definitions and the typed functions users
// call. Kernels are in kernels/cpu/math.hpp, their checks in kernels/checks/math.hpp;
// batch_matmul (rank 3 and more) is graph/ops/batch_matmul.hpp's.
#pragma once

#include <loom/graph/lower.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/ops/math.hpp>
#include <loom/graph/output.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace loom::detail {

inline std::string transposes_note(bool ta, bool tb) {
  if (!ta && !tb)
    return {};
  return std::string(" (") + (ta ? "transpose_a" : "") + (ta && tb ? ", " : "") +
         (tb ? "transpose_b" : "") + ")";
}

// The matmul message, shared with the kernel's run-time check.
inline std::string inner_dims_message(const node_def& n, const loom::shape& a, const loom::shape& b,
                                      bool ta, bool tb) {
  return "node " + n.describe() + ": inner dimensions differ: " + a.to_string() + " x " +
         b.to_string() + transposes_note(ta, tb);
}

inline void infer_matmul(node_def& n, const std::vector<const node_def*>& in) {
  const node_def& a = *in[0];
  const node_def& b = *in[1];
  check_rank(n, a, 2, "operand a");
  check_rank(n, b, 2, "operand b");
  check_same_type(n, a, b);
  check_floating(n, a.type);
  const bool ta = n.attr_or<bool>("transpose_a", false);
  const bool tb = n.attr_or<bool>("transpose_b", false);
  const std::int64_t ka = a.shape[ta ? 0 : 1], kb = b.shape[tb ? 1 : 0];
  if (ka >= 0 && kb >= 0 && ka != kb)
    throw invalid_argument_error(inner_dims_message(n, a.shape, b.shape, ta, tb));
  n.type = a.type;
  n.shape = loom::shape{a.shape[ta ? 1 : 0], b.shape[tb ? 0 : 1]};
}

inline void infer_xw_plus_b(node_def& n, const std::vector<const node_def*>& in) {
  const node_def& x = *in[0];
  const node_def& w = *in[1];
  const node_def& b = *in[2];
  check_rank(n, x, 2, "x");
  check_rank(n, w, 2, "weights");
  check_rank(n, b, 1, "bias");
  check_same_type(n, x, w);
  check_same_type(n, x, b);
  check_floating(n, x.type);
  if (x.shape[1] >= 0 && w.shape[0] >= 0 && x.shape[1] != w.shape[0])
    throw invalid_argument_error(inner_dims_message(n, x.shape, w.shape, false, false));
  if (b.shape[0] >= 0 && w.shape[1] >= 0 && b.shape[0] != w.shape[1])
    throw invalid_argument_error(
        "node " + n.describe() + ": the bias of shape " + b.shape.to_string() +
        " does not match the columns of the weights of shape " + w.shape.to_string());
  n.type = x.type;
  n.shape = loom::shape{x.shape[0], w.shape[1]};
}

inline node_id matmul_node(graph& g, node_id a, node_id b, bool ta, bool tb) {
  return g.add_node("matmul", {a, b}, {{"transpose_a", ta}, {"transpose_b", tb}});
}

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_matmul_ops() {
  auto& r = op_registry::instance();

  // TF's _MatMulGrad, for the four transpose combinations.
  r.add({.name = "matmul",
         .num_inputs = 2,
         .infer = infer_matmul,
         .gradient = [](graph& g, const node_def& n, node_id dy) {
           const node_id a = n.inputs[0], b = n.inputs[1];
           const bool ta = n.attr_or<bool>("transpose_a", false);
           const bool tb = n.attr_or<bool>("transpose_b", false);
           if (!ta && !tb)
             return std::vector{matmul_node(g, dy, b, false, true),
                                matmul_node(g, a, dy, true, false)};
           if (!ta && tb)
             return std::vector{matmul_node(g, dy, b, false, false),
                                matmul_node(g, dy, a, true, false)};
           if (ta && !tb)
             return std::vector{matmul_node(g, b, dy, false, true),
                                matmul_node(g, a, dy, false, false)};
           return std::vector{matmul_node(g, b, dy, true, true), matmul_node(g, dy, a, true, true)};
         }});

  r.add({.name = "xw_plus_b",
         .num_inputs = 3,
         .infer = infer_xw_plus_b,
         .gradient = [](graph& g, const node_def& n, node_id dy) {
           const node_id x = n.inputs[0], w = n.inputs[1];
           return std::vector{matmul_node(g, dy, w, false, true),
                              matmul_node(g, x, dy, true, false),
                              reduce_node(g, "reduce_sum", dy, {0}, false)};
         }});
  return true;
}

inline const bool matmul_ops_registered = register_matmul_ops();
#endif

} // namespace loom::detail

namespace loom {

// -- matrix products -------------------------------------------------------------

// op(a) x op(b), op transposing when asked (tf.matmul).
template <expression A, expression B>
output<value_type_of<A>, 2> matmul(const A& a, const B& b, bool transpose_a = false,
                                   bool transpose_b = false) {
  static_assert(rank_of<A> == 2, "loom::matmul: the first operand (a) must have rank 2");
  static_assert(rank_of<B> == 2, "loom::matmul: the second operand (b) must have rank 2");
  static_assert(std::is_same_v<value_type_of<A>, value_type_of<B>>,
                "loom::matmul: the operands have different dtypes; use loom::cast<T>() on one");
  static_assert(floating_type<value_type_of<A>>,
                "loom::matmul: the operands must be float or double");
  auto la = lower(a);
  auto lb = lower(b);
  graph g = detail::common_graph("matmul", la, lb);
  return {g, detail::matmul_node(g, la.id(), lb.id(), transpose_a, transpose_b)};
}

// x w + b in one kernel (tf.nn.xw_plus_b): x [n, k], w [k, m], b [m].
template <expression X, expression W, expression B>
output<value_type_of<X>, 2> xw_plus_b(const X& x, const W& w, const B& b) {
  static_assert(rank_of<X> == 2, "loom::xw_plus_b: x must have rank 2");
  static_assert(rank_of<W> == 2, "loom::xw_plus_b: the weights w must have rank 2");
  static_assert(rank_of<B> == 1, "loom::xw_plus_b: the bias b must have rank 1");
  static_assert(std::is_same_v<value_type_of<X>, value_type_of<W>> &&
                    std::is_same_v<value_type_of<X>, value_type_of<B>>,
                "loom::xw_plus_b: x, w and b must have the same dtype");
  static_assert(floating_type<value_type_of<X>>, "loom::xw_plus_b: needs float or double");
  auto lx = lower(x);
  auto lw = lower(w);
  auto lb = lower(b);
  graph g = detail::common_graph("xw_plus_b", lx, lw, lb);
  return {g, g.add_node("xw_plus_b", {lx.id(), lw.id(), lb.id()})};
}

} // namespace loom

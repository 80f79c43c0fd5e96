// Gradient clipping (TF 1.x's clip_ops): clip_by_norm of one tensor, global_norm of many,
// and clip_by_global_norm over an optimizer's (gradient, variable) pairs, whose sparse
// gradients (indexed_slices: rows and their ids) are scaled as rows and stay sparse, so a
// clipped embedding still gets a sparse update.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/graph/builder.hpp>
#include <loom/graph/ops/math.hpp>
#include <loom/train/optimizer.hpp>

#include <string>
#include <vector>

namespace loom {

// t * clip_norm / max(||t||_2, clip_norm) (tf.clip_by_norm): t itself where its norm is
// at most clip_norm. Its gradient at t = 0 is finite, as TF's.
template <expression E>
output<value_type_of<E>, rank_of<E>> clip_by_norm(const E& t, double clip_norm) {
  using T = value_type_of<E>;
  static_assert(floating_type<T>, "loom::clip_by_norm: needs float or double");
  if (!(clip_norm > 0))
    throw invalid_argument_error("loom::clip_by_norm: clip_norm " + std::to_string(clip_norm) +
                                 " must be positive");
  auto lt = lower(t);
  auto l2sum = reduce_sum(square(lt));
  const auto positive = greater(l2sum, T(0));
  auto safe = lower(where(positive, l2sum, l2sum * T(0) + T(1)));
  auto norm = where(positive, sqrt(safe), l2sum);
  const T c = static_cast<T>(clip_norm);
  return lower(lt * c / maximum(norm, c));
}

namespace detail {
// What a gradient's norm is taken over: a sparse gradient's rows, else the gradient.
inline node_id gradient_values(const graph& g, node_id grad) {
  const node_def& n = g.node(grad);
  return n.op == "indexed_slices" ? n.inputs[0] : grad;
}
// The gradient times a scalar: a sparse one's rows scaled, its ids and shape kept.
LOOM_COMPILED_ONCE node_id scaled_gradient(graph& g, node_id grad, node_id scale);
} // namespace detail

// sqrt(sum of the squares of every element of every tensor) (tf.global_norm); a sparse
// gradient counts its rows. The tensors share one float dtype.
LOOM_COMPILED_ONCE node_id global_norm(graph& g, const std::vector<node_id>& tensors);

struct clipped_gradients {
  std::vector<grad_and_var> grads_and_vars; // each gradient scaled, or no_node as it was
  node_id global_norm;                      // the norm before clipping
};

// Every gradient times clip_norm / max(global_norm, clip_norm) (tf.clip_by_global_norm): the
// pairs for apply_gradients, and the norm before clipping (for a summary). A pair without
// a gradient stays so.
LOOM_COMPILED_ONCE clipped_gradients
clip_by_global_norm(graph& g, const std::vector<grad_and_var>& grads_and_vars, double clip_norm);

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE node_id scaled_gradient(graph& g, node_id grad, node_id scale) {
  const node_def& n = g.node(grad);
  if (n.op != "indexed_slices")
    return build::mul(g, grad, scale);
  std::vector<node_id> inputs = n.inputs;
  attr_map attrs = n.attrs;
  inputs[0] = build::mul(g, inputs[0], scale);
  return g.add_node("indexed_slices", std::move(inputs), std::move(attrs));
}
} // namespace loom::detail

namespace loom {

LOOM_COMPILED_ONCE node_id global_norm(graph& g, const std::vector<node_id>& tensors) {
  if (tensors.empty())
    throw invalid_argument_error("loom::global_norm: no tensors");
  const dtype t = g.node(tensors.front()).type;
  if (t != dtype::f32 && t != dtype::f64)
    throw invalid_argument_error("loom::global_norm: " + g.node(tensors.front()).describe() +
                                 " is " + std::string(to_string(t)) + ", not float or double");
  std::vector<node_id> squares;
  for (node_id x : tensors) {
    if (g.node(x).type != t)
      throw invalid_argument_error("loom::global_norm: " + g.node(x).describe() + " is " +
                                   std::string(to_string(g.node(x).type)) + ", " +
                                   g.node(tensors.front()).describe() + " " +
                                   std::string(to_string(t)) + "; the tensors share one dtype");
    const node_id v = detail::gradient_values(g, x);
    squares.push_back(detail::reduce_node(g, "reduce_sum", g.add_node("square", {v}), {}, false));
  }
  const node_id sum = squares.size() == 1 ? squares.front() : g.add_node("add_n", squares);
  return g.add_node("sqrt", {sum});
}

LOOM_COMPILED_ONCE clipped_gradients
clip_by_global_norm(graph& g, const std::vector<grad_and_var>& grads_and_vars, double clip_norm) {
  if (!(clip_norm > 0))
    throw invalid_argument_error("loom::clip_by_global_norm: clip_norm " +
                                 std::to_string(clip_norm) + " must be positive");
  std::vector<node_id> grads;
  for (const grad_and_var& gv : grads_and_vars)
    if (gv.grad != no_node)
      grads.push_back(gv.grad);
  if (grads.empty())
    throw invalid_argument_error("loom::clip_by_global_norm: no gradients to clip");
  clipped_gradients out{{}, global_norm(g, grads)};
  const dtype t = g.node(out.global_norm).type;
  const node_id c = detail::build::scalar(g, t, clip_norm);
  const node_id scale = detail::build::div(g, c, g.add_node("maximum", {out.global_norm, c}));
  for (const grad_and_var& gv : grads_and_vars)
    out.grads_and_vars.push_back(
        {gv.grad == no_node ? no_node : detail::scaled_gradient(g, gv.grad, scale), gv.var});
  return out;
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

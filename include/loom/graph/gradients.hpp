// Reverse-mode automatic differentiation on the runtime graph (TF's
// tf.gradients): adjoints are propagated over the nodes between xs and ys in
// reverse topological order, summed where a node feeds several consumers, using
// each op's registered gradient function.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/graph/builder.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/ops/array.hpp>
#include <loom/graph/output.hpp>

#include <map>
#include <tuple>
#include <vector>

namespace loom {

namespace detail {

// Whether gradients flow through input k: a data input, or a ref the op only reads.
inline bool differentiable_input(const op_def& def, std::size_t k) {
  return !(def.ref_inputs >> k & 1u) || (def.read_refs >> k & 1u);
}

// Several sparse gradients of one tensor (gathers of one variable) summed as
// one sparse gradient: their rows and indices joined, duplicates left for the
// consumer to sum (the sparse applies do, as the dense value does). no_node
// where the parts are not all row slices (axis 0) of one dense shape: those
// are summed densely (an indexed_slices node's value is the dense gradient).
LOOM_COMPILED_ONCE node_id sum_of_slices(graph& g, const std::vector<node_id>& parts);

} // namespace detail

// Adjoints of sum(ys) with respect to each x; no_node where x does not affect
// any y. grad_ys, when given, seeds each y's adjoint (default: ones).
LOOM_COMPILED_ONCE std::vector<node_id> gradients(graph& g, const std::vector<node_id>& ys,
                                                  const std::vector<node_id>& xs,
                                                  const std::vector<node_id>& grad_ys = {});

// Typed: auto [dw, db] = gradients(loss, w, b); each adjoint has its x's type.
template <expression Y, class... X> auto gradients(const Y& y, const X&... xs) {
  auto yo = lower(y);
  graph g = yo.graph();
  std::vector<node_id> ids = gradients(g, {yo.id()}, {xs.id()...});
  std::size_t k = 0;
  auto typed = [&]<class XT>(const XT& x) {
    node_id d = ids[k++];
    if (d == no_node)
      throw invalid_argument_error("gradients: '" + yo.name() + "' does not depend on '" +
                                   x.name() + "'");
    return output<value_type_of<XT>, rank_of<XT>>(g, d);
  };
  return std::tuple{typed(xs)...};
}

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE node_id sum_of_slices(graph& g, const std::vector<node_id>& parts) {
  if (parts.size() < 2)
    return no_node;
  const node_def first = g.node(parts.front());
  for (node_id p : parts) {
    const node_def& n = g.node(p);
    if (n.op != "indexed_slices" || n.inputs.size() != 2 || n.attr<std::int64_t>("axis") != 0 ||
        n.attr<std::vector<std::int64_t>>("dense_shape") !=
            first.attr<std::vector<std::int64_t>>("dense_shape"))
      return no_node;
  }
  std::vector<std::int64_t> rows = first.attr<std::vector<std::int64_t>>("dense_shape");
  rows.front() = -1; // [any, the dense shape's row]
  bool mixed_ids = false;
  for (node_id p : parts)
    mixed_ids |= g.node(g.node(p).inputs[1]).type != g.node(first.inputs[1]).type;
  std::vector<node_id> values, indices;
  for (node_id p : parts) {
    const node_def n = g.node(p);
    values.push_back(g.add_node("reshape", {n.inputs[0]}, {{"dims", rows}}));
    node_id ids = g.add_node("reshape", {n.inputs[1]}, {{"dims", std::vector<std::int64_t>{-1}}});
    if (mixed_ids && g.node(ids).type != dtype::i64)
      ids = g.add_node("cast", {ids}, {{"dst", dtype::i64}});
    indices.push_back(ids);
  }
  const node_id joined_values = g.add_node("concat", values, {{"axis", std::int64_t{0}}});
  const node_id joined_indices = g.add_node("concat", indices, {{"axis", std::int64_t{0}}});
  return g.add_node("indexed_slices", {joined_values, joined_indices}, first.attrs);
}
} // namespace loom::detail

namespace loom {

LOOM_COMPILED_ONCE std::vector<node_id> gradients(graph& g, const std::vector<node_id>& ys,
                                                  const std::vector<node_id>& xs,
                                                  const std::vector<node_id>& grad_ys) {
  if (!grad_ys.empty() && grad_ys.size() != ys.size())
    throw invalid_argument_error("gradients: " + std::to_string(grad_ys.size()) + " grad_ys for " +
                                 std::to_string(ys.size()) + " ys");
  const std::size_t n = g.size();
  const auto& reg = detail::op_registry::instance();
  // Nodes that depend on some x (forward) and that some y depends on (backward).
  std::vector<char> from_x(n, 0), to_y(n, 0);
  for (node_id x : xs)
    from_x[static_cast<std::size_t>(g.node(x).id)] = 1;
  for (std::size_t i = 0; i < n; ++i) {
    const node_def& nd = g.node(static_cast<node_id>(i));
    const detail::op_def& def = reg.find(nd.op);
    for (std::size_t k = 0; k < nd.inputs.size(); ++k)
      if (detail::differentiable_input(def, k) && from_x[static_cast<std::size_t>(nd.inputs[k])])
        from_x[i] = 1;
  }
  for (node_id y : ys)
    to_y[static_cast<std::size_t>(g.node(y).id)] = 1;
  node_id top = 0;
  for (node_id y : ys)
    top = std::max(top, y);
  for (node_id i = top; i >= 0; --i) {
    if (!to_y[static_cast<std::size_t>(i)])
      continue;
    const node_def& nd = g.node(i);
    const detail::op_def& def = reg.find(nd.op);
    for (std::size_t k = 0; k < nd.inputs.size(); ++k)
      if (detail::differentiable_input(def, k))
        to_y[static_cast<std::size_t>(nd.inputs[k])] = 1;
  }

  std::map<node_id, std::vector<node_id>> pending; // adjoint contributions per node
  for (std::size_t k = 0; k < ys.size(); ++k) {
    node_id y = ys[k];
    pending[y].push_back(grad_ys.empty() ? detail::build::ones_like(g, y) : grad_ys[k]);
  }
  auto sum = [&](std::vector<node_id>& parts) {
    if (node_id slices = detail::sum_of_slices(g, parts); slices != no_node)
      return slices;
    node_id acc = parts.front();
    for (std::size_t k = 1; k < parts.size(); ++k)
      acc = detail::build::add(g, acc, parts[k]);
    return acc;
  };

  std::map<node_id, node_id> adjoint;
  for (node_id i = top; i >= 0; --i) {
    auto it = pending.find(i);
    if (it == pending.end())
      continue;
    const node_id dy = sum(it->second);
    adjoint[i] = dy;
    const node_def nd = g.node(i); // a copy: the gradient function adds nodes
    const detail::op_def& def = reg.find(nd.op);
    bool wants = false;
    for (std::size_t k = 0; k < nd.inputs.size(); ++k) {
      const auto in = static_cast<std::size_t>(nd.inputs[k]);
      if (detail::differentiable_input(def, k) && from_x[in] && to_y[in])
        wants = true;
    }
    if (!wants)
      continue;
    if (!def.gradient)
      throw invalid_argument_error("gradients: op '" + nd.op + "' of node '" + nd.name +
                                   "' has no registered gradient, and an input of it depends "
                                   "on a variable being differentiated");
    std::vector<node_id> dxs = def.gradient(g, nd, dy);
    for (std::size_t k = 0; k < nd.inputs.size() && k < dxs.size(); ++k) {
      const auto in = static_cast<std::size_t>(nd.inputs[k]);
      if (dxs[k] == no_node || !from_x[in] || !to_y[in])
        continue;
      pending[nd.inputs[k]].push_back(dxs[k]);
    }
  }

  std::vector<node_id> out;
  for (node_id x : xs) {
    auto it = adjoint.find(x);
    if (it != adjoint.end())
      out.push_back(it->second);
    else if (auto p = pending.find(x); p != pending.end())
      out.push_back(sum(p->second));
    else
      out.push_back(no_node);
  }
  return out;
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

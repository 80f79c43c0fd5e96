// Lowering typed expressions into the runtime graph. Every subexpression
// becomes a primitive node (structural CSE merges repeats); an elementwise tree
// of two or more ops is also recorded as a fusion candidate, and its fused
// kernels, instantiated from the tree's type, are registered under the
// region's canonical key through detail::register_fused_kernels: the CPU's
// always, and in a translation unit compiled by nvcc the GPU's too (DESIGN §3:
// "a TU compiled by nvcc instantiates CUDA kernels for what it uses").
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/device_spec.hpp>
#include <loom/expr/expr.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/output.hpp>

#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace loom {

namespace detail {

// A constant node holding `value` (any dtype, strings too).
LOOM_COMPILED_ONCE node_id constant_node(graph& g, any_tensor value, std::string name = {});

template <element_type T> node_id scalar_node(graph& g, T v) {
  return constant_node(g, any_tensor::scalar<T>(v));
}

// The canonical key of a typed tree: op ids, cast targets, leaf dtypes and
// whether each leaf is a scalar, e.g. "mul(f32:t,log(clip_by_value(f32:t,f32:s,f32:s)))".
template <class E> std::string region_key() {
  if constexpr (E::is_leaf) {
    return std::string(to_string(dtype_of<typename E::value_type>)) + (E::rank == 0 ? ":s" : ":t");
  } else {
    return []<class Op, class... C>(std::type_identity<expr<Op, C...>>) {
      std::string k = Op::id;
      if constexpr (std::is_same_v<Op, ops::cast<typename E::value_type>>)
        k += std::string("<") + std::string(to_string(dtype_of<typename E::value_type>)) + ">";
      k += '(';
      bool first = true;
      ((k += (first ? "" : ","), k += region_key<C>(), first = false), ...);
      return k + ')';
    }(std::type_identity<E>{});
  }
}

// The customization point through which lowering hands a fusable tree's type
// to the kernel layer, which instantiates and registers the tree's fused
// kernels under `key`. Declared here, defined by kernels/fused.hpp (which
// <loom/api.hpp> includes): the graph layer lies below the kernels and cannot
// name them, and the tree's type exists only here.
template <class E> void register_fused_kernels(const std::string& key);

template <class E> void find_graph(const E& e, std::optional<graph>& g) {
  if constexpr (E::is_leaf) {
    if constexpr (requires { e.graph(); }) {
      if (!g)
        g = e.graph();
      else if (!(*g == e.graph()))
        throw invalid_argument_error("an expression mixes nodes of two different graphs (node '" +
                                     e.name() + "')");
    }
  } else {
    std::apply([&](const auto&... c) { (find_graph(c, g), ...); }, e.children);
  }
}

// Adds e's nodes under the scopes each expr<> node was written under (its
// numbers' constants under their parent's), with `extra` (on<Kind>'s device)
// inside them when given.
template <class E>
node_id lower_tree(graph& g, const E& e, std::vector<node_id>& leaves,
                   const std::optional<device_spec>& extra) {
  if constexpr (E::is_leaf) {
    node_id id;
    if constexpr (requires { e.value; })
      id = scalar_node(g, e.value);
    else
      id = e.id();
    leaves.push_back(id);
    return id;
  } else {
    auto written = g.restore_scope(e.written);
    std::optional<scope_guard> on_device;
    if (extra)
      (void)on_device.emplace(
          g.device(*extra)); // (void): nvcc warns of a nodiscard type's reference
    std::vector<node_id> inputs;
    std::apply([&](const auto&... c) { (inputs.push_back(lower_tree(g, c, leaves, extra)), ...); },
               e.children);
    attr_map attrs;
    using Op = typename E::op_type;
    if constexpr (std::is_same_v<Op, ops::cast<typename E::value_type>>)
      attrs.emplace("dst", dtype_of<typename E::value_type>);
    return g.add_node(Op::id, std::move(inputs), std::move(attrs));
  }
}

template <expression E> graph graph_of(const E& e) {
  std::optional<graph> g;
  detail::find_graph(e, g);
  if (!g)
    throw invalid_argument_error("an expression of numbers alone has no graph; make one operand "
                                 "a graph node (loom::constant)");
  return *g;
}

template <expression E>
output<value_type_of<E>, rank_of<E>> lower_with(const E& e,
                                                const std::optional<device_spec>& extra) {
  using ED = std::remove_cvref_t<E>;
  if constexpr (requires { e.id(); }) {
    return output<value_type_of<E>, rank_of<E>>(e.graph(), e.id());
  } else {
    graph g = graph_of(e);
    std::vector<node_id> leaves;
    node_id root = detail::lower_tree(g, e, leaves, extra);
    if constexpr (op_count<ED>() >= 2) {
      std::string key = detail::region_key<ED>();
      detail::register_fused_kernels<ED>(key);
      g.add_fusion({root, std::move(key), std::move(leaves)});
    }
    return output<value_type_of<E>, rank_of<E>>(g, root);
  }
}
} // namespace detail

// Lowers an expression to a node and returns its typed handle. Its nodes go
// where it was written: under the device scopes, name scope and control
// dependencies current when each of its operations was written, not those
// current here (as in TF, where the op exists from the line that wrote it).
template <expression E> output<value_type_of<E>, rank_of<E>> lower(const E& e) {
  return detail::lower_with(e, std::nullopt);
}

// Lowers an expression on a device of kind Kind (loom::gpu or loom::cpu), index
// `index` of the task its scopes give: `on<gpu>(relu(x * w))` puts the tree's
// nodes on "/device:GPU:0" inside the scopes it was written under. Where the
// process has no such device, placement fails with the node named, or soft
// placement moves it to the CPU and logs why.
template <class Kind, expression E>
output<value_type_of<E>, rank_of<E>> on(const E& e, int index = 0) {
  static_assert(std::is_same_v<Kind, gpu> || std::is_same_v<Kind, cpu>,
                "loom::on<Kind>(expression): Kind is the device kind to run on, loom::gpu or "
                "loom::cpu");
  return detail::lower_with(
      e, device_spec::from_string(
             std::string(std::is_same_v<Kind, gpu> ? "/device:GPU:" : "/device:CPU:") +
             std::to_string(index)));
}

// Lowers an expression and gives its result a name (an identity node when the
// expression's node already exists under another name).
template <expression E>
output<value_type_of<E>, rank_of<E>> named(const E& e, const std::string& name) {
  auto out = lower(e);
  graph g = out.graph();
  node_id id = g.add_node("identity", {out.id()}, {}, name);
  return output<value_type_of<E>, rank_of<E>>(g, id);
}

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE node_id constant_node(graph& g, any_tensor value, std::string name) {
  dtype t = value.type();
  return g.add_node("constant", {}, {{"value", std::move(value)}, {"dtype", t}}, std::move(name));
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

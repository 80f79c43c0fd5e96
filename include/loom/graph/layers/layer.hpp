// What loom::layers (TF 1.x's tf.layers) share: a layer's variable scope, named as TF names
// it ("dense", "dense_1", ... in the scope around it), so that its variables are
// "dense/kernel" and "dense/bias" and the device scope places them like any variable;
// initializers and regularizers held by value; the activations a layer may apply.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/lower.hpp>
#include <loom/graph/ops/math.hpp>
#include <loom/graph/ops/nn.hpp>
#include <loom/graph/variables.hpp>

#include <functional>
#include <optional>
#include <string>

namespace loom {

// Any initializer, held by value (a layer's options are not templates).
class any_initializer {
public:
  template <initializer I>
  requires(!std::is_same_v<I, any_initializer>) any_initializer(I init)
      : make_([init](graph& g, dtype t, const loom::shape& s) { return init.make(g, t, s); }) {}
  node_id make(graph& g, dtype t, const loom::shape& s) const { return make_(g, t, s); }

private:
  std::function<node_id(graph&, dtype, const loom::shape&)> make_;
};

// A regularizer: a scalar penalty node of a weight, which a layer adds to the
// "regularization_losses" collection (tf.GraphKeys.REGULARIZATION_LOSSES).
using regularizer = std::function<node_id(graph& g, node_id weight)>;

// scale * sum(w^2) / 2 (tf.contrib.layers.l2_regularizer); scale must not be negative.
LOOM_COMPILED_ONCE regularizer l2_regularizer(double scale);

// The sum of the regularization losses (tf.losses.get_regularization_loss): a float32
// zero where there are none, so it can always be added to a loss.
LOOM_COMPILED_ONCE output<float, 0> get_regularization_loss(graph& g);

// Activations a layer applies to its output (tf.layers' activation=tf.nn.relu): any callable
// from an expression to an expression does; these name the usual ones.
namespace activations {
struct linear_t {
  template <expression E> auto operator()(const E& x) const { return loom::lower(x); }
};
struct relu_t {
  template <expression E> auto operator()(const E& x) const { return loom::relu(x); }
};
struct sigmoid_t {
  template <expression E> auto operator()(const E& x) const { return loom::sigmoid(x); }
};
struct tanh_t {
  template <expression E> auto operator()(const E& x) const { return loom::tanh(x); }
};
struct elu_t {
  template <expression E> auto operator()(const E& x) const { return loom::elu(x); }
};
inline constexpr linear_t linear{};
inline constexpr relu_t relu{};
inline constexpr sigmoid_t sigmoid{};
inline constexpr tanh_t tanh{};
inline constexpr elu_t elu{};
} // namespace activations

namespace detail {
// The variable scope of a layer: `name` where given, else the first of base, base_1,
// base_2, ... that names no variable in the scope around it yet (TF's unique layer names).
LOOM_COMPILED_ONCE scope_guard layer_scope(graph& g, const std::string& name,
                                           const std::string& base);

// A layer's weight, its regularizer's penalty added to the collection.
template <class T, int R>
variable<T, R> layer_weight(graph& g, const std::string& name, const loom::shape& s,
                            const any_initializer& init, const std::optional<regularizer>& reg,
                            bool trainable = true) {
  auto w = get_variable<T, R>(g, name, s, init, variable_options{.trainable = trainable});
  if (reg)
    g.add_to_collection(collection::regularization_losses, (*reg)(g, w.id()));
  return w;
}
} // namespace detail

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE regularizer l2_regularizer(double scale) {
  if (!(scale >= 0))
    throw invalid_argument_error("loom::l2_regularizer: scale " + std::to_string(scale) +
                                 " must be >= 0");
  return [scale](graph& g, node_id w) {
    const dtype t = g.node(w).type;
    const node_id squares =
        detail::reduce_node(g, "reduce_sum", g.add_node("square", {w}), {}, false);
    return detail::build::mul(g, squares, detail::build::scalar(g, t, scale / 2));
  };
}

LOOM_COMPILED_ONCE output<float, 0> get_regularization_loss(graph& g) {
  const auto& losses = g.collection(collection::regularization_losses);
  if (losses.empty())
    return constant(g, 0.f);
  node_id sum = losses.size() == 1 ? losses.front() : g.add_node("add_n", losses);
  if (g.node(sum).type != dtype::f32)
    sum = g.add_node("cast", {sum}, {{"dst", dtype::f32}});
  return {g, sum};
}
} // namespace loom

namespace loom::detail {

LOOM_COMPILED_ONCE scope_guard layer_scope(graph& g, const std::string& name,
                                           const std::string& base) {
  if (!name.empty())
    return variable_scope(g, name);
  const auto& store = g.state().variable_store;
  for (int k = 0;; ++k) {
    const std::string candidate = k == 0 ? base : base + "_" + std::to_string(k);
    const std::string prefix = scoped_variable_name(g, candidate) + "/";
    auto it = store.lower_bound(prefix);
    if (it == store.end() || it->first.compare(0, prefix.size(), prefix) != 0)
      return variable_scope(g, candidate);
  }
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

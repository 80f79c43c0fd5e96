// The core layers of tf.layers: dense, dropout, flatten, and an embedding table's lookup.
#pragma once

#include <loom/graph/layers/layer.hpp>
#include <loom/graph/ops/array.hpp>
#include <loom/graph/ops/embedding_lookup.hpp>
#include <loom/graph/ops/matmul.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace loom::layers {

struct dense_options {
  bool use_bias = true;
  any_initializer kernel_initializer = glorot_uniform_initializer{};
  any_initializer bias_initializer = zeros_initializer{};
  std::optional<regularizer> kernel_regularizer{};
  std::optional<regularizer> bias_regularizer{};
  bool trainable = true;
  std::string name{}; // default: "dense", "dense_1", ... in the current variable scope
};

// activation(x kernel + bias) (tf.layers.dense) over x [batch, features]: variables
// NAME/kernel [features, units] and NAME/bias [units].
template <expression X, class Activation = activations::linear_t>
output<value_type_of<X>, 2> dense(const X& x, std::int64_t units, const dense_options& o = {},
                                  Activation activation = {}) {
  using T = value_type_of<X>;
  static_assert(rank_of<X> == 2, "loom::layers::dense: the input must have rank 2 ([batch, "
                                 "features]); loom::layers::flatten it first");
  static_assert(floating_type<T>, "loom::layers::dense: needs float or double inputs");
  auto lx = lower(x);
  graph g = lx.graph();
  const std::int64_t features = lx.shape()[1];
  if (features < 0)
    throw invalid_argument_error("loom::layers::dense: the input " + lx.node().describe() +
                                 " of shape " + lx.shape().to_string() +
                                 " must have its last dimension known when the graph is built");
  if (units <= 0)
    throw invalid_argument_error("loom::layers::dense: " + std::to_string(units) +
                                 " units; a layer needs one or more");
  auto scope = detail::layer_scope(g, o.name, "dense");
  auto kernel = detail::layer_weight<T, 2>(g, "kernel", loom::shape{features, units},
                                           o.kernel_initializer, o.kernel_regularizer, o.trainable);
  if (!o.use_bias)
    return lower(activation(matmul(lx, kernel)));
  auto bias = detail::layer_weight<T, 1>(g, "bias", loom::shape{units}, o.bias_initializer,
                                         o.bias_regularizer, o.trainable);
  return lower(activation(xw_plus_b(lx, kernel, bias)));
}

// x as [batch, everything else] (tf.layers.flatten); the dimensions after the first must be
// known when the graph is built.
template <expression X> output<value_type_of<X>, 2> flatten(const X& x) {
  static_assert(rank_of<X> >= 1, "loom::layers::flatten: a scalar has no batch dimension");
  auto lx = lower(x);
  std::int64_t features = 1;
  for (int d = 1; d < rank_of<X>; ++d) {
    if (lx.shape()[d] < 0)
      throw invalid_argument_error("loom::layers::flatten: the input " + lx.node().describe() +
                                   " of shape " + lx.shape().to_string() +
                                   " must have every dimension after the first known");
    features *= lx.shape()[d];
  }
  return reshape(lx, std::array<std::int64_t, 2>{-1, features});
}

// tf.layers.dropout: `rate` of the elements zeroed while training, the rest scaled by
// 1 / (1 - rate); `training` a bool, or a bool scalar of the graph fed each step.
template <expression X, class Training = bool>
output<value_type_of<X>, rank_of<X>> dropout(const X& x, double rate = 0.5,
                                             const Training& training = false,
                                             std::optional<std::int64_t> seed = std::nullopt) {
  return loom::dropout(x, rate, seed, training);
}

struct embedding_options {
  any_initializer initializer = random_uniform_initializer{-0.05, 0.05};
  std::optional<regularizer> embeddings_regularizer{};
  bool trainable = true;
  std::string name{}; // default: "embedding", "embedding_1", ...
};

// The rows of a table NAME/embeddings [input_dim, output_dim] at ids (tf.keras.layers'
// Embedding in a TF 1.x graph): ids' shape + [output_dim], a sparse gradient for the table.
template <class T = float, expression I>
output<T, rank_of<I> + 1> embedding(const I& ids, std::int64_t input_dim, std::int64_t output_dim,
                                    const embedding_options& o = {}) {
  static_assert(std::is_same_v<value_type_of<I>, std::int32_t> ||
                    std::is_same_v<value_type_of<I>, std::int64_t>,
                "loom::layers::embedding: the ids must be int32 or int64");
  auto li = lower(ids);
  graph g = li.graph();
  if (input_dim <= 0 || output_dim <= 0)
    throw invalid_argument_error("loom::layers::embedding: a table of " +
                                 std::to_string(input_dim) + " x " + std::to_string(output_dim) +
                                 "; both must be positive");
  auto scope = detail::layer_scope(g, o.name, "embedding");
  auto table = detail::layer_weight<T, 2>(g, "embeddings", loom::shape{input_dim, output_dim},
                                          o.initializer, o.embeddings_regularizer, o.trainable);
  return embedding_lookup(table, li);
}

} // namespace loom::layers

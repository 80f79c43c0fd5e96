// Normalization: tf.nn.moments and tf.nn.batch_normalization as expressions, and the layers
// tf.layers.batch_normalization (its moving mean and variance updated by ops in the
// "update_ops" collection, TF's UPDATE_OPS) and layer normalization.
//
// moments and batch_normalization are expressions of elementwise ops and reductions; the
// batch_normalization layer runs the fused ops of graph/ops/batch_norm.hpp (one pass for the
// statistics, one for y, and for the gradient one for its per-channel sums and one for the
// statistics' part).
#pragma once

#include <loom/graph/layers/layer.hpp>
#include <loom/graph/ops/batch_norm.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom {

// The mean and (biased) variance of x over `axes`, kept as dimensions of 1 (tf.nn.moments
// with keep_dims=True).
template <expression X, std::size_t N>
std::pair<output<value_type_of<X>, rank_of<X>>, output<value_type_of<X>, rank_of<X>>>
moments(const X& x, const std::array<std::int64_t, N>& axes) {
  static_assert(floating_type<value_type_of<X>>, "loom::moments: needs float or double");
  auto lx = lower(x);
  auto mean = reduce_mean(lx, axes, keepdims);
  auto variance = reduce_mean(square(lx - mean), axes, keepdims);
  return {mean, variance};
}

// (x - mean) / sqrt(variance + epsilon) * scale + offset (tf.nn.batch_normalization): an
// expression, one fused kernel.
template <expression X, expression M, expression V, expression O, expression S>
auto batch_normalization(const X& x, const M& mean, const V& variance, const O& offset,
                         const S& scale, double epsilon) {
  using T = value_type_of<X>;
  static_assert(floating_type<T>, "loom::batch_normalization: needs float or double");
  return (x - mean) * (rsqrt(variance + static_cast<T>(epsilon)) * scale) + offset;
}

} // namespace loom

namespace loom::layers {

struct batch_normalization_options {
  double momentum = 0.99;
  double epsilon = 1e-3;
  bool center = true; // a learned offset, NAME/beta
  bool scale = true;  // a learned scale, NAME/gamma
  bool trainable = true;
  std::string name{}; // default: "batch_normalization", "batch_normalization_1", ...
};

namespace detail {
template <expression X, class Training>
output<value_type_of<X>, rank_of<X>> normalize_batch(const X& x, const Training& training,
                                                     const batch_normalization_options& o) {
  using T = value_type_of<X>;
  constexpr int R = rank_of<X>;
  static_assert(R >= 2, "loom::layers::batch_normalization: the input must have rank 2 or more "
                        "(its last dimension the features, or an image's channels)");
  static_assert(floating_type<T>, "loom::layers::batch_normalization: needs float or double");
  auto lx = lower(x);
  graph g = lx.graph();
  const std::int64_t channels = lx.shape()[R - 1];
  if (channels < 0)
    throw invalid_argument_error("loom::layers::batch_normalization: the input " +
                                 lx.node().describe() + " of shape " + lx.shape().to_string() +
                                 " must have its last dimension known when the graph is built");
  if (!(o.momentum >= 0 && o.momentum <= 1) || !(o.epsilon > 0))
    throw invalid_argument_error("loom::layers::batch_normalization: momentum " +
                                 std::to_string(o.momentum) + " must be in [0, 1] and epsilon " +
                                 std::to_string(o.epsilon) + " positive");
  auto scope = loom::detail::layer_scope(g, o.name, "batch_normalization");
  const loom::shape c{channels};
  std::optional<variable<T, 1>> gamma, beta;
  if (o.scale)
    gamma = loom::detail::layer_weight<T, 1>(g, "gamma", c, ones_initializer{}, {}, o.trainable);
  if (o.center)
    beta = loom::detail::layer_weight<T, 1>(g, "beta", c, zeros_initializer{}, {}, o.trainable);
  auto moving_mean =
      loom::detail::layer_weight<T, 1>(g, "moving_mean", c, zeros_initializer{}, {}, false);
  auto moving_variance =
      loom::detail::layer_weight<T, 1>(g, "moving_variance", c, ones_initializer{}, {}, false);

  // The batch's statistics in one pass (batch_norm_moments: mean, variance, and the variance
  // times n / (n - 1)); not computed where the flag is the constant false.
  bool batch_statistics = true;
  if constexpr (std::is_same_v<Training, bool>)
    batch_statistics = training;
  std::optional<output<T, 1>> batch_mean, batch_variance, update_variance;
  if (batch_statistics) {
    const node_id m = g.add_node("batch_norm_moments", {lx.id()});
    batch_mean.emplace(g, loom::detail::channel_row(g, m, 0));
    batch_variance.emplace(g, loom::detail::channel_row(g, m, 1));
    // TF's fused kernel (its choice for a 4-D input) moves the average toward the unbiased
    // variance; the non-fused one toward the batch's.
    update_variance.emplace(g, R == 4 ? loom::detail::channel_row(g, m, 2) : batch_variance->id());
    const T decay = static_cast<T>(1 - o.momentum);
    auto move_toward = [&](const variable<T, 1>& average, const output<T, 1>& value) {
      node_id update;
      if constexpr (std::is_same_v<Training, bool>)
        update = average.assign_sub((average - value) * decay).id();
      else // no move while the graph's flag says not training
        update =
            average.assign_sub(where(training, (average - value) * decay, average * T(0))).id();
      g.add_to_collection(collection::update_ops, update);
    };
    move_toward(moving_mean, *batch_mean);
    move_toward(moving_variance, *update_variance);
  }
  auto pick = [&](const std::optional<output<T, 1>>& batch,
                  const variable<T, 1>& average) -> output<T, 1> {
    if constexpr (std::is_same_v<Training, bool>)
      return training ? *batch : output<T, 1>(average);
    else
      return lower(where(training, *batch, average));
  };
  auto filled = [&](T v) {
    return output<T, 1>(
        constant(g, tensor<T, 1>(c, std::vector<T>(static_cast<std::size_t>(channels), v))));
  };
  const output<T, 1> scale_by = gamma ? output<T, 1>(*gamma) : filled(T(1));
  const output<T, 1> offset = beta ? output<T, 1>(*beta) : filled(T(0));
  // One fused_batch_norm: its gradient reaches x through the batch statistics while
  // training, as TF's training-mode kernel's does.
  return loom::detail::fused_batch_norm_node(lx, scale_by, offset, pick(batch_mean, moving_mean),
                                             pick(batch_variance, moving_variance), o.epsilon);
}
} // namespace detail

// tf.layers.batch_normalization over the last axis (NHWC channels, or a dense layer's
// features): NAME/gamma, NAME/beta, and the moving statistics NAME/moving_mean and
// NAME/moving_variance (not trainable). While training it normalizes by the batch's
// statistics and adds to the "update_ops" collection the ops that move the averages
// toward them (run them with the train op, as in TF); otherwise it uses the averages.
// `training`: a bool, or a bool scalar of the graph fed each step.
template <expression X, class Training = bool>
output<value_type_of<X>, rank_of<X>>
batch_normalization(const X& x, const Training& training = false,
                    const batch_normalization_options& o = {}) {
  return detail::normalize_batch(x, training, o);
}

// Layer normalization over the last axis with NAME/gamma and NAME/beta ("layer_normalization"):
// each example by its own mean and variance.
template <expression X>
output<value_type_of<X>, rank_of<X>> layer_normalization(const X& x, double epsilon = 1e-3,
                                                         const std::string& name = {}) {
  using T = value_type_of<X>;
  constexpr int R = rank_of<X>;
  static_assert(R >= 1 && floating_type<T>,
                "loom::layers::layer_normalization: needs a float or double tensor of rank >= 1");
  auto lx = lower(x);
  graph g = lx.graph();
  const std::int64_t features = lx.shape()[R - 1];
  if (features < 0)
    throw invalid_argument_error("loom::layers::layer_normalization: the input " +
                                 lx.node().describe() + " of shape " + lx.shape().to_string() +
                                 " must have its last dimension known when the graph is built");
  auto scope = loom::detail::layer_scope(g, name, "layer_normalization");
  auto gamma =
      loom::detail::layer_weight<T, 1>(g, "gamma", loom::shape{features}, ones_initializer{}, {});
  auto beta =
      loom::detail::layer_weight<T, 1>(g, "beta", loom::shape{features}, zeros_initializer{}, {});
  auto [mean, variance] = moments(lx, std::array<std::int64_t, 1>{R - 1});
  return lower(batch_normalization(lx, mean, variance, beta, gamma, epsilon));
}

} // namespace loom::layers

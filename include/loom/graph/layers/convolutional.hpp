// The convolutional layers of tf.layers (NHWC): conv2d, separable_conv2d, max_pooling2d,
// average_pooling2d.
#pragma once

#include <loom/graph/layers/layer.hpp>
#include <loom/graph/ops/conv.hpp>
#include <loom/graph/ops/depthwise_conv.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace loom::layers {

struct conv2d_options {
  std::array<std::int64_t, 2> strides{1, 1};
  std::string padding = "VALID"; // tf.layers' default
  std::array<std::int64_t, 2> dilation_rate{1, 1};
  bool use_bias = true;
  any_initializer kernel_initializer = glorot_uniform_initializer{};
  any_initializer bias_initializer = zeros_initializer{};
  std::optional<regularizer> kernel_regularizer{};
  std::optional<regularizer> bias_regularizer{};
  bool trainable = true;
  std::string name{}; // default: "conv2d", "conv2d_1", ...
};

// activation(conv2d(x, kernel) + bias) (tf.layers.conv2d) over x [batch, h, w, channels]:
// variables NAME/kernel [kh, kw, channels, filters] and NAME/bias [filters].
template <expression X, class Activation = activations::linear_t>
output<value_type_of<X>, 4> conv2d(const X& x, std::int64_t filters,
                                   std::array<std::int64_t, 2> kernel_size,
                                   const conv2d_options& o = {}, Activation activation = {}) {
  using T = value_type_of<X>;
  static_assert(rank_of<X> == 4, "loom::layers::conv2d: the input must have rank 4 (NHWC: "
                                 "batch, height, width, channels); reshape a flat image first");
  static_assert(floating_type<T>, "loom::layers::conv2d: needs float or double inputs");
  auto lx = lower(x);
  graph g = lx.graph();
  const std::int64_t channels = lx.shape()[3];
  if (channels < 0)
    throw invalid_argument_error("loom::layers::conv2d: the input " + lx.node().describe() +
                                 " of shape " + lx.shape().to_string() +
                                 " must have its channels known when the graph is built");
  if (filters <= 0 || kernel_size[0] <= 0 || kernel_size[1] <= 0)
    throw invalid_argument_error("loom::layers::conv2d: " + std::to_string(filters) +
                                 " filters of " + std::to_string(kernel_size[0]) + "x" +
                                 std::to_string(kernel_size[1]) + "; all must be positive");
  auto scope = detail::layer_scope(g, o.name, "conv2d");
  auto kernel = detail::layer_weight<T, 4>(
      g, "kernel", loom::shape{kernel_size[0], kernel_size[1], channels, filters},
      o.kernel_initializer, o.kernel_regularizer, o.trainable);
  auto y = loom::conv2d(lx, kernel,
                        {.strides = o.strides, .padding = o.padding, .dilations = o.dilation_rate});
  if (!o.use_bias)
    return lower(activation(y));
  auto bias = detail::layer_weight<T, 1>(g, "bias", loom::shape{filters}, o.bias_initializer,
                                         o.bias_regularizer, o.trainable);
  return lower(activation(bias_add(y, bias)));
}

struct separable_conv2d_options {
  std::array<std::int64_t, 2> strides{1, 1};
  std::string padding = "VALID"; // tf.layers' default
  std::array<std::int64_t, 2> dilation_rate{1, 1};
  std::int64_t depth_multiplier = 1;
  bool use_bias = true;
  any_initializer depthwise_initializer = glorot_uniform_initializer{};
  any_initializer pointwise_initializer = glorot_uniform_initializer{};
  any_initializer bias_initializer = zeros_initializer{};
  std::optional<regularizer> depthwise_regularizer{};
  std::optional<regularizer> pointwise_regularizer{};
  std::optional<regularizer> bias_regularizer{};
  bool trainable = true;
  std::string name{}; // default: "separable_conv2d", "separable_conv2d_1", ...
};

// activation(pointwise(depthwise(x)) + bias) (tf.layers.separable_conv2d, tf.nn.separable_conv2d's
// two steps): a depthwise_conv2d with the strides, padding and dilations, then a 1x1 conv2d to
// `filters`. Variables NAME/depthwise_kernel [kh, kw, channels, depth_multiplier],
// NAME/pointwise_kernel [1, 1, channels * depth_multiplier, filters] and NAME/bias [filters].
template <expression X, class Activation = activations::linear_t>
output<value_type_of<X>, 4>
separable_conv2d(const X& x, std::int64_t filters, std::array<std::int64_t, 2> kernel_size,
                 const separable_conv2d_options& o = {}, Activation activation = {}) {
  using T = value_type_of<X>;
  static_assert(rank_of<X> == 4, "loom::layers::separable_conv2d: the input must have rank 4 "
                                 "(NHWC: batch, height, width, channels)");
  static_assert(floating_type<T>, "loom::layers::separable_conv2d: needs float or double inputs");
  auto lx = lower(x);
  graph g = lx.graph();
  const std::int64_t channels = lx.shape()[3];
  if (channels < 0)
    throw invalid_argument_error("loom::layers::separable_conv2d: the input " +
                                 lx.node().describe() + " of shape " + lx.shape().to_string() +
                                 " must have its channels known when the graph is built");
  if (filters <= 0 || kernel_size[0] <= 0 || kernel_size[1] <= 0 || o.depth_multiplier <= 0)
    throw invalid_argument_error("loom::layers::separable_conv2d: " + std::to_string(filters) +
                                 " filters of " + std::to_string(kernel_size[0]) + "x" +
                                 std::to_string(kernel_size[1]) + ", depth multiplier " +
                                 std::to_string(o.depth_multiplier) + "; all must be positive");
  auto scope = detail::layer_scope(g, o.name, "separable_conv2d");
  auto depthwise = detail::layer_weight<T, 4>(
      g, "depthwise_kernel",
      loom::shape{kernel_size[0], kernel_size[1], channels, o.depth_multiplier},
      o.depthwise_initializer, o.depthwise_regularizer, o.trainable);
  auto pointwise = detail::layer_weight<T, 4>(
      g, "pointwise_kernel", loom::shape{1, 1, channels * o.depth_multiplier, filters},
      o.pointwise_initializer, o.pointwise_regularizer, o.trainable);
  auto y =
      loom::conv2d(loom::depthwise_conv2d(
                       lx, depthwise,
                       {.strides = o.strides, .padding = o.padding, .dilations = o.dilation_rate}),
                   pointwise, {.padding = "VALID"});
  if (!o.use_bias)
    return lower(activation(y));
  auto bias = detail::layer_weight<T, 1>(g, "bias", loom::shape{filters}, o.bias_initializer,
                                         o.bias_regularizer, o.trainable);
  return lower(activation(bias_add(y, bias)));
}

// tf.layers.max_pooling2d and average_pooling2d: pools of pool_size, strides, padding
// ("VALID" by default, as TF's).
template <expression X>
output<value_type_of<X>, 4> max_pooling2d(const X& x, std::array<std::int64_t, 2> pool_size,
                                          std::array<std::int64_t, 2> strides,
                                          const std::string& padding = "VALID") {
  return max_pool(x, pool_size, {.strides = strides, .padding = padding});
}
template <expression X>
output<value_type_of<X>, 4> average_pooling2d(const X& x, std::array<std::int64_t, 2> pool_size,
                                              std::array<std::int64_t, 2> strides,
                                              const std::string& padding = "VALID") {
  return avg_pool(x, pool_size, {.strides = strides, .padding = padding});
}

} // namespace loom::layers

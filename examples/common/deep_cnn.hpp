// The convolutional network of TensorFlow's "Deep MNIST for experts" tutorial, written with
// loom::layers: conv 5x5x32 (relu), max pool 2x2, conv 5x5x64 (relu), max pool 2x2, dense
// 1024 (relu), dropout, dense 10; with batch_norm, batch normalization after each
// convolution and the first dense layer (before the relu). One copy, shared by examples/cnn
// and its benchmark against TensorFlow (benchmarks/tf/cnn_tf.py builds the same graph).
#pragma once

#include <loom/api.hpp>

#include <array>
#include <cstdint>
#include <optional>

namespace loom::examples {

struct deep_cnn {
  static constexpr std::int64_t image_pixels = 28;

  placeholder<float, 2> x;             // [batch, 784], pixels in [0, 1]
  placeholder<std::int64_t, 1> labels; // [batch], classes in [0, 10)
  placeholder<bool, 0> training;       // dropout and batch statistics on while training
  output<float, 2> logits;             // [batch, 10]
  output<float, 0> loss;               // the mean cross entropy
  output<std::int64_t, 1> predictions; // argmax of the logits

  deep_cnn(graph& g, bool batch_norm, std::optional<std::int64_t> seed = std::nullopt)
      : x(g, shape{-1, image_pixels * image_pixels}, "x"), labels(g, shape{-1}, "labels"),
        training(g, shape{}, "training"), logits(build(g, batch_norm, seed)),
        loss(lower(reduce_mean(sparse_softmax_cross_entropy_with_logits(labels, logits)))),
        predictions(argmax(logits, 1)) {}

private:
  // The tutorial's weights: truncated normal of stddev 0.1, biases 0.1.
  static layers::conv2d_options conv_options(bool batch_norm) {
    return {.padding = "SAME",
            .use_bias = !batch_norm,
            .kernel_initializer = truncated_normal_initializer{.stddev = 0.1},
            .bias_initializer = constant_initializer{0.1}};
  }
  static layers::dense_options dense_options(bool batch_norm) {
    return {.use_bias = !batch_norm,
            .kernel_initializer = truncated_normal_initializer{.stddev = 0.1},
            .bias_initializer = constant_initializer{0.1}};
  }

  output<float, 2> build(graph&, bool batch_norm, std::optional<std::int64_t> seed) {
    // [snippet:network]
    auto relu_after = [&](const auto& y) {
      if (!batch_norm)
        return lower(relu(y));
      return lower(relu(layers::batch_normalization(y, training)));
    };
    auto images = reshape(x, std::array<std::int64_t, 4>{-1, image_pixels, image_pixels, 1});
    auto conv1 = relu_after(layers::conv2d(images, 32, {5, 5}, conv_options(batch_norm)));
    auto pool1 = layers::max_pooling2d(conv1, {2, 2}, {2, 2});
    auto conv2 = relu_after(layers::conv2d(pool1, 64, {5, 5}, conv_options(batch_norm)));
    auto pool2 = layers::max_pooling2d(conv2, {2, 2}, {2, 2});
    auto fc1 = relu_after(layers::dense(layers::flatten(pool2), 1024, dense_options(batch_norm)));
    auto dropped = layers::dropout(fc1, 0.5, training, seed);
    return layers::dense(dropped, 10,
                         {.kernel_initializer = truncated_normal_initializer{.stddev = 0.1},
                          .bias_initializer = constant_initializer{0.1}});
    // [snippet-end:network]
  }
};

} // namespace loom::examples

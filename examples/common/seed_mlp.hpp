// The model of seed 002's distributed.py: 784 -> hidden (relu) -> 10 (softmax),
// the clipped cross entropy summed over the batch, and the accuracy. One copy,
// shared by mnist_local (one process), mnist_replica (a cluster) and the
// train_throughput benchmark, so that they compare the same graph.
#pragma once

#include <loom/api.hpp>

#include <cmath>
#include <cstdint>

namespace loom::examples {

struct seed_mlp {
  static constexpr int image_pixels = 28;

  variable<float, 2> hid_w;
  variable<float, 1> hid_b;
  variable<float, 2> sm_w;
  variable<float, 1> sm_b;
  placeholder<float, 2> x;
  placeholder<float, 2> y_;
  output<float, 2> y;
  output<float, 0> cross_entropy;
  output<float, 0> accuracy;

  // [snippet:model]
  // Variables as the seed creates them: truncated normal weights, zero biases.
  seed_mlp(graph& g, std::int64_t hidden)
      : hid_w(g, "hid_w", shape{image_pixels * image_pixels, hidden},
              truncated_normal_initializer{.stddev = 1.0 / image_pixels}),
        hid_b(g, "hid_b", shape{hidden}, zeros_initializer{}),
        sm_w(g, "sm_w", shape{hidden, 10},
             truncated_normal_initializer{.stddev = 1.0 / std::sqrt(static_cast<double>(hidden))}),
        sm_b(g, "sm_b", shape{10}, zeros_initializer{}),
        x(g, shape{-1, image_pixels * image_pixels}, "x"), y_(g, shape{-1, 10}, "y_"),
        y(lower(softmax(xw_plus_b(relu(xw_plus_b(x, hid_w, hid_b)), sm_w, sm_b)))),
        cross_entropy(named(-reduce_sum(y_ * log(clip_by_value(y, 1e-10, 1.0))), "cross_entropy")),
        accuracy(lower(reduce_mean(cast<float>(equal(argmax(y, 1), argmax(y_, 1)))))) {}
  // [snippet-end:model]
};

} // namespace loom::examples

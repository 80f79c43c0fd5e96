// The host-side part of the convolution and pooling kernels that the CPU's
// (kernels/cpu/conv.hpp) and the GPU's (kernels/cuda/conv.cuh) share: how many images'
// patches a kernel holds at once, when the input is its own patch matrix, and the checks
// of a gradient's dy, with their messages. Host code only, so nvcc compiles it too.
#pragma once

#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/graph/ops/conv.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace loom::kernels {

// The most elements of patches a conv2d kernel holds at once: 16 MiB of floats.
inline constexpr std::int64_t patch_budget = std::int64_t{4} << 20;

// The images whose patches a kernel builds at once: as many as the budget holds, one at
// least.
inline std::int64_t chunk_images(const detail::conv_window& w) {
  const std::int64_t per_image = w.out_h * w.out_w * w.patch_size();
  return std::clamp<std::int64_t>(per_image ? patch_budget / per_image : w.batch, 1,
                                  std::max<std::int64_t>(w.batch, 1));
}

// Whether the input is its own patch matrix: a 1x1 window, unit strides, no padding.
inline bool pointwise(const detail::conv_window& w) {
  return w.window_h == 1 && w.window_w == 1 && w.stride_h == 1 && w.stride_w == 1 &&
         w.pad_top == 0 && w.pad_left == 0;
}

// A gradient's dy must have the shape of the op's output.
inline void check_window_dy(const node_def& n, const any_tensor& dy, const detail::conv_window& w) {
  if (dy.shape() != w.output_shape())
    throw invalid_argument_error("node " + n.describe() + ": dy of shape " +
                                 dy.shape().to_string() + " is not the output shape " +
                                 w.output_shape().to_string() + " of its forward op");
}

// The shape a backprop's result takes: its input `index` where it has one, else the
// attribute.
inline loom::shape backprop_shape(std::span<const any_tensor* const> inputs, const node_def& n,
                                  std::size_t index, const char* attr) {
  return inputs.size() > index ? inputs[index]->shape()
                               : loom::shape(n.attr<std::vector<std::int64_t>>(attr));
}

} // namespace loom::kernels

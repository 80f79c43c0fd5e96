// The host-side part of the depthwise convolution's kernels that the CPU's
// (kernels/cpu/depthwise_conv.hpp) and the GPU's (kernels/cuda/depthwise_conv.cuh) share: the
// window of each op from its tensors, with the checks of a backprop's dy. Host code only, so
// nvcc compiles it too.
#pragma once

#include <loom/graph/ops/depthwise_conv.hpp>
#include <loom/kernels/checks/conv.hpp>
#include <loom/kernels/registry.hpp>

namespace loom::kernels {

// depthwise_conv2d: inputs (x, filter).
inline detail::conv_window depthwise_forward_window(kernel_context& c) {
  return depthwise_window_of(c.node, c.decoded<detail::window_attrs>(), c.input(0).shape(),
                             c.input(1).shape());
}

// depthwise_conv2d_native_backprop_input: inputs (filter, dy[, x]); the window of x's shape.
inline detail::conv_window depthwise_input_grad_window(kernel_context& c) {
  const loom::shape x = backprop_shape(c.inputs, c.node, 2, "input_shape");
  const detail::conv_window w =
      depthwise_window_of(c.node, c.decoded<detail::window_attrs>(), x, c.input(0).shape());
  check_window_dy(c.node, c.input(1), w);
  return w;
}

// depthwise_conv2d_native_backprop_filter: inputs (x, dy[, filter]); the window of the
// filter's shape.
inline detail::conv_window depthwise_filter_grad_window(kernel_context& c, loom::shape& filter) {
  filter = backprop_shape(c.inputs, c.node, 2, "filter_shape");
  const detail::conv_window w =
      depthwise_window_of(c.node, c.decoded<detail::window_attrs>(), c.input(0).shape(), filter);
  check_window_dy(c.node, c.input(1), w);
  return w;
}

} // namespace loom::kernels

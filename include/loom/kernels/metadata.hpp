// Kernels that touch a tensor's metadata (its shape, its buffer handle) and
// never its elements, so one definition serves every device: reshape and
// reshape_like, expand_dims and squeeze give the same buffer under another shape, identity passes
// its input on, no_op does nothing. Each device's kernels register them for that device
// (register_metadata_kernels, called by kernels/cpu/state.hpp and kernels/cuda/state.cuh), so that
// a program without the GPU kernels has no GPU kernel of these either. Host code only, so nvcc
// compiles it too.
#pragma once

#include <loom/graph/ops/math.hpp>
#include <loom/graph/ops/strided.hpp>
#include <loom/kernels/registry.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace loom::kernels {

template <class T> struct reshape_kernel {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    c.output = x.reshaped(
        detail::reshape_target(c.node, x.shape(), c.node.attr<std::vector<std::int64_t>>("dims")));
  }
};

template <class T> struct reshape_like_kernel {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const loom::shape& to = c.input(1).shape();
    if (x.num_elements() != to.num_elements())
      throw invalid_argument_error("node " + c.node.describe() +
                                   ": cannot reshape a tensor of shape " + x.shape().to_string() +
                                   " into shape " + to.to_string());
    c.output = x.reshaped(to);
  }
};

template <class T> struct expand_dims_kernel {
  static void run(kernel_context& c) {
    c.output = c.input(0).reshaped(detail::expanded_shape(c.node, c.input(0).shape()));
  }
};

template <class T> struct squeeze_kernel {
  static void run(kernel_context& c) {
    c.output = c.input(0).reshaped(detail::squeezed_shape(c.node, c.input(0).shape()));
  }
};

template <class T> struct identity_kernel {
  static void run(kernel_context& c) { c.output = c.input(0); }
};

template <class T> struct no_op_kernel {
  static void run(kernel_context&) {}
};

// Registers the kernels above on `device` for every dtype in Types: all
// types on the CPU; on a GPU all but strings, which never live there.
template <class Types> bool register_metadata_kernels(const std::string& device) {
  register_kernels<reshape_kernel>("reshape", Types{}, device);
  register_kernels<reshape_like_kernel>("reshape_like", Types{}, device);
  register_kernels<expand_dims_kernel>("expand_dims", Types{}, device);
  register_kernels<squeeze_kernel>("squeeze", Types{}, device);
  register_kernels<identity_kernel>("identity", Types{}, device);
  register_kernels<no_op_kernel>("no_op", Types{}, device);
  return true;
}

} // namespace loom::kernels

// CPU kernels of gather_nd and gather_nd_grad (graph/ops/gather_nd.hpp): the index tuples are
// checked and turned into slice numbers first (kernels/checks/gather_nd.hpp), then slices are
// copied (gather_nd, over the pool) or added into zeros in the tuples' order (the gradient).
#pragma once

#include <loom/kernels/checks/gather_nd.hpp>
#include <loom/kernels/cpu/parallel_for.hpp>
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace loom::kernels {

template <class T> struct gather_nd_cpu {
  static void run(kernel_context& c) {
    const any_tensor& params = c.input(0);
    const any_tensor& indices = c.input(1);
    const gather_nd_layout l = gather_nd_layout_of(c.node, params.shape(), indices.shape());
    const std::vector<std::int64_t> rows = gather_nd_slices(c.node, indices, params.shape(), l);
    c.output = any_tensor(params.type(), l.out);
    const T* in = params.data<T>();
    T* out = c.output.data<T>();
    const std::int64_t slice = l.slice;
    parallel_for(c.device, l.tuples,
                 Eigen::TensorOpCost(static_cast<double>(slice * sizeof(T)),
                                     static_cast<double>(slice * sizeof(T)), 0),
                 [&](Eigen::Index first, Eigen::Index last) {
                   for (Eigen::Index t = first; t < last; ++t)
                     std::copy_n(in + rows[static_cast<std::size_t>(t)] * slice, slice,
                                 out + t * slice);
                 });
  }
};

template <class T> struct gather_nd_grad_cpu {
  static void run(kernel_context& c) {
    const any_tensor& dy = c.input(0);
    const any_tensor& indices = c.input(1);
    const loom::shape to = gather_nd_grad_shape(c.node, c.inputs);
    const gather_nd_layout l = gather_nd_layout_of(c.node, to, indices.shape());
    const std::vector<std::int64_t> rows = gather_nd_slices(c.node, indices, to, l);
    c.output = any_tensor(dy.type(), to);
    T* out = c.output.data<T>();
    std::fill_n(out, to.num_elements(), T(0));
    const T* in = dy.data<T>();
    for (std::int64_t t = 0; t < l.tuples; ++t) {
      T* row = out + rows[static_cast<std::size_t>(t)] * l.slice;
      const T* src = in + t * l.slice;
      for (std::int64_t j = 0; j < l.slice; ++j)
        row[j] += src[j];
    }
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_gather_nd_kernels() {
  register_kernels<gather_nd_cpu>("gather_nd", all_types_but_string{});
  register_kernels<gather_nd_grad_cpu>("gather_nd_grad", floating_types{});
  return true;
}

inline const bool gather_nd_kernels_registered = register_gather_nd_kernels();
#endif

} // namespace loom::kernels

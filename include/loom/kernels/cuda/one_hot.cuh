// GPU kernel of one_hot (kernels/cpu/one_hot.hpp on the CPU): a thread an element, the
// ids, on_value and off_value read where they are, on this GPU.
#pragma once

#include <loom/graph/ops/one_hot.hpp>
#include <loom/kernels/checks/array.hpp>
#include <loom/kernels/cuda/common.cuh>
#include <loom/kernels/registry.hpp>

#include <cstdint>

namespace loom::kernels::cuda_kernels {

template <class T, class I>
__global__ void one_hot_kernel(T* out, const I* ids, const T* on, const T* off, std::int64_t depth,
                               std::int64_t inner, std::int64_t total) {
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t i = e % inner, r = e / inner, o = r / depth, j = r % depth;
    out[e] = static_cast<std::int64_t>(ids[o * inner + i]) == j ? *on : *off;
  }
}

template <class T> struct one_hot_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& ids = c.input(0);
    const detail::one_hot_attrs& a = c.decoded<detail::one_hot_attrs>();
    c.output = g.allocate(dtype_of<T>, detail::one_hot_shape(c.node, a, ids.shape()));
    const std::int64_t total = c.output.num_elements();
    if (total == 0)
      return;
    const axis_layout l = layout_around(c.output.shape(), a.axis < 0 ? c.output.shape().rank() - 1
                                                                     : static_cast<int>(a.axis));
    auto launch = [&](const auto* id) {
      one_hot_kernel<<<grid_for(total), block_threads, 0, g.stream>>>(
          c.output.template device_data<T>(), id, c.input(1).template device_data<T>(),
          c.input(2).template device_data<T>(), l.count, l.inner, total);
    };
    if (ids.type() == dtype::i32)
      launch(ids.template device_data<std::int32_t>());
    else
      launch(ids.template device_data<std::int64_t>());
    check_launch();
  }
};

inline const bool one_hot_gpu_registered =
    register_kernels<one_hot_gpu>("one_hot", all_types_but_string{}, device_gpu);

} // namespace loom::kernels::cuda_kernels

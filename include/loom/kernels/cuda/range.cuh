// GPU kernel of range (kernels/cpu/range.hpp on the CPU): the output's length depends on the
// three scalars' values, so they are copied to the host (one synchronisation), checked with
// the CPU's message, and the elements written by a thread each.
#pragma once

#include <loom/graph/ops/range.hpp>
#include <loom/kernels/cuda/common.cuh>
#include <loom/kernels/cuda/ids.cuh> // download
#include <loom/kernels/registry.hpp>

#include <cstdint>

namespace loom::kernels::cuda_kernels {

template <class T> __global__ void range_kernel(T* out, T start, T delta, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] = static_cast<T>(start + static_cast<T>(i) * delta);
}

template <class T> struct range_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const T start = *download(g, c.input(0)).template data<T>();
    const T limit = *download(g, c.input(1)).template data<T>();
    const T delta = *download(g, c.input(2)).template data<T>();
    const std::int64_t size = loom::detail::range_length<T>(c.node, start, limit, delta);
    c.output = g.allocate(dtype_of<T>, loom::shape{size});
    if (size == 0)
      return;
    range_kernel<T><<<grid_for(size), block_threads, 0, g.stream>>>(
        c.output.template device_data<T>(), start, delta, size);
    check_launch();
  }
};

inline const bool range_gpu_registered =
    register_kernels<range_gpu>("range", numeric_types{}, device_gpu);

} // namespace loom::kernels::cuda_kernels

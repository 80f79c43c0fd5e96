// GPU kernels of gather_nd and gather_nd_grad (kernels/cpu/gather_nd.hpp on the CPU). The
// indices are copied to the host on the kernel's stream (one synchronisation, as every GPU
// kernel that takes ids: kernels/cuda/ids.cuh), checked with the CPU's message and turned into
// slice numbers there, which go back to the GPU; then a thread an element copies (gather_nd),
// or the slices of dy are summed per slice number in the tuples' order, with no atomics
// (gather_nd_grad: array.cuh's segment sum over CUB's grouping).
#pragma once

#include <loom/kernels/checks/gather_nd.hpp>
#include <loom/kernels/cuda/array.cuh>
#include <loom/kernels/cuda/common.cuh>
#include <loom/kernels/cuda/ids.cuh>
#include <loom/kernels/registry.hpp>

#include <cstdint>
#include <vector>

namespace loom::kernels::cuda_kernels {

template <class T>
__global__ void gather_slices_kernel(T* out, const T* in, const std::int64_t* rows,
                                     std::int64_t slice, std::int64_t total) {
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t t = e / slice, j = e - t * slice;
    out[e] = in[rows[t] * slice + j];
  }
}

template <class T> struct gather_nd_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& params = c.input(0);
    const any_tensor& indices = c.input(1);
    const gather_nd_layout l =
        loom::kernels::gather_nd_layout_of(c.node, params.shape(), indices.shape());
    const std::vector<std::int64_t> rows =
        loom::kernels::gather_nd_slices(c.node, download(g, indices), params.shape(), l);
    c.output = g.allocate(params.type(), l.out);
    const std::int64_t total = l.tuples * l.slice;
    if (total == 0)
      return;
    const cuda::device_buffer<std::int64_t> dev_rows = upload(g, rows);
    gather_slices_kernel<T><<<grid_for(total), block_threads, 0, g.stream>>>(
        c.output.template device_data<T>(), params.template device_data<T>(), dev_rows.data(),
        l.slice, total);
    check_launch();
  }
};

template <class T> struct gather_nd_grad_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& dy = c.input(0);
    const any_tensor& indices = c.input(1);
    const loom::shape to = loom::kernels::gather_nd_grad_shape(c.node, c.inputs);
    const gather_nd_layout l = loom::kernels::gather_nd_layout_of(c.node, to, indices.shape());
    const std::vector<std::int64_t> rows =
        loom::kernels::gather_nd_slices(c.node, download(g, indices), to, l);
    const any_tensor ids = g.upload(any_tensor::from_vector(loom::shape{l.tuples}, rows));
    // dy as [tuples, slice] summed into zeros of [slices, slice] at the slice numbers.
    const loom::shape dense{l.slices, l.slice};
    sum_rows_into_zeros<T>(c, dy, ids, dense, layout_around(dense, 0));
    c.output = c.output.reshaped(to);
  }
};

inline bool register_gather_nd_gpu() {
  register_kernels<gather_nd_gpu>("gather_nd", all_types_but_string{}, device_gpu);
  register_kernels<gather_nd_grad_gpu>("gather_nd_grad", floating_types{}, device_gpu);
  return true;
}

inline const bool gather_nd_gpu_registered = register_gather_nd_gpu();

} // namespace loom::kernels::cuda_kernels

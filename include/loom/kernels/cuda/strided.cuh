// GPU kernels of the strided ops (kernels/cpu/strided.hpp on the CPU): transpose,
// strided_slice and its gradient, pad, tile, for the CPU's dtypes but strings. They
// plan the CPU's strided copy (kernels/checks/strided.hpp) on the host and run it here,
// a thread an element, instantiated per element width, not per dtype.
#pragma once

#include <loom/kernels/checks/strided.hpp>
#include <loom/kernels/cuda/array.cuh>
#include <loom/kernels/cuda/common.cuh>
#include <loom/kernels/registry.hpp>

#include <cstdint>
#include <vector>

namespace loom::kernels::cuda_kernels {

// A strided copy as a kernel argument: by value, its dimensions in fixed arrays.
struct strided_copy_args {
  int dims = 0;
  std::int64_t count[max_strided_dims], src_stride[max_strided_dims], dst_stride[max_strided_dims];
  std::int64_t src_base = 0, dst_base = 0;
};

template <class T>
__global__ void strided_copy_kernel(T* dst, const T* src, strided_copy_args a, std::int64_t total) {
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    std::int64_t r = e, s = a.src_base, d = a.dst_base;
    for (int dim = a.dims - 1; dim >= 0; --dim) {
      const std::int64_t i = r % a.count[dim];
      r /= a.count[dim];
      s += i * a.src_stride[dim];
      d += i * a.dst_stride[dim];
    }
    dst[d] = src[s];
  }
}

// out[0, n) = *value, a scalar already on this GPU.
template <class T> __global__ void fill_from_kernel(T* out, std::int64_t n, const T* value) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] = *value;
}

template <class T>
void run_strided_copy(const gpu_context& g, const strided_copy& c, const T* src, T* dst) {
  const std::int64_t total = c.total();
  if (total == 0)
    return;
  strided_copy_args a;
  a.dims = static_cast<int>(c.count.size());
  for (std::size_t d = 0; d < c.count.size(); ++d) {
    a.count[d] = c.count[d];
    a.src_stride[d] = c.src_stride[d];
    a.dst_stride[d] = c.dst_stride[d];
  }
  a.src_base = c.src_base;
  a.dst_base = c.dst_base;
  strided_copy_kernel<same_width<T>>
      <<<grid_for(total), block_threads, 0, g.stream>>>(as_width(dst), as_width(src), a, total);
  check_launch();
}

template <class T> struct transpose_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& x = c.input(0);
    check_strided_rank(c.node, x.shape());
    const std::vector<int> perm = detail::checked_perm(c.node, x.shape());
    c.output = g.allocate(x.type(), detail::transposed_shape(x.shape(), perm));
    run_strided_copy(g, transpose_copy(x.shape(), perm), x.template device_data<T>(),
                     c.output.template device_data<T>());
  }
};

template <class T> struct strided_slice_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& x = c.input(0);
    check_strided_rank(c.node, x.shape());
    const detail::resolved_slice r =
        detail::resolve_slice(c.node, c.decoded<detail::strided_slice_attrs>(), x.shape());
    c.output = g.allocate(x.type(), r.out);
    run_strided_copy(g, slice_copy(x.shape(), r, false), x.template device_data<T>(),
                     c.output.template device_data<T>());
  }
};

template <class T> struct strided_slice_grad_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& dy = c.input(0);
    const slice_grad_attrs& a = c.decoded<slice_grad_attrs>();
    const loom::shape x = c.inputs.size() == 2 ? c.input(1).shape() : loom::shape(a.shape);
    check_strided_rank(c.node, x);
    const detail::resolved_slice r = detail::resolve_slice(c.node, a.slice, x);
    check_slice_grad(c.node, dy, r);
    c.output = g.allocate(dy.type(), x);
    T* out = c.output.template device_data<T>();
    fill<same_width<T>>(g, as_width(out), c.output.num_elements(), 0);
    run_strided_copy(g, slice_copy(x, r, true), dy.template device_data<T>(), out);
  }
};

template <class T> struct pad_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& x = c.input(0);
    check_strided_rank(c.node, x.shape());
    const auto paddings = detail::checked_paddings(c.node, x.shape());
    c.output = g.allocate(x.type(), detail::padded_shape(x.shape(), paddings));
    T* out = c.output.template device_data<T>();
    if (const std::int64_t n = c.output.num_elements(); n > 0) {
      fill_from_kernel<same_width<T>><<<grid_for(n), block_threads, 0, g.stream>>>(
          as_width(out), n, as_width(c.input(1).template device_data<T>()));
      check_launch();
    }
    run_strided_copy(g, pad_copy(x.shape(), c.output.shape(), paddings),
                     x.template device_data<T>(), out);
  }
};

template <class T> struct tile_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& x = c.input(0);
    check_strided_rank(c.node, x.shape());
    const auto multiples = detail::checked_multiples(c.node, x.shape());
    c.output = g.allocate(x.type(), detail::tiled_shape(x.shape(), multiples));
    run_strided_copy(g, tile_copy(x.shape(), multiples), x.template device_data<T>(),
                     c.output.template device_data<T>());
  }
};

inline bool register_strided_gpu() {
  register_kernels<transpose_gpu>("transpose", all_types_but_string{}, device_gpu);
  register_kernels<strided_slice_gpu>("strided_slice", all_types_but_string{}, device_gpu);
  register_kernels<strided_slice_grad_gpu>("strided_slice_grad", all_types_but_string{},
                                           device_gpu);
  register_kernels<pad_gpu>("pad", all_types_but_string{}, device_gpu);
  register_kernels<tile_gpu>("tile", all_types_but_string{}, device_gpu);
  return true;
}

inline const bool strided_gpu_registered = register_strided_gpu();

} // namespace loom::kernels::cuda_kernels

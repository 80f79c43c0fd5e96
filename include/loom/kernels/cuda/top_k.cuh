// GPU kernels of top_k (kernels/cpu/top_k.hpp on the CPU). top_k_indices: a thread per
// element counts the elements of its row that come before it in TF's order (larger, or equal
// at a lower position) and, where that rank is below k, writes its position there: exact,
// deterministic, no sort, O(n) work per element (meant for rows of up to some thousands, a
// model's classes or candidates). top_k_values and top_k_grad move elements by the indices,
// which are first copied to the host and checked with the CPU's message (one synchronisation);
// the gradient a thread per input element, summing the dy its row gives it (no atomics).
#pragma once

#include <loom/kernels/checks/top_k.hpp>
#include <loom/kernels/cuda/common.cuh>
#include <loom/kernels/cuda/ids.cuh> // download
#include <loom/kernels/registry.hpp>

#include <cstdint>

namespace loom::kernels::cuda_kernels {

template <class T>
__global__ void top_k_rank_kernel(std::int32_t* out, const T* in, std::int64_t cols, std::int64_t k,
                                  std::int64_t total) {
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t row = e / cols, j = e - row * cols;
    const T* v = in + row * cols;
    const T mine = v[j];
    std::int64_t rank = 0;
    for (std::int64_t a = 0; a < cols && rank < k; ++a)
      rank += v[a] > mine || (v[a] == mine && a < j);
    if (rank < k)
      out[row * k + rank] = static_cast<std::int32_t>(j);
  }
}

template <class T> struct top_k_indices_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& x = c.input(0);
    const std::int64_t k = c.decoded<top_k_attrs>().k;
    c.output = g.allocate(dtype::i32, loom::detail::top_k_shape(c.node, x.shape(), k));
    const top_k_rows r = loom::kernels::rows_of(x.shape());
    const std::int64_t total = r.rows * r.cols;
    if (k == 0 || total == 0)
      return;
    top_k_rank_kernel<T><<<grid_for(total), block_threads, 0, g.stream>>>(
        c.output.template device_data<std::int32_t>(), x.template device_data<T>(), r.cols, k,
        total);
    check_launch();
  }
};

// The indices checked on the host: their rows and k.
inline top_k_rows checked_selection(const gpu_context& g, const node_def& n, const loom::shape& x,
                                    const any_tensor& indices) {
  loom::kernels::check_selection(n, x, indices.shape());
  const top_k_rows r = loom::kernels::rows_of(x);
  const any_tensor host = download(g, indices);
  loom::kernels::check_positions(n, host.data<std::int32_t>(), host.num_elements(), r.cols);
  return r;
}

// out[row, j] = in[row, idx[row, j]].
template <class T>
__global__ void select_kernel(T* out, const T* in, const std::int32_t* idx, std::int64_t cols,
                              std::int64_t k, std::int64_t total) {
  for (std::int64_t e = global_thread(); e < total; e += grid_threads())
    out[e] = in[(e / k) * cols + idx[e]];
}

// out[row, col] = the sum of dy[row, j] over the j (ascending, the CPU's order) whose index is
// col: a thread per output element, so a position named twice sums as on the CPU.
template <class T>
__global__ void unselect_kernel(T* out, const T* dy, const std::int32_t* idx, std::int64_t cols,
                                std::int64_t k, std::int64_t total) {
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t row = e / cols, col = e - row * cols;
    T sum = T(0);
    for (std::int64_t j = 0; j < k; ++j)
      if (idx[row * k + j] == col)
        sum += dy[row * k + j];
    out[e] = sum;
  }
}

template <class T> struct top_k_values_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& x = c.input(0);
    const any_tensor& indices = c.input(1);
    const top_k_rows r = checked_selection(g, c.node, x.shape(), indices);
    c.output = g.allocate(x.type(), indices.shape());
    const std::int64_t total = indices.num_elements();
    if (total == 0)
      return;
    select_kernel<T><<<grid_for(total), block_threads, 0, g.stream>>>(
        c.output.template device_data<T>(), x.template device_data<T>(),
        indices.template device_data<std::int32_t>(), r.cols, total / r.rows, total);
    check_launch();
  }
};

template <class T> struct top_k_grad_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& dy = c.input(0);
    const any_tensor& indices = c.input(1);
    const loom::shape& to = c.input(2).shape();
    const top_k_rows r = checked_selection(g, c.node, to, indices);
    if (dy.shape() != indices.shape())
      throw invalid_argument_error(
          "node " + c.node.describe() + ": dy of shape " + dy.shape().to_string() +
          " does not match the indices of shape " + indices.shape().to_string());
    c.output = g.allocate(dy.type(), to);
    const std::int64_t total = to.num_elements();
    if (total == 0)
      return;
    const std::int64_t k = indices.rank() ? indices.shape()[indices.rank() - 1] : 0;
    unselect_kernel<T><<<grid_for(total), block_threads, 0, g.stream>>>(
        c.output.template device_data<T>(), dy.template device_data<T>(),
        indices.template device_data<std::int32_t>(), r.cols, k, total);
    check_launch();
  }
};

inline bool register_top_k_gpu() {
  register_kernels<top_k_indices_gpu>("top_k_indices", numeric_types{}, device_gpu);
  register_kernels<top_k_values_gpu>("top_k_values", numeric_types{}, device_gpu);
  register_kernels<top_k_grad_gpu>("top_k_grad", floating_types{}, device_gpu);
  return true;
}

inline const bool top_k_gpu_registered = register_top_k_gpu();

} // namespace loom::kernels::cuda_kernels

// CPU kernels of top_k (graph/ops/top_k.hpp): per row, a partial sort of the positions by
// (value descending, position ascending), TF's order; the values and the gradient move
// elements by those positions. Rows are split over the pool.
#pragma once

#include <loom/kernels/checks/top_k.hpp>
#include <loom/kernels/cpu/parallel_for.hpp>
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace loom::kernels {

template <class T> struct top_k_indices_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const std::int64_t k = c.decoded<top_k_attrs>().k;
    c.output = any_tensor(dtype::i32, detail::top_k_shape(c.node, x.shape(), k));
    const top_k_rows r = rows_of(x.shape());
    if (k == 0 || r.rows == 0)
      return;
    const T* in = x.data<T>();
    std::int32_t* out = c.output.data<std::int32_t>();
    parallel_for(c.device, r.rows,
                 Eigen::TensorOpCost(static_cast<double>(r.cols * sizeof(T)),
                                     static_cast<double>(k * 4), static_cast<double>(r.cols * 8)),
                 [&](Eigen::Index first, Eigen::Index last) {
                   std::vector<std::int32_t> order(static_cast<std::size_t>(r.cols));
                   for (Eigen::Index row = first; row < last; ++row) {
                     const T* v = in + row * r.cols;
                     std::iota(order.begin(), order.end(), 0);
                     std::partial_sort(order.begin(), order.begin() + k, order.end(),
                                       [v](std::int32_t a, std::int32_t b) {
                                         return v[a] > v[b] || (v[a] == v[b] && a < b);
                                       });
                     std::copy_n(order.begin(), k, out + row * k);
                   }
                 });
  }
};

// The indices of a selection, checked against x [..., n]: its rows and k.
inline top_k_rows checked_selection(const node_def& n, const loom::shape& x,
                                    const any_tensor& indices) {
  check_selection(n, x, indices.shape());
  const top_k_rows r = rows_of(x);
  check_positions(n, indices.data<std::int32_t>(), indices.num_elements(), r.cols);
  return r;
}

template <class T> struct top_k_values_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const any_tensor& indices = c.input(1);
    const top_k_rows r = checked_selection(c.node, x.shape(), indices);
    c.output = any_tensor(x.type(), indices.shape());
    const std::int64_t k = indices.rank() ? indices.shape()[indices.rank() - 1] : 0;
    const T* in = x.data<T>();
    const std::int32_t* idx = indices.data<std::int32_t>();
    T* out = c.output.data<T>();
    for (std::int64_t row = 0; row < r.rows; ++row)
      for (std::int64_t j = 0; j < k; ++j)
        out[row * k + j] = in[row * r.cols + idx[row * k + j]];
  }
};

template <class T> struct top_k_grad_cpu {
  static void run(kernel_context& c) {
    const any_tensor& dy = c.input(0);
    const any_tensor& indices = c.input(1);
    const loom::shape& to = c.input(2).shape();
    const top_k_rows r = checked_selection(c.node, to, indices);
    if (dy.shape() != indices.shape())
      throw invalid_argument_error(
          "node " + c.node.describe() + ": dy of shape " + dy.shape().to_string() +
          " does not match the indices of shape " + indices.shape().to_string());
    c.output = any_tensor(dy.type(), to);
    T* out = c.output.data<T>();
    std::fill_n(out, to.num_elements(), T(0));
    const std::int64_t k = indices.rank() ? indices.shape()[indices.rank() - 1] : 0;
    const T* d = dy.data<T>();
    const std::int32_t* idx = indices.data<std::int32_t>();
    for (std::int64_t row = 0; row < r.rows; ++row)
      for (std::int64_t j = 0; j < k; ++j)
        out[row * r.cols + idx[row * k + j]] += d[row * k + j];
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_top_k_kernels() {
  register_kernels<top_k_indices_cpu>("top_k_indices", numeric_types{});
  register_kernels<top_k_values_cpu>("top_k_values", numeric_types{});
  register_kernels<top_k_grad_cpu>("top_k_grad", floating_types{});
  return true;
}

inline const bool top_k_kernels_registered = register_top_k_kernels();
#endif

} // namespace loom::kernels

// GPU kernels of softmax, log_softmax, the cross-entropies and their gradients
// (kernels/cpu/nn.hpp on the CPU). Each works row by row over the last axis, a
// block per row (grid-stride over rows), with block reductions for the row's
// maximum and sums; every row subtracts its maximum first, as on the CPU.
//
// One difference: the CPU kernels of the sparse cross-entropies check every
// label against the class count and throw. Here the labels are in device
// memory, and reading them back would stall the stream every step, so a row
// whose label is out of range gets NaN instead (TF's GPU kernels do the same).
// The labels' shape and dtype are still checked on the host, with the CPU's
// messages.
#pragma once

#include <loom/kernels/checks/nn.hpp>
#include <loom/kernels/cuda/common.cuh>
#include <loom/kernels/cuda/expression.cuh>
#include <loom/kernels/registry.hpp>

#include <cstdint>
#include <limits>
#include <string>

namespace loom::kernels::cuda_kernels {

// Threads per row: a warp for short rows, up to a full block for long ones.
inline int row_threads(std::int64_t cols) {
  return cols <= 32 ? 32 : cols <= 128 ? 64 : cols <= 512 ? 128 : block_threads;
}

// Shared scratch for block_reduce of T.
#define LOOM_ROW_SCRATCH(T)                                                                        \
  __shared__ alignas(8) unsigned char scratch_bytes[32 * sizeof(T)];                               \
  T* scratch = reinterpret_cast<T*>(scratch_bytes)

// The row's maximum and sum of exp(x - max), every thread of the block.
template <class T>
__device__ inline void row_max_sum(const T* x, std::int64_t cols, T* scratch, T& m, T& sum) {
  m = -std::numeric_limits<T>::infinity();
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    m = max_op{}(m, x[j]);
  m = block_reduce(m, max_op{}, scratch);
  sum = T(0);
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    sum += ops::scalar::exp(T(x[j] - m));
  sum = block_reduce(sum, sum_op{}, scratch);
}

template <class T>
__global__ void softmax_kernel(const T* x, T* y, std::int64_t rows, std::int64_t cols, bool log) {
  LOOM_ROW_SCRATCH(T);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    T m, sum;
    row_max_sum(xr, cols, scratch, m, sum);
    const T lse = ops::scalar::log(sum);
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      yr[j] = log ? T((xr[j] - m) - lse) : T(ops::scalar::exp(T(xr[j] - m)) / sum);
  }
}

// softmax: y (dy - sum(dy y)); log_softmax: dy - exp(y) sum(dy).
template <class T>
__global__ void softmax_grad_kernel(const T* y, const T* dy, T* out, std::int64_t rows,
                                    std::int64_t cols, bool log) {
  LOOM_ROW_SCRATCH(T);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* yr = y + r * cols;
    const T* g = dy + r * cols;
    T* o = out + r * cols;
    T s = T(0);
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      s += log ? g[j] : T(g[j] * yr[j]);
    s = block_reduce(s, sum_op{}, scratch);
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      o[j] = log ? T(g[j] - ops::scalar::exp(yr[j]) * s) : T(yr[j] * (g[j] - s));
  }
}

// loss = sum(labels (lse - (x - max))).
template <class T>
__global__ void xent_kernel(const T* labels, const T* x, T* out, std::int64_t rows,
                            std::int64_t cols) {
  LOOM_ROW_SCRATCH(T);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    const T* lr = labels + r * cols;
    T m, sum;
    row_max_sum(xr, cols, scratch, m, sum);
    const T lse = ops::scalar::log(sum);
    T loss = T(0);
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      loss += lr[j] * (lse - (xr[j] - m));
    loss = block_reduce(loss, sum_op{}, scratch);
    if (threadIdx.x == 0)
      out[r] = loss;
  }
}

// wrt logits: dy (softmax - labels); wrt labels: dy (lse - (x - max)).
template <class T>
__global__ void xent_grad_kernel(const T* dy, const T* labels, const T* x, T* out,
                                 std::int64_t rows, std::int64_t cols, bool wrt_labels) {
  LOOM_ROW_SCRATCH(T);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    const T* lr = labels + r * cols;
    T* o = out + r * cols;
    T m, sum;
    row_max_sum(xr, cols, scratch, m, sum);
    const T lse = ops::scalar::log(sum), d = dy[r];
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      o[j] = wrt_labels ? T(d * (lse - (xr[j] - m)))
                        : T(d * (ops::scalar::exp(T(xr[j] - m)) / sum - lr[j]));
  }
}

// loss = lse - (x[label] - max); NaN for a label outside [0, cols).
template <class T, class L>
__global__ void sparse_xent_kernel(const L* labels, const T* x, T* out, std::int64_t rows,
                                   std::int64_t cols) {
  LOOM_ROW_SCRATCH(T);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    T m, sum;
    row_max_sum(xr, cols, scratch, m, sum);
    if (threadIdx.x == 0) {
      const auto label = static_cast<std::int64_t>(labels[r]);
      out[r] = label < 0 || label >= cols ? std::numeric_limits<T>::quiet_NaN()
                                          : T(ops::scalar::log(sum) - (xr[label] - m));
    }
  }
}

// dy (softmax - one_hot(label)); a row of NaN for a label outside [0, cols).
template <class T, class L>
__global__ void sparse_xent_grad_kernel(const T* dy, const L* labels, const T* x, T* out,
                                        std::int64_t rows, std::int64_t cols) {
  LOOM_ROW_SCRATCH(T);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    T* o = out + r * cols;
    T m, sum;
    row_max_sum(xr, cols, scratch, m, sum);
    const auto label = static_cast<std::int64_t>(labels[r]);
    const bool bad = label < 0 || label >= cols;
    const T scale = dy[r] / sum;
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      T v = ops::scalar::exp(T(xr[j] - m)) * scale;
      if (j == label)
        v -= dy[r];
      o[j] = bad ? std::numeric_limits<T>::quiet_NaN() : v;
    }
  }
}

#undef LOOM_ROW_SCRATCH

// Launches a row kernel: a block per row (at most max_blocks, striding), sized to the row.
template <class K, class... A>
void launch_rows(const gpu_context& g, row_layout l, K kernel, A... args) {
  if (l.rows == 0)
    return;
  kernel<<<static_cast<unsigned>(std::min(l.rows, max_blocks)), row_threads(l.cols), 0, g.stream>>>(
      args...);
  check_launch();
}

template <class T> struct softmax_gpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const row_layout l = rows_of(c.node, x);
    const gpu_context& g = gpu_of(c);
    c.output = g.allocate(x.type(), x.shape());
    if (l.cols == 0)
      return;
    launch_rows(g, l, softmax_kernel<T>, x.template device_data<T>(),
                c.output.template device_data<T>(), l.rows, l.cols, c.node.op == "log_softmax");
  }
};

// Inputs (y, dy).
template <class T> struct softmax_grad_gpu {
  static void run(kernel_context& c) {
    const any_tensor& y = c.input(0);
    const any_tensor& dy = c.input(1);
    check_same_shape(c.node, y, "the output", dy, "its gradient");
    const row_layout l = rows_of(c.node, y);
    const gpu_context& g = gpu_of(c);
    c.output = g.allocate(y.type(), y.shape());
    if (l.cols == 0)
      return;
    launch_rows(g, l, softmax_grad_kernel<T>, y.template device_data<T>(),
                dy.template device_data<T>(), c.output.template device_data<T>(), l.rows, l.cols,
                c.node.op == "log_softmax_grad");
  }
};

// Inputs (labels, logits).
template <class T> struct xent_gpu {
  static void run(kernel_context& c) {
    const any_tensor& labels = c.input(0);
    const any_tensor& logits = c.input(1);
    check_same_shape(c.node, labels, "labels", logits, "logits");
    const row_layout l = rows_of(c.node, logits);
    const gpu_context& g = gpu_of(c);
    c.output = g.allocate(logits.type(), detail::without_last(logits.shape()));
    if (l.cols == 0) { // an empty sum per row
      fill<T>(g, c.output.template device_data<T>(), l.rows, T(0));
      return;
    }
    launch_rows(g, l, xent_kernel<T>, labels.template device_data<T>(),
                logits.template device_data<T>(), c.output.template device_data<T>(), l.rows,
                l.cols);
  }
};

// Inputs (dy, labels, logits).
template <class T> struct xent_grad_gpu {
  static void run(kernel_context& c) {
    const any_tensor& dy = c.input(0);
    const any_tensor& labels = c.input(1);
    const any_tensor& logits = c.input(2);
    check_same_shape(c.node, labels, "labels", logits, "logits");
    check_per_row(c.node, dy, logits);
    const row_layout l = rows_of(c.node, logits);
    const gpu_context& g = gpu_of(c);
    c.output = g.allocate(logits.type(), logits.shape());
    if (l.cols == 0)
      return;
    launch_rows(g, l, xent_grad_kernel<T>, dy.template device_data<T>(),
                labels.template device_data<T>(), logits.template device_data<T>(),
                c.output.template device_data<T>(), l.rows, l.cols,
                c.node.attr_or<std::string>("wrt", "logits") == "labels");
  }
};

// Inputs (labels, logits).
template <class T> struct sparse_xent_gpu {
  static void run(kernel_context& c) {
    const any_tensor& labels = c.input(0);
    const any_tensor& logits = c.input(1);
    const row_layout l = rows_of(c.node, logits);
    check_sparse_labels(c.node, labels, logits);
    const gpu_context& g = gpu_of(c);
    c.output = g.allocate(logits.type(), detail::without_last(logits.shape()));
    T* out = c.output.template device_data<T>();
    if (labels.type() == dtype::i32)
      launch_rows(g, l, sparse_xent_kernel<T, std::int32_t>,
                  labels.template device_data<std::int32_t>(), logits.template device_data<T>(),
                  out, l.rows, l.cols);
    else
      launch_rows(g, l, sparse_xent_kernel<T, std::int64_t>,
                  labels.template device_data<std::int64_t>(), logits.template device_data<T>(),
                  out, l.rows, l.cols);
  }
};

// Inputs (dy, labels, logits).
template <class T> struct sparse_xent_grad_gpu {
  static void run(kernel_context& c) {
    const any_tensor& dy = c.input(0);
    const any_tensor& labels = c.input(1);
    const any_tensor& logits = c.input(2);
    check_per_row(c.node, dy, logits);
    const row_layout l = rows_of(c.node, logits);
    check_sparse_labels(c.node, labels, logits);
    const gpu_context& g = gpu_of(c);
    c.output = g.allocate(logits.type(), logits.shape());
    if (l.cols == 0)
      return;
    T* out = c.output.template device_data<T>();
    if (labels.type() == dtype::i32)
      launch_rows(g, l, sparse_xent_grad_kernel<T, std::int32_t>, dy.template device_data<T>(),
                  labels.template device_data<std::int32_t>(), logits.template device_data<T>(),
                  out, l.rows, l.cols);
    else
      launch_rows(g, l, sparse_xent_grad_kernel<T, std::int64_t>, dy.template device_data<T>(),
                  labels.template device_data<std::int64_t>(), logits.template device_data<T>(),
                  out, l.rows, l.cols);
  }
};

inline bool register_nn_gpu() {
  register_kernels<softmax_gpu>("softmax", floating_types{}, device_gpu);
  register_kernels<softmax_gpu>("log_softmax", floating_types{}, device_gpu);
  register_kernels<softmax_grad_gpu>("softmax_grad", floating_types{}, device_gpu);
  register_kernels<softmax_grad_gpu>("log_softmax_grad", floating_types{}, device_gpu);
  register_kernels<xent_gpu>("softmax_cross_entropy_with_logits", floating_types{}, device_gpu);
  register_kernels<xent_grad_gpu>("xent_grad", floating_types{}, device_gpu);
  register_kernels<sparse_xent_gpu>("sparse_softmax_cross_entropy_with_logits", floating_types{},
                                    device_gpu);
  register_kernels<sparse_xent_grad_gpu>("sparse_xent_grad", floating_types{}, device_gpu);
  return true;
}

inline const bool nn_gpu_registered = register_nn_gpu();

} // namespace loom::kernels::cuda_kernels

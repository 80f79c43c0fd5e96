// CPU kernels of softmax, log_softmax, the cross-entropies and their
// gradients. Each works row by row over the last axis (rows split over the
// thread pool), with Eigen's vectorised exp; every row subtracts its maximum
// first, so large logits never overflow.
#pragma once

#include <loom/kernels/checks/nn.hpp>
#include <loom/kernels/cpu/parallel_for.hpp>
#include <loom/kernels/registry.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::kernels {

template <class T> using row_array = Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>>;
template <class T> using const_row_array = Eigen::Map<const Eigen::Array<T, 1, Eigen::Dynamic>>;

// Runs f(row) for every row, split over the pool; `cycles` is the work per element.
template <class T, class F>
void for_each_row(const cpu_device& d, row_layout l, double cycles, F&& f) {
  if (l.rows == 0 || l.cols == 0)
    return;
  const double bytes = static_cast<double>(l.cols) * static_cast<double>(sizeof(T));
  parallel_for(d, l.rows,
               Eigen::TensorOpCost(2 * bytes, bytes, cycles * static_cast<double>(l.cols)),
               [&](Eigen::Index first, Eigen::Index last) {
                 for (Eigen::Index r = first; r < last; ++r)
                   f(r);
               });
}

// Cycles per element of a row pass with exp (Eigen's vectorised exp is ~10-20).
inline constexpr double exp_cycles = 20;

template <class T> struct softmax_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const row_layout l = rows_of(c.node, x);
    c.output = any_tensor(x.type(), x.shape());
    const T* in = x.data<T>();
    T* out = c.output.data<T>();
    const bool log = c.node.op == "log_softmax";
    for_each_row<T>(c.device, l, exp_cycles, [&](Eigen::Index r) {
      const_row_array<T> xr(in + r * l.cols, l.cols);
      row_array<T> y(out + r * l.cols, l.cols);
      y = xr - xr.maxCoeff();
      if (log)
        y -= std::log(y.exp().sum());
      else {
        y = y.exp();
        y /= y.sum();
      }
    });
  }
};

// Inputs (y, dy). softmax: y (dy - sum(dy y)); log_softmax: dy - exp(y) sum(dy).
template <class T> struct softmax_grad_cpu {
  static void run(kernel_context& c) {
    const any_tensor& y = c.input(0);
    const any_tensor& dy = c.input(1);
    check_same_shape(c.node, y, "the output", dy, "its gradient");
    const row_layout l = rows_of(c.node, y);
    c.output = any_tensor(y.type(), y.shape());
    const T* py = y.data<T>();
    const T* pdy = dy.data<T>();
    T* out = c.output.data<T>();
    const bool log = c.node.op == "log_softmax_grad";
    for_each_row<T>(c.device, l, log ? exp_cycles : 4, [&](Eigen::Index r) {
      const_row_array<T> yr(py + r * l.cols, l.cols);
      const_row_array<T> g(pdy + r * l.cols, l.cols);
      row_array<T> o(out + r * l.cols, l.cols);
      if (log)
        o = g - yr.exp() * g.sum();
      else
        o = yr * (g - (g * yr).sum());
    });
  }
};

// Inputs (labels, logits): loss = sum(labels (lse - s)), s = logits - max.
template <class T> struct xent_cpu {
  static void run(kernel_context& c) {
    const any_tensor& labels = c.input(0);
    const any_tensor& logits = c.input(1);
    check_same_shape(c.node, labels, "labels", logits, "logits");
    const row_layout l = rows_of(c.node, logits);
    c.output = any_tensor(logits.type(), detail::without_last(logits.shape()));
    T* out = c.output.data<T>();
    if (l.cols == 0)
      std::fill_n(out, l.rows, T(0));
    const T* pl = labels.data<T>();
    const T* px = logits.data<T>();
    for_each_row<T>(c.device, l, exp_cycles, [&](Eigen::Index r) {
      const_row_array<T> lab(pl + r * l.cols, l.cols);
      const_row_array<T> x(px + r * l.cols, l.cols);
      const T m = x.maxCoeff();
      const T lse = std::log((x - m).exp().sum());
      out[r] = (lab * (lse - (x - m))).sum();
    });
  }
};

// Inputs (dy, labels, logits). wrt logits: dy (softmax(logits) - labels);
// wrt labels: dy (lse - s) = -dy log_softmax(logits).
template <class T> struct xent_grad_cpu {
  static void run(kernel_context& c) {
    const any_tensor& dy = c.input(0);
    const any_tensor& labels = c.input(1);
    const any_tensor& logits = c.input(2);
    check_same_shape(c.node, labels, "labels", logits, "logits");
    check_per_row(c.node, dy, logits);
    const row_layout l = rows_of(c.node, logits);
    c.output = any_tensor(logits.type(), logits.shape());
    const T* pdy = dy.data<T>();
    const T* pl = labels.data<T>();
    const T* px = logits.data<T>();
    T* out = c.output.data<T>();
    const bool wrt_labels = c.node.attr_or<std::string>("wrt", "logits") == "labels";
    for_each_row<T>(c.device, l, exp_cycles, [&](Eigen::Index r) {
      const_row_array<T> lab(pl + r * l.cols, l.cols);
      const_row_array<T> x(px + r * l.cols, l.cols);
      row_array<T> o(out + r * l.cols, l.cols);
      const T m = x.maxCoeff();
      o = (x - m).exp();
      const T sum = o.sum();
      if (wrt_labels)
        o = pdy[r] * (std::log(sum) - (x - m));
      else
        o = pdy[r] * (o / sum - lab);
    });
  }
};

// Labels as int64, checked against the class count before any row runs (an
// exception must not escape a pool thread).
inline std::vector<std::int64_t> checked_labels(const node_def& n, const any_tensor& labels,
                                                const any_tensor& logits, row_layout l) {
  check_sparse_labels(n, labels, logits);
  std::vector<std::int64_t> out(static_cast<std::size_t>(l.rows));
  visit_dtype(labels.type(), [&]<class L>() {
    if constexpr (std::is_same_v<L, std::int32_t> || std::is_same_v<L, std::int64_t>) {
      const L* p = labels.data<L>();
      for (Eigen::Index r = 0; r < l.rows; ++r)
        out[static_cast<std::size_t>(r)] = p[r];
    }
  });
  for (Eigen::Index r = 0; r < l.rows; ++r) {
    const std::int64_t v = out[static_cast<std::size_t>(r)];
    if (v < 0 || v >= l.cols)
      throw invalid_argument_error("node " + n.describe() + ": label " + std::to_string(v) +
                                   " (at row " + std::to_string(r) +
                                   ") is outside the valid range [0, " + std::to_string(l.cols) +
                                   ") of logits of shape " + logits.shape().to_string());
  }
  return out;
}

// Inputs (labels, logits): loss = lse - s[label].
template <class T> struct sparse_xent_cpu {
  static void run(kernel_context& c) {
    const any_tensor& logits = c.input(1);
    const row_layout l = rows_of(c.node, logits);
    const auto labels = checked_labels(c.node, c.input(0), logits, l);
    c.output = any_tensor(logits.type(), detail::without_last(logits.shape()));
    const T* px = logits.data<T>();
    T* out = c.output.data<T>();
    for_each_row<T>(c.device, l, exp_cycles, [&](Eigen::Index r) {
      const_row_array<T> x(px + r * l.cols, l.cols);
      const T m = x.maxCoeff();
      out[r] = std::log((x - m).exp().sum()) - (x[labels[static_cast<std::size_t>(r)]] - m);
    });
  }
};

// Inputs (dy, labels, logits): dy (softmax(logits) - one_hot(label)).
template <class T> struct sparse_xent_grad_cpu {
  static void run(kernel_context& c) {
    const any_tensor& dy = c.input(0);
    const any_tensor& logits = c.input(2);
    check_per_row(c.node, dy, logits);
    const row_layout l = rows_of(c.node, logits);
    const auto labels = checked_labels(c.node, c.input(1), logits, l);
    c.output = any_tensor(logits.type(), logits.shape());
    const T* pdy = dy.data<T>();
    const T* px = logits.data<T>();
    T* out = c.output.data<T>();
    for_each_row<T>(c.device, l, exp_cycles, [&](Eigen::Index r) {
      const_row_array<T> x(px + r * l.cols, l.cols);
      row_array<T> o(out + r * l.cols, l.cols);
      o = (x - x.maxCoeff()).exp();
      o *= pdy[r] / o.sum();
      o[labels[static_cast<std::size_t>(r)]] -= pdy[r];
    });
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_nn_kernels() {
  register_kernels<softmax_cpu>("softmax", floating_types{});
  register_kernels<softmax_cpu>("log_softmax", floating_types{});
  register_kernels<softmax_grad_cpu>("softmax_grad", floating_types{});
  register_kernels<softmax_grad_cpu>("log_softmax_grad", floating_types{});
  register_kernels<xent_cpu>("softmax_cross_entropy_with_logits", floating_types{});
  register_kernels<xent_grad_cpu>("xent_grad", floating_types{});
  register_kernels<sparse_xent_cpu>("sparse_softmax_cross_entropy_with_logits", floating_types{});
  register_kernels<sparse_xent_grad_cpu>("sparse_xent_grad", floating_types{});
  return true;
}

inline const bool nn_kernels_registered = register_nn_kernels();
#endif

} // namespace loom::kernels

// The host-side part of fused batch normalization's kernels that the CPU's
// (kernels/cpu/batch_norm.hpp) and the GPU's (kernels/cuda/batch_norm.cuh) share: x seen as
// [rows, channels], and the run-time checks of the per-channel inputs, with their messages.
// Host code only, so nvcc compiles it too.
#pragma once

#include <loom/graph/ops/batch_norm.hpp>
#include <loom/kernels/checks/nn.hpp>
#include <loom/kernels/registry.hpp>

#include <cstdint>
#include <string>

namespace loom::kernels {

// x [..., C] as rows of C channels (checks/nn.hpp's rows_of): n = rows, the elements each
// channel's statistics cover.
struct channel_layout {
  std::int64_t rows = 0, channels = 0;
};

inline channel_layout channels_of(const node_def& n, const any_tensor& x) {
  const row_layout r = rows_of(n, x);
  return {r.rows, r.cols};
}

// A per-channel input: [C] of x's dtype.
inline void check_channel_vector(const node_def& n, const any_tensor& v, const channel_layout& l,
                                 const char* what) {
  if (v.shape() != loom::shape{l.channels})
    throw invalid_argument_error("node " + n.describe() + ": the " + what + " of shape " +
                                 v.shape().to_string() + " must be [" + std::to_string(l.channels) +
                                 "], one per channel");
}

// A [K, C] input (the moments, K = 3).
inline void check_channel_rows(const node_def& n, const any_tensor& m, std::int64_t rows,
                               const channel_layout& l, const char* what) {
  if (m.shape() != loom::shape{rows, l.channels})
    throw invalid_argument_error("node " + n.describe() + ": the " + what + " of shape " +
                                 m.shape().to_string() + " must be [" + std::to_string(rows) +
                                 ", " + std::to_string(l.channels) + "]");
}

inline void check_dy_like_x(const node_def& n, const any_tensor& dy, const any_tensor& x) {
  if (dy.shape() != x.shape())
    throw invalid_argument_error("node " + n.describe() + ": dy of shape " +
                                 dy.shape().to_string() + " does not match x of shape " +
                                 x.shape().to_string());
}

// fused_batch_norm's inputs (x, scale, offset, mean, variance): the four vectors of [C].
inline channel_layout checked_normalize_inputs(const kernel_context& c) {
  const channel_layout l = channels_of(c.node, c.input(0));
  const char* what[] = {"scale", "offset", "mean", "variance"};
  for (int i = 1; i < 5; ++i)
    check_channel_vector(c.node, c.input(i), l, what[i - 1]);
  return l;
}

// fused_batch_norm_grad_sums' inputs (dy, x, mean, variance).
inline channel_layout checked_grad_sums_inputs(const kernel_context& c) {
  check_dy_like_x(c.node, c.input(0), c.input(1));
  const channel_layout l = channels_of(c.node, c.input(1));
  check_channel_vector(c.node, c.input(2), l, "mean");
  check_channel_vector(c.node, c.input(3), l, "variance");
  return l;
}

// batch_norm_moments_grad's inputs (dm, x, moments).
inline channel_layout checked_moments_grad_inputs(const kernel_context& c) {
  const channel_layout l = channels_of(c.node, c.input(1));
  check_channel_rows(c.node, c.input(0), 3, l, "gradient of the moments");
  check_channel_rows(c.node, c.input(2), 3, l, "moments");
  return l;
}

// n / (n - 1), TF's correction of the reported variance; 1 where n <= 1.
inline double bessel_factor(std::int64_t n) {
  return n > 1 ? static_cast<double>(n) / static_cast<double>(n - 1) : 1.0;
}

} // namespace loom::kernels

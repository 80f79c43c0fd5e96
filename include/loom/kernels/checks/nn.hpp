// The host-side checks of softmax, the cross-entropies and their gradients
// that the CPU kernels (kernels/cpu/nn.hpp) and the GPU kernels
// (kernels/cuda/nn.cuh) share, with their messages, and the [rows, cols]
// layout both work in. Host code only (no Eigen evaluation), so nvcc compiles
// it too.
#pragma once

#include <loom/graph/ops/nn.hpp>
#include <loom/kernels/registry.hpp>

#include <cstdint>
#include <string>

namespace loom::kernels {

// A [rows, cols] view of a tensor of rank >= 1: cols is its last dimension.
struct row_layout {
  std::int64_t rows = 0, cols = 0;
};
inline row_layout rows_of(const node_def& n, const any_tensor& t) {
  if (t.rank() < 1)
    throw invalid_argument_error("node " + n.describe() + ": needs rank 1 or more, got shape " +
                                 t.shape().to_string());
  row_layout l;
  l.cols = t.shape()[t.rank() - 1];
  l.rows = l.cols == 0 ? detail::without_last(t.shape()).num_elements() : t.num_elements() / l.cols;
  return l;
}

inline void check_same_shape(const node_def& n, const any_tensor& a, const char* what_a,
                             const any_tensor& b, const char* what_b) {
  if (a.shape() != b.shape())
    throw invalid_argument_error("node " + n.describe() + ": " + what_a + " of shape " +
                                 a.shape().to_string() + " and " + what_b + " of shape " +
                                 b.shape().to_string() + " must have the same shape");
}

// dy of a per-row op must have one element per row.
inline void check_per_row(const node_def& n, const any_tensor& dy, const any_tensor& logits) {
  if (dy.shape() != detail::without_last(logits.shape()))
    throw invalid_argument_error("node " + n.describe() + ": the gradient of shape " +
                                 dy.shape().to_string() + " does not match logits of shape " +
                                 logits.shape().to_string());
}

// The sparse cross-entropies' labels: one per row of the logits, int32 or
// int64. Their values are checked by the CPU kernel only (the GPU's stay in
// device memory).
inline void check_sparse_labels(const node_def& n, const any_tensor& labels,
                                const any_tensor& logits) {
  if (labels.shape() != detail::without_last(logits.shape()))
    throw invalid_argument_error("node " + n.describe() + ": labels of shape " +
                                 labels.shape().to_string() + " do not match logits of shape " +
                                 logits.shape().to_string());
  if (labels.type() != dtype::i32 && labels.type() != dtype::i64)
    throw invalid_argument_error("node " + n.describe() + ": labels must be int32 or int64, not " +
                                 std::string(to_string(labels.type())));
}

} // namespace loom::kernels

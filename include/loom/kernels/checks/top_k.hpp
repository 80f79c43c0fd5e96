// The host-side part of top_k's kernels that the CPU's (kernels/cpu/top_k.hpp) and the GPU's
// (kernels/cuda/top_k.cuh) share: the attributes, the rows the input is seen as, and the checks
// of a selection's indices, with their messages. Host code only, so nvcc compiles it too.
#pragma once

#include <loom/graph/ops/top_k.hpp>
#include <loom/kernels/registry.hpp>

#include <cstdint>
#include <string>

namespace loom::kernels {

struct top_k_attrs {
  std::int64_t k;
  explicit top_k_attrs(const node_def& n) : k(n.attr<std::int64_t>("k")) {}
};

// x [..., n] as rows of n: how many rows, and n.
struct top_k_rows {
  std::int64_t rows = 0, cols = 0;
};

inline top_k_rows rows_of(const loom::shape& x) {
  top_k_rows r;
  r.cols = x.rank() ? x[x.rank() - 1] : 1;
  r.rows = 1;
  for (int a = 0; a + 1 < x.rank(); ++a)
    r.rows *= x[a];
  return r;
}

// A selection's indices [..., k] must select along the last axis of x [..., n].
inline void check_selection(const node_def& n, const loom::shape& x, const loom::shape& indices) {
  bool fits = x.rank() >= 1 && indices.rank() == x.rank();
  for (int a = 0; fits && a + 1 < x.rank(); ++a)
    fits = indices[a] == x[a];
  if (!fits)
    throw invalid_argument_error(
        "node " + n.describe() + ": indices of shape " + indices.to_string() +
        " do not select along the last axis of an input of shape " + x.to_string());
}

// Every position must lie in its row: [0, cols).
inline void check_positions(const node_def& n, const std::int32_t* idx, std::int64_t count,
                            std::int64_t cols) {
  for (std::int64_t e = 0; e < count; ++e)
    if (idx[e] < 0 || idx[e] >= cols)
      throw invalid_argument_error("node " + n.describe() + ": index " + std::to_string(idx[e]) +
                                   " (at position " + std::to_string(e) + ") is outside a row of " +
                                   std::to_string(cols));
}

} // namespace loom::kernels

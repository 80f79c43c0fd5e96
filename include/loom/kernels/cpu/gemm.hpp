// The CPU's one matrix product, which matmul, xw_plus_b, conv2d (over patches) and
// batch_matmul run: Eigen's Matrix GEMM (its fastest path), split by rows of the result
// over the session's pool, because Eigen parallelises a product only with OpenMP.
#pragma once

#include <loom/kernels/cpu/parallel_for.hpp>

#include <Eigen/Core>

#include <cstdint>

namespace loom::kernels {

template <class T>
using row_major_matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// C [m, n] = op(A) op(B) (+ C where `accumulate`; + bias on every row where given), op(A)
// [m, k] and op(B) [k, n], all row-major; A is [k, m] when ta, B [n, k] when tb. `threads`
// false: on the calling thread (a caller that splits its own work over the pool).
template <class T>
void gemm_rows(const cpu_device& d, const T* a, bool ta, const T* b, bool tb, T* c, std::int64_t m,
               std::int64_t n, std::int64_t k, bool accumulate, const T* bias = nullptr,
               bool threads = true) {
  if (m == 0 || n == 0)
    return;
  using cmap = Eigen::Map<const row_major_matrix<T>>;
  const cmap A(a, ta ? k : m, ta ? m : k);
  const cmap B(b, tb ? n : k, tb ? k : n);
  Eigen::Map<row_major_matrix<T>> C(c, m, n);
  // C starts as the bias rows (or zeros) and the product is added to it: Eigen's
  // product into C zero-fills C first anyway, and a bias added after it would be
  // another pass over C.
  auto rows = [&](Eigen::Index first, Eigen::Index last) {
    auto out = C.middleRows(first, last - first);
    if (bias)
      out.rowwise() = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(bias, n);
    else if (!accumulate)
      out.setZero();
    if (k == 0)
      return;
    if (ta) {
      auto a_rows = A.middleCols(first, last - first).transpose();
      if (tb)
        out.noalias() += a_rows * B.transpose();
      else
        out.noalias() += a_rows * B;
    } else {
      auto a_rows = A.middleRows(first, last - first);
      if (tb)
        out.noalias() += a_rows * B.transpose();
      else
        out.noalias() += a_rows * B;
    }
  };
  if (!threads) {
    rows(0, m);
    return;
  }
  // Per row: k*n multiply-adds, a few per cycle with SIMD. Small products stay on this
  // thread.
  const Eigen::TensorOpCost per_row(static_cast<double>(k * sizeof(T)),
                                    static_cast<double>(n * sizeof(T)),
                                    static_cast<double>(k) * static_cast<double>(n) / 4.0);
  parallel_for(d, m, per_row, rows);
}

} // namespace loom::kernels

// The CPU's one matrix product, which matmul, xw_plus_b, conv2d (over patches) and
// batch_matmul run: Eigen's Matrix GEMM (its fastest path), split by rows or columns of the
// result over the session's pool, because Eigen parallelises a product only with OpenMP.
#pragma once

#include <loom/kernels/cpu/parallel_for.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cstdint>

namespace loom::kernels {

template <class T>
using row_major_matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// C [m, n] = op(A) op(B) (+ C where `accumulate`; + bias on every row where given), op(A)
// [m, k] and op(B) [k, n], all row-major; A is [k, m] when ta, B [n, k] when tb. `threads`
// false: on the calling thread (a caller that splits its own work over the pool).
//
// Split over the pool by rows of C, or by columns where C has at least 4 times as many
// columns as rows. Eigen's GEMM packs both operands for each product it computes, so each
// block packs its share of one operand and all of the other: split by rows, every block
// packed the whole of op(B). A dense layer's product has few rows (the batch) and a large
// op(B) (the weights): examples/cnn's [50, 3136] x [3136, 1024] in 8 blocks packed its
// 12.8 MB of weights 8 times (2.8x slower than split by columns, where each block packs
// op(A), the batch's 627 KB). Not at fewer columns: narrow column blocks cost Eigen's
// kernels their edges ([256, 64] x [64, 400] 0.63-1.07x as fast by columns). The row
// split multiplies the operands as they are, not as blocks of them: Eigen's expressions
// over blocks made a [100, 10] x [10, 100] product 0.77x as fast.
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
  // A block of C (its columns from c0) starts as the bias (or zeros) and the product is
  // added to it: Eigen's product into C zero-fills C first anyway, and a bias added after
  // it would be another pass over C.
  auto product_into = [&](auto&& out, Eigen::Index c0, const auto& a_op, const auto& b_op) {
    if (bias)
      out.rowwise() = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(bias + c0, out.cols());
    else if (!accumulate)
      out.setZero();
    if (k != 0)
      out.noalias() += a_op * b_op;
  };
  auto rows = [&](Eigen::Index first, Eigen::Index last) {
    auto out = C.middleRows(first, last - first);
    if (ta) {
      auto a_rows = A.middleCols(first, last - first).transpose();
      if (tb)
        product_into(out, 0, a_rows, B.transpose());
      else
        product_into(out, 0, a_rows, B);
    } else {
      auto a_rows = A.middleRows(first, last - first);
      if (tb)
        product_into(out, 0, a_rows, B.transpose());
      else
        product_into(out, 0, a_rows, B);
    }
  };
  auto columns = [&](Eigen::Index first, Eigen::Index last) {
    auto out = C.middleCols(first, last - first);
    const auto times_b = [&](const auto& a_op) {
      if (tb)
        product_into(out, first, a_op, B.middleRows(first, last - first).transpose());
      else
        product_into(out, first, a_op, B.middleCols(first, last - first));
    };
    if (ta)
      times_b(A.transpose());
    else
      times_b(A);
  };
  // k multiply-adds per element of C, a few per cycle with SIMD. Small products stay on
  // this thread.
  const auto cost_of = [&](std::int64_t elements) {
    return Eigen::TensorOpCost(static_cast<double>(k * sizeof(T)),
                               static_cast<double>(elements * sizeof(T)),
                               static_cast<double>(k) * static_cast<double>(elements) / 4.0);
  };
  if (!threads || n < 4 * m) {
    if (threads)
      parallel_for(d, m, cost_of(n), rows);
    else
      rows(0, m);
    return;
  }
  // Panels of 32 columns: whole multiples of the kernels' register blocks.
  constexpr std::int64_t panel = 32;
  parallel_for(d, (n + panel - 1) / panel, cost_of(m * panel),
               [&](Eigen::Index first, Eigen::Index last) {
                 columns(first * panel, std::min<Eigen::Index>(n, last * panel));
               });
}

} // namespace loom::kernels

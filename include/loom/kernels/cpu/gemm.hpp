// The CPU's one matrix product, which matmul, xw_plus_b, conv2d (over patches) and
// batch_matmul run: Eigen's Matrix GEMM (its fastest path), split by rows or columns of the
// result over the session's pool, because Eigen parallelises a product only with OpenMP;
// where loom is built with oneDNN (LOOM_HAVE_DNNL), a large float product is oneDNN's sgemm.
#pragma once

#include <loom/kernels/cpu/parallel_for.hpp>
#if defined(LOOM_HAVE_DNNL)
#include <loom/kernels/cpu/dnnl_team.hpp>
#endif

#include <Eigen/Core>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

namespace loom::kernels {

template <class T>
using row_major_matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The multiply-adds (m n k) from which a float product on the pool is oneDNN's sgemm. oneDNN
// picks the CPU's widest instructions when it runs, where loom's Eigen is compiled for
// LOOM_CPU_ARCH (AVX2 by default): on the Xeon VM (AVX-512) examples/cnn's dense layer
// ([50, 3136] x [3136, 1024] and its two gradients, 161 M each) ran 1.0-1.9x as fast, and
// examples/cnn 1.16x (docs/benchmarks.md, "Models"). Smaller products (examples/ctr's deep
// layers, 27 M at most) stay Eigen's, measured as they are.
inline constexpr std::int64_t dnnl_gemm_min_macs = std::int64_t{1} << 26;

// C = op(A) op(B) + beta C through oneDNN's sgemm (row-major, as loom's tensors); false where
// it refused the arguments, C untouched.
// The products oneDNN computed in this process (a test checks that its size of product ran
// there).
inline std::atomic<std::int64_t>& dnnl_gemm_count() {
  static std::atomic<std::int64_t> count{0};
  return count;
}

inline bool dnnl_gemm(const cpu_device& d, const float* a, bool ta, const float* b, bool tb,
                      float* c, std::int64_t m, std::int64_t n, std::int64_t k, float beta) {
#if defined(LOOM_HAVE_DNNL)
  dnnl_team::use_pool_size(d);
  if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, ta ? m : k, b, tb ? k : n, beta,
                 c, n) != dnnl_success)
    return false;
  ++dnnl_gemm_count();
  return true;
#else
  (void)d, (void)a, (void)ta, (void)b, (void)tb, (void)c, (void)m, (void)n, (void)k, (void)beta;
  return false;
#endif
}

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
  if constexpr (std::is_same_v<T, float>) {
    if (threads && k != 0 && m * n * k >= dnnl_gemm_min_macs) {
      if (bias)
        for (std::int64_t i = 0; i < m; ++i)
          std::copy_n(bias, n, c + i * n);
      if (dnnl_gemm(d, a, ta, b, tb, c, m, n, k, bias || accumulate ? 1.0f : 0.0f))
        return;
    }
  }
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

// GPU kernel of batch_matmul (kernels/cpu/batch_matmul.hpp on the CPU): cuBLAS's strided
// batched GEMM where each operand is either whole or broadcast whole (a batch stride or
// 0), else one GEMM per batch index.
#pragma once

#include <loom/graph/ops/batch_matmul.hpp>
#include <loom/kernels/cuda/common.cuh>
#include <loom/kernels/cuda/math.cuh>
#include <loom/kernels/registry.hpp>

#include <cstdint>

namespace loom::kernels::cuda_kernels {

inline cublasStatus_t strided_gemm_call(cublasHandle_t h, cublasOperation_t ta,
                                        cublasOperation_t tb, int m, int n, int k,
                                        const float* alpha, const float* a, int lda, long long sa,
                                        const float* b, int ldb, long long sb, const float* beta,
                                        float* c, int ldc, long long sc, int count) {
  return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc,
                                   sc, count);
}
inline cublasStatus_t strided_gemm_call(cublasHandle_t h, cublasOperation_t ta,
                                        cublasOperation_t tb, int m, int n, int k,
                                        const double* alpha, const double* a, int lda, long long sa,
                                        const double* b, int ldb, long long sb, const double* beta,
                                        double* c, int ldc, long long sc, int count) {
  return cublasDgemmStridedBatched(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc,
                                   sc, count);
}

// The operand's one batch stride over every output batch index (its matrix size, or 0
// where it is broadcast whole), or -1 where no single stride describes it.
inline std::int64_t uniform_stride(const loom::detail::batch_layout& l, bool which_a,
                                   std::int64_t matrix) {
  const std::int64_t batches = l.batches();
  if (batches <= 1)
    return 0;
  const std::int64_t first = l.operand_batch(1, which_a);
  if (first > 1)
    return -1;
  for (std::int64_t at = 2; at < batches; ++at)
    if (l.operand_batch(at, which_a) != first * at)
      return -1;
  return first * matrix;
}

template <class T> struct batch_matmul_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& a = c.input(0);
    const any_tensor& b = c.input(1);
    const bool adj_x = c.node.attr_or<bool>("adj_x", false);
    const bool adj_y = c.node.attr_or<bool>("adj_y", false);
    const loom::detail::batch_layout l =
        loom::detail::batch_layout_of(c.node, a.shape(), b.shape(), adj_x, adj_y);
    c.output = g.allocate(dtype_of<T>, l.output_shape());
    const std::int64_t batches = l.batches();
    if (batches == 0 || l.m == 0 || l.n == 0)
      return;
    const T* A = a.template device_data<T>();
    const T* B = b.template device_data<T>();
    T* C = c.output.template device_data<T>();
    const std::int64_t sa = uniform_stride(l, true, l.m * l.k);
    const std::int64_t sb = uniform_stride(l, false, l.k * l.n);
    if (sa < 0 || sb < 0 || l.k == 0 || batches > INT_MAX) {
      for (std::int64_t at = 0; at < batches; ++at)
        gemm_rows(c, A + l.operand_batch(at, true) * l.m * l.k, adj_x,
                  B + l.operand_batch(at, false) * l.k * l.n, adj_y, C + at * l.m * l.n, l.m, l.n,
                  l.k, false);
      return;
    }
    const T one = T(1), zero = T(0);
    // Column-major, the buffers hold A^T and B^T; C^T = op(B)^T op(A)^T, batch by batch.
    cuda::check_cublas(
        strided_gemm_call(
            g.blas, adj_y ? CUBLAS_OP_T : CUBLAS_OP_N, adj_x ? CUBLAS_OP_T : CUBLAS_OP_N,
            blas_dim(c.node, l.n), blas_dim(c.node, l.m), blas_dim(c.node, l.k), &one, B,
            blas_dim(c.node, adj_y ? l.k : l.n), sb, A, blas_dim(c.node, adj_x ? l.m : l.k), sa,
            &zero, C, blas_dim(c.node, l.n), l.m * l.n, static_cast<int>(batches)),
        "batched gemm");
  }
};

inline const bool batch_matmul_gpu_registered =
    register_kernels<batch_matmul_gpu>("batch_matmul", floating_types{}, device_gpu);

} // namespace loom::kernels::cuda_kernels

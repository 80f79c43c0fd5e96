// CPU kernel of batch_matmul (graph/ops/batch_matmul.hpp): one GEMM per output batch index
// (kernels/cpu/gemm.hpp), the batches spread over the pool, or one product's rows where
// there is a single batch.
#pragma once

#include <loom/graph/ops/batch_matmul.hpp>
#include <loom/kernels/cpu/gemm.hpp>
#include <loom/kernels/registry.hpp>

#include <cstdint>

namespace loom::kernels {

template <class T> struct batch_matmul_cpu {
  static void run(kernel_context& c) {
    const any_tensor& a = c.input(0);
    const any_tensor& b = c.input(1);
    const bool adj_x = c.node.attr_or<bool>("adj_x", false);
    const bool adj_y = c.node.attr_or<bool>("adj_y", false);
    const detail::batch_layout l =
        detail::batch_layout_of(c.node, a.shape(), b.shape(), adj_x, adj_y);
    c.output = any_tensor(dtype_of<T>, l.output_shape());
    const std::int64_t batches = l.batches();
    auto one = [&](std::int64_t at, bool threads) {
      gemm_rows(c.device, a.data<T>() + l.operand_batch(at, true) * l.m * l.k, adj_x,
                b.data<T>() + l.operand_batch(at, false) * l.k * l.n, adj_y,
                c.output.data<T>() + at * l.m * l.n, l.m, l.n, l.k, false,
                static_cast<const T*>(nullptr), threads);
    };
    if (batches == 1) {
      one(0, true);
      return;
    }
    const double per_batch = static_cast<double>(l.m * l.n * l.k);
    parallel_for(
        c.device, batches,
        Eigen::TensorOpCost(per_batch / static_cast<double>(std::max<std::int64_t>(l.n, 1)),
                            static_cast<double>(l.m * l.n), per_batch / 4),
        [&](Eigen::Index first, Eigen::Index last) {
          for (Eigen::Index at = first; at < last; ++at)
            one(at, false);
        });
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline const bool batch_matmul_cpu_registered =
    register_kernels<batch_matmul_cpu>("batch_matmul", floating_types{});
#endif

} // namespace loom::kernels

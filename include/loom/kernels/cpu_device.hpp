// The CPU device every CPU kernel runs on (cpu_device: Eigen's ThreadPoolDevice over the
// process's intra-op pool), declared without Eigen's Tensor module: what only passes it on
// (kernel_context, the fused-kernel registry, the executor, the GPU kernels' units) parses
// no Eigen. The headers that use it (kernels/cpu/parallel_for.hpp and the kernels over it,
// the runtime that owns one, through kernels/cpu/cpu_pool.hpp) include the Tensor module
// themselves.
#pragma once

namespace Eigen {
struct ThreadPoolDevice; // as Eigen declares it (TensorForwardDeclarations.h)
} // namespace Eigen

namespace loom::kernels {

using cpu_device = Eigen::ThreadPoolDevice;

} // namespace loom::kernels

// What lowering a fusable typed tree instantiates: detail::register_fused_kernels<E>,
// the customization point graph/lower.hpp declares, defined here because only
// the kernel layer knows the kernels. It registers the tree's CPU kernel
// (kernels/cpu/fused.hpp) and, in a translation unit nvcc compiles, its GPU
// kernel (kernels/cuda/fused.cuh) under the region's key. <loom/api.hpp>
// includes this, so every program that lowers a tree has it.
#pragma once

#include <loom/kernels/cpu/fused.hpp>
#include <loom/kernels/fused_registry.hpp>

#if defined(__CUDACC__)
#include <loom/kernels/cuda/fused.cuh>
#endif

#include <string>

namespace loom::detail {

template <class E> void register_fused_kernels(const std::string& key) {
  kernels::fused_kernel_registry::instance().add(key, &kernels::fused_kernel<E>);
#if defined(__CUDACC__)
  cuda::register_gpu_region<E>(key);
#endif
}

} // namespace loom::detail

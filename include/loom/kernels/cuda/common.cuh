// What the GPU kernels of kernels/cuda/ share: launch geometry, checked
// launches on the kernel's stream, block reductions, device copies and fills,
// and the host-side checks that keep a GPU kernel's errors those of its CPU
// twin. Every launch goes to kernel_context::gpu->stream (never the legacy
// default stream) and none synchronises.
#pragma once

#include <loom/kernels/cuda/backend.hpp>
#include <loom/kernels/cuda/error.hpp>
#include <loom/kernels/registry.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::kernels::cuda_kernels {

inline constexpr int block_threads = 256;
// Grid-stride kernels need no more blocks than the GPU holds at once; this
// cap is a few waves on any current GPU and far below gridDim.x's limit.
inline constexpr std::int64_t max_blocks = 8192;

inline unsigned grid_for(std::int64_t work, int threads = block_threads) {
  const std::int64_t wanted = (work + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<std::int64_t>(wanted, 1, max_blocks));
}

// The GPU a kernel runs on; a kernel registered under device_gpu always has one.
inline const gpu_context& gpu_of(const kernel_context& c) {
  if (!c.gpu)
    throw internal_error("node " + c.node.describe() +
                         ": a GPU kernel ran without a GPU context (not through the GPU backend)");
  return *c.gpu;
}

// Throws when the last launch failed (bad configuration, no kernel image).
inline void check_launch() {
  LOOM_CUDA_CHECK(cudaGetLastError());
}

// 64-bit grid-stride index helpers.
__device__ inline std::int64_t global_thread() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::int64_t grid_threads() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

template <class T> __global__ void fill_kernel(T* out, std::int64_t n, T value) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] = value;
}

// out[0, n) = value on the kernel's stream.
template <class T> void fill(const gpu_context& g, T* out, std::int64_t n, T value) {
  if (n <= 0)
    return;
  fill_kernel<T><<<grid_for(n), block_threads, 0, g.stream>>>(out, n, value);
  check_launch();
}

inline bool on_this_gpu(const gpu_context& g, const any_tensor& t) {
  return t.location() == memory_location::gpu(g.device);
}

// Sum and max of a block's values (blockDim.x a multiple of 32, at most 1024):
// warp shuffles, then one warp over the warps' results. Every thread gets the
// result. `scratch` holds 32 values; the call ends with a barrier, so it may be
// reused at once.
template <class T, class F> __device__ T block_reduce(T v, F op, T* scratch) {
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 16; o > 0; o /= 2)
    v = op(v, __shfl_down_sync(0xffffffffu, v, o));
  if (lane == 0)
    scratch[warp] = v;
  __syncthreads();
  const unsigned warps = blockDim.x / 32;
  if (warp == 0) {
    v = lane < warps ? scratch[lane] : scratch[0];
    for (int o = 16; o > 0; o /= 2) {
      const T other = __shfl_down_sync(0xffffffffu, v, o);
      if (lane + static_cast<unsigned>(o) < warps)
        v = op(v, other);
    }
    // Lane 0 overwrites scratch[0], which lanes past `warps` read above: the
    // shuffles keep the warp in step, but only a warp barrier orders the memory.
    __syncwarp();
    if (lane == 0)
      scratch[0] = v;
  }
  __syncthreads();
  v = scratch[0];
  __syncthreads();
  return v;
}

struct sum_op {
  template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};
// std::max's order: the first argument wins ties (as Eigen's MaxReducer on numbers).
struct max_op {
  template <class T> __device__ T operator()(T a, T b) const { return a < b ? b : a; }
};

} // namespace loom::kernels::cuda_kernels

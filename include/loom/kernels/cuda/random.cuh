// GPU kernels of the random sources (kernels/cpu/random.hpp on the CPU):
// random_uniform, random_normal and truncated_normal. Each run draws one
// 64-bit key from the node's engine (the CPU kernel's engine and seeding, so a
// seeded op repeats its sequence of runs), and every element is a pure
// function of (key, index): a counter-based generator (splitmix64's mixer over
// the counter) that needs no state on the device. The numbers differ from the
// CPU's but follow the same distributions: uniform in [a, b), normal (a, b)
// by Box-Muller in double, and the normal redrawn beyond two standard
// deviations for truncated_normal.
#pragma once

#include <loom/kernels/cuda/common.cuh>
#include <loom/kernels/registry.hpp>

#include <cstdint>
#include <type_traits>

namespace loom::kernels::cuda_kernels {

__device__ inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// 64 random bits for counter `i` under `key`.
__device__ inline std::uint64_t random_bits(std::uint64_t key, std::uint64_t i) {
  return mix64(mix64(key + i * 0x9E3779B97F4A7C15ull) ^ key);
}

// A uniform double in [0, 1) from the top 53 bits (as the CPU's uniform01).
__device__ inline double uniform01(std::uint64_t key, std::uint64_t i) {
  return static_cast<double>(random_bits(key, i) >> 11) * 0x1.0p-53;
}

// a + (b - a) * u as T, below b (as the CPU's uniform_in: rounding to float
// can reach b itself). Host-callable for the tests.
template <class T> __host__ __device__ inline T uniform_in(double a, double b, double u) {
  const T v = static_cast<T>(a + (b - a) * u);
  const T hi = static_cast<T>(b);
  if (v < hi)
    return v;
  if constexpr (std::is_same_v<T, float>)
    return ::nextafterf(hi, static_cast<T>(a));
  else
    return ::nextafter(hi, static_cast<T>(a));
}

// A standard normal from counters 2c and 2c + 1 (Box-Muller, as on the CPU).
__device__ inline double standard_normal(std::uint64_t key, std::uint64_t c) {
  double u1 = uniform01(key, 2 * c);
  if (u1 <= 0.0) // probability 2^-53; the smallest positive draw instead
    u1 = 0x1.0p-53;
  const double u2 = uniform01(key, 2 * c + 1);
  return ::sqrt(-2.0 * ::log(u1)) * ::cospi(2.0 * u2);
}

enum class distribution : int { uniform, normal, truncated };

template <class T>
__global__ void __launch_bounds__(block_threads)
    random_kernel(T* out, std::int64_t n, std::uint64_t key, distribution dist, double a,
                  double b) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const auto u = static_cast<std::uint64_t>(i);
    double v;
    if (dist == distribution::uniform) {
      out[i] = uniform_in<T>(a, b, uniform01(key, u));
      continue;
    } else if (dist == distribution::normal) {
      v = a + b * standard_normal(key, u);
    } else {
      // Draw t of element i uses counter i * 64 + t: a redraw is needed with
      // probability 0.0455, 64 in a row practically never; the last one is
      // clamped to stay in range.
      double z = standard_normal(key, u * 64);
      for (std::uint64_t t = 1; t < 64 && ::fabs(z) > 2.0; ++t)
        z = standard_normal(key, u * 64 + t);
      v = a + b * ::fmin(::fmax(z, -2.0), 2.0);
    }
    out[i] = static_cast<T>(v);
  }
}

template <class T> struct random_gpu {
  static void run(kernel_context& c) {
    const node_def& n = c.node;
    const auto seed = static_cast<std::uint64_t>(n.attr<std::int64_t>("seed"));
    const auto seed2 = static_cast<std::uint64_t>(n.attr<std::int64_t>("seed2"));
    const std::uint64_t mixed = seed || seed2 ? seed * 0x9E3779B97F4A7C15ull ^ (seed2 + 1) : 0;
    const std::uint64_t key = c.resources.random_engine(n, mixed)();
    const double a = n.attr<double>("a"), b = n.attr<double>("b");
    const gpu_context& g = gpu_of(c);
    c.output = g.allocate(dtype_of<T>, c.inputs.empty() ? n.shape : c.input(0).shape());
    const std::int64_t count = c.output.num_elements();
    if (count == 0)
      return;
    const distribution dist = n.op == "random_uniform"  ? distribution::uniform
                              : n.op == "random_normal" ? distribution::normal
                                                        : distribution::truncated;
    random_kernel<T><<<grid_for(count), block_threads, 0, g.stream>>>(
        c.output.template device_data<T>(), count, key, dist, a, b);
    check_launch();
  }
};

inline bool register_random_gpu() {
  for (const char* op : {"random_uniform", "random_normal", "truncated_normal"})
    register_kernels<random_gpu>(op, floating_types{}, device_gpu);
  return true;
}

inline const bool random_gpu_registered = register_random_gpu();

} // namespace loom::kernels::cuda_kernels

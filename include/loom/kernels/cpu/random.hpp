// CPU kernels of the random sources. The draws are computed from mt19937_64's
// bits by loom itself (not std:: distributions, whose results differ between
// standard libraries), so a seed gives the same numbers everywhere.
#pragma once

#include <loom/kernels/registry.hpp>

#include <cmath>
#include <numbers>

namespace loom::kernels {

// A uniform double in [0, 1) from the top 53 bits.
inline double uniform01(std::mt19937_64& e) {
  return static_cast<double>(e() >> 11) * 0x1.0p-53;
}

// a + (b - a) * u as T, below b: TF's interval is [a, b), and rounding to
// float can reach b itself (u = 1 - 2^-53 over [0, 1) rounds to 1.0f).
template <class T> T uniform_in(double a, double b, double u) {
  const T v = static_cast<T>(a + (b - a) * u);
  const T hi = static_cast<T>(b);
  return v < hi ? v : std::nextafter(hi, static_cast<T>(a));
}

// A standard normal by Box-Muller (one of the pair; simple and portable).
inline double standard_normal(std::mt19937_64& e) {
  double u1 = uniform01(e);
  while (u1 <= 0.0)
    u1 = uniform01(e);
  const double u2 = uniform01(e);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

template <class T> struct random_cpu {
  static void run(kernel_context& c) {
    const node_def& n = c.node;
    const auto seed = static_cast<std::uint64_t>(n.attr<std::int64_t>("seed"));
    const auto seed2 = static_cast<std::uint64_t>(n.attr<std::int64_t>("seed2"));
    const std::uint64_t mixed = seed || seed2 ? seed * 0x9E3779B97F4A7C15ull ^ (seed2 + 1) : 0;
    std::mt19937_64& e = c.resources.random_engine(n, mixed);
    const double a = n.attr<double>("a"), b = n.attr<double>("b");
    c.output = any_tensor(dtype_of<T>, c.inputs.empty() ? n.shape : c.input(0).shape());
    T* out = c.output.data<T>();
    const std::int64_t count = c.output.num_elements();
    if (n.op == "random_uniform") {
      for (std::int64_t i = 0; i < count; ++i)
        out[i] = uniform_in<T>(a, b, uniform01(e));
    } else if (n.op == "random_normal") {
      for (std::int64_t i = 0; i < count; ++i)
        out[i] = static_cast<T>(a + b * standard_normal(e));
    } else { // truncated_normal: redraw values beyond two standard deviations, as TF does
      for (std::int64_t i = 0; i < count; ++i) {
        double z = standard_normal(e);
        while (std::abs(z) > 2.0)
          z = standard_normal(e);
        out[i] = static_cast<T>(a + b * z);
      }
    }
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_random_kernels() {
  for (const char* op : {"random_uniform", "random_normal", "truncated_normal"})
    register_kernels<random_cpu>(op, floating_types{});
  return true;
}

inline const bool random_kernels_registered = register_random_kernels();
#endif

} // namespace loom::kernels

// CPU kernel of range (graph/ops/range.hpp).
#pragma once

#include <loom/graph/ops/range.hpp>
#include <loom/kernels/registry.hpp>

#include <cstdint>

namespace loom::kernels {

// out[i] = start + i * delta (TF's GPU form; one rounding per element, none accumulated).
template <class T> struct range_cpu {
  static void run(kernel_context& c) {
    const T start = *c.input(0).data<T>(), limit = *c.input(1).data<T>(),
            delta = *c.input(2).data<T>();
    const std::int64_t size = detail::range_length<T>(c.node, start, limit, delta);
    c.output = any_tensor(dtype_of<T>, loom::shape{size});
    T* out = c.output.data<T>();
    for (std::int64_t i = 0; i < size; ++i)
      out[i] = static_cast<T>(start + static_cast<T>(i) * delta);
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline const bool range_cpu_registered = register_kernels<range_cpu>("range", numeric_types{});
#endif

} // namespace loom::kernels

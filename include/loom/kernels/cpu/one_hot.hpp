// CPU kernel of one_hot (graph/ops/one_hot.hpp).
#pragma once

#include <loom/graph/ops/one_hot.hpp>
#include <loom/kernels/checks/array.hpp>
#include <loom/kernels/cpu/parallel_for.hpp>
#include <loom/kernels/registry.hpp>

#include <cstdint>

namespace loom::kernels {

template <class T> struct one_hot_cpu {
  static void run(kernel_context& c) {
    const any_tensor& ids = c.input(0);
    const detail::one_hot_attrs& a = c.decoded<detail::one_hot_attrs>();
    c.output = any_tensor(dtype_of<T>, one_hot_shape(c.node, a, ids.shape()));
    const axis_layout l = layout_around(c.output.shape(), a.axis < 0 ? c.output.shape().rank() - 1
                                                                     : static_cast<int>(a.axis));
    const T on = *c.input(1).data<T>(), off = *c.input(2).data<T>();
    T* out = c.output.data<T>();
    with_ids(ids, [&](const auto* id) {
      // One [depth, inner] block per outer index; the id of (o, i) is id[o * inner + i].
      parallel_for(c.device, l.outer * l.count,
                   Eigen::TensorOpCost(static_cast<double>(l.inner * sizeof(*id)),
                                       static_cast<double>(l.inner * sizeof(T)),
                                       static_cast<double>(l.inner)),
                   [&](Eigen::Index first, Eigen::Index last) {
                     for (Eigen::Index r = first; r < last; ++r) {
                       const std::int64_t o = r / l.count, j = r % l.count;
                       const auto* row_ids = id + o * l.inner;
                       T* row = out + r * l.inner;
                       for (std::int64_t i = 0; i < l.inner; ++i)
                         row[i] = static_cast<std::int64_t>(row_ids[i]) == j ? on : off;
                     }
                   });
    });
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline const bool one_hot_cpu_registered =
    register_kernels<one_hot_cpu>("one_hot", all_types_but_string{});
#endif

} // namespace loom::kernels

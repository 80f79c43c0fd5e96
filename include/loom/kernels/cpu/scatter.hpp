// CPU kernels of the scatter updates (graph/ops/scatter.hpp): under the
// variable's lock, the indices checked before anything is written, then the
// rows changed in place.
#pragma once

#include <loom/graph/ops/scatter.hpp>
#include <loom/kernels/checks/array.hpp>
#include <loom/kernels/cpu/array.hpp>
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

namespace loom::kernels {

template <class T> struct scatter_cpu {
  static void run(kernel_context& c) {
    variable_resource& v = *c.refs[0];
    const any_tensor& indices = c.input(1);
    const any_tensor& updates = c.input(2);
    const std::string var = scatter_variable(c.node);
    std::lock_guard lock(v.mu);
    check_scatter(c.node, v, indices, updates);
    const std::int64_t rows = v.value.shape()[0];
    const std::int64_t row = rows == 0 ? 0 : v.value.num_elements() / rows;
    const std::int64_t n = indices.num_elements();
    const T* src = updates.data<T>();
    T* dst = v.value.data<T>();
    const std::string& op = c.node.op;
    with_ids(indices, [&](const auto* id) {
      check_id_range(c.node, id, n, rows, false, var);
      if (v.changes)
        for (std::int64_t k = 0; k < n; ++k)
          v.changes->mark(static_cast<std::int64_t>(id[k]));
      for (std::int64_t k = 0; k < n; ++k) {
        T* to = dst + static_cast<std::int64_t>(id[k]) * row;
        const T* from = src + k * row;
        if (op == "scatter_update")
          std::copy_n(from, row, to);
        else if (op == "scatter_add")
          add_row(to, from, row);
        else
          for (std::int64_t j = 0; j < row; ++j)
            to[j] -= from[j];
      }
    });
    c.output = v.value;
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_scatter_kernels() {
  for (const char* op : {"scatter_add", "scatter_sub", "scatter_update"})
    register_kernels<scatter_cpu>(op, numeric_types{});
  return true;
}

inline const bool scatter_kernels_registered = register_scatter_kernels();
#endif

} // namespace loom::kernels

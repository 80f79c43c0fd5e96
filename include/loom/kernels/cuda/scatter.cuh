// GPU kernels of the scatter updates (kernels/cpu/scatter.hpp on the CPU):
// scatter_add, scatter_sub and scatter_update of a variable in this GPU's
// memory, in place under its lock, for the CPU's dtypes. The CPU's checks
// and messages (kernels/checks/array.hpp) run first, the indices on their
// host copy (kernels/cuda/ids.cuh), so a bad index writes nothing. A
// variable on the host or another GPU is refused, naming it.
//
// Repeated indices are the CPU's too: the indices are grouped on the GPU
// (ids.cuh) and one thread per (distinct index, element of a row) applies
// that index's updates in their order: added or subtracted one after another
// (the CPU's sums, to the bit), or, for scatter_update, the last one written.
// No atomics, so the result never depends on the order threads run in.
#pragma once

#include <loom/kernels/checks/array.hpp>
#include <loom/kernels/cuda/common.cuh>
#include <loom/kernels/cuda/ids.cuh>
#include <loom/kernels/cuda/state.cuh>
#include <loom/kernels/registry.hpp>

#include <cstdint>
#include <mutex>
#include <string>

namespace loom::kernels::cuda_kernels {

enum class scatter_mode { add, sub, update };

template <class T>
__global__ void scatter_kernel(T* var, id_groups_view ids, const T* updates, std::int64_t row,
                               scatter_mode mode) {
  const std::int64_t total = static_cast<std::int64_t>(*ids.groups) * row;
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t u = e / row, j = e - u * row;
    const std::int32_t first = ids.start[u], last = first + ids.count[u];
    T* to = var + static_cast<std::int64_t>(ids.key[u]) * row + j;
    if (mode == scatter_mode::update) {
      *to = updates[ids.order[last - 1] * row + j];
      continue;
    }
    T x = *to;
#pragma unroll 4
    for (std::int32_t p = first; p < last; ++p) {
      const T d = updates[ids.order[p] * row + j];
      x = mode == scatter_mode::add ? T(x + d) : T(x - d);
    }
    *to = x;
  }
}

template <class T> struct scatter_gpu {
  static void run(kernel_context& c) {
    variable_resource& v = *c.refs[0];
    const any_tensor& indices = c.input(1);
    const any_tensor& updates = c.input(2);
    const std::string var = loom::kernels::scatter_variable(c.node);
    const gpu_context& g = gpu_of(c);
    std::lock_guard lock(v.mu);
    loom::kernels::check_scatter(c.node, v, indices, updates);
    check_on_gpu(c, v.value, var);
    const std::int64_t rows = v.value.shape()[0];
    const std::int64_t row = rows == 0 ? 0 : v.value.num_elements() / rows;
    const std::int64_t n = indices.num_elements();
    with_ids(download(g, indices),
             [&](const auto* id) { check_id_range(c.node, id, n, rows, false, var); });
    if (n > 0 && row > 0) {
      const scatter_mode mode = c.node.op == "scatter_update" ? scatter_mode::update
                                : c.node.op == "scatter_add"  ? scatter_mode::add
                                                              : scatter_mode::sub;
      const id_groups groups = group_ids(g, c.node, indices, rows);
      scatter_kernel<T><<<grid_for(n * row), block_threads, 0, g.stream>>>(
          v.value.template device_data<T>(), groups.view(), updates.template device_data<T>(), row,
          mode);
      check_launch();
    }
    c.output = v.value;
  }
};

inline bool register_scatter_gpu() {
  for (const char* op : {"scatter_add", "scatter_sub", "scatter_update"})
    register_kernels<scatter_gpu>(op, numeric_types{}, device_gpu);
  return true;
}

inline const bool scatter_gpu_registered = register_scatter_gpu();

} // namespace loom::kernels::cuda_kernels

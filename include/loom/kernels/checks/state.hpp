// The host-side checks of the state and plumbing kernels that the CPU kernels
// (kernels/cpu/state.hpp) and the GPU kernels (kernels/cuda/state.cuh) share,
// with their messages. Host code only (no Eigen evaluation), so nvcc compiles
// it too.
#pragma once

#include <loom/kernels/registry.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::kernels {

// A variable node reads its variable only once it has a value. The caller holds v.mu.
inline void check_variable_initialized(const node_def& n, const variable_resource& v) {
  if (!v.initialized)
    throw failed_precondition_error("attempting to use uninitialized value " + n.name +
                                    " (run its initializer, or "
                                    "global_variables_initializer, first)");
}

// assign_add / assign_sub update a variable that has a value of value's shape.
// The caller holds v.mu.
inline void check_assign_update(const node_def& n, const variable_resource& v,
                                const any_tensor& value) {
  if (!v.initialized)
    throw failed_precondition_error(
        "node " + n.describe() + ": attempting to use uninitialized variable '" +
        n.attr_or<std::string>("_ref_name_0", "?") +
        "' (run its initializer, or global_variables_initializer, first)");
  if (value.shape() != v.value.shape())
    throw invalid_argument_error(
        "node " + n.describe() + ": value of shape " + value.shape().to_string() +
        " does not match the variable's shape " + v.value.shape().to_string());
}

// assign_add / assign_sub of a dtype without arithmetic (bool, string).
[[noreturn]] inline void throw_no_arithmetic(const node_def& n, dtype t) {
  throw invalid_argument_error("node " + n.describe() + ": no arithmetic on " +
                               std::string(to_string(t)));
}

// sum_to_shape: the axes of `from` that broadcasting expanded from `to` (a
// dimension of 1, or one `to` lacks), which the kernel sums over. Throws
// unless `to` broadcasts to `from`.
inline std::vector<char> summed_axes(const node_def& n, const loom::shape& from,
                                     const loom::shape& to) {
  const int r = from.rank(), pad = r - to.rank();
  if (pad < 0)
    throw invalid_argument_error("node " + n.describe() + ": cannot reduce " + from.to_string() +
                                 " to " + to.to_string());
  std::vector<char> mask(static_cast<std::size_t>(r), 0);
  for (int i = 0; i < r; ++i) {
    const std::int64_t td = i >= pad ? to[i - pad] : 1;
    if (td != 1 && td != from[i])
      throw invalid_argument_error("node " + n.describe() + ": cannot reduce " + from.to_string() +
                                   " to " + to.to_string());
    mask[static_cast<std::size_t>(i)] = td == 1 && from[i] != 1;
  }
  return mask;
}

} // namespace loom::kernels

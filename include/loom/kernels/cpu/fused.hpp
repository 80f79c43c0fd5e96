// The CPU kernel of a fused elementwise region: its whole typed tree as one
// Eigen expression (the op tags' eval()), one pass over memory, instantiated
// where a program lowers the tree (kernels/fused.hpp registers it).
#pragma once

#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/expr/expr.hpp>
#include <loom/kernels/checks/elementwise.hpp>
#include <loom/kernels/cpu/parallel_for.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

namespace loom::kernels {

// Builds the Eigen expression of a typed tree. Leaves are read from `in` in
// depth-first order starting at Offset; rank-0 leaves become constants.
template <class E, std::size_t Offset>
auto fused_operand(std::span<const any_tensor* const> in, Eigen::DenseIndex first,
                   Eigen::DenseIndex len) {
  if constexpr (E::is_leaf) {
    using T = typename E::value_type;
    const any_tensor& t = *in[Offset];
    if constexpr (E::rank == 0)
      return repeated_operand<T>(t, len);
    else
      return flat_operand<T>(t, first, len);
  } else {
    return []<class Op, class... C>(std::type_identity<expr<Op, C...>>,
                                    std::span<const any_tensor* const> leaves,
                                    Eigen::DenseIndex begin, Eigen::DenseIndex size) {
      return [&]<std::size_t... I>(std::index_sequence<I...>) {
        constexpr auto at = loom::detail::child_leaf_offsets<E, Offset>();
        return Op::eval(fused_operand<C, at[I]>(leaves, begin, size)...);
      }
      (std::index_sequence_for<C...>{});
    }(std::type_identity<E>{}, in, first, len);
  }
}

// The region's kernel (fused_kernel_fn): false when an operand needs general
// broadcasting, and the executor then runs the region's primitive ops.
template <class E>
bool fused_kernel(const cpu_device& d, std::span<const any_tensor* const> leaves, any_tensor& out,
                  const std::string& node_name) {
  if (leaves.size() != loom::detail::leaf_count<E>())
    throw internal_error(node_name + ": fused region expects " +
                         std::to_string(loom::detail::leaf_count<E>()) + " inputs, got " +
                         std::to_string(leaves.size()));
  const loom::shape s = kernels::broadcast_all(leaves, node_name);
  if (!kernels::leaves_have_shape<E>(leaves, s))
    return false;
  using T = typename E::value_type;
  out = any_tensor(dtype_of<T>, s);
  const Eigen::DenseIndex n = s.num_elements();
  if (n == 0)
    return true;
  T* dst = out.data<T>();
  const Eigen::TensorOpCost cost(static_cast<double>(loom::detail::leaf_count<E>() * sizeof(T)),
                                 sizeof(T), 4.0 * static_cast<double>(loom::detail::op_count<E>()));
  kernels::parallel_chunks(d, n, cost, [&](Eigen::DenseIndex first, Eigen::DenseIndex len) {
    kernels::chunk_map<T>(dst + first, len) = kernels::fused_operand<E, 0>(leaves, first, len);
  });
  return true;
}

} // namespace loom::kernels

// The host-side shape rules of the elementwise kernels that the CPU's
// (kernels/cpu/elementwise.hpp, kernels/cpu/fused.hpp) and the GPU's
// (kernels/cuda/elementwise.cuh, kernels/cuda/fused.cuh) share: the
// operands' broadcast shape, and whether a fused region can run without
// general broadcasting. Host code only, so nvcc compiles it too.
#pragma once

#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/expr/expr.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

namespace loom::kernels {

// The shape all operands broadcast to; `what` names the op for the error.
inline loom::shape broadcast_all(std::span<const any_tensor* const> in, const std::string& what) {
  loom::shape s = in.empty() ? loom::shape{} : in[0]->shape();
  for (std::size_t i = 1; i < in.size(); ++i)
    s = broadcast_shapes(s, in[i]->shape(), what);
  return s;
}

// Whether every leaf of a fused region's typed tree E has the output's shape
// s (a rank-0 leaf: one element). Where one does not, the fused kernel
// declines and the executor runs the region's primitive ops, which broadcast.
template <class E, std::size_t Offset = 0>
bool leaves_have_shape(std::span<const any_tensor* const> in, const loom::shape& s) {
  if constexpr (E::is_leaf) {
    return E::rank == 0 ? in[Offset]->num_elements() == 1 : in[Offset]->shape() == s;
  } else {
    return
        []<class Op, class... C>(std::type_identity<expr<Op, C...>>,
                                 std::span<const any_tensor* const> leaves, const loom::shape& sh) {
          return [&]<std::size_t... I>(std::index_sequence<I...>) {
            constexpr auto at = loom::detail::child_leaf_offsets<E, Offset>();
            return (leaves_have_shape<C, at[I]>(leaves, sh) && ...);
          }
          (std::index_sequence_for<C...>{});
        }(std::type_identity<E>{}, in, s);
  }
}

} // namespace loom::kernels

// The GPU kernel of a graph's fused elementwise region (DESIGN.md §2: "GPU via
// one generated CUDA kernel"), instantiated from the region's typed tree when
// the translation unit that lowers the tree is compiled by nvcc:
// kernels/fused.hpp registers it beside the CPU's fused kernel, under the same
// canonical key. The executor runs it for a region whose nodes are all placed
// on one GPU; a process that lowered the tree with g++ has only the CPU's, and
// runs such a region as its primitive GPU kernels.
//
// The tree is kernels/cuda/expression.cuh's device tree, so this is cuda::evaluate's
// kernel: leaf k of the typed tree (in lowering order, the order of
// fusion_candidate::leaves) reads the k-th input tensor, every element for a
// tensor leaf and its one element for a scalar leaf (rank 0: a constant
// number or a scalar node). Like the CPU's fused kernel it declines (returns
// false) when an operand needs general broadcasting; the executor then runs
// the region's primitive ops, which broadcast.
//
// Where to lower: in a unit nvcc compiles (CMake: loom_cuda_target, which
// gives nvcc Eigen's flags and loom's definitions; <loom/loom.hpp> compiles
// there). An inline function that lowers the same tree type in both a g++ and
// an nvcc unit is instantiated twice, and the linker keeps one: the tree then
// may or may not have its GPU kernel (the result is the same either way; only
// the fusion is lost), so build the graph in the nvcc unit.
#pragma once

#include <loom/expr/expr.hpp>
#include <loom/kernels/checks/elementwise.hpp>
#include <loom/kernels/cuda/backend.hpp>
#include <loom/kernels/cuda/expression.cuh>
#include <loom/kernels/fused_registry.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

namespace loom::cuda {

namespace detail {

// The device tree of a lowered region over its leaves' memory (device memory
// when run; host memory in the host emulation of the tests).
template <class E, std::size_t Offset = 0>
auto region_tree(std::span<const any_tensor* const> leaves) {
  if constexpr (E::is_leaf) {
    using T = typename E::value_type;
    const T* p = static_cast<const T*>(leaves[Offset]->device_data());
    if constexpr (E::rank == 0)
      return d_repeat<T>{p};
    else
      return d_leaf<T>{p};
  } else {
    return []<class Op, class... C>(std::type_identity<expr<Op, C...>>,
                                    std::span<const any_tensor* const> in) {
      return [&]<std::size_t... I>(std::index_sequence<I...>) {
        constexpr auto at = loom::detail::child_leaf_offsets<E, Offset>();
        return d_node<Op, decltype(region_tree<C, at[I]>(in))...>{region_tree<C, at[I]>(in)...};
      }
      (std::index_sequence_for<C...>{});
    }(std::type_identity<E>{}, leaves);
  }
}

} // namespace detail

// Whether a typed tree has a GPU form: every leaf and result a number (strings
// never live on a GPU).
template <class E> constexpr bool gpu_fusable() {
  if constexpr (E::is_leaf)
    return std::is_arithmetic_v<typename E::value_type>;
  else
    return std::is_arithmetic_v<typename E::value_type> &&
           []<class Op, class... C>(std::type_identity<expr<Op, C...>>) {
             return (gpu_fusable<C>() && ...);
           }(std::type_identity<E>{});
}

// The region's kernel (gpu_fused_kernel_fn): queues one kernel on g's stream
// that writes `out`, made on g's GPU; false when an operand needs general
// broadcasting.
template <class E>
bool gpu_fused_kernel(const loom::kernels::gpu_context& g,
                      std::span<const any_tensor* const> leaves, any_tensor& out,
                      const std::string& node_name) {
  static_assert(gpu_fusable<E>(), "loom::cuda::gpu_fused_kernel: a tree with string operands");
  if (leaves.size() != loom::detail::leaf_count<E>())
    throw internal_error(node_name + ": fused region expects " +
                         std::to_string(loom::detail::leaf_count<E>()) + " inputs, got " +
                         std::to_string(leaves.size()));
  const loom::shape s = loom::kernels::broadcast_all(leaves, node_name);
  if (!loom::kernels::leaves_have_shape<E>(leaves, s))
    return false;
  using R = typename E::value_type;
  out = g.allocate(dtype_of<R>, s);
  detail::launch(detail::region_tree<E>(leaves), static_cast<R*>(out.device_data()),
                 static_cast<std::size_t>(s.num_elements()), g.stream);
  return true;
}

// Registers the region's GPU kernel under its key (kernels/fused.hpp, in a
// unit compiled by nvcc); a tree with strings has none.
template <class E> void register_gpu_region(const std::string& key) {
  if constexpr (gpu_fusable<E>())
    loom::kernels::fused_kernel_registry::instance().add(key, &gpu_fused_kernel<E>);
}

} // namespace loom::cuda

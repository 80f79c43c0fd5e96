// CPU kernels of the elementwise ops, on Eigen: one primitive kernel per op
// and dtype with TF broadcasting, evaluating the op tag's eval() (the same
// Eigen form the fused kernels use), registered for every op of
// ops::elementwise_ops, and cast per destination dtype.
#pragma once

#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/expr/ops.hpp>
#include <loom/kernels/checks/elementwise.hpp>
#include <loom/kernels/cpu/eigen_tensor.hpp>
#include <loom/kernels/cpu/parallel_for.hpp>
#include <loom/kernels/registry.hpp>

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>

namespace loom::kernels {

// Materialises t broadcast to `to` (TF semantics), for the general case.
template <class T>
any_tensor broadcast_to(const cpu_device& d, const any_tensor& t, const loom::shape& to) {
  constexpr int max_rank = 6;
  if (to.rank() > max_rank)
    throw unimplemented_error("broadcasting beyond rank 6 (shape " + to.to_string() + ")");
  any_tensor out(t.type(), to);
  Eigen::array<Eigen::DenseIndex, max_rank> in_dims{}, out_dims{}, factors{};
  const int pad = max_rank - to.rank(), in_pad = max_rank - t.rank();
  for (int i = 0; i < max_rank; ++i) {
    out_dims[static_cast<std::size_t>(i)] = i < pad ? 1 : to[i - pad];
    in_dims[static_cast<std::size_t>(i)] = i < in_pad ? 1 : t.shape()[i - in_pad];
    factors[static_cast<std::size_t>(i)] =
        in_dims[static_cast<std::size_t>(i)] == 1 ? out_dims[static_cast<std::size_t>(i)] : 1;
  }
  const_tensor_map<T, max_rank> src(t.data<T>(), in_dims);
  tensor_map<T, max_rank> dst(out.data<T>(), out_dims);
  dst.device(d) = src.broadcast(factors);
  return out;
}

// Calls f with one Eigen operand per input for the chunk [first, first + len),
// each the full tensor's chunk or its single element repeated, so `x * 2` and
// `x * y` both take one pass. When every operand is a single element the output
// has one element too, and the operands are read as tensors: no all-constant
// instantiation is needed.
template <class In, bool FirstIsBool, std::size_t I, std::size_t N, bool AnyTensor = false, class F,
          class... Operands>
void with_flat_operands(std::span<const any_tensor* const> in, Eigen::DenseIndex n,
                        Eigen::DenseIndex first, Eigen::DenseIndex len, F&& f,
                        const Operands&... ops) {
  if constexpr (I == N) {
    f(ops...);
  } else {
    const any_tensor& t = *in[I];
    using TI = std::conditional_t<I == 0 && FirstIsBool, bool, In>;
    // The last operand is read as a tensor if none before it was.
    constexpr bool may_repeat = AnyTensor || I + 1 < N;
    if constexpr (may_repeat) {
      if (t.num_elements() == 1 && n != 1) {
        with_flat_operands<In, FirstIsBool, I + 1, N, AnyTensor>(in, n, first, len, f, ops...,
                                                                 repeated_operand<TI>(t, len));
        return;
      }
    }
    with_flat_operands<In, FirstIsBool, I + 1, N, true>(in, n, first, len, f, ops...,
                                                        flat_operand<TI>(t, first, len));
  }
}

// One elementwise op over runtime tensors. Operands that already have the
// output's shape, or hold a single element, are read in place; others are
// broadcast into a temporary first.
template <class Op, class T>
any_tensor elementwise_kernel(const cpu_device& d, std::span<const any_tensor* const> in,
                              const std::string& node_name) {
  constexpr std::size_t n_in = static_cast<std::size_t>(Op::arity);
  using Out = ops::result_for_t<Op, T>;

  const loom::shape out_shape = kernels::broadcast_all(in, node_name);
  const Eigen::DenseIndex n = out_shape.num_elements();
  std::array<any_tensor, n_in> expanded;
  std::array<const any_tensor*, n_in> operands{};
  for (std::size_t i = 0; i < n_in; ++i) {
    const any_tensor& t = *in[i];
    if (t.num_elements() == 1 || t.shape() == out_shape)
      operands[i] = &t;
    else {
      expanded[i] = visit_dtype(t.type(), [&]<class E>() -> any_tensor {
        if constexpr (std::is_same_v<E, std::string>)
          throw invalid_argument_error(node_name + ": string operand");
        else
          return kernels::broadcast_to<E>(d, t, out_shape);
      });
      operands[i] = &expanded[i];
    }
  }
  any_tensor out(dtype_of<Out>, out_shape);
  if (n == 0)
    return out;
  Out* dst = out.data<Out>();
  constexpr bool first_is_bool = std::is_same_v<Op, ops::select>; // select's condition
  const Eigen::TensorOpCost cost(static_cast<double>(n_in * sizeof(T)), sizeof(Out), 4.0);
  kernels::parallel_chunks(d, n, cost, [&](Eigen::DenseIndex first, Eigen::DenseIndex len) {
    kernels::with_flat_operands<T, first_is_bool, 0, n_in>(
        operands, n, first, len,
        [&](const auto&... ops) { kernels::chunk_map<Out>(dst + first, len) = Op::eval(ops...); });
  });
  return out;
}

template <class Op> struct elementwise_cpu {
  template <class T> struct kernel {
    static void run(kernel_context& c) {
      c.output = elementwise_kernel<Op, T>(c.device, c.inputs, c.node.name);
    }
  };
};

// cast dispatches on its destination dtype at run time.
template <class From> struct cast_cpu {
  static void run(kernel_context& c) {
    c.output = visit_dtype(c.node.attr<dtype>("dst"), [&]<class To>() -> any_tensor {
      if constexpr (std::is_same_v<To, std::string>)
        throw invalid_argument_error("node " + c.node.describe() + ": cannot cast to string");
      else
        return elementwise_kernel<ops::cast<To>, From>(c.device, c.inputs, c.node.name);
    });
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
template <class... Op> bool register_elementwise_kernels(type_list<Op...>) {
  (register_kernels<elementwise_cpu<Op>::template kernel>(Op::id, typename Op::types{}), ...);
  register_kernels<cast_cpu>("cast", all_types_but_string{});
  return true;
}

inline const bool elementwise_kernels_registered =
    register_elementwise_kernels(ops::elementwise_ops{});
#endif

} // namespace loom::kernels

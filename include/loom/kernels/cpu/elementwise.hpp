// CPU kernels of the elementwise ops, generated from the op tags: the same
// eval() the fused kernels use.
#pragma once

#include <loom/expr/eval.hpp>
#include <loom/expr/ops.hpp>
#include <loom/kernels/registry.hpp>

namespace loom::detail {

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

template <class... Op> bool register_elementwise_kernels() {
  (register_kernels<elementwise_cpu<Op>::template kernel>(Op::id, typename Op::types{}), ...);
  register_kernels<cast_cpu>("cast", all_types_but_string{});
  return true;
}

inline const bool elementwise_kernels_registered = register_elementwise_kernels<
    ops::neg, ops::exp, ops::log, ops::sqrt, ops::square, ops::abs, ops::sign, ops::relu,
    ops::sigmoid, ops::tanh, ops::reciprocal, ops::add, ops::sub, ops::mul, ops::div, ops::maximum,
    ops::minimum, ops::relu_grad, ops::less, ops::less_equal, ops::greater, ops::greater_equal,
    ops::equal, ops::not_equal, ops::clip_by_value, ops::select>();

} // namespace loom::detail

// GPU kernels of the elementwise ops and cast, one grid-stride kernel per op,
// dtype and arity, with the CPU kernel's broadcasting (kernels/cpu/elementwise.hpp
// elementwise_kernel): the output has the operands' broadcast shape, an
// operand of that shape is read in place, a one-element operand is repeated,
// and any other is read through strides (0 on its broadcast dimensions)
// instead of being materialised first. Each evaluates the op tag's scalar
// form (apply()), as the fused GPU kernels do.
#pragma once

#include <loom/expr/ops.hpp>
#include <loom/kernels/checks/elementwise.hpp>
#include <loom/kernels/cuda/common.cuh>
#include <loom/kernels/cuda/expression.cuh>
#include <loom/kernels/registry.hpp>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

namespace loom::kernels::cuda_kernels {

// The CPU kernels broadcast up to this rank (kernels::broadcast_to).
inline constexpr int max_broadcast_rank = 6;

// The output's dimensions, for turning a flat index into an operand's offset.
struct out_dims {
  int rank = 0;
  std::int64_t dims[max_broadcast_rank] = {};
};

// How one operand is read at output index i.
struct operand {
  enum mode_t : int { full, repeated, strided };
  const void* p = nullptr;
  int mode = full;
  std::int64_t stride[max_broadcast_rank] = {}; // per output dimension; 0 where broadcast
};

template <class T> __device__ inline T load(const operand& o, const out_dims& d, std::int64_t i) {
  const T* p = static_cast<const T*>(o.p);
  if (o.mode == operand::full)
    return p[i];
  if (o.mode == operand::repeated)
    return p[0];
  std::int64_t off = 0;
  for (int k = d.rank - 1; k >= 0; --k) {
    const std::int64_t q = i / d.dims[k];
    off += (i - q * d.dims[k]) * o.stride[k];
    i = q;
  }
  return p[off];
}

template <class Op, class R, class A>
__global__ void __launch_bounds__(block_threads)
    unary_kernel(R* out, std::int64_t n, out_dims d, operand a) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] = Op::apply(load<A>(a, d, i));
}

template <class Op, class R, class A>
__global__ void __launch_bounds__(block_threads)
    binary_kernel(R* out, std::int64_t n, out_dims d, operand a, operand b) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] = Op::apply(load<A>(a, d, i), load<A>(b, d, i));
}

// select's first operand is its bool condition.
template <class Op, class R, class A0, class A>
__global__ void __launch_bounds__(block_threads)
    ternary_kernel(R* out, std::int64_t n, out_dims d, operand a, operand b, operand c) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] = Op::apply(load<A0>(a, d, i), load<A>(b, d, i), load<A>(c, d, i));
}

// Op over the kernel's inputs, T being the dtype the kernel was chosen by.
template <class Op, class T> void elementwise(kernel_context& c) {
  const gpu_context& g = gpu_of(c);
  constexpr std::size_t n_in = static_cast<std::size_t>(Op::arity);
  using Out = ops::result_for_t<Op, T>;
  if (c.inputs.size() != n_in)
    throw invalid_argument_error("node " + c.node.describe() + ": needs " + std::to_string(n_in) +
                                 " inputs, got " + std::to_string(c.inputs.size()));
  const loom::shape out_shape = loom::kernels::broadcast_all(c.inputs, c.node.name);
  const std::int64_t n = out_shape.num_elements();
  out_dims d;
  std::array<operand, 3> ops{};
  for (std::size_t k = 0; k < n_in; ++k) {
    const any_tensor& t = c.input(k);
    operand& o = ops[k];
    o.p = t.device_data();
    if (t.num_elements() == 1 || t.shape() == out_shape) {
      o.mode = t.shape() == out_shape ? operand::full : operand::repeated;
      continue;
    }
    if (out_shape.rank() > max_broadcast_rank) // the CPU kernel's limit and message
      throw unimplemented_error("broadcasting beyond rank 6 (shape " + out_shape.to_string() + ")");
    o.mode = operand::strided;
    d.rank = out_shape.rank();
    const int pad = out_shape.rank() - t.rank();
    std::int64_t s = 1;
    for (int i = t.rank() - 1; i >= 0; --i) {
      o.stride[i + pad] = t.shape()[i] == 1 ? 0 : s;
      s *= t.shape()[i];
    }
  }
  for (int i = 0; i < out_shape.rank() && i < max_broadcast_rank; ++i)
    d.dims[i] = out_shape[i];
  c.output = g.allocate(dtype_of<Out>, out_shape);
  if (n == 0)
    return;
  Out* out = c.output.template device_data<Out>();
  const unsigned blocks = grid_for(n);
  if constexpr (n_in == 1)
    unary_kernel<Op, Out, T><<<blocks, block_threads, 0, g.stream>>>(out, n, d, ops[0]);
  else if constexpr (n_in == 2)
    binary_kernel<Op, Out, T><<<blocks, block_threads, 0, g.stream>>>(out, n, d, ops[0], ops[1]);
  else {
    using A0 = std::conditional_t<std::is_same_v<Op, ops::select>, bool, T>;
    ternary_kernel<Op, Out, A0, T>
        <<<blocks, block_threads, 0, g.stream>>>(out, n, d, ops[0], ops[1], ops[2]);
  }
  check_launch();
}

template <class Op> struct elementwise_gpu {
  template <class T> struct kernel {
    static void run(kernel_context& c) { elementwise<Op, T>(c); }
  };
};

// cast dispatches on its destination dtype at run time, as the CPU kernel.
template <class From> struct cast_gpu {
  static void run(kernel_context& c) {
    visit_dtype(c.node.attr<dtype>("dst"), [&]<class To>() {
      if constexpr (std::is_same_v<To, std::string>)
        throw invalid_argument_error("node " + c.node.describe() + ": cannot cast to string");
      else
        elementwise<ops::cast<To>, From>(c);
    });
  }
};

template <class... Op> bool register_elementwise_gpu(type_list<Op...>) {
  (register_kernels<elementwise_gpu<Op>::template kernel>(Op::id, typename Op::types{}, device_gpu),
   ...);
  register_kernels<cast_gpu>("cast", all_types_but_string{}, device_gpu);
  return true;
}

inline const bool elementwise_gpu_registered = register_elementwise_gpu(ops::elementwise_ops{});

} // namespace loom::kernels::cuda_kernels

// The elementwise ops, each defined once. A tag says its op id, its arity, the
// dtypes it has kernels for, its result type and its semantics twice, side by
// side: eval(), on Eigen expressions (the packet form the CPU's primitive and
// fused kernels vectorise), and apply(), on single values, host and device
// (the form every GPU kernel runs, primitive and fused). The kernels' test
// checks that the two agree for every op and dtype (tests/kernels,
// "elementwise ops: the Eigen form and the scalar form agree"), so the CPU and
// the GPU cannot differ. `elementwise_ops` lists them for every registration:
// the graph's op definitions, the CPU kernels and the GPU kernels.
#pragma once

#include <loom/core/dtype.hpp>

#include <cmath>
#include <cstdint>
#include <type_traits>

// A function callable from host and device code: __host__ __device__ where
// nvcc compiles, nothing elsewhere.
#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

namespace loom::ops {

// relu_grad's Eigen functor: defined beside Eigen's packets, in the kernel layer
// (kernels/cpu/eigen_tensor.hpp), where every eval() is instantiated.
template <class T> struct relu_grad_fn;
// pow's Eigen functor (kernels/cpu/eigen_tensor.hpp): the Tensor module has a pow of a
// scalar exponent only.
template <class T> struct pow_fn;
// cos's and sin's (Eigen's packet forms; the Tensor module names neither).
template <class T> struct cos_fn;
template <class T> struct sin_fn;

using int_and_float_types = type_list<float, double, std::int32_t, std::int64_t>;

// The scalar math the apply()s share: the float functions for float (expf,
// not exp's double), and the argument order of std::max/std::min (the first
// wins ties), which is Eigen's scalar cwiseMax/cwiseMin.
namespace scalar {
template <class T> LOOM_HOST_DEVICE inline T exp(T a) {
  if constexpr (std::is_same_v<T, float>)
    return ::expf(a);
  else
    return ::exp(a);
}
template <class T> LOOM_HOST_DEVICE inline T log(T a) {
  if constexpr (std::is_same_v<T, float>)
    return ::logf(a);
  else
    return ::log(a);
}
template <class T> LOOM_HOST_DEVICE inline T sqrt(T a) {
  if constexpr (std::is_same_v<T, float>)
    return ::sqrtf(a);
  else
    return ::sqrt(a);
}
template <class T> LOOM_HOST_DEVICE inline T tanh(T a) {
  if constexpr (std::is_same_v<T, float>)
    return ::tanhf(a);
  else
    return ::tanh(a);
}
template <class T> LOOM_HOST_DEVICE inline T cos(T a) {
  if constexpr (std::is_same_v<T, float>)
    return ::cosf(a);
  else
    return ::cos(a);
}
template <class T> LOOM_HOST_DEVICE inline T sin(T a) {
  if constexpr (std::is_same_v<T, float>)
    return ::sinf(a);
  else
    return ::sin(a);
}
template <class T> LOOM_HOST_DEVICE inline T log1p(T a) {
  if constexpr (std::is_same_v<T, float>)
    return ::log1pf(a);
  else
    return ::log1p(a);
}
template <class T> LOOM_HOST_DEVICE inline T expm1(T a) {
  if constexpr (std::is_same_v<T, float>)
    return ::expm1f(a);
  else
    return ::expm1(a);
}
template <class T> LOOM_HOST_DEVICE inline T pow(T a, T b) {
  if constexpr (std::is_same_v<T, float>)
    return ::powf(a, b);
  else
    return ::pow(a, b);
}
template <class T> LOOM_HOST_DEVICE inline T max(T a, T b) {
  return a < b ? b : a;
}
template <class T> LOOM_HOST_DEVICE inline T min(T a, T b) {
  return b < a ? b : a;
}
} // namespace scalar

// NAME: the struct and its op id. RESULT: the result type, written with T (the
// operands' type). PACKET: eval()'s body over Eigen expressions a (and b).
// SCALAR: apply()'s body over values a (and b) of type T.
#define LOOM_UNARY_OP(NAME, TYPES, PACKET, SCALAR)                                                 \
  struct NAME {                                                                                    \
    static constexpr const char* id = #NAME;                                                       \
    static constexpr int arity = 1;                                                                \
    using types = TYPES;                                                                           \
    template <class T> using result = T;                                                           \
    template <class A> static auto eval(const A& a) { return PACKET; }                             \
    template <class T> LOOM_HOST_DEVICE static T apply(T a) { return SCALAR; }                     \
  };

#define LOOM_BINARY_OP(NAME, TYPES, RESULT, PACKET, SCALAR)                                        \
  struct NAME {                                                                                    \
    static constexpr const char* id = #NAME;                                                       \
    static constexpr int arity = 2;                                                                \
    using types = TYPES;                                                                           \
    template <class T, class> using result = RESULT;                                               \
    template <class A, class B> static auto eval(const A& a, const B& b) { return PACKET; }        \
    template <class T> LOOM_HOST_DEVICE static RESULT apply(T a, T b) { return SCALAR; }           \
  };

// clang-format off
//            name        dtypes               Eigen form                   scalar form
LOOM_UNARY_OP(neg,        int_and_float_types, -a,                          T(-a))
LOOM_UNARY_OP(exp,        floating_types,      a.exp(),                     scalar::exp(a))
LOOM_UNARY_OP(log,        floating_types,      a.log(),                     scalar::log(a))
LOOM_UNARY_OP(sqrt,       floating_types,      a.sqrt(),                    scalar::sqrt(a))
LOOM_UNARY_OP(square,     int_and_float_types, a.square(),                  T(a * a))
LOOM_UNARY_OP(abs,        int_and_float_types, a.abs(),                     a < T(0) ? T(-a) : a)
LOOM_UNARY_OP(relu,       int_and_float_types, a.cwiseMax(typename A::Scalar(0)), scalar::max(a, T(0)))
LOOM_UNARY_OP(sigmoid,    floating_types,      a.sigmoid(),                 T(1) / (T(1) + scalar::exp(T(-a))))
LOOM_UNARY_OP(tanh,       floating_types,      a.tanh(),                    scalar::tanh(a))
LOOM_UNARY_OP(reciprocal, floating_types,      a.inverse(),                 T(1) / a)
LOOM_UNARY_OP(cos,        floating_types,      a.unaryExpr(cos_fn<typename A::Scalar>{}), scalar::cos(a))
LOOM_UNARY_OP(sin,        floating_types,      a.unaryExpr(sin_fn<typename A::Scalar>{}), scalar::sin(a))
LOOM_UNARY_OP(rsqrt,      floating_types,      a.rsqrt(),                   T(1) / scalar::sqrt(a))
// elu (TF's Elu): exp(x) - 1 below zero, x elsewhere, computed as expm1: exp(x) - 1
// cancels near zero, where a last-bit difference between two exp()s (Eigen's and
// CUDA's) became a 2e-5 relative difference. The Eigen form adds a zero to each side
// instead of choosing (Eigen's select goes a bool at a time): expm1(min(x, 0)) is
// exactly 0 for x >= 0, and max(x, 0) exactly 0 for x < 0.
LOOM_UNARY_OP(elu,        floating_types,
              a.cwiseMax(typename A::Scalar(0)) + a.cwiseMin(typename A::Scalar(0)).expm1(),
              a < T(0) ? scalar::expm1(a) : a)
// softplus, log(1 + exp(x)), as max(x, 0) + log1p(exp(-|x|)): no overflow for a large x,
// no loss of the small result for a very negative one.
LOOM_UNARY_OP(softplus,   floating_types,
              a.cwiseMax(typename A::Scalar(0)) + (-a.abs()).exp().log1p(),
              T(scalar::max(a, T(0)) + scalar::log1p(scalar::exp(T(a < T(0) ? a : -a)))))

//             name      dtypes               result Eigen form       scalar form
LOOM_BINARY_OP(add,      int_and_float_types, T,     a + b,           T(a + b))
LOOM_BINARY_OP(sub,      int_and_float_types, T,     a - b,           T(a - b))
LOOM_BINARY_OP(mul,      int_and_float_types, T,     a * b,           T(a * b))
LOOM_BINARY_OP(div,      int_and_float_types, T,     a / b,           T(a / b))
LOOM_BINARY_OP(maximum,  int_and_float_types, T,     a.cwiseMax(b),   scalar::max(a, b))
LOOM_BINARY_OP(minimum,  int_and_float_types, T,     a.cwiseMin(b),   scalar::min(a, b))
LOOM_BINARY_OP(pow,      floating_types,      T,     a.binaryExpr(b, pow_fn<typename A::Scalar>{}), scalar::pow(a, b))
// The adjoint of relu: dy where the forward input was positive (a = dy, b = x).
// Its Eigen form is a functor with packet math (relu_grad_fn), not select() over
// a comparison, which Eigen's Tensor module evaluates a bool at a time.
LOOM_BINARY_OP(relu_grad, floating_types,     T,
               a.binaryExpr(b, relu_grad_fn<typename A::Scalar>{}),
               b > T(0) ? a : T(0))
LOOM_BINARY_OP(less,          int_and_float_types, bool, a < b,  a < b)
LOOM_BINARY_OP(less_equal,    int_and_float_types, bool, a <= b, a <= b)
LOOM_BINARY_OP(greater,       int_and_float_types, bool, a > b,  a > b)
LOOM_BINARY_OP(greater_equal, int_and_float_types, bool, a >= b, a >= b)
// Eigen's member operators are called by name: C++20 would otherwise also
// consider the rewritten (reversed) comparisons, which clang finds ambiguous.
LOOM_BINARY_OP(equal,     all_types_but_string, bool, a.operator==(b), a == b)
LOOM_BINARY_OP(not_equal, all_types_but_string, bool, a.operator!=(b), a != b)
// clang-format on

#undef LOOM_UNARY_OP
#undef LOOM_BINARY_OP

// sign(x): -1, 0 or 1, and NaN for NaN (Eigen's and TF's).
struct sign {
  static constexpr const char* id = "sign";
  static constexpr int arity = 1;
  using types = int_and_float_types;
  template <class T> using result = T;
  template <class A> static auto eval(const A& a) { return a.sign(); }
  template <class T> LOOM_HOST_DEVICE static T apply(T a) {
    if constexpr (std::is_floating_point_v<T>) {
      if (a != a)
        return a;
    }
    return T(int(a > T(0)) - int(a < T(0)));
  }
};

// clip_by_value(x, lo, hi): TF's ClipByValue, three inputs.
struct clip_by_value {
  static constexpr const char* id = "clip_by_value";
  static constexpr int arity = 3;
  using types = int_and_float_types;
  template <class T, class, class> using result = T;
  template <class X, class L, class H> static auto eval(const X& x, const L& lo, const H& hi) {
    return x.cwiseMax(lo).cwiseMin(hi);
  }
  template <class T> LOOM_HOST_DEVICE static T apply(T x, T lo, T hi) {
    return scalar::min(scalar::max(x, lo), hi);
  }
};

// select(cond, a, b): a where cond, else b (TF's Select/where).
struct select {
  static constexpr const char* id = "select";
  static constexpr int arity = 3;
  static constexpr int type_input = 1; // kernels are chosen by a's dtype; cond is bool
  using types = int_and_float_types;
  template <class, class T, class> using result = T;
  template <class C, class A, class B> static auto eval(const C& c, const A& a, const B& b) {
    return c.select(a, b);
  }
  template <class T> LOOM_HOST_DEVICE static T apply(bool c, T a, T b) { return c ? a : b; }
};

// cast<U>: the only op whose result type is a parameter. Its op id is "cast";
// the destination dtype travels as the node's "dst" attribute.
template <element_type U> struct cast {
  static constexpr const char* id = "cast";
  static constexpr int arity = 1;
  using types = all_types_but_string;
  template <class> using result = U;
  template <class A> static auto eval(const A& a) { return a.template cast<U>(); }
  template <class T> LOOM_HOST_DEVICE static U apply(T a) { return static_cast<U>(a); }
};

// Every elementwise op but cast (registered per destination dtype at run
// time): what the graph, the CPU and the GPU register, from this one list.
using elementwise_ops =
    type_list<neg, exp, log, sqrt, square, abs, sign, relu, sigmoid, tanh, reciprocal, rsqrt, elu,
              softplus, cos, sin, add, sub, mul, div, maximum, minimum, pow, relu_grad, less,
              less_equal, greater, greater_equal, equal, not_equal, clip_by_value, select>;

// Op's result type when every operand has element type T (select's condition
// too: its result<> ignores that operand).
template <class Op, class T, int N = Op::arity> struct result_for;
template <class Op, class T> struct result_for<Op, T, 1> {
  using type = typename Op::template result<T>;
};
template <class Op, class T> struct result_for<Op, T, 2> {
  using type = typename Op::template result<T, T>;
};
template <class Op, class T> struct result_for<Op, T, 3> {
  using type = typename Op::template result<T, T, T>;
};
template <class Op, class T> using result_for_t = typename result_for<Op, T>::type;

} // namespace loom::ops

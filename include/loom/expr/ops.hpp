// The elementwise ops. Each tag says, in one place, its stable op id, its
// arity, the dtypes it has kernels for, its result type and how it evaluates
// on Eigen expressions. The same eval() builds the primitive CPU kernel and
// every fused kernel instantiated from a typed tree, so the two cannot differ.
#pragma once

#include <loom/core/dtype.hpp>

#include <cstdint>
#include <string>

namespace loom::ops {

using int_and_float_types = type_list<float, double, std::int32_t, std::int64_t>;

#define LOOM_UNARY_OP(NAME, ID, TYPES, BODY)                                                       \
  struct NAME {                                                                                    \
    static constexpr const char* id = ID;                                                          \
    static constexpr int arity = 1;                                                                \
    using types = TYPES;                                                                           \
    template <class T> using result = T;                                                           \
    template <class A> static auto eval(const A& a) { return BODY; }                               \
  };

#define LOOM_BINARY_OP(NAME, ID, TYPES, RESULT, BODY)                                              \
  struct NAME {                                                                                    \
    static constexpr const char* id = ID;                                                          \
    static constexpr int arity = 2;                                                                \
    using types = TYPES;                                                                           \
    template <class T, class> using result = RESULT;                                               \
    template <class A, class B> static auto eval(const A& a, const B& b) { return BODY; }          \
  };

// clang-format off
LOOM_UNARY_OP(neg, "neg", int_and_float_types, -a)
LOOM_UNARY_OP(exp, "exp", floating_types, a.exp())
LOOM_UNARY_OP(log, "log", floating_types, a.log())
LOOM_UNARY_OP(sqrt, "sqrt", floating_types, a.sqrt())
LOOM_UNARY_OP(square, "square", int_and_float_types, a.square())
LOOM_UNARY_OP(abs, "abs", int_and_float_types, a.abs())
LOOM_UNARY_OP(sign, "sign", int_and_float_types, a.sign())
LOOM_UNARY_OP(relu, "relu", int_and_float_types, a.cwiseMax(typename A::Scalar(0)))
LOOM_UNARY_OP(sigmoid, "sigmoid", floating_types, a.sigmoid())
LOOM_UNARY_OP(tanh, "tanh", floating_types, a.tanh())
LOOM_UNARY_OP(reciprocal, "reciprocal", floating_types, a.inverse())

LOOM_BINARY_OP(add, "add", int_and_float_types, T, a + b)
LOOM_BINARY_OP(sub, "sub", int_and_float_types, T, a - b)
LOOM_BINARY_OP(mul, "mul", int_and_float_types, T, a * b)
LOOM_BINARY_OP(div, "div", int_and_float_types, T, a / b)
LOOM_BINARY_OP(maximum, "maximum", int_and_float_types, T, a.cwiseMax(b))
LOOM_BINARY_OP(minimum, "minimum", int_and_float_types, T, a.cwiseMin(b))
// The adjoint of relu: dy where the forward input was positive (a = dy, b = x).
LOOM_BINARY_OP(relu_grad, "relu_grad", floating_types, T,
               (b > b.constant(typename B::Scalar(0))).select(a, a.constant(typename A::Scalar(0))))
LOOM_BINARY_OP(less, "less", int_and_float_types, bool, a < b)
LOOM_BINARY_OP(less_equal, "less_equal", int_and_float_types, bool, a <= b)
LOOM_BINARY_OP(greater, "greater", int_and_float_types, bool, a > b)
LOOM_BINARY_OP(greater_equal, "greater_equal", int_and_float_types, bool, a >= b)
// Eigen's member operators are called by name: C++20 would otherwise also
// consider the rewritten (reversed) comparisons, which clang finds ambiguous.
LOOM_BINARY_OP(equal, "equal", all_types_but_string, bool, a.operator==(b))
LOOM_BINARY_OP(not_equal, "not_equal", all_types_but_string, bool, a.operator!=(b))
// clang-format on

#undef LOOM_UNARY_OP
#undef LOOM_BINARY_OP

// clip_by_value(x, lo, hi): TF's ClipByValue, three inputs.
struct clip_by_value {
  static constexpr const char* id = "clip_by_value";
  static constexpr int arity = 3;
  using types = int_and_float_types;
  template <class T, class, class> using result = T;
  template <class X, class L, class H> static auto eval(const X& x, const L& lo, const H& hi) {
    return x.cwiseMax(lo).cwiseMin(hi);
  }
};

// select(cond, a, b): a where cond, else b (TF's Select/where).
struct select {
  static constexpr const char* id = "select";
  static constexpr int arity = 3;
  static constexpr int type_input = 1; // kernels are chosen by a's dtype, not cond's
  using types = int_and_float_types;
  template <class, class T, class> using result = T;
  template <class C, class A, class B> static auto eval(const C& c, const A& a, const B& b) {
    return c.select(a, b);
  }
};

// cast<U>: the only op whose result type is a parameter. Its op id is "cast";
// the destination dtype travels as the node's "dst" attribute.
template <element_type U> struct cast {
  static constexpr const char* id = "cast";
  static constexpr int arity = 1;
  using types = all_types_but_string;
  template <class> using result = U;
  template <class A> static auto eval(const A& a) { return a.template cast<U>(); }
};

} // namespace loom::ops

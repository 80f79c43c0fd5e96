// The typed front end. An expression is a small value type with its element
// type and rank in the type: expr<Op, Children...> for an elementwise op over
// sub-expressions, scalar_leaf<T> for a C++ number, and graph leaves (defined
// in graph/, holding a shared handle to their node). Elementwise expressions
// stay lazy, so a whole elementwise tree reaches the graph at once and can be
// fused into one kernel; every other op materialises a graph node. Each
// expr<> keeps the graph's scopes current where it was written (device, name,
// control dependencies: graph/scope.hpp), and is lowered under them, as TF
// creates an op under the scopes where its Python line runs.
#pragma once

#include <loom/core/dtype.hpp>
#include <loom/expr/ops.hpp>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

namespace loom {

// Where an expression may run. Kinds live in the type; the location (job,
// task, device index) is decided at run time by placement.
struct any_device {};
struct cpu {};
struct gpu {};

// Anything usable as an operand: an element type, a rank, a device kind, and
// whether it is a leaf. Graph handles (and types derived from them, such as
// variables and placeholders) model it as well as expr<> trees.
template <class E>
concept expression = requires {
  typename std::remove_cvref_t<E>::value_type;
  typename std::remove_cvref_t<E>::device_kind;
  { std::remove_cvref_t<E>::rank } -> std::convertible_to<int>;
  { std::remove_cvref_t<E>::is_leaf } -> std::convertible_to<bool>;
};

// A C++ number inside an expression; lowers to a constant node (as TF turns a
// Python number into a Const).
template <element_type T> struct scalar_leaf {
  using value_type = T;
  static constexpr int rank = 0;
  using device_kind = any_device;
  static constexpr bool is_leaf = true;
  T value;
};

namespace detail {
// The graph's scopes where an expression was written; defined by the graph
// layer (graph/scope.hpp), carried here as an opaque shared pointer.
struct scope_frame;
using scope_ptr = std::shared_ptr<const scope_frame>;
} // namespace detail

template <class Op, class... Children> struct expr {
  using op_type = Op;
  using value_type = typename Op::template result<typename Children::value_type...>;
  static constexpr int rank = std::max({Children::rank...});
  using device_kind = any_device;
  static constexpr bool is_leaf = false;

  Op op;
  std::tuple<Children...> children;
  detail::scope_ptr written{}; // the scopes it is lowered under (null: none)
};

template <expression E> using value_type_of = typename std::remove_cvref_t<E>::value_type;
template <expression E> inline constexpr int rank_of = std::remove_cvref_t<E>::rank;

namespace detail {

// How many leaves a typed tree has, counted in depth-first order: the fused
// kernel reads its inputs in that order.
template <class E> constexpr std::size_t leaf_count() {
  if constexpr (E::is_leaf)
    return 1;
  else
    return []<class Op, class... C>(std::type_identity<expr<Op, C...>>) {
      return (leaf_count<C>() + ... + 0);
    }(std::type_identity<E>{});
}

// Where each child of a (non-leaf) typed tree starts among the leaves, in
// depth-first order, when the tree's own first leaf is leaf Offset: child k's
// leaves are the inputs from child_leaf_offsets<E, Offset>()[k] on. The fused
// kernels (CPU and GPU) walk their inputs with it.
template <class E, std::size_t Offset = 0> constexpr auto child_leaf_offsets() {
  return []<class Op, class... C>(std::type_identity<expr<Op, C...>>) {
    std::array<std::size_t, sizeof...(C)> at{};
    std::size_t next = Offset, k = 0;
    ((at[k++] = next, next += leaf_count<C>()), ...);
    return at;
  }(std::type_identity<E>{});
}

// How many ops a typed tree has; a region of one op is not worth fusing.
template <class E> constexpr std::size_t op_count() {
  if constexpr (E::is_leaf)
    return 0;
  else
    return []<class Op, class... C>(std::type_identity<expr<Op, C...>>) {
      return (op_count<C>() + ... + 1);
    }(std::type_identity<E>{});
}

} // namespace detail

namespace detail {

// Whether a typed tree has a leaf in a graph (not only numbers).
template <class E> constexpr bool has_graph_leaf() {
  if constexpr (E::is_leaf)
    return requires(const E& e) {
      e.graph();
    };
  else
    return []<class Op, class... C>(std::type_identity<expr<Op, C...>>) {
      return (has_graph_leaf<C>() || ...);
    }(std::type_identity<E>{});
}

// The scopes current now in the graph of e's leaves.
template <class E> scope_ptr scope_now(const E& e) {
  if constexpr (E::is_leaf) {
    if constexpr (has_graph_leaf<E>())
      return e.graph().current_scope();
    else
      return nullptr;
  } else {
    scope_ptr s;
    bool found = false;
    std::apply(
        [&](const auto&... c) {
          ((!found && has_graph_leaf<std::remove_cvref_t<decltype(c)>>()
                ? (s = scope_now(c), found = true)
                : false),
           ...);
        },
        e.children);
    return s;
  }
}

// An expr<> node over `children`, written under the graph's current scopes.
template <class Op, class... C> auto make_expr(C&&... children) {
  expr<Op, std::remove_cvref_t<C>...> e{Op{}, {std::forward<C>(children)...}};
  e.written = scope_now(e);
  return e;
}

template <class T, class... Ts>
struct is_type_in_list_impl : std::bool_constant<(std::is_same_v<T, Ts> || ...)> {};
template <class T, class L> struct in_list;
template <class T, class... Ts>
struct in_list<T, type_list<Ts...>> : is_type_in_list_impl<T, Ts...> {};

template <class Op, class T>
inline constexpr bool op_supports = in_list<T, typename Op::types>::value;

// Turns a C++ number into a leaf of the other operand's element type, as TF
// converts a Python scalar to the tensor's dtype.
template <class T, class S> constexpr auto as_operand(S&& s) {
  if constexpr (expression<S>)
    return std::remove_cvref_t<S>(std::forward<S>(s));
  else
    return scalar_leaf<T>{static_cast<T>(s)};
}

template <class Op, expression A> constexpr void check_unary() {
  using T = value_type_of<A>;
  static_assert(op_supports<Op, T>, "loom: this elementwise op has no kernel for the operand's "
                                    "dtype (e.g. exp/log/sqrt/sigmoid/tanh need float or double, "
                                    "arithmetic needs a numeric dtype); use loom::cast<T>() first");
}

template <class Op, class A, class B> constexpr void check_binary() {
  using TA = value_type_of<A>;
  using TB = value_type_of<B>;
  static_assert(std::is_same_v<TA, TB>,
                "loom: the operands of an elementwise op have different dtypes; loom never "
                "converts implicitly (TF does not either): use loom::cast<T>() on one of them");
  static_assert(op_supports<Op, TA>, "loom: this elementwise op has no kernel for the operands' "
                                     "dtype (bool and string tensors have no arithmetic)");
}

template <class Op, class A, class B> auto make_binary(A&& a, B&& b) {
  using AD = std::remove_cvref_t<A>;
  using BD = std::remove_cvref_t<B>;
  if constexpr (expression<AD> && expression<BD>) {
    check_binary<Op, AD, BD>();
    return make_expr<Op>(std::forward<A>(a), std::forward<B>(b));
  } else if constexpr (expression<AD>) {
    static_assert(std::is_arithmetic_v<BD>, "loom: the right operand is neither an expression "
                                            "nor a number");
    using T = value_type_of<AD>;
    check_binary<Op, AD, scalar_leaf<T>>();
    return make_expr<Op>(std::forward<A>(a), scalar_leaf<T>{static_cast<T>(b)});
  } else {
    static_assert(std::is_arithmetic_v<AD>, "loom: the left operand is neither an expression "
                                            "nor a number");
    using T = value_type_of<BD>;
    check_binary<Op, scalar_leaf<T>, BD>();
    return make_expr<Op>(scalar_leaf<T>{static_cast<T>(a)}, std::forward<B>(b));
  }
}

template <class A, class B>
concept binary_operands = (expression<A> || expression<B>)&&(
    expression<A> ||
    std::is_arithmetic_v<std::remove_cvref_t<A>>)&&(expression<B> ||
                                                    std::is_arithmetic_v<std::remove_cvref_t<B>>);

} // namespace detail

// -- operators ----------------------------------------------------------------
template <class A, class B>
requires detail::binary_operands<A, B>
auto operator+(A&& a, B&& b) {
  return detail::make_binary<ops::add>(std::forward<A>(a), std::forward<B>(b));
}
template <class A, class B>
requires detail::binary_operands<A, B>
auto operator-(A&& a, B&& b) {
  return detail::make_binary<ops::sub>(std::forward<A>(a), std::forward<B>(b));
}
template <class A, class B>
requires detail::binary_operands<A, B>
auto operator*(A&& a, B&& b) {
  return detail::make_binary<ops::mul>(std::forward<A>(a), std::forward<B>(b));
}
template <class A, class B>
requires detail::binary_operands<A, B>
auto operator/(A&& a, B&& b) {
  return detail::make_binary<ops::div>(std::forward<A>(a), std::forward<B>(b));
}
template <class A, class B>
requires detail::binary_operands<A, B>
auto operator<(A&& a, B&& b) {
  return detail::make_binary<ops::less>(std::forward<A>(a), std::forward<B>(b));
}
template <class A, class B>
requires detail::binary_operands<A, B>
auto operator<=(A&& a, B&& b) {
  return detail::make_binary<ops::less_equal>(std::forward<A>(a), std::forward<B>(b));
}
template <class A, class B>
requires detail::binary_operands<A, B>
auto operator>(A&& a, B&& b) {
  return detail::make_binary<ops::greater>(std::forward<A>(a), std::forward<B>(b));
}
template <class A, class B>
requires detail::binary_operands<A, B>
auto operator>=(A&& a, B&& b) {
  return detail::make_binary<ops::greater_equal>(std::forward<A>(a), std::forward<B>(b));
}

template <expression A> auto operator-(A&& a) {
  using AD = std::remove_cvref_t<A>;
  detail::check_unary<ops::neg, AD>();
  return detail::make_expr<ops::neg>(std::forward<A>(a));
}

// -- elementwise functions ------------------------------------------------------
#define LOOM_UNARY_FUNCTION(NAME)                                                                  \
  template <expression A> auto NAME(A&& a) {                                                       \
    using AD = std::remove_cvref_t<A>;                                                             \
    detail::check_unary<ops::NAME, AD>();                                                          \
    return detail::make_expr<ops::NAME>(std::forward<A>(a));                                       \
  }
LOOM_UNARY_FUNCTION(exp)
LOOM_UNARY_FUNCTION(log)
LOOM_UNARY_FUNCTION(sqrt)
LOOM_UNARY_FUNCTION(square)
LOOM_UNARY_FUNCTION(abs)
LOOM_UNARY_FUNCTION(sign)
LOOM_UNARY_FUNCTION(relu)
LOOM_UNARY_FUNCTION(sigmoid)
LOOM_UNARY_FUNCTION(tanh)
LOOM_UNARY_FUNCTION(reciprocal)
LOOM_UNARY_FUNCTION(rsqrt)
LOOM_UNARY_FUNCTION(elu)
LOOM_UNARY_FUNCTION(softplus)
LOOM_UNARY_FUNCTION(cos)
LOOM_UNARY_FUNCTION(sin)
#undef LOOM_UNARY_FUNCTION

#define LOOM_BINARY_FUNCTION(NAME)                                                                 \
  template <class A, class B>                                                                      \
  requires detail::binary_operands<A, B>                                                           \
  auto NAME(A&& a, B&& b) {                                                                        \
    return detail::make_binary<ops::NAME>(std::forward<A>(a), std::forward<B>(b));                 \
  }
LOOM_BINARY_FUNCTION(maximum)
LOOM_BINARY_FUNCTION(minimum)
LOOM_BINARY_FUNCTION(pow)
LOOM_BINARY_FUNCTION(equal)
LOOM_BINARY_FUNCTION(not_equal)
LOOM_BINARY_FUNCTION(less)
LOOM_BINARY_FUNCTION(less_equal)
LOOM_BINARY_FUNCTION(greater)
LOOM_BINARY_FUNCTION(greater_equal)
#undef LOOM_BINARY_FUNCTION

// clip_by_value(x, lo, hi) with numbers or scalar expressions as bounds.
template <expression X, class L, class H> auto clip_by_value(X&& x, L&& lo, H&& hi) {
  using XD = std::remove_cvref_t<X>;
  using T = value_type_of<XD>;
  auto l = detail::as_operand<T>(std::forward<L>(lo));
  auto h = detail::as_operand<T>(std::forward<H>(hi));
  using LD = decltype(l);
  using HD = decltype(h);
  detail::check_binary<ops::clip_by_value, XD, LD>();
  detail::check_binary<ops::clip_by_value, XD, HD>();
  static_assert(LD::rank == 0 && HD::rank == 0,
                "loom::clip_by_value: the bounds must be scalars (rank 0)");
  return detail::make_expr<ops::clip_by_value>(std::forward<X>(x), std::move(l), std::move(h));
}

// where(cond, a, b): elementwise choice (TF's tf.where with three arguments).
template <expression C, expression A, expression B> auto where(C&& c, A&& a, B&& b) {
  using CD = std::remove_cvref_t<C>;
  using AD = std::remove_cvref_t<A>;
  using BD = std::remove_cvref_t<B>;
  static_assert(std::is_same_v<value_type_of<CD>, bool>, "loom::where: the condition must be bool");
  detail::check_binary<ops::select, AD, BD>();
  return detail::make_expr<ops::select>(std::forward<C>(c), std::forward<A>(a), std::forward<B>(b));
}

// cast<U>(x): converts the element type.
template <element_type U, expression A> auto cast(A&& a) {
  using AD = std::remove_cvref_t<A>;
  static_assert(!std::is_same_v<U, std::string> && !std::is_same_v<value_type_of<AD>, std::string>,
                "loom::cast: string tensors cannot be cast");
  return detail::make_expr<ops::cast<U>>(std::forward<A>(a));
}

} // namespace loom

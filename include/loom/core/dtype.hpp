// The element types a tensor can hold, as a runtime tag (dtype) and as a
// compile-time mapping between C++ types and tags.
#pragma once

#include <loom/core/error.hpp>

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace loom {

enum class dtype : std::uint8_t { f32, f64, i32, i64, boolean, string };

constexpr std::string_view to_string(dtype d) noexcept {
  switch (d) {
  case dtype::f32: return "float32";
  case dtype::f64: return "float64";
  case dtype::i32: return "int32";
  case dtype::i64: return "int64";
  case dtype::boolean: return "bool";
  case dtype::string: return "string";
  }
  return "?";
}

constexpr std::size_t size_of(dtype d) noexcept {
  switch (d) {
  case dtype::f32: return sizeof(float);
  case dtype::f64: return sizeof(double);
  case dtype::i32: return sizeof(std::int32_t);
  case dtype::i64: return sizeof(std::int64_t);
  case dtype::boolean: return sizeof(bool);
  case dtype::string: return sizeof(std::string);
  }
  return 0;
}

namespace detail {
template <class T> struct dtype_of_impl {};
template <> struct dtype_of_impl<float> : std::integral_constant<dtype, dtype::f32> {};
template <> struct dtype_of_impl<double> : std::integral_constant<dtype, dtype::f64> {};
template <> struct dtype_of_impl<std::int32_t> : std::integral_constant<dtype, dtype::i32> {};
template <> struct dtype_of_impl<std::int64_t> : std::integral_constant<dtype, dtype::i64> {};
template <> struct dtype_of_impl<bool> : std::integral_constant<dtype, dtype::boolean> {};
template <> struct dtype_of_impl<std::string> : std::integral_constant<dtype, dtype::string> {};

template <dtype D> struct type_of_impl;
template <> struct type_of_impl<dtype::f32> { using type = float; };
template <> struct type_of_impl<dtype::f64> { using type = double; };
template <> struct type_of_impl<dtype::i32> { using type = std::int32_t; };
template <> struct type_of_impl<dtype::i64> { using type = std::int64_t; };
template <> struct type_of_impl<dtype::boolean> { using type = bool; };
template <> struct type_of_impl<dtype::string> { using type = std::string; };
} // namespace detail

// A C++ type that a tensor can hold.
template <class T>
concept element_type = requires {
  detail::dtype_of_impl<T>::value;
};

// Element types with arithmetic (everything but bool and string).
template <class T>
concept numeric_type = element_type<T> && std::is_arithmetic_v<T> && !std::is_same_v<T, bool>;

template <class T>
concept floating_type = numeric_type<T> && std::is_floating_point_v<T>;

template <element_type T> inline constexpr dtype dtype_of = detail::dtype_of_impl<T>::value;

template <dtype D> using type_of = typename detail::type_of_impl<D>::type;

// Calls f.template operator()<T>() with T the C++ type of a runtime dtype.
template <class F> decltype(auto) visit_dtype(dtype d, F&& f) {
  switch (d) {
  case dtype::f32: return f.template operator()<float>();
  case dtype::f64: return f.template operator()<double>();
  case dtype::i32: return f.template operator()<std::int32_t>();
  case dtype::i64: return f.template operator()<std::int64_t>();
  case dtype::boolean: return f.template operator()<bool>();
  case dtype::string: return f.template operator()<std::string>();
  }
  throw internal_error("visit_dtype: corrupt dtype tag " + std::to_string(static_cast<int>(d)));
}

// A compile-time list of element types, for typed tests and kernel registration.
template <class... Ts> struct type_list {};
using all_types = type_list<float, double, std::int32_t, std::int64_t, bool, std::string>;
using all_types_but_string = type_list<float, double, std::int32_t, std::int64_t, bool>;
using numeric_types = type_list<float, double, std::int32_t, std::int64_t>;
using floating_types = type_list<float, double>;

} // namespace loom

// An iterator's position as bytes, so that a pipeline stopped mid-epoch (a
// worker killed and restarted) continues where it was (TF's iterator
// checkpointing). Each stage writes a tag with its name, its own counters, the
// elements its buffers hold, and then its input's state; restore reads the same
// on a fresh iterator of the same recipe, before its first next(). A state from
// another recipe fails at the first tag that differs, naming both.
//
// Numbers are little-endian fixed width, strings and tensors length-prefixed,
// so a state moves between machines. Element types serialize here too (the
// file cache stores elements the same way): numbers, strings, tensor<T, R>,
// any_tensor, tuples, pairs, vectors, features and sparse values.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/data/features.hpp>

#include <cstdint>
#include <cstring>
#include <istream>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::data::state {

LOOM_COMPILED_ONCE void put_u64(std::ostream& out, std::uint64_t v);
LOOM_COMPILED_ONCE std::uint64_t get_u64(std::istream& in);
inline void put_i64(std::ostream& out, std::int64_t v) {
  put_u64(out, static_cast<std::uint64_t>(v));
}
inline std::int64_t get_i64(std::istream& in) {
  return static_cast<std::int64_t>(get_u64(in));
}

// A declared length is checked against this before anything is allocated, so
// corrupt bytes are an error and never a huge allocation.
inline constexpr std::uint64_t max_string_bytes = std::uint64_t{1} << 32;

inline void put_string(std::ostream& out, std::string_view s) {
  put_u64(out, s.size());
  out.write(s.data(), static_cast<std::streamsize>(s.size()));
}
LOOM_COMPILED_ONCE std::string get_string(std::istream& in);

// Each stage's state opens with its name.
inline void put_tag(std::ostream& out, std::string_view stage) {
  put_string(out, stage);
}
inline void expect_tag(std::istream& in, std::string_view stage) {
  const std::string tag = get_string(in);
  if (tag != stage)
    throw invalid_argument_error("iterator state: the saved state is a '" + tag +
                                 "' stage's where this pipeline has '" + std::string(stage) +
                                 "' (a state restores only into the recipe that saved it)");
}

template <class E> void put_element(std::ostream& out, const E& e);
template <class E> E get_element(std::istream& in);

namespace detail {
template <class T> struct is_tensor : std::false_type {};
template <class T, int R> struct is_tensor<loom::tensor<T, R>> : std::true_type {};
template <class T> struct is_tuple_like : std::false_type {};
template <class... T> struct is_tuple_like<std::tuple<T...>> : std::true_type {};
template <class A, class B> struct is_tuple_like<std::pair<A, B>> : std::true_type {};
template <class T> struct is_vector : std::false_type {};
template <class T> struct is_vector<std::vector<T>> : std::true_type {};
template <class T> struct is_sparse_value : std::false_type {};
template <class T> struct is_sparse_value<sparse_value<T>> : std::true_type {};

LOOM_COMPILED_ONCE void put_tensor(std::ostream& out, const any_tensor& t);
LOOM_COMPILED_ONCE any_tensor get_tensor(std::istream& in);
inline void put_sparse(std::ostream& out, const any_sparse& s) {
  put_tensor(out, s.indices.value());
  put_tensor(out, s.values);
  put_tensor(out, s.dense_shape.value());
}
LOOM_COMPILED_ONCE any_sparse get_sparse(std::istream& in);
} // namespace detail

// One element. A type outside the list above fails to compile here, naming it.
template <class E> void put_element(std::ostream& out, const E& e) {
  if constexpr (std::is_arithmetic_v<E>) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &e, sizeof(E));
    put_u64(out, bits);
  } else if constexpr (std::is_same_v<E, std::string>) {
    put_string(out, e);
  } else if constexpr (std::is_same_v<E, any_tensor>) {
    detail::put_tensor(out, e);
  } else if constexpr (detail::is_tensor<E>::value) {
    detail::put_tensor(out, e.value());
  } else if constexpr (detail::is_tuple_like<E>::value) {
    std::apply([&](const auto&... part) { (put_element(out, part), ...); }, e);
  } else if constexpr (detail::is_vector<E>::value) {
    put_u64(out, e.size());
    for (const auto& x : e)
      put_element(out, x);
  } else if constexpr (std::is_same_v<E, any_sparse>) {
    detail::put_sparse(out, e);
  } else if constexpr (detail::is_sparse_value<E>::value) {
    detail::put_sparse(out, any_sparse{e.indices, e.values.value(), e.dense_shape});
  } else if constexpr (std::is_same_v<E, features>) {
    put_u64(out, e.size());
    for (const auto& [name, v] : e.all()) {
      put_string(out, name);
      put_u64(out, v.index());
      if (const auto* d = std::get_if<any_tensor>(&v))
        detail::put_tensor(out, *d);
      else
        detail::put_sparse(out, std::get<any_sparse>(v));
    }
  } else {
    static_assert(std::is_same_v<E, void>,
                  "loom::data: this element type has no saved form (numbers, strings, tensors, "
                  "tuples, vectors, features and sparse values have); map the elements to one "
                  "before a stage that saves or caches them");
  }
}

template <class E> E get_element(std::istream& in) {
  if constexpr (std::is_arithmetic_v<E>) {
    const std::uint64_t bits = get_u64(in);
    E e;
    std::memcpy(&e, &bits, sizeof(E));
    return e;
  } else if constexpr (std::is_same_v<E, std::string>) {
    return get_string(in);
  } else if constexpr (std::is_same_v<E, any_tensor>) {
    return detail::get_tensor(in);
  } else if constexpr (detail::is_tensor<E>::value) {
    return E::from(detail::get_tensor(in), "a saved element");
  } else if constexpr (detail::is_tuple_like<E>::value) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      // Braces evaluate left to right, in the order put_element wrote them.
      return E{get_element<std::tuple_element_t<I, E>>(in)...};
    }
    (std::make_index_sequence<std::tuple_size_v<E>>{});
  } else if constexpr (detail::is_vector<E>::value) {
    const std::uint64_t n = get_u64(in);
    if (n > max_string_bytes)
      throw data_loss_error("iterator state: a list of " + std::to_string(n) + " elements");
    E v;
    for (std::uint64_t i = 0; i < n; ++i)
      v.push_back(get_element<typename E::value_type>(in));
    return v;
  } else if constexpr (std::is_same_v<E, any_sparse>) {
    return detail::get_sparse(in);
  } else if constexpr (detail::is_sparse_value<E>::value) {
    any_sparse s = detail::get_sparse(in);
    return E{s.indices, decltype(E::values)::from(s.values, "a saved sparse value"), s.dense_shape};
  } else if constexpr (std::is_same_v<E, features>) {
    features f;
    const std::uint64_t n = get_u64(in);
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::string name = get_string(in);
      if (get_u64(in) == 0)
        f.set(name, detail::get_tensor(in));
      else
        f.set(name, detail::get_sparse(in));
    }
    return f;
  } else {
    static_assert(std::is_same_v<E, void>, "loom::data: this element type has no saved form");
  }
}

template <class E> void put_optional(std::ostream& out, const std::optional<E>& e) {
  put_u64(out, e ? 1 : 0);
  if (e)
    put_element(out, *e);
}
template <class E> std::optional<E> get_optional(std::istream& in) {
  if (get_u64(in) == 0)
    return std::nullopt;
  return get_element<E>(in);
}

} // namespace loom::data::state

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::data::state {

LOOM_COMPILED_ONCE void put_u64(std::ostream& out, std::uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i)
    b[i] = static_cast<char>(v >> (8 * i) & 0xff);
  out.write(b, 8);
}

LOOM_COMPILED_ONCE std::uint64_t get_u64(std::istream& in) {
  unsigned char b[8];
  if (!in.read(reinterpret_cast<char*>(b), 8))
    throw data_loss_error("iterator state: the bytes end early");
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= std::uint64_t{b[i]} << (8 * i);
  return v;
}

LOOM_COMPILED_ONCE std::string get_string(std::istream& in) {
  const std::uint64_t n = get_u64(in);
  if (n > max_string_bytes)
    throw data_loss_error("iterator state: a string of " + std::to_string(n) + " bytes");
  std::string s(static_cast<std::size_t>(n), '\0');
  if (!in.read(s.data(), static_cast<std::streamsize>(n)))
    throw data_loss_error("iterator state: the bytes end inside a string");
  return s;
}
} // namespace loom::data::state

namespace loom::data::state::detail {

LOOM_COMPILED_ONCE void put_tensor(std::ostream& out, const any_tensor& t) {
  put_u64(out, t.empty() ? 0 : 1);
  if (t.empty())
    return;
  put_u64(out, static_cast<std::uint64_t>(t.type()));
  put_u64(out, static_cast<std::uint64_t>(t.rank()));
  for (const auto d : t.shape().dims())
    put_i64(out, d);
  if (t.type() == dtype::string)
    for (const auto& s : t.flat<std::string>())
      put_string(out, s);
  else
    out.write(static_cast<const char*>(t.raw_data()), static_cast<std::streamsize>(t.byte_size()));
}

LOOM_COMPILED_ONCE any_tensor get_tensor(std::istream& in) {
  if (get_u64(in) == 0)
    return {};
  const std::uint64_t type = get_u64(in), rank = get_u64(in);
  if (type > static_cast<std::uint64_t>(dtype::string) || rank > 64)
    throw data_loss_error("iterator state: a tensor of dtype tag " + std::to_string(type) +
                          " and rank " + std::to_string(rank));
  std::vector<std::int64_t> dims(static_cast<std::size_t>(rank));
  std::uint64_t bytes = size_of(static_cast<dtype>(type));
  for (auto& d : dims) {
    d = get_i64(in);
    if (d < 0 || (d > 0 && bytes > max_string_bytes / static_cast<std::uint64_t>(d)))
      throw data_loss_error("iterator state: a tensor dimension of " + std::to_string(d));
    bytes *= static_cast<std::uint64_t>(d);
  }
  any_tensor t(static_cast<dtype>(type), loom::shape(std::move(dims)));
  if (t.type() == dtype::string) {
    for (auto& s : t.flat<std::string>())
      s = get_string(in);
  } else if (!in.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(bytes))) {
    throw data_loss_error("iterator state: the bytes end inside a tensor");
  }
  return t;
}

LOOM_COMPILED_ONCE any_sparse get_sparse(std::istream& in) {
  any_sparse s;
  s.indices = tensor<std::int64_t, 2>::from(get_tensor(in), "a saved sparse value's indices");
  s.values = get_tensor(in);
  s.dense_shape = tensor<std::int64_t, 1>::from(get_tensor(in), "a saved sparse value's shape");
  return s;
}

} // namespace loom::data::state::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

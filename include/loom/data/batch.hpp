// batch(batch_size, drop_remainder) (TF's Dataset.batch): batch_size
// consecutive elements stacked into one, along a new first dimension; the
// last batch is smaller unless drop_remainder drops it. padded_batch
// (data/padded_batch.hpp) is the same stacking with padding.
//
// What an element stacks to (batch_of<E>):
//   a number or string T          -> tensor<T, 1>
//   tensor<T, R>                  -> tensor<T, R + 1>
//   any_tensor                    -> any_tensor, one rank more
//   std::tuple<E...>              -> std::tuple<batch_of<E>...>
//   std::vector<any_tensor>       -> the same, column by column (csv_dataset's rows)
//   any_sparse                    -> any_sparse, one rank more: a batch of
//                                    ragged lists becomes a sparse tensor whose
//                                    dense shape is [batch, longest list]
//   features                      -> features, each feature stacked as above
//   anything else E               -> std::vector<E>
// Tensors must agree in shape (else one error naming the two elements and
// shapes); padded_batch pads them to the largest instead.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/features.hpp>
#include <loom/data/iterator_state.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace loom::data {

namespace detail {
template <class E> struct batched { using type = std::vector<E>; };
template <element_type T> struct batched<T> { using type = tensor<T, 1>; };
template <element_type T, int R> struct batched<tensor<T, R>> { using type = tensor<T, R + 1>; };
template <> struct batched<any_tensor> { using type = any_tensor; };
template <class... E> struct batched<std::tuple<E...>> {
  using type = std::tuple<typename batched<E>::type...>;
};
template <> struct batched<std::vector<any_tensor>> { using type = std::vector<any_tensor>; };
template <> struct batched<any_sparse> { using type = any_sparse; };
template <> struct batched<features> { using type = features; };
} // namespace detail

template <class E> using batch_of = typename detail::batched<E>::type;

namespace detail {

// Copies `from` (shape `from_dims`) into `to` (shape `to_dims`, each dim at
// least as large), element [i, j, ...] to [i, j, ...]: padding leaves the rest.
template <class T>
void copy_padded(const T* from, const std::vector<std::int64_t>& from_dims, T* to,
                 const std::vector<std::int64_t>& to_dims, std::size_t dim = 0) {
  if (dim == from_dims.size()) {
    *to = *from;
    return;
  }
  std::int64_t from_stride = 1, to_stride = 1;
  for (std::size_t k = dim + 1; k < from_dims.size(); ++k) {
    from_stride *= from_dims[k];
    to_stride *= to_dims[k];
  }
  if (from_dims == to_dims) { // the common case: one contiguous copy
    std::copy_n(from, from_dims[dim] * from_stride, to);
    return;
  }
  for (std::int64_t i = 0; i < from_dims[dim]; ++i)
    copy_padded(from + i * from_stride, from_dims, to + i * to_stride, to_dims, dim + 1);
}

// The tensors stacked along a new first dimension; `what` names them in errors.
LOOM_COMPILED_ONCE any_tensor stack_tensors(const std::vector<any_tensor>& parts, bool pad,
                                            const std::string& what);

// Sparse values of one rank stacked: each index gains the element's number in
// front, and the dense shape is [count, the largest of each dimension].
LOOM_COMPILED_ONCE any_sparse stack_sparse(const std::vector<any_sparse>& parts,
                                           const std::string& what);

template <class E> batch_of<E> stack(std::vector<E>&& elements, bool pad, const std::string& what) {
  if constexpr (element_type<E>) {
    batch_of<E> out(loom::shape{static_cast<std::int64_t>(elements.size())});
    std::move(elements.begin(), elements.end(), out.data());
    return out;
  } else if constexpr (std::is_same_v<E, any_tensor>) {
    return stack_tensors(elements, pad, what);
  } else if constexpr (requires {
                         typename E::value_type;
                         E::rank;
                       }) { // tensor<T, R>
    std::vector<any_tensor> parts;
    for (auto& e : elements)
      parts.push_back(std::move(e).value());
    return batch_of<E>::from(stack_tensors(parts, pad, what));
  } else if constexpr (std::is_same_v<E, any_sparse>) {
    return stack_sparse(elements, what);
  } else if constexpr (std::is_same_v<E, std::vector<any_tensor>>) {
    const std::size_t columns = elements.front().size();
    batch_of<E> out;
    for (std::size_t c = 0; c < columns; ++c) {
      std::vector<any_tensor> column;
      for (std::size_t i = 0; i < elements.size(); ++i) {
        if (elements[i].size() != columns)
          throw invalid_argument_error("batch: element " + std::to_string(i) + " has " +
                                       std::to_string(elements[i].size()) +
                                       " components, element 0 has " + std::to_string(columns));
        column.push_back(std::move(elements[i][c]));
      }
      out.push_back(stack_tensors(column, pad, what + " component " + std::to_string(c)));
    }
    return out;
  } else if constexpr (std::is_same_v<E, features>) {
    features out;
    for (const auto& [name, first] : elements.front().all()) {
      const std::string feature = "feature \"" + name + "\"";
      if (std::holds_alternative<any_tensor>(first)) {
        std::vector<any_tensor> parts;
        for (const auto& e : elements)
          parts.push_back(e.dense_value(name));
        out.set(name, stack_tensors(parts, pad, feature));
      } else {
        std::vector<any_sparse> parts;
        for (const auto& e : elements)
          parts.push_back(e.sparse_any(name));
        out.set(name, stack_sparse(parts, feature));
      }
    }
    return out;
  } else if constexpr (requires { std::tuple_size<E>::value; }) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      const auto column = [&]<std::size_t K>(std::integral_constant<std::size_t, K>) {
        std::vector<std::tuple_element_t<K, E>> parts;
        for (auto& e : elements)
          parts.push_back(std::move(std::get<K>(e)));
        return stack(std::move(parts), pad, what + " component " + std::to_string(K));
      };
      return batch_of<E>{column(std::integral_constant<std::size_t, I>{})...};
    }
    (std::make_index_sequence<std::tuple_size_v<E>>{});
  } else {
    return std::move(elements);
  }
}

// batch and padded_batch: the same stage, padding or not.
template <dataset_recipe Input> class stacking_dataset {
public:
  using element_type = batch_of<element_of<Input>>;

  stacking_dataset(Input input, std::int64_t batch_size, bool drop_remainder, bool pad)
      : input_(std::move(input)), batch_size_(batch_size), drop_remainder_(drop_remainder),
        pad_(pad) {
    if (batch_size < 1)
      throw invalid_argument_error(std::string(pad ? "padded_batch" : "batch") +
                                   ": batch_size must be at least 1, got " +
                                   std::to_string(batch_size));
  }

  class iterator {
  public:
    explicit iterator(const stacking_dataset& d)
        : input_(d.input_.make_iterator()), batch_size_(d.batch_size_),
          drop_remainder_(d.drop_remainder_), pad_(d.pad_) {}
    std::optional<element_type> next() {
      std::vector<element_of<Input>> elements;
      elements.reserve(static_cast<std::size_t>(batch_size_));
      while (static_cast<std::int64_t>(elements.size()) < batch_size_) {
        auto x = input_.next();
        if (!x)
          break;
        elements.push_back(std::move(*x));
      }
      if (elements.empty() ||
          (drop_remainder_ && static_cast<std::int64_t>(elements.size()) < batch_size_))
        return std::nullopt;
      return stack(std::move(elements), pad_, "the element");
    }
    void save(std::ostream& out) {
      state::put_tag(out, "batch");
      input_.save(out);
    }
    void restore(std::istream& in) {
      state::expect_tag(in, "batch");
      input_.restore(in);
    }

  private:
    iterator_of<Input> input_;
    std::int64_t batch_size_;
    bool drop_remainder_, pad_;
  };

  iterator make_iterator() const { return iterator(*this); }

private:
  Input input_;
  std::int64_t batch_size_;
  bool drop_remainder_, pad_;
};

} // namespace detail

struct batch_stage {
  std::int64_t batch_size;
  bool drop_remainder;
  template <dataset_recipe D> detail::stacking_dataset<D> apply(D input) const {
    return {std::move(input), batch_size, drop_remainder, false};
  }
};

inline batch_stage batch(std::int64_t batch_size, bool drop_remainder = false) {
  return {batch_size, drop_remainder};
}

} // namespace loom::data

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::data::detail {

LOOM_COMPILED_ONCE any_tensor stack_tensors(const std::vector<any_tensor>& parts, bool pad,
                                            const std::string& what) {
  const any_tensor& first = parts.front();
  std::vector<std::int64_t> dims = first.shape().dims();
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const any_tensor& t = parts[i];
    if (t.type() != first.type() || t.rank() != first.rank() ||
        (!pad && t.shape() != first.shape()))
      throw invalid_argument_error(
          "batch: " + what + " is " + first.describe() + " in the batch's element 0 and " +
          t.describe() + " in its element " + std::to_string(i) +
          (t.type() == first.type() && t.rank() == first.rank()
               ? " (padded_batch pads them to one shape; a VarLenFeature batches to sparse)"
               : ""));
    for (std::size_t k = 0; k < dims.size(); ++k)
      dims[k] = std::max(dims[k], t.shape().dims()[k]);
  }
  std::vector<std::int64_t> out_dims{static_cast<std::int64_t>(parts.size())};
  out_dims.insert(out_dims.end(), dims.begin(), dims.end());
  any_tensor out(first.type(), loom::shape(out_dims));
  const std::int64_t row = loom::shape(dims).num_elements();
  visit_dtype(first.type(), [&]<class T>() {
    T* dst = out.data<T>();
    if (pad)
      std::fill_n(dst, out.num_elements(), T{});
    for (std::size_t i = 0; i < parts.size(); ++i)
      copy_padded(parts[i].data<T>(), parts[i].shape().dims(),
                  dst + static_cast<std::int64_t>(i) * row, dims);
  });
  return out;
}

LOOM_COMPILED_ONCE any_sparse stack_sparse(const std::vector<any_sparse>& parts,
                                           const std::string& what) {
  const auto rank = parts.front().dense_shape.dim(0);
  std::int64_t total = 0;
  std::vector<std::int64_t> dense(static_cast<std::size_t>(rank) + 1, 0);
  dense[0] = static_cast<std::int64_t>(parts.size());
  std::vector<any_tensor> values;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const any_sparse& p = parts[i];
    if (p.dense_shape.dim(0) != rank || p.values.type() != parts.front().values.type())
      throw invalid_argument_error(
          "batch: " + what + " is a sparse " + std::string(to_string(p.values.type())) +
          " value of rank " + std::to_string(p.dense_shape.dim(0)) + " in element " +
          std::to_string(i) + ", " + std::string(to_string(parts.front().values.type())) +
          " of rank " + std::to_string(rank) + " in element 0");
    total += p.indices.dim(0);
    for (std::int64_t k = 0; k < rank; ++k)
      dense[static_cast<std::size_t>(k) + 1] =
          std::max(dense[static_cast<std::size_t>(k) + 1], p.dense_shape(k));
    values.push_back(p.values.reshaped(loom::shape{p.values.num_elements()}));
  }
  any_sparse out;
  out.indices = tensor<std::int64_t, 2>(loom::shape{total, rank + 1});
  out.dense_shape = tensor<std::int64_t, 1>(loom::shape{rank + 1}, dense);
  out.values = any_tensor(parts.front().values.type(), loom::shape{total});
  std::int64_t* idx = out.indices.data();
  std::int64_t at = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::int64_t n = parts[i].indices.dim(0);
    const std::int64_t* src = parts[i].indices.data();
    for (std::int64_t r = 0; r < n; ++r) {
      *idx++ = static_cast<std::int64_t>(i);
      idx = std::copy_n(src + r * rank, rank, idx);
    }
    visit_dtype(out.values.type(),
                [&]<class T>() { std::copy_n(values[i].data<T>(), n, out.values.data<T>() + at); });
    at += n;
  }
  return out;
}

} // namespace loom::data::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

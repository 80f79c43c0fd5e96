// from_tensor_slices (TF's Dataset.from_tensor_slices): the slices of tensors
// along their first dimension, tensor<T, R> giving elements tensor<T, R - 1>
// (several tensors: a tuple of their slices, all with the same first
// dimension), or the elements of a std::vector as they are. The tensors'
// buffers are shared, not copied; each element is a copy of its slice.
//
// MNIST's IDX files go in through the existing reader this way:
//   auto d = data::read_mnist(dir).train;
//   auto examples = data::from_tensor_slices(d.images, d.labels);
#pragma once

#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/iterator_state.hpp>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace loom::data {

// The elements of a vector, in order; the vector is shared by every copy of
// the recipe and every iterator.
template <class E> class vector_dataset {
public:
  using element_type = E;

  explicit vector_dataset(std::vector<E> elements)
      : elements_(std::make_shared<const std::vector<E>>(std::move(elements))) {}

  class iterator {
  public:
    explicit iterator(std::shared_ptr<const std::vector<E>> e) : elements_(std::move(e)) {}
    std::optional<E> next() {
      if (at_ >= elements_->size())
        return std::nullopt;
      return (*elements_)[at_++];
    }
    void save(std::ostream& out) const {
      state::put_tag(out, "from_tensor_slices");
      state::put_u64(out, at_);
    }
    void restore(std::istream& in) {
      state::expect_tag(in, "from_tensor_slices");
      at_ = static_cast<std::size_t>(state::get_u64(in));
    }

  private:
    std::shared_ptr<const std::vector<E>> elements_;
    std::size_t at_ = 0;
  };

  iterator make_iterator() const { return iterator(elements_); }

private:
  std::shared_ptr<const std::vector<E>> elements_;
};

namespace detail {
// Slice i of a tensor along its first dimension, a copy.
template <element_type T, int R> tensor<T, R - 1> slice_of(const tensor<T, R>& t, std::int64_t i) {
  std::vector<std::int64_t> dims(t.shape().dims().begin() + 1, t.shape().dims().end());
  tensor<T, R - 1> out{loom::shape(std::move(dims))};
  const std::int64_t n = out.size();
  std::copy_n(t.data() + i * n, n, out.data());
  return out;
}
} // namespace detail

template <class... Slices> class tensor_slices_dataset;

template <element_type... T, int... R> class tensor_slices_dataset<tensor<T, R>...> {
public:
  using element_type = std::conditional_t<sizeof...(T) == 1,
                                          std::tuple_element_t<0, std::tuple<tensor<T, R - 1>...>>,
                                          std::tuple<tensor<T, R - 1>...>>;

  explicit tensor_slices_dataset(tensor<T, R>... tensors) : tensors_(std::move(tensors)...) {
    const std::int64_t n = std::get<0>(tensors_).dim(0);
    std::apply(
        [&](const auto&... t) {
          if (((t.dim(0) != n) || ...))
            throw invalid_argument_error(
                "from_tensor_slices: the tensors' first dimensions differ (" +
                ((t.shape().to_string() + " ") + ...) + ")");
        },
        tensors_);
  }

  class iterator {
  public:
    explicit iterator(const tensor_slices_dataset& d) : d_(d) {}
    std::optional<element_type> next() {
      if (at_ >= std::get<0>(d_.tensors_).dim(0))
        return std::nullopt;
      const std::int64_t i = at_++;
      if constexpr (sizeof...(T) == 1)
        return detail::slice_of(std::get<0>(d_.tensors_), i);
      else
        return std::apply([&](const auto&... t) { return element_type{detail::slice_of(t, i)...}; },
                          d_.tensors_);
    }
    void save(std::ostream& out) const {
      state::put_tag(out, "from_tensor_slices");
      state::put_i64(out, at_);
    }
    void restore(std::istream& in) {
      state::expect_tag(in, "from_tensor_slices");
      at_ = state::get_i64(in);
    }

  private:
    tensor_slices_dataset d_;
    std::int64_t at_ = 0;
  };

  iterator make_iterator() const { return iterator(*this); }

private:
  std::tuple<tensor<T, R>...> tensors_;
};

template <element_type... T, int... R>
requires(sizeof...(T) > 0 && ((R >= 1) && ...))
    tensor_slices_dataset<tensor<T, R>...> from_tensor_slices(tensor<T, R>... tensors) {
  return tensor_slices_dataset<tensor<T, R>...>(std::move(tensors)...);
}

template <class E> vector_dataset<E> from_tensor_slices(std::vector<E> elements) {
  return vector_dataset<E>(std::move(elements));
}

} // namespace loom::data

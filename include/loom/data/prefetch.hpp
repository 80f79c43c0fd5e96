// prefetch(buffer_size) (TF's Dataset.prefetch): one thread of the stage's own
// reads the input ahead of the consumer, holding at most buffer_size elements,
// so that reading and parsing overlap the training step. buffer_size 0 reads
// on the consumer's thread, as TF's prefetch(0).
#pragma once

#include <loom/core/error.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/iterator_state.hpp>
#include <loom/data/parallel_buffer.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace loom::data {

template <dataset_recipe Input> class prefetch_dataset {
public:
  using element_type = element_of<Input>;

  prefetch_dataset(Input input, std::int64_t buffer_size)
      : input_(std::move(input)), buffer_size_(buffer_size) {
    if (buffer_size < 0)
      throw invalid_argument_error("prefetch: buffer_size must not be negative, got " +
                                   std::to_string(buffer_size));
  }

  class iterator {
    struct pass_through {
      element_type operator()(element_type&& x) const { return std::move(x); }
    };
    using ahead = detail::parallel_buffer<iterator_of<Input>, pass_through, element_type>;

  public:
    explicit iterator(const prefetch_dataset& d) : impl_(start(d)) {}
    std::optional<element_type> next() {
      return std::visit([](auto& it) { return it.next(); }, impl_);
    }
    void save(std::ostream& out) {
      state::put_tag(out, "prefetch");
      std::visit([&](auto& it) { it.save(out); }, impl_);
    }
    void restore(std::istream& in) {
      state::expect_tag(in, "prefetch");
      std::visit([&](auto& it) { it.restore(in); }, impl_);
    }

  private:
    static std::variant<iterator_of<Input>, ahead> start(const prefetch_dataset& d) {
      if (d.buffer_size_ == 0)
        return std::variant<iterator_of<Input>, ahead>(std::in_place_index<0>,
                                                       d.input_.make_iterator());
      return std::variant<iterator_of<Input>, ahead>(std::in_place_index<1>,
                                                     d.input_.make_iterator(), pass_through{}, 1,
                                                     static_cast<std::size_t>(d.buffer_size_));
    }

    std::variant<iterator_of<Input>, ahead> impl_;
  };

  iterator make_iterator() const { return iterator(*this); }

private:
  Input input_;
  std::int64_t buffer_size_;
};

struct prefetch_stage {
  std::int64_t buffer_size;
  template <dataset_recipe D> prefetch_dataset<D> apply(D input) const {
    return {std::move(input), buffer_size};
  }
};

inline prefetch_stage prefetch(std::int64_t buffer_size) {
  return {buffer_size};
}

} // namespace loom::data

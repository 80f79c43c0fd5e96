// map(fn, num_parallel_calls) (TF's Dataset.map): each element through a C++
// callable, its result the new element, in the input's order. With
// num_parallel_calls > 1 that many threads of the stage's own call fn at once
// (so fn must be safe to call concurrently) and at most num_parallel_calls
// results wait beyond what the consumer took (data/parallel_buffer.hpp).
#pragma once

#include <loom/core/error.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/iterator_state.hpp>
#include <loom/data/parallel_buffer.hpp>

#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace loom::data {

template <dataset_recipe Input, class Fn> class map_dataset {
public:
  using element_type = std::remove_cvref_t<std::invoke_result_t<const Fn&, element_of<Input>&&>>;

  map_dataset(Input input, Fn fn, int num_parallel_calls)
      : input_(std::move(input)), fn_(std::move(fn)), parallel_(num_parallel_calls) {
    if (num_parallel_calls < 1)
      throw invalid_argument_error("map: num_parallel_calls must be at least 1, got " +
                                   std::to_string(num_parallel_calls));
  }

  class iterator {
    // The function as the parallel buffer calls it: the recipe's, shared.
    struct call {
      const Fn* fn;
      element_type operator()(element_of<Input>&& x) const {
        return std::invoke(*fn, std::move(x));
      }
    };
    using parallel = detail::parallel_buffer<iterator_of<Input>, call, element_type>;

  public:
    explicit iterator(const map_dataset& d)
        : fn_(std::make_shared<Fn>(d.fn_)), impl_(start(d, fn_.get())) {}

    std::optional<element_type> next() {
      if (auto* p = std::get_if<parallel>(&impl_))
        return p->next();
      auto x = std::get<iterator_of<Input>>(impl_).next();
      if (!x)
        return std::nullopt;
      return std::invoke(*fn_, std::move(*x));
    }
    void save(std::ostream& out) {
      state::put_tag(out, "map");
      std::visit([&](auto& it) { it.save(out); }, impl_);
    }
    void restore(std::istream& in) {
      state::expect_tag(in, "map");
      std::visit([&](auto& it) { it.restore(in); }, impl_);
    }

  private:
    static std::variant<iterator_of<Input>, parallel> start(const map_dataset& d, const Fn* fn) {
      if (d.parallel_ == 1)
        return std::variant<iterator_of<Input>, parallel>(std::in_place_index<0>,
                                                          d.input_.make_iterator());
      return std::variant<iterator_of<Input>, parallel>(
          std::in_place_index<1>, d.input_.make_iterator(), call{fn},
          static_cast<std::size_t>(d.parallel_), static_cast<std::size_t>(d.parallel_));
    }

    std::shared_ptr<Fn> fn_; // declared first: the workers call it until impl_ is gone
    std::variant<iterator_of<Input>, parallel> impl_;
  };

  iterator make_iterator() const { return iterator(*this); }

private:
  Input input_;
  Fn fn_;
  int parallel_;
};

template <class Fn> struct map_stage {
  Fn fn;
  int num_parallel_calls;
  template <dataset_recipe D> map_dataset<D, Fn> apply(D input) const {
    return {std::move(input), fn, num_parallel_calls};
  }
};

template <class Fn> map_stage<Fn> map(Fn fn, int num_parallel_calls = 1) {
  return {std::move(fn), num_parallel_calls};
}

} // namespace loom::data

// filter(predicate) (TF's Dataset.filter): the elements for which a C++
// callable returns true, in order.
#pragma once

#include <loom/data/dataset.hpp>
#include <loom/data/iterator_state.hpp>

#include <functional>
#include <optional>
#include <utility>

namespace loom::data {

template <dataset_recipe Input, class Pred> class filter_dataset {
public:
  using element_type = element_of<Input>;

  filter_dataset(Input input, Pred pred) : input_(std::move(input)), pred_(std::move(pred)) {}

  class iterator {
  public:
    explicit iterator(const filter_dataset& d) : input_(d.input_.make_iterator()), pred_(d.pred_) {}
    std::optional<element_type> next() {
      while (auto x = input_.next())
        if (std::invoke(pred_, std::as_const(*x)))
          return x;
      return std::nullopt;
    }
    void save(std::ostream& out) {
      state::put_tag(out, "filter");
      input_.save(out);
    }
    void restore(std::istream& in) {
      state::expect_tag(in, "filter");
      input_.restore(in);
    }

  private:
    iterator_of<Input> input_;
    Pred pred_;
  };

  iterator make_iterator() const { return iterator(*this); }

private:
  Input input_;
  Pred pred_;
};

template <class Pred> struct filter_stage {
  Pred pred;
  template <dataset_recipe D> filter_dataset<D, Pred> apply(D input) const {
    return {std::move(input), pred};
  }
};

template <class Pred> filter_stage<Pred> filter(Pred pred) {
  return {std::move(pred)};
}

} // namespace loom::data

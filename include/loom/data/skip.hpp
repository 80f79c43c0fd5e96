// skip(count) (TF's Dataset.skip): all but the first `count` elements; -1
// skips them all.
#pragma once

#include <loom/core/error.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/iterator_state.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace loom::data {

template <dataset_recipe Input> class skip_dataset {
public:
  using element_type = element_of<Input>;

  skip_dataset(Input input, std::int64_t count) : input_(std::move(input)), count_(count) {
    if (count < -1)
      throw invalid_argument_error("skip: count must be -1 (all) or more, got " +
                                   std::to_string(count));
  }

  class iterator {
  public:
    explicit iterator(const skip_dataset& d) : input_(d.input_.make_iterator()), left_(d.count_) {}
    std::optional<element_type> next() {
      for (; left_ != 0; left_ = left_ > 0 ? left_ - 1 : left_)
        if (!input_.next()) {
          left_ = 0;
          return std::nullopt;
        }
      return input_.next();
    }
    void save(std::ostream& out) {
      state::put_tag(out, "skip");
      state::put_i64(out, left_);
      input_.save(out);
    }
    void restore(std::istream& in) {
      state::expect_tag(in, "skip");
      left_ = state::get_i64(in);
      input_.restore(in);
    }

  private:
    iterator_of<Input> input_;
    std::int64_t left_;
  };

  iterator make_iterator() const { return iterator(*this); }

private:
  Input input_;
  std::int64_t count_;
};

struct skip_stage {
  std::int64_t count;
  template <dataset_recipe D> skip_dataset<D> apply(D input) const {
    return {std::move(input), count};
  }
};

inline skip_stage skip(std::int64_t count) {
  return {count};
}

} // namespace loom::data

// repeat(count) (TF's Dataset.repeat): the input `count` times over, -1 for
// ever; each pass is a fresh iterator of the input, so a shuffle upstream
// draws a new order each pass. An input that gives no element in a pass ends
// the repetition (as in TF), rather than spinning for ever.
#pragma once

#include <loom/core/error.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/iterator_state.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace loom::data {

template <dataset_recipe Input> class repeat_dataset {
public:
  using element_type = element_of<Input>;

  repeat_dataset(Input input, std::int64_t count) : input_(std::move(input)), count_(count) {
    if (count < -1)
      throw invalid_argument_error("repeat: count must be -1 (for ever) or more, got " +
                                   std::to_string(count));
  }

  class iterator {
  public:
    explicit iterator(const repeat_dataset& d) : d_(d) {
      if (d_.count_ != 0)
        current_.emplace(d_.input_.make_iterator());
    }
    std::optional<element_type> next() {
      while (current_) {
        if (auto x = current_->next()) {
          empty_pass_ = false;
          return x;
        }
        ++pass_;
        const bool done = empty_pass_ || (d_.count_ >= 0 && pass_ >= d_.count_);
        current_.reset();
        if (!done)
          current_.emplace(d_.input_.make_iterator());
        empty_pass_ = true;
      }
      return std::nullopt;
    }
    // The pass number and the current pass's position.
    void save(std::ostream& out) {
      state::put_tag(out, "repeat");
      state::put_i64(out, pass_);
      state::put_u64(out, (current_ ? 1 : 0) | (empty_pass_ ? 2 : 0));
      if (current_)
        current_->save(out);
    }
    void restore(std::istream& in) {
      state::expect_tag(in, "repeat");
      pass_ = state::get_i64(in);
      const std::uint64_t flags = state::get_u64(in);
      empty_pass_ = (flags & 2) != 0;
      current_.reset();
      if (flags & 1) {
        current_.emplace(d_.input_.make_iterator());
        current_->restore(in);
      }
    }

  private:
    repeat_dataset d_;
    std::optional<iterator_of<Input>> current_;
    std::int64_t pass_ = 0;
    bool empty_pass_ = true;
  };

  iterator make_iterator() const { return iterator(*this); }

private:
  Input input_;
  std::int64_t count_;
};

struct repeat_stage {
  std::int64_t count;
  template <dataset_recipe D> repeat_dataset<D> apply(D input) const {
    return {std::move(input), count};
  }
};

inline repeat_stage repeat(std::int64_t count = -1) {
  return {count};
}

} // namespace loom::data

// range(begin, end, step): the int64 numbers of [begin, end) (TF's
// Dataset.range), the smallest source, for tests and for indexing.
#pragma once

#include <loom/core/error.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/iterator_state.hpp>

#include <cstdint>
#include <optional>

namespace loom::data {

class range_dataset {
public:
  using element_type = std::int64_t;

  range_dataset(std::int64_t begin, std::int64_t end, std::int64_t step)
      : begin_(begin), end_(end), step_(step) {
    if (step == 0)
      throw invalid_argument_error("range: step must not be 0");
  }

  class iterator {
  public:
    explicit iterator(const range_dataset& d) : end_(d.end_), step_(d.step_), at_(d.begin_) {}
    std::optional<std::int64_t> next() {
      if (step_ > 0 ? at_ >= end_ : at_ <= end_)
        return std::nullopt;
      const std::int64_t v = at_;
      at_ += step_;
      return v;
    }
    void save(std::ostream& out) const {
      state::put_tag(out, "range");
      state::put_i64(out, at_);
    }
    void restore(std::istream& in) {
      state::expect_tag(in, "range");
      at_ = state::get_i64(in);
    }

  private:
    std::int64_t end_, step_, at_;
  };

  iterator make_iterator() const { return iterator(*this); }

private:
  std::int64_t begin_, end_, step_;
};

inline range_dataset range(std::int64_t end) {
  return {0, end, 1};
}
inline range_dataset range(std::int64_t begin, std::int64_t end, std::int64_t step = 1) {
  return {begin, end, step};
}

} // namespace loom::data

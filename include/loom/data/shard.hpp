// shard(num_shards, index) (TF's Dataset.shard): every num_shards-th element
// starting at `index`, so that worker i of n reads its own 1/n of the input.
// As in TF, shard before shuffling and before expensive maps, and over a list
// of files rather than records where the files are many.
#pragma once

#include <loom/core/error.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/iterator_state.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace loom::data {

template <dataset_recipe Input> class shard_dataset {
public:
  using element_type = element_of<Input>;

  shard_dataset(Input input, std::int64_t num_shards, std::int64_t index)
      : input_(std::move(input)), num_shards_(num_shards), index_(index) {
    if (num_shards < 1)
      throw invalid_argument_error("shard: num_shards must be at least 1, got " +
                                   std::to_string(num_shards));
    if (index < 0 || index >= num_shards)
      throw invalid_argument_error("shard: index must be in [0, " + std::to_string(num_shards) +
                                   "), got " + std::to_string(index));
  }

  class iterator {
  public:
    explicit iterator(const shard_dataset& d)
        : input_(d.input_.make_iterator()), num_shards_(d.num_shards_), index_(d.index_) {}
    // Reads the input up to its next element of this shard, so the elements
    // of other shards are read and dropped (TF's shard does the same).
    std::optional<element_type> next() {
      for (;;) {
        auto x = input_.next();
        if (!x)
          return std::nullopt;
        if (position_++ % num_shards_ == index_)
          return x;
      }
    }
    void save(std::ostream& out) {
      state::put_tag(out, "shard");
      state::put_i64(out, position_);
      input_.save(out);
    }
    void restore(std::istream& in) {
      state::expect_tag(in, "shard");
      position_ = state::get_i64(in);
      input_.restore(in);
    }

  private:
    iterator_of<Input> input_;
    std::int64_t num_shards_, index_, position_ = 0;
  };

  iterator make_iterator() const { return iterator(*this); }

private:
  Input input_;
  std::int64_t num_shards_, index_;
};

struct shard_stage {
  std::int64_t num_shards, index;
  template <dataset_recipe D> shard_dataset<D> apply(D input) const {
    return {std::move(input), num_shards, index};
  }
};

inline shard_stage shard(std::int64_t num_shards, std::int64_t index) {
  return {num_shards, index};
}

} // namespace loom::data

// shuffle(buffer_size, seed, reshuffle_each_iteration) (TF's Dataset.shuffle):
// a buffer of buffer_size elements is filled from the input; each next() gives
// a uniformly drawn element of the buffer and refills its place with the next
// input element. So the order is uniform only for buffer_size >= the input's
// size, and the stage holds at most buffer_size elements.
//
// With a seed the order is the same on every run and platform (data/random.hpp
// says why std::shuffle is not used). reshuffle_each_iteration: each new
// iterator of the same recipe (each pass of a repeat) draws another order,
// from (seed, pass); without it every pass repeats the first order. Without a
// seed the order comes from std::random_device.
#pragma once

#include <loom/core/error.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/iterator_state.hpp>
#include <loom/data/random.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace loom::data {

template <dataset_recipe Input> class shuffle_dataset {
public:
  using element_type = element_of<Input>;

  shuffle_dataset(Input input, std::int64_t buffer_size, std::optional<std::uint64_t> seed,
                  bool reshuffle_each_iteration)
      : input_(std::move(input)), buffer_size_(buffer_size),
        seed_(seed ? *seed : std::random_device{}() * 0x100000001ull + std::random_device{}()),
        reshuffle_(reshuffle_each_iteration),
        passes_(std::make_shared<std::atomic<std::uint64_t>>(0)) {
    if (buffer_size < 1)
      throw invalid_argument_error("shuffle: buffer_size must be at least 1, got " +
                                   std::to_string(buffer_size));
  }

  class iterator {
  public:
    explicit iterator(const shuffle_dataset& d)
        : input_(d.input_.make_iterator()), capacity_(static_cast<std::size_t>(d.buffer_size_)),
          passes_(d.passes_), pass_(d.reshuffle_ ? passes_->fetch_add(1) : 0) {
      std::seed_seq seq{static_cast<std::uint32_t>(d.seed_),
                        static_cast<std::uint32_t>(d.seed_ >> 32),
                        static_cast<std::uint32_t>(pass_), static_cast<std::uint32_t>(pass_ >> 32)};
      rng_.seed(seq);
    }

    std::optional<element_type> next() {
      while (!input_done_ && buffer_.size() < capacity_) {
        auto x = input_.next();
        if (!x) {
          input_done_ = true;
          break;
        }
        buffer_.push_back(std::move(*x));
      }
      if (buffer_.empty())
        return std::nullopt;
      const auto i = static_cast<std::size_t>(uniform_below(rng_, buffer_.size()));
      std::swap(buffer_[i], buffer_.back());
      element_type out = std::move(buffer_.back());
      buffer_.pop_back();
      return out;
    }

    // The pass, the generator, the buffered elements and the input's
    // position. Restoring sets the recipe's pass count back to what it was
    // then, so the passes that follow (a repeat's) draw the orders they drew.
    void save(std::ostream& out) {
      state::put_tag(out, "shuffle");
      state::put_u64(out, pass_);
      std::ostringstream rng_text;
      rng_text << rng_;
      state::put_string(out, rng_text.str());
      state::put_u64(out, input_done_ ? 1 : 0);
      state::put_element(out, buffer_);
      input_.save(out);
    }
    void restore(std::istream& in) {
      state::expect_tag(in, "shuffle");
      pass_ = state::get_u64(in);
      passes_->store(pass_ + 1);
      std::istringstream rng_text(state::get_string(in));
      if (!(rng_text >> rng_))
        throw data_loss_error("iterator state: a shuffle's generator does not parse");
      input_done_ = state::get_u64(in) != 0;
      buffer_ = state::get_element<std::vector<element_type>>(in);
      if (buffer_.size() > capacity_)
        throw invalid_argument_error(
            "iterator state: a shuffle buffer of " + std::to_string(buffer_.size()) +
            " elements saved, this one holds " + std::to_string(capacity_));
      input_.restore(in);
    }

  private:
    iterator_of<Input> input_;
    std::size_t capacity_;
    std::shared_ptr<std::atomic<std::uint64_t>> passes_;
    std::uint64_t pass_;
    std::mt19937_64 rng_;
    std::vector<element_type> buffer_;
    bool input_done_ = false;
  };

  iterator make_iterator() const { return iterator(*this); }

private:
  Input input_;
  std::int64_t buffer_size_;
  std::uint64_t seed_;
  bool reshuffle_;
  // How many iterators this recipe (and its copies) made: the pass number
  // that picks each new iterator's order.
  std::shared_ptr<std::atomic<std::uint64_t>> passes_;
};

struct shuffle_stage {
  std::int64_t buffer_size;
  std::optional<std::uint64_t> seed;
  bool reshuffle_each_iteration;
  template <dataset_recipe D> shuffle_dataset<D> apply(D input) const {
    return {std::move(input), buffer_size, seed, reshuffle_each_iteration};
  }
};

inline shuffle_stage shuffle(std::int64_t buffer_size, std::optional<std::uint64_t> seed = {},
                             bool reshuffle_each_iteration = true) {
  return {buffer_size, seed, reshuffle_each_iteration};
}

} // namespace loom::data

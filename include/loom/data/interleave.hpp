// interleave(fn, cycle_length, block_length, parallel) (TF's
// Dataset.interleave): fn maps each input element (typically a file name) to a
// dataset; up to cycle_length of those are open at once, and block_length
// elements are taken from each in turn. When one ends, the next input element
// opens in its place. The order is TF's exactly, parallel or not.
//
// parallel: each open dataset is read ahead by a thread of its own (a
// prefetch of block_length), so cycle_length files are read at once. Bound:
// cycle_length open iterators and, parallel, cycle_length x block_length
// elements read ahead.
#pragma once

#include <loom/core/error.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/iterator_state.hpp>
#include <loom/data/prefetch.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::data {

template <dataset_recipe Input, class Fn> class interleave_dataset {
  using inner_recipe =
      std::remove_cvref_t<std::invoke_result_t<const Fn&, const element_of<Input>&>>;
  static_assert(dataset_recipe<inner_recipe>,
                "loom::data::interleave: the function must return a dataset");
  using opened = prefetch_dataset<inner_recipe>;

public:
  using element_type = element_of<inner_recipe>;

  interleave_dataset(Input input, Fn fn, std::int64_t cycle_length, std::int64_t block_length,
                     bool parallel)
      : input_(std::move(input)), fn_(std::move(fn)), cycle_length_(cycle_length),
        block_length_(block_length), parallel_(parallel) {
    if (cycle_length < 1 || block_length < 1)
      throw invalid_argument_error("interleave: cycle_length and block_length must be at least "
                                   "1, got " +
                                   std::to_string(cycle_length) + " and " +
                                   std::to_string(block_length));
  }

  class iterator {
    struct open_slot {
      element_of<Input> arg; // what opened it, saved so that restore can reopen it
      iterator_of<opened> it;
    };

  public:
    explicit iterator(const interleave_dataset& d)
        : d_(d), input_(d.input_.make_iterator()),
          cycle_(static_cast<std::size_t>(d.cycle_length_)) {}

    // TF's InterleaveDatasetOp::GetNext, step for step.
    std::optional<element_type> next() {
      while (!end_of_input_ || open_ > 0) {
        auto& slot = cycle_[cycle_index_];
        if (slot) {
          if (auto x = slot->it.next()) {
            if (++block_index_ == d_.block_length_)
              advance();
            return x;
          }
          slot.reset();
          --open_;
          advance();
        } else if (!end_of_input_) {
          if (auto arg = input_.next()) {
            slot.emplace(open_slot{*arg, open(*arg)});
            ++open_;
          } else {
            end_of_input_ = true;
          }
        } else {
          advance();
        }
      }
      return std::nullopt;
    }

    void save(std::ostream& out) {
      state::put_tag(out, "interleave");
      state::put_u64(out, cycle_index_);
      state::put_i64(out, block_index_);
      state::put_u64(out, end_of_input_ ? 1 : 0);
      for (auto& slot : cycle_) {
        state::put_u64(out, slot ? 1 : 0);
        if (slot) {
          state::put_element(out, slot->arg);
          slot->it.save(out);
        }
      }
      input_.save(out);
    }
    void restore(std::istream& in) {
      state::expect_tag(in, "interleave");
      cycle_index_ = static_cast<std::size_t>(state::get_u64(in));
      block_index_ = state::get_i64(in);
      end_of_input_ = state::get_u64(in) != 0;
      if (cycle_index_ >= cycle_.size())
        throw invalid_argument_error("iterator state: interleave position " +
                                     std::to_string(cycle_index_) + " in a cycle of " +
                                     std::to_string(cycle_.size()));
      open_ = 0;
      for (auto& slot : cycle_) {
        slot.reset();
        if (state::get_u64(in) == 0)
          continue;
        auto arg = state::get_element<element_of<Input>>(in);
        slot.emplace(open_slot{arg, open(arg)});
        slot->it.restore(in);
        ++open_;
      }
      input_.restore(in);
    }

  private:
    iterator_of<opened> open(const element_of<Input>& arg) const {
      return opened(std::invoke(d_.fn_, arg), d_.parallel_ ? d_.block_length_ : 0).make_iterator();
    }
    void advance() {
      block_index_ = 0;
      cycle_index_ = (cycle_index_ + 1) % cycle_.size();
    }

    interleave_dataset d_;
    iterator_of<Input> input_;
    std::vector<std::optional<open_slot>> cycle_;
    std::size_t cycle_index_ = 0;
    std::int64_t block_index_ = 0, open_ = 0;
    bool end_of_input_ = false;
  };

  iterator make_iterator() const { return iterator(*this); }

private:
  Input input_;
  Fn fn_;
  std::int64_t cycle_length_, block_length_;
  bool parallel_;
};

template <class Fn> struct interleave_stage {
  Fn fn;
  std::int64_t cycle_length, block_length;
  bool parallel;
  template <dataset_recipe D> interleave_dataset<D, Fn> apply(D input) const {
    return {std::move(input), fn, cycle_length, block_length, parallel};
  }
};

template <class Fn>
interleave_stage<Fn> interleave(Fn fn, std::int64_t cycle_length, std::int64_t block_length = 1,
                                bool parallel = false) {
  return {std::move(fn), cycle_length, block_length, parallel};
}

} // namespace loom::data

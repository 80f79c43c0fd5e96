// cache() and cache(filename) (TF's Dataset.cache): the first complete pass
// over the input records its elements, in memory or in a file, and every later
// iterator of the recipe (and its copies) reads them from there instead of
// from the input. A pass that stops early (take, a destroyed iterator) records
// nothing, so the cache never holds part of an epoch; nor does a pass resumed
// by restore(). The file cache outlives the process: a later program with the
// same filename reads it and not the input. Memory: the whole input, once.
//
// Elements are written in the iterator-state form (data/iterator_state.hpp),
// the file written beside its final name and renamed when complete, so a
// reader never sees a torn cache.
#pragma once

#include <loom/core/error.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/iterator_state.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::data {

template <dataset_recipe Input> class cache_dataset {
public:
  using element_type = element_of<Input>;

  // filename empty: in memory.
  cache_dataset(Input input, std::string filename)
      : input_(std::move(input)), store_(std::make_shared<store>()) {
    store_->filename = std::move(filename);
  }

  class iterator {
    enum class mode : std::uint64_t { filling, from_memory, from_file };

  public:
    explicit iterator(const cache_dataset& d) : d_(d) {
      std::lock_guard lock(d_.store_->m);
      if (d_.store_->elements) {
        mode_ = mode::from_memory;
        elements_ = d_.store_->elements;
      } else if (!d_.store_->filename.empty() && std::filesystem::exists(d_.store_->filename)) {
        open_file();
      } else {
        input_.emplace(d_.input_.make_iterator());
      }
    }

    std::optional<element_type> next() {
      switch (mode_) {
      case mode::from_memory:
        if (at_ >= elements_->size())
          return std::nullopt;
        return (*elements_)[at_++];
      case mode::from_file: {
        auto x = state::get_optional<element_type>(file_);
        if (x)
          ++at_;
        return x;
      }
      case mode::filling: break;
      }
      auto x = input_->next();
      if (x) {
        ++at_;
        if (recording_)
          recorded_.push_back(*x);
      } else if (recording_) {
        commit();
      }
      return x;
    }

    // The mode and the number of elements given. Restored where the cache
    // is not there (another process, a memory cache), the input is read up to
    // that position again.
    void save(std::ostream& out) {
      state::put_tag(out, "cache");
      state::put_u64(out, static_cast<std::uint64_t>(mode_));
      state::put_u64(out, at_);
      if (mode_ == mode::filling)
        input_->save(out);
    }
    void restore(std::istream& in) {
      state::expect_tag(in, "cache");
      const auto saved = static_cast<mode>(state::get_u64(in));
      const std::uint64_t position = state::get_u64(in);
      recording_ = false;
      if (saved == mode::filling) {
        if (mode_ != mode::filling) {
          mode_ = mode::filling;
          input_.emplace(d_.input_.make_iterator());
        }
        input_->restore(in);
        at_ = position;
        return;
      }
      for (at_ = 0; at_ < position;)
        if (!next())
          throw invalid_argument_error("iterator state: a cache position of " +
                                       std::to_string(position) + " elements, past its end");
    }

  private:
    void open_file() {
      mode_ = mode::from_file;
      file_.open(d_.store_->filename, std::ios::binary);
      if (!file_)
        throw permission_denied_error("cache: cannot read " + d_.store_->filename);
    }
    void commit() {
      recording_ = false;
      store& s = *d_.store_;
      std::lock_guard lock(s.m);
      if (s.filename.empty()) {
        if (!s.elements)
          s.elements = std::make_shared<const std::vector<element_type>>(std::move(recorded_));
        return;
      }
      const std::string partial = s.filename + ".partial";
      {
        std::ofstream out(partial, std::ios::binary | std::ios::trunc);
        for (const auto& e : recorded_)
          state::put_optional(out, std::optional<element_type>(e));
        state::put_optional(out, std::optional<element_type>());
        if (!out.flush())
          throw permission_denied_error("cache: cannot write " + partial);
      }
      std::filesystem::rename(partial, s.filename);
      recorded_.clear();
    }

    cache_dataset d_;
    mode mode_ = mode::filling;
    std::optional<iterator_of<Input>> input_;
    std::shared_ptr<const std::vector<element_type>> elements_;
    std::ifstream file_;
    std::uint64_t at_ = 0;
    bool recording_ = true;
    std::vector<element_type> recorded_;
  };

  iterator make_iterator() const { return iterator(*this); }

private:
  struct store {
    std::mutex m;
    std::string filename;
    std::shared_ptr<const std::vector<element_type>> elements;
  };
  Input input_;
  std::shared_ptr<store> store_;
};

struct cache_stage {
  std::string filename;
  template <dataset_recipe D> cache_dataset<D> apply(D input) const {
    return {std::move(input), filename};
  }
};

inline cache_stage cache(std::string filename = {}) {
  return {std::move(filename)};
}

} // namespace loom::data

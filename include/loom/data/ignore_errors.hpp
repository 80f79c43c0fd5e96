// ignore_errors() (TF's Dataset.ignore_errors): an element whose reading or
// making throws a loom::error (a corrupt record, a record that does not
// parse) is dropped and counted, and reading goes on. The first dropped error
// of each file is logged as a warning, with the file; later ones in that file
// are only counted (errors_ignored()), so a bad file cannot flood the log.
#pragma once

#include <loom/core/error.hpp>
#include <loom/core/log.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/file_io.hpp>
#include <loom/data/iterator_state.hpp>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>

namespace loom::data {

template <dataset_recipe Input> class ignore_errors_dataset {
public:
  using element_type = element_of<Input>;

  explicit ignore_errors_dataset(Input input) : input_(std::move(input)) {}

  class iterator {
  public:
    explicit iterator(const ignore_errors_dataset& d) : input_(d.input_.make_iterator()) {}
    std::optional<element_type> next() {
      for (;;) {
        try {
          return input_.next();
        } catch (const loom::error& e) {
          ++ignored_;
          const auto* record = dynamic_cast<const corrupt_record_error*>(&e);
          const std::string file = record ? record->file() : std::string();
          if (logged_.insert(file).second)
            logging::warn("ignore_errors: dropped an element: " + std::string(e.what()) +
                          (record ? " (later errors of this file are counted, not logged)"
                                  : " (later errors are counted, not logged)"));
        }
      }
    }
    std::uint64_t errors_ignored() const noexcept { return ignored_; }

    void save(std::ostream& out) {
      state::put_tag(out, "ignore_errors");
      state::put_u64(out, ignored_);
      input_.save(out);
    }
    void restore(std::istream& in) {
      state::expect_tag(in, "ignore_errors");
      ignored_ = state::get_u64(in);
      input_.restore(in);
    }

  private:
    iterator_of<Input> input_;
    std::uint64_t ignored_ = 0;
    std::set<std::string> logged_;
  };

  iterator make_iterator() const { return iterator(*this); }

private:
  Input input_;
};

struct ignore_errors_stage {
  template <dataset_recipe D> ignore_errors_dataset<D> apply(D input) const {
    return ignore_errors_dataset<D>(std::move(input));
  }
};

inline ignore_errors_stage ignore_errors() {
  return {};
}

} // namespace loom::data

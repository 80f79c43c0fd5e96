// text_line_dataset(files, compression) (TF's TextLineDataset): the lines of
// text files, one file after another, each without its "\n" or "\r\n".
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/file_io.hpp>
#include <loom/data/iterator_state.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::data {

class text_line_dataset {
public:
  using element_type = std::string;

  explicit text_line_dataset(std::vector<std::string> files, compression c = compression::none)
      : files_(std::make_shared<const std::vector<std::string>>(std::move(files))),
        compression_(c) {}

  class iterator {
  public:
    explicit iterator(const text_line_dataset& d)
        : files_(d.files_), compression_(d.compression_) {}
    std::optional<std::string> next();
    void save(std::ostream& out) {
      state::put_tag(out, "text_line");
      state::put_u64(out, file_index_);
      state::put_u64(out, file_ ? file_->offset() : 0);
    }
    void restore(std::istream& in);

  private:
    // Where the file cannot be opened, the iterator is past it when the error
    // is thrown, so an ignore_errors() downstream goes on to the next.
    void open_current() {
      try {
        file_.emplace((*files_)[file_index_], compression_, "text_line_dataset");
      } catch (...) {
        ++file_index_;
        throw;
      }
    }
    std::shared_ptr<const std::vector<std::string>> files_;
    compression compression_;
    std::size_t file_index_ = 0;
    std::optional<input_file> file_;
  };

  iterator make_iterator() const { return iterator(*this); }

private:
  std::shared_ptr<const std::vector<std::string>> files_;
  compression compression_;
};

} // namespace loom::data

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::data {

LOOM_COMPILED_ONCE auto text_line_dataset::iterator::next() -> std::optional<std::string> {
  for (;;) {
    if (!file_) {
      if (file_index_ >= files_->size())
        return std::nullopt;
      open_current();
    }
    std::string line;
    bool got;
    try {
      got = file_->read_line(line);
    } catch (...) { // a corrupt stream: nothing more to read in this file
      file_.reset();
      ++file_index_;
      throw;
    }
    if (got)
      return line;
    file_.reset();
    ++file_index_;
  }
}

LOOM_COMPILED_ONCE void text_line_dataset::iterator::restore(std::istream& in) {
  state::expect_tag(in, "text_line");
  file_index_ = static_cast<std::size_t>(state::get_u64(in));
  const std::uint64_t offset = state::get_u64(in);
  file_.reset();
  if (file_index_ < files_->size()) {
    open_current();
    file_->seek(offset);
  }
}

} // namespace loom::data

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

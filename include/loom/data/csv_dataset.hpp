// csv_dataset(files, columns, options) (TF's tf.data.experimental.CsvDataset):
// the records of CSV or TSV files, each a std::vector<any_tensor> of scalars,
// one per column, typed as its column says (int32, int64, float32, float64 or
// string). batch() stacks them column by column. A batch of lines decodes in one
// call with decode_csv (data/decode_csv.hpp), the same parser, without a tensor
// per field.
//
// The fields and their values as csv_record.hpp says (TF's semantics, checked
// against CsvDataset on a file it parsed, tests/data/tf/). Lines end in "\n" or
// "\r\n"; a quoted field may hold line breaks; an empty line is a record of one
// empty field (so usually an error, as in TF). Every error names the file and
// the line the record starts on.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/data/csv_record.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/file_io.hpp>
#include <loom/data/iterator_state.hpp>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::data {

class csv_dataset {
  struct setup {
    std::vector<std::string> files;
    detail::csv_decoder decoder;
  };

public:
  using element_type = std::vector<any_tensor>;

  csv_dataset(std::vector<std::string> files, std::vector<csv_column> columns,
              csv_options options = {})
      : s_(std::make_shared<const setup>(
            setup{std::move(files),
                  detail::csv_decoder(std::move(columns), std::move(options), "csv_dataset")})) {}

  class iterator {
  public:
    explicit iterator(const csv_dataset& d)
        : s_(d.s_),
          splitter_(s_->decoder.options().field_delim, s_->decoder.options().use_quote_delim) {}

    std::optional<element_type> next();

    void save(std::ostream& out);
    void restore(std::istream& in);

  private:
    void open_current();
    void close_current() {
      file_.reset();
      ++file_index_;
    }
    [[noreturn]] void fail(const std::string& why) const {
      // A record in error is consumed: reading goes on after it.
      throw corrupt_record_error(file_->path(),
                                 "line " + std::to_string(record_line_) + ": " + why);
    }

    // The next record split into splitter_'s fields; false at the end of the file.
    bool read_record();

    std::shared_ptr<const setup> s_;
    detail::csv_splitter splitter_;
    std::size_t file_index_ = 0;
    std::optional<input_file> file_;
    std::uint64_t line_ = 1, record_line_ = 1;
    std::string record_, line_text_;
    std::vector<void*> outputs_; // kept: no allocation per record beyond its values
  };

  iterator make_iterator() const { return iterator(*this); }

private:
  std::shared_ptr<const setup> s_;
};

} // namespace loom::data

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::data {

LOOM_COMPILED_ONCE auto csv_dataset::iterator::next() -> std::optional<element_type> {
  for (;;) {
    if (!file_) {
      if (file_index_ >= s_->files.size())
        return std::nullopt;
      open_current();
      if (s_->decoder.options().header && !read_record()) {
        close_current();
        continue;
      }
    }
    bool got;
    try {
      got = read_record();
    } catch (const corrupt_record_error&) {
      throw;
    } catch (...) { // a corrupt compressed stream
      close_current();
      throw;
    }
    if (!got) {
      close_current();
      continue;
    }
    element_type row = s_->decoder.make_columns(std::nullopt);
    s_->decoder.outputs(row, outputs_);
    if (const std::string why = s_->decoder.decode(splitter_.fields(), outputs_, 0); !why.empty())
      fail(why);
    return row;
  }
}

LOOM_COMPILED_ONCE void csv_dataset::iterator::save(std::ostream& out) {
  state::put_tag(out, "csv");
  state::put_u64(out, file_index_);
  state::put_u64(out, file_ ? file_->offset() : 0);
  state::put_u64(out, line_);
}

LOOM_COMPILED_ONCE void csv_dataset::iterator::restore(std::istream& in) {
  state::expect_tag(in, "csv");
  file_index_ = static_cast<std::size_t>(state::get_u64(in));
  const std::uint64_t offset = state::get_u64(in);
  line_ = state::get_u64(in);
  file_.reset();
  if (file_index_ < s_->files.size()) {
    open_current();
    file_->seek(offset);
  }
}

LOOM_COMPILED_ONCE void csv_dataset::iterator::open_current() {
  try {
    file_.emplace(s_->files[file_index_], s_->decoder.options().file_compression, "csv_dataset");
  } catch (...) {
    ++file_index_;
    throw;
  }
  line_ = 1;
}

LOOM_COMPILED_ONCE bool csv_dataset::iterator::read_record() {
  // A line with its "\r" (a quoted field's line break keeps it); a quoted field
  // still open at its end joins the next line.
  if (!file_->read_line(record_, /*keep_cr=*/true))
    return false;
  record_line_ = line_++;
  for (;;) {
    switch (splitter_.split(record_)) {
    case detail::csv_splitter::result::ok: return true;
    case detail::csv_splitter::result::malformed: fail(splitter_.error());
    case detail::csv_splitter::result::open_quote:
      if (!file_->read_line(line_text_, /*keep_cr=*/true))
        fail("the file ends inside a quoted field");
      ++line_;
      record_ += '\n';
      record_ += line_text_;
    }
  }
}

} // namespace loom::data

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

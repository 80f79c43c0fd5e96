// csv_dataset(files, columns, options) (TF's tf.data.experimental.CsvDataset):
// the records of CSV or TSV files, each a std::vector<any_tensor> of scalars,
// one per column, typed as its column says (int32, int64, float32, float64 or
// string). batch() stacks them column by column.
//
// TF's semantics, checked against CsvDataset on a file it parsed
// (tests/data/tf/): an empty field, or one equal to na_value, or a quoted
// empty one (""), takes its column's default; a column without a default
// makes that an error. A field in double quotes may hold the delimiter, line
// breaks and "" for a quote (use_quote_delim); an unquoted field must hold no
// quote. Lines end in "\n" or "\r\n"; an empty line is a record of one empty
// field (so usually an error, as in TF). Every error names the file and the
// line the record starts on: too many or too few fields, a missing default, a
// number that does not parse, an unclosed quote.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/file_io.hpp>
#include <loom/data/iterator_state.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::data {

// One column: its dtype and its default (none: the field is required).
struct csv_column {
  dtype type;
  std::optional<any_tensor> default_value;
};

template <element_type T> csv_column csv_default(T value) {
  return {dtype_of<T>, any_tensor::scalar<T>(std::move(value))};
}
template <element_type T> csv_column csv_required() {
  return {dtype_of<T>, std::nullopt};
}

struct csv_options {
  bool header = false; // the first line names the columns: skipped
  char field_delim = ',';
  bool use_quote_delim = true;
  std::string na_value{};         // a field equal to it is missing (as an empty one)
  std::vector<int> select_cols{}; // the columns read, ascending; empty: all
  compression file_compression = compression::none;
};

class csv_dataset {
  struct setup {
    std::vector<std::string> files;
    std::vector<csv_column> columns;
    csv_options options;
  };

public:
  using element_type = std::vector<any_tensor>;

  csv_dataset(std::vector<std::string> files, std::vector<csv_column> columns,
              csv_options options = {});

  class iterator {
  public:
    explicit iterator(const csv_dataset& d) : s_(d.s_) {}

    std::optional<element_type> next();

    void save(std::ostream& out);
    void restore(std::istream& in);

  private:
    struct field {
      std::string text;
      bool quoted = false;
    };

    void open_current();
    void close_current() {
      file_.reset();
      ++file_index_;
    }
    int get() { return file_->get(); }
    [[noreturn]] void fail(const std::string& why) const {
      // A record in error is consumed: reading goes on after it.
      throw corrupt_record_error(file_->path(),
                                 "line " + std::to_string(record_line_) + ": " + why);
    }

    // The next record's fields; false at the end of the file.
    bool read_fields();
    void skip_line(int c) {
      while (c != '\n' && c != -1)
        c = get();
      if (c == '\n')
        ++line_;
    }

    element_type convert();

    any_tensor parse(const std::string& text, dtype type, std::size_t at) const;

    std::shared_ptr<const setup> s_;
    std::size_t file_index_ = 0;
    std::optional<input_file> file_;
    std::uint64_t line_ = 1, record_line_ = 1;
    std::vector<field> fields_;
  };

  iterator make_iterator() const { return iterator(*this); }

private:
  std::shared_ptr<const setup> s_;
};

} // namespace loom::data

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::data {

LOOM_COMPILED_ONCE csv_dataset::csv_dataset(std::vector<std::string> files,
                                            std::vector<csv_column> columns, csv_options options)
    : s_(std::make_shared<const setup>(
          setup{std::move(files), std::move(columns), std::move(options)})) {
  for (const csv_column& c : s_->columns) {
    if (c.type == dtype::boolean)
      throw invalid_argument_error("csv_dataset: a column of bool (TF reads int32, int64, "
                                   "float32, float64 and string)");
    if (c.default_value && (c.default_value->type() != c.type || c.default_value->rank() != 0))
      throw invalid_argument_error("csv_dataset: a column of " + std::string(to_string(c.type)) +
                                   " has the default " + c.default_value->describe());
  }
  const auto& sel = s_->options.select_cols;
  if (!sel.empty() && sel.size() != s_->columns.size())
    throw invalid_argument_error("csv_dataset: " + std::to_string(sel.size()) +
                                 " select_cols for " + std::to_string(s_->columns.size()) +
                                 " columns");
  if (!std::is_sorted(sel.begin(), sel.end()) ||
      std::adjacent_find(sel.begin(), sel.end()) != sel.end() || (!sel.empty() && sel[0] < 0))
    throw invalid_argument_error("csv_dataset: select_cols must be distinct, ascending and "
                                 "not negative");
}

LOOM_COMPILED_ONCE auto csv_dataset::iterator::next() -> std::optional<element_type> {
  for (;;) {
    if (!file_) {
      if (file_index_ >= s_->files.size())
        return std::nullopt;
      open_current();
      if (s_->options.header && !read_fields()) {
        close_current();
        continue;
      }
    }
    bool got;
    try {
      got = read_fields();
    } catch (const corrupt_record_error&) {
      throw;
    } catch (...) { // a corrupt compressed stream
      close_current();
      throw;
    }
    if (got)
      return convert();
    close_current();
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
    file_.emplace(s_->files[file_index_], s_->options.file_compression, "csv_dataset");
  } catch (...) {
    ++file_index_;
    throw;
  }
  line_ = 1;
}

LOOM_COMPILED_ONCE bool csv_dataset::iterator::read_fields() {
  const char delim = s_->options.field_delim;
  const bool quotes = s_->options.use_quote_delim;
  int c = get();
  if (c == -1)
    return false;
  record_line_ = line_;
  fields_.clear();
  std::string error;
  for (;;) {
    field& f = fields_.emplace_back();
    if (quotes && c == '"') {
      f.quoted = true;
      for (;;) {
        c = get();
        if (c == -1) {
          error = "the file ends inside a quoted field";
          break;
        }
        if (c == '"') {
          c = get();
          if (c != '"')
            break; // the closing quote; c is what follows it
        }
        if (c == '\n')
          ++line_;
        f.text.push_back(static_cast<char>(c));
      }
      if (error.empty() && c == '\r') {
        c = get();
        if (c != '\n')
          error = "a quoted field is followed by \"\\r\" without \"\\n\"";
      }
      if (error.empty() && c != delim && c != '\n' && c != -1)
        error = "a quoted field must end at a delimiter or the line's end";
    } else {
      while (c != delim && c != '\n' && c != -1) {
        if (quotes && c == '"' && error.empty())
          error = "an unquoted field holds a quote (quote the field and double it)";
        f.text.push_back(static_cast<char>(c));
        c = get();
      }
      if (c != delim && !f.text.empty() && f.text.back() == '\r')
        f.text.pop_back();
    }
    if (!error.empty()) {
      skip_line(c);
      fail(error);
    }
    if (c != delim)
      break;
    c = get();
  }
  if (c == '\n')
    ++line_;
  return true;
}

LOOM_COMPILED_ONCE auto csv_dataset::iterator::convert() -> element_type {
  const auto& columns = s_->columns;
  const auto& sel = s_->options.select_cols;
  const std::size_t needed =
      sel.empty() ? columns.size() : static_cast<std::size_t>(sel.back()) + 1;
  if (fields_.size() < needed || (sel.empty() && fields_.size() > needed))
    fail("expected " + std::to_string(needed) + (sel.empty() ? "" : " or more") +
         " fields, the record has " + std::to_string(fields_.size()));
  element_type row;
  row.reserve(columns.size());
  for (std::size_t i = 0; i < columns.size(); ++i) {
    const std::size_t at = sel.empty() ? i : static_cast<std::size_t>(sel[i]);
    const field& f = fields_[at];
    const csv_column& col = columns[i];
    if (f.text.empty() ||
        (!f.quoted && !s_->options.na_value.empty() && f.text == s_->options.na_value)) {
      if (!col.default_value)
        fail("field " + std::to_string(at) + " is empty and its column has no default");
      row.push_back(*col.default_value);
      continue;
    }
    row.push_back(parse(f.text, col.type, at));
  }
  return row;
}

LOOM_COMPILED_ONCE auto csv_dataset::iterator::parse(const std::string& text, dtype type,
                                                     std::size_t at) const -> any_tensor {
  const auto bad = [&]() -> any_tensor {
    fail("field " + std::to_string(at) + " is \"" + text + "\", not a valid " +
         std::string(to_string(type)));
  };
  char* end = nullptr;
  errno = 0;
  switch (type) {
  case dtype::i32:
  case dtype::i64: {
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (end != text.c_str() + text.size() || errno == ERANGE ||
        (type == dtype::i32 && (v < INT32_MIN || v > INT32_MAX)))
      return bad();
    return type == dtype::i32 ? any_tensor::scalar(static_cast<std::int32_t>(v))
                              : any_tensor::scalar(static_cast<std::int64_t>(v));
  }
  case dtype::f32:
  case dtype::f64: {
    const double v = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size())
      return bad();
    return type == dtype::f32 ? any_tensor::scalar(static_cast<float>(v)) : any_tensor::scalar(v);
  }
  case dtype::string: return any_tensor::scalar(text);
  case dtype::boolean: break;
  }
  return bad();
}

} // namespace loom::data

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// A CSV record: its columns and format (csv_column, csv_options), and the two steps
// that csv_dataset and decode_csv share: splitting a record's text into fields and
// converting the fields into the columns' values.
//
// TF's semantics (CsvDataset and decode_csv, one parser there too): an empty field,
// or one equal to na_value, or a quoted empty one (""), takes its column's default; a
// column without a default makes that an error. A field in double quotes may hold the
// delimiter, line breaks and "" for a quote (use_quote_delim); an unquoted field must
// hold no quote. A record of too many or too few fields, a number that does not parse
// and an unclosed quote are errors too.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/data/file_io.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
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

// header and file_compression are the files' (csv_dataset); decode_csv, given
// records already read, takes neither.
struct csv_options {
  bool header = false; // the first line names the columns: skipped
  char field_delim = ',';
  bool use_quote_delim = true;
  std::string na_value{};         // a field equal to it is missing (as an empty one)
  std::vector<int> select_cols{}; // the columns read, ascending; empty: all
  compression file_compression = compression::none;
};

namespace detail {

struct csv_field {
  std::string_view text;
  bool quoted = false;
};

// Splits one record's text (a line, or lines a quoted field joins, without the last
// one's "\n"; a "\r" at its end is the line end's) into fields. The fields view the
// record and, for quoted ones (their "" undone), this splitter's own text: both must
// outlive them.
class csv_splitter {
public:
  enum class result { ok, open_quote, malformed };

  csv_splitter(char delim, bool quotes) : delim_(delim), quotes_(quotes) {}

  // open_quote: the record ends inside a quoted field (a line break in it, when the
  // caller reads lines: it joins the next line and splits again). malformed: error()
  // says why.
  inline result split(std::string_view record);

  const std::vector<csv_field>& fields() const noexcept { return fields_; }
  const char* error() const noexcept { return error_; }

private:
  char delim_;
  bool quotes_;
  std::vector<csv_field> fields_;
  std::string unquoted_;
  const char* error_ = "";
};

// The columns' values of records split into fields: row `row` of each column.
class csv_decoder {
public:
  // `who` begins each error about the columns or options.
  LOOM_COMPILED_ONCE csv_decoder(std::vector<csv_column> columns, csv_options options,
                                 std::string_view who);

  const std::vector<csv_column>& columns() const noexcept { return columns_; }
  const csv_options& options() const noexcept { return options_; }

  // Each column's tensor of `rows` values, or a scalar when rows is nullopt.
  LOOM_COMPILED_ONCE std::vector<any_tensor> make_columns(std::optional<std::int64_t> rows) const;

  // Writes the record's values into row `row` of `columns` (make_columns'); what is
  // wrong with the record otherwise ("" when nothing is).
  inline std::string decode(const std::vector<csv_field>& fields, std::vector<any_tensor>& columns,
                            std::int64_t row) const;

private:
  // The field's value into *to; false when it does not parse as a T.
  template <class T> static bool parse(std::string_view text, T* to);

  std::vector<csv_column> columns_;
  csv_options options_;
  std::size_t fields_needed_;
};

} // namespace detail
} // namespace loom::data

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::data::detail {

auto csv_splitter::split(std::string_view record) -> result {
  fields_.clear();
  unquoted_.clear();
  unquoted_.reserve(record.size()); // never longer than the record: the views stay valid
  const std::size_t n = record.size();
  std::size_t i = 0;
  for (;;) {
    if (quotes_ && i < n && record[i] == '"') {
      const std::size_t start = unquoted_.size();
      for (++i;; ++i) {
        if (i == n)
          return result::open_quote;
        if (record[i] == '"') {
          if (i + 1 < n && record[i + 1] == '"') {
            unquoted_.push_back('"');
            ++i;
            continue;
          }
          ++i; // past the closing quote
          break;
        }
        unquoted_.push_back(record[i]);
      }
      fields_.push_back({std::string_view(unquoted_).substr(start), true});
      if (i == n || (record[i] == '\r' && i + 1 == n))
        return result::ok;
      if (record[i] != delim_) {
        error_ = record[i] == '\r' ? "a quoted field is followed by \"\\r\" without \"\\n\""
                                   : "a quoted field must end at a delimiter or the line's end";
        return result::malformed;
      }
      ++i;
      continue;
    }
    const auto* at = static_cast<const char*>(std::memchr(record.data() + i, delim_, n - i));
    const std::size_t end = at ? static_cast<std::size_t>(at - record.data()) : n;
    std::string_view text = record.substr(i, end - i);
    if (quotes_ && text.find('"') != std::string_view::npos) {
      error_ = "an unquoted field holds a quote (quote the field and double it)";
      return result::malformed;
    }
    if (!at) {
      if (!text.empty() && text.back() == '\r')
        text.remove_suffix(1);
      fields_.push_back({text, false});
      return result::ok;
    }
    fields_.push_back({text, false});
    i = end + 1;
  }
}

template <class T> bool csv_decoder::parse(std::string_view text, T* to) {
  if constexpr (std::is_same_v<T, std::string>) {
    to->assign(text);
    return true;
  } else {
    // strtoll and strtod as TF's parser accepts (leading blanks, a sign, "inf"), over a
    // terminated copy of the field.
    char small[64];
    std::string large;
    const char* s = small;
    if (text.size() < sizeof small) {
      std::memcpy(small, text.data(), text.size());
      small[text.size()] = '\0';
    } else {
      large.assign(text);
      s = large.c_str();
    }
    char* end = nullptr;
    errno = 0;
    if constexpr (std::is_integral_v<T>) {
      const long long v = std::strtoll(s, &end, 10);
      if (end != s + text.size() || errno == ERANGE ||
          (sizeof(T) == 4 && (v < INT32_MIN || v > INT32_MAX)))
        return false;
      *to = static_cast<T>(v);
    } else {
      const double v = std::strtod(s, &end);
      if (end != s + text.size())
        return false;
      *to = static_cast<T>(v);
    }
    return true;
  }
}

std::string csv_decoder::decode(const std::vector<csv_field>& fields,
                                std::vector<any_tensor>& columns, std::int64_t row) const {
  const auto& sel = options_.select_cols;
  if (fields.size() < fields_needed_ || (sel.empty() && fields.size() > fields_needed_))
    return "expected " + std::to_string(fields_needed_) + (sel.empty() ? "" : " or more") +
           " fields, the record has " + std::to_string(fields.size());
  for (std::size_t i = 0; i < columns_.size(); ++i) {
    const std::size_t at = sel.empty() ? i : static_cast<std::size_t>(sel[i]);
    const csv_field& f = fields[at];
    const csv_column& col = columns_[i];
    const bool missing = f.text.empty() || (!f.quoted && !options_.na_value.empty() &&
                                            f.text == std::string_view(options_.na_value));
    if (missing && !col.default_value)
      return "field " + std::to_string(at) + " is empty and its column has no default";
    const bool parsed = visit_dtype(col.type, [&]<class T>() {
      T* to = columns[i].data<T>() + row;
      if (missing) {
        *to = *col.default_value->data<T>();
        return true;
      }
      if constexpr (std::is_same_v<T, bool>)
        return false; // refused by the constructor
      else
        return parse(f.text, to);
    });
    if (!parsed)
      return "field " + std::to_string(at) + " is \"" + std::string(f.text) + "\", not a valid " +
             std::string(to_string(col.type));
  }
  return {};
}

LOOM_COMPILED_ONCE csv_decoder::csv_decoder(std::vector<csv_column> columns, csv_options options,
                                            std::string_view who)
    : columns_(std::move(columns)), options_(std::move(options)) {
  const std::string w(who);
  for (const csv_column& c : columns_) {
    if (c.type == dtype::boolean)
      throw invalid_argument_error(w + ": a column of bool (TF reads int32, int64, float32, "
                                       "float64 and string)");
    if (c.default_value && (c.default_value->type() != c.type || c.default_value->rank() != 0))
      throw invalid_argument_error(w + ": a column of " + std::string(to_string(c.type)) +
                                   " has the default " + c.default_value->describe());
  }
  const auto& sel = options_.select_cols;
  if (!sel.empty() && sel.size() != columns_.size())
    throw invalid_argument_error(w + ": " + std::to_string(sel.size()) + " select_cols for " +
                                 std::to_string(columns_.size()) + " columns");
  if (!std::is_sorted(sel.begin(), sel.end()) ||
      std::adjacent_find(sel.begin(), sel.end()) != sel.end() || (!sel.empty() && sel[0] < 0))
    throw invalid_argument_error(w + ": select_cols must be distinct, ascending and not negative");
  fields_needed_ = sel.empty() ? columns_.size() : static_cast<std::size_t>(sel.back()) + 1;
}

LOOM_COMPILED_ONCE std::vector<any_tensor>
csv_decoder::make_columns(std::optional<std::int64_t> rows) const {
  std::vector<any_tensor> out;
  out.reserve(columns_.size());
  for (const csv_column& c : columns_)
    out.emplace_back(c.type, rows ? loom::shape{*rows} : loom::shape{});
  return out;
}

} // namespace loom::data::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

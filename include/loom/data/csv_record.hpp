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
#include <loom/core/fingerprint.hpp>
#include <loom/core/tensor.hpp>
#include <loom/data/file_io.hpp>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::data {

// One column: its dtype and its default (none: the field is required).
struct csv_column {
  dtype type;
  std::optional<any_tensor> default_value;
  // Above 0: an int64 column of the field's text hashed into this many buckets as
  // string_to_hash_bucket_fast hashes it (TF's decode_csv of a string column, then
  // categorical_column_with_hash_bucket's hash), without making a string of each field;
  // its default_value is the string a missing field stands for.
  std::int64_t hash_buckets = 0;
};

template <element_type T> csv_column csv_default(T value) {
  return {dtype_of<T>, any_tensor::scalar<T>(std::move(value))};
}
template <element_type T> csv_column csv_required() {
  return {dtype_of<T>, std::nullopt};
}
// A string column hashed to `num_buckets` ids (above); a missing field is `missing`'s
// bucket, or an error where it is nullopt.
inline csv_column csv_hash_bucket(std::int64_t num_buckets,
                                  std::optional<std::string> missing = std::string()) {
  return {dtype::i64,
          missing ? std::optional<any_tensor>(any_tensor::scalar<std::string>(std::move(*missing)))
                  : std::nullopt,
          num_buckets};
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

  std::span<const csv_field> fields() const noexcept { return {fields_.data(), count_}; }
  const char* error() const noexcept { return error_; }

private:
  // A record without quotes: its delimiters found eight bytes at a time.
  inline void split_unquoted(std::string_view record);

  char delim_;
  bool quotes_;
  // Grown, never shrunk: fields_[0, count_) are this record's (no vector call per field).
  void add(std::string_view text, bool quoted) {
    if (count_ == fields_.size())
      fields_.resize(2 * count_ + 8);
    fields_[count_++] = {text, quoted};
  }
  std::vector<csv_field> fields_;
  std::size_t count_ = 0;
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

  // Where decode writes, into `into`: each column's first element (make_columns'
  // tensors'), looked up once, not per field.
  LOOM_COMPILED_ONCE void outputs(std::vector<any_tensor>& columns, std::vector<void*>& into) const;

  // Writes the record's values into row `row` of the columns `outputs` points into;
  // what is wrong with the record otherwise ("" when nothing is).
  inline std::string decode(std::span<const csv_field> fields, const std::vector<void*>& outputs,
                            std::int64_t row) const;

private:
  // The field's value into *to; false when it does not parse as a T.
  template <class T> static bool parse(std::string_view text, T* to);
  // Field f's value (or its column's default) into row `row` of out; false where it
  // has none or does not parse.
  template <class T>
  bool decode_field(const csv_field& f, const csv_column& col, void* out, std::int64_t row) const;
  // A hashed column's field (csv_hash_bucket): its text's bucket, or its default's.
  bool decode_hashed(const csv_field& f, const csv_column& col, void* out, std::int64_t row) const {
    std::string_view text = f.text;
    if (missing(f)) {
      if (!col.default_value)
        return false;
      text = *static_cast<const std::string*>(col.default_value->raw_data());
    }
    static_cast<std::int64_t*>(out)[row] = string_to_hash_bucket_fast(text, col.hash_buckets);
    return true;
  }
  // Empty, or equal to na_value: the column's default is the value.
  bool missing(const csv_field& f) const {
    return f.text.empty() || (!f.quoted && !options_.na_value.empty() &&
                              f.text == std::string_view(options_.na_value));
  }

  std::vector<csv_column> columns_;
  csv_options options_;
  std::size_t fields_needed_;
};

} // namespace detail
} // namespace loom::data

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::data::detail {

auto csv_splitter::split(std::string_view record) -> result {
  count_ = 0;
  if (!quotes_ || std::memchr(record.data(), '"', record.size()) == nullptr) {
    split_unquoted(record);
    return result::ok;
  }
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
      add(std::string_view(unquoted_).substr(start), true);
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
      add(text, false);
      return result::ok;
    }
    add(text, false);
    i = end + 1;
  }
}

void csv_splitter::split_unquoted(std::string_view record) {
  // Fields are short (ctr's TSV: 9 bytes on average), so a memchr per field cost more
  // than its scan. Each 8-byte word is tested for the delimiter at once (SWAR: a byte
  // equal to it becomes zero, and zero bytes get their high bit set), and the fields
  // end at the set bits, in order on a little-endian machine.
  const char* text = record.data();
  const std::size_t n = record.size();
  std::size_t start = 0, i = 0;
  if constexpr (std::endian::native == std::endian::little) {
    constexpr std::uint64_t low7 = 0x7f7f7f7f7f7f7f7fULL;
    const std::uint64_t pattern = 0x0101010101010101ULL * static_cast<unsigned char>(delim_);
    for (; i + 8 <= n; i += 8) {
      std::uint64_t word;
      std::memcpy(&word, text + i, 8);
      const std::uint64_t x = word ^ pattern;
      std::uint64_t found = ~(((x & low7) + low7) | x | low7);
      for (; found != 0; found &= found - 1) {
        const std::size_t at = i + static_cast<std::size_t>(std::countr_zero(found)) / 8;
        add(record.substr(start, at - start), false);
        start = at + 1;
      }
    }
  }
  for (; i < n; ++i)
    if (text[i] == delim_) {
      add(record.substr(start, i - start), false);
      start = i + 1;
    }
  std::string_view last = record.substr(start);
  if (!last.empty() && last.back() == '\r')
    last.remove_suffix(1);
  add(last, false);
}

template <class T> bool csv_decoder::parse(std::string_view text, T* to) {
  if constexpr (std::is_same_v<T, std::string>) {
    to->assign(text);
    return true;
  } else {
    if constexpr (std::is_integral_v<T>) {
      // The common field, an optional '-' and up to 18 digits, without strtoll; what it
      // reads it reads as strtoll does, and anything else goes to strtoll below.
      const bool negative = text.size() > 1 && text[0] == '-';
      const std::string_view digits = text.substr(negative ? 1 : 0);
      std::int64_t v = 0;
      bool all_digits = !digits.empty() && digits.size() <= 18;
      for (std::size_t k = 0; all_digits && k < digits.size(); ++k) {
        const auto d = static_cast<unsigned>(digits[k]) - unsigned{'0'};
        all_digits = d <= 9;
        v = v * 10 + static_cast<std::int64_t>(d);
      }
      if (all_digits) {
        v = negative ? -v : v;
        if (sizeof(T) == 4 && (v < INT32_MIN || v > INT32_MAX))
          return false;
        *to = static_cast<T>(v);
        return true;
      }
    }
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

template <class T>
bool csv_decoder::decode_field(const csv_field& f, const csv_column& col, void* out,
                               std::int64_t row) const {
  T* to = static_cast<T*>(out) + row;
  if (missing(f)) {
    if (!col.default_value)
      return false;
    *to = *static_cast<const T*>(col.default_value->raw_data());
    return true;
  }
  return parse(f.text, to);
}

std::string csv_decoder::decode(std::span<const csv_field> fields,
                                const std::vector<void*>& outputs, std::int64_t row) const {
  const auto& sel = options_.select_cols;
  if (fields.size() < fields_needed_ || (sel.empty() && fields.size() > fields_needed_))
    return "expected " + std::to_string(fields_needed_) + (sel.empty() ? "" : " or more") +
           " fields, the record has " + std::to_string(fields.size());
  for (std::size_t i = 0; i < columns_.size(); ++i) {
    const std::size_t at = sel.empty() ? i : static_cast<std::size_t>(sel[i]);
    const csv_field& f = fields[at];
    const csv_column& col = columns_[i];
    bool ok = false;
    if (col.hash_buckets > 0) // fails only where missing without a default
      ok = decode_hashed(f, col, outputs[i], row);
    else
      switch (col.type) { // a switch, not visit_dtype: this runs per field
      case dtype::i64: ok = decode_field<std::int64_t>(f, col, outputs[i], row); break;
      case dtype::string: ok = decode_field<std::string>(f, col, outputs[i], row); break;
      case dtype::f32: ok = decode_field<float>(f, col, outputs[i], row); break;
      case dtype::i32: ok = decode_field<std::int32_t>(f, col, outputs[i], row); break;
      case dtype::f64: ok = decode_field<double>(f, col, outputs[i], row); break;
      case dtype::boolean: break; // refused by the constructor
      }
    if (ok)
      continue;
    if (missing(f))
      return "field " + std::to_string(at) + " is empty and its column has no default";
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
    if (c.hash_buckets < 0 || (c.hash_buckets > 0 && c.type != dtype::i64))
      throw invalid_argument_error(w + ": a column hashed into " + std::to_string(c.hash_buckets) +
                                   " buckets of " + std::string(to_string(c.type)) +
                                   " (csv_hash_bucket: int64 ids, 1 bucket or more)");
    const dtype default_type = c.hash_buckets > 0 ? dtype::string : c.type;
    if (c.default_value &&
        (c.default_value->type() != default_type || c.default_value->rank() != 0))
      throw invalid_argument_error(w + ": a column of " + std::string(to_string(c.type)) +
                                   (c.hash_buckets > 0 ? " hashed from strings" : "") +
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

LOOM_COMPILED_ONCE void csv_decoder::outputs(std::vector<any_tensor>& columns,
                                             std::vector<void*>& into) const {
  into.clear();
  for (any_tensor& c : columns)
    into.push_back(c.raw_data());
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

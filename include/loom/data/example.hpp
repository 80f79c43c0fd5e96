// tf.Example parsing (TF's tf.io.parse_example / parse_single_example): a
// spec names the features a model reads, and parsing a batch of serialized
// Example protos gives `features` (data/features.hpp):
//   fixed_len(name, dtype, shape, default)  -> a dense [batch] + shape tensor
//                                              (TF's FixedLenFeature)
//   var_len(name, dtype)                    -> a sparse value: indices [N, 2],
//                                              values [N], dense_shape
//                                              [batch, longest list]
//                                              (TF's VarLenFeature)
// with dtype int64, float32 or string (TF's Int64List, FloatList, BytesList).
// Features not in the spec are skipped. Errors, each naming the feature and
// the example's position in the batch: a required feature missing, a feature
// of another type than the spec's, a fixed-length feature with the wrong
// number of values, bytes that are no Example.
//
// Parsed a batch at a time, straight into the batch's tensors, as TF's
// fast parser does: `tfrecord_dataset(files) | batch(256) | map(example_parser(spec))`.
// The encoding TF writes (each field once, in order, lists packed, short lengths in
// one byte) is read directly; any other the wire format allows is read with
// core/protobuf_wire.hpp's reader (a view of the bytes and of its name, which
// allocates nothing), to the same values.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/protobuf_wire.hpp>
#include <loom/core/tensor.hpp>
#include <loom/data/features.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace loom::data {

class example_spec {
public:
  struct feature {
    std::string name;
    dtype type;
    bool fixed;               // FixedLenFeature, else VarLenFeature
    loom::shape shape;        // fixed only
    any_tensor default_value; // fixed only; empty: required
  };

  // A FixedLenFeature; `default_value` (empty: the feature is required) holds
  // shape's number of elements, or one that fills it.
  example_spec& fixed_len(std::string name, dtype type, loom::shape shape,
                          any_tensor default_value = {});
  template <element_type T>
  example_spec& fixed_len(std::string name, loom::shape shape, std::vector<T> default_value) {
    const auto n = static_cast<std::int64_t>(default_value.size());
    return fixed_len(std::move(name), dtype_of<T>, std::move(shape),
                     any_tensor::from_vector(loom::shape{n}, default_value));
  }

  // A VarLenFeature: any number of values per example, batched as sparse.
  example_spec& var_len(std::string name, dtype type) {
    check_type(name, type);
    add({std::move(name), type, false, {}, {}});
    return *this;
  }

  const std::vector<feature>& all() const noexcept { return features_; }
  // The position of a feature in all(), or -1.
  int find(std::string_view name) const {
    const auto it = index_.find(name);
    return it == index_.end() ? -1 : it->second;
  }

private:
  static void check_type(const std::string& name, dtype type);
  void add(feature f);

  // Looked up by string_view, so parsing a key allocates nothing.
  struct name_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };
  std::vector<feature> features_;
  std::unordered_map<std::string, int, name_hash, std::equal_to<>> index_;
};

namespace detail {

// The Feature message's kinds (tensorflow/core/example/feature.proto).
inline dtype feature_kind(std::uint32_t field);

// One parse: the spec's columns, filled example by example.
// Its per-record and per-feature steps are inline, defined with the compiled-once ones
// (core/compiled_once.hpp): only parse_example and parse_single_example call them, and
// inline, g++ -O2 inlines them into each other (out of line, a parse took twice as long).
class example_batch_parser {
public:
  example_batch_parser(const example_spec& spec, std::size_t batch);

  inline void parse(std::size_t e, std::string_view serialized);

  features finish();

private:
  struct column {
    std::int64_t per_example = 0;      // fixed
    any_tensor dense;                  // fixed: [batch] + shape
    void* dense_data = nullptr;        // its elements, of the spec's dtype
    std::vector<std::int64_t> lengths; // var_len: values per example
    std::vector<std::int64_t> ints;
    std::vector<float> floats;
    std::vector<std::string> strings;
    std::size_t start = 0; // var_len: where this example's values begin
  };

  // Out of line and cold: the error's message is built only when it is thrown.
  [[noreturn, gnu::cold, gnu::noinline]] void fail(const std::string& name,
                                                   const std::string& why) const {
    throw invalid_argument_error("parse_example: example " + std::to_string(example_) +
                                 ": feature \"" + name + "\": " + why);
  }
  [[noreturn, gnu::cold]] void fail_kind(int c, dtype kind) const;
  [[noreturn, gnu::cold]] void fail_too_many(int c) const;
  [[noreturn, gnu::cold]] void fail_count(int c, std::int64_t count) const;
  [[noreturn, gnu::cold]] void fail_varint(int c) const;

  // A Features map entry: key (1) and Feature (2).
  inline void parse_entry(std::string_view entry_bytes);
  // A Feature's list of values into column c: a fixed one's slot of the example, a
  // var_len one's values. One function a dtype, so that no per-value branch on it
  // remains.
  template <class T> [[gnu::always_inline]] inline void read_values(int c, std::string_view list);
  // The values of a list (its field 1, packed or not), each given to put.
  template <class T, class Put>
  [[gnu::always_inline]] inline void for_each_value(std::string_view list, int c, Put&& put);
  // A list's length-delimited field 1: a bytes value, or numbers packed, each given to put.
  template <class T, class Put>
  [[gnu::always_inline]] inline void put_delimited(std::string_view bytes, int c, Put& put);

  // The spec's column of a key, or -1. Examples of one dataset list their
  // features in one order, so the order is learned as each column's successor
  // and followed: the column after the previous entry's is tried first, then
  // the two after it (an entry after missing optional features, as in
  // Criteo's rows), before the name is hashed. Only a key found by hashing
  // changes the order learned, so an example with a feature missing does not
  // unlearn it for the next one.
  inline int column_of(std::string_view key);
  // A column's name equals key. Names are a few bytes: compared inline, as a
  // call to memcmp took a quarter of the parse.
  bool is_named(int c, std::string_view key) const noexcept {
    const std::string_view name = names_[static_cast<std::size_t>(c)];
    if (name.size() != key.size())
      return false;
    for (std::size_t i = 0; i < name.size(); ++i)
      if (name[i] != key[i])
        return false;
    return true;
  }

  // The common encoding, read without a reader: `bytes` starts with the length-delimited
  // field whose key is the one byte `tag` and whose length is one byte. Its bytes go to
  // `out` and `bytes` moves past it; false (nothing moved) for any other encoding. TF and
  // every protobuf library write a feature's entry, key, Feature and short lists so, and a
  // reader's loop and wire-type switch for each took a third of a parse; the reader reads
  // the rest.
  [[gnu::always_inline]] static bool take_short_field(std::string_view& bytes, char tag,
                                                      std::string_view& out) noexcept {
    if (bytes.size() < 2 || bytes[0] != tag || (bytes[1] & 0x80))
      return false;
    const auto n = static_cast<std::size_t>(static_cast<std::uint8_t>(bytes[1]));
    if (n > bytes.size() - 2)
      return false;
    out = std::string_view(bytes.data() + 2, n); // not substr(), whose check g++ calls out of line
    bytes.remove_prefix(2 + n);
    return true;
  }

  // A varint of a packed list (whose values have no keys, so the field reader
  // does not apply).
  [[gnu::always_inline]] inline std::uint64_t packed_varint(const char*& at, const char* end,
                                                            int c) const;

  const example_spec& spec_;
  std::size_t batch_;
  std::vector<column> columns_;
  std::size_t example_ = 0;
  // By column: the number of the last example that held it (examples are numbered from
  // 1 as parsed), so that a new example clears nothing; and how many fixed columns the
  // example held, so that defaults are looked for only where one was missing.
  std::vector<std::size_t> seen_in_;
  std::size_t parsed_ = 0;
  std::size_t fixed_columns_ = 0;
  std::size_t fixed_seen_ = 0;
  int previous_ = -1;                   // the column of the example's last known entry
  std::vector<int> successor_;          // by column + 1: the column that came after it
  std::vector<std::string_view> names_; // by column: the spec's names
};

} // namespace detail

// A batch of serialized Examples parsed with `spec`.
LOOM_COMPILED_ONCE features parse_example(const example_spec& spec,
                                          std::span<const std::string> serialized);

// One serialized Example (TF's parse_single_example): fixed features have the
// spec's shape, sparse ones indices [N, 1] and dense_shape [length].
LOOM_COMPILED_ONCE features parse_single_example(const example_spec& spec,
                                                 std::string_view serialized);

// parse_example as a callable for map(): a batch of records (what
// tfrecord_dataset | batch(n) gives) to features.
class example_parser {
public:
  explicit example_parser(example_spec spec)
      : spec_(std::make_shared<const example_spec>(std::move(spec))) {}
  features operator()(const tensor<std::string, 1>& serialized) const {
    return parse_example(*spec_, serialized.flat());
  }

private:
  std::shared_ptr<const example_spec> spec_;
};

} // namespace loom::data

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::data {

LOOM_COMPILED_ONCE auto example_spec::fixed_len(std::string name, dtype type, loom::shape shape,
                                                any_tensor default_value) -> example_spec& {
  check_type(name, type);
  if (!shape.fully_defined())
    throw invalid_argument_error("example_spec: feature \"" + name + "\" has the partial shape " +
                                 shape.to_string());
  if (!default_value.empty()) {
    if (default_value.type() != type)
      throw invalid_argument_error("example_spec: feature \"" + name + "\" is " +
                                   std::string(to_string(type)) + ", its default " +
                                   default_value.describe());
    const std::int64_t n = shape.num_elements();
    if (default_value.num_elements() == 1 && n != 1) {
      any_tensor filled(type, shape);
      visit_dtype(type,
                  [&]<class T>() { std::fill_n(filled.data<T>(), n, default_value.data<T>()[0]); });
      default_value = filled;
    } else if (default_value.num_elements() != n) {
      throw invalid_argument_error("example_spec: feature \"" + name + "\" of shape " +
                                   shape.to_string() + " has a default of " +
                                   std::to_string(default_value.num_elements()) + " values");
    }
    default_value = default_value.reshaped(shape);
  }
  add({std::move(name), type, true, std::move(shape), std::move(default_value)});
  return *this;
}

LOOM_COMPILED_ONCE void example_spec::check_type(const std::string& name, dtype type) {
  if (type != dtype::i64 && type != dtype::f32 && type != dtype::string)
    throw invalid_argument_error("example_spec: feature \"" + name + "\" is " +
                                 std::string(to_string(type)) +
                                 "; a tf.Example holds int64, float32 or string (bytes)");
}

LOOM_COMPILED_ONCE void example_spec::add(feature f) {
  if (find(f.name) >= 0)
    throw invalid_argument_error("example_spec: feature \"" + f.name + "\" is given twice");
  index_.emplace(f.name, static_cast<int>(features_.size()));
  features_.push_back(std::move(f));
}
} // namespace loom::data

namespace loom::data::detail {

inline dtype feature_kind(std::uint32_t field) {
  switch (field) {
  case 1: return dtype::string;   // BytesList
  case 2: return dtype::f32;      // FloatList
  case 3: return dtype::i64;      // Int64List
  default: return dtype::boolean; // not a kind: the caller skips it
  }
}

LOOM_COMPILED_ONCE example_batch_parser::example_batch_parser(const example_spec& spec,
                                                              std::size_t batch)
    : spec_(spec), batch_(batch), columns_(spec.all().size()), seen_in_(spec.all().size(), 0),
      successor_(spec.all().size() + 1, -1) {
  for (std::size_t c = 0; c < columns_.size(); ++c) {
    const auto& f = spec.all()[c];
    names_.push_back(f.name);
    column& col = columns_[c];
    if (f.fixed) {
      ++fixed_columns_;
      col.per_example = f.shape.num_elements();
      std::vector<std::int64_t> dims{static_cast<std::int64_t>(batch)};
      dims.insert(dims.end(), f.shape.dims().begin(), f.shape.dims().end());
      col.dense = any_tensor(f.type, loom::shape(std::move(dims)));
      col.dense_data = col.dense.raw_data();
    } else {
      col.lengths.assign(batch, 0);
    }
  }
}

inline void example_batch_parser::parse(std::size_t e, std::string_view serialized) {
  example_ = e;
  previous_ = -1;
  ++parsed_;
  fixed_seen_ = 0;
  loom::detail::protobuf::reader example(serialized, "tf.Example");
  while (!example.done()) {
    const loom::detail::protobuf::field f = example.next();
    if (f.number != 1 || f.type != loom::detail::protobuf::wire_type::length_delimited)
      continue; // Example.features
    for (std::string_view entries = f.bytes, entry; !entries.empty();) {
      if (take_short_field(entries, '\x0a', entry)) { // Features.feature (1), a map entry
        parse_entry(entry);
        continue;
      }
      loom::detail::protobuf::reader features(entries, "tf.Features");
      const loom::detail::protobuf::field e = features.next();
      if (e.number == 1 && e.type == loom::detail::protobuf::wire_type::length_delimited)
        parse_entry(e.bytes);
      entries = features.left();
    }
  }
  if (fixed_seen_ == fixed_columns_)
    return;
  for (std::size_t c = 0; c < columns_.size(); ++c) {
    column& col = columns_[c];
    const auto& spec = spec_.all()[c];
    if (seen_in_[c] == parsed_ || !spec.fixed)
      continue;
    if (spec.default_value.empty())
      throw invalid_argument_error("parse_example: example " + std::to_string(e) + ": feature \"" +
                                   spec.name + "\" (" + std::string(to_string(spec.type)) +
                                   ") is required but missing, and has no default");
    visit_dtype(spec.type, [&]<class T>() {
      std::copy_n(spec.default_value.data<T>(), col.per_example,
                  col.dense.data<T>() + static_cast<std::int64_t>(e) * col.per_example);
    });
  }
}

LOOM_COMPILED_ONCE auto example_batch_parser::finish() -> features {
  features out;
  for (std::size_t c = 0; c < columns_.size(); ++c) {
    column& col = columns_[c];
    const auto& spec = spec_.all()[c];
    if (spec.fixed) {
      out.set(spec.name, std::move(col.dense));
      continue;
    }
    std::int64_t total = 0, longest = 0;
    for (const auto n : col.lengths) {
      total += n;
      longest = std::max(longest, n);
    }
    any_sparse s;
    s.indices = tensor<std::int64_t, 2>(loom::shape{total, 2});
    s.dense_shape = tensor<std::int64_t, 1>(
        loom::shape{2}, std::vector<std::int64_t>{static_cast<std::int64_t>(batch_), longest});
    std::int64_t* idx = s.indices.data();
    for (std::size_t e = 0; e < batch_; ++e)
      for (std::int64_t k = 0; k < col.lengths[e]; ++k) {
        *idx++ = static_cast<std::int64_t>(e);
        *idx++ = k;
      }
    if (spec.type == dtype::i64)
      s.values = any_tensor::from_vector(loom::shape{total}, col.ints);
    else if (spec.type == dtype::f32)
      s.values = any_tensor::from_vector(loom::shape{total}, col.floats);
    else
      s.values = any_tensor::from_vector(loom::shape{total}, col.strings);
    out.set(spec.name, std::move(s));
  }
  return out;
}

inline void example_batch_parser::parse_entry(std::string_view entry_bytes) {
  std::string_view key, value;
  if (std::string_view rest = entry_bytes;
      !(take_short_field(rest, '\x0a', key) && take_short_field(rest, '\x12', value) &&
        rest.empty())) {
    key = value = {};
    loom::detail::protobuf::reader entry(entry_bytes, "tf.Feature map");
    while (!entry.done()) {
      const loom::detail::protobuf::field f = entry.next();
      if (f.type != loom::detail::protobuf::wire_type::length_delimited)
        continue;
      if (f.number == 1)
        key = f.bytes;
      else if (f.number == 2)
        value = f.bytes;
    }
  }
  const int c = column_of(key);
  if (c < 0)
    return;
  const auto& spec = spec_.all()[static_cast<std::size_t>(c)];
  const bool first = seen_in_[static_cast<std::size_t>(c)] != parsed_;
  seen_in_[static_cast<std::size_t>(c)] = parsed_;
  if (spec.fixed) {
    fixed_seen_ += first;
  } else {
    // A key given twice: the last wins, as for any protobuf map.
    column& col = columns_[static_cast<std::size_t>(c)];
    if (first)
      col.start = spec.type == dtype::i64   ? col.ints.size()
                  : spec.type == dtype::f32 ? col.floats.size()
                                            : col.strings.size();
    col.ints.resize(spec.type == dtype::i64 ? col.start : col.ints.size());
    col.floats.resize(spec.type == dtype::f32 ? col.start : col.floats.size());
    col.strings.resize(spec.type == dtype::string ? col.start : col.strings.size());
  }

  // The Feature: its one kind's list, whose field 1 holds the values.
  std::string_view list;
  dtype kind = spec.type; // a Feature with no kind set holds no values
  if (std::string_view rest = value;
      !value.empty() && (value[0] == '\x0a' || value[0] == '\x12' || value[0] == '\x1a') &&
      take_short_field(rest, value[0], list) && rest.empty()) {
    kind = feature_kind(static_cast<std::uint32_t>(value[0]) >> 3);
  } else {
    loom::detail::protobuf::reader feature(value, "tf.Feature");
    while (!feature.done()) {
      const loom::detail::protobuf::field f = feature.next();
      const dtype k = feature_kind(f.number);
      if (k == dtype::boolean || f.type != loom::detail::protobuf::wire_type::length_delimited)
        continue;
      kind = k;
      list = f.bytes;
    }
  }
  if (kind != spec.type)
    fail_kind(c, kind);
  switch (spec.type) {
  case dtype::i64: read_values<std::int64_t>(c, list); break;
  case dtype::f32: read_values<float>(c, list); break;
  default: read_values<std::string>(c, list); break;
  }
}

template <class T> inline void example_batch_parser::read_values(int c, std::string_view list) {
  const auto& spec = spec_.all()[static_cast<std::size_t>(c)];
  column& col = columns_[static_cast<std::size_t>(c)];
  std::int64_t count = 0;
  if (spec.fixed) {
    T* slot =
        static_cast<T*>(col.dense_data) + static_cast<std::int64_t>(example_) * col.per_example;
    for_each_value<T>(list, c, [&](auto&& v) {
      if (count == col.per_example)
        fail_too_many(c);
      slot[count++] = std::forward<decltype(v)>(v);
    });
    if (count != col.per_example)
      fail_count(c, count);
    return;
  }
  auto& values = [&]() -> std::vector<T>& {
    if constexpr (std::is_same_v<T, std::int64_t>)
      return col.ints;
    else if constexpr (std::is_same_v<T, float>)
      return col.floats;
    else
      return col.strings;
  }();
  for_each_value<T>(list, c, [&](auto&& v) {
    values.emplace_back(std::forward<decltype(v)>(v));
    ++count;
  });
  col.lengths[example_] = count;
}

template <class T, class Put>
inline void example_batch_parser::for_each_value(std::string_view list, int c, Put&& put) {
  // The common encoding: one packed list (TF's int64 and float lists) or one bytes value.
  if (std::string_view rest = list, only; take_short_field(rest, '\x0a', only) && rest.empty()) {
    put_delimited<T>(only, c, put);
    return;
  }
  loom::detail::protobuf::reader values(list, "tf.Feature list");
  while (!values.done()) {
    const loom::detail::protobuf::field f = values.next();
    if (f.number != 1)
      continue;
    if (std::is_same_v<T, std::string> ||
        f.type == loom::detail::protobuf::wire_type::length_delimited)
      put_delimited<T>(f.bytes, c, put);
    else if constexpr (std::is_same_v<T, std::int64_t>)
      put(f.as_int64());
    else if constexpr (std::is_same_v<T, float>)
      put(f.as_float());
  }
}

template <class T, class Put>
inline void example_batch_parser::put_delimited(std::string_view bytes, int c, Put& put) {
  if constexpr (std::is_same_v<T, std::string>) {
    put(bytes);
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    for (const char *at = bytes.data(), *end = at + bytes.size(); at != end;)
      put(static_cast<std::int64_t>(packed_varint(at, end, c)));
  } else {
    if (bytes.size() % 4 != 0)
      fail(spec_.all()[static_cast<std::size_t>(c)].name,
           "a packed float list of " + std::to_string(bytes.size()) + " bytes");
    for (std::size_t i = 0; i < bytes.size(); i += 4) {
      std::uint32_t bits = 0; // little-endian on the wire
      if constexpr (std::endian::native == std::endian::little) {
        std::memcpy(&bits, bytes.data() + i, 4);
      } else {
        for (std::size_t b = 0; b < 4; ++b)
          bits |= std::uint32_t{static_cast<std::uint8_t>(bytes[i + b])} << (8 * b);
      }
      put(std::bit_cast<float>(bits));
    }
  }
}

LOOM_COMPILED_ONCE void example_batch_parser::fail_kind(int c, dtype kind) const {
  const auto& spec = spec_.all()[static_cast<std::size_t>(c)];
  fail(spec.name, "the spec says " + std::string(to_string(spec.type)) + ", the example holds " +
                      std::string(to_string(kind)));
}

LOOM_COMPILED_ONCE void example_batch_parser::fail_too_many(int c) const {
  const auto& spec = spec_.all()[static_cast<std::size_t>(c)];
  fail(spec.name, "more values than the " +
                      std::to_string(columns_[static_cast<std::size_t>(c)].per_example) +
                      " of the spec's shape " + spec.shape.to_string());
}

LOOM_COMPILED_ONCE void example_batch_parser::fail_count(int c, std::int64_t count) const {
  const auto& spec = spec_.all()[static_cast<std::size_t>(c)];
  fail(spec.name, std::to_string(count) + " values, the spec's shape " + spec.shape.to_string() +
                      " needs " +
                      std::to_string(columns_[static_cast<std::size_t>(c)].per_example));
}

LOOM_COMPILED_ONCE void example_batch_parser::fail_varint(int c) const {
  fail(spec_.all()[static_cast<std::size_t>(c)].name, "a packed int64 list ends inside a varint");
}

inline int example_batch_parser::column_of(std::string_view key) {
  const auto after = static_cast<std::size_t>(previous_ + 1); // 0: the first entry
  int c = successor_[after];
  for (int step = 0; step < 3 && c >= 0; ++step) {
    if (is_named(c, key))
      return previous_ = c;
    c = successor_[static_cast<std::size_t>(c) + 1];
  }
  c = spec_.find(key);
  if (c >= 0) // a key the spec lacks leaves the order as it was
    successor_[after] = previous_ = c;
  return c;
}

inline std::uint64_t example_batch_parser::packed_varint(const char*& at, const char* end,
                                                         int c) const {
  std::uint64_t v = 0;
  for (int shift = 0; shift < 64 && at != end; shift += 7) {
    const auto b = static_cast<std::uint8_t>(*at++);
    v |= std::uint64_t{b & 0x7fu} << shift;
    if (!(b & 0x80))
      return v;
  }
  fail_varint(c);
}
} // namespace loom::data::detail

namespace loom::data {

LOOM_COMPILED_ONCE features parse_example(const example_spec& spec,
                                          std::span<const std::string> serialized) {
  detail::example_batch_parser parser(spec, serialized.size());
  for (std::size_t e = 0; e < serialized.size(); ++e)
    parser.parse(e, serialized[e]);
  return parser.finish();
}

LOOM_COMPILED_ONCE features parse_single_example(const example_spec& spec,
                                                 std::string_view serialized) {
  detail::example_batch_parser parser(spec, 1);
  parser.parse(0, serialized);
  features batch = parser.finish(), out;
  for (const auto& f : spec.all()) {
    if (f.fixed) {
      out.set(f.name, batch.dense_value(f.name).reshaped(f.shape));
      continue;
    }
    const any_sparse& s = batch.sparse_any(f.name);
    const std::int64_t n = s.indices.dim(0);
    any_sparse one{tensor<std::int64_t, 2>(loom::shape{n, 1}), s.values,
                   tensor<std::int64_t, 1>(loom::shape{1}, s.dense_shape(1))};
    for (std::int64_t k = 0; k < n; ++k)
      one.indices(k, 0) = s.indices(k, 1);
    out.set(f.name, std::move(one));
  }
  return out;
}

} // namespace loom::data

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

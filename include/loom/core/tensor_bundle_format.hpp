// TensorFlow's V2 checkpoint format (core/tensor_bundle.hpp), its encodings: the
// dtypes' numbers, the file names, the index's protocol buffers (BundleHeaderProto,
// BundleEntryProto with its TensorShapeProto and TensorSliceProto) and the keys of a
// partitioned tensor's parts (OrderedCode), each as TF writes it. The reader
// (core/tensor_bundle_reader.hpp) and the writer (core/tensor_bundle_writer.hpp) share them.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/crc32c.hpp>
#include <loom/core/dtype.hpp>
#include <loom/core/error.hpp>
#include <loom/core/leveldb_table.hpp>
#include <loom/core/protobuf_wire.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/tensor_slice.hpp>
#include <loom/core/tfrecord.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::tensor_bundle {

// TF's DataType numbers (types.proto) of loom's dtypes.
LOOM_COMPILED_ONCE int tf_dtype_of(dtype d);
LOOM_COMPILED_ONCE std::optional<dtype> loom_dtype_of(int tf_dtype);
// TF's Python name of a DataType ("float16"), for listings and errors.
LOOM_COMPILED_ONCE std::string tf_dtype_name(int tf_dtype);

// One entry of a checkpoint's index.
struct entry {
  std::string key;           // the tensor's name, or a part's encoded slice key
  int tf_dtype = 0;          // TF's DataType number
  loom::shape shape;         // the tensor's (a partitioned one's full shape)
  std::int32_t shard_id = 0; // its data file
  std::uint64_t offset = 0;  // of its bytes in the data file
  std::uint64_t size = 0;    // its bytes
  std::uint32_t masked_crc32c = 0;
  std::vector<tensor_slice> slices; // a partitioned tensor's parts (it has no data)

  // loom's dtype; nullopt for one loom lacks (float16, uint8, ...).
  std::optional<loom::dtype> type() const { return loom_dtype_of(tf_dtype); }
  std::string dtype_name() const { return tf_dtype_name(tf_dtype); }
  bool partitioned() const noexcept { return !slices.empty(); }
};

// The name of data file `shard` of `num_shards` of checkpoint `prefix`.
inline std::string data_path(const std::string& prefix, int shard, int num_shards) {
  char suffix[48];
  std::snprintf(suffix, sizeof suffix, ".data-%05d-of-%05d", shard, num_shards);
  return prefix + suffix;
}
inline std::string index_path(const std::string& prefix) {
  return prefix + ".index";
}

// TF's bundle format version: the producer version loom writes and the consumer version
// it reads as (an index whose min_consumer is newer is refused).
inline constexpr int format_version = 1;

namespace detail {

// -- TF's OrderedCode, for a part's key --

LOOM_COMPILED_ONCE void ordered_number(std::string& out, std::uint64_t v);
LOOM_COMPILED_ONCE void ordered_string(std::string& out, std::string_view s);
// A signed number in n bytes, n the fewest whose 7n - 1 bits hold it: its two's
// complement big-endian (sign-extended), with its first n bits flipped (past 8 bytes they
// reach into the second byte), so that they read as n ones for a number >= 0 and n zeros
// for a negative one: the encodings sort as the numbers do.
LOOM_COMPILED_ONCE void ordered_signed_number(std::string& out, std::int64_t v);

// -- the protocol buffers --

LOOM_COMPILED_ONCE std::string encode_shape(const loom::shape& s);

LOOM_COMPILED_ONCE std::string encode_slice(const tensor_slice& s);

LOOM_COMPILED_ONCE std::string encode_entry(const entry& e);

LOOM_COMPILED_ONCE std::string encode_header(int num_shards);

struct header {
  int num_shards = 0;
  bool big_endian = false;
  int producer = 0;
  int min_consumer = 0;
  std::vector<int> bad_consumers;
};

LOOM_COMPILED_ONCE header decode_header(std::string_view bytes, const std::string& what);

LOOM_COMPILED_ONCE loom::shape decode_shape(std::string_view bytes, const std::string& what);

LOOM_COMPILED_ONCE tensor_slice decode_slice(std::string_view bytes, const std::string& what);

LOOM_COMPILED_ONCE entry decode_entry(std::string key, std::string_view bytes,
                                      const std::string& what);

// -- tensor data --

LOOM_COMPILED_ONCE std::size_t element_bytes(dtype d);

inline void put_le32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<char>(v >> (8 * i) & 0xff));
}

// A string tensor's bytes in the data file and their CRC-32C (unmasked).
LOOM_COMPILED_ONCE std::pair<std::string, std::uint32_t>
encode_strings(std::span<const std::string> strings);

// A writer's check that a new part of partitioned tensor `full` overlaps none of its
// parts so far (a reader could not tell which to restore).
LOOM_COMPILED_ONCE void check_no_overlap(const entry& full, const tensor_slice& part,
                                         const std::string& prefix);

// Levenshtein distance, for "did you mean" lists.
LOOM_COMPILED_ONCE std::size_t edit_distance(std::string_view a, std::string_view b);

} // namespace detail

// The index key of part `slice` of the partitioned tensor `name` (TF's
// checkpoint::EncodeTensorNameSlice). It begins with a 0 byte, which no name does.
LOOM_COMPILED_ONCE std::string slice_key(std::string_view name, const tensor_slice& slice);

} // namespace loom::tensor_bundle

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::tensor_bundle {

LOOM_COMPILED_ONCE int tf_dtype_of(dtype d) {
  switch (d) {
  case dtype::f32: return 1;
  case dtype::f64: return 2;
  case dtype::i32: return 3;
  case dtype::string: return 7;
  case dtype::i64: return 9;
  case dtype::boolean: return 10;
  }
  throw internal_error("tensor_bundle: unknown dtype");
}

LOOM_COMPILED_ONCE std::optional<dtype> loom_dtype_of(int tf_dtype) {
  switch (tf_dtype) {
  case 1: return dtype::f32;
  case 2: return dtype::f64;
  case 3: return dtype::i32;
  case 7: return dtype::string;
  case 9: return dtype::i64;
  case 10: return dtype::boolean;
  default: return std::nullopt;
  }
}

LOOM_COMPILED_ONCE std::string tf_dtype_name(int tf_dtype) {
  static constexpr const char* names[] = {
      "invalid",   "float32", "float64",    "int32",   "uint8",    "int16",   "int8",     "string",
      "complex64", "int64",   "bool",       "qint8",   "quint8",   "qint32",  "bfloat16", "qint16",
      "quint16",   "uint16",  "complex128", "float16", "resource", "variant", "uint32",   "uint64"};
  if (tf_dtype >= 0 && tf_dtype < static_cast<int>(std::size(names)))
    return names[tf_dtype];
  return "DataType " + std::to_string(tf_dtype);
}
} // namespace loom::tensor_bundle

namespace loom::tensor_bundle::detail {

LOOM_COMPILED_ONCE void ordered_number(std::string& out, std::uint64_t v) {
  // A length byte, then the value big-endian without leading zero bytes.
  unsigned char buf[8];
  int n = 0;
  for (; v > 0; v >>= 8)
    buf[n++] = static_cast<unsigned char>(v & 0xff);
  out.push_back(static_cast<char>(n));
  while (n > 0)
    out.push_back(static_cast<char>(buf[--n]));
}

LOOM_COMPILED_ONCE void ordered_string(std::string& out, std::string_view s) {
  // 0x00 and 0xff are escaped (0x00 0xff, 0xff 0x00); 0x00 0x01 ends the string.
  for (char c : s) {
    out.push_back(c);
    if (c == '\0')
      out.push_back('\xff');
    else if (c == '\xff')
      out.push_back('\0');
  }
  out.append("\0\1", 2);
}

LOOM_COMPILED_ONCE void ordered_signed_number(std::string& out, std::int64_t v) {
  const std::uint64_t magnitude =
      v < 0 ? ~static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
  int n = 1;
  while (n < 10 && magnitude >= (std::uint64_t{1} << (7 * n - 1)))
    ++n;
  unsigned char buf[10];
  const unsigned char sign = v < 0 ? 0xff : 0x00;
  for (int i = 0; i < 10; ++i) // sign-extended to 80 bits, big-endian
    buf[i] =
        i < 2 ? sign : static_cast<unsigned char>(static_cast<std::uint64_t>(v) >> (8 * (9 - i)));
  unsigned char* first = buf + 10 - n;
  for (int bit = 0; bit < n; ++bit) // the n header bits, from the top of the first byte
    first[bit / 8] ^= static_cast<unsigned char>(0x80u >> (bit % 8));
  out.append(reinterpret_cast<const char*>(first), static_cast<std::size_t>(n));
}

LOOM_COMPILED_ONCE std::string encode_shape(const loom::shape& s) {
  loom::detail::protobuf::writer w;
  for (std::int64_t d : s.dims()) {
    loom::detail::protobuf::writer dim;
    if (d != 0)
      dim.int64(1, d);
    w.message(2, dim);
  }
  return std::move(w).bytes();
}

LOOM_COMPILED_ONCE std::string encode_slice(const tensor_slice& s) {
  loom::detail::protobuf::writer w;
  for (int d = 0; d < s.rank(); ++d) {
    loom::detail::protobuf::writer extent;
    if (!s.whole_at(d)) {
      if (s.start(d) != 0)
        extent.int64(1, s.start(d));
      extent.int64(2, s.length(d)); // in a oneof: written even where it is 0
    }
    w.message(1, extent);
  }
  return std::move(w).bytes();
}

LOOM_COMPILED_ONCE std::string encode_entry(const entry& e) {
  loom::detail::protobuf::writer w;
  if (e.tf_dtype != 0)
    w.varint(1, static_cast<std::uint64_t>(e.tf_dtype));
  w.bytes(2, encode_shape(e.shape));
  if (e.shard_id != 0)
    w.varint(3, static_cast<std::uint64_t>(e.shard_id));
  if (e.offset != 0)
    w.varint(4, e.offset);
  if (e.size != 0)
    w.varint(5, e.size);
  if (e.masked_crc32c != 0)
    w.fixed32(6, e.masked_crc32c);
  for (const tensor_slice& s : e.slices)
    w.bytes(7, encode_slice(s));
  return std::move(w).bytes();
}

LOOM_COMPILED_ONCE std::string encode_header(int num_shards) {
  loom::detail::protobuf::writer version;
  version.varint(1, static_cast<std::uint64_t>(format_version)); // producer; min_consumer 0
  loom::detail::protobuf::writer w;
  w.varint(1, static_cast<std::uint64_t>(num_shards)); // endianness LITTLE: the default
  w.message(3, version);
  return std::move(w).bytes();
}

LOOM_COMPILED_ONCE header decode_header(std::string_view bytes, const std::string& what) {
  header h;
  const std::string header_name = what + "'s header (BundleHeaderProto)";
  loom::detail::protobuf::reader r(bytes, header_name);
  while (!r.done()) {
    const loom::detail::protobuf::field f = r.next();
    if (f.number == 1 && f.type == loom::detail::protobuf::wire_type::varint)
      h.num_shards = static_cast<int>(f.as_int64());
    else if (f.number == 2 && f.type == loom::detail::protobuf::wire_type::varint)
      h.big_endian = f.number_value == 1;
    else if (f.number == 3 && f.type == loom::detail::protobuf::wire_type::length_delimited) {
      const std::string version_name = what + "'s format version (VersionDef)";
      loom::detail::protobuf::reader v(f.bytes, version_name);
      while (!v.done()) {
        const loom::detail::protobuf::field g = v.next();
        if (g.type != loom::detail::protobuf::wire_type::varint)
          continue;
        if (g.number == 1)
          h.producer = static_cast<int>(g.as_int64());
        else if (g.number == 2)
          h.min_consumer = static_cast<int>(g.as_int64());
        else if (g.number == 3)
          h.bad_consumers.push_back(static_cast<int>(g.as_int64()));
      }
    }
  }
  return h;
}

LOOM_COMPILED_ONCE loom::shape decode_shape(std::string_view bytes, const std::string& what) {
  std::vector<std::int64_t> dims;
  const std::string shape_name = what + "'s shape (TensorShapeProto)";
  const std::string dim_name = what + "'s shape (TensorShapeProto.Dim)";
  loom::detail::protobuf::reader r(bytes, shape_name);
  while (!r.done()) {
    const loom::detail::protobuf::field f = r.next();
    if (f.number == 3 && f.type == loom::detail::protobuf::wire_type::varint && f.number_value != 0)
      throw data_loss_error(what + " has a shape of unknown rank");
    if (f.number != 2 || f.type != loom::detail::protobuf::wire_type::length_delimited)
      continue;
    std::int64_t size = 0;
    loom::detail::protobuf::reader d(f.bytes, dim_name);
    while (!d.done()) {
      const loom::detail::protobuf::field g = d.next();
      if (g.number == 1 && g.type == loom::detail::protobuf::wire_type::varint)
        size = g.as_int64();
    }
    if (size < 0)
      throw data_loss_error(what + " has a dimension of size " + std::to_string(size));
    dims.push_back(size);
  }
  // The element count must fit an int64 (TF's TensorShape::IsValid), before anyone
  // multiplies the dimensions.
  std::int64_t elements = 1;
  for (std::int64_t d : dims)
    if (d != 0 && elements > std::numeric_limits<std::int64_t>::max() / d)
      throw data_loss_error(what + " has a shape of more than 2^63 elements");
    else
      elements *= d;
  return loom::shape(std::move(dims));
}

LOOM_COMPILED_ONCE tensor_slice decode_slice(std::string_view bytes, const std::string& what) {
  std::vector<std::int64_t> starts, lengths;
  const std::string slice_name = what + "'s slice (TensorSliceProto)";
  const std::string extent_name = what + "'s slice extent";
  loom::detail::protobuf::reader r(bytes, slice_name);
  while (!r.done()) {
    const loom::detail::protobuf::field f = r.next();
    if (f.number != 1 || f.type != loom::detail::protobuf::wire_type::length_delimited)
      continue;
    std::int64_t start = 0, length = tensor_slice::whole;
    loom::detail::protobuf::reader x(f.bytes, extent_name);
    while (!x.done()) {
      const loom::detail::protobuf::field g = x.next();
      if (g.number == 1 && g.type == loom::detail::protobuf::wire_type::varint)
        start = g.as_int64();
      else if (g.number == 2 && g.type == loom::detail::protobuf::wire_type::varint)
        length = g.as_int64();
    }
    starts.push_back(start);
    lengths.push_back(length);
  }
  try {
    return tensor_slice(std::move(starts), std::move(lengths));
  } catch (const invalid_argument_error& e) {
    throw data_loss_error(what + " has a malformed slice: " + e.message());
  }
}

LOOM_COMPILED_ONCE entry decode_entry(std::string key, std::string_view bytes,
                                      const std::string& what) {
  entry e;
  e.key = std::move(key);
  loom::detail::protobuf::reader r(bytes, what);
  while (!r.done()) {
    const loom::detail::protobuf::field f = r.next();
    using wt = loom::detail::protobuf::wire_type;
    switch (f.number) {
    case 1:
      if (f.type == wt::varint)
        e.tf_dtype = static_cast<int>(f.as_int64());
      break;
    case 2:
      if (f.type == wt::length_delimited)
        e.shape = decode_shape(f.bytes, what);
      break;
    case 3:
      if (f.type == wt::varint)
        e.shard_id = static_cast<std::int32_t>(f.as_int64());
      break;
    case 4:
      if (f.type == wt::varint)
        e.offset = f.number_value;
      break;
    case 5:
      if (f.type == wt::varint)
        e.size = f.number_value;
      break;
    case 6:
      if (f.type == wt::fixed32)
        e.masked_crc32c = static_cast<std::uint32_t>(f.number_value);
      break;
    case 7:
      if (f.type == wt::length_delimited)
        e.slices.push_back(decode_slice(f.bytes, what));
      break;
    default: break; // a field of a newer TF: skipped, as protobuf does
    }
  }
  return e;
}

LOOM_COMPILED_ONCE std::size_t element_bytes(dtype d) {
  switch (d) {
  case dtype::f32:
  case dtype::i32: return 4;
  case dtype::f64:
  case dtype::i64: return 8;
  case dtype::boolean: return 1;
  case dtype::string: return 0;
  }
  return 0;
}

LOOM_COMPILED_ONCE std::pair<std::string, std::uint32_t>
encode_strings(std::span<const std::string> strings) {
  std::string out;
  std::uint32_t crc = 0;
  for (const std::string& s : strings) {
    loom::detail::leveldb_table::put_varint64(out, s.size());
    std::string length; // as TF checksums it: a u32 where it fits, else a u64
    if (s.size() <= 0xffffffffu) {
      put_le32(length, static_cast<std::uint32_t>(s.size()));
    } else {
      put_le32(length, static_cast<std::uint32_t>(s.size()));
      put_le32(length, static_cast<std::uint32_t>(static_cast<std::uint64_t>(s.size()) >> 32));
    }
    crc = loom::detail::crc32c::extend(crc, length);
  }
  std::string masked;
  put_le32(masked, tfrecord::mask(crc));
  out += masked;
  crc = loom::detail::crc32c::extend(crc, masked);
  for (const std::string& s : strings) {
    out += s;
    crc = loom::detail::crc32c::extend(crc, s);
  }
  return {std::move(out), crc};
}

LOOM_COMPILED_ONCE void check_no_overlap(const entry& full, const tensor_slice& part,
                                         const std::string& prefix) {
  for (const tensor_slice& have : full.slices)
    if (have.intersect(part, full.shape))
      throw invalid_argument_error("checkpoint " + prefix + ": tensor '" + full.key +
                                   "' has parts " + have.to_string() + " and " + part.to_string() +
                                   ", which overlap");
}

LOOM_COMPILED_ONCE std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}
} // namespace loom::tensor_bundle::detail

namespace loom::tensor_bundle {

LOOM_COMPILED_ONCE std::string slice_key(std::string_view name, const tensor_slice& slice) {
  std::string key;
  detail::ordered_number(key, 0);
  detail::ordered_string(key, name);
  detail::ordered_number(key, static_cast<std::uint64_t>(slice.rank()));
  for (int d = 0; d < slice.rank(); ++d) {
    detail::ordered_signed_number(key, slice.start(d));
    detail::ordered_signed_number(key, slice.length(d));
  }
  return key;
}

} // namespace loom::tensor_bundle

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

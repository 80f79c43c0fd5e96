// TensorFlow's V2 checkpoint format, the tensor bundle (TF's
// util/tensor_bundle/tensor_bundle.cc), read and written, so that checkpoints move
// between loom and TensorFlow both ways. A checkpoint PREFIX is
//
//   PREFIX.index                   a LevelDB table (core/leveldb_table.hpp): key "" holds
//                                  a BundleHeaderProto (the number of data files, their
//                                  byte order, the format version), and each tensor's
//                                  name its BundleEntryProto (dtype, shape, data file,
//                                  offset, size, masked CRC-32C of the data)
//   PREFIX.data-00000-of-00002     the tensors' bytes, row-major, little-endian: bool one
//   PREFIX.data-00001-of-00002     byte; strings as a varint64 length of each, a u32
//                                  masked CRC-32C of those lengths (each as a u32, or a
//                                  u64 where it does not fit), then their bytes
//
// A partitioned variable is one entry under its full name, with its full dtype and
// shape and one TensorSliceProto per part (and no data), and each part an entry of its
// own under the key TF's checkpoint::EncodeTensorNameSlice makes of the name and the
// slice (OrderedCode: a 0, the name, the rank, each start and length), so a restore
// into any other partitioning reads the parts it overlaps (read_slice).
//
// The protocol buffers (five messages, a dozen fields) are hand-encoded with
// core/protobuf_wire.hpp, as TF serializes them (fields in number order, proto3
// defaults left out): an index loom writes is byte-identical to TF's for the same
// tensors. Each data file, then the index, is written durably (core/durable_file.hpp):
// the index last, so a reader never sees an index naming data that is not there yet.
#pragma once

#include <loom/core/crc32c.hpp>
#include <loom/core/dtype.hpp>
#include <loom/core/durable_file.hpp>
#include <loom/core/error.hpp>
#include <loom/core/leveldb_table.hpp>
#include <loom/core/protobuf_wire.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/tensor.hpp>
#include <loom/core/tensor_slice.hpp>
#include <loom/core/tfrecord.hpp>

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::tensor_bundle {

// TF's DataType numbers (types.proto) of loom's dtypes.
inline int tf_dtype_of(dtype d) {
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
inline std::optional<dtype> loom_dtype_of(int tf_dtype) {
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
// TF's Python name of a DataType ("float16"), for listings and errors.
inline std::string tf_dtype_name(int tf_dtype) {
  static constexpr const char* names[] = {
      "invalid",   "float32", "float64",    "int32",   "uint8",    "int16",   "int8",     "string",
      "complex64", "int64",   "bool",       "qint8",   "quint8",   "qint32",  "bfloat16", "qint16",
      "quint16",   "uint16",  "complex128", "float16", "resource", "variant", "uint32",   "uint64"};
  if (tf_dtype >= 0 && tf_dtype < static_cast<int>(std::size(names)))
    return names[tf_dtype];
  return "DataType " + std::to_string(tf_dtype);
}

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

inline void ordered_number(std::string& out, std::uint64_t v) {
  // A length byte, then the value big-endian without leading zero bytes.
  unsigned char buf[8];
  int n = 0;
  for (; v > 0; v >>= 8)
    buf[n++] = static_cast<unsigned char>(v & 0xff);
  out.push_back(static_cast<char>(n));
  while (n > 0)
    out.push_back(static_cast<char>(buf[--n]));
}
inline void ordered_string(std::string& out, std::string_view s) {
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
// A signed number in n bytes, n the fewest whose 7n - 1 bits hold it: its two's
// complement big-endian (sign-extended), with its first n bits flipped (past 8 bytes they
// reach into the second byte), so that they read as n ones for a number >= 0 and n zeros
// for a negative one: the encodings sort as the numbers do.
inline void ordered_signed_number(std::string& out, std::int64_t v) {
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

// -- the protocol buffers --

inline std::string encode_shape(const loom::shape& s) {
  protobuf::writer w;
  for (std::int64_t d : s.dims()) {
    protobuf::writer dim;
    if (d != 0)
      dim.int64(1, d);
    w.message(2, dim);
  }
  return std::move(w).bytes();
}

inline std::string encode_slice(const tensor_slice& s) {
  protobuf::writer w;
  for (int d = 0; d < s.rank(); ++d) {
    protobuf::writer extent;
    if (!s.whole_at(d)) {
      if (s.start(d) != 0)
        extent.int64(1, s.start(d));
      extent.int64(2, s.length(d)); // in a oneof: written even where it is 0
    }
    w.message(1, extent);
  }
  return std::move(w).bytes();
}

inline std::string encode_entry(const entry& e) {
  protobuf::writer w;
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

inline std::string encode_header(int num_shards) {
  protobuf::writer version;
  version.varint(1, static_cast<std::uint64_t>(format_version)); // producer; min_consumer 0
  protobuf::writer w;
  w.varint(1, static_cast<std::uint64_t>(num_shards)); // endianness LITTLE: the default
  w.message(3, version);
  return std::move(w).bytes();
}

struct header {
  int num_shards = 0;
  bool big_endian = false;
  int producer = 0;
  int min_consumer = 0;
  std::vector<int> bad_consumers;
};

inline header decode_header(std::string_view bytes, const std::string& what) {
  header h;
  protobuf::reader r(bytes, what + "'s header (BundleHeaderProto)");
  while (!r.done()) {
    const protobuf::field f = r.next();
    if (f.number == 1 && f.type == protobuf::wire_type::varint)
      h.num_shards = static_cast<int>(f.as_int64());
    else if (f.number == 2 && f.type == protobuf::wire_type::varint)
      h.big_endian = f.number_value == 1;
    else if (f.number == 3 && f.type == protobuf::wire_type::length_delimited) {
      protobuf::reader v(f.bytes, what + "'s format version (VersionDef)");
      while (!v.done()) {
        const protobuf::field g = v.next();
        if (g.type != protobuf::wire_type::varint)
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

inline loom::shape decode_shape(std::string_view bytes, const std::string& what) {
  std::vector<std::int64_t> dims;
  protobuf::reader r(bytes, what + "'s shape (TensorShapeProto)");
  while (!r.done()) {
    const protobuf::field f = r.next();
    if (f.number == 3 && f.type == protobuf::wire_type::varint && f.number_value != 0)
      throw data_loss_error(what + " has a shape of unknown rank");
    if (f.number != 2 || f.type != protobuf::wire_type::length_delimited)
      continue;
    std::int64_t size = 0;
    protobuf::reader d(f.bytes, what + "'s shape (TensorShapeProto.Dim)");
    while (!d.done()) {
      const protobuf::field g = d.next();
      if (g.number == 1 && g.type == protobuf::wire_type::varint)
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

inline tensor_slice decode_slice(std::string_view bytes, const std::string& what) {
  std::vector<std::int64_t> starts, lengths;
  protobuf::reader r(bytes, what + "'s slice (TensorSliceProto)");
  while (!r.done()) {
    const protobuf::field f = r.next();
    if (f.number != 1 || f.type != protobuf::wire_type::length_delimited)
      continue;
    std::int64_t start = 0, length = tensor_slice::whole;
    protobuf::reader x(f.bytes, what + "'s slice extent");
    while (!x.done()) {
      const protobuf::field g = x.next();
      if (g.number == 1 && g.type == protobuf::wire_type::varint)
        start = g.as_int64();
      else if (g.number == 2 && g.type == protobuf::wire_type::varint)
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

inline entry decode_entry(std::string key, std::string_view bytes, const std::string& what) {
  entry e;
  e.key = std::move(key);
  protobuf::reader r(bytes, what);
  while (!r.done()) {
    const protobuf::field f = r.next();
    using wt = protobuf::wire_type;
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

// -- tensor data --

inline std::size_t element_bytes(dtype d) {
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

inline void put_le32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<char>(v >> (8 * i) & 0xff));
}

// A string tensor's bytes in the data file and their CRC-32C (unmasked).
inline std::pair<std::string, std::uint32_t> encode_strings(std::span<const std::string> strings) {
  std::string out;
  std::uint32_t crc = 0;
  for (const std::string& s : strings) {
    leveldb_table::put_varint64(out, s.size());
    std::string length; // as TF checksums it: a u32 where it fits, else a u64
    if (s.size() <= 0xffffffffu) {
      put_le32(length, static_cast<std::uint32_t>(s.size()));
    } else {
      put_le32(length, static_cast<std::uint32_t>(s.size()));
      put_le32(length, static_cast<std::uint32_t>(static_cast<std::uint64_t>(s.size()) >> 32));
    }
    crc = crc32c::extend(crc, length);
  }
  std::string masked;
  put_le32(masked, tfrecord::mask(crc));
  out += masked;
  crc = crc32c::extend(crc, masked);
  for (const std::string& s : strings) {
    out += s;
    crc = crc32c::extend(crc, s);
  }
  return {std::move(out), crc};
}

// A writer's check that a new part of partitioned tensor `full` overlaps none of its
// parts so far (a reader could not tell which to restore).
inline void check_no_overlap(const entry& full, const tensor_slice& part,
                             const std::string& prefix) {
  for (const tensor_slice& have : full.slices)
    if (have.intersect(part, full.shape))
      throw invalid_argument_error("checkpoint " + prefix + ": tensor '" + full.key +
                                   "' has parts " + have.to_string() + " and " + part.to_string() +
                                   ", which overlap");
}

// Levenshtein distance, for "did you mean" lists.
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
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

} // namespace detail

// The index key of part `slice` of the partitioned tensor `name` (TF's
// checkpoint::EncodeTensorNameSlice). It begins with a 0 byte, which no name does.
inline std::string slice_key(std::string_view name, const tensor_slice& slice) {
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

// -- reading ------------------------------------------------------------------------

// Opens a checkpoint (TF's BundleReader, tf.train.load_checkpoint): reads and checks
// its index (every block's checksum, every entry's fields, every part of a partitioned
// tensor), and reads tensors from its data files, each checked against its CRC-32C.
// A truncated or corrupt file is a data_loss_error naming the file and, where one is
// concerned, the tensor.
class reader {
public:
  explicit reader(std::string prefix) : prefix_(std::move(prefix)) {
    const std::string path = index_path(prefix_);
    const std::string bytes = read_file(path);
    std::vector<leveldb_table::entry> table = leveldb_table::read_table(bytes, path);
    if (table.empty() || !table.front().key.empty())
      throw data_loss_error(path + " has no header entry (key \"\"): not a checkpoint index");
    const detail::header h = detail::decode_header(table.front().value, path);
    if (h.num_shards < 1)
      throw data_loss_error(path + " declares " + std::to_string(h.num_shards) + " data files");
    if (h.min_consumer > format_version || std::find(h.bad_consumers.begin(), h.bad_consumers.end(),
                                                     format_version) != h.bad_consumers.end())
      throw unimplemented_error(path + " needs a reader of checkpoint format version " +
                                std::to_string(h.min_consumer) + " or later; loom reads version " +
                                std::to_string(format_version));
    if (h.big_endian || std::endian::native != std::endian::little)
      throw unimplemented_error(path + ": loom reads TF checkpoints of little-endian hosts on "
                                       "little-endian hosts only");
    num_shards_ = h.num_shards;
    for (std::size_t i = 1; i < table.size(); ++i) {
      const std::string what = path + ": the entry of " + describe_key(table[i].key);
      entry e = detail::decode_entry(std::move(table[i].key), table[i].value, what);
      check_entry(e, what);
      by_key_.emplace(e.key, all_.size());
      all_.push_back(std::move(e));
    }
    for (std::size_t i = 0; i < all_.size(); ++i) {
      if (is_slice_key(all_[i].key))
        continue;
      check_parts(all_[i]);
      names_.push_back(i);
    }
  }

  const std::string& prefix() const noexcept { return prefix_; }
  int num_shards() const noexcept { return num_shards_; }

  // The tensors by name, in name order: whole ones and partitioned ones (with their
  // slices), not the parts' own entries.
  std::vector<const entry*> entries() const {
    std::vector<const entry*> out;
    for (std::size_t i : names_)
      out.push_back(&all_[i]);
    return out;
  }
  const entry* find(std::string_view name) const {
    if (is_slice_key(name))
      return nullptr;
    auto it = by_key_.find(name);
    return it == by_key_.end() ? nullptr : &all_[it->second];
  }
  bool has_tensor(std::string_view name) const { return find(name) != nullptr; }
  // The entry of part `slice` of partitioned tensor `name` (its data file and offset).
  const entry* find_part(std::string_view name, const tensor_slice& slice) const {
    auto it = by_key_.find(slice_key(name, slice));
    return it == by_key_.end() ? nullptr : &all_[it->second];
  }

  // The tensor's whole value (a partitioned one assembled from its parts).
  any_tensor read_tensor(std::string_view name) const {
    const entry& e = lookup(name);
    return read_slice(name, tensor_slice::full(e.shape.rank()));
  }

  // The tensor, checked against what the caller restores it into: a dtype or shape
  // that differs is an invalid_argument_error naming both.
  any_tensor read_tensor(std::string_view name, dtype type, const loom::shape& shape) const {
    const entry& e = lookup(name);
    if (e.tf_dtype != tf_dtype_of(type) || e.shape != shape)
      throw invalid_argument_error("checkpoint " + prefix_ + ": tensor '" + std::string(name) +
                                   "' is " + e.dtype_name() + e.shape.to_string() +
                                   ", restored into " + std::string(to_string(type)) +
                                   shape.to_string());
    return read_tensor(name);
  }

  // Part `slice` of the tensor `name`, from whichever of its stored parts overlap it
  // (a partitioned tensor restored into another partitioning; a whole tensor's rows).
  any_tensor read_slice(std::string_view name, const tensor_slice& slice) const {
    const entry& e = lookup(name);
    const std::string what = "checkpoint " + prefix_ + ": tensor '" + std::string(name) + "'";
    const auto type = e.type();
    if (!type)
      throw unimplemented_error(what + " is " + e.dtype_name() + " (TF DataType " +
                                std::to_string(e.tf_dtype) + "), which loom has no dtype for");
    loom::shape shape;
    try {
      shape = slice.shape_in(e.shape);
    } catch (const invalid_argument_error& err) {
      throw invalid_argument_error(what + " of shape " + e.shape.to_string() + ": " +
                                   err.message());
    }
    if (!e.partitioned() && slice.covers(e.shape))
      return read_data(e, name);
    // A part read as it was saved (a variable restored into its own partitioning):
    // straight into its tensor, no copy.
    if (const entry* part = e.partitioned() ? find_part(name, slice) : nullptr)
      return read_data(*part, name);
    any_tensor out(*type, shape);
    std::int64_t copied = 0;
    if (!e.partitioned()) {
      copied = copy_common_elements(read_data(e, name), tensor_slice::full(e.shape.rank()), out,
                                    slice, e.shape);
    } else {
      for (const tensor_slice& part : e.slices) {
        if (!part.intersect(slice, e.shape))
          continue;
        const entry& stored = all_[by_key_.find(slice_key(name, part))->second];
        copied += copy_common_elements(read_data(stored, name), part, out, slice, e.shape);
      }
    }
    if (copied != shape.num_elements())
      throw data_loss_error(what + ": its parts hold " + std::to_string(copied) + " of the " +
                            std::to_string(shape.num_elements()) + " elements of slice " +
                            slice.to_string() + " (a part is missing)");
    return out;
  }

  // Up to n names of the checkpoint nearest to `name` (by edit distance).
  std::vector<std::string> nearest_names(std::string_view name, std::size_t n = 3) const {
    std::vector<std::pair<std::size_t, std::string>> scored;
    for (std::size_t i : names_)
      scored.emplace_back(detail::edit_distance(name, all_[i].key), all_[i].key);
    std::sort(scored.begin(), scored.end());
    std::vector<std::string> out;
    for (std::size_t i = 0; i < scored.size() && i < n; ++i)
      out.push_back(scored[i].second);
    return out;
  }

private:
  static bool is_slice_key(std::string_view key) { return !key.empty() && key.front() == '\0'; }
  static std::string describe_key(std::string_view key) {
    if (!is_slice_key(key))
      return "tensor '" + std::string(key) + "'";
    std::string printable; // a part's key: its name, between binary bytes
    for (char c : key)
      if (c >= 0x20 && c < 0x7f)
        printable += c;
    return "a part of '" + printable + "'";
  }

  static std::string read_file(const std::string& path) {
    using namespace loom::detail::ckpt;
    fd_handle fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd)
      throw_io("checkpoint index " + path + ": cannot open", errno);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0)
      throw_io("checkpoint index " + path + ": cannot stat", errno);
    std::string bytes(static_cast<std::size_t>(st.st_size), '\0');
    if (!pread_all(fd.get(), bytes.data(), bytes.size(), 0, path))
      throw data_loss_error("checkpoint index " + path + " shrank while it was read");
    return bytes;
  }

  const entry& lookup(std::string_view name) const {
    if (const entry* e = find(name))
      return *e;
    std::string near;
    for (const std::string& n : nearest_names(name))
      near += (near.empty() ? "" : ", ") + ("'" + n + "'");
    throw not_found_error(
        "checkpoint " + prefix_ + " has no tensor '" + std::string(name) + "'" +
        (near.empty() ? std::string(" (it holds no tensors)") : " (nearest: " + near + ")"));
  }

  void check_entry(const entry& e, const std::string& what) const {
    if (e.partitioned()) {
      for (const tensor_slice& s : e.slices)
        if (s.rank() != e.shape.rank())
          throw data_loss_error(what + ": part " + s.to_string() + " of shape " +
                                e.shape.to_string() + " has another rank");
      return;
    }
    if (e.shard_id < 0 || e.shard_id >= num_shards_)
      throw data_loss_error(what + " names data file " + std::to_string(e.shard_id) + " of " +
                            std::to_string(num_shards_));
    const auto type = e.type();
    if (!type)
      return; // listed, and an error when read
    const auto n = static_cast<std::uint64_t>(e.shape.num_elements());
    // A string tensor: at least a byte of length per string and the lengths' checksum
    // (which TF writes even for no strings, and leaves out only for no data at all).
    const bool fits = *type == dtype::string ? (e.size == 0 && n == 0) || e.size >= n + 4
                                             : e.size / detail::element_bytes(*type) == n &&
                                                   e.size % detail::element_bytes(*type) == 0;
    if (!fits)
      throw data_loss_error(what + " of " + e.dtype_name() + e.shape.to_string() + " has " +
                            std::to_string(e.size) + " bytes of data");
  }

  // Every part of a partitioned tensor has its entry, of the part's shape and the
  // tensor's dtype, and no two parts overlap.
  void check_parts(const entry& e) const {
    const std::string what = "checkpoint " + index_path(prefix_) + ": tensor '" + e.key + "'";
    for (std::size_t i = 0; i < e.slices.size(); ++i) {
      const tensor_slice& s = e.slices[i];
      loom::shape part_shape;
      try {
        part_shape = s.shape_in(e.shape);
      } catch (const invalid_argument_error& err) {
        throw data_loss_error(what + ": " + err.message());
      }
      auto it = by_key_.find(slice_key(e.key, s));
      if (it == by_key_.end())
        throw data_loss_error(what + " lists part " + s.to_string() +
                              ", which has no entry: the index is corrupt");
      const entry& part = all_[it->second];
      if (part.tf_dtype != e.tf_dtype || part.shape != part_shape || part.partitioned())
        throw data_loss_error(what + ": part " + s.to_string() + " is " + part.dtype_name() +
                              part.shape.to_string() + ", not " + e.dtype_name() +
                              part_shape.to_string());
      for (std::size_t j = 0; j < i; ++j)
        if (s.intersect(e.slices[j], e.shape))
          throw data_loss_error(what + ": parts " + e.slices[j].to_string() + " and " +
                                s.to_string() + " overlap");
    }
  }

  struct data_file {
    loom::detail::ckpt::fd_handle fd;
    std::uint64_t size = 0;
  };
  // The data file of `shard`, opened on first use (by whichever thread reads first).
  std::shared_ptr<const data_file> data(std::int32_t shard) const {
    std::lock_guard lock(data_mutex_);
    auto& file = data_[shard];
    if (!file) {
      const std::string path = data_path(prefix_, shard, num_shards_);
      auto opened = std::make_shared<data_file>();
      opened->fd = loom::detail::ckpt::fd_handle(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
      struct stat st {};
      if (!opened->fd || ::fstat(opened->fd.get(), &st) != 0)
        loom::detail::ckpt::throw_io("checkpoint " + prefix_ + ": data file " + path, errno);
      opened->size = static_cast<std::uint64_t>(st.st_size);
      file = std::move(opened);
    }
    return file;
  }

  // The bytes of a stored (not partitioned) entry as a tensor, checked.
  any_tensor read_data(const entry& e, std::string_view name) const {
    const std::string path = data_path(prefix_, e.shard_id, num_shards_);
    const std::string what =
        path + ": tensor '" + std::string(name) + "'" + (e.key == name ? "" : " (a part)");
    const std::shared_ptr<const data_file> file = data(e.shard_id);
    // Checked before anything is allocated: a corrupt size is an error, not a huge buffer.
    if (e.offset > file->size || e.size > file->size - e.offset)
      throw data_loss_error(what + " needs bytes [" + std::to_string(e.offset) + ", " +
                            std::to_string(e.offset + e.size) + ") of the file, which has " +
                            std::to_string(file->size) + ": it is truncated");
    auto read_into = [&](void* into) {
      if (!loom::detail::ckpt::pread_all(file->fd.get(), into, static_cast<std::size_t>(e.size),
                                         e.offset, path))
        throw data_loss_error(what + ": the file shrank while it was read");
    };
    const dtype type = *e.type();
    any_tensor t(type, e.shape);
    if (type != dtype::string) { // straight into the tensor: sizes were checked on open
      read_into(t.raw_data());
      check_crc(e, crc32c::extend(0, t.raw_data(), e.size), what);
      if (type == dtype::boolean)
        for (unsigned char b : std::span(static_cast<const unsigned char*>(t.raw_data()), e.size))
          if (b > 1)
            throw data_loss_error(what + " holds a bool byte " + std::to_string(b) +
                                  " that is neither 0 nor 1");
      return t;
    }
    std::string bytes(static_cast<std::size_t>(e.size), '\0');
    read_into(bytes.data());
    read_strings(bytes, t.flat<std::string>(), e, what);
    return t;
  }

  void check_crc(const entry& e, std::uint32_t computed, const std::string& what) const {
    if (tfrecord::unmask(e.masked_crc32c) != computed) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "stored crc32c %08x, computed %08x",
                    tfrecord::unmask(e.masked_crc32c), computed);
      throw data_loss_error(what + " fails its checksum (" + buf + "): the file is corrupt");
    }
  }

  void read_strings(std::string_view bytes, std::span<std::string> out, const entry& e,
                    const std::string& what) const {
    std::string_view rest = bytes;
    std::vector<std::uint64_t> lengths;
    std::uint32_t crc = 0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      const auto n = leveldb_table::get_varint64(rest);
      if (!n)
        throw data_loss_error(what + ": the length of string " + std::to_string(i) +
                              " is malformed");
      std::string length;
      detail::put_le32(length, static_cast<std::uint32_t>(*n));
      if (*n > 0xffffffffu)
        detail::put_le32(length, static_cast<std::uint32_t>(*n >> 32));
      crc = crc32c::extend(crc, length);
      lengths.push_back(*n);
    }
    if (!bytes.empty()) {
      if (rest.size() < 4)
        throw data_loss_error(what + ": its bytes end before the strings' lengths' checksum");
      const std::string_view masked = rest.substr(0, 4);
      if (tfrecord::unmask(leveldb_table::detail::get_fixed32(masked)) != crc)
        throw data_loss_error(what + ": the checksum of its strings' lengths does not match: "
                                     "the file is corrupt");
      crc = crc32c::extend(crc, masked);
      rest.remove_prefix(4);
    }
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (lengths[i] > rest.size())
        throw data_loss_error(what + ": string " + std::to_string(i) + " of " +
                              std::to_string(lengths[i]) + " bytes runs past its data");
      out[i].assign(rest.substr(0, static_cast<std::size_t>(lengths[i])));
      rest.remove_prefix(static_cast<std::size_t>(lengths[i]));
      crc = crc32c::extend(crc, out[i]);
    }
    check_crc(e, crc, what);
    if (!rest.empty())
      throw data_loss_error(what + " has " + std::to_string(rest.size()) +
                            " bytes after its last string");
  }

  std::string prefix_;
  int num_shards_ = 0;
  std::vector<entry> all_;                                 // in key order
  std::map<std::string, std::size_t, std::less<>> by_key_; // into all_
  std::vector<std::size_t> names_;                         // all_ minus the parts
  mutable std::mutex data_mutex_;
  mutable std::map<std::int32_t, std::shared_ptr<const data_file>> data_;
};

// -- writing ------------------------------------------------------------------------

// One tensor to save: a whole one, or part `slice` of a partitioned tensor of shape
// `full_shape` (a variable's part, as TF's save_slice_info says).
struct tensor_to_save {
  std::string name;
  any_tensor value;
  std::optional<tensor_slice> slice;
  loom::shape full_shape;
};

// Writes data file `shard` of `num_shards` of checkpoint `prefix`, durably, asking
// tensor_at(i) for each of `count` tensors in turn (so no more of them are in memory
// at once than the caller holds); returns their index entries, for write_index.
inline std::vector<entry> write_shard(const std::string& prefix, int shard, int num_shards,
                                      std::size_t count,
                                      const std::function<tensor_to_save(std::size_t)>& tensor_at) {
  if (shard < 0 || shard >= num_shards)
    throw invalid_argument_error("checkpoint " + prefix + ": data file " + std::to_string(shard) +
                                 " of " + std::to_string(num_shards));
  if constexpr (std::endian::native != std::endian::little)
    throw unimplemented_error("checkpoint " + prefix +
                              ": loom writes TF checkpoints on little-endian hosts only");
  std::vector<entry> entries;
  std::map<std::string, std::size_t, std::less<>> full_entries; // partitioned, by name
  const std::string path = data_path(prefix, shard, num_shards);
  loom::detail::ckpt::write_atomically(path, [&](auto&& out) {
    std::uint64_t offset = 0;
    for (std::size_t i = 0; i < count; ++i) {
      tensor_to_save t = tensor_at(i);
      const std::string what = "checkpoint " + prefix + ": tensor '" + t.name + "'";
      if (t.name.empty() || t.name.front() == '\0')
        throw invalid_argument_error("checkpoint " + prefix + ": tensor " + std::to_string(i) +
                                     " has an empty name or one that begins with a 0 byte");
      if (t.value.empty())
        throw invalid_argument_error(what + " has no value");
      std::string key = t.name;
      // A part that is the whole tensor is saved as the tensor (as TF does).
      if (t.slice && !t.slice->covers(t.full_shape)) {
        const loom::shape part_shape = t.slice->shape_in(t.full_shape);
        if (part_shape != t.value.shape())
          throw invalid_argument_error(what + ": part " + t.slice->to_string() + " of " +
                                       t.full_shape.to_string() + " is " + part_shape.to_string() +
                                       ", its value " + t.value.describe());
        auto [it, fresh] = full_entries.emplace(t.name, entries.size());
        if (fresh) {
          entry full;
          full.key = t.name;
          full.tf_dtype = tf_dtype_of(t.value.type());
          full.shape = t.full_shape;
          entries.push_back(std::move(full));
        }
        entry& full = entries[it->second];
        if (full.tf_dtype != tf_dtype_of(t.value.type()) || full.shape != t.full_shape)
          throw invalid_argument_error(what + ": part " + t.slice->to_string() + " is " +
                                       t.value.describe() + " of " + t.full_shape.to_string() +
                                       ", another part of " + full.dtype_name() +
                                       full.shape.to_string());
        detail::check_no_overlap(full, *t.slice, prefix);
        full.slices.push_back(*t.slice);
        key = slice_key(t.name, *t.slice);
      }
      entry e;
      e.key = std::move(key);
      e.tf_dtype = tf_dtype_of(t.value.type());
      e.shape = t.value.shape();
      e.shard_id = shard;
      e.offset = offset;
      std::uint32_t crc = 0;
      if (t.value.type() == dtype::string) {
        auto [bytes, string_crc] = detail::encode_strings(t.value.flat<std::string>());
        out(bytes.data(), bytes.size());
        e.size = bytes.size();
        crc = string_crc;
      } else {
        e.size = t.value.byte_size();
        crc = crc32c::extend(0, t.value.raw_data(), e.size);
        out(t.value.raw_data(), e.size);
      }
      e.masked_crc32c = tfrecord::mask(crc);
      offset += e.size;
      entries.push_back(std::move(e));
    }
  });
  return entries;
}

// Writes checkpoint `prefix`'s index, durably and last, from the entries of all its
// `num_shards` data files (write_shard's, in shard order): a partitioned tensor's
// parts from several files are merged into one entry (TF's MergeBundles).
inline void write_index(const std::string& prefix, int num_shards, std::vector<entry> entries) {
  std::map<std::string, entry> by_key;
  for (entry& e : entries) {
    if (e.shard_id < 0 || e.shard_id >= num_shards)
      throw invalid_argument_error("checkpoint " + prefix + ": tensor '" + e.key +
                                   "' is in data file " + std::to_string(e.shard_id) + " of " +
                                   std::to_string(num_shards));
    auto it = by_key.find(e.key);
    if (it == by_key.end()) {
      by_key.emplace(e.key, std::move(e));
      continue;
    }
    entry& have = it->second;
    if (!have.partitioned() || !e.partitioned())
      throw invalid_argument_error("checkpoint " + prefix + ": tensor '" + e.key +
                                   "' is saved twice");
    if (have.tf_dtype != e.tf_dtype || have.shape != e.shape)
      throw invalid_argument_error("checkpoint " + prefix + ": tensor '" + e.key +
                                   "' has parts of " + have.dtype_name() + have.shape.to_string() +
                                   " and of " + e.dtype_name() + e.shape.to_string());
    for (const tensor_slice& part : e.slices) {
      detail::check_no_overlap(have, part, prefix);
      have.slices.push_back(part);
    }
  }
  leveldb_table::table_builder table;
  table.add("", detail::encode_header(num_shards));
  for (const auto& [key, e] : by_key)
    table.add(key, detail::encode_entry(e));
  const std::string bytes = table.finish();
  loom::detail::ckpt::write_atomically(index_path(prefix),
                                       [&](auto&& out) { out(bytes.data(), bytes.size()); });
}

// A checkpoint of one data file: its tensors, then its index.
inline void write(const std::string& prefix, const std::vector<tensor_to_save>& tensors) {
  write_index(prefix, 1,
              write_shard(prefix, 0, 1, tensors.size(), [&](std::size_t i) { return tensors[i]; }));
}

} // namespace loom::tensor_bundle

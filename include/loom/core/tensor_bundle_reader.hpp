// Reading TensorFlow's V2 checkpoints (core/tensor_bundle.hpp): TF's BundleReader.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/crc32c.hpp>
#include <loom/core/dtype.hpp>
#include <loom/core/durable_file.hpp>
#include <loom/core/error.hpp>
#include <loom/core/leveldb_table.hpp>
#include <loom/core/protobuf_wire.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/tensor.hpp>
#include <loom/core/tensor_bundle_format.hpp>
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
// -- reading ------------------------------------------------------------------------

// Opens a checkpoint (TF's BundleReader, tf.train.load_checkpoint): reads and checks
// its index (every block's checksum, every entry's fields, every part of a partitioned
// tensor), and reads tensors from its data files, each checked against its CRC-32C.
// A truncated or corrupt file is a data_loss_error naming the file and, where one is
// concerned, the tensor.
class reader {
public:
  explicit reader(std::string prefix);

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
  const entry* find(std::string_view name) const;
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
  any_tensor read_tensor(std::string_view name, dtype type, const loom::shape& shape) const;

  // Part `slice` of the tensor `name`, from whichever of its stored parts overlap it
  // (a partitioned tensor restored into another partitioning; a whole tensor's rows).
  any_tensor read_slice(std::string_view name, const tensor_slice& slice) const;

  // Up to n names of the checkpoint nearest to `name` (by edit distance).
  std::vector<std::string> nearest_names(std::string_view name, std::size_t n = 3) const;

private:
  static bool is_slice_key(std::string_view key) { return !key.empty() && key.front() == '\0'; }
  static std::string describe_key(std::string_view key);

  static std::string read_file(const std::string& path);

  const entry& lookup(std::string_view name) const;

  void check_entry(const entry& e, const std::string& what) const;

  // Every part of a partitioned tensor has its entry, of the part's shape and the
  // tensor's dtype, and no two parts overlap.
  void check_parts(const entry& e) const;

  struct data_file {
    loom::detail::ckpt::fd_handle fd;
    std::uint64_t size = 0;
  };
  // The data file of `shard`, opened on first use (by whichever thread reads first).
  std::shared_ptr<const data_file> data(std::int32_t shard) const;

  // The bytes of a stored (not partitioned) entry as a tensor, checked.
  any_tensor read_data(const entry& e, std::string_view name) const;

  void check_crc(const entry& e, std::uint32_t computed, const std::string& what) const;

  void read_strings(std::string_view bytes, std::span<std::string> out, const entry& e,
                    const std::string& what) const;

  std::string prefix_;
  int num_shards_ = 0;
  std::vector<entry> all_;                                 // in key order
  std::map<std::string, std::size_t, std::less<>> by_key_; // into all_
  std::vector<std::size_t> names_;                         // all_ minus the parts
  mutable std::mutex data_mutex_;
  mutable std::map<std::int32_t, std::shared_ptr<const data_file>> data_;
};

} // namespace loom::tensor_bundle

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::tensor_bundle {

LOOM_COMPILED_ONCE reader::reader(std::string prefix) : prefix_(std::move(prefix)) {
  const std::string path = index_path(prefix_);
  const std::string bytes = read_file(path);
  std::vector<loom::detail::leveldb_table::entry> table =
      loom::detail::leveldb_table::read_table(bytes, path);
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

LOOM_COMPILED_ONCE auto reader::find(std::string_view name) const -> const entry* {
  if (is_slice_key(name))
    return nullptr;
  auto it = by_key_.find(name);
  return it == by_key_.end() ? nullptr : &all_[it->second];
}

LOOM_COMPILED_ONCE auto reader::read_tensor(std::string_view name, dtype type,
                                            const loom::shape& shape) const -> any_tensor {
  const entry& e = lookup(name);
  if (e.tf_dtype != tf_dtype_of(type) || e.shape != shape)
    throw invalid_argument_error("checkpoint " + prefix_ + ": tensor '" + std::string(name) +
                                 "' is " + e.dtype_name() + e.shape.to_string() +
                                 ", restored into " + std::string(to_string(type)) +
                                 shape.to_string());
  return read_tensor(name);
}

LOOM_COMPILED_ONCE auto reader::read_slice(std::string_view name, const tensor_slice& slice) const
    -> any_tensor {
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
    throw invalid_argument_error(what + " of shape " + e.shape.to_string() + ": " + err.message());
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
    copied = loom::detail::copy_common_elements(
        read_data(e, name), tensor_slice::full(e.shape.rank()), out, slice, e.shape);
  } else {
    for (const tensor_slice& part : e.slices) {
      if (!part.intersect(slice, e.shape))
        continue;
      const entry& stored = all_[by_key_.find(slice_key(name, part))->second];
      copied +=
          loom::detail::copy_common_elements(read_data(stored, name), part, out, slice, e.shape);
    }
  }
  if (copied != shape.num_elements())
    throw data_loss_error(what + ": its parts hold " + std::to_string(copied) + " of the " +
                          std::to_string(shape.num_elements()) + " elements of slice " +
                          slice.to_string() + " (a part is missing)");
  return out;
}

LOOM_COMPILED_ONCE auto reader::nearest_names(std::string_view name, std::size_t n) const
    -> std::vector<std::string> {
  std::vector<std::pair<std::size_t, std::string>> scored;
  for (std::size_t i : names_)
    scored.emplace_back(detail::edit_distance(name, all_[i].key), all_[i].key);
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (std::size_t i = 0; i < scored.size() && i < n; ++i)
    out.push_back(scored[i].second);
  return out;
}

LOOM_COMPILED_ONCE std::string reader::describe_key(std::string_view key) {
  if (!is_slice_key(key))
    return "tensor '" + std::string(key) + "'";
  std::string printable; // a part's key: its name, between binary bytes
  for (char c : key)
    if (c >= 0x20 && c < 0x7f)
      printable += c;
  return "a part of '" + printable + "'";
}

LOOM_COMPILED_ONCE std::string reader::read_file(const std::string& path) {
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

LOOM_COMPILED_ONCE auto reader::lookup(std::string_view name) const -> const entry& {
  if (const entry* e = find(name))
    return *e;
  std::string near;
  for (const std::string& n : nearest_names(name))
    near += (near.empty() ? "" : ", ") + ("'" + n + "'");
  throw not_found_error(
      "checkpoint " + prefix_ + " has no tensor '" + std::string(name) + "'" +
      (near.empty() ? std::string(" (it holds no tensors)") : " (nearest: " + near + ")"));
}

LOOM_COMPILED_ONCE void reader::check_entry(const entry& e, const std::string& what) const {
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

LOOM_COMPILED_ONCE void reader::check_parts(const entry& e) const {
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

LOOM_COMPILED_ONCE auto reader::data(std::int32_t shard) const -> std::shared_ptr<const data_file> {
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

LOOM_COMPILED_ONCE auto reader::read_data(const entry& e, std::string_view name) const
    -> any_tensor {
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
    check_crc(e, loom::detail::crc32c::extend(0, t.raw_data(), e.size), what);
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

LOOM_COMPILED_ONCE void reader::check_crc(const entry& e, std::uint32_t computed,
                                          const std::string& what) const {
  if (tfrecord::unmask(e.masked_crc32c) != computed) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "stored crc32c %08x, computed %08x",
                  tfrecord::unmask(e.masked_crc32c), computed);
    throw data_loss_error(what + " fails its checksum (" + buf + "): the file is corrupt");
  }
}

LOOM_COMPILED_ONCE void reader::read_strings(std::string_view bytes, std::span<std::string> out,
                                             const entry& e, const std::string& what) const {
  std::string_view rest = bytes;
  std::vector<std::uint64_t> lengths;
  std::uint32_t crc = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const auto n = loom::detail::leveldb_table::get_varint64(rest);
    if (!n)
      throw data_loss_error(what + ": the length of string " + std::to_string(i) + " is malformed");
    std::string length;
    detail::put_le32(length, static_cast<std::uint32_t>(*n));
    if (*n > 0xffffffffu)
      detail::put_le32(length, static_cast<std::uint32_t>(*n >> 32));
    crc = loom::detail::crc32c::extend(crc, length);
    lengths.push_back(*n);
  }
  if (!bytes.empty()) {
    if (rest.size() < 4)
      throw data_loss_error(what + ": its bytes end before the strings' lengths' checksum");
    const std::string_view masked = rest.substr(0, 4);
    if (tfrecord::unmask(loom::detail::leveldb_table::detail::get_fixed32(masked)) != crc)
      throw data_loss_error(what + ": the checksum of its strings' lengths does not match: "
                                   "the file is corrupt");
    crc = loom::detail::crc32c::extend(crc, masked);
    rest.remove_prefix(4);
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (lengths[i] > rest.size())
      throw data_loss_error(what + ": string " + std::to_string(i) + " of " +
                            std::to_string(lengths[i]) + " bytes runs past its data");
    out[i].assign(rest.substr(0, static_cast<std::size_t>(lengths[i])));
    rest.remove_prefix(static_cast<std::size_t>(lengths[i]));
    crc = loom::detail::crc32c::extend(crc, out[i]);
  }
  check_crc(e, crc, what);
  if (!rest.empty())
    throw data_loss_error(what + " has " + std::to_string(rest.size()) +
                          " bytes after its last string");
}

} // namespace loom::tensor_bundle

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

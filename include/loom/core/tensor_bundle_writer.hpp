// Writing TensorFlow's V2 checkpoints (core/tensor_bundle.hpp): TF's BundleWriter,
// a data file per shard, then the index, last.
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
LOOM_COMPILED_ONCE std::vector<entry>
write_shard(const std::string& prefix, int shard, int num_shards, std::size_t count,
            const std::function<tensor_to_save(std::size_t)>& tensor_at);

// Writes checkpoint `prefix`'s index, durably and last, from the entries of all its
// `num_shards` data files (write_shard's, in shard order): a partitioned tensor's
// parts from several files are merged into one entry (TF's MergeBundles).
LOOM_COMPILED_ONCE void write_index(const std::string& prefix, int num_shards,
                                    std::vector<entry> entries);

// A checkpoint of one data file: its tensors, then its index.
LOOM_COMPILED_ONCE void write(const std::string& prefix,
                              const std::vector<tensor_to_save>& tensors);

} // namespace loom::tensor_bundle

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::tensor_bundle {

LOOM_COMPILED_ONCE std::vector<entry>
write_shard(const std::string& prefix, int shard, int num_shards, std::size_t count,
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
        crc = loom::detail::crc32c::extend(0, t.value.raw_data(), e.size);
        out(t.value.raw_data(), e.size);
      }
      e.masked_crc32c = tfrecord::mask(crc);
      offset += e.size;
      entries.push_back(std::move(e));
    }
  });
  return entries;
}

LOOM_COMPILED_ONCE void write_index(const std::string& prefix, int num_shards,
                                    std::vector<entry> entries) {
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
  loom::detail::leveldb_table::table_builder table;
  table.add("", detail::encode_header(num_shards));
  for (const auto& [key, e] : by_key)
    table.add(key, detail::encode_entry(e));
  const std::string bytes = table.finish();
  loom::detail::ckpt::write_atomically(index_path(prefix),
                                       [&](auto&& out) { out(bytes.data(), bytes.size()); });
}

LOOM_COMPILED_ONCE void write(const std::string& prefix,
                              const std::vector<tensor_to_save>& tensors) {
  write_index(prefix, 1,
              write_shard(prefix, 0, 1, tensors.size(), [&](std::size_t i) { return tensors[i]; }));
}

} // namespace loom::tensor_bundle

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

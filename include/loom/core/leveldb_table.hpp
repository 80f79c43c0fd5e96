// LevelDB's table format (an SSTable), as TensorFlow writes and reads it for a
// checkpoint's index (TF's lib/io/table_builder.cc, block_builder.cc, format.cc):
// a sorted map of byte-string keys to values in one file.
//
//   data block 0 | ... | data block n-1 | metaindex block | index block | footer
//
// A block holds entries with prefix-compressed keys,
//   varint32 shared key bytes, varint32 unshared key bytes, varint32 value bytes,
//   the key's unshared bytes, the value,
// then a u32 offset of every restart point (an entry whose key is stored whole, every
// `restart_interval` entries) and a u32 count of them. Each block is followed by a
// trailer: a byte of compression type (0 none, 1 Snappy) and a u32 masked CRC-32C of
// the stored block bytes and that type byte. The index block maps a key >= every key
// of a data block (and < every key of the next) to that block's handle (varint64
// offset, varint64 size). The footer, 48 bytes, is the metaindex and index handles,
// zero-padded to 40 bytes, then the u64 magic 0xdb4775248b80fb57. Integers are
// little-endian.
//
// The writer makes the bytes TF's TableBuilder makes for the same entries (its block
// size, restart intervals, split points and shortened index keys), so a checkpoint
// index loom writes is byte-identical to TF's. The reader checks every handle, length
// and checksum against the file's bytes: a truncated or corrupt file is a
// data_loss_error naming it, never a read past the end. Snappy (Debian's
// libsnappy-dev) decompresses blocks that were written compressed.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/crc32c.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tfrecord.hpp>

#include <snappy.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::detail::leveldb_table {

enum class compression : std::uint8_t { none = 0, snappy = 1 };

inline constexpr std::uint64_t magic = 0xdb4775248b80fb57ull;
inline constexpr std::size_t block_trailer_bytes = 5; // type byte + masked CRC
inline constexpr std::size_t max_handle_bytes = 20;   // two varint64s
inline constexpr std::size_t footer_bytes = 2 * max_handle_bytes + 8;

// TF's table::Options defaults.
struct options {
  std::size_t block_size = 256 * 1024;
  int restart_interval = 16;
  leveldb_table::compression compression = compression::none;
};

namespace detail {

inline void put_fixed32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<char>(v >> (8 * i) & 0xff));
}
LOOM_COMPILED_ONCE std::uint32_t get_fixed32(std::string_view in);

} // namespace detail

LOOM_COMPILED_ONCE void put_varint64(std::string& out, std::uint64_t v);

// Reads a varint64 from the front of `in`, consuming it; nullopt where the bytes end
// inside it or it runs past 10 bytes.
LOOM_COMPILED_ONCE std::optional<std::uint64_t> get_varint64(std::string_view& in);

// Where a block lies in the file (its stored bytes, without the trailer).
struct block_handle {
  std::uint64_t offset = 0;
  std::uint64_t size = 0;

  void encode_to(std::string& out) const {
    put_varint64(out, offset);
    put_varint64(out, size);
  }
};

// -- writing ------------------------------------------------------------------------

// One block's bytes, built entry by entry (keys in increasing order).
class block_builder {
public:
  explicit block_builder(int restart_interval) : restart_interval_(restart_interval) {
    restarts_.push_back(0);
  }

  bool empty() const noexcept { return bytes_.empty(); }
  // The block's size once finished (TF's CurrentSizeEstimate: it decides the splits).
  std::size_t size_estimate() const noexcept { return bytes_.size() + 4 * restarts_.size() + 4; }

  void add(std::string_view key, std::string_view value);

  // The block's bytes; the builder is empty again after.
  std::string finish();

private:
  int restart_interval_;
  std::string bytes_;
  std::vector<std::uint32_t> restarts_;
  int since_restart_ = 0;
  std::string last_key_;
};

// Builds a table's bytes from entries added in strictly increasing key order (bytes
// compared unsigned, as LevelDB's bytewise comparator does).
class table_builder {
public:
  explicit table_builder(options o = {}) : options_(o), data_(o.restart_interval), index_(1) {}

  void add(std::string_view key, std::string_view value);

  // The whole file's bytes; the builder is spent after.
  std::string finish();

private:
  // The shortest key k with start <= k < limit, where one byte of start can be raised.
  static void shorten_to_separator(std::string& start, std::string_view limit);
  // The shortest key >= key: its first byte below 0xff raised, the rest cut.
  static void shorten_to_successor(std::string& key);
  void add_index_entry() {
    std::string handle;
    pending_handle_.encode_to(handle);
    index_.add(last_key_, handle);
    pending_index_entry_ = false;
  }
  void flush() {
    if (data_.empty())
      return;
    pending_handle_ = write_block(data_);
    pending_index_entry_ = true;
  }
  block_handle write_block(block_builder& block);

  options options_;
  block_builder data_;
  block_builder index_;
  std::string file_;
  std::string last_key_;
  std::size_t entries_ = 0;
  bool pending_index_entry_ = false;
  block_handle pending_handle_;
};

// -- reading ------------------------------------------------------------------------

struct entry {
  std::string key;
  std::string value;
};

namespace detail {

// Reads and checks the block at `h` of `file` (trailer, checksum, decompression).
LOOM_COMPILED_ONCE std::string read_block(std::string_view file, const block_handle& h,
                                          const std::string& what, const std::string& which);

// The entries of a block's bytes, appended to `out`.
LOOM_COMPILED_ONCE void parse_block(std::string_view block, const std::string& where,
                                    std::vector<entry>& out);

LOOM_COMPILED_ONCE block_handle decode_handle(std::string_view& in, const std::string& where);

} // namespace detail

// Every entry of a table file's bytes, in key order. `what` (the file's name) is in
// the errors.
LOOM_COMPILED_ONCE std::vector<entry> read_table(std::string_view file, const std::string& what);

} // namespace loom::detail::leveldb_table

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail::leveldb_table::detail {

LOOM_COMPILED_ONCE std::uint32_t get_fixed32(std::string_view in) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < 4; ++i)
    v |= std::uint32_t{static_cast<std::uint8_t>(in[i])} << (8 * i);
  return v;
}
} // namespace loom::detail::leveldb_table::detail

namespace loom::detail::leveldb_table {

LOOM_COMPILED_ONCE void put_varint64(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

LOOM_COMPILED_ONCE std::optional<std::uint64_t> get_varint64(std::string_view& in) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < in.size() && i < 10; ++i) {
    const auto b = static_cast<std::uint8_t>(in[i]);
    v |= std::uint64_t{b & 0x7fu} << (7 * i);
    if (!(b & 0x80)) {
      in.remove_prefix(i + 1);
      return v;
    }
  }
  return std::nullopt;
}

LOOM_COMPILED_ONCE void block_builder::add(std::string_view key, std::string_view value) {
  std::size_t shared = 0;
  if (since_restart_ < restart_interval_) {
    const std::size_t n = std::min(last_key_.size(), key.size());
    while (shared < n && last_key_[shared] == key[shared])
      ++shared;
  } else {
    restarts_.push_back(static_cast<std::uint32_t>(bytes_.size()));
    since_restart_ = 0;
  }
  put_varint64(bytes_, shared);
  put_varint64(bytes_, key.size() - shared);
  put_varint64(bytes_, value.size());
  bytes_.append(key.substr(shared));
  bytes_.append(value);
  last_key_.assign(key);
  ++since_restart_;
}

LOOM_COMPILED_ONCE std::string block_builder::finish() {
  std::string out = std::move(bytes_);
  for (std::uint32_t r : restarts_)
    detail::put_fixed32(out, r);
  detail::put_fixed32(out, static_cast<std::uint32_t>(restarts_.size()));
  bytes_.clear();
  restarts_.assign(1, 0);
  since_restart_ = 0;
  last_key_.clear();
  return out;
}

LOOM_COMPILED_ONCE void table_builder::add(std::string_view key, std::string_view value) {
  if (entries_ > 0 && !(std::string_view(last_key_) < key))
    throw invalid_argument_error("leveldb table: key '" + std::string(key) + "' added after '" +
                                 last_key_ + "' (keys must be strictly increasing)");
  // An entry of twice the block size or more gets a block of its own.
  if (entries_ > 0 && key.size() + value.size() >= 2 * options_.block_size)
    flush();
  if (pending_index_entry_) {
    shorten_to_separator(last_key_, key);
    add_index_entry();
  }
  last_key_.assign(key);
  ++entries_;
  data_.add(key, value);
  if (data_.size_estimate() >= options_.block_size)
    flush();
}

LOOM_COMPILED_ONCE std::string table_builder::finish() {
  flush();
  block_builder empty_metaindex(options_.restart_interval);
  const block_handle metaindex = write_block(empty_metaindex);
  if (pending_index_entry_) {
    shorten_to_successor(last_key_);
    add_index_entry();
  }
  const block_handle index = write_block(index_);
  std::string footer;
  metaindex.encode_to(footer);
  index.encode_to(footer);
  footer.resize(2 * max_handle_bytes, '\0');
  detail::put_fixed32(footer, static_cast<std::uint32_t>(magic & 0xffffffffu));
  detail::put_fixed32(footer, static_cast<std::uint32_t>(magic >> 32));
  file_ += footer;
  return std::move(file_);
}

LOOM_COMPILED_ONCE void table_builder::shorten_to_separator(std::string& start,
                                                            std::string_view limit) {
  const std::size_t n = std::min(start.size(), limit.size());
  std::size_t diff = 0;
  while (diff < n && start[diff] == limit[diff])
    ++diff;
  if (diff >= n)
    return; // one is a prefix of the other
  const auto byte = static_cast<std::uint8_t>(start[diff]);
  if (byte < 0xff && byte + 1 < static_cast<std::uint8_t>(limit[diff])) {
    start[diff] = static_cast<char>(byte + 1);
    start.resize(diff + 1);
  }
}

LOOM_COMPILED_ONCE void table_builder::shorten_to_successor(std::string& key) {
  for (std::size_t i = 0; i < key.size(); ++i) {
    const auto byte = static_cast<std::uint8_t>(key[i]);
    if (byte != 0xff) {
      key[i] = static_cast<char>(byte + 1);
      key.resize(i + 1);
      return;
    }
  }
}

LOOM_COMPILED_ONCE auto table_builder::write_block(block_builder& block) -> block_handle {
  const std::string raw = block.finish();
  auto type = compression::none;
  std::string compressed;
  std::string_view stored = raw;
  if (options_.compression == compression::snappy) {
    snappy::Compress(raw.data(), raw.size(), &compressed);
    // Kept only where it saves at least an eighth, as TF's builder does.
    if (compressed.size() < raw.size() - raw.size() / 8) {
      stored = compressed;
      type = compression::snappy;
    }
  }
  const block_handle handle{file_.size(), stored.size()};
  file_.append(stored);
  const char type_byte = static_cast<char>(type);
  file_.push_back(type_byte);
  detail::put_fixed32(file_, tfrecord::mask(crc32c::extend(crc32c::value(stored), &type_byte, 1)));
  return handle;
}
} // namespace loom::detail::leveldb_table

namespace loom::detail::leveldb_table::detail {

LOOM_COMPILED_ONCE std::string read_block(std::string_view file, const block_handle& h,
                                          const std::string& what, const std::string& which) {
  const std::string where = what + ": " + which + " block at byte " + std::to_string(h.offset);
  if (h.offset > file.size() || h.size > file.size() - h.offset ||
      file.size() - h.offset - h.size < block_trailer_bytes)
    throw data_loss_error(where + " of " + std::to_string(h.size) +
                          " bytes runs past the end of the file (" + std::to_string(file.size()) +
                          " bytes): the file is truncated or corrupt");
  const std::string_view stored = file.substr(h.offset, h.size + 1);
  const std::uint32_t crc = get_fixed32(file.substr(h.offset + h.size + 1, 4));
  if (tfrecord::unmask(crc) != crc32c::value(stored))
    throw data_loss_error(where + " fails its checksum: the file is corrupt");
  const auto type = static_cast<std::uint8_t>(stored.back());
  const std::string_view body = stored.substr(0, h.size);
  if (type == static_cast<std::uint8_t>(compression::none))
    return std::string(body);
  if (type != static_cast<std::uint8_t>(compression::snappy))
    throw data_loss_error(where + " has compression type " + std::to_string(type) +
                          " (0 none and 1 Snappy are LevelDB's)");
  std::string out;
  if (!snappy::Uncompress(body.data(), body.size(), &out))
    throw data_loss_error(where + ": its Snappy-compressed bytes do not decompress");
  return out;
}

LOOM_COMPILED_ONCE void parse_block(std::string_view block, const std::string& where,
                                    std::vector<entry>& out) {
  if (block.size() < 4)
    throw data_loss_error(where + " has " + std::to_string(block.size()) +
                          " bytes, too few for its restart count");
  const std::uint32_t restarts = get_fixed32(block.substr(block.size() - 4));
  if (restarts == 0 || restarts > (block.size() - 4) / 4)
    throw data_loss_error(where + " claims " + std::to_string(restarts) + " restart points in " +
                          std::to_string(block.size()) + " bytes");
  std::string_view rest = block.substr(0, block.size() - 4 - 4 * std::size_t{restarts});
  std::string key;
  while (!rest.empty()) {
    const auto shared = get_varint64(rest);
    const auto unshared = get_varint64(rest);
    const auto value_size = get_varint64(rest);
    if (!shared || !unshared || !value_size || *shared > key.size() || *unshared > rest.size() ||
        *value_size > rest.size() - *unshared)
      throw data_loss_error(where + ": entry " + std::to_string(out.size()) +
                            " is malformed (a length runs past the block)");
    key.resize(static_cast<std::size_t>(*shared));
    key.append(rest.substr(0, static_cast<std::size_t>(*unshared)));
    rest.remove_prefix(static_cast<std::size_t>(*unshared));
    out.push_back({key, std::string(rest.substr(0, static_cast<std::size_t>(*value_size)))});
    rest.remove_prefix(static_cast<std::size_t>(*value_size));
  }
}

LOOM_COMPILED_ONCE block_handle decode_handle(std::string_view& in, const std::string& where) {
  const auto offset = get_varint64(in);
  const auto size = get_varint64(in);
  if (!offset || !size)
    throw data_loss_error(where + ": a malformed block handle");
  return {*offset, *size};
}
} // namespace loom::detail::leveldb_table::detail

namespace loom::detail::leveldb_table {

LOOM_COMPILED_ONCE std::vector<entry> read_table(std::string_view file, const std::string& what) {
  if (file.size() < footer_bytes)
    throw data_loss_error(what + " has " + std::to_string(file.size()) +
                          " bytes, fewer than a table's footer (" + std::to_string(footer_bytes) +
                          "): the file is truncated or not a checkpoint index");
  std::string_view footer = file.substr(file.size() - footer_bytes);
  const std::uint64_t found = std::uint64_t{detail::get_fixed32(footer.substr(40))} |
                              std::uint64_t{detail::get_fixed32(footer.substr(44))} << 32;
  if (found != magic)
    throw data_loss_error(what + " does not end in a LevelDB table's magic number: the file is "
                                 "truncated, corrupt or not a checkpoint index");
  detail::decode_handle(footer, what + "'s footer"); // the metaindex: TF stores nothing there
  const block_handle index_handle = detail::decode_handle(footer, what + "'s footer");
  std::vector<entry> index;
  detail::parse_block(detail::read_block(file, index_handle, what, "the index"),
                      what + ": the index block", index);
  std::vector<entry> entries;
  for (std::size_t b = 0; b < index.size(); ++b) {
    std::string_view handle_bytes = index[b].value;
    const std::string which = "data block " + std::to_string(b);
    const block_handle h = detail::decode_handle(handle_bytes, what + ": the index's " + which);
    const std::size_t first = entries.size();
    detail::parse_block(detail::read_block(file, h, what, which), what + ": " + which, entries);
    for (std::size_t i = first; i < entries.size(); ++i)
      if ((i > 0 && !(entries[i - 1].key < entries[i].key)) || entries[i].key > index[b].key)
        throw data_loss_error(what + ": " + which +
                              "'s keys are out of order: the file is "
                              "corrupt");
  }
  return entries;
}

} // namespace loom::detail::leveldb_table

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// The checkpoint file format: its reader (TF's NewCheckpointReader) and
// writer. Readers check every length against the file's size before
// allocating, so a truncated or corrupt file is an error (data_loss), never a
// crash.
//
// The file (one per checkpoint; every integer little-endian):
//
//   "LOOMCKPT"  u32 format version (1)  u64 tensor count
//   per tensor: u32 name length, name (UTF-8), u8 dtype tag (0 float32,
//               1 float64, 2 int32, 3 int64, 4 bool, 5 string), u32 rank,
//               rank x i64 dimensions, u64 byte length, u32 CRC-32 (zlib's)
//               of the bytes, then the bytes: the elements in row-major order
//               (bool one byte 0 or 1; string: u64 length + bytes, each).
//
// A sharded checkpoint (TF's sharded Saver) is several such files: each task
// writes the tensors it holds to "<path>.data-<i>-of-<n>", and the manifest at
// <path>, written last, lists them in its string tensor ".shards" (file names
// beside the manifest). A reader opened on the manifest reads them as one.
//
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/dtype.hpp>
#include <loom/core/durable_file.hpp>
#include <loom/core/error.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/tensor.hpp>

#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

namespace detail::ckpt {

inline constexpr std::array<char, 8> magic = {'L', 'O', 'O', 'M', 'C', 'K', 'P', 'T'};
inline constexpr std::uint32_t format_version = 1;
inline constexpr std::uint32_t max_name_length = 1u << 16;
inline constexpr std::uint32_t max_rank = 64;
// A header: magic, version, count.
inline constexpr std::uint64_t file_header_bytes = 8 + 4 + 8;
// The smallest entry: name length, dtype, rank, byte length, crc.
inline constexpr std::uint64_t min_entry_bytes = 4 + 1 + 4 + 8 + 4;

// File tags of the dtypes: fixed, whatever the order of loom::dtype.
LOOM_COMPILED_ONCE std::uint8_t dtype_tag(dtype d);
LOOM_COMPILED_ONCE std::optional<dtype> dtype_from_tag(std::uint8_t tag);

// The file's size of one element (strings have none: they are length-prefixed).
LOOM_COMPILED_ONCE std::size_t element_bytes(dtype d);

LOOM_COMPILED_ONCE std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t n);
inline std::uint32_t crc32_of(const void* data, std::size_t n) {
  return crc32_update(static_cast<std::uint32_t>(::crc32(0L, Z_NULL, 0)), data, n);
}

template <class U> void put_le(std::string& out, U v) {
  for (std::size_t i = 0; i < sizeof(U); ++i)
    out.push_back(static_cast<char>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xff));
}
template <class U> U get_le(const unsigned char* p) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(U); ++i)
    v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return static_cast<U>(v);
}

// Reverses the bytes of each element in place (files are little-endian).
LOOM_COMPILED_ONCE void swap_elements(unsigned char* p, std::size_t bytes, std::size_t element);

} // namespace detail::ckpt

// -- reading -----------------------------------------------------------------------

// One tensor of a checkpoint file, as its header describes it.
struct checkpoint_entry {
  std::string name;
  dtype type = dtype::f32;
  loom::shape shape;
  std::uint64_t byte_length = 0; // of its data in the file
  std::uint32_t stored_crc32 = 0;
  std::uint32_t computed_crc32 = 0;
  bool crc_ok = false;
  std::uint64_t offset = 0; // of its data in the file
  std::size_t file = 0;     // 0: this file; i: the manifest's shard i - 1
};

namespace detail {
// The name of shard i of n of the sharded checkpoint at `path`.
inline std::string checkpoint_shard_path(const std::string& path, std::int64_t i, std::int64_t n) {
  return path + ".data-" + std::to_string(i) + "-of-" + std::to_string(n);
}
// The tensor of a manifest that lists its shards' file names.
inline constexpr std::string_view checkpoint_shards_key = ".shards";
} // namespace detail

// Opens a checkpoint file, checks its structure (magic, version, every length
// against the file's size) and every tensor's checksum, and reads tensors
// (TF's NewCheckpointReader). A bad structure throws data_loss_error naming the
// file; a bad checksum is recorded in entries() and makes read_tensor throw.
class checkpoint_reader {
public:
  explicit checkpoint_reader(std::string path);

  const std::string& path() const noexcept { return path_; }
  std::uint32_t version() const noexcept { return version_; }
  std::uint64_t file_size() const noexcept { return size_; }
  const std::vector<checkpoint_entry>& entries() const noexcept { return entries_; }
  // The shard files of a sharded checkpoint's manifest (empty for one file).
  std::vector<std::string> shard_paths() const {
    std::vector<std::string> out;
    for (const auto& r : shards_)
      out.push_back(r->path());
    return out;
  }
  // True when every tensor's checksum matches.
  bool all_ok() const noexcept {
    return std::all_of(entries_.begin(), entries_.end(), [](auto& e) { return e.crc_ok; });
  }

  const checkpoint_entry* find(std::string_view name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &entries_[it->second];
  }
  bool has_tensor(std::string_view name) const { return find(name) != nullptr; }

  // The tensor's value; not_found_error when the file has no such tensor,
  // data_loss_error when its bytes fail their checksum.
  any_tensor read_tensor(std::string_view name) const;

  any_tensor read(const checkpoint_entry& e) const;

private:
  using fd_handle = detail::ckpt::fd_handle;

  // A manifest: opens the shards it lists (each checked as this file is) and
  // takes their tensors in as its own. A shard missing or a tensor in two files
  // is data loss: the checkpoint is incomplete or was mixed from two saves.
  void open_shards();

  [[noreturn]] void corrupt(const std::string& what) const {
    throw data_loss_error("checkpoint " + path_ + " is corrupt: " + what);
  }
  [[noreturn]] void throw_bad_crc(const checkpoint_entry& e) const;
  void check_crc(const checkpoint_entry& e, std::uint32_t crc) const {
    if (crc != e.stored_crc32) {
      checkpoint_entry copy = e;
      copy.computed_crc32 = crc;
      throw_bad_crc(copy);
    }
  }
  void read_exact(void* p, std::size_t n, std::uint64_t offset, const checkpoint_entry& e) const;

  // Reads n header bytes at pos_, checking them against the file's size.
  const unsigned char* take(std::size_t n, const std::string& what);
  template <class U> U take_le(const std::string& what) {
    return detail::ckpt::get_le<U>(take(sizeof(U), what));
  }

  void parse();

  std::string path_;
  fd_handle fd_;
  std::uint64_t size_ = 0;
  std::uint64_t pos_ = 0;
  std::uint32_t version_ = 0;
  std::vector<checkpoint_entry> entries_;
  std::map<std::string, std::size_t, std::less<>> by_name_;
  std::vector<unsigned char> scratch_;
  std::vector<std::unique_ptr<checkpoint_reader>> shards_;
};

// -- writing -----------------------------------------------------------------------

// Writes a checkpoint file of `values` under `names` (durably: write_atomically).
// Writes `count` tensors, asking tensor_at(i) for each in turn (name,
// value), so that a caller can produce them a few at a time and no more of
// them are in memory at once than it holds.
LOOM_COMPILED_ONCE void write_checkpoint_file(
    const std::string& path, std::size_t count,
    const std::function<std::pair<std::string, any_tensor>(std::size_t)>& tensor_at);

LOOM_COMPILED_ONCE void write_checkpoint_file(const std::string& path,
                                              const std::vector<std::string>& names,
                                              const std::vector<any_tensor>& values);

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail::ckpt {

LOOM_COMPILED_ONCE std::uint8_t dtype_tag(dtype d) {
  switch (d) {
  case dtype::f32: return 0;
  case dtype::f64: return 1;
  case dtype::i32: return 2;
  case dtype::i64: return 3;
  case dtype::boolean: return 4;
  case dtype::string: return 5;
  }
  throw internal_error("checkpoint: unknown dtype");
}

LOOM_COMPILED_ONCE std::optional<dtype> dtype_from_tag(std::uint8_t tag) {
  switch (tag) {
  case 0: return dtype::f32;
  case 1: return dtype::f64;
  case 2: return dtype::i32;
  case 3: return dtype::i64;
  case 4: return dtype::boolean;
  case 5: return dtype::string;
  default: return std::nullopt;
  }
}

LOOM_COMPILED_ONCE std::size_t element_bytes(dtype d) {
  switch (d) {
  case dtype::f32: return 4;
  case dtype::f64: return 8;
  case dtype::i32: return 4;
  case dtype::i64: return 8;
  case dtype::boolean: return 1;
  case dtype::string: return 0;
  }
  return 0;
}

LOOM_COMPILED_ONCE std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (n > 0) {
    const std::size_t chunk = std::min<std::size_t>(n, std::size_t{1} << 30);
    c = ::crc32(c, p, static_cast<uInt>(chunk));
    p += chunk;
    n -= chunk;
  }
  return static_cast<std::uint32_t>(c);
}

LOOM_COMPILED_ONCE void swap_elements(unsigned char* p, std::size_t bytes, std::size_t element) {
  if (element <= 1)
    return;
  for (std::size_t i = 0; i + element <= bytes; i += element)
    std::reverse(p + i, p + i + element);
}
} // namespace loom::detail::ckpt

namespace loom {

LOOM_COMPILED_ONCE checkpoint_reader::checkpoint_reader(std::string path) : path_(std::move(path)) {
  using namespace detail::ckpt;
  fd_ = fd_handle(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd_)
    throw_io("checkpoint " + path_ + ": cannot open", errno);
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0)
    throw_io("checkpoint " + path_ + ": cannot stat", errno);
  if (!S_ISREG(st.st_mode))
    throw invalid_argument_error("checkpoint " + path_ + " is not a regular file");
  size_ = static_cast<std::uint64_t>(st.st_size);
  parse();
  open_shards();
}

LOOM_COMPILED_ONCE auto checkpoint_reader::read_tensor(std::string_view name) const -> any_tensor {
  const checkpoint_entry* e = find(name);
  if (!e)
    throw not_found_error("checkpoint " + path_ + " has no tensor '" + std::string(name) + "'");
  return read(*e);
}

LOOM_COMPILED_ONCE auto checkpoint_reader::read(const checkpoint_entry& e) const -> any_tensor {
  using namespace detail::ckpt;
  if (e.file > 0) {
    if (e.file > shards_.size())
      throw invalid_argument_error("checkpoint " + path_ + ": tensor '" + e.name +
                                   "' names shard " + std::to_string(e.file) + " of " +
                                   std::to_string(shards_.size()));
    checkpoint_entry own = e;
    own.file = 0;
    return shards_[e.file - 1]->read(own);
  }
  if (!e.crc_ok)
    throw_bad_crc(e);
  any_tensor t(e.type, e.shape);
  const auto n = static_cast<std::size_t>(e.shape.num_elements());
  if (e.type != dtype::string) {
    const std::size_t bytes = static_cast<std::size_t>(e.byte_length);
    auto* p = static_cast<unsigned char*>(t.raw_data());
    read_exact(p, bytes, e.offset, e);
    check_crc(e, crc32_of(p, bytes));
    if (e.type == dtype::boolean) {
      for (std::size_t i = 0; i < bytes; ++i)
        if (p[i] > 1)
          throw data_loss_error("checkpoint " + path_ + ": tensor '" + e.name +
                                "' holds a bool byte " + std::to_string(p[i]) +
                                " that is neither 0 nor 1");
    } else if constexpr (std::endian::native == std::endian::big) {
      swap_elements(p, bytes, element_bytes(e.type));
    }
    return t;
  }
  std::vector<unsigned char> raw(static_cast<std::size_t>(e.byte_length));
  read_exact(raw.data(), raw.size(), e.offset, e);
  check_crc(e, crc32_of(raw.data(), raw.size()));
  std::string* out = t.data<std::string>();
  std::size_t at = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (raw.size() - at < 8)
      throw data_loss_error("checkpoint " + path_ + ": tensor '" + e.name + "': string " +
                            std::to_string(i) + " has no length");
    const auto len = get_le<std::uint64_t>(raw.data() + at);
    at += 8;
    if (len > raw.size() - at)
      throw data_loss_error("checkpoint " + path_ + ": tensor '" + e.name + "': string " +
                            std::to_string(i) + " of " + std::to_string(len) +
                            " bytes runs past the tensor's data");
    out[i].assign(reinterpret_cast<const char*>(raw.data() + at), static_cast<std::size_t>(len));
    at += static_cast<std::size_t>(len);
  }
  if (at != raw.size())
    throw data_loss_error("checkpoint " + path_ + ": tensor '" + e.name + "' has " +
                          std::to_string(raw.size() - at) + " bytes after its last string");
  return t;
}

LOOM_COMPILED_ONCE void checkpoint_reader::open_shards() {
  const checkpoint_entry* list = find(detail::checkpoint_shards_key);
  if (!list)
    return;
  const any_tensor names = read(*list);
  if (names.type() != dtype::string || names.rank() != 1)
    throw data_loss_error("checkpoint " + path_ + ": its '" +
                          std::string(detail::checkpoint_shards_key) + "' is " + names.describe() +
                          ", not a list of file names");
  const std::string dir = detail::ckpt::parent_dir(path_);
  for (const std::string& name : names.flat<std::string>()) {
    if (name.empty() || name.find('/') != std::string::npos)
      throw data_loss_error("checkpoint " + path_ + " lists a shard named '" + name +
                            "' (a file name beside the manifest)");
    try {
      shards_.push_back(std::make_unique<checkpoint_reader>(dir + "/" + name));
    } catch (const not_found_error& e) {
      throw data_loss_error("checkpoint " + path_ + " is incomplete: " + e.what());
    }
    for (checkpoint_entry e : shards_.back()->entries()) {
      if (find(e.name))
        throw data_loss_error("checkpoint " + path_ + ": tensor '" + e.name +
                              "' is in two of its files (" + shards_.back()->path() + ")");
      e.file = shards_.size();
      by_name_.emplace(e.name, entries_.size());
      entries_.push_back(std::move(e));
    }
  }
}

LOOM_COMPILED_ONCE void checkpoint_reader::throw_bad_crc(const checkpoint_entry& e) const {
  char buf[64];
  std::snprintf(buf, sizeof buf, "stored crc32 %08x, computed %08x", e.stored_crc32,
                e.computed_crc32);
  throw data_loss_error("checkpoint " + path_ + ": tensor '" + e.name + "' fails its checksum (" +
                        buf + "): the file is corrupt");
}

LOOM_COMPILED_ONCE void checkpoint_reader::read_exact(void* p, std::size_t n, std::uint64_t offset,
                                                      const checkpoint_entry& e) const {
  if (!detail::ckpt::pread_all(fd_.get(), p, n, offset, path_))
    throw data_loss_error("checkpoint " + path_ + " is truncated: tensor '" + e.name +
                          "' (the file shrank since it was opened)");
}

LOOM_COMPILED_ONCE auto checkpoint_reader::take(std::size_t n, const std::string& what) -> const
    unsigned char* {
  if (n > size_ - pos_)
    throw data_loss_error("checkpoint " + path_ + " is truncated: " + what + " needs " +
                          std::to_string(n) + " bytes at offset " + std::to_string(pos_) +
                          ", the file has " + std::to_string(size_ - pos_) + " left (size " +
                          std::to_string(size_) + ")");
  scratch_.resize(n);
  if (!detail::ckpt::pread_all(fd_.get(), scratch_.data(), n, pos_, path_))
    throw data_loss_error("checkpoint " + path_ + " is truncated at offset " +
                          std::to_string(pos_));
  pos_ += n;
  return scratch_.data();
}

LOOM_COMPILED_ONCE void checkpoint_reader::parse() {
  using namespace detail::ckpt;
  const unsigned char* m = take(magic.size(), "the header");
  if (!std::equal(magic.begin(), magic.end(), m))
    throw data_loss_error("checkpoint " + path_ +
                          " is not a loom checkpoint (its first bytes are not LOOMCKPT)");
  version_ = take_le<std::uint32_t>("the header");
  if (version_ == 0 || version_ > format_version)
    throw unimplemented_error("checkpoint " + path_ + " has format version " +
                              std::to_string(version_) + "; this loom reads version " +
                              std::to_string(format_version));
  const auto count = take_le<std::uint64_t>("the header");
  if (count > (size_ - pos_) / min_entry_bytes)
    throw data_loss_error("checkpoint " + path_ + " is truncated or corrupt: it claims " +
                          std::to_string(count) + " tensors, more than its " +
                          std::to_string(size_) + " bytes can hold");
  entries_.reserve(static_cast<std::size_t>(count));
  std::vector<unsigned char> chunk;
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::string which = "tensor " + std::to_string(i);
    checkpoint_entry e;
    const auto name_len = take_le<std::uint32_t>(which);
    if (name_len == 0 || name_len > max_name_length)
      corrupt(which + " has a name of " + std::to_string(name_len) + " bytes");
    const unsigned char* name = take(name_len, which + "'s name");
    e.name.assign(reinterpret_cast<const char*>(name), name_len);
    const std::string what = "tensor '" + e.name + "'";
    const auto tag = take_le<std::uint8_t>(what);
    const auto type = dtype_from_tag(tag);
    if (!type)
      corrupt(what + " has an unknown dtype tag " + std::to_string(tag));
    e.type = *type;
    const auto rank = take_le<std::uint32_t>(what);
    if (rank > max_rank)
      corrupt(what + " has rank " + std::to_string(rank));
    std::vector<std::int64_t> dims;
    std::uint64_t elements = 1;
    bool overflow = false;
    for (std::uint32_t d = 0; d < rank; ++d) {
      const auto dim = take_le<std::int64_t>(what + "'s shape");
      if (dim < 0)
        corrupt(what + " has a negative dimension " + std::to_string(dim));
      dims.push_back(dim);
      const auto u = static_cast<std::uint64_t>(dim);
      if (u != 0 && elements > std::numeric_limits<std::uint64_t>::max() / u)
        overflow = true;
      else
        elements *= u;
    }
    e.shape = loom::shape(std::move(dims));
    e.byte_length = take_le<std::uint64_t>(what);
    e.stored_crc32 = take_le<std::uint32_t>(what);
    e.offset = pos_;
    if (e.byte_length > size_ - pos_)
      throw data_loss_error("checkpoint " + path_ + " is truncated: " + what + " needs " +
                            std::to_string(e.byte_length) + " bytes of data at offset " +
                            std::to_string(pos_) + ", the file has " +
                            std::to_string(size_ - pos_) + " left (size " + std::to_string(size_) +
                            ")");
    // Every element takes bytes in the file (a string at least its length),
    // so a shape the data cannot hold is caught before anything is allocated.
    const bool is_string = e.type == dtype::string;
    const std::uint64_t per = is_string ? 8 : element_bytes(e.type);
    const bool fits = !overflow && elements <= e.byte_length / per &&
                      (is_string || elements * per == e.byte_length);
    if (!fits)
      corrupt(what + " of " + std::string(to_string(e.type)) + e.shape.to_string() + " has " +
              std::to_string(e.byte_length) + " bytes of data");
    // The checksum, read in bounded chunks.
    std::uint32_t crc = crc32_of(nullptr, 0);
    std::uint64_t left = e.byte_length;
    chunk.resize(static_cast<std::size_t>(std::min<std::uint64_t>(left, 1u << 20)));
    while (left > 0) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(left, chunk.size()));
      if (!pread_all(fd_.get(), chunk.data(), n, pos_, path_))
        throw data_loss_error("checkpoint " + path_ + " is truncated inside " + what);
      crc = crc32_update(crc, chunk.data(), n);
      pos_ += n;
      left -= n;
    }
    e.computed_crc32 = crc;
    e.crc_ok = crc == e.stored_crc32;
    if (!by_name_.emplace(e.name, entries_.size()).second)
      corrupt(what + " appears twice");
    entries_.push_back(std::move(e));
  }
  if (pos_ != size_)
    corrupt(std::to_string(size_ - pos_) + " bytes follow the last tensor");
}

LOOM_COMPILED_ONCE void write_checkpoint_file(
    const std::string& path, std::size_t count,
    const std::function<std::pair<std::string, any_tensor>(std::size_t)>& tensor_at) {
  using namespace detail::ckpt;
  detail::ckpt::write_atomically(path, [&](auto&& out) {
    std::string head(magic.begin(), magic.end());
    put_le<std::uint32_t>(head, format_version);
    put_le<std::uint64_t>(head, count);
    out(head.data(), head.size());
    for (std::size_t i = 0; i < count; ++i) {
      const auto [name, t] = tensor_at(i);
      std::string data; // for strings and big-endian hosts
      const void* bytes = t.raw_data();
      std::size_t length = 0;
      if (t.type() == dtype::string) {
        for (const std::string& s : t.flat<std::string>()) {
          put_le<std::uint64_t>(data, s.size());
          data += s;
        }
        bytes = data.data();
        length = data.size();
      } else {
        length = static_cast<std::size_t>(t.num_elements()) * element_bytes(t.type());
        if constexpr (std::endian::native == std::endian::big) {
          data.assign(static_cast<const char*>(t.raw_data()), length);
          swap_elements(reinterpret_cast<unsigned char*>(data.data()), length,
                        element_bytes(t.type()));
          bytes = data.data();
        }
      }
      std::string h;
      put_le<std::uint32_t>(h, static_cast<std::uint32_t>(name.size()));
      h += name;
      put_le<std::uint8_t>(h, dtype_tag(t.type()));
      put_le<std::uint32_t>(h, static_cast<std::uint32_t>(t.rank()));
      for (std::int64_t d : t.shape().dims())
        put_le<std::int64_t>(h, d);
      put_le<std::uint64_t>(h, length);
      put_le<std::uint32_t>(h, crc32_of(bytes, length));
      out(h.data(), h.size());
      out(bytes, length);
    }
  });
}

LOOM_COMPILED_ONCE void write_checkpoint_file(const std::string& path,
                                              const std::vector<std::string>& names,
                                              const std::vector<any_tensor>& values) {
  write_checkpoint_file(path, names.size(), [&](std::size_t i) {
    return std::pair<std::string, any_tensor>(names[i], values[i]);
  });
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

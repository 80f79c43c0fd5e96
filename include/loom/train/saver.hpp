// Checkpoints (TF's tf.train.Saver, tf.train.latest_checkpoint and
// tf.train.NewCheckpointReader).
//
//   loom::saver saver(g);                                  // the global variables
//   std::string path = saver.save(sess, dir + "/model", step);  // dir/model-<step>
//   saver.restore(sess, *loom::latest_checkpoint(dir));
//
// A saver saves variables by node name (TF's checkpoint key), every one in one
// session run, and restores them with one run that feeds a placeholder per
// variable into an assign. The assign and its placeholder are colocated with
// their variable, so on a cluster each value goes straight to the variable's ps
// task, and a checkpoint restores into a cluster with another number of ps
// tasks (the names, not the devices, identify the variables).
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
// A checkpoint is written to "<file>.tmp-<pid>", fsynced, renamed to its name
// and the directory fsynced, so a crash leaves the old file or the new one,
// never a torn one. The directory's "checkpoint" state file (TF's text format:
// model_checkpoint_path and all_model_checkpoint_paths) is replaced the same
// way. Readers check every length against the file's size before allocating,
// so a truncated or corrupt file is an error (data_loss), never a crash.
#pragma once

#include <loom/core/dtype.hpp>
#include <loom/core/error.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/tensor.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/node.hpp>
#include <loom/runtime/session.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
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
inline std::uint8_t dtype_tag(dtype d) {
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
inline std::optional<dtype> dtype_from_tag(std::uint8_t tag) {
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

// The file's size of one element (strings have none: they are length-prefixed).
inline std::size_t element_bytes(dtype d) {
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

inline std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t n) {
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
inline void swap_elements(unsigned char* p, std::size_t bytes, std::size_t element) {
  if (element <= 1)
    return;
  for (std::size_t i = 0; i + element <= bytes; i += element)
    std::reverse(p + i, p + i + element);
}

inline std::string errno_text(int e) {
  return std::strerror(e);
}

// An I/O failure as the loom error that fits errno.
[[noreturn]] inline void throw_io(const std::string& what, int e) {
  const std::string msg = what + ": " + errno_text(e);
  switch (e) {
  case ENOENT: throw not_found_error(msg);
  case EACCES:
  case EPERM:
  case EROFS: throw permission_denied_error(msg);
  case ENOSPC:
  case EDQUOT:
  case EFBIG: throw resource_exhausted_error(msg);
  default: throw coded_error<error_code::unknown>(msg);
  }
}

// An owned file descriptor.
class fd_handle {
public:
  fd_handle() = default;
  explicit fd_handle(int fd) : fd_(fd) {}
  fd_handle(fd_handle&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  fd_handle& operator=(fd_handle&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  fd_handle(const fd_handle&) = delete;
  fd_handle& operator=(const fd_handle&) = delete;
  ~fd_handle() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = -1;
  }
  // Closes and reports close's error (where a deferred write error shows).
  int close() noexcept {
    const int r = fd_ >= 0 ? ::close(fd_) : 0;
    fd_ = -1;
    return r;
  }

private:
  int fd_ = -1;
};

inline void write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR)
        continue;
      throw_io("cannot write " + path, errno);
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

// Reads exactly n bytes at offset; false at an early end of file.
inline bool pread_all(int fd, void* data, std::size_t n, std::uint64_t offset,
                      const std::string& path) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r =
        ::pread(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR)
        continue;
      throw_io("cannot read " + path, errno);
    }
    if (r == 0)
      return false;
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
  return true;
}

inline std::string parent_dir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? std::string(".") : dir;
}

inline void fsync_dir(const std::string& dir) {
  fd_handle fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd)
    throw_io("cannot open directory " + dir + " to sync it", errno);
  if (::fsync(fd.get()) != 0 && errno != EINVAL) // EINVAL: a file system without dir fsync
    throw_io("cannot sync directory " + dir, errno);
}

// Writes `path` atomically: the content goes to "<path>.tmp-<pid>", which is
// fsynced and renamed over `path`, then the directory is fsynced. `fill`
// writes through the callable it is given; on any error the temporary file is
// removed and `path` is untouched.
template <class Fill> void write_atomically(const std::string& path, Fill&& fill) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  fd_handle fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd)
    throw_io("cannot create " + tmp, errno);
  try {
    fill([&](const void* data, std::size_t n) { write_all(fd.get(), data, n, tmp); });
    if (::fsync(fd.get()) != 0)
      throw_io("cannot sync " + tmp, errno);
    if (fd.close() != 0)
      throw_io("cannot close " + tmp, errno);
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw_io("cannot rename " + tmp + " to " + path, errno);
  } catch (...) {
    fd.reset();
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_dir(parent_dir(path));
}

// TF's text form of a string field: quotes, with \\, \" and \n escaped.
inline std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '\\' || c == '"')
      out += '\\', out += c;
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out + "\"";
}
inline std::optional<std::string> unquote(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  if (s.size() < 2 || s.front() != '"' || s.back() != '"')
    return std::nullopt;
  s = s.substr(1, s.size() - 2);
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out += s[i];
      continue;
    }
    if (++i == s.size())
      return std::nullopt;
    out += s[i] == 'n' ? '\n' : s[i];
  }
  return out;
}

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
};

// Opens a checkpoint file, checks its structure (magic, version, every length
// against the file's size) and every tensor's checksum, and reads tensors
// (TF's NewCheckpointReader). A bad structure throws data_loss_error naming the
// file; a bad checksum is recorded in entries() and makes read_tensor throw.
class checkpoint_reader {
public:
  explicit checkpoint_reader(std::string path) : path_(std::move(path)) {
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
  }

  const std::string& path() const noexcept { return path_; }
  std::uint32_t version() const noexcept { return version_; }
  std::uint64_t file_size() const noexcept { return size_; }
  const std::vector<checkpoint_entry>& entries() const noexcept { return entries_; }
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
  any_tensor read_tensor(std::string_view name) const {
    const checkpoint_entry* e = find(name);
    if (!e)
      throw not_found_error("checkpoint " + path_ + " has no tensor '" + std::string(name) + "'");
    return read(*e);
  }

  any_tensor read(const checkpoint_entry& e) const {
    using namespace detail::ckpt;
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

private:
  using fd_handle = detail::ckpt::fd_handle;

  [[noreturn]] void corrupt(const std::string& what) const {
    throw data_loss_error("checkpoint " + path_ + " is corrupt: " + what);
  }
  [[noreturn]] void throw_bad_crc(const checkpoint_entry& e) const {
    char buf[64];
    std::snprintf(buf, sizeof buf, "stored crc32 %08x, computed %08x", e.stored_crc32,
                  e.computed_crc32);
    throw data_loss_error("checkpoint " + path_ + ": tensor '" + e.name + "' fails its checksum (" +
                          buf + "): the file is corrupt");
  }
  void check_crc(const checkpoint_entry& e, std::uint32_t crc) const {
    if (crc != e.stored_crc32) {
      checkpoint_entry copy = e;
      copy.computed_crc32 = crc;
      throw_bad_crc(copy);
    }
  }
  void read_exact(void* p, std::size_t n, std::uint64_t offset, const checkpoint_entry& e) const {
    if (!detail::ckpt::pread_all(fd_.get(), p, n, offset, path_))
      throw data_loss_error("checkpoint " + path_ + " is truncated: tensor '" + e.name +
                            "' (the file shrank since it was opened)");
  }

  // Reads n header bytes at pos_, checking them against the file's size.
  const unsigned char* take(std::size_t n, const std::string& what) {
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
  template <class U> U take_le(const std::string& what) {
    return detail::ckpt::get_le<U>(take(sizeof(U), what));
  }

  void parse() {
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
                              std::to_string(size_ - pos_) + " left (size " +
                              std::to_string(size_) + ")");
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

  std::string path_;
  fd_handle fd_;
  std::uint64_t size_ = 0;
  std::uint64_t pos_ = 0;
  std::uint32_t version_ = 0;
  std::vector<checkpoint_entry> entries_;
  std::map<std::string, std::size_t, std::less<>> by_name_;
  std::vector<unsigned char> scratch_;
};

// -- the state file ----------------------------------------------------------------

// A directory's "checkpoint" file (TF's CheckpointState). Paths are as written:
// relative to the directory when the checkpoint is in it.
struct checkpoint_state {
  std::string model_checkpoint_path;
  std::vector<std::string> all_model_checkpoint_paths;
};

// The state of `dir`, nothing when it has no (readable, well-formed) state file
// (TF's get_checkpoint_state). Paths come back joined to `dir` when relative.
inline std::optional<checkpoint_state> get_checkpoint_state(const std::string& dir) {
  std::FILE* f = std::fopen((std::filesystem::path(dir) / "checkpoint").c_str(), "rb");
  if (!f)
    return std::nullopt;
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0 && text.size() < (1u << 24);)
    text.append(buf, n);
  std::fclose(f);
  auto full = [&](const std::string& p) {
    const std::filesystem::path path(p);
    return path.is_absolute() ? p : (std::filesystem::path(dir) / path).string();
  };
  checkpoint_state st;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos)
      end = text.size();
    std::string_view line(text.data() + at, end - at);
    at = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos)
      continue;
    const auto colon = line.find(':');
    if (colon == std::string_view::npos)
      return std::nullopt;
    std::string_view key = line.substr(0, colon);
    while (!key.empty() && (key.front() == ' ' || key.front() == '\t'))
      key.remove_prefix(1);
    const auto value = detail::ckpt::unquote(line.substr(colon + 1));
    if (!value)
      return std::nullopt;
    if (key == "model_checkpoint_path")
      st.model_checkpoint_path = full(*value);
    else if (key == "all_model_checkpoint_paths")
      st.all_model_checkpoint_paths.push_back(full(*value));
  }
  if (st.model_checkpoint_path.empty())
    return std::nullopt;
  return st;
}

// The newest checkpoint of `dir` by its state file (TF's
// tf.train.latest_checkpoint); nothing without a state file or when the file
// it names is gone.
inline std::optional<std::string> latest_checkpoint(const std::string& dir) {
  auto st = get_checkpoint_state(dir);
  if (!st)
    return std::nullopt;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(st->model_checkpoint_path, ec))
    return std::nullopt;
  return st->model_checkpoint_path;
}

// -- the saver -----------------------------------------------------------------------

struct saver_options {
  // Checkpoints kept on disk; older ones are deleted. 0 or less keeps every
  // file and lists only the newest in the state file (TF's max_to_keep=None).
  int max_to_keep = 5;
  // Variable nodes to save; empty: the global_variables collection.
  std::vector<node_id> var_list{};
};

class saver {
public:
  // What the saver saves, and the nodes that restore it.
  struct saved_variable {
    std::string name; // the checkpoint key: the variable node's name
    node_id variable = no_node;
    node_id value = no_node;  // placeholder fed with the restored value
    node_id assign = no_node; // assigns it, colocated with the variable
    dtype type = dtype::f32;
    loom::shape shape;
  };

  explicit saver(graph& g, saver_options o = {}) : graph_(g), max_to_keep_(o.max_to_keep) {
    std::vector<node_id> ids =
        o.var_list.empty() ? g.collection(collection::global_variables) : o.var_list;
    if (ids.empty())
      throw invalid_argument_error("saver: no variables to save");
    for (node_id id : ids) // every id checked before the graph changes
      if (g.node(id).op != "variable")
        throw invalid_argument_error("saver: node " + g.node(id).describe() + " is not a variable");
    // The restore nodes take no name scope, device scope or control dependency
    // of wherever the saver is made.
    auto no_names = g.name_scope("");
    auto saved_deps = std::exchange(g.state().control_scopes, {});
    scope_guard deps([&g, &saved_deps] { g.state().control_scopes = std::move(saved_deps); });
    auto no_device = g.device(nullptr);
    auto names = g.name_scope("save");
    for (node_id id : ids) {
      const node_def& n = g.node(id);
      if (std::any_of(vars_.begin(), vars_.end(), [&](auto& v) { return v.variable == id; }))
        continue;
      saved_variable v{n.name, id, no_node, no_node, n.type, n.shape};
      v.value =
          g.add_node("placeholder", {}, {{"dtype", v.type}, {"shape", v.shape}}, v.name + "/value");
      // Fed on the variable's task: the value crosses the network once.
      g.mutable_node(v.value).colocation_group = g.node(id).colocation();
      v.assign = g.add_node("assign", {id, v.value}, {}, v.name + "/assign");
      vars_.push_back(std::move(v));
    }
  }

  // Saves every variable (fetched in one run) to `prefix` or, with a global
  // step, to "prefix-<step>"; updates the directory's state file and deletes
  // the checkpoints beyond max_to_keep. Returns the path written.
  std::string save(session& s, const std::string& prefix,
                   std::optional<std::int64_t> global_step = {}) {
    check_session(s);
    if (prefix.empty())
      throw invalid_argument_error("saver::save: empty checkpoint prefix");
    const std::string path = global_step ? prefix + "-" + std::to_string(*global_step) : prefix;
    std::vector<node_id> ids;
    ids.reserve(vars_.size());
    for (auto& v : vars_)
      ids.push_back(v.variable);
    std::vector<any_tensor> values = s.run_nodes(ids, {});
    for (std::size_t i = 0; i < vars_.size(); ++i)
      if (values[i].type() != vars_[i].type || !(values[i].shape() == vars_[i].shape))
        throw internal_error("saver: variable '" + vars_[i].name + "' is " + values[i].describe() +
                             ", its node says " + std::string(to_string(vars_[i].type)) +
                             vars_[i].shape.to_string());
    write_checkpoint(path, values);

    const std::string dir = detail::ckpt::parent_dir(path);
    if (last_checkpoints_.empty()) // adopt what an earlier run kept here (TF's recover)
      if (auto st = get_checkpoint_state(dir)) {
        std::error_code ec;
        for (auto& p : st->all_model_checkpoint_paths)
          if (std::filesystem::is_regular_file(p, ec))
            last_checkpoints_.push_back(p);
      }
    auto same = [&](const std::string& p) { return same_file_name(p, path); };
    last_checkpoints_.erase(
        std::remove_if(last_checkpoints_.begin(), last_checkpoints_.end(), same),
        last_checkpoints_.end());
    last_checkpoints_.push_back(path);
    std::vector<std::string> doomed;
    if (max_to_keep_ > 0)
      while (last_checkpoints_.size() > static_cast<std::size_t>(max_to_keep_)) {
        doomed.push_back(last_checkpoints_.front());
        last_checkpoints_.erase(last_checkpoints_.begin());
      }
    write_state(dir);
    for (auto& p : doomed) // after the state file stops naming them
      ::unlink(p.c_str());
    return path;
  }

  // Restores every variable from the checkpoint at `path` in one run, after
  // checking the file and that it holds each variable with its dtype and shape.
  // Extra tensors in the file are ignored.
  void restore(session& s, const std::string& path) {
    check_session(s);
    checkpoint_reader reader(path);
    for (const auto& e : reader.entries())
      if (!e.crc_ok)
        reader.read(e); // throws, naming the tensor
    for (const auto& v : vars_) {
      const checkpoint_entry* e = reader.find(v.name);
      if (!e)
        throw not_found_error("checkpoint " + path + ": no tensor '" + v.name +
                              "' for the variable of that name (the file holds " +
                              std::to_string(reader.entries().size()) + " tensors" +
                              names_sample(reader) + ")");
      if (e->type != v.type)
        throw invalid_argument_error("checkpoint " + path + ": tensor '" + v.name + "' is " +
                                     std::string(to_string(e->type)) + ", the variable is " +
                                     std::string(to_string(v.type)));
      if (!(e->shape == v.shape))
        throw invalid_argument_error("checkpoint " + path + ": tensor '" + v.name + "' has shape " +
                                     e->shape.to_string() + ", the variable has " +
                                     v.shape.to_string());
    }
    std::vector<std::pair<node_id, any_tensor>> feeds;
    std::vector<node_id> targets;
    feeds.reserve(vars_.size());
    for (const auto& v : vars_) {
      feeds.emplace_back(v.value, reader.read(*reader.find(v.name)));
      targets.push_back(v.assign);
    }
    s.run_nodes({}, targets, feeds);
  }

  const std::vector<saved_variable>& variables() const noexcept { return vars_; }
  // The checkpoints this saver keeps, oldest first (TF's last_checkpoints).
  const std::vector<std::string>& last_checkpoints() const noexcept { return last_checkpoints_; }
  // Takes over checkpoints written earlier, so max_to_keep deletes them in
  // turn (TF's recover_last_checkpoints).
  void recover_last_checkpoints(std::vector<std::string> paths) {
    last_checkpoints_ = std::move(paths);
  }

private:
  void check_session(const session& s) const {
    if (!(s.graph_ref() == graph_))
      throw invalid_argument_error("saver: the session runs another graph than the saver's");
  }

  static bool same_file_name(const std::string& a, const std::string& b) {
    std::error_code ea, eb;
    const auto pa = std::filesystem::absolute(a, ea).lexically_normal();
    const auto pb = std::filesystem::absolute(b, eb).lexically_normal();
    return ea || eb ? a == b : pa == pb;
  }

  static std::string names_sample(const checkpoint_reader& r) {
    std::string out;
    std::size_t shown = 0;
    for (const auto& e : r.entries()) {
      if (shown == 8) {
        out += ", ...";
        break;
      }
      out += (shown++ ? ", '" : ": '") + e.name + "'";
    }
    return out;
  }

  static void write_checkpoint(const std::string& path, const std::vector<any_tensor>& values,
                               const std::vector<saved_variable>& vars) {
    using namespace detail::ckpt;
    detail::ckpt::write_atomically(path, [&](auto&& out) {
      std::string head(magic.begin(), magic.end());
      put_le<std::uint32_t>(head, format_version);
      put_le<std::uint64_t>(head, vars.size());
      out(head.data(), head.size());
      for (std::size_t i = 0; i < vars.size(); ++i) {
        const any_tensor& t = values[i];
        const std::string& name = vars[i].name;
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
  void write_checkpoint(const std::string& path, const std::vector<any_tensor>& values) const {
    write_checkpoint(path, values, vars_);
  }

  // The state file: the newest checkpoint and the kept ones, relative to the
  // directory when they are in it.
  void write_state(const std::string& dir) const {
    auto rel = [&](const std::string& p) {
      return detail::ckpt::parent_dir(p) == dir ? std::filesystem::path(p).filename().string() : p;
    };
    std::string text =
        "model_checkpoint_path: " + detail::ckpt::quote(rel(last_checkpoints_.back())) + "\n";
    if (max_to_keep_ > 0)
      for (const auto& p : last_checkpoints_)
        text += "all_model_checkpoint_paths: " + detail::ckpt::quote(rel(p)) + "\n";
    else
      text += "all_model_checkpoint_paths: " + detail::ckpt::quote(rel(last_checkpoints_.back())) +
              "\n";
    detail::ckpt::write_atomically((std::filesystem::path(dir) / "checkpoint").string(),
                                   [&](auto&& out) { out(text.data(), text.size()); });
  }

  graph graph_;
  int max_to_keep_;
  std::vector<saved_variable> vars_;
  std::vector<std::string> last_checkpoints_;
};

} // namespace loom

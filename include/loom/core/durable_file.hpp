// Files written durably (for checkpoints): the content goes to a temporary
// file that is fsynced, renamed to its name, and the directory fsynced, so a
// crash leaves the old file or the new one, never a torn one. I/O failures
// become the loom error that fits errno.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

namespace loom::detail::ckpt {

inline std::string errno_text(int e) {
  return std::strerror(e);
}

// An I/O failure as the loom error that fits errno.
[[noreturn]] LOOM_COMPILED_ONCE void throw_io(const std::string& what, int e);

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

LOOM_COMPILED_ONCE void write_all(int fd, const void* data, std::size_t n, const std::string& path);

// Reads exactly n bytes at offset; false at an early end of file.
LOOM_COMPILED_ONCE bool pread_all(int fd, void* data, std::size_t n, std::uint64_t offset,
                                  const std::string& path);

LOOM_COMPILED_ONCE std::string parent_dir(const std::string& path);

LOOM_COMPILED_ONCE void fsync_dir(const std::string& dir);

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

} // namespace loom::detail::ckpt

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail::ckpt {

LOOM_COMPILED_ONCE void throw_io(const std::string& what, int e) {
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

LOOM_COMPILED_ONCE void write_all(int fd, const void* data, std::size_t n,
                                  const std::string& path) {
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

LOOM_COMPILED_ONCE bool pread_all(int fd, void* data, std::size_t n, std::uint64_t offset,
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

LOOM_COMPILED_ONCE std::string parent_dir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? std::string(".") : dir;
}

LOOM_COMPILED_ONCE void fsync_dir(const std::string& dir) {
  fd_handle fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd)
    throw_io("cannot open directory " + dir + " to sync it", errno);
  if (::fsync(fd.get()) != 0 && errno != EINVAL) // EINVAL: a file system without dir fsync
    throw_io("cannot sync directory " + dir, errno);
}

} // namespace loom::detail::ckpt

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

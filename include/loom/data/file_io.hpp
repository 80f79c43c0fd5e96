// Files as the input pipeline reads and writes them: plain, GZIP or ZLIB
// (TF's TFRecordOptions compression types), through zlib. An input_file
// decompresses as it reads, into a buffer of its own (64 KiB of file bytes and
// 256 KiB decompressed), and counts the bytes it has given, so an error names
// the byte offset in the (decompressed) stream and an iterator can save its
// position as one number.
//
// Errors name the file: not_found (no such file), permission_denied (not
// readable), failed_precondition (a directory), data_loss (a compressed
// stream that is corrupt or cut short). A record that is corrupt is a
// corrupt_record_error, which ignore_errors() skips and counts per file.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>

#include <zlib.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace loom::data {

enum class compression { none, gzip, zlib };

// TF's names: "", "GZIP", "ZLIB".
LOOM_COMPILED_ONCE compression compression_from_name(std::string_view name);

// A record of a file that cannot be read as one: its CRC does not match, or the
// file ends inside it.
class corrupt_record_error : public data_loss_error {
public:
  corrupt_record_error(std::string file, const std::string& message)
      : data_loss_error(file + ": " + message), file_(std::move(file)) {}
  const std::string& file() const noexcept { return file_; }

private:
  std::string file_;
};

namespace detail {
struct file_closer {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};

// Opens `path` for reading or writing, or throws the error its failure means.
LOOM_COMPILED_ONCE std::unique_ptr<std::FILE, file_closer>
open_file(const std::string& path, bool write, std::string_view who);

inline int window_bits(compression c) {
  return c == compression::gzip ? MAX_WBITS + 16 : MAX_WBITS;
}
} // namespace detail

class input_file {
public:
  input_file(std::string path, compression c, std::string_view who = "reading");
  input_file(input_file&&) noexcept = default;
  input_file& operator=(input_file&&) noexcept = default;
  ~input_file() {
    if (stream_)
      inflateEnd(stream_.get());
  }

  const std::string& path() const noexcept { return path_; }
  // Bytes given so far: the offset of the next byte in the decompressed stream.
  std::uint64_t offset() const noexcept { return offset_; }

  // The next byte, or -1 at the end of the file.
  int get() {
    if (at_ == size_ && !refill())
      return -1;
    ++offset_;
    return static_cast<unsigned char>(buffer_[at_++]);
  }

  // Up to n bytes appended to out; fewer only at the end of the file.
  std::size_t read(std::string& out, std::size_t n);

  // The next line, without its "\n" or "\r\n" (its "\r" kept with keep_cr); false
  // at the end of the file.
  bool read_line(std::string& line, bool keep_cr = false);

  // Reads and drops bytes up to `offset` (an iterator's saved position).
  void seek(std::uint64_t offset);

private:
  static constexpr std::size_t buffer_bytes = 256 << 10, compressed_buffer_bytes = 64 << 10;

  bool refill();
  void check_read() {
    if (std::ferror(file_.get()))
      throw unavailable_error(path_ + ": read failed: " + std::strerror(errno));
  }

  std::string path_;
  std::unique_ptr<std::FILE, detail::file_closer> file_;
  std::unique_ptr<z_stream> stream_;
  std::vector<char> compressed_, buffer_;
  std::size_t at_ = 0, size_ = 0;
  std::uint64_t offset_ = 0;
  bool started_ = false, ended_member_ = false, done_ = false;
};

// A file written through a compressor (or not). close() finishes the stream
// and reports a failed write; the destructor closes too, silently.
class output_file {
public:
  output_file(std::string path, compression c);
  output_file(output_file&&) noexcept = default;
  output_file& operator=(output_file&&) noexcept = default;
  ~output_file() {
    try {
      close();
    } catch (...) { // a destructor reports nothing; call close() to see it
    }
  }

  void write(std::string_view bytes);

  void close();

private:
  void put(const char* p, std::size_t n);
  void deflate_all(int flush);

  std::string path_;
  std::unique_ptr<std::FILE, detail::file_closer> file_;
  std::unique_ptr<z_stream> stream_;
};

} // namespace loom::data

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::data {

LOOM_COMPILED_ONCE compression compression_from_name(std::string_view name) {
  if (name.empty() || name == "NONE")
    return compression::none;
  if (name == "GZIP")
    return compression::gzip;
  if (name == "ZLIB")
    return compression::zlib;
  throw invalid_argument_error("unknown compression type \"" + std::string(name) +
                               "\" (TF's are \"\", \"GZIP\" and \"ZLIB\")");
}
} // namespace loom::data

namespace loom::data::detail {

LOOM_COMPILED_ONCE std::unique_ptr<std::FILE, file_closer>
open_file(const std::string& path, bool write, std::string_view who) {
  std::error_code ec;
  if (!write && std::filesystem::is_directory(path, ec))
    throw failed_precondition_error(std::string(who) + ": " + path + " is a directory");
  std::FILE* f = std::fopen(path.c_str(), write ? "wb" : "rb");
  if (!f) {
    const int err = errno;
    const std::string text = std::string(who) + ": cannot open " + path + ": " + std::strerror(err);
    if (err == ENOENT)
      throw not_found_error(text);
    if (err == EACCES || err == EPERM)
      throw permission_denied_error(text);
    throw unavailable_error(text);
  }
  return std::unique_ptr<std::FILE, file_closer>(f);
}
} // namespace loom::data::detail

namespace loom::data {

LOOM_COMPILED_ONCE input_file::input_file(std::string path, compression c, std::string_view who)
    : path_(std::move(path)), file_(detail::open_file(path_, false, who)) {
  if (c != compression::none) {
    stream_ = std::make_unique<z_stream>();
    std::memset(stream_.get(), 0, sizeof(z_stream));
    if (inflateInit2(stream_.get(), detail::window_bits(c)) != Z_OK)
      throw internal_error("zlib: inflateInit2 failed for " + path_);
    compressed_.resize(compressed_buffer_bytes);
  }
  buffer_.resize(buffer_bytes);
}

LOOM_COMPILED_ONCE std::size_t input_file::read(std::string& out, std::size_t n) {
  std::size_t got = 0;
  while (got < n) {
    if (at_ == size_ && !refill())
      break;
    const std::size_t k = std::min(n - got, size_ - at_);
    out.append(buffer_.data() + at_, k);
    at_ += k;
    got += k;
  }
  offset_ += got;
  return got;
}

LOOM_COMPILED_ONCE bool input_file::read_line(std::string& line, bool keep_cr) {
  line.clear();
  bool any = false;
  for (;;) {
    if (at_ == size_ && !refill())
      break;
    any = true;
    const char* start = buffer_.data() + at_;
    const auto* nl = static_cast<const char*>(std::memchr(start, '\n', size_ - at_));
    const std::size_t k = nl ? static_cast<std::size_t>(nl - start) : size_ - at_;
    line.append(start, k);
    at_ += k;
    offset_ += k;
    if (nl) {
      ++at_;
      ++offset_;
      break;
    }
  }
  if (!keep_cr && !line.empty() && line.back() == '\r')
    line.pop_back();
  return any;
}

LOOM_COMPILED_ONCE void input_file::seek(std::uint64_t offset) {
  std::string sink;
  while (offset_ < offset) {
    sink.clear();
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(offset - offset_, 1 << 20));
    if (read(sink, n) < n)
      throw invalid_argument_error(path_ + ": a saved position at byte " + std::to_string(offset) +
                                   ", past the end of the file");
  }
}

LOOM_COMPILED_ONCE bool input_file::refill() {
  at_ = size_ = 0;
  if (!stream_) {
    size_ = std::fread(buffer_.data(), 1, buffer_.size(), file_.get());
    check_read();
    return size_ > 0;
  }
  while (size_ == 0 && !done_) {
    if (stream_->avail_in == 0) {
      const std::size_t n = std::fread(compressed_.data(), 1, compressed_.size(), file_.get());
      check_read();
      if (n == 0) {
        if (!started_ || ended_member_)
          done_ = true; // an empty file, or the end after a complete stream
        else
          throw data_loss_error(path_ + ": the compressed stream ends early, at byte " +
                                std::to_string(offset_) + " of its data");
        break;
      }
      stream_->next_in = reinterpret_cast<Bytef*>(compressed_.data());
      stream_->avail_in = static_cast<uInt>(n);
    }
    if (ended_member_) { // another gzip member follows (concatenated files)
      inflateReset(stream_.get());
      ended_member_ = false;
    }
    started_ = true;
    stream_->next_out = reinterpret_cast<Bytef*>(buffer_.data());
    stream_->avail_out = static_cast<uInt>(buffer_.size());
    const int rc = inflate(stream_.get(), Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
      throw data_loss_error(path_ + ": the compressed stream is corrupt near byte " +
                            std::to_string(offset_) + " of its data (" +
                            (stream_->msg ? stream_->msg : "zlib error") + ")");
    size_ = buffer_.size() - stream_->avail_out;
    if (rc == Z_STREAM_END)
      ended_member_ = true;
  }
  return size_ > 0;
}

LOOM_COMPILED_ONCE output_file::output_file(std::string path, compression c)
    : path_(std::move(path)), file_(detail::open_file(path_, true, "writing")) {
  if (c != compression::none) {
    stream_ = std::make_unique<z_stream>();
    std::memset(stream_.get(), 0, sizeof(z_stream));
    if (deflateInit2(stream_.get(), Z_DEFAULT_COMPRESSION, Z_DEFLATED, detail::window_bits(c), 8,
                     Z_DEFAULT_STRATEGY) != Z_OK)
      throw internal_error("zlib: deflateInit2 failed for " + path_);
  }
}

LOOM_COMPILED_ONCE void output_file::write(std::string_view bytes) {
  if (!file_)
    throw failed_precondition_error(path_ + ": written after close()");
  if (!stream_) {
    put(bytes.data(), bytes.size());
    return;
  }
  stream_->next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  stream_->avail_in = static_cast<uInt>(bytes.size());
  deflate_all(Z_NO_FLUSH);
}

LOOM_COMPILED_ONCE void output_file::close() {
  if (!file_)
    return;
  if (stream_) {
    deflate_all(Z_FINISH);
    deflateEnd(stream_.get());
    stream_.reset();
  }
  const bool ok = std::fflush(file_.get()) == 0 && !std::ferror(file_.get());
  file_.reset();
  if (!ok)
    throw unavailable_error(path_ + ": write failed: " + std::strerror(errno));
}

LOOM_COMPILED_ONCE void output_file::put(const char* p, std::size_t n) {
  if (n && std::fwrite(p, 1, n, file_.get()) != n)
    throw unavailable_error(path_ + ": write failed: " + std::strerror(errno));
}

LOOM_COMPILED_ONCE void output_file::deflate_all(int flush) {
  char out[64 << 10];
  for (;;) {
    stream_->next_out = reinterpret_cast<Bytef*>(out);
    stream_->avail_out = sizeof(out);
    const int rc = deflate(stream_.get(), flush);
    if (rc == Z_STREAM_ERROR)
      throw internal_error("zlib: deflate failed for " + path_);
    put(out, sizeof(out) - stream_->avail_out);
    // Without Z_FINISH, room left over means all input was taken.
    if (flush == Z_FINISH ? rc == Z_STREAM_END : stream_->avail_out != 0)
      return;
  }
}

} // namespace loom::data

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// tfrecord_dataset(files, compression) (TF's TFRecordDataset): the records of
// TFRecord files (core/tfrecord.hpp's framing), one file after another, each
// record a std::string (a serialized tf.Example, usually). Files are read as
// they are consumed, 256 KiB at a time (data/file_io.hpp), never whole.
//
// A record whose CRC does not match is a corrupt_record_error naming the file,
// the record's number and its byte offset; the iterator has moved past it, so
// an ignore_errors() downstream skips it and reading goes on. A length whose
// CRC does not match, or a file that ends inside a record, leaves nothing to
// read in that file: the error is thrown and the next file follows.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tfrecord.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/file_io.hpp>
#include <loom/data/iterator_state.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::data {

class tfrecord_dataset {
public:
  using element_type = std::string;

  explicit tfrecord_dataset(std::vector<std::string> files, compression c = compression::none)
      : files_(std::make_shared<const std::vector<std::string>>(std::move(files))),
        compression_(c) {}

  class iterator {
  public:
    explicit iterator(const tfrecord_dataset& d) : files_(d.files_), compression_(d.compression_) {}

    std::optional<std::string> next();

    // The file's number, its byte offset and its record's number.
    void save(std::ostream& out);
    void restore(std::istream& in);

  private:
    // Opens the current file; where it cannot, the error is thrown with the
    // iterator past it, so an ignore_errors() downstream goes on to the next.
    void open_current() {
      try {
        file_.emplace((*files_)[file_index_], compression_, "tfrecord_dataset");
      } catch (...) {
        ++file_index_;
        throw;
      }
    }
    void next_file() {
      file_.reset();
      ++file_index_;
    }

    // The file's next record; nullopt at its end.
    std::optional<std::string> read_record();

    std::shared_ptr<const std::vector<std::string>> files_;
    compression compression_;
    std::size_t file_index_ = 0;
    std::optional<input_file> file_;
    std::uint64_t record_ = 0;
    std::string header_, footer_;
  };

  iterator make_iterator() const { return iterator(*this); }

private:
  std::shared_ptr<const std::vector<std::string>> files_;
  compression compression_;
};

} // namespace loom::data

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::data {

LOOM_COMPILED_ONCE auto tfrecord_dataset::iterator::next() -> std::optional<std::string> {
  for (;;) {
    if (!file_) {
      if (file_index_ >= files_->size())
        return std::nullopt;
      open_current();
      record_ = 0;
    }
    std::optional<std::string> r;
    try {
      r = read_record();
    } catch (const corrupt_record_error&) {
      throw; // read_record moved on where it could not
    } catch (...) {
      next_file(); // an unreadable file or a corrupt stream: nothing more to read in it
      throw;
    }
    if (r)
      return r;
    next_file();
  }
}

LOOM_COMPILED_ONCE void tfrecord_dataset::iterator::save(std::ostream& out) {
  state::put_tag(out, "tfrecord");
  state::put_u64(out, file_index_);
  state::put_u64(out, file_ ? file_->offset() : 0);
  state::put_u64(out, record_);
}

LOOM_COMPILED_ONCE void tfrecord_dataset::iterator::restore(std::istream& in) {
  state::expect_tag(in, "tfrecord");
  file_index_ = static_cast<std::size_t>(state::get_u64(in));
  const std::uint64_t offset = state::get_u64(in);
  record_ = state::get_u64(in);
  file_.reset();
  if (file_index_ < files_->size()) {
    open_current();
    file_->seek(offset);
  }
}

LOOM_COMPILED_ONCE auto tfrecord_dataset::iterator::read_record() -> std::optional<std::string> {
  input_file& f = *file_;
  const std::uint64_t at = f.offset(), index = record_;
  // The error names the file, which next_file() closes: built first, so that a record read
  // well copies no name.
  const auto corrupt = [&](const std::string& why, bool readable_after) {
    corrupt_record_error e(f.path(), "record " + std::to_string(index) + " at byte " +
                                         std::to_string(at) + ": " + why);
    if (!readable_after)
      next_file();
    return e;
  };
  header_.clear();
  const std::size_t got = f.read(header_, tfrecord::header_bytes);
  if (got == 0)
    return std::nullopt;
  if (got < tfrecord::header_bytes)
    throw corrupt("the file ends inside the record's header", false);
  const std::string_view h(header_);
  if (tfrecord::masked_crc32c(h.substr(0, 8)) !=
      tfrecord::detail::read_le<std::uint32_t>(h.substr(8)))
    throw corrupt("the length's CRC does not match", false);
  const auto length = tfrecord::detail::read_le<std::uint64_t>(h);
  std::string data;
  // Grown as bytes arrive, never sized from the header alone.
  while (data.size() < length && f.read(data, static_cast<std::size_t>(std::min<std::uint64_t>(
                                                  length - data.size(), 1 << 20))) > 0) {
  }
  footer_.clear();
  if (data.size() < length || f.read(footer_, tfrecord::footer_bytes) < tfrecord::footer_bytes)
    throw corrupt("the file ends inside the record (" + std::to_string(length) + " bytes declared)",
                  false);
  ++record_;
  if (tfrecord::masked_crc32c(data) != tfrecord::detail::read_le<std::uint32_t>(footer_))
    throw corrupt("the data's CRC does not match", true);
  return data;
}

} // namespace loom::data

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

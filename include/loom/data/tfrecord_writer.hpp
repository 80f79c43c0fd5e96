// tfrecord_writer (TF's tf.io.TFRecordWriter): records framed as TFRecord
// (core/tfrecord.hpp), plain or through GZIP/ZLIB (TFRecordOptions), so that
// TensorFlow and tfrecord_dataset read them. close() finishes the file and
// reports a failed write; the destructor closes silently.
#pragma once

#include <loom/core/tfrecord.hpp>
#include <loom/data/file_io.hpp>

#include <string>
#include <string_view>
#include <utility>

namespace loom::data {

class tfrecord_writer {
public:
  explicit tfrecord_writer(std::string path, compression c = compression::none)
      : file_(std::move(path), c) {}

  void write(std::string_view record) { file_.write(tfrecord::frame(record)); }
  void close() { file_.close(); }

private:
  output_file file_;
};

} // namespace loom::data

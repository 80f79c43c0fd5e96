// MNIST and Fashion-MNIST (same file layout) as loom tensors, split the way
// TensorFlow's tutorials split them (input_data.read_data_sets), so that
// numbers reported against those tutorials are comparable.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/tensor.hpp>
#include <loom/data/idx.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace loom::data {

// Where the test machines keep Fashion-MNIST (the four .gz files as published).
inline constexpr std::string_view default_fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";

// Examples as rows. Copying a dataset is cheap: tensors share their buffers.
struct dataset {
  loom::tensor<float, 2> images;        // [n, rows * cols], pixels scaled to [0, 1]
  loom::tensor<std::int64_t, 1> labels; // [n], each in [0, num_classes)
  int num_classes = 10;
  std::int64_t image_rows = 28;
  std::int64_t image_cols = 28;

  std::int64_t size() const { return labels.dim(0); }
  std::int64_t feature_size() const { return images.dim(1); }
};

struct mnist_splits {
  dataset train, validation, test;
};

// [n] labels -> [n, num_classes] rows of 0 with a single 1.
LOOM_COMPILED_ONCE loom::tensor<float, 2> one_hot(const loom::tensor<std::int64_t, 1>& labels,
                                                  int num_classes);

namespace detail {

inline constexpr int mnist_num_classes = 10;

// Plain is tried first because it skips inflating; either form is accepted
// since people unpack the published .gz files as often as not.
LOOM_COMPILED_ONCE std::filesystem::path find_mnist_file(const std::filesystem::path& dir,
                                                         std::string_view base);

LOOM_COMPILED_ONCE idx_array read_mnist_images_idx(const std::filesystem::path& path);

LOOM_COMPILED_ONCE idx_array read_mnist_labels_idx(const std::filesystem::path& path);

LOOM_COMPILED_ONCE void check_same_count(const idx_array& images,
                                         const std::filesystem::path& ipath,
                                         const idx_array& labels,
                                         const std::filesystem::path& lpath);

// Examples [begin, end) of a checked image/label pair, decoded in one pass
// straight into the destination tensors so that no split costs a second copy.
LOOM_COMPILED_ONCE dataset decode_mnist(const idx_array& images, const idx_array& labels,
                                        std::int64_t begin, std::int64_t end);

} // namespace detail

// One split from an explicit image file and label file (gzipped or plain).
LOOM_COMPILED_ONCE dataset read_mnist_pair(const std::filesystem::path& images_path,
                                           const std::filesystem::path& labels_path);

// Reads the four standard files from `dir`. As in TF, the first
// `validation_size` training examples become the validation set and the rest
// the training set; the test set is the t10k files.
LOOM_COMPILED_ONCE mnist_splits read_mnist(
    const std::filesystem::path& dir = default_fashion_mnist_dir, int validation_size = 5000);

} // namespace loom::data

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::data {

LOOM_COMPILED_ONCE loom::tensor<float, 2> one_hot(const loom::tensor<std::int64_t, 1>& labels,
                                                  int num_classes) {
  if (num_classes <= 0)
    throw invalid_argument_error("one_hot: num_classes must be positive, got " +
                                 std::to_string(num_classes));
  const std::int64_t n = labels.dim(0);
  loom::tensor<float, 2> out(loom::shape{n, num_classes}, 0.f);
  const std::int64_t* src = labels.data();
  float* dst = out.data();
  for (std::int64_t i = 0; i < n; ++i) {
    if (src[i] < 0 || src[i] >= num_classes)
      throw invalid_argument_error("one_hot: label " + std::to_string(src[i]) + " at index " +
                                   std::to_string(i) + " is outside [0, " +
                                   std::to_string(num_classes) + ")");
    dst[i * num_classes + src[i]] = 1.f;
  }
  return out;
}
} // namespace loom::data

namespace loom::data::detail {

LOOM_COMPILED_ONCE std::filesystem::path find_mnist_file(const std::filesystem::path& dir,
                                                         std::string_view base) {
  std::error_code ec;
  const auto plain = dir / std::string(base);
  const auto gz = dir / (std::string(base) + ".gz");
  if (std::filesystem::is_regular_file(plain, ec))
    return plain;
  if (std::filesystem::is_regular_file(gz, ec))
    return gz;
  throw not_found_error("MNIST file " + std::string(base) + " not found in " + dir.string() +
                        " (looked for " + plain.string() + " and " + gz.string() + ")");
}

LOOM_COMPILED_ONCE idx_array read_mnist_images_idx(const std::filesystem::path& path) {
  idx_array a = read_idx(path);
  if (a.type != idx_ubyte || a.dims.size() != 3)
    throw data_loss_error("MNIST image file " + path.string() + " holds " +
                          std::string(idx_type_name(a.type)) + " " + idx_dims_string(a.dims) +
                          ", expected ubyte images of shape count x rows x cols");
  return a;
}

LOOM_COMPILED_ONCE idx_array read_mnist_labels_idx(const std::filesystem::path& path) {
  idx_array a = read_idx(path);
  if (a.type != idx_ubyte || a.dims.size() != 1)
    throw data_loss_error("MNIST label file " + path.string() + " holds " +
                          std::string(idx_type_name(a.type)) + " " + idx_dims_string(a.dims) +
                          ", expected a 1-D ubyte array of labels");
  for (std::size_t i = 0; i < a.bytes.size(); ++i)
    if (a.bytes[i] >= mnist_num_classes)
      throw data_loss_error("MNIST label file " + path.string() + " has label " +
                            std::to_string(a.bytes[i]) + " at index " + std::to_string(i) +
                            ", outside [0, " + std::to_string(mnist_num_classes) + ")");
  return a;
}

LOOM_COMPILED_ONCE void check_same_count(const idx_array& images,
                                         const std::filesystem::path& ipath,
                                         const idx_array& labels,
                                         const std::filesystem::path& lpath) {
  if (images.dims[0] != labels.dims[0])
    throw data_loss_error("MNIST files disagree on the number of examples: " + ipath.string() +
                          " has " + std::to_string(images.dims[0]) + " images but " +
                          lpath.string() + " has " + std::to_string(labels.dims[0]) + " labels");
}

LOOM_COMPILED_ONCE dataset decode_mnist(const idx_array& images, const idx_array& labels,
                                        std::int64_t begin, std::int64_t end) {
  dataset d;
  d.image_rows = images.dims[1];
  d.image_cols = images.dims[2];
  const std::int64_t n = end - begin, features = d.image_rows * d.image_cols;
  d.images = loom::tensor<float, 2>(loom::shape{n, features});
  d.labels = loom::tensor<std::int64_t, 1>(loom::shape{n});

  const std::uint8_t* px = images.bytes.data() + begin * features;
  float* dst = d.images.data();
  // TF computes float32(pixel) * float32(1/255), not pixel / 255; multiplying
  // by the same constant reproduces its values bit for bit (and 255 -> 1.0f).
  constexpr float scale = static_cast<float>(1.0 / 255.0);
  const std::int64_t total = n * features;
  for (std::int64_t i = 0; i < total; ++i)
    dst[i] = static_cast<float>(px[i]) * scale;

  const std::uint8_t* lb = labels.bytes.data() + begin;
  std::int64_t* ldst = d.labels.data();
  for (std::int64_t i = 0; i < n; ++i)
    ldst[i] = lb[i];
  return d;
}
} // namespace loom::data::detail

namespace loom::data {

LOOM_COMPILED_ONCE dataset read_mnist_pair(const std::filesystem::path& images_path,
                                           const std::filesystem::path& labels_path) {
  const idx_array images = detail::read_mnist_images_idx(images_path);
  const idx_array labels = detail::read_mnist_labels_idx(labels_path);
  detail::check_same_count(images, images_path, labels, labels_path);
  return detail::decode_mnist(images, labels, 0, images.dims[0]);
}

LOOM_COMPILED_ONCE mnist_splits read_mnist(const std::filesystem::path& dir, int validation_size) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw not_found_error("MNIST directory " + dir.string() + " does not exist");
  const auto train_images_path = detail::find_mnist_file(dir, "train-images-idx3-ubyte");
  const auto train_labels_path = detail::find_mnist_file(dir, "train-labels-idx1-ubyte");
  const auto test_images_path = detail::find_mnist_file(dir, "t10k-images-idx3-ubyte");
  const auto test_labels_path = detail::find_mnist_file(dir, "t10k-labels-idx1-ubyte");

  mnist_splits out;
  {
    const idx_array images = detail::read_mnist_images_idx(train_images_path);
    const idx_array labels = detail::read_mnist_labels_idx(train_labels_path);
    detail::check_same_count(images, train_images_path, labels, train_labels_path);
    const std::int64_t n = images.dims[0];
    if (validation_size < 0 || validation_size > n)
      throw invalid_argument_error("read_mnist: validation_size must be between 0 and " +
                                   std::to_string(n) + " (the number of training examples in " +
                                   train_images_path.string() + "), got " +
                                   std::to_string(validation_size));
    out.validation = detail::decode_mnist(images, labels, 0, validation_size);
    out.train = detail::decode_mnist(images, labels, validation_size, n);
  }
  out.test = read_mnist_pair(test_images_path, test_labels_path);
  if (out.test.image_rows != out.train.image_rows || out.test.image_cols != out.train.image_cols)
    throw data_loss_error(
        "MNIST files disagree on the image size: " + train_images_path.string() + " has " +
        std::to_string(out.train.image_rows) + "x" + std::to_string(out.train.image_cols) +
        " images but " + test_images_path.string() + " has " + std::to_string(out.test.image_rows) +
        "x" + std::to_string(out.test.image_cols));
  return out;
}

} // namespace loom::data

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

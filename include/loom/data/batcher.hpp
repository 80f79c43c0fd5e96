// Minibatches over a dataset with the semantics of TF's DataSet.next_batch, and
// a synthetic dataset for tests that cannot rely on MNIST being installed.
// Randomness comes from data/random.hpp (why: see there).
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/tensor.hpp>
#include <loom/data/mnist.hpp>
#include <loom/data/random.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace loom::data {

// What next_batch gives (named apart from the pipeline's batch() transformation).
struct minibatch {
  loom::tensor<float, 2> images;         // [batch_size, features]
  loom::tensor<float, 2> labels_one_hot; // [batch_size, num_classes]
  loom::tensor<std::int64_t, 1> labels;  // [batch_size]
};

class batcher {
public:
  // The dataset is held by value, which shares its tensors' buffers rather
  // than copying them and keeps them alive as long as the batcher.
  batcher(const dataset& data, std::int64_t batch_size, std::uint64_t seed, bool shuffle = true);

  // The next batch_size examples. A batch that crosses the end of an epoch
  // takes the rest of that epoch followed by the start of the next (freshly
  // shuffled) one, so every example appears exactly once per epoch.
  minibatch next_batch();

  // As in TF, an epoch counts as completed when the batch after its last
  // example is drawn, not when its last example is.
  std::int64_t epochs_completed() const noexcept { return epochs_completed_; }
  std::int64_t examples_seen() const noexcept { return examples_seen_; }
  std::int64_t index_in_epoch() const noexcept { return index_in_epoch_; }
  std::int64_t batch_size() const noexcept { return batch_size_; }
  std::int64_t num_examples() const noexcept { return static_cast<std::int64_t>(order_.size()); }
  // The current epoch's order: position i of the epoch is example order()[i].
  const std::vector<std::int64_t>& order() const noexcept { return order_; }
  const dataset& data() const noexcept { return data_; }

private:
  dataset data_;
  std::int64_t batch_size_;
  bool shuffle_;
  std::mt19937_64 rng_;
  std::vector<std::int64_t> order_;
  std::int64_t index_in_epoch_ = 0;
  std::int64_t epochs_completed_ = 0;
  std::int64_t examples_seen_ = 0;
};

// n MNIST-shaped examples (784 features in [0, 1], 10 classes) for tests and
// benchmarks without the real files. Each class has a random prototype image
// and each example is 0.6 * its class prototype + 0.4 * uniform noise, so the
// classes are well separated (a linear model or nearest centroid reaches
// near-perfect accuracy) while examples still differ. Same seed, same data,
// on every platform.
LOOM_COMPILED_ONCE dataset make_synthetic(std::int64_t n, std::uint64_t seed);

} // namespace loom::data

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::data {

LOOM_COMPILED_ONCE batcher::batcher(const dataset& data, std::int64_t batch_size,
                                    std::uint64_t seed, bool shuffle)
    : data_(data), batch_size_(batch_size), shuffle_(shuffle), rng_(seed) {
  const std::int64_t n = data_.labels.dim(0);
  if (data_.images.dim(0) != n)
    throw invalid_argument_error("batcher: dataset has " + std::to_string(data_.images.dim(0)) +
                                 " images but " + std::to_string(n) + " labels");
  if (batch_size <= 0)
    throw invalid_argument_error("batcher: batch_size must be positive, got " +
                                 std::to_string(batch_size));
  if (batch_size > n)
    throw invalid_argument_error("batcher: batch_size " + std::to_string(batch_size) +
                                 " exceeds the dataset size " + std::to_string(n));
  if (data_.num_classes <= 0)
    throw invalid_argument_error("batcher: dataset num_classes must be positive, got " +
                                 std::to_string(data_.num_classes));
  // Checked once here so that next_batch cannot fail halfway through a batch.
  const std::int64_t* labels = data_.labels.data();
  for (std::int64_t i = 0; i < n; ++i)
    if (labels[i] < 0 || labels[i] >= data_.num_classes)
      throw invalid_argument_error("batcher: label " + std::to_string(labels[i]) + " of example " +
                                   std::to_string(i) + " is outside [0, " +
                                   std::to_string(data_.num_classes) + ")");
  order_.resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    order_[static_cast<std::size_t>(i)] = i;
  // TF shuffles the first epoch lazily on the first call; nothing else draws
  // from the generator in between, so doing it now gives the same order.
  if (shuffle_)
    shuffle_in_place(order_, rng_);
}

LOOM_COMPILED_ONCE auto batcher::next_batch() -> minibatch {
  const std::int64_t n = num_examples(), features = data_.images.dim(1);
  const int k = data_.num_classes;
  minibatch b{loom::tensor<float, 2>(loom::shape{batch_size_, features}),
              loom::tensor<float, 2>(loom::shape{batch_size_, k}, 0.f),
              loom::tensor<std::int64_t, 1>(loom::shape{batch_size_})};
  const float* src = data_.images.data();
  const std::int64_t* src_labels = data_.labels.data();
  float* dst = b.images.data();
  float* dst_one_hot = b.labels_one_hot.data();
  std::int64_t* dst_labels = b.labels.data();

  std::int64_t row = 0;
  const auto take = [&](std::int64_t from, std::int64_t to) {
    for (std::int64_t i = from; i < to; ++i, ++row) {
      const std::int64_t ex = order_[static_cast<std::size_t>(i)];
      if (features > 0)
        std::memcpy(dst + row * features, src + ex * features,
                    static_cast<std::size_t>(features) * sizeof(float));
      dst_labels[row] = src_labels[ex];
      dst_one_hot[row * k + src_labels[ex]] = 1.f;
    }
  };

  const std::int64_t start = index_in_epoch_;
  if (start + batch_size_ > n) {
    ++epochs_completed_;
    take(start, n);
    if (shuffle_)
      shuffle_in_place(order_, rng_);
    index_in_epoch_ = batch_size_ - (n - start);
    take(0, index_in_epoch_);
  } else {
    index_in_epoch_ = start + batch_size_;
    take(start, index_in_epoch_);
  }
  examples_seen_ += batch_size_;
  return b;
}

LOOM_COMPILED_ONCE dataset make_synthetic(std::int64_t n, std::uint64_t seed) {
  constexpr std::int64_t features = 784;
  constexpr int classes = 10;
  if (n < 0)
    throw invalid_argument_error("make_synthetic: n must be non-negative, got " +
                                 std::to_string(n));
  if (n > (std::int64_t{1} << 40) / features)
    throw invalid_argument_error("make_synthetic: n = " + std::to_string(n) +
                                 " examples would not fit in memory");
  std::mt19937_64 rng(seed);
  std::vector<float> prototypes(static_cast<std::size_t>(classes * features));
  for (auto& p : prototypes)
    p = uniform_unit(rng);

  dataset d;
  d.num_classes = classes;
  d.images = loom::tensor<float, 2>(loom::shape{n, features});
  d.labels = loom::tensor<std::int64_t, 1>(loom::shape{n});
  float* img = d.images.data();
  std::int64_t* lab = d.labels.data();
  for (std::int64_t i = 0; i < n; ++i) {
    const auto c = static_cast<std::int64_t>(uniform_below(rng, classes));
    lab[i] = c;
    const float* proto = prototypes.data() + c * features;
    float* row = img + i * features;
    for (std::int64_t j = 0; j < features; ++j)
      row[j] = 0.6f * proto[j] + 0.4f * uniform_unit(rng);
  }
  return d;
}

} // namespace loom::data

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

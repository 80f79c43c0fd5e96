// The seed's mnist.train.next_batch(batch_size) as an input pipeline: a split's
// examples in batches of (images [b, 784], one-hot labels [b, 10]), reshuffled at
// each epoch with the worker's seed and repeated, so a batch may span two epochs as
// next_batch's does. The pipeline shuffles the examples' numbers, not the images
// (a buffer of 55 000 ids rather than of 172 MB of image copies), and a map gathers
// each batch's rows on the pipeline's own thread while the step before it runs.
#pragma once

#include <loom/data/batch.hpp>
#include <loom/data/map.hpp>
#include <loom/data/mnist.hpp>
#include <loom/data/prefetch.hpp>
#include <loom/data/range.hpp>
#include <loom/data/repeat.hpp>
#include <loom/data/shuffle.hpp>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <utility>

namespace loom::examples {

inline auto mnist_batches(const data::dataset& split, std::int64_t batch_size, std::uint64_t seed) {
  const std::int64_t n = split.labels.dim(0);
  auto gather = [split](const tensor<std::int64_t, 1>& ids) {
    const std::int64_t b = ids.size();
    const std::int64_t width = split.images.dim(1);
    tensor<float, 2> images(shape{b, width});
    tensor<std::int64_t, 1> labels(shape{b});
    for (std::int64_t i = 0; i < b; ++i) {
      std::copy_n(split.images.data() + ids(i) * width, width, images.data() + i * width);
      labels(i) = split.labels(ids(i));
    }
    return std::tuple{std::move(images), data::one_hot(labels, 10)}; // 10 classes
  };
  return data::range(0, n) | data::shuffle(n, seed) | data::repeat() | data::batch(batch_size) |
         data::map(std::move(gather)) | data::prefetch(2);
}

} // namespace loom::examples

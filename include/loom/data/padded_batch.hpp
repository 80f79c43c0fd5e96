// padded_batch(batch_size, drop_remainder) (TF's Dataset.padded_batch with its
// default padded_shapes and padding_values): as batch, but tensors of one rank
// and different shapes are padded to the largest of each dimension in the
// batch, with 0 (numbers) or "" (strings). Fixed padded shapes and other
// padding values are not offered.
#pragma once

#include <loom/data/batch.hpp>
#include <loom/data/dataset.hpp>

#include <cstdint>
#include <utility>

namespace loom::data {

struct padded_batch_stage {
  std::int64_t batch_size;
  bool drop_remainder;
  template <dataset_recipe D> detail::stacking_dataset<D> apply(D input) const {
    return {std::move(input), batch_size, drop_remainder, true};
  }
};

inline padded_batch_stage padded_batch(std::int64_t batch_size, bool drop_remainder = false) {
  return {batch_size, drop_remainder};
}

} // namespace loom::data

// The host-side part of the index kernels that the CPU kernels
// (kernels/cpu/array.hpp) and the GPU kernels share: the checks of ids and
// shapes, with their messages, and the layouts they imply. Host code only.
#pragma once

#include <loom/graph/ops/array.hpp>
#include <loom/kernels/registry.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace loom::detail {

// A tensor seen as [outer, count, inner] around one axis.
struct axis_layout {
  std::int64_t outer = 1, count = 1, inner = 1;
};

inline axis_layout layout_around(const loom::shape& s, int axis) {
  axis_layout l;
  for (int a = 0; a < s.rank(); ++a)
    (a < axis ? l.outer : a == axis ? l.count : l.inner) *= s[a];
  return l;
}

// Calls f(const I* ids) with the ids' element type.
template <class F> decltype(auto) with_ids(const any_tensor& ids, F&& f) {
  if (ids.type() == dtype::i32)
    return f(ids.data<std::int32_t>());
  return f(ids.data<std::int64_t>());
}

// The first id outside [0, limit) (negative ones allowed where `negative_ok`),
// as an error naming the node, what the ids index, the id and its position;
// none: nothing is thrown. Checked before anything is written.
template <class I>
void check_id_range(const node_def& n, const I* ids, std::int64_t count, std::int64_t limit,
                    bool negative_ok, const std::string& what) {
  for (std::int64_t k = 0; k < count; ++k) {
    const auto id = static_cast<std::int64_t>(ids[k]);
    if ((id < 0 && !negative_ok) || id >= limit)
      throw invalid_argument_error("node " + n.describe() + ": id " + std::to_string(id) +
                                   " (at position " + std::to_string(k) + ") is outside [0, " +
                                   std::to_string(limit) + ") of " + what);
  }
}

// The params of a gather: of rank above the axis (a fed placeholder may have
// any shape its type allows).
inline axis_layout gather_layout(const node_def& n, const any_tensor& params, int axis) {
  if (params.rank() <= axis)
    throw invalid_argument_error("node " + n.describe() + ": params of shape " +
                                 params.shape().to_string() + " have no axis " +
                                 std::to_string(axis));
  return layout_around(params.shape(), axis);
}

// values of an indexed_slices must be dense_shape gathered at the indices.
inline void check_slices(const node_def& n, const any_tensor& values, const any_tensor& indices,
                         const loom::shape& dense, int axis) {
  const loom::shape want = gathered_shape(dense, indices.shape(), axis);
  if (!(values.shape() == want))
    throw invalid_argument_error("node " + n.describe() + ": values of shape " +
                                 values.shape().to_string() + " do not match indices of shape " +
                                 indices.shape().to_string() + " into " + dense.to_string() +
                                 " (expected " + want.to_string() + ")");
}

// data of an unsorted_segment_sum begins with the segment ids' shape; the
// output is [num_segments] + the rest of data's shape.
inline loom::shape segment_sum_shape(const node_def& n, const any_tensor& data,
                                     const any_tensor& ids, std::int64_t num_segments) {
  if (num_segments < 0)
    throw invalid_argument_error("node " + n.describe() + ": the number of segments is " +
                                 std::to_string(num_segments) + "; it must be 0 or more");
  const int k = ids.rank();
  bool fits = data.rank() >= k;
  for (int a = 0; fits && a < k; ++a)
    fits = data.shape()[a] == ids.shape()[a];
  if (!fits)
    throw invalid_argument_error("node " + n.describe() + ": data of shape " +
                                 data.shape().to_string() + " must begin with the segment ids' " +
                                 "shape " + ids.shape().to_string());
  std::vector<std::int64_t> d{num_segments};
  d.insert(d.end(), data.shape().dims().begin() + k, data.shape().dims().end());
  return loom::shape(std::move(d));
}

// The inputs of a concat agree on every dimension but the axis; the output's shape.
inline loom::shape concat_shape(const node_def& n, std::span<const any_tensor* const> in,
                                int axis) {
  const loom::shape& first = in[0]->shape();
  std::vector<std::int64_t> d = first.dims();
  d[static_cast<std::size_t>(axis)] = 0;
  for (const any_tensor* x : in) {
    bool fits = x->rank() == first.rank();
    for (int a = 0; fits && a < first.rank(); ++a)
      fits = a == axis || x->shape()[a] == first[a];
    if (!fits)
      throw invalid_argument_error("node " + n.describe() + ": cannot join shapes " +
                                   first.to_string() + " and " + x->shape().to_string() +
                                   " along axis " + std::to_string(axis));
    d[static_cast<std::size_t>(axis)] += x->shape()[axis];
  }
  return loom::shape(std::move(d));
}

} // namespace loom::detail

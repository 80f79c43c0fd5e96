// The one plan the strided ops' kernels run (graph/ops/strided.hpp), on the CPU
// (kernels/cpu/strided.hpp) and the GPU (kernels/cuda/strided.cuh): a strided copy.
// transpose, strided_slice and tile read their input through strides (a gather), and
// strided_slice_grad and pad write it through strides into a filled output (a scatter).
// Host code only, so nvcc compiles it too.
#pragma once

#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/graph/ops/strided.hpp>

#include <cstdint>
#include <vector>

namespace loom::kernels {

// For every index (i_0, ..., i_{k-1}) of the iteration space `count` (row-major):
// dst[dst_base + sum i_d dst_stride_d] = src[src_base + sum i_d src_stride_d]
// (elements, not bytes; a stride may be 0 or negative).
struct strided_copy {
  std::vector<std::int64_t> count, src_stride, dst_stride;
  std::int64_t src_base = 0, dst_base = 0;

  std::int64_t total() const {
    std::int64_t n = 1;
    for (std::int64_t c : count)
      n *= c;
    return n;
  }

  // The same copy over the fewest dimensions: a dimension of 1 is dropped, and one
  // that continues the next in both tensors is merged into it. A transpose of a
  // [64, 128, 16] tensor by (1, 0, 2) is a copy of 16-element rows; a contiguous
  // slice of rows is one run.
  strided_copy& coalesce() {
    strided_copy c;
    for (std::size_t d = 0; d < count.size(); ++d) {
      if (count[d] == 1)
        continue;
      if (count[d] == 0)
        return *this = strided_copy{{0}, {1}, {1}, 0, 0};
      if (!c.count.empty() && c.src_stride.back() == src_stride[d] * count[d] &&
          c.dst_stride.back() == dst_stride[d] * count[d]) {
        c.count.back() *= count[d];
        c.src_stride.back() = src_stride[d];
        c.dst_stride.back() = dst_stride[d];
      } else {
        c.count.push_back(count[d]);
        c.src_stride.push_back(src_stride[d]);
        c.dst_stride.push_back(dst_stride[d]);
      }
    }
    if (c.count.empty()) { // one element (every dimension 1)
      c.count = {1};
      c.src_stride = {1};
      c.dst_stride = {1};
    }
    c.src_base = src_base;
    c.dst_base = dst_base;
    return *this = std::move(c);
  }
};

// Row-major element strides of a shape.
inline std::vector<std::int64_t> strides_of(const loom::shape& s) {
  std::vector<std::int64_t> st(static_cast<std::size_t>(s.rank()), 1);
  for (int d = s.rank() - 2; d >= 0; --d)
    st[static_cast<std::size_t>(d)] = st[static_cast<std::size_t>(d) + 1] * s[d + 1];
  return st;
}

// transpose: the output in order, each element read through x's permuted strides.
inline strided_copy transpose_copy(const loom::shape& x, const std::vector<int>& perm) {
  const auto xs = strides_of(x);
  strided_copy c;
  for (int p : perm) {
    c.count.push_back(x[p]);
    c.src_stride.push_back(xs[static_cast<std::size_t>(p)]);
  }
  c.dst_stride = strides_of(loom::shape(c.count));
  return c.coalesce();
}

// The elements a resolved strided_slice takes from x, in x's coordinates: gathered
// into a contiguous output (forward) or scattered into x's shape (its gradient).
inline strided_copy slice_copy(const loom::shape& x, const detail::resolved_slice& r,
                               bool scatter) {
  const auto xs = strides_of(x);
  strided_copy c;
  std::int64_t base = 0;
  for (std::size_t d = 0; d < xs.size(); ++d) {
    c.count.push_back(r.count[d]);
    base += r.start[d] * xs[d];
    (scatter ? c.dst_stride : c.src_stride).push_back(r.step[d] * xs[d]);
  }
  (scatter ? c.src_stride : c.dst_stride) = strides_of(loom::shape(c.count));
  (scatter ? c.dst_base : c.src_base) = base;
  return c.coalesce();
}

// pad: x scattered into the padded output, each dimension from its `before`.
inline strided_copy pad_copy(const loom::shape& x, const loom::shape& out,
                             const std::vector<std::int64_t>& paddings) {
  const auto os = strides_of(out);
  strided_copy c{x.dims(), strides_of(x), os, 0, 0};
  for (std::size_t d = 0; d < os.size(); ++d)
    c.dst_base += paddings[2 * d] * os[d];
  return c.coalesce();
}

// tile: the output seen as [m_0, d_0, m_1, d_1, ...] in order, reading x's element
// (i_1, i_3, ...): stride 0 along each multiple.
inline strided_copy tile_copy(const loom::shape& x, const std::vector<std::int64_t>& multiples) {
  const auto xs = strides_of(x);
  strided_copy c;
  for (std::size_t d = 0; d < xs.size(); ++d) {
    c.count.insert(c.count.end(), {multiples[d], x[static_cast<int>(d)]});
    c.src_stride.insert(c.src_stride.end(), {0, xs[d]});
  }
  c.dst_stride = strides_of(loom::shape(c.count));
  return c.coalesce();
}

// The most dimensions a strided copy has after coalescing: tile's 2 per dimension of
// an input of rank 8 (TF's kernels go to rank 8 too).
inline constexpr int max_strided_dims = 16;

inline void check_strided_rank(const node_def& n, const loom::shape& x) {
  if (x.rank() > max_strided_dims / 2)
    throw invalid_argument_error("node " + n.describe() + ": input of shape " + x.to_string() +
                                 " has rank " + std::to_string(x.rank()) + "; " + n.op +
                                 " handles rank " + std::to_string(max_strided_dims / 2) +
                                 " at most");
}

// dy must have the shape of the slice it is the gradient of.
inline void check_slice_grad(const node_def& n, const any_tensor& dy,
                             const detail::resolved_slice& r) {
  if (dy.shape() != r.out)
    throw invalid_argument_error("node " + n.describe() + ": dy of shape " +
                                 dy.shape().to_string() + " is not the slice's shape " +
                                 r.out.to_string());
}

// strided_slice_grad's x shape: its second input's, else its "shape" attribute.
struct slice_grad_attrs {
  detail::strided_slice_attrs slice;
  std::vector<std::int64_t> shape;
  explicit slice_grad_attrs(const node_def& n)
      : slice(n), shape(n.attr_or<std::vector<std::int64_t>>("shape", {})) {}
};

} // namespace loom::kernels

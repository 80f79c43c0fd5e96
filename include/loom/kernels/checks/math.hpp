// The host-side part of the non-elementwise math kernels that the CPU kernels
// (kernels/cpu/math.hpp) and the GPU kernels (kernels/cuda/math.cuh) share:
// argument checks, with their messages, and the output shapes and layouts
// they imply. Host code only (no Eigen evaluation), so nvcc compiles it too.
#pragma once

#include <loom/graph/ops/math.hpp>
#include <loom/graph/ops/matmul.hpp>
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace loom::kernels {

// -- matmul, xw_plus_b --------------------------------------------------------------

// The shape [m, n] of op(a) op(b), once both are matrices whose inner dimensions agree.
inline loom::shape matmul_shape(const node_def& n, const any_tensor& a, const any_tensor& b,
                                bool ta, bool tb) {
  if (a.rank() != 2 || b.rank() != 2)
    throw invalid_argument_error("node " + n.describe() + ": needs rank-2 operands, got " +
                                 a.shape().to_string() + " x " + b.shape().to_string());
  if (a.shape()[ta ? 0 : 1] != b.shape()[tb ? 1 : 0])
    throw invalid_argument_error(detail::inner_dims_message(n, a.shape(), b.shape(), ta, tb));
  return loom::shape{a.shape()[ta ? 1 : 0], b.shape()[tb ? 0 : 1]};
}

// The shape of x w + b, once x and w multiply and b has one value per column of w.
inline loom::shape xw_plus_b_shape(const node_def& n, const any_tensor& x, const any_tensor& w,
                                   const any_tensor& b) {
  if (x.rank() != 2 || w.rank() != 2 || b.rank() != 1)
    throw invalid_argument_error("node " + n.describe() +
                                 ": needs x, w, b of ranks 2, 2 "
                                 "and 1, got " +
                                 x.shape().to_string() + ", " + w.shape().to_string() + " and " +
                                 b.shape().to_string());
  if (x.shape()[1] != w.shape()[0])
    throw invalid_argument_error(detail::inner_dims_message(n, x.shape(), w.shape(), false, false));
  if (b.shape()[0] != w.shape()[1])
    throw invalid_argument_error(
        "node " + n.describe() + ": the bias of shape " + b.shape().to_string() +
        " does not match the columns of the weights of shape " + w.shape().to_string());
  return loom::shape{x.shape()[0], w.shape()[1]};
}

// -- add_n --------------------------------------------------------------------------

// The shape of add_n's sum, once every input has input 0's dtype and shape (TF's AddN
// broadcasts nothing).
inline loom::shape add_n_shape(const node_def& n, std::span<const any_tensor* const> xs) {
  if (xs.empty())
    throw invalid_argument_error("node " + n.describe() + ": add_n needs an input");
  const any_tensor& first = *xs.front();
  for (std::size_t i = 1; i < xs.size(); ++i)
    if (xs[i]->type() != first.type() || xs[i]->shape() != first.shape())
      throw invalid_argument_error(
          "node " + n.describe() + ": input " + std::to_string(i) + " is " +
          std::string(to_string(xs[i]->type())) + xs[i]->shape().to_string() + " but input 0 is " +
          std::string(to_string(first.type())) + first.shape().to_string() +
          "; add_n sums tensors of one dtype and shape");
  return first.shape();
}

// -- reductions ---------------------------------------------------------------------

// What a reduction (reduce_sum, _mean, _max, _min, _prod, _any, _all) reduces, from the node's
// "axes" and "keepdims": the reduced axes of the input and the output's shape.
struct reduction_axes {
  std::vector<char> mask;
  loom::shape out;
};

inline reduction_axes reduction_of(const node_def& n, const loom::shape& in) {
  reduction_axes r;
  r.mask = detail::reduction_mask(n, in, n.attr_or<std::vector<std::int64_t>>("axes", {}));
  r.out = detail::reduced_shape(in, r.mask, n.attr_or<bool>("keepdims", false));
  return r;
}

// What reduce_grad broadcasts back: the axes the forward reduction reduced
// (of `to`, its input's shape) and how many elements each output summed,
// once dy has one element per output.
struct reduce_grad_axes {
  std::vector<char> mask;
  std::int64_t count = 0;
};

inline reduce_grad_axes reduce_grad_of(const node_def& n, const any_tensor& dy,
                                       const loom::shape& to) {
  reduce_grad_axes r;
  r.mask = detail::reduction_mask(n, to, n.attr_or<std::vector<std::int64_t>>("axes", {}));
  const loom::shape kept = detail::reduced_shape(to, r.mask, true);
  if (dy.num_elements() != kept.num_elements())
    throw invalid_argument_error("node " + n.describe() + ": the gradient of shape " +
                                 dy.shape().to_string() + " does not match a reduction of shape " +
                                 to.to_string());
  r.count = kept.num_elements() == 0 ? 0 : to.num_elements() / kept.num_elements();
  return r;
}

// The input's dimensions merged into alternating runs of kept and reduced
// ones; dimensions of size 1 are dropped, as they change no element's position.
struct reduction_runs {
  std::vector<std::int64_t> dims;
  std::vector<char> reduced;
  bool any_reduced() const { return std::find(reduced.begin(), reduced.end(), 1) != reduced.end(); }
};

inline reduction_runs merge_runs(const loom::shape& s, const std::vector<char>& mask) {
  reduction_runs r;
  for (int i = 0; i < s.rank(); ++i) {
    const std::int64_t d = s[i];
    if (d == 1)
      continue;
    const char red = mask[static_cast<std::size_t>(i)];
    if (!r.dims.empty() && r.reduced.back() == red)
      r.dims.back() *= d;
    else {
      r.dims.push_back(d);
      r.reduced.push_back(red);
    }
  }
  return r;
}

// An input walked as [kept runs..., reduced runs...] with its own strides (row-major
// elements): output o (row-major over the kept runs, dy's order) reads the elements at
// offset(o, kept) + offset(j, reduced) for j below `count`. reduce_prod_grad walks x so on
// both devices.
struct reduction_walk {
  std::vector<std::int64_t> kept_dims, kept_strides, red_dims, red_strides;
  std::int64_t outputs = 1, count = 1;
};

inline reduction_walk walk_of(const loom::shape& x, const std::vector<char>& mask) {
  const reduction_runs runs = merge_runs(x, mask);
  reduction_walk w;
  std::vector<std::int64_t> strides(runs.dims.size());
  std::int64_t stride = 1;
  for (std::size_t k = runs.dims.size(); k-- > 0;) {
    strides[k] = stride;
    stride *= runs.dims[k];
  }
  for (std::size_t k = 0; k < runs.dims.size(); ++k) {
    auto& dims = runs.reduced[k] ? w.red_dims : w.kept_dims;
    auto& st = runs.reduced[k] ? w.red_strides : w.kept_strides;
    dims.push_back(runs.dims[k]);
    st.push_back(strides[k]);
    (runs.reduced[k] ? w.count : w.outputs) *= runs.dims[k];
  }
  if (x.num_elements() == 0)
    w.outputs = w.count = 0;
  return w;
}

// The offset of element i of a row-major walk over `dims` with `strides`.
inline std::int64_t walk_offset(std::int64_t i, const std::vector<std::int64_t>& dims,
                                const std::vector<std::int64_t>& strides) {
  std::int64_t off = 0;
  for (std::size_t k = dims.size(); k-- > 0;) {
    const std::int64_t q = i / dims[k];
    off += (i - q * dims[k]) * strides[k];
    i = q;
  }
  return off;
}

// reduce_prod_grad's dy must have one element per output of the reduction of x.
inline reduction_walk reduce_prod_grad_of(const node_def& n, const any_tensor& dy,
                                          const loom::shape& x) {
  const auto mask = detail::reduction_mask(n, x, n.attr_or<std::vector<std::int64_t>>("axes", {}));
  if (dy.num_elements() != detail::reduced_shape(x, mask, true).num_elements())
    throw invalid_argument_error("node " + n.describe() + ": the gradient of shape " +
                                 dy.shape().to_string() + " does not match a reduction of shape " +
                                 x.to_string());
  return walk_of(x, mask);
}

// argmax / argmin of an input seen as [outer, size, inner], `size` along the
// node's "axis": the output's shape and the three extents. An empty axis is
// an error only when there are outputs to give.
struct arg_reduction_layout {
  loom::shape out;
  std::int64_t outer = 1, size = 0, inner = 1;
};

inline arg_reduction_layout arg_reduction_of(const node_def& n, const loom::shape& in) {
  const int axis = detail::normalize_axis(n, in, n.attr<std::int64_t>("axis"));
  std::vector<char> mask(static_cast<std::size_t>(in.rank()), 0);
  mask[static_cast<std::size_t>(axis)] = 1;
  arg_reduction_layout l;
  l.out = detail::reduced_shape(in, mask, false);
  for (int k = 0; k < axis; ++k)
    l.outer *= in[k];
  for (int k = axis + 1; k < in.rank(); ++k)
    l.inner *= in[k];
  l.size = in[axis];
  if (l.outer * l.inner != 0 && l.size == 0)
    throw invalid_argument_error("node " + n.describe() + ": axis " + std::to_string(axis) +
                                 " of the input of shape " + in.to_string() + " is empty");
  return l;
}

} // namespace loom::kernels

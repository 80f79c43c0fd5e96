// The host-side part of gather_nd's kernels that the CPU's (kernels/cpu/gather_nd.hpp) and the
// GPU's (kernels/cuda/gather_nd.cuh) share: each index tuple checked against params' shape and
// turned into the number of the slice it names, with TF's message for a tuple outside params.
// Host code only, so nvcc compiles it too.
#pragma once

#include <loom/graph/ops/gather_nd.hpp>
#include <loom/kernels/checks/array.hpp>
#include <loom/kernels/registry.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace loom::kernels {

// params seen as [slices, slice]: the tuples of `depth` indices name one of `slices` slices
// of `slice` elements each.
struct gather_nd_layout {
  std::int64_t tuples = 0, depth = 0, slices = 1, slice = 1;
  loom::shape out;
};

inline gather_nd_layout gather_nd_layout_of(const node_def& n, const loom::shape& params,
                                            const loom::shape& indices) {
  gather_nd_layout l;
  l.out = detail::gather_nd_shape(n, params, indices);
  l.depth = indices[indices.rank() - 1];
  l.tuples = indices.num_elements() / (l.depth > 0 ? l.depth : 1);
  if (l.depth == 0)
    l.tuples =
        loom::shape(std::vector<std::int64_t>(indices.dims().begin(), indices.dims().end() - 1))
            .num_elements();
  for (int a = 0; a < params.rank(); ++a)
    (a < l.depth ? l.slices : l.slice) *= params[a];
  return l;
}

// The slice each tuple names (row-major over params' first `depth` dimensions), every tuple
// checked first: one outside params is TF's error, naming the tuple's position in indices and
// its values, e.g. "indices[1, 0] = [4, 0] does not index into params of shape [3, 2]".
template <class I>
std::vector<std::int64_t> gather_nd_slices(const node_def& n, const I* idx,
                                           const loom::shape& indices, const loom::shape& params,
                                           const gather_nd_layout& l) {
  std::vector<std::int64_t> rows(static_cast<std::size_t>(l.tuples));
  for (std::int64_t t = 0; t < l.tuples; ++t) {
    std::int64_t row = 0;
    for (std::int64_t j = 0; j < l.depth; ++j) {
      const auto v = static_cast<std::int64_t>(idx[t * l.depth + j]);
      const std::int64_t dim = params[static_cast<int>(j)];
      if (v < 0 || v >= dim) {
        std::string where, tuple;
        std::int64_t rest = t;
        std::vector<std::int64_t> at(static_cast<std::size_t>(indices.rank() - 1));
        for (int a = indices.rank() - 2; a >= 0; --a) {
          at[static_cast<std::size_t>(a)] = rest % indices[a];
          rest /= indices[a];
        }
        for (std::size_t a = 0; a < at.size(); ++a)
          where += (a ? ", " : "") + std::to_string(at[a]);
        for (std::int64_t k = 0; k < l.depth; ++k)
          tuple +=
              (k ? ", " : "") + std::to_string(static_cast<std::int64_t>(idx[t * l.depth + k]));
        throw invalid_argument_error("node " + n.describe() + ": indices[" + where + "] = [" +
                                     tuple + "] does not index into params of shape " +
                                     params.to_string() + " (index " + std::to_string(v) +
                                     " of dimension " + std::to_string(j) + " is outside [0, " +
                                     std::to_string(dim) + "))");
      }
      row = row * dim + v;
    }
    rows[static_cast<std::size_t>(t)] = row;
  }
  return rows;
}

// The checked slices of a gather_nd or gather_nd_grad whose indices are on the host.
inline std::vector<std::int64_t> gather_nd_slices(const node_def& n, const any_tensor& indices,
                                                  const loom::shape& params,
                                                  const gather_nd_layout& l) {
  return with_ids(indices, [&](const auto* idx) {
    return gather_nd_slices(n, idx, indices.shape(), params, l);
  });
}

// gather_nd_grad's output shape: its attribute, or its third input's shape; and dy must be
// gather_nd's output of that shape.
inline loom::shape gather_nd_grad_shape(const node_def& n, std::span<const any_tensor* const> in) {
  const loom::shape s =
      in.size() == 3 ? in[2]->shape() : loom::shape(n.attr<std::vector<std::int64_t>>("shape"));
  const loom::shape want = detail::gather_nd_shape(n, s, in[1]->shape());
  if (in[0]->shape() != want)
    throw invalid_argument_error("node " + n.describe() + ": dy of shape " +
                                 in[0]->shape().to_string() + " is not gather_nd's output " +
                                 want.to_string());
  return s;
}

} // namespace loom::kernels

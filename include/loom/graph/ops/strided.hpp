// Op definitions of the ops that move a tensor's elements by a strided map (TF's
// array_ops): transpose, strided_slice (slice is one) and its gradient, pad, tile; and
// expand_dims and squeeze, which change a shape only. Each kernel, on the CPU
// (kernels/cpu/strided.hpp) and the GPU (kernels/cuda/strided.cuh), runs one strided
// copy that kernels/checks/strided.hpp plans. stack, unstack and split are built from
// them in graph/ops/stack_split.hpp.
#pragma once

#include <loom/graph/builder.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/ops/array.hpp>
#include <loom/graph/ops/math.hpp>
#include <loom/graph/output.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace loom::detail {

inline std::string node_error(const node_def& n, const std::string& what) {
  return "node " + n.describe() + ": " + what;
}

// -- transpose ---------------------------------------------------------------------

// The node's "perm", checked to be a permutation of [0, rank).
inline std::vector<int> checked_perm(const node_def& n, const loom::shape& in) {
  const auto perm = n.attr<std::vector<std::int64_t>>("perm");
  const int rank = in.rank();
  std::vector<bool> seen(static_cast<std::size_t>(rank), false);
  bool ok = static_cast<int>(perm.size()) == rank;
  for (std::size_t i = 0; ok && i < perm.size(); ++i) {
    ok = perm[i] >= 0 && perm[i] < rank && !seen[static_cast<std::size_t>(perm[i])];
    if (ok)
      seen[static_cast<std::size_t>(perm[i])] = true;
  }
  if (!ok)
    throw invalid_argument_error(node_error(n, "perm " + dims_to_string(perm) +
                                                   " is not a permutation of the dimensions "
                                                   "of an input of shape " +
                                                   in.to_string()));
  return {perm.begin(), perm.end()};
}

inline loom::shape transposed_shape(const loom::shape& in, const std::vector<int>& perm) {
  std::vector<std::int64_t> d;
  for (int p : perm)
    d.push_back(in[p]);
  return loom::shape(std::move(d));
}

// -- strided_slice -----------------------------------------------------------------

// strided_slice's attributes, TF's: begin, end and strides of one length (the sparse
// spec), and the masks over its entries. Decoded once per plan item by the kernels.
struct strided_slice_attrs {
  std::vector<std::int64_t> begin, end, strides;
  std::int64_t begin_mask, end_mask, ellipsis_mask, new_axis_mask, shrink_axis_mask;
  explicit strided_slice_attrs(const node_def& n)
      : begin(n.attr<std::vector<std::int64_t>>("begin")),
        end(n.attr<std::vector<std::int64_t>>("end")),
        strides(n.attr<std::vector<std::int64_t>>("strides")),
        begin_mask(n.attr_or<std::int64_t>("begin_mask", 0)),
        end_mask(n.attr_or<std::int64_t>("end_mask", 0)),
        ellipsis_mask(n.attr_or<std::int64_t>("ellipsis_mask", 0)),
        new_axis_mask(n.attr_or<std::int64_t>("new_axis_mask", 0)),
        shrink_axis_mask(n.attr_or<std::int64_t>("shrink_axis_mask", 0)) {}
};

// A strided_slice resolved against its input's shape: per input dimension the first
// index taken, the step and the count (-1 where the dimension is known only when the
// step runs), and the result's shape (new axes in, shrunk dimensions out).
struct resolved_slice {
  std::vector<std::int64_t> start, step, count;
  loom::shape out;
};

// TF's semantics (its ValidateStridedSliceOp): the spec's entries map onto the input's
// dimensions, an ellipsis (or, without one, the spec's end) standing for the dimensions
// the spec leaves out; a new axis takes no dimension; a negative index counts from the
// end; indices are clamped to the dimension, except a shrunk one, which must be inside.
inline resolved_slice resolve_slice(const node_def& n, const strided_slice_attrs& a,
                                    const loom::shape& in) {
  const std::size_t entries = a.begin.size();
  if (a.end.size() != entries || a.strides.size() != entries)
    throw invalid_argument_error(
        node_error(n, "begin " + dims_to_string(a.begin) + ", end " + dims_to_string(a.end) +
                          " and strides " + dims_to_string(a.strides) + " must have one length"));
  if (entries > 62)
    throw invalid_argument_error(node_error(n, "a slice spec of more than 62 entries"));
  auto bit = [](std::int64_t mask, std::size_t i) { return (mask >> i & 1) != 0; };
  if (std::popcount(static_cast<std::uint64_t>(a.ellipsis_mask)) > 1)
    throw invalid_argument_error(node_error(n, "more than one ellipsis in the slice spec"));
  const int rank = in.rank();
  int spec_dims = 0; // entries that take an input dimension
  for (std::size_t i = 0; i < entries; ++i)
    if (!bit(a.ellipsis_mask, i) && !bit(a.new_axis_mask, i))
      ++spec_dims;
  if (spec_dims > rank)
    throw invalid_argument_error(
        node_error(n, "the slice spec indexes " + std::to_string(spec_dims) +
                          " dimensions of an input of shape " + in.to_string() + " (rank " +
                          std::to_string(rank) + ")"));
  resolved_slice r;
  r.start.assign(static_cast<std::size_t>(rank), 0);
  r.step.assign(static_cast<std::size_t>(rank), 1);
  r.count.assign(static_cast<std::size_t>(rank), 0);
  std::vector<std::int64_t> out;
  int d = 0; // the input dimension the next entry takes
  auto whole = [&](int dim) {
    r.count[static_cast<std::size_t>(dim)] = in[dim];
    out.push_back(in[dim]);
  };
  auto take = [&](std::size_t i) {
    const std::int64_t dim = in[d], stride = a.strides[i];
    const auto ud = static_cast<std::size_t>(d);
    if (stride == 0)
      throw invalid_argument_error(
          node_error(n, "stride 0 in entry " + std::to_string(i) + " of the slice spec"));
    r.step[ud] = stride;
    if (bit(a.shrink_axis_mask, i)) {
      const std::int64_t x = a.begin[i];
      if (dim >= 0 && (x < -dim || x >= dim))
        throw invalid_argument_error(
            node_error(n, "index " + std::to_string(x) + " of entry " + std::to_string(i) +
                              " is outside dimension " + std::to_string(d) +
                              " of an input of shape " + in.to_string()));
      r.start[ud] = dim >= 0 && x < 0 ? x + dim : x;
      r.step[ud] = 1;
      r.count[ud] = 1;
    } else if (dim < 0) {
      r.count[ud] = -1;
      out.push_back(-1);
    } else {
      // Clamped into [0, dim] going forward, [-1, dim - 1] going back.
      const std::int64_t lo = stride > 0 ? 0 : -1, hi = stride > 0 ? dim : dim - 1;
      auto canonical = [&](std::int64_t x, bool masked, bool is_begin) {
        if (masked)
          return (stride > 0) == is_begin ? lo : hi;
        x = x < 0 ? x + dim : x;
        return std::clamp(x, lo, hi);
      };
      const std::int64_t b = canonical(a.begin[i], bit(a.begin_mask, i), true);
      const std::int64_t e = canonical(a.end[i], bit(a.end_mask, i), false);
      const std::int64_t span = stride > 0 ? e - b : b - e;
      const std::int64_t step = stride > 0 ? stride : -stride;
      r.start[ud] = b;
      r.count[ud] = span <= 0 ? 0 : (span + step - 1) / step;
      out.push_back(r.count[ud]);
    }
    ++d;
  };
  for (std::size_t i = 0; i < entries; ++i) {
    if (bit(a.ellipsis_mask, i)) {
      int after = 0; // entries after the ellipsis that take a dimension
      for (std::size_t j = i + 1; j < entries; ++j)
        if (!bit(a.new_axis_mask, j))
          ++after;
      while (d < rank - after)
        whole(d++);
    } else if (bit(a.new_axis_mask, i)) {
      out.push_back(1);
    } else {
      take(i);
    }
  }
  while (d < rank) // without an ellipsis, the dimensions the spec leaves are taken whole
    whole(d++);
  r.out = loom::shape(std::move(out));
  return r;
}

// -- pad, tile, expand_dims, squeeze --------------------------------------------------

// "paddings": 2 * rank non-negative numbers, (before, after) for each dimension.
inline std::vector<std::int64_t> checked_paddings(const node_def& n, const loom::shape& in) {
  auto p = n.attr<std::vector<std::int64_t>>("paddings");
  if (static_cast<int>(p.size()) != 2 * in.rank() ||
      std::any_of(p.begin(), p.end(), [](std::int64_t v) { return v < 0; }))
    throw invalid_argument_error(node_error(
        n, "paddings " + dims_to_string(p) + " must be " + std::to_string(in.rank()) +
               " pairs of non-negative numbers for an input of shape " + in.to_string()));
  return p;
}

inline loom::shape padded_shape(const loom::shape& in, const std::vector<std::int64_t>& p) {
  std::vector<std::int64_t> d = in.dims();
  for (std::size_t i = 0; i < d.size(); ++i)
    if (d[i] >= 0)
      d[i] += p[2 * i] + p[2 * i + 1];
  return loom::shape(std::move(d));
}

inline std::vector<std::int64_t> checked_multiples(const node_def& n, const loom::shape& in) {
  auto m = n.attr<std::vector<std::int64_t>>("multiples");
  if (static_cast<int>(m.size()) != in.rank() ||
      std::any_of(m.begin(), m.end(), [](std::int64_t v) { return v < 0; }))
    throw invalid_argument_error(
        node_error(n, "multiples " + dims_to_string(m) + " must be " + std::to_string(in.rank()) +
                          " non-negative numbers for an input of shape " + in.to_string()));
  return m;
}

inline loom::shape tiled_shape(const loom::shape& in, const std::vector<std::int64_t>& m) {
  std::vector<std::int64_t> d = in.dims();
  for (std::size_t i = 0; i < d.size(); ++i)
    if (d[i] >= 0)
      d[i] *= m[i];
  return loom::shape(std::move(d));
}

// expand_dims: a dimension of 1 at "axis" (in [-rank - 1, rank], negative from the end).
inline loom::shape expanded_shape(const node_def& n, const loom::shape& in) {
  const std::int64_t axis = n.attr<std::int64_t>("axis"), rank = in.rank();
  if (axis < -rank - 1 || axis > rank)
    throw invalid_argument_error(node_error(
        n, "axis " + std::to_string(axis) + " is outside [" + std::to_string(-rank - 1) + ", " +
               std::to_string(rank) + "] for an input of shape " + in.to_string()));
  std::vector<std::int64_t> d = in.dims();
  d.insert(d.begin() + (axis < 0 ? axis + rank + 1 : axis), 1);
  return loom::shape(std::move(d));
}

// squeeze: without "axes" every dimension of 1 (which the shape must show), else those,
// each of which must be 1.
inline loom::shape squeezed_shape(const node_def& n, const loom::shape& in) {
  const auto axes = n.attr_or<std::vector<std::int64_t>>("axes", {});
  const int rank = in.rank();
  std::vector<bool> drop(static_cast<std::size_t>(rank), false);
  if (axes.empty()) {
    for (int a = 0; a < rank; ++a) {
      if (in[a] < 0)
        throw invalid_argument_error(node_error(
            n, "squeeze without axes needs every dimension known; input shape " + in.to_string()));
      drop[static_cast<std::size_t>(a)] = in[a] == 1;
    }
  }
  for (std::int64_t axis : axes) {
    if (axis < -rank || axis >= rank)
      throw invalid_argument_error(node_error(
          n, "axis " + std::to_string(axis) + " is outside an input of shape " + in.to_string()));
    const auto a = static_cast<std::size_t>(axis < 0 ? axis + rank : axis);
    if (in[static_cast<int>(a)] > 1 || in[static_cast<int>(a)] == 0)
      throw invalid_argument_error(node_error(n, "cannot squeeze dimension " + std::to_string(a) +
                                                     " of shape " + in.to_string() +
                                                     ": it is not 1"));
    drop[a] = true;
  }
  std::vector<std::int64_t> d;
  for (int a = 0; a < rank; ++a)
    if (!drop[static_cast<std::size_t>(a)])
      d.push_back(in[a]);
  return loom::shape(std::move(d));
}

// dy under x's shape: the gradient of an op that changes only the shape.
inline node_id reshape_back(graph& g, const node_def& n, node_id dy) {
  const node_id x = n.inputs[0];
  const loom::shape& s = g.node(x).shape;
  if (s.fully_defined())
    return g.add_node("reshape", {dy}, {{"dims", s.dims()}});
  return g.add_node("reshape_like", {dy, x});
}

// The gradient of a slice of x: dy put back where it was taken, zeros elsewhere. x's
// shape travels as an attribute where the graph knows it, so x need not live until
// then; else x is an input.
inline node_id slice_gradient(graph& g, const node_def& n, node_id dy) {
  const node_id x = n.inputs[0];
  attr_map attrs = n.attrs;
  const loom::shape& s = g.node(x).shape;
  if (s.fully_defined()) {
    attrs["shape"] = s.dims();
    return g.add_node("strided_slice_grad", {dy}, std::move(attrs));
  }
  return g.add_node("strided_slice_grad", {dy, x}, std::move(attrs));
}

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_strided_ops() {
  auto& r = op_registry::instance();

  // Input x, attr "perm": out[i_0, ...] = x[i at perm], TF's Transpose.
  r.add({.name = "transpose",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               n.type = in[0]->type;
               n.shape = transposed_shape(in[0]->shape, checked_perm(n, in[0]->shape));
             },
         .gradient =
             [](graph& g, const node_def& n, node_id dy) {
               const auto perm = n.attr<std::vector<std::int64_t>>("perm");
               std::vector<std::int64_t> inverse(perm.size());
               for (std::size_t i = 0; i < perm.size(); ++i)
                 inverse[static_cast<std::size_t>(perm[i])] = static_cast<std::int64_t>(i);
               return std::vector{g.add_node("transpose", {dy}, {{"perm", inverse}})};
             }});

  // Input x; attrs as strided_slice_attrs (TF's StridedSlice).
  r.add({.name = "strided_slice",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               n.type = in[0]->type;
               n.shape = resolve_slice(n, strided_slice_attrs(n), in[0]->shape).out;
             },
         .gradient = [](graph& g, const node_def& n,
                        node_id dy) { return std::vector{slice_gradient(g, n, dy)}; }});
  // Inputs (dy) with attr "shape" (x's), or (dy, x): zeros of x's shape with dy where
  // the strided_slice of the same attrs took it.
  r.add({.name = "strided_slice_grad",
         .num_inputs = -1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               if (in.size() != 1 && in.size() != 2)
                 throw invalid_argument_error(node_error(n, "takes dy, and x or a shape"));
               n.type = in[0]->type;
               n.shape = in.size() == 2 ? in[1]->shape
                                        : loom::shape(n.attr<std::vector<std::int64_t>>("shape"));
             },
         .gradient =
             [](graph& g, const node_def& n, node_id ddx) {
               attr_map attrs = n.attrs;
               attrs.erase("shape");
               std::vector<node_id> grads{g.add_node("strided_slice", {ddx}, std::move(attrs))};
               if (n.inputs.size() == 2)
                 grads.push_back(no_node);
               return grads;
             }});

  // Inputs (x, a scalar of x's dtype), attr "paddings": TF's PadV2 (constant mode).
  r.add({.name = "pad",
         .num_inputs = 2,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               if (in[1]->type != in[0]->type || in[1]->shape.rank() != 0)
                 throw invalid_argument_error(
                     node_error(n, "the padding value " + in[1]->describe() +
                                       " must be a scalar of the input's dtype " +
                                       std::string(to_string(in[0]->type))));
               n.type = in[0]->type;
               n.shape = padded_shape(in[0]->shape, checked_paddings(n, in[0]->shape));
             },
         .gradient =
             [](graph& g, const node_def& n, node_id dy) {
               // The middle of dy: from `before` to `after` short of the end.
               const auto p = n.attr<std::vector<std::int64_t>>("paddings");
               std::vector<std::int64_t> begin, end, strides;
               std::int64_t end_mask = 0;
               for (std::size_t i = 0; i < p.size() / 2; ++i) {
                 begin.push_back(p[2 * i]);
                 end.push_back(-p[2 * i + 1]);
                 strides.push_back(1);
                 if (p[2 * i + 1] == 0)
                   end_mask |= std::int64_t{1} << i;
               }
               return std::vector{g.add_node("strided_slice", {dy},
                                             {{"begin", begin},
                                              {"end", end},
                                              {"strides", strides},
                                              {"end_mask", end_mask}}),
                                  no_node};
             }});

  // Input x, attr "multiples": TF's Tile. The gradient sums dy's copies: dy seen as
  // [m_0, d_0, m_1, d_1, ...] summed over the m's.
  r.add({.name = "tile",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               n.type = in[0]->type;
               n.shape = tiled_shape(in[0]->shape, checked_multiples(n, in[0]->shape));
             },
         .gradient =
             [](graph& g, const node_def& n, node_id dy) {
               const node_id x = n.inputs[0];
               const loom::shape& s = g.node(x).shape;
               const auto m = n.attr<std::vector<std::int64_t>>("multiples");
               std::vector<std::int64_t> split, axes;
               for (int a = 0; a < s.rank(); ++a) {
                 split.push_back(m[static_cast<std::size_t>(a)]);
                 split.push_back(s[a]);
                 axes.push_back(2 * a);
               }
               if (std::count(s.dims().begin(), s.dims().end(), -1) > 1)
                 throw invalid_argument_error(
                     node_error(n, "the gradient of tile needs all but one dimension of its "
                                   "input known when the graph is built; input shape " +
                                       s.to_string()));
               const node_id parts = g.add_node("reshape", {dy}, {{"dims", split}});
               const node_id sum = reduce_node(g, "reduce_sum", parts, axes, false);
               if (s.fully_defined())
                 return std::vector{sum};
               return std::vector{g.add_node("reshape_like", {sum, x})};
             }});

  // Input x, attr "axis" (expand_dims) or "axes" (squeeze): x under another shape.
  r.add({.name = "expand_dims",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               n.type = in[0]->type;
               n.shape = expanded_shape(n, in[0]->shape);
             },
         .gradient = [](graph& g, const node_def& n,
                        node_id dy) { return std::vector{reshape_back(g, n, dy)}; }});
  r.add({.name = "squeeze",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               n.type = in[0]->type;
               n.shape = squeezed_shape(n, in[0]->shape);
             },
         .gradient = [](graph& g, const node_def& n,
                        node_id dy) { return std::vector{reshape_back(g, n, dy)}; }});
  return true;
}

inline const bool strided_ops_registered = register_strided_ops();
#endif

} // namespace loom::detail

namespace loom {

// out[i_0, ..., i_{R-1}] = x[i at perm] (tf.transpose); by default the dimensions
// reversed, as TF's.
template <expression E>
output<value_type_of<E>, rank_of<E>>
transpose(const E& x, std::array<int, static_cast<std::size_t>(rank_of<E>)> perm) {
  auto lx = lower(x);
  return {lx.graph(),
          lx.graph().add_node("transpose", {lx.id()},
                              {{"perm", std::vector<std::int64_t>(perm.begin(), perm.end())}})};
}
template <expression E> output<value_type_of<E>, rank_of<E>> transpose(const E& x) {
  std::array<int, static_cast<std::size_t>(rank_of<E>)> perm{};
  for (int i = 0; i < rank_of<E>; ++i)
    perm[static_cast<std::size_t>(i)] = rank_of<E> - 1 - i;
  return transpose(x, perm);
}

// The masks of strided_slice, TF's: bit i applies to entry i of the spec.
struct slice_masks {
  std::int64_t begin_mask = 0, end_mask = 0, ellipsis_mask = 0, new_axis_mask = 0,
               shrink_axis_mask = 0;
};

// x[begin:end:strides] with TF's masks (tf.strided_slice). The result's rank is OutR,
// x's rank unless the masks add or remove dimensions: strided_slice<1>(m, {0, 0}, {1, 0},
// {1, 1}, {.end_mask = 2, .shrink_axis_mask = 1}) is m's first row. A rank that does not
// match the masks is an error when the graph is built.
template <int OutR = -1, expression E>
output<value_type_of<E>, (OutR < 0 ? rank_of<E> : OutR)>
strided_slice(const E& x, std::vector<std::int64_t> begin, std::vector<std::int64_t> end,
              std::vector<std::int64_t> strides, slice_masks masks = {}) {
  auto lx = lower(x);
  return {lx.graph(), lx.graph().add_node("strided_slice", {lx.id()},
                                          {{"begin", std::move(begin)},
                                           {"end", std::move(end)},
                                           {"strides", std::move(strides)},
                                           {"begin_mask", masks.begin_mask},
                                           {"end_mask", masks.end_mask},
                                           {"ellipsis_mask", masks.ellipsis_mask},
                                           {"new_axis_mask", masks.new_axis_mask},
                                           {"shrink_axis_mask", masks.shrink_axis_mask}})};
}

// size[i] elements of dimension i from begin[i] (tf.slice); a size of -1 takes the rest.
template <expression E>
output<value_type_of<E>, rank_of<E>>
slice(const E& x, const std::array<std::int64_t, static_cast<std::size_t>(rank_of<E>)>& begin,
      const std::array<std::int64_t, static_cast<std::size_t>(rank_of<E>)>& size) {
  std::vector<std::int64_t> b(begin.begin(), begin.end()), e, s(begin.size(), 1);
  slice_masks masks;
  for (std::size_t i = 0; i < begin.size(); ++i) {
    if (begin[i] < 0 || size[i] < -1)
      throw invalid_argument_error("loom::slice: begin " + std::to_string(begin[i]) + " and size " +
                                   std::to_string(size[i]) + " of dimension " + std::to_string(i) +
                                   " (begin must be >= 0, size >= 0 or -1 for the rest)");
    e.push_back(size[i] < 0 ? 0 : begin[i] + size[i]);
    if (size[i] < 0)
      masks.end_mask |= std::int64_t{1} << i;
  }
  return strided_slice(x, std::move(b), std::move(e), std::move(s), masks);
}

// x with its elements padded by `value`, paddings[i] = {before, after} (tf.pad, constant).
template <expression E>
output<value_type_of<E>, rank_of<E>>
pad(const E& x,
    const std::array<std::array<std::int64_t, 2>, static_cast<std::size_t>(rank_of<E>)>& paddings,
    value_type_of<E> value = value_type_of<E>{}) {
  auto lx = lower(x);
  graph g = lx.graph();
  std::vector<std::int64_t> p;
  for (const auto& [before, after] : paddings) {
    p.push_back(before);
    p.push_back(after);
  }
  return {g, g.add_node("pad", {lx.id(), loom::detail::scalar_node(g, value)}, {{"paddings", p}})};
}

// x repeated multiples[i] times along dimension i (tf.tile).
template <expression E>
output<value_type_of<E>, rank_of<E>>
tile(const E& x, const std::array<std::int64_t, static_cast<std::size_t>(rank_of<E>)>& multiples) {
  auto lx = lower(x);
  return {lx.graph(),
          lx.graph().add_node(
              "tile", {lx.id()},
              {{"multiples", std::vector<std::int64_t>(multiples.begin(), multiples.end())}})};
}

// x with a dimension of 1 inserted at axis (tf.expand_dims); axis in [-R - 1, R].
template <expression E>
output<value_type_of<E>, rank_of<E> + 1> expand_dims(const E& x, std::int64_t axis) {
  auto lx = lower(x);
  return {lx.graph(), lx.graph().add_node("expand_dims", {lx.id()}, {{"axis", axis}})};
}

// x without the dimensions of 1 at axes (tf.squeeze); its rank R - N.
template <expression E, std::size_t N>
output<value_type_of<E>, std::max(rank_of<E> - static_cast<int>(N), 0)>
squeeze(const E& x, const std::array<std::int64_t, N>& axes) {
  static_assert(N >= 1 && N <= rank_of<E>,
                "loom::squeeze: name the axes to remove (at least one, at most the rank): the "
                "result's rank is part of its type");
  auto lx = lower(x);
  return {lx.graph(),
          lx.graph().add_node("squeeze", {lx.id()},
                              {{"axes", std::vector<std::int64_t>(axes.begin(), axes.end())}})};
}
template <expression E> auto squeeze(const E& x, std::int64_t axis) {
  return squeeze(x, std::array<std::int64_t, 1>{axis});
}

} // namespace loom

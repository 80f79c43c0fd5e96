// The host-side part of the index kernels that the CPU kernels
// (kernels/cpu/array.hpp, kernels/cpu/scatter.hpp) and the GPU kernels
// (kernels/cuda/array.cuh) share: the checks of ids and shapes, with their
// messages, the layouts they imply, and unique_positions (which both run on the
// host). Host code only (no Eigen evaluation), so nvcc compiles it too.
#pragma once

#include <loom/graph/ops/array.hpp>
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
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

// The index kernels' attributes, as kernel_context::decoded decodes them once
// per plan step (the CPU's and the GPU's kernels read the same ones).
// gather and resource_gather: along `axis`; a negative id gives a row of zeros
// where drop_negative (embedding_lookup_sparse's padding), else fails.
struct gather_attrs {
  int axis;
  bool drop_negative;
  explicit gather_attrs(const node_def& n)
      : axis(static_cast<int>(n.attr<std::int64_t>("axis"))),
        drop_negative(n.attr_or<bool>("drop_negative", false)) {}
};
// indexed_slices: rows along `axis` of the dense shape (of its third input,
// else this attribute).
struct slices_attrs {
  int axis;
  std::vector<std::int64_t> dense_shape;
  explicit slices_attrs(const node_def& n)
      : axis(static_cast<int>(n.attr<std::int64_t>("axis"))),
        dense_shape(n.inputs.size() == 3 ? std::vector<std::int64_t>{}
                                         : n.attr<std::vector<std::int64_t>>("dense_shape")) {}
};
// concat (`index` unused) and concat_grad (the part of input `index`).
struct concat_attrs {
  int axis;
  std::size_t index;
  explicit concat_attrs(const node_def& n)
      : axis(static_cast<int>(n.attr<std::int64_t>("axis"))),
        index(n.op == "concat_grad" ? static_cast<std::size_t>(n.attr<std::int64_t>("index")) : 0) {
  }
};
// dynamic_stitch: N parts.
struct stitch_attrs {
  std::size_t parts;
  explicit stitch_attrs(const node_def& n)
      : parts(static_cast<std::size_t>(n.attr<std::int64_t>("N"))) {}
};
// shard_ids / shard_positions: shard `shard` of `num_shards` of an embedding of
// `rows` rows, dealt by "div" or "mod".
struct shard_route_attrs {
  std::int64_t num_shards, shard, rows;
  bool div, positions;
  explicit shard_route_attrs(const node_def& n)
      : num_shards(n.attr<std::int64_t>("num_shards")), shard(n.attr<std::int64_t>("shard")),
        rows(n.attr<std::int64_t>("rows")), div(n.attr<std::string>("strategy") == "div"),
        positions(n.op == "shard_positions") {}
};

// Calls f(const I* ids) with the ids' element type.
template <class F> decltype(auto) with_ids(const any_tensor& ids, F&& f) {
  if (ids.type() == dtype::i32)
    return f(ids.data<std::int32_t>());
  return f(ids.data<std::int64_t>());
}

// What ids index, for an error: a string, or a callable that makes it. The
// kernels pass callables, so that a step builds no message it never throws.
inline const std::string& text_of(const std::string& what) {
  return what;
}
template <class F>
requires std::is_invocable_r_v<std::string, const F&> std::string text_of(const F& what) {
  return what();
}

// The first id outside [0, limit) (negative ones allowed where `negative_ok`),
// as an error naming the node, what the ids index, the id and its position;
// none: nothing is thrown. Checked before anything is written.
template <class I, class What>
void check_id_range(const node_def& n, const I* ids, std::int64_t count, std::int64_t limit,
                    bool negative_ok, const What& what) {
  for (std::int64_t k = 0; k < count; ++k) {
    const auto id = static_cast<std::int64_t>(ids[k]);
    if ((id < 0 && !negative_ok) || id >= limit)
      throw invalid_argument_error("node " + n.describe() + ": id " + std::to_string(id) +
                                   " (at position " + std::to_string(k) + ") is outside [0, " +
                                   std::to_string(limit) + ") of " + text_of(what));
  }
}

// The ids of a gather along `axis`: in [0, rows), negative ones allowed (a
// row of zeros) where `drop_negative`; the message names the params.
template <class I>
void check_gather_ids(const node_def& n, const I* ids, std::int64_t count, std::int64_t rows,
                      bool drop_negative, int axis) {
  check_id_range(n, ids, count, rows, drop_negative, [&] {
    return n.attr_or<std::string>("_params_name", "the params") + " (axis " + std::to_string(axis) +
           ")";
  });
}

// A resource_gather reads a variable only once it has a value. The caller holds v.mu.
inline void check_gather_variable(const node_def& n, const variable_resource& v) {
  if (!v.initialized)
    throw failed_precondition_error("node " + n.describe() + ": attempting to use uninitialized " +
                                    n.attr<std::string>("_params_name") +
                                    " (run its initializer, or global_variables_initializer, "
                                    "first)");
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

// concat_grad's adjoint dy has the shape of the concat of xs.
inline void check_concat_grad(const node_def& n, const any_tensor& dy,
                              std::span<const any_tensor* const> xs, int axis) {
  if (!(concat_shape(n, xs, axis) == dy.shape()))
    throw invalid_argument_error("node " + n.describe() + ": the adjoint of shape " +
                                 dy.shape().to_string() + " is not the shape of the concat");
}

// Part i of a dynamic_stitch: data of the first part's rank and row shape,
// with one row per index.
inline void check_stitch_part(const node_def& n, std::size_t i, const any_tensor& data,
                              const any_tensor& at, const any_tensor& first) {
  bool fits = data.rank() == first.rank() && data.shape()[0] == at.num_elements();
  for (int a = 1; fits && a < data.rank(); ++a)
    fits = data.shape()[a] == first.shape()[a];
  if (!fits)
    throw invalid_argument_error("node " + n.describe() + ": data " + std::to_string(i) +
                                 " of shape " + data.shape().to_string() + " does not match its " +
                                 std::to_string(at.num_elements()) + " indices");
}

// The indices [count, rank] of a sparse tensor (sparse_segment_ids): each
// inside the dense shape `bound` and after the one before it in row-major
// order; the messages name `what`.
inline void check_sparse_indices(const node_def& n, const any_tensor& indices,
                                 const std::int64_t* bound, std::int64_t rank,
                                 const std::string& what) {
  if (indices.rank() != 2 || indices.shape()[1] != rank)
    throw invalid_argument_error("node " + n.describe() + ": indices of shape " +
                                 indices.shape().to_string() + " do not fit a dense shape of " +
                                 "rank " + std::to_string(rank) + " (" + what + ")");
  const std::int64_t count = indices.shape()[0];
  const std::int64_t* at = indices.data<std::int64_t>();
  const auto index_text = [&](std::int64_t k) {
    std::string s = "[";
    for (std::int64_t a = 0; a < rank; ++a)
      s += (a ? ", " : "") + std::to_string(at[k * rank + a]);
    return s + "]";
  };
  for (std::int64_t k = 0; k < count; ++k) {
    for (std::int64_t a = 0; a < rank; ++a)
      if (at[k * rank + a] < 0 || at[k * rank + a] >= bound[a])
        throw invalid_argument_error("node " + n.describe() + ": index " + std::to_string(k) + " " +
                                     index_text(k) + " is outside the dense shape of " + what);
    if (k > 0 && !std::lexicographical_compare(at + (k - 1) * rank, at + k * rank, at + k * rank,
                                               at + (k + 1) * rank))
      throw invalid_argument_error("node " + n.describe() + ": index " + std::to_string(k) + " " +
                                   index_text(k) + " does not come " + "after index " +
                                   std::to_string(k - 1) + " " + index_text(k - 1) + " of " + what +
                                   ": a sparse tensor's indices must be in row-major order, "
                                   "without repeats");
  }
}

// What a scatter's messages call its variable.
inline std::string scatter_variable(const node_def& n) {
  return "variable '" + n.attr<std::string>("_ref_name_0") + "'";
}

// A scatter changes an initialized variable at `indices` by updates of the
// indices' shape followed by a row of the variable. The caller holds v.mu.
inline void check_scatter(const node_def& n, const variable_resource& v, const any_tensor& indices,
                          const any_tensor& updates) {
  const std::string var = scatter_variable(n);
  if (!v.initialized)
    throw failed_precondition_error("node " + n.describe() + ": attempting to use uninitialized " +
                                    var +
                                    " (run its initializer, or global_variables_initializer, "
                                    "first)");
  const loom::shape want = gathered_shape(v.value.shape(), indices.shape(), 0);
  if (!(updates.shape() == want))
    throw invalid_argument_error("node " + n.describe() + ": updates of shape " +
                                 updates.shape().to_string() + " do not fit indices of shape " +
                                 indices.shape().to_string() + " into " + var + " of shape " +
                                 v.value.shape().to_string());
}

// Positions of each id's value among the distinct values, which are numbered
// in the order they first occur; `first` gets those values. On every lookup
// and sparse update: an open-addressing table in two flat arrays (one
// allocation each, no node per id), sized to twice the ids. The CPU's unique
// and sparse updates, and the GPU's unique (on the ids' host copy).
template <class I>
std::vector<std::int32_t> unique_positions(const I* ids, std::int64_t n, std::vector<I>* first) {
  std::size_t capacity = 16;
  while (capacity < 2 * static_cast<std::size_t>(n))
    capacity *= 2;
  const std::size_t mask = capacity - 1;
  std::vector<I> keys(capacity);
  std::vector<std::int32_t> slots(capacity, -1); // the key's position, -1: empty
  std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
  std::int32_t distinct = 0;
  for (std::int64_t k = 0; k < n; ++k) {
    // Fibonacci hashing spreads consecutive ids over the table.
    auto h = static_cast<std::size_t>(
        (static_cast<std::uint64_t>(ids[k]) * 0x9E3779B97F4A7C15ull) >> 32);
    for (;; h = (h + 1) & mask) {
      std::int32_t& slot = slots[h & mask];
      if (slot < 0) {
        slot = distinct++;
        keys[h & mask] = ids[k];
        if (first)
          first->push_back(ids[k]);
        break;
      }
      if (keys[h & mask] == ids[k])
        break;
    }
    pos[static_cast<std::size_t>(k)] = slots[h & mask];
  }
  return pos;
}

// shard_ids / shard_positions on the host, for the CPU kernel and for the GPU
// kernel's host copy of the ids: of the ids (checked against the embedding's
// rows), those that shard `shard` holds, as their rows there (shard_ids) or
// their positions among the ids (shard_positions). Two passes over the ids,
// one counting and one writing the output in place: every table of a step
// routes its ids once per shard and per op, and growing a vector and copying
// it into the tensor cost more than the second pass.
template <class I>
any_tensor route_to_shard(const node_def& node, const shard_route_attrs& a, const any_tensor& ids) {
  const std::int64_t n = a.num_shards, shard = a.shard, rows = a.rows;
  const bool div = a.div, positions = a.positions;
  const I* id = ids.data<I>();
  const std::int64_t count = ids.num_elements();
  check_id_range(node, id, count, rows, false,
                 [&] { return node.attr_or<std::string>("_what", "the embedding"); });
  // `where(v)`: whether the shard holds id v, and its row there. Everything
  // the loops read is a local, so their stores alias none of it. The second
  // pass writes every id's value and advances only past the shard's: no
  // branch on the id (half of them mispredicted over two shards), and every
  // write lands before the end, which it stops at.
  const auto route = [&, id, count, positions](auto where) {
    std::int64_t kept = 0;
    for (std::int64_t k = 0; k < count; ++k)
      kept += where(static_cast<std::int64_t>(id[k])).first ? 1 : 0;
    const auto write = [id, count, kept, where]<class T>(any_tensor out, auto value) {
      T* at = out.data<T>();
      T* const end = at + kept;
      for (std::int64_t k = 0; k < count && at != end; ++k) {
        const auto [in_shard, row] = where(static_cast<std::int64_t>(id[k]));
        *at = static_cast<T>(value(k, row));
        at += in_shard ? 1 : 0;
      }
      return out;
    };
    if (positions)
      return write.template operator()<std::int32_t>(
          any_tensor(dtype::i32, loom::shape{kept}),
          [](std::int64_t k, std::int64_t) { return k; });
    return write.template operator()<I>(any_tensor(dtype_of<I>, loom::shape{kept}),
                                        [](std::int64_t, std::int64_t row) { return row; });
  };
  if (div) {
    // The shard holds the ids [first, first + held): no division per id.
    const std::int64_t first = id_at(shard, 0, n, rows, true);
    const auto held = static_cast<std::uint64_t>(
        (shard + 1 < n ? id_at(shard + 1, 0, n, rows, true) : rows) - first);
    return route([first, held](std::int64_t v) {
      return std::pair{static_cast<std::uint64_t>(v - first) < held, v - first};
    });
  }
  if (std::has_single_bit(static_cast<std::uint64_t>(n))) {
    // "mod" over a power-of-two count of shards (the common 2, 4, 8): a mask
    // and a shift instead of two 64-bit divisions per id.
    const auto mask = static_cast<std::uint64_t>(n - 1);
    const int shift = std::countr_zero(static_cast<std::uint64_t>(n));
    const auto mine = static_cast<std::uint64_t>(shard);
    return route([mask, shift, mine](std::int64_t v) { // checked: 0 <= v < rows
      const auto u = static_cast<std::uint64_t>(v);
      return std::pair{(u & mask) == mine, static_cast<std::int64_t>(u >> shift)};
    });
  }
  return route([n, rows, shard](std::int64_t v) {
    const shard_route r = route_id(v, n, rows, false);
    return std::pair{r.shard == shard, r.row};
  });
}

} // namespace loom::detail

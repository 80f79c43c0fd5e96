// The host-side part of the index kernels that the CPU kernels
// (kernels/cpu/array.hpp, kernels/cpu/scatter.hpp) and the GPU kernels
// (kernels/cuda/array.cuh) share: the checks of ids and shapes, with their
// messages, the layouts they imply, and unique_positions (which both run on the
// host). Host code only (no Eigen evaluation), so nvcc compiles it too.
#pragma once

#include <loom/graph/ops/array.hpp>
#include <loom/graph/ops/embedding_lookup.hpp>
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace loom::kernels {

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
// per plan item (the CPU's and the GPU's kernels read the same ones).
// gather and resource_gather: along `axis`; a negative id gives a row of zeros
// where drop_negative (embedding_lookup_sparse's padding), else fails.
struct gather_attrs {
  int axis;
  bool drop_negative;
  explicit gather_attrs(const node_def& n)
      : axis(static_cast<int>(n.attr<std::int64_t>("axis"))),
        drop_negative(n.attr_or<bool>("drop_negative", false)) {}
};
// indexed_slices: rows along `axis` of the dense shape of its third input, else of
// its attribute. Which one is the kernel's inputs' to say, not the node's declared
// ones (a kernel can be run on a node that lists none); graph inference has already
// required the attribute of a node without a third input, and a node that reaches a
// kernel without either gets one error here.
struct slices_attrs {
  int axis;
  std::optional<std::vector<std::int64_t>> dense_shape;
  explicit slices_attrs(const node_def& n)
      : axis(static_cast<int>(n.attr<std::int64_t>("axis"))),
        dense_shape(n.has_attr("dense_shape")
                        ? std::optional(n.attr<std::vector<std::int64_t>>("dense_shape"))
                        : std::nullopt) {}
  loom::shape dense(const node_def& n, std::span<const any_tensor* const> inputs) const {
    if (inputs.size() == 3)
      return inputs[2]->shape();
    if (!dense_shape)
      throw invalid_argument_error("node " + n.describe() +
                                   ": no dense shape: neither a 'dense_shape' attribute nor a "
                                   "third input to take it from");
    return loom::shape(*dense_shape);
  }
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
// shard_unique / shard_slots: the ids of an embedding of `rows` rows dealt
// over `num_shards` shards by "div" or "mod"; shard_unique's shard `shard`.
struct shard_route_attrs {
  std::int64_t num_shards, shard, rows;
  bool div;
  explicit shard_route_attrs(const node_def& n)
      : num_shards(n.attr<std::int64_t>("num_shards")), shard(n.attr_or<std::int64_t>("shard", 0)),
        rows(n.attr<std::int64_t>("rows")), div(n.attr<std::string>("strategy") == "div") {}
};
// gather_shards: N shards' rows; gather_shards_grad: of shard `shard`.
struct gather_shards_attrs {
  std::int64_t parts, shard;
  explicit gather_shards_attrs(const node_def& n)
      : parts(n.attr<std::int64_t>("N")), shard(n.attr_or<std::int64_t>("shard", 0)) {}
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
  const loom::shape want = detail::gathered_shape(dense, indices.shape(), axis);
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
  const loom::shape want = detail::gathered_shape(v.value.shape(), indices.shape(), 0);
  if (!(updates.shape() == want))
    throw invalid_argument_error("node " + n.describe() + ": updates of shape " +
                                 updates.shape().to_string() + " do not fit indices of shape " +
                                 indices.shape().to_string() + " into " + var + " of shape " +
                                 v.value.shape().to_string());
}

// The distinct values of a run of ids, numbered in the order they first
// occur: an open-addressing table in two flat arrays (one allocation each, no
// node per id), sized to twice the ids it will see. Every lookup and sparse
// update numbers its ids with one.
template <class I> class first_occurrence {
public:
  explicit first_occurrence(std::int64_t ids) {
    std::size_t capacity = 16;
    while (capacity < 2 * static_cast<std::size_t>(ids))
      capacity *= 2;
    mask_ = capacity - 1;
    keys_.resize(capacity);
    numbers_.assign(capacity, -1);
  }
  // The number of `id`, and whether it is new (then numbered next).
  std::pair<std::int32_t, bool> insert(I id) {
    // Fibonacci hashing spreads consecutive ids over the table.
    auto h =
        static_cast<std::size_t>((static_cast<std::uint64_t>(id) * 0x9E3779B97F4A7C15ull) >> 32) &
        mask_;
    for (;; h = (h + 1) & mask_) {
      std::int32_t& number = numbers_[h];
      if (number < 0) {
        number = size_++;
        keys_[h] = id;
        return {number, true};
      }
      if (keys_[h] == id)
        return {number, false};
    }
  }
  std::int32_t size() const noexcept { return size_; }

private:
  std::size_t mask_ = 0;
  std::vector<I> keys_;
  std::vector<std::int32_t> numbers_; // the key's number, -1: empty
  std::int32_t size_ = 0;
};

// Positions of each id's value among the distinct values, which are numbered
// in the order they first occur; `first` gets those values. The CPU's unique
// and sparse updates, and the GPU's unique (on the ids' host copy).
template <class I>
std::vector<std::int32_t> unique_positions(const I* ids, std::int64_t n, std::vector<I>* first) {
  first_occurrence<I> table(n);
  std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
  for (std::int64_t k = 0; k < n; ++k) {
    const auto [number, added] = table.insert(ids[k]);
    if (added && first)
      first->push_back(ids[k]);
    pos[static_cast<std::size_t>(k)] = number;
  }
  return pos;
}

// x mod n and x / n for x >= 0: a mask and a shift where n is a power of two (the
// common 2, 4, 8 shards), not two 64-bit divisions. Both the "mod" rule of an id
// (its shard and its row there) and a slot of shard_slots (its shard and its
// position there) split so.
struct slot_split {
  std::int64_t parts;
  bool power_of_two;
  int shift;
  explicit slot_split(std::int64_t n)
      : parts(n), power_of_two(std::has_single_bit(static_cast<std::uint64_t>(n))),
        shift(std::countr_zero(static_cast<std::uint64_t>(n))) {}
  std::int64_t shard(std::int64_t x) const noexcept {
    return power_of_two ? x & (parts - 1) : x % parts;
  }
  std::int64_t row(std::int64_t x) const noexcept { return power_of_two ? x >> shift : x / parts; }
  // Calls f(shard_of, row_of) with the split as two functions that test nothing: for a
  // loop that would otherwise ask power_of_two at every element.
  template <class F> decltype(auto) visit(F&& f) const {
    if (power_of_two) {
      const std::int64_t mask = parts - 1;
      const int by = shift;
      return f([mask](std::int64_t x) { return x & mask; },
               [by](std::int64_t x) { return x >> by; });
    }
    const std::int64_t n = parts;
    return f([n](std::int64_t x) { return x % n; }, [n](std::int64_t x) { return x / n; });
  }
};

// Calls f(where) with where(id) -> (shard, row): the shard of an embedding
// routed by `a` that holds an id in [0, rows), and its row there.
template <class F> decltype(auto) with_shard_router(const shard_route_attrs& a, F&& f) {
  if (!a.div) {
    const slot_split mod(a.num_shards);
    return f([mod](std::int64_t v) { return detail::shard_route{mod.shard(v), mod.row(v)}; });
  }
  const std::int64_t n = a.num_shards, rows = a.rows;
  return f([n, rows](std::int64_t v) { return detail::route_id(v, n, rows, true); });
}

// The rows of shard `shard` that slots name: the largest named row's plus one
// (shard_slots names every row of its shard). One loop per kind of split, with
// no branch in it: whether a slot is the shard's is random, and as a branch
// (g++ makes one of a `?:` or an `&&` at -O2) it was mispredicted for half of
// the slots, 2.9 % of a worker's time in examples/ctr. A mask instead, over the
// split's branch-free form (slot_split::visit).
template <class I>
std::int64_t shard_rows_named(const I* slots, std::int64_t count, const slot_split& split,
                              std::int64_t shard) {
  return split.visit([&](auto shard_of, auto row_of) {
    std::int64_t rows = 0;
    for (std::int64_t k = 0; k < count; ++k) {
      const auto s = static_cast<std::int64_t>(slots[k]);
      const auto mine =
          static_cast<std::int64_t>(s >= 0) & static_cast<std::int64_t>(shard_of(s) == shard);
      rows = std::max(rows, (row_of(s) + 1) & -mine);
    }
    return rows;
  });
}

// shard_slots on the host, for the CPU kernel and for the GPU kernel's host copy
// of the ids (checked against the embedding's rows): for each id its row's
// position among its shard's distinct rows (in the order they first occur),
// times the shards, plus its shard. An id is distinct exactly where its (shard,
// row) is, so one table numbers them all, and a count per shard numbers each
// shard's own.
template <class I>
any_tensor shard_slots_of(const node_def& node, const shard_route_attrs& a, const any_tensor& ids) {
  const I* id = ids.data<I>();
  const std::int64_t count = ids.num_elements(), n = a.num_shards;
  check_id_range(node, id, count, a.rows, false,
                 [&] { return node.attr_or<std::string>("_what", "the embedding"); });
  any_tensor out(dtype::i64, loom::shape{count});
  std::int64_t* slot = out.data<std::int64_t>();
  with_shard_router(a, [&](auto where) {
    first_occurrence<I> table(count);
    std::vector<std::int64_t> in_shard(static_cast<std::size_t>(n), 0);
    std::vector<std::int64_t> slot_of; // by the id's number in `table`
    slot_of.reserve(static_cast<std::size_t>(count));
    for (std::int64_t k = 0; k < count; ++k) {
      const auto [number, added] = table.insert(id[k]);
      if (added) {
        const detail::shard_route r = where(static_cast<std::int64_t>(id[k]));
        slot_of.push_back(in_shard[static_cast<std::size_t>(r.shard)]++ * n + r.shard);
      }
      slot[k] = slot_of[static_cast<std::size_t>(number)];
    }
  });
  return out;
}

// shard_unique on the host (as shard_slots_of): the distinct rows of the ids that
// shard `shard` holds, in the order they first occur, from the ids and their slots:
// each id's row is written where its slot puts it (repeats write it again), so no id
// is hashed twice. Without a branch on the shard (half of them would be mispredicted
// over two shards): another shard's id rewrites row 0 with itself. An id's range was
// checked by shard_slots, which the slots come from; a row of it is only a value here.
template <class I>
any_tensor shard_unique_rows(const node_def& node, const shard_route_attrs& a,
                             const any_tensor& ids, const any_tensor& slots) {
  const std::int64_t count = ids.num_elements();
  if (slots.num_elements() != count)
    throw invalid_argument_error("node " + node.describe() + ": " +
                                 std::to_string(slots.num_elements()) + " slots for " +
                                 std::to_string(count) + " ids");
  const I* id = ids.data<I>();
  const slot_split split(a.num_shards);
  return with_ids(slots, [&](const auto* slot) {
    const std::int64_t rows = shard_rows_named(slot, count, split, a.shard);
    any_tensor out(dtype_of<I>, loom::shape{rows});
    if (rows == 0)
      return out;
    I* at = out.data<I>();
    with_shard_router(a, [&](auto where) {
      for (std::int64_t k = 0; k < count; ++k) {
        const auto s = static_cast<std::int64_t>(slot[k]);
        const bool mine = s >= 0 && split.shard(s) == a.shard;
        const std::int64_t r = mine ? split.row(s) : 0;
        at[r] = mine ? static_cast<I>(where(static_cast<std::int64_t>(id[k])).row) : at[r];
      }
    });
    return out;
  });
}

// The slots of a gather_shards name rows its parts have (`rows_in(p)`: part
// p's row count): one error naming the slot and the part otherwise.
template <class I, class RowsIn>
void check_slots(const node_def& n, const I* slots, std::int64_t count, const slot_split& split,
                 RowsIn rows_in) {
  for (std::int64_t k = 0; k < count; ++k) {
    const auto s = static_cast<std::int64_t>(slots[k]);
    if (s < 0)
      throw invalid_argument_error("node " + n.describe() + ": slot " + std::to_string(s) +
                                   " (at position " + std::to_string(k) + ") is negative");
    if (split.row(s) >= rows_in(split.shard(s)))
      throw invalid_argument_error("node " + n.describe() + ": slot " + std::to_string(s) +
                                   " (at position " + std::to_string(k) + ") names row " +
                                   std::to_string(split.row(s)) + " of shard " +
                                   std::to_string(split.shard(s)) + ", which has " +
                                   std::to_string(rows_in(split.shard(s))) + " rows");
  }
}

// The parts of a gather_shards agree on their row shape; the output's shape.
inline loom::shape gather_shards_shape(const node_def& n, const any_tensor& slots,
                                       std::span<const any_tensor* const> parts) {
  const any_tensor& first = *parts[0];
  for (std::size_t i = 0; i < parts.size(); ++i) {
    bool fits = parts[i]->rank() == first.rank() && first.rank() >= 1;
    for (int a = 1; fits && a < first.rank(); ++a)
      fits = parts[i]->shape()[a] == first.shape()[a];
    if (!fits)
      throw invalid_argument_error("node " + n.describe() + ": rows of shard " + std::to_string(i) +
                                   " of shape " + parts[i]->shape().to_string() +
                                   " do not match shard 0's " + first.shape().to_string());
  }
  std::vector<std::int64_t> d = first.shape().dims();
  d.front() = slots.num_elements();
  return loom::shape(std::move(d));
}

// The adjoint of a gather_shards has a row per slot.
inline void check_shards_adjoint(const node_def& n, const any_tensor& dy, const any_tensor& slots) {
  if (dy.rank() < 1 || dy.shape()[0] != slots.num_elements())
    throw invalid_argument_error("node " + n.describe() + ": the adjoint of shape " +
                                 dy.shape().to_string() + " needs a row for each of " +
                                 std::to_string(slots.num_elements()) + " slots");
}

} // namespace loom::kernels

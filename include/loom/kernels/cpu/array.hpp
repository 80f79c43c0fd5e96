// CPU kernels of the index ops (graph/ops/array.hpp): gather, indexed_slices
// (densified), unsorted_segment_sum, unique / unique_index, the routing over
// an embedding's shards (shard_unique, shard_slots, gather_shards and its
// gradient), dynamic_stitch, concat and its gradient. Ids are checked before anything is written,
// so a bad id fails the step with one error and never reads or writes past a buffer.
#pragma once

#include <loom/kernels/checks/array.hpp>
#include <loom/kernels/cpu/parallel_for.hpp>
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace loom::kernels {

// dst += src over `len` elements of two distinct buffers. At a width with_row_width
// (below) made a constant, as a fixed-size Eigen array: g++ adds a row of 16 floats
// with one scalar add per element otherwise (it cannot rule out that the rows
// overlap), and those adds were most of a sparse gradient's time.
template <class T, class Len> void add_row(T* dst, const T* src, Len len) {
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    if constexpr (std::is_integral_v<Len>) {
      for (Len j = 0; j < len; ++j)
        dst[j] += src[j];
    } else {
      using row = Eigen::Array<T, static_cast<int>(Len::value), 1>;
      Eigen::Map<row>(dst) += Eigen::Map<const row>(src);
    }
  }
}

// Copies a row of `width` elements between distinct buffers. memcpy, not std::copy_n:
// copy_n is a memmove, which g++ calls even at a constant width of 64 bytes, where a
// memcpy of a constant size compiles to a few moves (with_row_width below).
template <class T> void copy_row(T* dst, const T* src, std::int64_t width) {
  if constexpr (std::is_trivially_copyable_v<T>)
    std::memcpy(dst, src, static_cast<std::size_t>(width) * sizeof(T));
  else
    std::copy_n(src, width, dst);
}

// Asks the cache for a row `ahead` rows before a loop over random rows of a large table
// reaches it (every cache line of it), so that many rows' misses are in flight at once.
inline constexpr std::int64_t rows_ahead = 8;
template <class T> void prefetch_row(const T* row, std::int64_t width) {
  const auto* bytes = reinterpret_cast<const char*>(row);
  for (std::size_t b = 0; b < static_cast<std::size_t>(width) * sizeof(T); b += 64)
    __builtin_prefetch(bytes + b);
}

// Calls f(width) with a row's width (elements) as a compile-time constant where it is one
// of the usual widths of an embedding row (1 for a wide model's weights, 4 to 64), else as
// a number. A loop over rows inside f then copies or adds each row with inline moves, not
// a memmove call per row: for random rows of a large table a call per row took 3x the time
// of the inline copy at 1 float and 1.35x at 16 (#23: a ps's gathers and sparse applies
// move thousands of such rows a step). Arithmetic types only; others get the number.
template <class T, class F> decltype(auto) with_row_width(std::int64_t width, F&& f) {
  if constexpr (std::is_arithmetic_v<T>) {
    switch (width) {
    case 1: return f(std::integral_constant<std::int64_t, 1>{});
    case 4: return f(std::integral_constant<std::int64_t, 4>{});
    case 8: return f(std::integral_constant<std::int64_t, 8>{});
    case 16: return f(std::integral_constant<std::int64_t, 16>{});
    case 32: return f(std::integral_constant<std::int64_t, 32>{});
    case 64: return f(std::integral_constant<std::int64_t, 64>{});
    default: break;
    }
  }
  return f(width);
}

// The rows of params at ids into c.output.
template <class T> void gather_rows(kernel_context& c, const any_tensor& params) {
  const any_tensor& ids = c.input(1);
  const gather_attrs& a = c.decoded<gather_attrs>();
  const int axis = a.axis;
  const bool drop_negative = a.drop_negative;
  const axis_layout l = gather_layout(c.node, params, axis);
  const std::int64_t n = ids.num_elements();
  c.output = any_tensor(params.type(), detail::gathered_shape(params.shape(), ids.shape(), axis));
  const T* src = params.data<T>();
  T* dst = c.output.data<T>();
  with_ids(ids, [&](const auto* id) {
    check_gather_ids(c.node, id, n, l.count, drop_negative, axis);
    // One row (inner elements) per (outer, id).
    const Eigen::TensorOpCost per_row(static_cast<double>(l.inner * sizeof(T)),
                                      static_cast<double>(l.inner * sizeof(T)), 1.0);
    parallel_for(c.device, l.outer * n, per_row, [&](Eigen::Index first, Eigen::Index last) {
      with_row_width<T>(l.inner, [&](auto inner_constant) {
        const std::int64_t inner = inner_constant; // a constant where with_row_width makes one
        for (Eigen::Index r = first; r < last; ++r) {
          if (l.outer == 1 && r + rows_ahead < last)
            if (const auto ahead = static_cast<std::int64_t>(id[r + rows_ahead]); ahead >= 0)
              prefetch_row(src + ahead * inner, inner);
          // Axis 0 (one outer block, every embedding lookup) needs no division per row.
          const std::int64_t o = l.outer == 1 ? 0 : r / n, k = l.outer == 1 ? r : r % n;
          const auto row = static_cast<std::int64_t>(id[k]);
          T* out = dst + r * inner;
          if (row < 0)
            std::fill_n(out, inner, T{});
          else
            copy_row(out, src + (o * l.count + row) * inner, inner);
        }
      });
    });
  });
}

template <class T> struct gather_cpu {
  static void run(kernel_context& c) { gather_rows<T>(c, c.input(0)); }
};

// From a variable, under its lock: the rows are copied out while no update
// writes them.
template <class T> struct resource_gather_cpu {
  static void run(kernel_context& c) {
    variable_resource& v = *c.refs[0];
    std::lock_guard lock(v.mu);
    check_gather_variable(c.node, v);
    gather_rows<T>(c, v.value);
  }
};

// The dense value of a sparse gradient: zeros with the rows added in.
template <class T> struct indexed_slices_cpu {
  static void run(kernel_context& c) {
    const any_tensor& values = c.input(0);
    const any_tensor& indices = c.input(1);
    const slices_attrs& a = c.decoded<slices_attrs>();
    const int axis = a.axis;
    const loom::shape dense = a.dense(c.node, c.inputs);
    check_slices(c.node, values, indices, dense, axis);
    const axis_layout l = layout_around(dense, axis);
    const std::int64_t n = indices.num_elements();
    c.output = any_tensor(values.type(), dense);
    T* out = c.output.data<T>();
    std::fill_n(out, c.output.num_elements(), T(0));
    const T* v = values.data<T>();
    with_ids(indices, [&](const auto* id) {
      check_id_range(c.node, id, n, l.count, true,
                     [&] { return "a dense shape " + dense.to_string(); });
      with_row_width<T>(l.inner, [&](auto inner_constant) {
        const std::int64_t inner = inner_constant; // a constant where with_row_width makes one
        for (std::int64_t o = 0; o < l.outer; ++o)
          for (std::int64_t k = 0; k < n; ++k)
            if (id[k] >= 0)
              add_row(out + (o * l.count + static_cast<std::int64_t>(id[k])) * inner,
                      v + (o * n + k) * inner, inner_constant);
      });
    });
  }
};

template <class T> struct unsorted_segment_sum_cpu {
  static void run(kernel_context& c) {
    const any_tensor& data = c.input(0);
    const any_tensor& ids = c.input(1);
    const std::int64_t segments =
        with_ids(c.input(2), [](const auto* v) { return static_cast<std::int64_t>(*v); });
    c.output = any_tensor(data.type(), segment_sum_shape(c.node, data, ids, segments));
    T* out = c.output.data<T>();
    std::fill_n(out, c.output.num_elements(), T(0));
    const std::int64_t n = ids.num_elements();
    std::int64_t inner = 1;
    for (int a = ids.rank(); a < data.rank(); ++a)
      inner *= data.shape()[a];
    const T* in = data.data<T>();
    with_ids(ids, [&](const auto* id) {
      check_id_range(c.node, id, n, segments, true, "the segments");
      with_row_width<T>(inner, [&](auto width_constant) {
        const std::int64_t width = width_constant; // a constant where with_row_width makes one
        for (std::int64_t k = 0; k < n; ++k)
          if (id[k] >= 0)
            add_row(out + static_cast<std::int64_t>(id[k]) * width, in + k * width, width_constant);
      });
    });
  }
};

template <class I> struct unique_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    std::vector<I> values;
    (void)unique_positions(x.data<I>(), x.num_elements(), &values);
    c.output =
        any_tensor::from_vector(loom::shape{static_cast<std::int64_t>(values.size())}, values);
  }
};

template <class I> struct unique_index_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    c.output = any_tensor::from_vector(x.shape(),
                                       unique_positions<I>(x.data<I>(), x.num_elements(), nullptr));
  }
};

template <class T> struct concat_cpu {
  static void run(kernel_context& c) {
    const int axis = c.decoded<concat_attrs>().axis;
    c.output = any_tensor(c.input(0).type(), concat_shape(c.node, c.inputs, axis));
    const axis_layout out = layout_around(c.output.shape(), axis);
    T* dst = c.output.data<T>();
    std::int64_t offset = 0; // along the axis, in rows of `inner`
    for (const any_tensor* x : c.inputs) {
      const T* src = x->data<T>();
      // Joining embeddings along axis 1 copies a row of each per example: rows of
      // a usual width are copied inline, not by a memmove call each.
      with_row_width<T>(x->shape()[axis] * out.inner, [&](auto len_constant) {
        const std::int64_t len = len_constant; // a constant where with_row_width makes one
        for (std::int64_t o = 0; o < out.outer; ++o)
          copy_row(dst + (o * out.count + offset) * out.inner, src + o * len, len);
      });
      offset += x->shape()[axis];
    }
  }
};

// Inputs (dy, x_0 ... x_k): the part of dy that came from x_index.
template <class T> struct concat_grad_cpu {
  static void run(kernel_context& c) {
    const any_tensor& dy = c.input(0);
    const concat_attrs& a = c.decoded<concat_attrs>();
    const int axis = a.axis;
    const std::size_t index = a.index;
    const auto xs = c.inputs.subspan(1);
    check_concat_grad(c.node, dy, xs, axis);
    std::int64_t offset = 0;
    for (std::size_t k = 0; k < index; ++k)
      offset += xs[k]->shape()[axis];
    const any_tensor& x = *xs[index];
    const axis_layout whole = layout_around(dy.shape(), axis);
    c.output = any_tensor(dy.type(), x.shape());
    const T* src = dy.data<T>();
    T* dst = c.output.data<T>();
    with_row_width<T>(x.shape()[axis] * whole.inner, [&](auto len_constant) {
      const std::int64_t len = len_constant; // a constant where with_row_width makes one
      for (std::int64_t o = 0; o < whole.outer; ++o)
        copy_row(dst + o * len, src + (o * whole.count + offset) * whole.inner, len);
    });
  }
};

// The distinct rows an embedding shard holds of the ids.
template <class I> struct shard_unique_cpu {
  static void run(kernel_context& c) {
    c.output = shard_unique_rows<I>(c.node, c.decoded<shard_route_attrs>(), c.input(0), c.input(1));
  }
};

// Where each id's row is among its shard's shard_unique.
template <class I> struct shard_slots_cpu {
  static void run(kernel_context& c) {
    c.output = shard_slots_of<I>(c.node, c.decoded<shard_route_attrs>(), c.input(0));
  }
};

// Inputs (slots, rows_0 ... rows_{N-1}): each slot's row of its shard.
template <class T> struct gather_shards_cpu {
  static void run(kernel_context& c) {
    const any_tensor& slots = c.input(0);
    const auto parts = c.inputs.subspan(1);
    const slot_split split(c.decoded<gather_shards_attrs>().parts);
    c.output = any_tensor(parts[0]->type(), gather_shards_shape(c.node, slots, parts));
    const std::int64_t n = slots.num_elements();
    const std::int64_t width = n == 0 ? 0 : c.output.num_elements() / n;
    T* dst = c.output.data<T>();
    with_ids(slots, [&](const auto* slot) {
      check_slots(c.node, slot, n, split,
                  [&](std::int64_t p) { return parts[static_cast<std::size_t>(p)]->shape()[0]; });
      with_row_width<T>(width, [&](auto width_constant) {
        const std::int64_t w = width_constant; // a constant where with_row_width makes one
        for (std::int64_t k = 0; k < n; ++k) {
          const auto s = static_cast<std::int64_t>(slot[k]);
          copy_row(dst + k * w,
                   parts[static_cast<std::size_t>(split.shard(s))]->template data<T>() +
                       split.row(s) * w,
                   w);
        }
      });
    });
  }
};

// Inputs (dy, slots): the rows of dy of shard `shard`, summed at their rows.
// Without a branch per row: a row of another shard is added to a scratch row,
// the destination chosen by a mask (whether a row is the shard's is random; as
// a branch it was mispredicted for half of the rows). In integers, so that no
// pointer past the output is ever formed.
template <class T> struct gather_shards_grad_cpu {
  static void run(kernel_context& c) {
    const any_tensor& dy = c.input(0);
    const any_tensor& slots = c.input(1);
    const gather_shards_attrs& a = c.decoded<gather_shards_attrs>();
    const slot_split split(a.parts);
    check_shards_adjoint(c.node, dy, slots);
    const std::int64_t n = slots.num_elements();
    const std::int64_t width = n == 0 ? 0 : dy.num_elements() / n;
    with_ids(slots, [&](const auto* slot) {
      std::vector<std::int64_t> d = dy.shape().dims();
      d.front() = shard_rows_named(slot, n, split, a.shard);
      c.output = any_tensor(dy.type(), loom::shape(std::move(d)));
      T* out = c.output.data<T>();
      std::fill_n(out, c.output.num_elements(), T(0));
      const T* src = dy.data<T>();
      std::vector<T> scratch(static_cast<std::size_t>(width));
      const auto out_at = reinterpret_cast<std::uintptr_t>(out);
      const auto scratch_at = reinterpret_cast<std::uintptr_t>(scratch.data());
      with_row_width<T>(width, [&](auto width_constant) {
        const std::int64_t w = width_constant; // a constant where with_row_width makes one
        for (std::int64_t k = 0; k < n; ++k) {
          const auto s = static_cast<std::int64_t>(slot[k]);
          const auto mine = static_cast<std::uintptr_t>(s >= 0) &
                            static_cast<std::uintptr_t>(split.shard(s) == a.shard);
          const std::uintptr_t row_at =
              out_at + static_cast<std::uintptr_t>(split.row(s) * w) * sizeof(T);
          const std::uintptr_t to = (row_at & -mine) | (scratch_at & (mine - 1));
          add_row(reinterpret_cast<T*>(to), src + k * w, width_constant);
        }
      });
    });
  }
};

// Inputs (data_0 ... data_{N-1}, indices_0 ... indices_{N-1}).
template <class T> struct dynamic_stitch_cpu {
  static void run(kernel_context& c) {
    const std::size_t parts = c.decoded<stitch_attrs>().parts;
    const any_tensor& first = c.input(0);
    // Elements per row from the row's shape, not from a part's count: a part
    // may have no rows (a shard that got no ids this step).
    std::int64_t row = 1;
    for (int a = 1; a < first.rank(); ++a)
      row *= first.shape()[a];
    std::int64_t size = 0;
    for (std::size_t i = 0; i < parts; ++i) {
      const any_tensor& data = c.input(i);
      const any_tensor& at = c.input(parts + i);
      check_stitch_part(c.node, i, data, at, first);
      const std::int64_t n = at.num_elements();
      with_ids(at, [&](const auto* idx) {
        check_id_range(c.node, idx, n, std::numeric_limits<std::int32_t>::max(), false,
                       "the merged tensor");
        for (std::int64_t j = 0; j < n; ++j)
          size = std::max<std::int64_t>(size, static_cast<std::int64_t>(idx[j]) + 1);
      });
    }
    std::vector<std::int64_t> d = first.shape().dims();
    d.front() = size;
    c.output = any_tensor(first.type(), loom::shape(std::move(d)));
    T* out = c.output.data<T>();
    std::fill_n(out, c.output.num_elements(), T{});
    for (std::size_t i = 0; i < parts; ++i) {
      const T* src = c.input(i).data<T>();
      const any_tensor& at = c.input(parts + i);
      const std::int64_t n = at.num_elements(); // once: the loop's writes may alias its shape
      with_ids(at, [&](const auto* idx) {
        with_row_width<T>(row, [&](auto width_constant) {
          const std::int64_t width = width_constant; // a constant where with_row_width makes one
          for (std::int64_t j = 0; j < n; ++j)
            copy_row(out + static_cast<std::int64_t>(idx[j]) * width, src + j * width, width);
        });
      });
    }
  }
};

// indices[:, 0] of a sparse tensor, once its indices are checked.
template <class T> struct sparse_segment_ids_cpu {
  static void run(kernel_context& c) {
    const any_tensor& indices = c.input(0);
    const any_tensor& dense = c.input(1);
    const std::string what = c.node.attr_or<std::string>("_what", "the sparse tensor");
    const std::int64_t rank = dense.num_elements();
    check_sparse_indices(c.node, indices, dense.data<std::int64_t>(), rank, what);
    const std::int64_t n = indices.shape()[0];
    const std::int64_t* at = indices.data<std::int64_t>();
    c.output = any_tensor(dtype::i64, loom::shape{n});
    std::int64_t* rows = c.output.data<std::int64_t>();
    for (std::int64_t k = 0; k < n; ++k)
      rows[k] = rank > 0 ? at[k * rank] : 0;
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_array_kernels() {
  register_kernels<gather_cpu>("gather", all_types{});
  register_kernels<resource_gather_cpu>("resource_gather", all_types{});
  register_kernels<indexed_slices_cpu>("indexed_slices", numeric_types{});
  register_kernels<unsorted_segment_sum_cpu>("unsorted_segment_sum", numeric_types{});
  register_kernels<unique_cpu>("unique", type_list<std::int32_t, std::int64_t>{});
  register_kernels<unique_index_cpu>("unique_index", type_list<std::int32_t, std::int64_t>{});
  register_kernels<shard_unique_cpu>("shard_unique", type_list<std::int32_t, std::int64_t>{});
  register_kernels<shard_slots_cpu>("shard_slots", type_list<std::int32_t, std::int64_t>{});
  register_kernels<gather_shards_cpu>("gather_shards", all_types{});
  register_kernels<gather_shards_grad_cpu>("gather_shards_grad", numeric_types{});
  register_kernels<dynamic_stitch_cpu>("dynamic_stitch", all_types{});
  register_kernels<sparse_segment_ids_cpu>("sparse_segment_ids", type_list<std::int64_t>{});
  register_kernels<concat_cpu>("concat", all_types{});
  register_kernels<concat_grad_cpu>("concat_grad", all_types{});
  return true;
}

inline const bool array_kernels_registered = register_array_kernels();
#endif

} // namespace loom::kernels

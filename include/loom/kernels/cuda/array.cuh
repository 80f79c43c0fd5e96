// GPU kernels of the index ops of sparse models (kernels/cpu/array.hpp on the
// CPU): gather, resource_gather, indexed_slices, unsorted_segment_sum, unique,
// unique_index, shard_unique, shard_slots, gather_shards and its gradient,
// dynamic_stitch, sparse_segment_ids, concat and concat_grad, for the CPU's
// dtypes but strings.
// So an embedding lookup, its gradient and a sparse model's layers run on the
// GPU that holds their rows.
//
// Ids are checked on their host copy with the CPU's checks and messages
// before anything is written (kernels/cuda/ids.cuh). The rows move on the
// GPU: gathers, segment sums (the rows of one id summed in the CPU's order,
// grouped by ids.cuh, so the sums are the CPU's to the bit), concats and
// stitches. Where the output's size depends on the ids' values (unique,
// unique_index, shard_unique, shard_slots) the host computes it from that
// copy with the CPU's code and uploads the result: a batch's ids, and the
// host had to read them anyway. dynamic_stitch decides on the host which
// row of which part lands where (the last one, as on the CPU) and copies
// the rows on the GPU.
//
// resource_gather reads a variable in this GPU's memory under its lock; one
// on the host or another GPU is refused, naming it (as the updates do).
#pragma once

#include <loom/graph/ops/array.hpp>
#include <loom/kernels/checks/array.hpp>
#include <loom/kernels/cuda/common.cuh>
#include <loom/kernels/cuda/ids.cuh>
#include <loom/kernels/cuda/state.cuh>
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace loom::kernels::cuda_kernels {

// The unsigned integer of T's width: the kernels that only move elements
// (gathers, stitches, concats) are instantiated per width, not per dtype, so
// nvcc compiles three of each instead of five. A zero element is all zero
// bits in every dtype.
template <class T>
using same_width =
    std::conditional_t<sizeof(T) == 1, std::uint8_t,
                       std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>;
template <class T> same_width<T>* as_width(T* p) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 4 || sizeof(T) == 8);
  return reinterpret_cast<same_width<T>*>(p);
}
template <class T> const same_width<T>* as_width(const T* p) {
  return reinterpret_cast<const same_width<T>*>(p);
}

// out[r, j] = src[o, ids[k], j] for r = o * n + k over [outer * n, inner]; a
// negative id (drop_negative, checked) gives zeros.
template <class T, class I>
__global__ void gather_kernel(T* out, const T* src, const I* ids, std::int64_t n,
                              std::int64_t count, std::int64_t inner, std::int64_t total) {
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t r = e / inner, j = e - r * inner;
    const std::int64_t o = r / n, k = r - o * n;
    const auto row = static_cast<std::int64_t>(ids[k]);
    out[e] = row < 0 ? T{} : src[(o * count + row) * inner + j];
  }
}

// The rows of params (on this GPU) at the ids into c.output.
template <class T> void gather_rows(kernel_context& c, const any_tensor& params) {
  const gpu_context& g = gpu_of(c);
  const any_tensor& ids = c.input(1);
  const gather_attrs& a = c.decoded<gather_attrs>();
  const int axis = a.axis;
  const bool drop_negative = a.drop_negative;
  const axis_layout l = loom::kernels::gather_layout(c.node, params, axis);
  const std::int64_t n = ids.num_elements();
  with_ids(download(g, ids), [&](const auto* id) {
    loom::kernels::check_gather_ids(c.node, id, n, l.count, drop_negative, axis);
  });
  c.output = g.allocate(params.type(), detail::gathered_shape(params.shape(), ids.shape(), axis));
  if (const std::int64_t total = l.outer * n * l.inner; total > 0)
    with_device_ids(ids, [&]<class I>(const I* id) {
      gather_kernel<same_width<T>, I><<<grid_for(total), block_threads, 0, g.stream>>>(
          as_width(c.output.template device_data<T>()), as_width(params.template device_data<T>()),
          id, n, l.count, l.inner, total);
      check_launch();
    });
}

template <class T> struct gather_gpu {
  static void run(kernel_context& c) { gather_rows<T>(c, c.input(0)); }
};

// From a variable in this GPU's memory, under its lock: the gather is queued
// on the stream before the lock is released, so no later update overtakes it.
template <class T> struct resource_gather_gpu {
  static void run(kernel_context& c) {
    variable_resource& v = *c.refs[0];
    std::lock_guard lock(v.mu);
    loom::kernels::check_gather_variable(c.node, v);
    check_on_gpu(c, v.value, c.node.attr<std::string>("_params_name"), "read by a gather");
    gather_rows<T>(c, v.value);
  }
};

// out[o, key[u], j] = the sum of in[o, k, j] over the positions k of group u,
// in ascending k from zero (the CPU's order); the group of negative ids
// (key == count) is dropped. Rows no id names stay as they are (zeros).
template <class T>
__global__ void segment_sum_kernel(T* out, id_groups_view ids, const T* in, std::int64_t outer,
                                   std::int64_t n, std::int64_t count, std::int64_t inner) {
  const std::int64_t per_group = outer * inner;
  const std::int64_t total = static_cast<std::int64_t>(*ids.groups) * per_group;
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t u = e / per_group, rest = e - u * per_group;
    const std::int64_t o = rest / inner, j = rest - o * inner;
    const auto key = static_cast<std::int64_t>(ids.key[u]);
    if (key >= count)
      continue;
    const std::int32_t first = ids.start[u], last = first + ids.count[u];
    T sum = T(0);
#pragma unroll 4
    for (std::int32_t p = first; p < last; ++p)
      sum += in[(o * n + ids.order[p]) * inner + j];
    out[(o * count + key) * inner + j] = sum;
  }
}

// c.output = zeros of `dense` ([outer, count, inner]) with the rows of `values`
// ([outer, n, inner]) summed in at the (checked) ids.
template <class T>
void sum_rows_into_zeros(kernel_context& c, const any_tensor& values, const any_tensor& ids,
                         const loom::shape& dense, const axis_layout& l) {
  const gpu_context& g = gpu_of(c);
  const std::int64_t n = ids.num_elements();
  c.output = g.allocate(values.type(), dense);
  T* out = c.output.template device_data<T>();
  fill<T>(g, out, c.output.num_elements(), T(0));
  if (const std::int64_t total = n * l.outer * l.inner; total > 0) {
    const id_groups groups = group_ids(g, c.node, ids, l.count);
    segment_sum_kernel<T><<<grid_for(total), block_threads, 0, g.stream>>>(
        out, groups.view(), values.template device_data<T>(), l.outer, n, l.count, l.inner);
    check_launch();
  }
}

// The dense value of a sparse gradient: zeros with the rows added in.
template <class T> struct indexed_slices_gpu {
  static void run(kernel_context& c) {
    const any_tensor& values = c.input(0);
    const any_tensor& indices = c.input(1);
    const slices_attrs& a = c.decoded<slices_attrs>();
    const int axis = a.axis;
    const loom::shape dense = a.dense(c.node, c.inputs);
    loom::kernels::check_slices(c.node, values, indices, dense, axis);
    const axis_layout l = layout_around(dense, axis);
    with_ids(download(gpu_of(c), indices), [&](const auto* id) {
      check_id_range(c.node, id, indices.num_elements(), l.count, true,
                     "a dense shape " + dense.to_string());
    });
    sum_rows_into_zeros<T>(c, values, indices, dense, l);
  }
};

template <class T> struct unsorted_segment_sum_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& data = c.input(0);
    const any_tensor& ids = c.input(1);
    const std::int64_t segments = with_ids(
        download(g, c.input(2)), [](const auto* v) { return static_cast<std::int64_t>(*v); });
    const loom::shape out_shape = loom::kernels::segment_sum_shape(c.node, data, ids, segments);
    with_ids(download(g, ids), [&](const auto* id) {
      check_id_range(c.node, id, ids.num_elements(), segments, true, "the segments");
    });
    // [1, segments, inner]: one outer block.
    const axis_layout l = layout_around(out_shape, 0);
    sum_rows_into_zeros<T>(c, data, ids, out_shape, l);
  }
};

template <class I> struct unique_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor x = download(g, c.input(0));
    std::vector<I> values;
    (void)loom::kernels::unique_positions(x.data<I>(), x.num_elements(), &values);
    c.output = g.upload(
        any_tensor::from_vector(loom::shape{static_cast<std::int64_t>(values.size())}, values));
  }
};

template <class I> struct unique_index_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor x = download(g, c.input(0));
    c.output = g.upload(any_tensor::from_vector(
        x.shape(), loom::kernels::unique_positions<I>(x.data<I>(), x.num_elements(), nullptr)));
  }
};

// The distinct rows an embedding shard holds of the ids, and where each id's
// row is among its shard's: the CPU's code on the ids' host copy.
template <class I> struct shard_unique_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    c.output = g.upload(loom::kernels::shard_unique_rows<I>(
        c.node, c.decoded<shard_route_attrs>(), download(g, c.input(0)), download(g, c.input(1))));
  }
};
template <class I> struct shard_slots_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    c.output = g.upload(loom::kernels::shard_slots_of<I>(c.node, c.decoded<shard_route_attrs>(),
                                                         download(g, c.input(0))));
  }
};

// out[k, j] = part[slot % parts][slot / parts, j] for slot = slots[k].
template <class T, class I>
__global__ void gather_shards_kernel(T* out, const std::uint64_t* parts, const I* slots,
                                     std::int64_t num_parts, std::int64_t row, std::int64_t total) {
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t k = e / row, j = e - k * row;
    const auto s = static_cast<std::int64_t>(slots[k]);
    out[e] = reinterpret_cast<const T*>(parts[s % num_parts])[(s / num_parts) * row + j];
  }
}

// Inputs (slots, rows_0 ... rows_{N-1}): the slots are checked on their host
// copy against the parts' rows, then the rows move on the GPU.
template <class T> struct gather_shards_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const auto parts = c.inputs.subspan(1);
    const loom::kernels::slot_split split(c.decoded<gather_shards_attrs>().parts);
    const std::int64_t n = c.input(0).num_elements();
    with_ids(download(g, c.input(0)), [&](const auto* slot) {
      loom::kernels::check_slots(c.node, slot, n, split, [&](std::int64_t p) {
        return parts[static_cast<std::size_t>(p)]->shape()[0];
      });
    });
    c.output =
        g.allocate(parts[0]->type(), loom::kernels::gather_shards_shape(c.node, c.input(0), parts));
    const std::int64_t total = c.output.num_elements();
    if (total == 0)
      return;
    std::vector<std::uint64_t> addresses;
    for (const any_tensor* p : parts)
      addresses.push_back(reinterpret_cast<std::uint64_t>(p->device_data()));
    const auto d_parts = upload(g, addresses);
    with_device_ids(c.input(0), [&]<class I>(const I* slot) {
      gather_shards_kernel<same_width<T>, I><<<grid_for(total), block_threads, 0, g.stream>>>(
          as_width(c.output.template device_data<T>()), d_parts.data(), slot, split.parts,
          total / n, total);
      check_launch();
    });
  }
};

// Inputs (dy, slots): the rows of dy of shard `shard` summed at their rows,
// in the CPU's order: the host turns the slots into the shard's rows (-1 for
// another shard's, dropped) and the segment sum runs on the GPU.
template <class T> struct gather_shards_grad_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& dy = c.input(0);
    const gather_shards_attrs& a = c.decoded<gather_shards_attrs>();
    const loom::kernels::slot_split split(a.parts);
    loom::kernels::check_shards_adjoint(c.node, dy, c.input(1));
    const any_tensor slots = download(g, c.input(1));
    const std::int64_t n = slots.num_elements();
    any_tensor rows(dtype::i64, loom::shape{n});
    std::int64_t count = 0;
    with_ids(slots, [&](const auto* slot) {
      count = loom::kernels::shard_rows_named(slot, n, split, a.shard);
      for (std::int64_t k = 0; k < n; ++k) {
        const auto s = static_cast<std::int64_t>(slot[k]);
        rows.data<std::int64_t>()[k] = s >= 0 && split.shard(s) == a.shard ? split.row(s) : -1;
      }
    });
    std::vector<std::int64_t> d = dy.shape().dims();
    d.front() = count;
    const loom::shape dense(std::move(d));
    const any_tensor device_rows = g.upload(rows);
    sum_rows_into_zeros<T>(c, dy, device_rows, dense, layout_around(dense, 0));
  }
};

// out[r, j] = part[from_part[r]][from_row[r], j], or zeros where no index names r.
template <class T>
__global__ void stitch_kernel(T* out, const std::uint64_t* parts, const std::int32_t* from_part,
                              const std::int64_t* from_row, std::int64_t row, std::int64_t total) {
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t r = e / row, j = e - r * row;
    const std::int32_t p = from_part[r];
    out[e] = p < 0 ? T{} : reinterpret_cast<const T*>(parts[p])[from_row[r] * row + j];
  }
}

// Inputs (data_0 ... data_{N-1}, indices_0 ... indices_{N-1}). Where two
// indices name one row, the later one (in part, then position order) wins, as
// on the CPU: the host picks each row's source from the indices' copies.
template <class T> struct dynamic_stitch_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const std::size_t parts = c.decoded<stitch_attrs>().parts;
    const any_tensor& first = c.input(0);
    std::vector<any_tensor> at(parts);
    std::int64_t size = 0;
    for (std::size_t i = 0; i < parts; ++i) {
      loom::kernels::check_stitch_part(c.node, i, c.input(i), c.input(parts + i), first);
      at[i] = download(g, c.input(parts + i));
      with_ids(at[i], [&](const auto* idx) {
        check_id_range(c.node, idx, at[i].num_elements(), std::numeric_limits<std::int32_t>::max(),
                       false, "the merged tensor");
        for (std::int64_t j = 0; j < at[i].num_elements(); ++j)
          size = std::max<std::int64_t>(size, static_cast<std::int64_t>(idx[j]) + 1);
      });
    }
    std::vector<std::int64_t> d = first.shape().dims();
    d.front() = size;
    c.output = g.allocate(first.type(), loom::shape(std::move(d)));
    const std::int64_t row = size == 0 ? 0 : c.output.num_elements() / size;
    if (c.output.num_elements() == 0)
      return;
    std::vector<std::int32_t> from_part(static_cast<std::size_t>(size), -1);
    std::vector<std::int64_t> from_row(static_cast<std::size_t>(size), 0);
    std::vector<std::uint64_t> addresses(parts);
    for (std::size_t i = 0; i < parts; ++i) {
      addresses[i] = reinterpret_cast<std::uint64_t>(c.input(i).device_data());
      with_ids(at[i], [&](const auto* idx) {
        for (std::int64_t j = 0; j < at[i].num_elements(); ++j) {
          const auto r = static_cast<std::size_t>(idx[j]);
          from_part[r] = static_cast<std::int32_t>(i);
          from_row[r] = j;
        }
      });
    }
    const auto d_parts = upload(g, addresses);
    const auto d_from_part = upload(g, from_part);
    const auto d_from_row = upload(g, from_row);
    const std::int64_t total = c.output.num_elements();
    stitch_kernel<same_width<T>><<<grid_for(total), block_threads, 0, g.stream>>>(
        as_width(c.output.template device_data<T>()), d_parts.data(), d_from_part.data(),
        d_from_row.data(), row, total);
    check_launch();
  }
};

__global__ inline void first_column_kernel(std::int64_t* out, const std::int64_t* at,
                                           std::int64_t n, std::int64_t rank) {
  for (std::int64_t k = global_thread(); k < n; k += grid_threads())
    out[k] = rank > 0 ? at[k * rank] : 0;
}

// indices[:, 0] of a sparse tensor, once its indices are checked on the host.
template <class T> struct sparse_segment_ids_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& indices = c.input(0);
    const any_tensor dense = download(g, c.input(1));
    const std::int64_t rank = dense.num_elements();
    const std::string what = c.node.attr_or<std::string>("_what", "the sparse tensor");
    loom::kernels::check_sparse_indices(c.node, download(g, indices), dense.data<std::int64_t>(),
                                        rank, what);
    const std::int64_t n = indices.shape()[0];
    c.output = g.allocate(dtype::i64, loom::shape{n});
    if (n > 0) {
      first_column_kernel<<<grid_for(n), block_threads, 0, g.stream>>>(
          c.output.template device_data<std::int64_t>(),
          indices.template device_data<std::int64_t>(), n, rank);
      check_launch();
    }
  }
};

// dst[o * dst_stride + r] = src[o * src_stride + r] for o < outer, r < len.
template <class T>
__global__ void copy_blocks_kernel(T* dst, const T* src, std::int64_t len, std::int64_t dst_stride,
                                   std::int64_t src_stride, std::int64_t total) {
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t o = e / len, r = e - o * len;
    dst[o * dst_stride + r] = src[o * src_stride + r];
  }
}

template <class T>
void copy_blocks(const gpu_context& g, T* dst, const T* src, std::int64_t outer, std::int64_t len,
                 std::int64_t dst_stride, std::int64_t src_stride) {
  const std::int64_t total = outer * len;
  if (total <= 0)
    return;
  copy_blocks_kernel<same_width<T>><<<grid_for(total), block_threads, 0, g.stream>>>(
      as_width(dst), as_width(src), len, dst_stride, src_stride, total);
  check_launch();
}

template <class T> struct concat_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const int axis = c.decoded<concat_attrs>().axis;
    c.output = g.allocate(c.input(0).type(), loom::kernels::concat_shape(c.node, c.inputs, axis));
    const axis_layout out = layout_around(c.output.shape(), axis);
    T* dst = c.output.template device_data<T>();
    std::int64_t offset = 0; // along the axis, in rows of `inner`
    for (const any_tensor* x : c.inputs) {
      const std::int64_t len = x->shape()[axis] * out.inner;
      copy_blocks<T>(g, dst + offset * out.inner, x->template device_data<T>(), out.outer, len,
                     out.count * out.inner, len);
      offset += x->shape()[axis];
    }
  }
};

// Inputs (dy, x_0 ... x_k): the part of dy that came from x_index.
template <class T> struct concat_grad_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& dy = c.input(0);
    const concat_attrs& a = c.decoded<concat_attrs>();
    const int axis = a.axis;
    const std::size_t index = a.index;
    const auto xs = c.inputs.subspan(1);
    loom::kernels::check_concat_grad(c.node, dy, xs, axis);
    std::int64_t offset = 0;
    for (std::size_t k = 0; k < index; ++k)
      offset += xs[k]->shape()[axis];
    const any_tensor& x = *xs[index];
    const axis_layout whole = layout_around(dy.shape(), axis);
    c.output = g.allocate(dy.type(), x.shape());
    const std::int64_t len = x.shape()[axis] * whole.inner;
    copy_blocks<T>(g, c.output.template device_data<T>(),
                   dy.template device_data<T>() + offset * whole.inner, whole.outer, len, len,
                   whole.count * whole.inner);
  }
};

inline bool register_array_gpu() {
  using ids = type_list<std::int32_t, std::int64_t>;
  register_kernels<gather_gpu>("gather", all_types_but_string{}, device_gpu);
  register_kernels<resource_gather_gpu>("resource_gather", all_types_but_string{}, device_gpu);
  register_kernels<indexed_slices_gpu>("indexed_slices", numeric_types{}, device_gpu);
  register_kernels<unsorted_segment_sum_gpu>("unsorted_segment_sum", numeric_types{}, device_gpu);
  register_kernels<unique_gpu>("unique", ids{}, device_gpu);
  register_kernels<unique_index_gpu>("unique_index", ids{}, device_gpu);
  register_kernels<shard_unique_gpu>("shard_unique", ids{}, device_gpu);
  register_kernels<shard_slots_gpu>("shard_slots", ids{}, device_gpu);
  register_kernels<gather_shards_gpu>("gather_shards", all_types_but_string{}, device_gpu);
  register_kernels<gather_shards_grad_gpu>("gather_shards_grad", numeric_types{}, device_gpu);
  register_kernels<dynamic_stitch_gpu>("dynamic_stitch", all_types_but_string{}, device_gpu);
  register_kernels<sparse_segment_ids_gpu>("sparse_segment_ids", type_list<std::int64_t>{},
                                           device_gpu);
  register_kernels<concat_gpu>("concat", all_types_but_string{}, device_gpu);
  register_kernels<concat_grad_gpu>("concat_grad", all_types_but_string{}, device_gpu);
  return true;
}

inline const bool array_gpu_registered = register_array_gpu();

} // namespace loom::kernels::cuda_kernels

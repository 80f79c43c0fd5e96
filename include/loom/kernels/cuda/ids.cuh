// What the GPU kernels that take ids (kernels/cuda/array.cuh, scatter.cuh and
// the sparse applies of training.cuh) share: the ids' copy on the host, for
// the CPU's checks, and the grouping of equal ids on the GPU with CUB.
//
// Ids live in device memory, but a bad id must fail the step with the CPU
// kernel's message before anything is written, and a kernel must never read
// or write past a buffer. So each such kernel first copies its ids to the
// host on its stream and waits for them (one synchronisation per kernel; the
// ids are a batch's, small beside the rows they move), runs the CPU's host
// check (check_id_range and friends, kernels/checks/array.hpp) on the copy,
// and only then launches its kernels, which read the device ids.
//
// Where several ids may name one row (a sparse update, a scatter, a segment
// sum), the rows of one id are combined on the GPU, in the CPU's order:
// group_ids sorts the ids with their positions (cub::DeviceRadixSort, stable,
// over only the bits the checked ids can have), finds each distinct id's run
// (cub::DeviceRunLengthEncode) and where it starts (cub::DeviceScan), all on
// the kernel's stream without waiting. Then one thread per (distinct id,
// element of a row) reads its id's rows in their original order and writes
// its element once: no atomics, so results are deterministic and equal to the
// CPU's sums, and no row is written by two threads. The number of distinct
// ids stays on the device: the kernels that read the groups are launched for
// every id and stop at it. CUB is instantiated once (64-bit keys, 32-bit
// positions) whatever the ids' type, to keep nvcc's compile time down; its
// temporary storage comes from the caching allocator on the kernel's stream.
#pragma once

#include <loom/kernels/checks/array.hpp>
#include <loom/kernels/cuda/common.cuh>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace loom::kernels::cuda_kernels {

// A tensor in this GPU's memory copied to the host, once the work queued
// before it on the stream has run (the ids a kernel checks).
inline any_tensor download(const gpu_context& g, const any_tensor& t) {
  ++g.host_transfers;
  any_tensor out(t.type(), t.shape());
  if (t.byte_size() == 0)
    return out;
  cuda::copy_to_host(static_cast<unsigned char*>(out.raw_data()),
                     static_cast<const unsigned char*>(t.device_data()), t.byte_size(), g.stream);
  LOOM_CUDA_CHECK(cudaStreamSynchronize(g.stream));
  return out;
}

// A host vector's copy in this GPU's memory, ordered before the stream's later
// work; `v` may go at once (the driver staged it before returning).
template <class V> cuda::device_buffer<V> upload(const gpu_context& g, const std::vector<V>& v) {
  ++g.host_transfers;
  cuda::device_buffer<V> out(v.size(), g.memory_pool(), *g.allocator);
  cuda::copy_to_device(out.data(), v.data(), v.size(), g.stream);
  return out;
}

// Calls f(const I* ids) with the device ids' element type.
template <class F> decltype(auto) with_device_ids(const any_tensor& ids, F&& f) {
  if (ids.type() == dtype::i32)
    return f(ids.template device_data<std::int32_t>());
  return f(ids.template device_data<std::int64_t>());
}

// The groups of equal ids, as kernels read them: group u (u < *groups) is the
// id key[u] at the positions order[start[u] .. start[u] + count[u]), in
// ascending order; groups come in ascending id order. A key equal to the
// group_ids limit stands for the negative ids (dropped where allowed).
struct id_groups_view {
  const std::uint64_t* key;
  const std::int32_t* order;
  const std::int32_t* start;
  const std::int32_t* count;
  const std::int32_t* groups;
};

struct id_groups {
  cuda::device_buffer<std::uint64_t> key;
  cuda::device_buffer<std::int32_t> order, start, count, groups;
  id_groups_view view() const {
    return {key.data(), order.data(), start.data(), count.data(), groups.data()};
  }
};

template <class I>
__global__ void id_keys_kernel(std::uint64_t* keys, std::int32_t* positions, const I* ids,
                               std::int64_t n, std::uint64_t negative) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const I id = ids[i];
    keys[i] = id < 0 ? negative : static_cast<std::uint64_t>(id);
    positions[i] = static_cast<std::int32_t>(i);
  }
}

// Sorts (keys, positions) by key over bits [0, bits) and groups equal keys (the
// part of group_ids that does not depend on the ids' type).
inline id_groups group_keys(const gpu_context& g, const std::uint64_t* keys_in,
                            const std::int32_t* positions, int n, int bits) {
  id_groups out{
      cuda::device_buffer<std::uint64_t>(static_cast<std::size_t>(n), g.memory_pool(),
                                         *g.allocator),
      cuda::device_buffer<std::int32_t>(static_cast<std::size_t>(n), g.memory_pool(), *g.allocator),
      cuda::device_buffer<std::int32_t>(static_cast<std::size_t>(n), g.memory_pool(), *g.allocator),
      cuda::device_buffer<std::int32_t>(static_cast<std::size_t>(n), g.memory_pool(), *g.allocator),
      cuda::device_buffer<std::int32_t>(1, g.memory_pool(), *g.allocator)};
  cuda::device_buffer<std::uint64_t> sorted(static_cast<std::size_t>(n), g.memory_pool(),
                                            *g.allocator);
  std::size_t sort_bytes = 0, encode_bytes = 0, scan_bytes = 0;
  LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys_in, sorted.data(),
                                                  positions, out.order.data(), n, 0, bits,
                                                  g.stream));
  LOOM_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, encode_bytes, sorted.data(),
                                                     out.key.data(), out.count.data(),
                                                     out.groups.data(), n, g.stream));
  LOOM_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, out.count.data(),
                                                out.start.data(), n, g.stream));
  // One scratch block for the three calls: they run one after another on the stream.
  const std::size_t scratch_bytes =
      std::max({sort_bytes, encode_bytes, scan_bytes, std::size_t{1}});
  cuda::device_buffer<unsigned char> scratch(scratch_bytes, g.memory_pool(), *g.allocator);
  // The counts past the last group are never written: zeros, so that the
  // scan below reads defined values.
  LOOM_CUDA_CHECK(cudaMemsetAsync(out.count.data(), 0, out.count.bytes(), g.stream));
  std::size_t bytes = sort_bytes;
  LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch.data(), bytes, keys_in, sorted.data(),
                                                  positions, out.order.data(), n, 0, bits,
                                                  g.stream));
  bytes = encode_bytes;
  LOOM_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(scratch.data(), bytes, sorted.data(),
                                                     out.key.data(), out.count.data(),
                                                     out.groups.data(), n, g.stream));
  bytes = scan_bytes;
  LOOM_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(scratch.data(), bytes, out.count.data(),
                                                out.start.data(), n, g.stream));
  return out;
}

// The n device ids (int32 or int64), checked on the host to lie in
// [0, limit) or be negative, grouped by value on the GPU (see the top of this
// file); negative ids form the group of key `limit`. Nothing waits.
template <class I>
id_groups group_ids(const gpu_context& g, const node_def& node, const I* ids, std::int64_t n,
                    std::int64_t limit) {
  if (n > std::numeric_limits<std::int32_t>::max())
    throw invalid_argument_error("node " + node.describe() + ": " + std::to_string(n) +
                                 " ids; a GPU kernel takes at most 2^31 - 1");
  const int bits = std::max(1, static_cast<int>(std::bit_width(static_cast<std::uint64_t>(limit))));
  cuda::device_buffer<std::uint64_t> keys(static_cast<std::size_t>(n), g.memory_pool(),
                                          *g.allocator);
  cuda::device_buffer<std::int32_t> positions(static_cast<std::size_t>(n), g.memory_pool(),
                                              *g.allocator);
  id_keys_kernel<I><<<grid_for(n), block_threads, 0, g.stream>>>(
      keys.data(), positions.data(), ids, n, static_cast<std::uint64_t>(limit));
  check_launch();
  return group_keys(g, keys.data(), positions.data(), static_cast<int>(n), bits);
}

// The same for an any_tensor of ids on this GPU.
inline id_groups group_ids(const gpu_context& g, const node_def& node, const any_tensor& ids,
                           std::int64_t limit) {
  return with_device_ids(
      ids, [&](const auto* id) { return group_ids(g, node, id, ids.num_elements(), limit); });
}

} // namespace loom::kernels::cuda_kernels

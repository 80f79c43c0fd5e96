// Device memory: a caching allocator over plain cudaMalloc (never managed
// memory), RAII buffers on it, pinned host buffers for staging, and copies.
//
//   cuda::device_buffer<float> a(n, s);          // n floats on the current device, stream s
//   cuda::pinned_buffer<float> h(n);             // page-locked host memory (cudaMallocHost)
//   cuda::copy_to_device(a, h.span(), s);        // async on s
//   cuda::copy_to_host(h.span(), a, s); s.synchronize();
//
// The allocator (TF's BFC allocator / PyTorch's caching allocator, simplified):
// * sizes are rounded to a size class: multiples of 512 B below 1 MiB, of 2 MiB
//   from 1 MiB up; cudaMalloc is called for the rounded size;
// * a freed block is not returned to CUDA but cached in the free list of the
//   (device, stream) it was allocated on, and reused only by an allocation on that
//   same stream: work queued on one stream is ordered, so the next user of the block
//   on that stream cannot overtake the last one. A block used on another stream
//   must be synchronised by the caller before it is freed;
// * a request takes the smallest cached block of its size class or larger, up to
//   twice its size (bounded waste); otherwise cudaMalloc. When cudaMalloc runs out of
//   memory the device's cache is released and the call retried once; then
//   resource_exhausted_error;
// * empty_cache() returns every cached block to CUDA (cudaFree synchronises);
// * stats(): bytes in use, bytes cached, peak, cudaMalloc/cudaFree calls, hits, per
//   device (stats(device)) or summed over the devices;
// * thread-safe (one mutex). default_allocator() is a process-wide instance that is
//   never destroyed, so buffers freed during static destruction stay valid.
// Host-only (cuda_runtime_api.h): compiles with the host compiler and CUDA::cudart.
#pragma once

#include <loom/core/error.hpp>
#include <loom/kernels/cuda/error.hpp>
#include <loom/kernels/cuda/stream.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace loom::cuda {

struct allocator_stats {
  std::size_t bytes_in_use = 0;      // size-class bytes of the blocks handed out
  std::size_t bytes_requested = 0;   // bytes asked for by the blocks handed out
  std::size_t peak_bytes_in_use = 0; // maximum of bytes_in_use since the last reset_peak()
  std::size_t bytes_cached = 0;      // free blocks held for reuse
  std::size_t cuda_malloc_calls = 0; // successful cudaMalloc calls
  std::size_t cuda_free_calls = 0;
  std::size_t allocations = 0; // allocate() calls that returned a block
  std::size_t cache_hits = 0;  // of those, served from the cache
};

class caching_allocator {
public:
  static constexpr std::size_t small_granularity = 512;
  static constexpr std::size_t large_threshold = std::size_t{1} << 20;
  static constexpr std::size_t large_granularity = std::size_t{2} << 20;

  // The size class of a request: 0 stays 0.
  static constexpr std::size_t round_size(std::size_t bytes) noexcept {
    const std::size_t g = bytes < large_threshold ? small_granularity : large_granularity;
    return (bytes + g - 1) / g * g;
  }

  caching_allocator() = default;
  caching_allocator(const caching_allocator&) = delete;
  caching_allocator& operator=(const caching_allocator&) = delete;
  // Returns the cached blocks; blocks still in use are leaked, not freed under their user.
  ~caching_allocator() { empty_cache(); }

  // A block of at least `bytes` on the current device, for use on `stream`;
  // nullptr for 0 bytes. Aligned to at least 256 bytes.
  void* allocate(std::size_t bytes, cudaStream_t stream) {
    if (bytes == 0)
      return nullptr;
    const std::size_t size = round_size(bytes);
    const int device = current_device();
    std::lock_guard lock(mutex_);
    auto [p, block_size] = take_cached(device, stream, size);
    allocator_stats& st = stats_[device];
    if (p) {
      ++st.cache_hits;
    } else {
      p = malloc_locked(device, size);
      block_size = size;
    }
    try {
      active_.emplace(p, block{block_size, bytes, device, stream});
    } catch (...) {
      release(device, p, block_size, false);
      throw;
    }
    st.bytes_in_use += block_size;
    st.bytes_requested += bytes;
    if (st.bytes_in_use > st.peak_bytes_in_use)
      st.peak_bytes_in_use = st.bytes_in_use;
    ++st.allocations;
    return p;
  }

  // Returns a block to the free list of the stream it was allocated for. False
  // (and nothing done) for a pointer this allocator did not hand out.
  bool deallocate(void* p) noexcept {
    if (!p)
      return true;
    std::lock_guard lock(mutex_);
    const auto it = active_.find(p);
    if (it == active_.end())
      return false;
    const block b = it->second;
    active_.erase(it);
    allocator_stats& st = stats_.find(b.device)->second; // made by its allocate()
    st.bytes_in_use -= b.size;
    st.bytes_requested -= b.requested;
    if (released_pools_.count(pool_key{b.device, key_of(b.stream)})) { // its pool is gone
      release(b.device, p, b.size, false);
      return true;
    }
    try {
      free_[pool_key{b.device, key_of(b.stream)}].emplace(b.size, p);
      st.bytes_cached += b.size;
    } catch (...) { // no memory for the map node: give the block back to CUDA
      release(b.device, p, b.size, false);
    }
    return true;
  }

  // cudaFree for every cached block, on every device and stream.
  void empty_cache() noexcept {
    std::lock_guard lock(mutex_);
    release_cache_locked(-1);
  }

  // cudaFree for the cached blocks of one pool (a key of a CUDA graph's memory, which no
  // stream has: backend.hpp), and for its blocks still in use when they come back.
  void release_pool(int device, cudaStream_t pool) noexcept {
    std::lock_guard lock(mutex_);
    const pool_key key{device, key_of(pool)};
    if (const auto it = free_.find(key); it != free_.end()) {
      for (auto& [size, p] : it->second)
        release(device, p, size, true);
      free_.erase(it);
    }
    try {
      released_pools_.insert(key);
    } catch (...) { // no memory for the set node: its blocks in use stay cached, unused
    }
  }

  // Summed over the devices (a peak: the sum of each device's).
  allocator_stats stats() const {
    std::lock_guard lock(mutex_);
    allocator_stats sum;
    for (const auto& [device, st] : stats_) {
      sum.bytes_in_use += st.bytes_in_use;
      sum.bytes_requested += st.bytes_requested;
      sum.peak_bytes_in_use += st.peak_bytes_in_use;
      sum.bytes_cached += st.bytes_cached;
      sum.cuda_malloc_calls += st.cuda_malloc_calls;
      sum.cuda_free_calls += st.cuda_free_calls;
      sum.allocations += st.allocations;
      sum.cache_hits += st.cache_hits;
    }
    return sum;
  }
  allocator_stats stats(int device) const {
    std::lock_guard lock(mutex_);
    const auto it = stats_.find(device);
    return it == stats_.end() ? allocator_stats{} : it->second;
  }
  // The peak starts again from the bytes in use now: on every device (-1), or one.
  void reset_peak(int device = -1) {
    std::lock_guard lock(mutex_);
    for (auto& [d, st] : stats_)
      if (device < 0 || d == device)
        st.peak_bytes_in_use = st.bytes_in_use;
  }

private:
  struct block {
    std::size_t size;
    std::size_t requested;
    int device;
    cudaStream_t stream;
  };
  using pool_key = std::pair<int, std::uintptr_t>;
  static std::uintptr_t key_of(cudaStream_t s) noexcept {
    return reinterpret_cast<std::uintptr_t>(s);
  }

  // The smallest cached block of this stream that fits, if it is at most twice
  // the request: {pointer, its size class}, or {nullptr, 0}.
  std::pair<void*, std::size_t> take_cached(int device, cudaStream_t stream, std::size_t size) {
    const auto pool = free_.find(pool_key{device, key_of(stream)});
    if (pool == free_.end())
      return {nullptr, 0};
    const auto it = pool->second.lower_bound(size);
    if (it == pool->second.end() || it->first > 2 * size)
      return {nullptr, 0};
    const std::pair<void*, std::size_t> found{it->second, it->first};
    pool->second.erase(it);
    stats_[device].bytes_cached -= found.second;
    return found;
  }

  void* malloc_locked(int device, std::size_t size) {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cache_locked(device);
      e = cudaMalloc(&p, size);
    }
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw resource_exhausted_error("loom::cuda::caching_allocator: out of memory on GPU " +
                                     std::to_string(device) + " allocating " +
                                     std::to_string(size) + " bytes (" +
                                     std::to_string(stats_[device].bytes_in_use) +
                                     " bytes in use by this allocator, cache released)");
    }
    LOOM_CUDA_CHECK(e);
    ++stats_[device].cuda_malloc_calls;
    return p;
  }

  // cudaFree for the cached blocks of one device (-1: all devices).
  void release_cache_locked(int device) noexcept {
    for (auto it = free_.begin(); it != free_.end();) {
      if (device >= 0 && it->first.first != device) {
        ++it;
        continue;
      }
      for (auto& [size, p] : it->second)
        release(it->first.first, p, size, true);
      it = free_.erase(it);
    }
  }

  void release(int device, void* p, std::size_t size, bool was_cached) noexcept {
    int previous = -1;
    const bool switch_device = cudaGetDevice(&previous) == cudaSuccess && previous != device;
    if (switch_device)
      (void)cudaSetDevice(device);
    const auto st = stats_.find(device); // made by the block's allocate()
    if (cudaFree(p) == cudaSuccess) {
      if (st != stats_.end())
        ++st->second.cuda_free_calls;
    } else {
      (void)cudaGetLastError(); // e.g. the runtime is already shutting down
    }
    if (switch_device)
      (void)cudaSetDevice(previous);
    if (was_cached && st != stats_.end())
      st->second.bytes_cached -= size;
  }

  mutable std::mutex mutex_;
  std::unordered_map<void*, block> active_;
  std::map<pool_key, std::multimap<std::size_t, void*>> free_;
  std::set<pool_key> released_pools_;    // CUDA graphs' pools, dropped with their graphs
  std::map<int, allocator_stats> stats_; // per device
};

// The process-wide allocator. Never destroyed: buffers released during static
// destruction (or after the CUDA runtime has shut down) stay harmless.
inline caching_allocator& default_allocator() {
  static caching_allocator* const instance = new caching_allocator();
  return *instance;
}

// n elements of T in device memory from a caching_allocator, for use on one
// stream. Move-only; the destructor returns the block to the allocator's cache
// of that stream (queued work on the stream may still be using it: that is safe,
// the next user of the block on that stream is ordered after it).
template <class T> class device_buffer {
  static_assert(std::is_trivially_copyable_v<T>,
                "loom::cuda::device_buffer: the element type must be trivially copyable");

public:
  device_buffer() = default;
  explicit device_buffer(std::size_t n, cudaStream_t stream = nullptr,
                         caching_allocator& alloc = default_allocator())
      : alloc_(&alloc), stream_(stream), size_(n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T))
      throw invalid_argument_error("loom::cuda::device_buffer: " + std::to_string(n) +
                                   " elements overflow the byte count");
    data_ = static_cast<T*>(alloc.allocate(n * sizeof(T), stream));
  }
  ~device_buffer() { reset(); }
  device_buffer(device_buffer&& o) noexcept
      : alloc_(o.alloc_), stream_(o.stream_), data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      alloc_ = o.alloc_;
      stream_ = o.stream_;
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return size_ * sizeof(T); }
  bool empty() const noexcept { return size_ == 0; }
  cudaStream_t stream() const noexcept { return stream_; }

  // Returns the block to the allocator now.
  void reset() noexcept {
    if (data_ && alloc_)
      alloc_->deallocate(data_);
    data_ = nullptr;
    size_ = 0;
  }

private:
  caching_allocator* alloc_ = nullptr;
  cudaStream_t stream_ = nullptr;
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// n elements of page-locked host memory (cudaMallocHost): the staging area that
// lets cudaMemcpyAsync overlap with the host. Not cached. Move-only.
template <class T> class pinned_buffer {
  static_assert(std::is_trivially_copyable_v<T>,
                "loom::cuda::pinned_buffer: the element type must be trivially copyable");

public:
  pinned_buffer() = default;
  explicit pinned_buffer(std::size_t n) : size_(n) {
    if (n == 0)
      return;
    if (n > static_cast<std::size_t>(-1) / sizeof(T))
      throw invalid_argument_error("loom::cuda::pinned_buffer: " + std::to_string(n) +
                                   " elements overflow the byte count");
    void* p = nullptr;
    LOOM_CUDA_CHECK(cudaMallocHost(&p, n * sizeof(T)));
    data_ = static_cast<T*>(p);
  }
  ~pinned_buffer() { reset(); }
  pinned_buffer(pinned_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return size_ * sizeof(T); }
  bool empty() const noexcept { return size_ == 0; }
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }
  T* begin() noexcept { return data_; }
  T* end() noexcept { return data_ + size_; }
  const T* begin() const noexcept { return data_; }
  const T* end() const noexcept { return data_ + size_; }
  std::span<T> span() noexcept { return {data_, size_}; }
  std::span<const T> span() const noexcept { return {data_, size_}; }

  void reset() noexcept {
    if (data_)
      (void)cudaFreeHost(data_);
    data_ = nullptr;
    size_ = 0;
  }

private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// -- copies (asynchronous on a stream; from pageable host memory CUDA stages them
// and the call returns only once the source has been read) --------------------------

// True when `p` points into page-locked host memory (cudaHostAlloc or cudaHostRegister):
// a copy from it is the GPU's own and runs after the call returns.
inline bool is_page_locked(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}

template <class T>
void copy_to_device(T* dst_device, const T* src_host, std::size_t n, cudaStream_t stream) {
  if (n)
    LOOM_CUDA_CHECK(
        cudaMemcpyAsync(dst_device, src_host, n * sizeof(T), cudaMemcpyHostToDevice, stream));
}
template <class T>
void copy_to_host(T* dst_host, const T* src_device, std::size_t n, cudaStream_t stream) {
  if (n)
    LOOM_CUDA_CHECK(
        cudaMemcpyAsync(dst_host, src_device, n * sizeof(T), cudaMemcpyDeviceToHost, stream));
}
template <class T>
void copy_device_to_device(T* dst_device, const T* src_device, std::size_t n, cudaStream_t stream) {
  if (n)
    LOOM_CUDA_CHECK(
        cudaMemcpyAsync(dst_device, src_device, n * sizeof(T), cudaMemcpyDeviceToDevice, stream));
}

// The whole of `src` into the front of `dst`, on dst's stream unless one is given.
template <class T>
void copy_to_device(device_buffer<T>& dst, std::type_identity_t<std::span<const T>> src,
                    cudaStream_t stream) {
  if (src.size() > dst.size())
    throw invalid_argument_error("loom::cuda::copy_to_device: " + std::to_string(src.size()) +
                                 " elements do not fit a device buffer of " +
                                 std::to_string(dst.size()));
  copy_to_device(dst.data(), src.data(), src.size(), stream);
}
template <class T>
void copy_to_device(device_buffer<T>& dst, std::type_identity_t<std::span<const T>> src) {
  copy_to_device(dst, src, dst.stream());
}

// The front of `src` into the whole of `dst`, on src's stream unless one is given.
template <class T>
void copy_to_host(std::type_identity_t<std::span<T>> dst, const device_buffer<T>& src,
                  cudaStream_t stream) {
  if (dst.size() > src.size())
    throw invalid_argument_error("loom::cuda::copy_to_host: a device buffer of " +
                                 std::to_string(src.size()) + " elements cannot fill " +
                                 std::to_string(dst.size()));
  copy_to_host(dst.data(), src.data(), dst.size(), stream);
}
template <class T>
void copy_to_host(std::type_identity_t<std::span<T>> dst, const device_buffer<T>& src) {
  copy_to_host(dst, src, src.stream());
}

} // namespace loom::cuda

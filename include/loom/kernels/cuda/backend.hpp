// The GPU backend of the executor (kernels/gpu_backend.hpp) over CUDA: one
// context per device (a stream, a cuBLAS handle, the caching allocator), and
// GPU kernels and copies run on that stream.
//
// Ordering: every GPU kernel and every copy of a device runs on its one
// stream, so they run in the order the executor issued them, and a block the
// allocator hands out again on that stream cannot be overwritten before its
// last reader ran. A copy to the host waits for the stream: what the host
// reads is complete. A copy to a GPU does not wait: cudaMemcpyAsync from
// pageable memory returns once the driver has staged the source (no extra
// copy of ours, no pinned buffer to keep), so the host tensor may go at once
// and the GPU's queued work keeps running.
//
// Registered before main() by including this header in any translation unit
// (kernels/cuda/cuda.cuh does, with the GPU kernels); host-only (cudart,
// cuBLAS), so a g++ translation unit may include it too.
#pragma once

#include <loom/core/tensor.hpp>
#include <loom/kernels/cuda/allocator.hpp>
#include <loom/kernels/cuda/error.hpp>
#include <loom/kernels/cuda/stream.hpp>
#include <loom/kernels/gpu_backend.hpp>
#include <loom/kernels/registry.hpp>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace loom {
namespace kernels {

// What a GPU kernel launches on (kernel_context::gpu).
struct gpu_context {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr; // bound to `stream`
  cuda::caching_allocator* allocator = nullptr;
  // While a step is recorded into a CUDA graph: the graph's memory pool, which its kernels
  // allocate from (a key of the allocator's free lists that is no stream), else the stream.
  cudaStream_t pool = nullptr;
  // Copies between host and GPU memory made by kernels (upload, ids.cuh's download):
  // counted, as a step whose kernels make them cannot be recorded.
  mutable std::uint64_t host_transfers = 0;

  // The allocator's key for this GPU's kernels' memory.
  cudaStream_t memory_pool() const noexcept { return pool ? pool : stream; }

  // An uninitialised tensor on this GPU, its memory reused on this stream.
  any_tensor allocate(dtype t, loom::shape s) const {
    const auto n = s.num_elements();
    const std::size_t bytes = static_cast<std::size_t>(n) * size_of(t);
    cuda::caching_allocator* a = allocator;
    void* p = bytes ? a->allocate(bytes, memory_pool()) : nullptr;
    return any_tensor::adopt(t, std::move(s), memory_location::gpu(device), p,
                             [a](void* q) { a->deallocate(q); });
  }

  // A host tensor's copy on this GPU, ordered before this stream's later work; `host` may
  // go, or be written, at once. From pageable memory the driver has staged the bytes when
  // cudaMemcpyAsync returns. From page-locked memory (loom::pinned_tensor) the copy is the
  // GPU's own, at the full host-to-device rate, and asynchronous: this waits for it, as
  // whoever fed the tensor may refill it as soon as the step returns, and a step that
  // fetches nothing from this GPU returns without waiting for the GPU.
  any_tensor upload(const any_tensor& host) const {
    ++host_transfers;
    any_tensor out = allocate(host.type(), host.shape());
    cuda::copy_to_device(static_cast<unsigned char*>(out.device_data()),
                         static_cast<const unsigned char*>(host.raw_data()), host.byte_size(),
                         stream);
    if (host.byte_size() && cuda::is_page_locked(host.raw_data()))
      LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    return out;
  }

  // A copy of a tensor on this GPU in a buffer of its own.
  any_tensor clone(const any_tensor& t) const {
    any_tensor out = allocate(t.type(), t.shape());
    cuda::copy_device_to_device(static_cast<unsigned char*>(out.device_data()),
                                static_cast<const unsigned char*>(t.device_data()), t.byte_size(),
                                stream);
    return out;
  }
};

} // namespace kernels

namespace cuda {

inline const char* describe(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  default: return "a cuBLAS error";
  }
}

// Throws internal_error naming the call and status unless `s` is success.
inline void check_cublas(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw internal_error(std::string("cuBLAS: ") + call + " failed: " + describe(s));
}

class backend final : public loom::kernels::gpu_backend {
public:
  backend() : count_(cuda::device_count()), devices_(static_cast<std::size_t>(count_)) {}
  backend(const backend&) = delete;
  backend& operator=(const backend&) = delete;

  int device_count() const noexcept override { return count_; }

  // Calls f(context) of GPU `device` with the device current, and the
  // device's stream, allocator and cuBLAS handle to itself until f returns.
  template <class F> decltype(auto) on_device(int device, F&& f) {
    per_device& d = at(device);
    std::lock_guard lock(d.mu);
    device_guard g(device);
    return std::forward<F>(f)(d.context);
  }

  void run(int device, loom::kernels::kernel_fn kernel, loom::kernels::kernel_context& c) override {
    for (const any_tensor* in : c.inputs)
      if (in && !in->empty() && in->location() != memory_location::gpu(device))
        throw internal_error("node " + c.node.describe() + " on GPU:" + std::to_string(device) +
                             " got an input " + in->describe());
    on_device(device, [&](loom::kernels::gpu_context& g) {
      c.gpu = &g;
      const std::uint64_t transfers = g.host_transfers;
      kernel(c);
      if (g.host_transfers != transfers)
        ++kernel_transfers();
      LOOM_CUDA_CHECK(cudaGetLastError()); // a launch that failed
    });
  }

  void run_batch(int device, loom::kernels::batch_kernel_fn kernel,
                 std::span<loom::kernels::kernel_context* const> contexts) override {
    for (const loom::kernels::kernel_context* c : contexts)
      for (const any_tensor* in : c->inputs)
        if (in && !in->empty() && in->location() != memory_location::gpu(device))
          throw internal_error("node " + c->node.describe() + " on GPU:" + std::to_string(device) +
                               " got an input " + in->describe());
    on_device(device, [&](loom::kernels::gpu_context& g) {
      for (loom::kernels::kernel_context* c : contexts)
        c->gpu = &g;
      const std::uint64_t transfers = g.host_transfers;
      kernel(contexts);
      if (g.host_transfers != transfers)
        ++kernel_transfers();
      LOOM_CUDA_CHECK(cudaGetLastError()); // a launch that failed
    });
  }

  bool run_fused(int device, loom::kernels::gpu_fused_kernel_fn kernel,
                 std::span<const any_tensor* const> leaves, any_tensor& out,
                 const std::string& node_name) override {
    for (const any_tensor* in : leaves)
      if (in->location() != memory_location::gpu(device))
        throw internal_error("fused region '" + node_name + "' on GPU:" + std::to_string(device) +
                             " got an input " + in->describe());
    return on_device(device, [&](const loom::kernels::gpu_context& g) {
      const bool ran = kernel(g, leaves, out, node_name);
      LOOM_CUDA_CHECK(cudaGetLastError()); // a launch that failed
      return ran;
    });
  }

  any_tensor copy(const any_tensor& t, memory_location where) override {
    if (t.type() == dtype::string)
      throw invalid_argument_error("a string tensor " + t.describe() + " cannot move to " +
                                   where.to_string());
    if (!where.on_host()) {
      per_device& d = at(where.device);
      std::lock_guard lock(d.mu);
      device_guard g(where.device);
      if (t.on_host())
        return d.context.upload(t);
      // From another GPU: wait for its stream (t's last writer), copy, and wait
      // for the copy: t's block returns to the other GPU's free list when t
      // goes, and that GPU's next allocation must not overwrite it mid-copy.
      per_device& from = at(t.location().device);
      LOOM_CUDA_CHECK(cudaStreamSynchronize(from.context.stream));
      any_tensor out = d.context.allocate(t.type(), t.shape());
      if (t.byte_size())
        LOOM_CUDA_CHECK(cudaMemcpyPeerAsync(out.device_data(), where.device, t.device_data(),
                                            t.location().device, t.byte_size(), d.context.stream));
      LOOM_CUDA_CHECK(cudaStreamSynchronize(d.context.stream));
      return out;
    }
    per_device& d = at(t.location().device);
    std::lock_guard lock(d.mu);
    device_guard g(t.location().device);
    any_tensor out(t.type(), t.shape());
    copy_to_host(static_cast<unsigned char*>(out.raw_data()),
                 static_cast<const unsigned char*>(t.device_data()), t.byte_size(),
                 d.context.stream);
    LOOM_CUDA_CHECK(cudaStreamSynchronize(d.context.stream));
    return out;
  }

  // Page-locked host memory (cudaHostAlloc, portable: any device copies from it at its
  // full rate); freed by cudaFreeHost when the tensor's last copy goes.
  any_tensor allocate_pinned(dtype t, loom::shape s) override {
    if (t == dtype::string)
      throw invalid_argument_error("a string tensor cannot live in page-locked memory");
    const std::size_t bytes = static_cast<std::size_t>(s.num_elements()) * size_of(t);
    void* p = nullptr;
    if (bytes) {
      const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        throw resource_exhausted_error("cannot allocate " + std::to_string(bytes) +
                                       " bytes of page-locked host memory for a tensor of shape " +
                                       s.to_string() + ": " + cudaGetErrorString(e));
      }
    }
    return any_tensor::adopt(t, std::move(s), memory_location::host(), p, [](void* q) {
      if (q)
        (void)cudaFreeHost(q);
    });
  }

  void copy_into(any_tensor& to, const any_tensor& from) override {
    if (to.type() != from.type() || to.shape() != from.shape() || (to.on_host() && from.on_host()))
      throw internal_error("a copy of " + from.describe() + " into " + to.describe());
    if (to.on_host()) { // from a GPU, not waited for: see gpu_backend::copy_into
      per_device& d = at(from.location().device);
      std::lock_guard lock(d.mu);
      device_guard g(from.location().device);
      copy_to_host(static_cast<unsigned char*>(to.raw_data()),
                   static_cast<const unsigned char*>(from.device_data()), from.byte_size(),
                   d.context.stream);
      return;
    }
    per_device& d = at(to.location().device);
    std::lock_guard lock(d.mu);
    device_guard g(to.location().device);
    if (from.byte_size() == 0)
      return;
    if (from.on_host()) {
      cuda::copy_to_device(static_cast<unsigned char*>(to.device_data()),
                           static_cast<const unsigned char*>(from.raw_data()), from.byte_size(),
                           d.context.stream);
      return; // no wait, even from page-locked memory: see gpu_backend::copy_into
    }
    // From a GPU: its stream first (from's last writer), then the copy, waited for (as copy()).
    LOOM_CUDA_CHECK(cudaStreamSynchronize(at(from.location().device).context.stream));
    LOOM_CUDA_CHECK(cudaMemcpyPeerAsync(to.device_data(), to.location().device, from.device_data(),
                                        from.location().device, from.byte_size(),
                                        d.context.stream));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(d.context.stream));
  }

  // The allocator's own figures: asking creates no context on a GPU never used.
  gpu_memory_info memory(int device) const override {
    const cuda::allocator_stats st = default_allocator().stats(device);
    return {static_cast<std::int64_t>(st.bytes_in_use), static_cast<std::int64_t>(st.bytes_cached),
            static_cast<std::int64_t>(st.peak_bytes_in_use)};
  }
  void reset_memory_peak(int device) override { default_allocator().reset_peak(device); }

  bool can_capture() const noexcept override { return true; }
  std::unique_ptr<capture> begin_capture(int device) override;
  std::uint64_t kernel_host_transfers() const noexcept override { return kernel_transfers(); }

  void synchronize(int device) override {
    on_device(device, [](const loom::kernels::gpu_context& g) {
      LOOM_CUDA_CHECK(cudaStreamSynchronize(g.stream));
    });
  }

private:
  class cuda_capture;
  class cuda_graph;

  struct per_device {
    std::once_flag made;
    // Kernels and copies of concurrent steps, one at a time; held by a recording for its
    // whole step, whose thread takes it again for each of its kernels.
    std::recursive_mutex mu;
    std::unique_ptr<stream> s;
    loom::kernels::gpu_context context;
    void* blas_workspace = nullptr;
    ~per_device() {
      if (context.blas)
        cublasDestroy(context.blas);
    }
  };

  static std::uint64_t& kernel_transfers() noexcept {
    thread_local std::uint64_t n = 0;
    return n;
  }

  // Device `i`'s context, made on first use (a stream and a cuBLAS handle
  // cost a context on the device: a process that places nothing there pays nothing).
  per_device& at(int i) {
    if (i < 0 || i >= count_)
      throw invalid_argument_error("GPU:" + std::to_string(i) +
                                   " does not exist: this process has " + std::to_string(count_) +
                                   " GPU(s)");
    per_device& d = devices_[static_cast<std::size_t>(i)];
    std::call_once(d.made, [&] {
      device_guard g(i);
      d.s = std::make_unique<stream>();
      d.context.device = i;
      d.context.stream = d.s->get();
      d.context.allocator = &default_allocator();
      check_cublas(cublasCreate(&d.context.blas), "cublasCreate");
      check_cublas(cublasSetStream(d.context.blas, d.context.stream), "cublasSetStream");
      // A workspace of its own (NVIDIA's advice for Hopper: 32 MiB), so that no product
      // allocates while a step is recorded into a CUDA graph.
      constexpr std::size_t workspace = std::size_t{32} << 20;
      LOOM_CUDA_CHECK(cudaMalloc(&d.blas_workspace, workspace));
      check_cublas(cublasSetWorkspace(d.context.blas, d.blas_workspace, workspace),
                   "cublasSetWorkspace");
    });
    return d;
  }

  int count_;
  std::vector<per_device> devices_;
};

// A step's recording: holds the device (its lock, taken again by the recording thread for
// each kernel) and points the device's kernels at the graph's memory pool until it ends.
class backend::cuda_capture final : public loom::kernels::gpu_backend::capture {
public:
  cuda_capture(backend& b, int device) : b_(b), device_(device), d_(b.at(device)) {
    d_.mu.lock();
    try {
      device_guard g(device_);
      pool_ = reinterpret_cast<cudaStream_t>(next_pool_key());
      d_.context.pool = pool_;
      LOOM_CUDA_CHECK(cudaStreamBeginCapture(d_.context.stream, cudaStreamCaptureModeRelaxed));
      recording_ = true;
    } catch (...) {
      d_.context.pool = nullptr;
      d_.mu.unlock();
      throw;
    }
  }
  cuda_capture(const cuda_capture&) = delete;
  cuda_capture& operator=(const cuda_capture&) = delete;
  ~cuda_capture() override {
    if (recording_) { // not finished (the step failed): end it, keep nothing
      cudaGraph_t g = nullptr;
      if (cudaStreamEndCapture(d_.context.stream, &g) == cudaSuccess && g)
        (void)cudaGraphDestroy(g);
      (void)cudaGetLastError();
    }
    d_.context.pool = nullptr;
    if (pool_) // no graph took the pool
      default_allocator().release_pool(device_, pool_);
    d_.mu.unlock();
  }

  std::unique_ptr<graph> finish(std::string& why) override;

private:
  static std::uintptr_t next_pool_key() noexcept {
    // Keys no stream has: low addresses, one per recording of the process.
    static std::atomic<std::uintptr_t> n{0};
    return (n.fetch_add(1, std::memory_order_relaxed) + 1) * 16;
  }

  backend& b_;
  int device_;
  per_device& d_;
  cudaStream_t pool_ = nullptr;
  bool recording_ = false;
};

// A recorded step: launched on the device's stream; its pool returns to CUDA with it.
class backend::cuda_graph final : public loom::kernels::gpu_backend::graph {
public:
  cuda_graph(backend& b, int device, cudaGraphExec_t exec, cudaStream_t pool)
      : b_(b), device_(device), exec_(exec), pool_(pool) {}
  cuda_graph(const cuda_graph&) = delete;
  cuda_graph& operator=(const cuda_graph&) = delete;
  ~cuda_graph() override {
    (void)cudaGraphExecDestroy(exec_);
    default_allocator().release_pool(device_, pool_);
  }
  void launch() override {
    b_.on_device(device_, [&](const loom::kernels::gpu_context& g) {
      LOOM_CUDA_CHECK(cudaGraphLaunch(exec_, g.stream));
    });
  }

private:
  backend& b_;
  int device_;
  cudaGraphExec_t exec_;
  cudaStream_t pool_;
};

inline auto backend::cuda_capture::finish(std::string& why) -> std::unique_ptr<graph> {
  device_guard g(device_);
  recording_ = false;
  cudaGraph_t recorded = nullptr;
  cudaError_t e = cudaStreamEndCapture(d_.context.stream, &recorded);
  d_.context.pool = nullptr;
  if (e != cudaSuccess || !recorded) {
    (void)cudaGetLastError();
    why = std::string("CUDA did not record it (") + cudaGetErrorString(e) + ")";
    return nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  e = cudaGraphInstantiate(&exec, recorded, 0);
  (void)cudaGraphDestroy(recorded);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    why = std::string("CUDA did not instantiate its graph (") + cudaGetErrorString(e) + ")";
    return nullptr;
  }
  auto out = std::make_unique<cuda_graph>(b_, device_, exec, std::exchange(pool_, nullptr));
  return out;
}

inline auto backend::begin_capture(int device) -> std::unique_ptr<capture> {
  return std::make_unique<cuda_capture>(*this, device);
}

// The process's backend, registered before main(); never destroyed (tensors in
// static objects may release device memory late).
inline backend& the_backend() {
  static backend* b = [] {
    auto* p = new backend();
    loom::kernels::gpu_backend::register_backend(p);
    return p;
  }();
  return *b;
}

namespace detail {
inline const bool backend_registered = (the_backend(), true);
} // namespace detail

} // namespace cuda
} // namespace loom

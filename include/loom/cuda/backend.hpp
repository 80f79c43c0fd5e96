// The GPU backend of the executor (kernels/gpu_backend.hpp) over CUDA: one
// context per device (a stream, a cuBLAS handle, the caching allocator), GPU
// kernels run on that stream, and copies between host and device memory go
// through pinned staging buffers.
//
// Ordering: every GPU kernel and every copy of a device runs on its one
// stream, so they run in the order the executor issued them, and a block the
// allocator hands out again on that stream cannot be overwritten before its
// last reader ran. A copy to the host waits for the stream: what the host
// reads is complete.
//
// Registered before main() by including this header in any translation unit
// (kernels/cuda/cuda.cuh does, with the GPU kernels); host-only (cudart,
// cuBLAS), so a g++ translation unit may include it too.
#pragma once

#include <loom/core/tensor.hpp>
#include <loom/cuda/allocator.hpp>
#include <loom/cuda/error.hpp>
#include <loom/cuda/stream.hpp>
#include <loom/kernels/gpu_backend.hpp>
#include <loom/kernels/registry.hpp>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace loom {

// What a GPU kernel launches on (kernel_context::gpu).
struct gpu_context {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr; // bound to `stream`
  cuda::caching_allocator* allocator = nullptr;

  // An uninitialised tensor on this GPU, its memory reused on this stream.
  any_tensor allocate(dtype t, loom::shape s) const {
    const auto n = s.num_elements();
    const std::size_t bytes = static_cast<std::size_t>(n) * size_of(t);
    cuda::caching_allocator* a = allocator;
    void* p = bytes ? a->allocate(bytes, stream) : nullptr;
    return any_tensor::adopt(t, std::move(s), memory_location::gpu(device), p,
                             [a](void* q) { a->deallocate(q); });
  }
};

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

class backend final : public gpu_backend {
public:
  backend() : count_(cuda::device_count()), devices_(static_cast<std::size_t>(count_)) {}
  backend(const backend&) = delete;
  backend& operator=(const backend&) = delete;

  int device_count() const noexcept override { return count_; }

  void run(int device, kernel_fn kernel, kernel_context& c) override {
    per_device& d = at(device);
    std::lock_guard lock(d.mu);
    device_guard g(device);
    for (const any_tensor* in : c.inputs)
      if (in && !in->empty() && in->location() != memory_location::gpu(device))
        throw internal_error("node " + c.node.describe() + " on GPU:" + std::to_string(device) +
                             " got an input " + in->describe());
    c.gpu = &d.context;
    kernel(c);
    LOOM_CUDA_CHECK(cudaGetLastError()); // a launch that failed
  }

  any_tensor copy(const any_tensor& t, memory_location where) override {
    if (t.type() == dtype::string)
      throw invalid_argument_error("a string tensor " + t.describe() + " cannot move to " +
                                   where.to_string());
    if (!where.on_host()) {
      per_device& d = at(where.device);
      std::lock_guard lock(d.mu);
      device_guard g(where.device);
      any_tensor out = d.context.allocate(t.type(), t.shape());
      if (t.byte_size() == 0)
        return out;
      if (t.on_host()) { // through the staging buffer: the copy is asynchronous
        stage(d, t.byte_size());
        std::memcpy(d.staging.data(), t.raw_data(), t.byte_size());
        LOOM_CUDA_CHECK(cudaMemcpyAsync(out.device_data(), d.staging.data(), t.byte_size(),
                                        cudaMemcpyHostToDevice, d.context.stream));
        // The staging buffer is reused by the next copy: wait until this one read it.
        LOOM_CUDA_CHECK(cudaStreamSynchronize(d.context.stream));
      } else { // from another GPU: wait for its stream, then copy peer to peer
        per_device& from = at(t.location().device);
        LOOM_CUDA_CHECK(cudaStreamSynchronize(from.context.stream));
        LOOM_CUDA_CHECK(cudaMemcpyPeerAsync(out.device_data(), where.device, t.device_data(),
                                            t.location().device, t.byte_size(), d.context.stream));
      }
      return out;
    }
    per_device& d = at(t.location().device);
    std::lock_guard lock(d.mu);
    device_guard g(t.location().device);
    any_tensor out(t.type(), t.shape());
    if (t.byte_size() == 0)
      return out;
    stage(d, t.byte_size());
    LOOM_CUDA_CHECK(cudaMemcpyAsync(d.staging.data(), t.device_data(), t.byte_size(),
                                    cudaMemcpyDeviceToHost, d.context.stream));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(d.context.stream));
    std::memcpy(out.raw_data(), d.staging.data(), t.byte_size());
    return out;
  }

  // Waits for everything queued on `device`.
  void synchronize(int device) {
    per_device& d = at(device);
    std::lock_guard lock(d.mu);
    LOOM_CUDA_CHECK(cudaStreamSynchronize(d.context.stream));
  }

private:
  struct per_device {
    std::once_flag made;
    std::mutex mu; // kernels and copies of concurrent steps, one at a time
    std::unique_ptr<stream> s;
    gpu_context context;
    pinned_buffer<unsigned char> staging;
    ~per_device() {
      if (context.blas)
        cublasDestroy(context.blas);
    }
  };

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
    });
    return d;
  }

  // A pinned staging buffer of at least `bytes` (grown by doubling, kept).
  static void stage(per_device& d, std::size_t bytes) {
    if (d.staging.size() >= bytes)
      return;
    std::size_t n = std::max<std::size_t>(d.staging.size() * 2, 1 << 20);
    while (n < bytes)
      n *= 2;
    d.staging = pinned_buffer<unsigned char>(n);
  }

  int count_;
  std::vector<per_device> devices_;
};

// The process's backend, registered before main(); never destroyed (tensors in
// static objects may release device memory late).
inline backend& the_backend() {
  static backend* b = [] {
    auto* p = new backend();
    gpu_backend::register_backend(p);
    return p;
  }();
  return *b;
}

namespace detail {
inline const bool backend_registered = (the_backend(), true);
} // namespace detail

} // namespace cuda
} // namespace loom

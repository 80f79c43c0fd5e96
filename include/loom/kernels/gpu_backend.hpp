// What the executor and the placer need from a GPU runtime, without a CUDA
// header: how many GPUs this process has, how to run a GPU kernel or a fused
// region's GPU kernel, how to copy a tensor between host and device memory, and
// page-locked host memory for the tensors a GPU is fed (loom::pinned_tensor).
//
// A process has GPUs only when a translation unit compiled by nvcc includes
// loom/kernels/cuda/backend.hpp (DESIGN §3: "a TU compiled by nvcc instantiates CUDA
// kernels for what it uses"); that header registers the one backend here
// before main(). Everything else sees registered() == nullptr and places
// nothing on a GPU.
#pragma once

#include <loom/core/tensor.hpp>
#include <loom/kernels/fused_registry.hpp>
#include <loom/kernels/registry.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>

namespace loom {

// loom's device allocator's bytes on one GPU of this process (TF's
// tf.config.experimental.get_memory_info, with the cache PyTorch's memory_reserved shows).
struct gpu_memory_info {
  std::int64_t allocated = 0; // in blocks handed out to tensors (their size classes)
  std::int64_t cached = 0;    // in free blocks kept for reuse, not returned to CUDA
  std::int64_t peak = 0;      // the most allocated at once since the last reset_gpu_memory_peak
};

namespace kernels {

class gpu_backend {
public:
  virtual ~gpu_backend() = default;

  // GPUs this process can use (0 without a driver or a device).
  virtual int device_count() const noexcept = 0;

  // Runs a GPU kernel on `device`: sets c.gpu, launches under the device's
  // lock (kernels of concurrent steps share one stream), checks the launch.
  virtual void run(int device, kernel_fn kernel, kernel_context& c) = 0;

  // Runs a batch kernel on `device` over several nodes' contexts, as run() runs a kernel
  // over one (kernel_registry::find_batch).
  virtual void run_batch(int device, batch_kernel_fn kernel,
                         std::span<kernel_context* const> contexts) = 0;

  // Runs a fused region's GPU kernel on `device` as run() runs a kernel (its
  // leaves are on that GPU); false when it declined the operands' shapes.
  virtual bool run_fused(int device, gpu_fused_kernel_fn kernel,
                         std::span<const any_tensor* const> leaves, any_tensor& out,
                         const std::string& node_name) = 0;

  // A copy of `t` at `where`. To the host it has completed on return; to a GPU
  // it is ordered before every later kernel on that GPU.
  virtual any_tensor copy(const any_tensor& t, memory_location where) = 0;

  // An uninitialised host tensor in page-locked (pinned) memory, which a GPU copies from
  // at its full host-to-device rate; a backend without such memory gives ordinary memory.
  virtual any_tensor allocate_pinned(dtype t, loom::shape s) { return any_tensor(t, std::move(s)); }

  // -- CUDA graphs (runtime/captured_step.hpp) ---------------------------------------------
  // A step's GPU work, recorded once, replayed by one launch on the device's stream.
  class graph {
  public:
    virtual ~graph() = default;
    virtual void launch() = 0;
  };
  // A recording in progress on one GPU. From begin_capture until it is destroyed the GPU
  // takes the calling thread's work only (other threads wait for it), records it without
  // running it, and gives its kernels memory from a pool of the recording's own, which the
  // graph keeps and no one else takes. finish() ends the recording: the graph (which runs
  // only when launched), or nullptr with the reason in `why`.
  class capture {
  public:
    virtual ~capture() = default;
    virtual std::unique_ptr<graph> finish(std::string& why) = 0;
  };
  virtual bool can_capture() const noexcept { return false; }
  virtual std::unique_ptr<capture> begin_capture(int device) {
    throw internal_error("GPU:" + std::to_string(device) + ": this GPU backend cannot capture");
  }
  // Copies `from` into `to` (the same dtype and shape), queued on the GPU's stream after its
  // earlier work: into a GPU from the host or a GPU, or into the host from a GPU. From or
  // into page-locked memory (allocate_pinned, loom::pinned_tensor) the copy is the GPU's
  // own and asynchronous: the host side must stay as it is, and `to` on the host holds the
  // value, only after the GPU's next wait (a copy to the host, synchronize). A step replayed
  // from a CUDA graph so waits once, for its feeds and fetches together.
  virtual void copy_into(any_tensor& to, const any_tensor& from) {
    (void)from;
    throw internal_error("a copy into " + to.describe() + ": this GPU backend has none");
  }
  // Waits for everything queued on `device`.
  virtual void synchronize(int device) { (void)device; }
  // The device allocator's bytes on `device` (all zero on a GPU nothing allocated on), and
  // a new start for its peak: the bytes allocated now.
  virtual gpu_memory_info memory(int device) const {
    (void)device;
    return {};
  }
  virtual void reset_memory_peak(int device) { (void)device; }

  // How many GPU kernels run by the calling thread moved data between host and GPU
  // themselves (read ids on the host, uploaded a shape's table): such a step cannot be
  // recorded, as its kernels' host work would not replay.
  virtual std::uint64_t kernel_host_transfers() const noexcept { return 0; }

  // The registered backend, or nullptr when this process has none.
  static gpu_backend* registered() noexcept { return slot().load(std::memory_order_acquire); }
  static void register_backend(gpu_backend* b) noexcept {
    slot().store(b, std::memory_order_release);
  }

private:
  static std::atomic<gpu_backend*>& slot() noexcept {
    static std::atomic<gpu_backend*> s{nullptr};
    return s;
  }
};

} // namespace kernels

// GPUs this process can place nodes on.
inline int gpu_count() noexcept {
  const kernels::gpu_backend* b = kernels::gpu_backend::registered();
  return b ? b->device_count() : 0;
}

namespace detail {
inline kernels::gpu_backend& backend_of_gpu(int device, const char* who) {
  kernels::gpu_backend* b = kernels::gpu_backend::registered();
  const int count = b ? b->device_count() : 0;
  if (device < 0 || device >= count)
    throw invalid_argument_error(std::string(who) + ": GPU:" + std::to_string(device) +
                                 " does not exist: this process has " + std::to_string(count) +
                                 " GPU(s)");
  return *b;
}
} // namespace detail

// The bytes loom's allocator holds on GPU `device` of this process; throws
// invalid_argument_error for a GPU it does not have. A traced step's timeline and the
// summaries of summary_saver_hook show the same figures.
inline gpu_memory_info gpu_memory(int device) {
  return detail::backend_of_gpu(device, "loom::gpu_memory").memory(device);
}
// Starts GPU `device`'s peak again from the bytes allocated now (TF's reset_memory_stats).
inline void reset_gpu_memory_peak(int device) {
  detail::backend_of_gpu(device, "loom::reset_gpu_memory_peak").reset_memory_peak(device);
}

// An uninitialised host tensor in page-locked (pinned) memory where this process has a GPU
// backend, else in ordinary memory (PyTorch's pin_memory). A GPU copies a fed tensor that is
// pinned at its full host-to-device rate (55 GB/s on an H200's machine, where
// benchmarks/gpu_step's step went 0.62 -> 0.47 ms with its 3.25 MB batch so): allocate the
// batches a GPU step is fed so, once, and refill them. Page-locked memory is scarce and slow
// to allocate and free: not for every step.
template <element_type T, int R> tensor<T, R> pinned_tensor(const loom::shape& s) {
  static_assert(!std::is_same_v<T, std::string>,
                "loom::pinned_tensor: strings live in ordinary host memory (a GPU never reads "
                "them)");
  if (s.rank() != R)
    throw invalid_argument_error("loom::pinned_tensor: shape " + s.to_string() + " for a tensor " +
                                 "of rank " + std::to_string(R));
  kernels::gpu_backend* b = kernels::gpu_backend::registered();
  return tensor<T, R>::from(b ? b->allocate_pinned(dtype_of<T>, s) : any_tensor(dtype_of<T>, s),
                            "loom::pinned_tensor");
}

namespace kernels {

// `t` at `where`: itself when it is there already, else a copy (one clear
// error when no backend could have made it).
inline any_tensor at_location(const any_tensor& t, memory_location where) {
  if (t.empty() || t.location() == where)
    return t;
  gpu_backend* b = gpu_backend::registered();
  if (!b)
    throw internal_error("a tensor " + t.describe() + " is needed on " + where.to_string() +
                         " but this process has no GPU backend");
  return b->copy(t, where);
}

} // namespace kernels
} // namespace loom

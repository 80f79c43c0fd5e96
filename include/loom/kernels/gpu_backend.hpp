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
namespace kernels {

class gpu_backend {
public:
  virtual ~gpu_backend() = default;

  // GPUs this process can use (0 without a driver or a device).
  virtual int device_count() const noexcept = 0;

  // Runs a GPU kernel on `device`: sets c.gpu, launches under the device's
  // lock (kernels of concurrent steps share one stream), checks the launch.
  virtual void run(int device, kernel_fn kernel, kernel_context& c) = 0;

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
  // Copies `from` (on the host or a GPU) into `to` (on a GPU, the same dtype and shape),
  // ordered before the GPU's later work; `from` may go or be written on return.
  virtual void copy_into(any_tensor& to, const any_tensor& from) {
    (void)from;
    throw internal_error("a copy into " + to.describe() + ": this GPU backend has none");
  }
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

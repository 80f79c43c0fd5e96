// The fused kernels a process has, by the canonical key of their region
// (graph/lower.hpp's detail::region_key), and the signatures of the CPU's and
// the GPU's. The executor's plan looks a region's kernels up here.
#pragma once

#include <loom/core/tensor.hpp>
#include <loom/kernels/cpu_device.hpp>

#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <string>

namespace loom::kernels {

// The kernel of a fused region: false when the operands' shapes need general
// broadcasting, and the caller then runs the region's primitive ops instead.
using fused_kernel_fn = bool (*)(const cpu_device&, std::span<const any_tensor* const> leaves,
                                 any_tensor& out, const std::string& node_name);

// The same on a GPU (kernels/cuda/fused.cuh): the leaves are on that GPU, the
// output is made there, and the kernel is queued on the GPU's stream.
struct gpu_context;
using gpu_fused_kernel_fn = bool (*)(const gpu_context&, std::span<const any_tensor* const> leaves,
                                     any_tensor& out, const std::string& node_name);

// The process's fused kernels, by the canonical key of their region. Lowering
// a typed tree registers its instantiations here (kernels/fused.hpp): the
// CPU's always, the GPU's when the lowering translation unit is compiled by
// nvcc. A process that
// never saw the tree (a generic server) has no entry and runs the primitive
// ops instead.
class fused_kernel_registry {
public:
  static fused_kernel_registry& instance() {
    static fused_kernel_registry r;
    return r;
  }
  void add(const std::string& key, fused_kernel_fn fn) {
    std::lock_guard lock(mu_);
    kernels_[key].cpu = fn;
  }
  void add(const std::string& key, gpu_fused_kernel_fn fn) {
    std::lock_guard lock(mu_);
    kernels_[key].gpu = fn;
  }
  fused_kernel_fn find(const std::string& key) const {
    std::lock_guard lock(mu_);
    auto it = kernels_.find(key);
    return it == kernels_.end() ? nullptr : it->second.cpu;
  }
  gpu_fused_kernel_fn find_gpu(const std::string& key) const {
    std::lock_guard lock(mu_);
    auto it = kernels_.find(key);
    return it == kernels_.end() ? nullptr : it->second.gpu;
  }

private:
  struct kernels {
    fused_kernel_fn cpu = nullptr;
    gpu_fused_kernel_fn gpu = nullptr;
  };
  mutable std::mutex mu_;
  std::map<std::string, kernels, std::less<>> kernels_;
};

} // namespace loom::kernels

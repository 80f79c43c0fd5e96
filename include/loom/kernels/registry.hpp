// The kernel registry: (op id, dtype, device type) -> kernel. The executor
// looks every node's kernel up once when it plans a step, never per run.
//
// Each header under kernels/cpu/ registers its kernels before main() through an
// inline variable, as the op headers register their ops (graph/op_registry.hpp):
// header-only, in every unit that includes it; in a program that links
// loom::kernels (LOOM_COMPILED_KERNELS), in that library's unit only. The
// registration instantiates every kernel for every dtype, so a unit that includes
// a kernel header for one function of it (a test, the header checks) would compile
// them all again: kernels/cpu/math.hpp alone took 12 s of clang -fsyntax-only,
// 2 s without.
#pragma once

#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/graph/node.hpp>
#include <loom/kernels/context.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <tuple>

namespace loom::kernels {

using kernel_fn = void (*)(kernel_context&);
// A kernel that runs several nodes of its op in one go: the executor hands it the nodes of
// a step that are ready together and share it (PyTorch's fused optimizers: one launch
// updates every variable of a step on a GPU, where one launch each cost more than the
// updates). It must compute what the op's kernel computes for each node, in any order.
using batch_kernel_fn = void (*)(std::span<kernel_context* const>);

inline constexpr const char* device_cpu = "CPU";
inline constexpr const char* device_gpu = "GPU";

class kernel_registry {
public:
  static kernel_registry& instance() {
    static kernel_registry r;
    return r;
  }

  void add(std::string op, dtype t, std::string device, kernel_fn fn) {
    std::lock_guard lock(mu_);
    kernels_[{std::move(op), t, std::move(device)}] = fn;
  }

  kernel_fn find(const std::string& op, dtype t, const std::string& device) const {
    std::lock_guard lock(mu_);
    auto it = kernels_.find({op, t, device});
    return it == kernels_.end() ? nullptr : it->second;
  }

  // Registers (or, with nullptr, removes) the batch kernel of `op` for dtype t on `device`.
  void add_batch(std::string op, dtype t, std::string device, batch_kernel_fn fn) {
    std::lock_guard lock(mu_);
    if (fn)
      batches_[{std::move(op), t, std::move(device)}] = fn;
    else
      batches_.erase({op, t, device});
  }

  // The batch kernel of `op` for dtype t on `device`, or nullptr: most ops have none.
  batch_kernel_fn find_batch(const std::string& op, dtype t, const std::string& device) const {
    std::lock_guard lock(mu_);
    auto it = batches_.find({op, t, device});
    return it == batches_.end() ? nullptr : it->second;
  }

  // Whether `op` has a kernel on `device` for some dtype.
  bool has(const std::string& op, const std::string& device) const {
    std::lock_guard lock(mu_);
    for (const auto& [key, fn] : kernels_)
      if (std::get<0>(key) == op && std::get<2>(key) == device)
        return true;
    return false;
  }

  // The kernel for a node, or an error naming the node, dtype and device.
  kernel_fn find_for(const node_def& n, dtype t, const std::string& device) const {
    if (kernel_fn fn = find(n.op, t, device))
      return fn;
    throw not_found_error("no " + device + " kernel for node " + n.describe() + " with dtype " +
                          std::string(to_string(t)));
  }

private:
  kernel_registry() = default;
  mutable std::mutex mu_;
  std::map<std::tuple<std::string, dtype, std::string>, kernel_fn> kernels_;
  std::map<std::tuple<std::string, dtype, std::string>, batch_kernel_fn> batches_;
};

// The placer's question (placer_options::has_kernel): can `op` run on a
// device of `device_type`? Only GPUs are asked about: ops without a kernel
// anywhere (placeholders, transfers) go where they are put, and every op the
// CPU lacks fails later, when its step is planned, with the kernel's name.
inline bool placeable_on(std::string_view op, std::string_view device_type) {
  const kernel_registry& k = kernel_registry::instance();
  const std::string name(op);
  return device_type != device_gpu || k.has(name, device_gpu) || !k.has(name, device_cpu);
}

struct kernel_registration {
  kernel_registration(std::string op, dtype t, kernel_fn fn, std::string device = device_cpu) {
    kernel_registry::instance().add(std::move(op), t, std::move(device), fn);
  }
};

// Registers kernel_template<T> for every T in a type_list, on `device` (CPU by default).
template <template <class> class Kernel, class... Ts>
bool register_kernels(const std::string& op, type_list<Ts...>,
                      const std::string& device = device_cpu) {
  (kernel_registry::instance().add(op, dtype_of<Ts>, device, &Kernel<Ts>::run), ...);
  return true;
}

} // namespace loom::kernels

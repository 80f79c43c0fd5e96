// A process's CPU device as a master or a task server owns it: an intra-op thread pool of
// Eigen's and the ThreadPoolDevice over it (cpu_device, kernels/cpu_device.hpp), on which the
// CPU kernels of its steps split their work (parallel_for.hpp). The device is defined by
// Eigen's Tensor module, so its owners (runtime/local_master.hpp, runtime/task_server.hpp)
// parse that module through this header; the rest of the runtime and the kernel context only
// pass a cpu_device& on, and do not.
#pragma once

#include <loom/kernels/cpu/eigen_tensor.hpp>
#include <loom/kernels/cpu_device.hpp>

namespace loom::kernels {

class cpu_pool {
public:
  explicit cpu_pool(int threads) : pool_(threads), device_(&pool_, threads) {}
  cpu_pool(const cpu_pool&) = delete;
  cpu_pool& operator=(const cpu_pool&) = delete;

  const cpu_device& device() const noexcept { return device_; }

private:
  Eigen::ThreadPool pool_;
  cpu_device device_;
};

} // namespace loom::kernels

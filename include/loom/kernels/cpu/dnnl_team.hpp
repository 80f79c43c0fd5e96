// The threads of a oneDNN call (kernels/cpu/dnnl.hpp's convolutions, kernels/cpu/gemm.hpp's
// large float products). Debian builds oneDNN with OpenMP (libgomp): a call runs on an OpenMP
// team that the calling thread leads, as many threads as the session's intra-op pool
// (cpu_device), set on the calling thread alone (omp_set_num_threads is per thread); loom's
// pool waits meanwhile, as for any kernel that splits its work over it. A team's threads spin
// a while after each call (OpenMP's wait policy, which libgomp reads from the environment when
// it loads): where several processes share few cores, OMP_WAIT_POLICY=passive gives that CPU
// back to them (docs/benchmarks.md, "Models"; docs/dependencies.md).
#pragma once

#include <loom/kernels/cpu/eigen_tensor.hpp> // the pool whole, for its size
#include <loom/kernels/cpu_device.hpp>

#include <oneapi/dnnl/dnnl.h>
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
#include <omp.h>
#endif

#include <algorithm>

namespace loom::kernels::dnnl_team {

// Sizes this thread's next oneDNN calls' team as d's pool; returns that size.
inline int use_pool_size(const cpu_device& d) {
  const int threads = std::max(1, d.numThreads());
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
  if (omp_get_max_threads() != threads)
    omp_set_num_threads(threads);
#endif
  return threads;
}

} // namespace loom::kernels::dnnl_team

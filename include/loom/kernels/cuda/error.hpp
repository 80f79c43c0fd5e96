// CUDA runtime errors as loom errors. LOOM_CUDA_CHECK(call) evaluates a CUDA
// runtime call once and, when it does not return cudaSuccess, throws with the
// error's name and string, the call's text, file and line:
//   unavailable_error        no driver, no device, device busy or unavailable
//   resource_exhausted_error out of device or pinned host memory (TF's OOM)
//   internal_error           everything else (a bad launch, an illegal address, ...)
// Host-only: usable from .cpp files compiled by the host compiler and linked with
// CUDA::cudart, and from .cu files compiled by nvcc.
#pragma once

#include <loom/core/error.hpp>

#include <cuda_runtime_api.h>

#include <string>

namespace loom::cuda {

// True for the errors that mean "no usable GPU here" rather than a bug.
constexpr bool is_unavailable(cudaError_t e) noexcept {
  switch (e) {
  case cudaErrorNoDevice:
  case cudaErrorInsufficientDriver:
  case cudaErrorDevicesUnavailable:
  case cudaErrorInvalidDevice:
  case cudaErrorSystemDriverMismatch:
  case cudaErrorCompatNotSupportedOnDevice:
  case cudaErrorInitializationError:
  case cudaErrorStubLibrary: return true;
  default: return false;
  }
}

// "cudaErrorNoDevice (100): no CUDA-capable device is detected".
inline std::string describe(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + std::to_string(static_cast<int>(e)) +
         "): " + cudaGetErrorString(e);
}

// Throws the loom error for a failed CUDA call. Clears the runtime's last error
// first, so a non-sticky error does not resurface in a later, unrelated check.
[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* call, const char* file,
                                          int line) {
  (void)cudaGetLastError();
  std::string message =
      "CUDA error " + describe(e) + " in `" + call + "` at " + file + ":" + std::to_string(line);
  if (is_unavailable(e))
    throw unavailable_error(message);
  if (e == cudaErrorMemoryAllocation)
    throw resource_exhausted_error(message);
  throw internal_error(message);
}

} // namespace loom::cuda

#define LOOM_CUDA_CHECK(call)                                                                      \
  do {                                                                                             \
    const ::cudaError_t loom_cuda_check_error_ = (call);                                           \
    if (loom_cuda_check_error_ != ::cudaSuccess)                                                   \
      ::loom::cuda::throw_cuda_error(loom_cuda_check_error_, #call, __FILE__, __LINE__);           \
  } while (false)

// RAII CUDA streams and events, and device queries that never throw.
//   cuda::device_count()   0 when there is no driver or no device (never throws)
//   cuda::device_guard g(i) makes device i current for a scope, restores the previous one
//   cuda::stream s;        a non-blocking stream on the current device (move-only)
//   cuda::event e;         an event without timing (cheapest); event::timed() for timing
// Host-only (cuda_runtime_api.h): compiles with the host compiler and CUDA::cudart.
#pragma once

#include <loom/kernels/cuda/error.hpp>

#include <cuda_runtime_api.h>

#include <utility>

namespace loom::cuda {

// The number of CUDA devices this process can use; 0 (not an exception) when
// there is no driver, no device, or the driver is too old. Clears the error.
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

inline int current_device() {
  int d = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

// Makes a device current for a scope; restores the previous one on exit.
class device_guard {
public:
  explicit device_guard(int device) : previous_(current_device()) {
    if (device != previous_)
      LOOM_CUDA_CHECK(cudaSetDevice(device));
  }
  ~device_guard() { (void)cudaSetDevice(previous_); }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

private:
  int previous_;
};

class event;

// An owned cudaStream_t. Default: non-blocking with respect to the legacy
// default stream (as TF and PyTorch create theirs). Move-only.
class stream {
public:
  explicit stream(unsigned flags = cudaStreamNonBlocking) : device_(current_device()) {
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, flags));
  }
  ~stream() { reset(); }
  stream(stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)), device_(o.device_) {}
  stream& operator=(stream&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
      device_ = o.device_;
    }
    return *this;
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;

  cudaStream_t get() const noexcept { return s_; }
  operator cudaStream_t() const noexcept { return s_; }
  int device() const noexcept { return device_; }

  void synchronize() const { LOOM_CUDA_CHECK(cudaStreamSynchronize(s_)); }
  // True when all work queued so far has finished.
  bool query() const {
    const cudaError_t e = cudaStreamQuery(s_);
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    LOOM_CUDA_CHECK(e);
    return true;
  }
  // Later work on this stream waits until `e` has completed.
  inline void wait(const event& e) const;

private:
  void reset() noexcept {
    if (s_)
      (void)cudaStreamDestroy(s_);
    s_ = nullptr;
  }

  cudaStream_t s_ = nullptr;
  int device_ = 0;
};

// An owned cudaEvent_t. Move-only.
class event {
public:
  explicit event(unsigned flags = cudaEventDisableTiming) {
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&e_, flags));
  }
  // An event that records timestamps, for elapsed_ms().
  static event timed() { return event(cudaEventDefault); }

  ~event() {
    if (e_)
      (void)cudaEventDestroy(e_);
  }
  event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  event& operator=(event&& o) noexcept {
    if (this != &o) {
      if (e_)
        (void)cudaEventDestroy(e_);
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  event(const event&) = delete;
  event& operator=(const event&) = delete;

  cudaEvent_t get() const noexcept { return e_; }
  operator cudaEvent_t() const noexcept { return e_; }

  void record(cudaStream_t s) { LOOM_CUDA_CHECK(cudaEventRecord(e_, s)); }
  void synchronize() const { LOOM_CUDA_CHECK(cudaEventSynchronize(e_)); }
  bool query() const {
    const cudaError_t e = cudaEventQuery(e_);
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    LOOM_CUDA_CHECK(e);
    return true;
  }

  // Milliseconds between two recorded timed() events (waits for `end`).
  static float elapsed_ms(const event& start, const event& end) {
    LOOM_CUDA_CHECK(cudaEventSynchronize(end.e_));
    float ms = 0;
    LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, end.e_));
    return ms;
  }

private:
  cudaEvent_t e_ = nullptr;
};

inline void stream::wait(const event& e) const {
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(s_, e.get(), 0));
}

} // namespace loom::cuda

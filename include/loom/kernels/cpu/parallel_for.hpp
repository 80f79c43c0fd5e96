// How every CPU kernel splits its work over the process's thread pool
// (cpu_device): parallel_for over blocks, and for elementwise work, chunks
// that are each one Eigen expression over rank-1 maps.
#pragma once

#include <loom/core/tensor.hpp>
#include <loom/kernels/cpu/eigen_tensor.hpp>
#include <loom/kernels/cpu_device.hpp>

#include <algorithm>
#include <atomic>
#include <memory>
#include <type_traits>

namespace loom::kernels {

// Elementwise work is split into contiguous chunks over the pool, and each
// chunk is one Eigen expression evaluated on the DefaultDevice (vectorised,
// single-threaded). That instantiates Eigen's light default executor once per
// expression instead of the ThreadPoolDevice executor with its tiling machinery:
// the same speed on these sizes at well under half the compile time.
template <class T>
using chunk_map = Eigen::TensorMap<Eigen::Tensor<T, 1, Eigen::RowMajor, Eigen::DenseIndex>>;

// A chunk [first, first + len) of a rank-1 operand that is either the tensor
// itself or, when the tensor holds one element, that element repeated.
// constant() reads only the dimensions of the map it is called on.
template <class T>
auto flat_operand(const any_tensor& t, Eigen::DenseIndex first, Eigen::DenseIndex len) {
  return chunk_map<const T>(t.data<T>() + first, len);
}
template <class T> auto repeated_operand(const any_tensor& t, Eigen::DenseIndex len) {
  return chunk_map<const T>(t.data<T>(), len).constant(*t.data<T>());
}

// How many of the pool's threads parallel_for's n elements of `cost` each are worth
// (Eigen's cost model).
inline int parallel_threads(const cpu_device& d, Eigen::DenseIndex n,
                            const Eigen::TensorOpCost& cost) {
  return Eigen::TensorCostModel<cpu_device>::numThreads(static_cast<double>(n), cost,
                                                        d.numThreads());
}

// parallel_for's blocks, run(f, first, last) for each, on the calling thread and up to
// threads - 1 of the pool's. Apart from the body, so that it is compiled once rather than
// with each of the kernels' 430 bodies: instantiated with each, its shared state and the
// pool's std::function were a third of loom::kernels' symbols, and g++ -O2 took 268
// CPU-s over that unit instead of 212.
inline void run_blocks(const cpu_device& d, Eigen::DenseIndex n, int threads,
                       void (*run)(void*, Eigen::DenseIndex, Eigen::DenseIndex), void* f) {
  // About four blocks a thread, so a late thread still finds a share.
  struct shared_blocks {
    Eigen::DenseIndex n = 0, size = 0;
    int count = 0;
    std::atomic<int> next{0}, finished{0};
    void (*run)(void*, Eigen::DenseIndex, Eigen::DenseIndex) = nullptr;
    void* f = nullptr; // valid while blocks remain: the caller waits for them
    void take() {
      for (int b; (b = next.fetch_add(1)) < count;) {
        const Eigen::DenseIndex first = b * size;
        run(f, first, std::min(n, first + size));
        if (finished.fetch_add(1) + 1 == count)
          finished.notify_all();
      }
    }
  };
  auto blocks = std::make_shared<shared_blocks>();
  blocks->n = n;
  blocks->size = std::max<Eigen::DenseIndex>(1, (n + 4 * threads - 1) / (4 * threads));
  blocks->count = static_cast<int>((n + blocks->size - 1) / blocks->size);
  blocks->run = run;
  blocks->f = f;
  for (int t = 1; t < std::min(threads, blocks->count); ++t)
    d.enqueueNoNotification([blocks] { blocks->take(); });
  blocks->take();
  for (int done = blocks->finished.load(); done < blocks->count; done = blocks->finished.load())
    blocks->finished.wait(done);
}

// Runs f(first, last) over blocks covering [0, n), on the calling thread and
// the pool's; `cost` is per element (Eigen's cost model picks how many threads
// the work is worth). Every CPU kernel splits its work through this.
//
// Why not Eigen's parallelFor: with more blocks than threads it hands even the
// first block to the pool and sleeps until the last is done, two thread
// switches that on a small machine cost tens of µs each, more than much of
// the work (a ps applying a step's update, whose pool was asleep). Here the
// caller starts on the blocks at once, taking them from a shared counter, and
// pool threads take what is left when they wake. One that wakes after the
// last block was taken touches nothing of the caller's.
template <class F>
void parallel_for(const cpu_device& d, Eigen::DenseIndex n, const Eigen::TensorOpCost& cost,
                  F&& f) {
  if (n <= 0)
    return;
  const int threads = parallel_threads(d, n, cost);
  if (threads <= 1 || n == 1) {
    f(Eigen::DenseIndex{0}, n);
    return;
  }
  run_blocks(
      d, n, threads,
      [](void* fn, Eigen::DenseIndex first, Eigen::DenseIndex last) {
        (*static_cast<std::remove_reference_t<F>*>(fn))(first, last);
      },
      const_cast<void*>(static_cast<const void*>(std::addressof(f))));
}

// Runs chunk(first, len) over [0, n) on the pool; `cost` is per element.
template <class F>
void parallel_chunks(const cpu_device& d, Eigen::DenseIndex n, const Eigen::TensorOpCost& cost,
                     F&& chunk) {
  parallel_for(d, n, cost, [&](Eigen::DenseIndex first, Eigen::DenseIndex last) {
    chunk(first, last - first);
  });
}

} // namespace loom::kernels

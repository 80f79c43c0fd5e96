// kernels::parallel_for, through which every CPU kernel splits its work: each
// element is visited once whatever the size and cost, the calling thread does
// the work itself when the pool cannot (every pool thread busy, or a call from
// a pool thread), and a pool thread that wakes after the call returned touches
// nothing of it.
#include <doctest/doctest.h>

#include <loom/kernels/cpu/parallel_for.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace {

using loom::kernels::parallel_for;
using index_t = Eigen::DenseIndex;

// Work that Eigen's cost model spreads over every thread of the pool.
const Eigen::TensorOpCost expensive(64, 64, 10000);
// Work that it keeps on the calling thread.
const Eigen::TensorOpCost cheap(1, 1, 1);

// How many times parallel_for(n, cost) visits each index of [0, n).
std::vector<int> visits(const loom::kernels::cpu_device& d, index_t n,
                        const Eigen::TensorOpCost& cost) {
  std::vector<std::atomic<int>> seen(static_cast<std::size_t>(n));
  parallel_for(d, n, cost, [&](index_t first, index_t last) {
    REQUIRE(first < last);
    for (index_t i = first; i < last; ++i)
      seen[static_cast<std::size_t>(i)].fetch_add(1);
  });
  std::vector<int> out;
  for (auto& s : seen)
    out.push_back(s.load());
  return out;
}

// Holds every thread of a pool until release().
class occupied_pool {
public:
  explicit occupied_pool(Eigen::ThreadPool& pool) : threads_(pool.NumThreads()) {
    for (int i = 0; i < threads_; ++i)
      pool.Schedule([this] {
        std::unique_lock lock(mu_);
        ++holding_;
        cv_.notify_all();
        cv_.wait(lock, [&] { return released_; });
      });
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return holding_ == threads_; });
  }
  ~occupied_pool() { release(); }
  void release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

private:
  int threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  int holding_ = 0;
  bool released_ = false;
};

} // namespace

TEST_CASE("parallel_for visits every index once") {
  for (int threads : {1, 2, 4}) {
    Eigen::ThreadPool pool(threads);
    loom::kernels::cpu_device d(&pool, threads);
    for (index_t n :
         {index_t{0}, index_t{1}, index_t{2}, index_t{7}, index_t{1000}, index_t{100003}})
      for (const auto* cost : {&cheap, &expensive}) {
        CAPTURE(threads);
        CAPTURE(n);
        CAPTURE(cost == &cheap);
        const auto seen = visits(d, n, *cost);
        CHECK(std::count(seen.begin(), seen.end(), 1) == n);
      }
  }
}

TEST_CASE("parallel_for uses the pool's threads for work worth splitting") {
  Eigen::ThreadPool pool(2);
  loom::kernels::cpu_device d(&pool, 2);
  const auto caller = std::this_thread::get_id();
  std::atomic<bool> elsewhere{false};
  // Blocks slow enough that a pool thread wakes before the caller takes them all.
  parallel_for(d, 64, expensive, [&](index_t, index_t) {
    if (std::this_thread::get_id() != caller)
      elsewhere = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  });
  CHECK(elsewhere);
}

TEST_CASE("parallel_for finishes on the calling thread when every pool thread is busy") {
  Eigen::ThreadPool pool(2);
  loom::kernels::cpu_device d(&pool, 2);
  occupied_pool busy(pool);
  const auto caller = std::this_thread::get_id();
  std::atomic<bool> elsewhere{false};
  std::atomic<index_t> visited{0};
  // Eigen's parallelFor would queue this work behind the busy threads and wait.
  parallel_for(d, 100003, expensive, [&](index_t first, index_t last) {
    elsewhere = elsewhere || std::this_thread::get_id() != caller;
    visited += last - first;
  });
  CHECK(visited == 100003);
  CHECK_FALSE(elsewhere);
  busy.release();
  // The pool threads that wake now find no block left; the pool still works.
  const auto seen = visits(d, 1000, expensive);
  CHECK(std::count(seen.begin(), seen.end(), 1) == 1000);
}

TEST_CASE("parallel_for called from the pool's own threads") {
  Eigen::ThreadPool pool(2);
  loom::kernels::cpu_device d(&pool, 2);
  std::atomic<index_t> visited{0};
  parallel_for(d, 8, expensive, [&](index_t first, index_t last) {
    for (index_t i = first; i < last; ++i)
      parallel_for(d, 1000, expensive, [&](index_t f, index_t l) { visited += l - f; });
  });
  CHECK(visited == 8000);
}

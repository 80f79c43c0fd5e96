// loom/kernels/cuda: errors, streams, the caching allocator, copies and the fused
// elementwise kernel.
//
// Two suites:
//   "cuda_host"   needs no GPU: error mapping, size classes, and the kernels' bodies
//                 (vector body + scalar tail, scalar body) run on the host over every
//                 "thread" of a grid, against the same references as on the device;
//   "cuda_device" needs a GPU; every case is skipped (doctest::skip) when
//                 cuda::device_count() is 0, and main prints "no CUDA device".
// Inputs are fresh random numbers each run (the seed is printed on failure); outputs
// are poisoned (all bytes 0xFF: NaN for float and double) before a kernel runs, with a
// guard element on each side, so an unwritten or overwritten element fails.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <loom/kernels/cuda/allocator.hpp>
#include <loom/kernels/cuda/error.hpp>
#include <loom/kernels/cuda/expression.cuh>
#include <loom/kernels/cuda/stream.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace cuda = loom::cuda;

namespace {

bool have_gpu() {
  static const bool has = cuda::device_count() > 0;
  return has;
}

std::uint64_t fresh_seed() {
  static std::random_device rd;
  return (std::uint64_t{rd()} << 32) ^ rd();
}

// -- the two places a tree runs: the GPU, and the kernels' bodies on the host -----------------
template <class T> struct host_storage {
  struct deleter {
    void operator()(T* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<T, deleter> mem;
  T* data() const { return mem.get(); }
};

struct host_runner {
  std::size_t nthreads;
  template <class T> host_storage<T> alloc(std::size_t n) {
    const std::size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    return {std::unique_ptr<T, typename host_storage<T>::deleter>(
        static_cast<T*>(std::aligned_alloc(64, bytes)))};
  }
  template <class T> void upload(host_storage<T>& b, const std::vector<T>& v) {
    std::memcpy(b.data(), v.data(), v.size() * sizeof(T));
  }
  template <class T> void poison(host_storage<T>& b, std::size_t n) {
    std::memset(static_cast<void*>(b.data()), 0xFF, n * sizeof(T));
  }
  template <class T> std::vector<unsigned char> download_bytes(host_storage<T>& b, std::size_t n) {
    std::vector<unsigned char> out(n * sizeof(T));
    std::memcpy(out.data(), b.data(), out.size());
    return out;
  }
  template <class E> void run(const E& e, loom::value_type_of<E>* out, std::size_t n) {
    cuda::detail::emulate_on_host(e, out, n, nthreads, cuda::vectorizable(e, out, n));
  }
};

struct device_runner {
  cuda::stream s;
  template <class T> cuda::device_buffer<T> alloc(std::size_t n) {
    return cuda::device_buffer<T>(n, s);
  }
  template <class T> void upload(cuda::device_buffer<T>& b, const std::vector<T>& v) {
    if constexpr (std::is_same_v<T, bool>) { // std::vector<bool> is packed
      std::vector<unsigned char> bytes(v.begin(), v.end());
      LOOM_CUDA_CHECK(
          cudaMemcpyAsync(b.data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice, s));
      s.synchronize();
    } else {
      cuda::copy_to_device(b.data(), v.data(), v.size(), s);
    }
  }
  template <class T> void poison(cuda::device_buffer<T>& b, std::size_t n) {
    LOOM_CUDA_CHECK(cudaMemsetAsync(b.data(), 0xFF, n * sizeof(T), s));
  }
  template <class T>
  std::vector<unsigned char> download_bytes(cuda::device_buffer<T>& b, std::size_t n) {
    std::vector<unsigned char> out(n * sizeof(T));
    LOOM_CUDA_CHECK(cudaMemcpyAsync(out.data(), b.data(), out.size(), cudaMemcpyDeviceToHost, s));
    s.synchronize();
    return out;
  }
  template <class E> void run(const E& e, loom::value_type_of<E>* out, std::size_t n) {
    cuda::evaluate(e, out, n, s);
  }
};

// -- references -------------------------------------------------------------------------------
template <class T> bool close(T got, T want) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(want))
      return std::isnan(got);
    if (std::isinf(want))
      return got == want;
    const T tol = std::is_same_v<T, float> ? T(2e-5) : T(1e-12);
    return std::abs(got - want) <= tol * (T(1) + std::abs(want));
  } else {
    return got == want;
  }
}

template <class T> T bytes_to(const unsigned char* p) {
  if constexpr (std::is_same_v<T, bool>) {
    return *p != 0; // checked to be 0 or 1 by the caller
  } else {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  }
}

// Runs build(A, B, C) over n elements with fresh random inputs (gen(rng) each) on
// `runner` and compares every element with ref(a, b, c). The leaves are offset by one
// element when misaligned_in, the output when misaligned_out; one poisoned guard
// element stays on each side of the output.
template <class T, class Runner, class Gen, class Build, class Ref>
void check_tree(Runner& runner, std::size_t n, bool misaligned_in, bool misaligned_out, Gen gen,
                Build build, Ref ref) {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  CAPTURE(n);
  CAPTURE(misaligned_in);
  CAPTURE(misaligned_out);
  std::mt19937_64 rng(seed);
  std::vector<T> a(n + 1), b(n + 1), c(n + 1);
  for (std::size_t i = 0; i <= n; ++i) {
    a[i] = gen(rng);
    b[i] = gen(rng);
    c[i] = gen(rng);
  }
  auto da = runner.template alloc<T>(n + 1);
  auto db = runner.template alloc<T>(n + 1);
  auto dc = runner.template alloc<T>(n + 1);
  runner.upload(da, a);
  runner.upload(db, b);
  runner.upload(dc, c);
  const std::size_t in_off = misaligned_in ? 1 : 0;

  const auto e = build(cuda::input(da.data() + in_off), cuda::input(db.data() + in_off),
                       cuda::input(dc.data() + in_off));
  using R = loom::value_type_of<decltype(e)>;
  // [guard][n outputs][guard], with the outputs aligned or one element off.
  const std::size_t out_off = misaligned_out ? 1 : 4;
  auto dout = runner.template alloc<R>(n + 5);
  runner.poison(dout, n + 5);
  R* out = dout.data() + out_off;
  CHECK(cuda::vectorizable(e, out, n) == (n >= 4 && !misaligned_in && !misaligned_out));
  runner.run(e, out, n);
  const auto bytes = runner.download_bytes(dout, n + 5);

  std::size_t bad = 0;
  for (std::size_t k = 0; k < n + 5; ++k) {
    const unsigned char* p = bytes.data() + k * sizeof(R);
    if (k < out_off || k >= out_off + n) { // a guard: must still be poison
      if (std::any_of(p, p + sizeof(R), [](unsigned char x) { return x != 0xFF; })) {
        if (++bad <= 5)
          FAIL_CHECK("guard element " << k << " was overwritten");
      }
      continue;
    }
    const std::size_t i = k - out_off;
    if constexpr (std::is_same_v<R, bool>) {
      if (*p > 1) {
        if (++bad <= 5)
          FAIL_CHECK("element " << i << " was not written (byte " << int(*p) << ")");
        continue;
      }
    }
    const R got = bytes_to<R>(p);
    const R want = ref(a[i + in_off], b[i + in_off], c[i + in_off]);
    if (!close(got, want)) {
      if (++bad <= 5)
        FAIL_CHECK("element " << i << ": got " << got << ", want " << want << " (inputs "
                              << a[i + in_off] << ", " << b[i + in_off] << ", " << c[i + in_off]
                              << ")");
    }
  }
  CHECK(bad == 0);
}

template <class T> auto uniform(T lo, T hi) {
  return [lo, hi](std::mt19937_64& rng) {
    if constexpr (std::is_floating_point_v<T>)
      return std::uniform_real_distribution<T>(lo, hi)(rng);
    else
      return std::uniform_int_distribution<T>(lo, hi)(rng);
  };
}

// The 5-op tree of the benchmark: relu(a * b + c) * 2 - a.
struct fused5 {
  template <class A, class B, class C> static auto build(A a, B b, C c) {
    using namespace loom;
    return relu(a * b + c) * 2 - a;
  }
  template <class T> static T ref(T a, T b, T c) { return std::max(T(a * b + c), T(0)) * T(2) - a; }
};

// Transcendentals, a division and a clip in one tree.
struct fused_math {
  template <class A, class B, class C> static auto build(A a, B b, C c) {
    using namespace loom;
    return sigmoid(a) * tanh(b) + exp(-square(c)) / sqrt(abs(a) + 1) - log(abs(b) + 0.5) +
           clip_by_value(reciprocal(abs(c) + 1), 0.25, 0.75);
  }
  template <class T> static T ref(T a, T b, T c) {
    const T clipped = std::min(std::max(T(1) / (std::abs(c) + T(1)), T(0.25)), T(0.75));
    return T(1) / (T(1) + std::exp(-a)) * std::tanh(b) +
           std::exp(-(c * c)) / std::sqrt(std::abs(a) + T(1)) - std::log(std::abs(b) + T(0.5)) +
           clipped;
  }
};

// n = 1, short vectors, 4k + 3 (a scalar tail), and large ones.
const std::vector<std::size_t> device_sizes = {
    1, 2, 3, 4, 5, 7, 8, 4099, 65536, (1u << 20) + 3, 1u << 22};
// The host runs the same shapes, smaller.
const std::vector<std::size_t> host_sizes = {1, 2, 3, 4, 5, 7, 8, 4099, 65539};

template <class T, class Tree, class Runner>
void check_fused(Runner& runner, const std::vector<std::size_t>& sizes) {
  for (const std::size_t n : sizes) {
    for (const auto& [mis_in, mis_out] : {std::pair{false, false}, std::pair{true, false},
                                          std::pair{false, true}, std::pair{true, true}}) {
      check_tree<T>(
          runner, n, mis_in, mis_out, uniform<T>(T(-2), T(2)),
          [](auto a, auto b, auto c) { return Tree::build(a, b, c); },
          [](T a, T b, T c) { return Tree::template ref<T>(a, b, c); });
    }
  }
}

// Every op of expr/ops.hpp alone (and select/cast/comparisons in small trees), at a
// size with a vector body and a tail and at a misaligned one.
template <class Runner> void check_each_op(Runner& runner) {
  using namespace loom;
  const std::size_t n = 4099;
  for (const bool mis : {false, true}) {
    const auto f = uniform<float>(-3.f, 3.f);
    const auto pos = uniform<float>(0.1f, 5.f);
    const auto d = uniform<double>(-3., 3.);
    const auto i32 = uniform<std::int32_t>(-50, 50);
    const auto i64 = uniform<std::int64_t>(-(std::int64_t{1} << 40), std::int64_t{1} << 40);
    // clang-format off
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto, auto) { return -a; }, [](float a, float, float) { return -a; });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto, auto) { return exp(a); }, [](float a, float, float) { return std::exp(a); });
    check_tree<float>(runner, n, mis, mis, pos, [](auto a, auto, auto) { return log(a); }, [](float a, float, float) { return std::log(a); });
    check_tree<float>(runner, n, mis, mis, pos, [](auto a, auto, auto) { return sqrt(a); }, [](float a, float, float) { return std::sqrt(a); });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto, auto) { return square(a); }, [](float a, float, float) { return a * a; });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto, auto) { return abs(a); }, [](float a, float, float) { return std::abs(a); });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto, auto) { return sign(a); }, [](float a, float, float) { return float((a > 0) - (a < 0)); });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto, auto) { return relu(a); }, [](float a, float, float) { return std::max(a, 0.f); });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto, auto) { return sigmoid(a); }, [](float a, float, float) { return 1.f / (1.f + std::exp(-a)); });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto, auto) { return tanh(a); }, [](float a, float, float) { return std::tanh(a); });
    check_tree<float>(runner, n, mis, mis, pos, [](auto a, auto, auto) { return reciprocal(a); }, [](float a, float, float) { return 1.f / a; });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto b, auto) { return a + b; }, [](float a, float b, float) { return a + b; });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto b, auto) { return a - b; }, [](float a, float b, float) { return a - b; });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto b, auto) { return a * b; }, [](float a, float b, float) { return a * b; });
    check_tree<float>(runner, n, mis, mis, pos, [](auto a, auto b, auto) { return a / b; }, [](float a, float b, float) { return a / b; });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto b, auto) { return maximum(a, b); }, [](float a, float b, float) { return std::max(a, b); });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto b, auto) { return minimum(a, b); }, [](float a, float b, float) { return std::min(a, b); });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto b, auto) { return expr<ops::relu_grad, decltype(a), decltype(b)>{{}, {a, b}}; }, [](float a, float b, float) { return b > 0 ? a : 0.f; });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto, auto) { return clip_by_value(a, -1, 1.5); }, [](float a, float, float) { return std::min(std::max(a, -1.f), 1.5f); });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto b, auto c) { return where(a < b, a, c); }, [](float a, float b, float c) { return a < b ? a : c; });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto b, auto) { return a <= b; }, [](float a, float b, float) { return a <= b; });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto b, auto) { return a > b; }, [](float a, float b, float) { return a > b; });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto b, auto) { return a >= b; }, [](float a, float b, float) { return a >= b; });
    check_tree<float>(runner, n, mis, mis, f, [](auto a, auto, auto) { return cast<std::int32_t>(a * 10); }, [](float a, float, float) { return static_cast<std::int32_t>(a * 10.f); });
    check_tree<double>(runner, n, mis, mis, d, [](auto a, auto b, auto c) { return cast<float>(maximum(a, b) - c); }, [](double a, double b, double c) { return static_cast<float>(std::max(a, b) - c); });
    check_tree<std::int32_t>(runner, n, mis, mis, i32, [](auto a, auto b, auto) { return equal(a, b); }, [](std::int32_t a, std::int32_t b, std::int32_t) { return a == b; });
    check_tree<std::int32_t>(runner, n, mis, mis, i32, [](auto a, auto b, auto) { return not_equal(a, b); }, [](std::int32_t a, std::int32_t b, std::int32_t) { return a != b; });
    check_tree<std::int32_t>(runner, n, mis, mis, i32, [](auto a, auto b, auto c) { return relu(a * b - c) + abs(c) * sign(b) - square(a); }, [](std::int32_t a, std::int32_t b, std::int32_t c) { return std::max(a * b - c, 0) + std::abs(c) * ((b > 0) - (b < 0)) - a * a; });
    check_tree<std::int32_t>(runner, n, mis, mis, i32, [](auto a, auto b, auto) { return a / (abs(b) + 1) - minimum(a, -b); }, [](std::int32_t a, std::int32_t b, std::int32_t) { return a / (std::abs(b) + 1) - std::min(a, -b); });
    check_tree<std::int64_t>(runner, n, mis, mis, i64, [](auto a, auto b, auto c) { return maximum(a, b) - c; }, [](std::int64_t a, std::int64_t b, std::int64_t c) { return std::max(a, b) - c; });
    check_tree<std::int64_t>(runner, n, mis, mis, i64, [](auto a, auto b, auto) { return cast<bool>(a - b); }, [](std::int64_t a, std::int64_t b, std::int64_t) { return a != b; });
    // clang-format on
  }
}

} // namespace

// =============================================================================================
// Without a GPU
// =============================================================================================
TEST_SUITE("cuda_host") {

  TEST_CASE("LOOM_CUDA_CHECK throws loom errors with the CUDA string, the call, file and line") {
    try {
      LOOM_CUDA_CHECK(cudaErrorNoDevice);
      FAIL("no throw");
    } catch (const loom::unavailable_error& e) {
      const std::string what = e.what();
      CHECK(what.find("cudaErrorNoDevice") != std::string::npos);
      CHECK(what.find(cudaGetErrorString(cudaErrorNoDevice)) != std::string::npos);
      CHECK(what.find("test_gpu.cu:") != std::string::npos);
      CHECK(what.find("`cudaErrorNoDevice`") != std::string::npos);
    }
    CHECK_THROWS_AS(LOOM_CUDA_CHECK(cudaErrorInsufficientDriver), loom::unavailable_error);
    CHECK_THROWS_AS(LOOM_CUDA_CHECK(cudaErrorMemoryAllocation), loom::resource_exhausted_error);
    CHECK_THROWS_AS(LOOM_CUDA_CHECK(cudaErrorInvalidValue), loom::internal_error);
    CHECK_THROWS_AS(LOOM_CUDA_CHECK(cudaErrorIllegalAddress), loom::internal_error);
    CHECK_NOTHROW(LOOM_CUDA_CHECK(cudaSuccess));
  }

  TEST_CASE("device_count never throws") {
    int n = -1;
    CHECK_NOTHROW(n = cuda::device_count());
    CHECK(n >= 0);
    MESSAGE("CUDA devices: " << n);
  }

  TEST_CASE("size classes: 512 B below 1 MiB, 2 MiB from 1 MiB") {
    using A = cuda::caching_allocator;
    static_assert(A::round_size(0) == 0);
    static_assert(A::round_size(1) == 512);
    static_assert(A::round_size(512) == 512);
    static_assert(A::round_size(513) == 1024);
    static_assert(A::round_size((1 << 20) - 1) == (1 << 20));
    static_assert(A::round_size(1 << 20) == (2 << 20));
    static_assert(A::round_size((2 << 20) + 1) == (4 << 20));
    static_assert(A::round_size(std::size_t{1} << 30) == (std::size_t{1} << 30));
    CHECK(A::round_size(1000) == 1024);
  }

  TEST_CASE("the kernels' bodies on the host: fused trees, every op, tails and misalignment") {
    // 1 "thread" does everything; 3 and 7 leave uneven strides and tails; 256 is a block.
    for (const std::size_t threads :
         {std::size_t{1}, std::size_t{3}, std::size_t{7}, std::size_t{256}}) {
      CAPTURE(threads);
      host_runner runner{threads};
      check_fused<float, fused5>(runner, host_sizes);
      check_fused<double, fused5>(runner, host_sizes);
    }
    host_runner runner{97};
    check_fused<float, fused_math>(runner, host_sizes);
    check_fused<double, fused_math>(runner, host_sizes);
    check_each_op(runner);
  }

} // TEST_SUITE

// =============================================================================================
// On a GPU (skipped without one)
// =============================================================================================
TEST_SUITE("cuda_device" * doctest::skip(!have_gpu())) {

  TEST_CASE("stream and event: record, wait, query, timing") {
    cuda::stream s1, s2;
    auto start = cuda::event::timed(), end = cuda::event::timed();
    cuda::device_buffer<float> buf(1 << 20, s1);
    start.record(s1);
    LOOM_CUDA_CHECK(cudaMemsetAsync(buf.data(), 0, buf.bytes(), s1));
    end.record(s1);
    s2.wait(end);
    s2.synchronize();
    CHECK(end.query());
    CHECK(s1.query());
    CHECK(cuda::event::elapsed_ms(start, end) >= 0.f);
    cuda::stream moved = std::move(s1);
    CHECK(moved.get() != nullptr);
    CHECK(s1.get() == nullptr);
    CHECK(moved.device() == cuda::current_device());
    buf = cuda::device_buffer<float>(); // released before the stream it was used on
  }

  TEST_CASE("caching allocator: size classes, reuse on the same stream only, stats") {
    cuda::caching_allocator alloc;
    cuda::stream s1, s2;

    void* p = alloc.allocate(3000, s1);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
    cudaPointerAttributes attr{};
    LOOM_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
    CHECK(attr.type == cudaMemoryTypeDevice); // plain cudaMalloc, never managed
    auto st = alloc.stats();
    CHECK(st.bytes_in_use == 3072);
    CHECK(st.bytes_requested == 3000);
    CHECK(st.bytes_cached == 0);
    CHECK(st.cuda_malloc_calls == 1);

    CHECK(alloc.deallocate(p));
    st = alloc.stats();
    CHECK(st.bytes_in_use == 0);
    CHECK(st.bytes_requested == 0);
    CHECK(st.bytes_cached == 3072);

    // Same size class, same stream: the cached block, no cudaMalloc.
    void* q = alloc.allocate(2600, s1);
    CHECK(q == p);
    st = alloc.stats();
    CHECK(st.cuda_malloc_calls == 1);
    CHECK(st.cache_hits == 1);
    CHECK(st.bytes_cached == 0);
    CHECK(st.bytes_in_use == 3072);
    CHECK(alloc.deallocate(q));

    // Another stream never gets s1's block.
    void* r = alloc.allocate(3000, s2);
    CHECK(r != p);
    CHECK(alloc.stats().cuda_malloc_calls == 2);
    // A request less than half the cached block's size does not take it.
    void* tiny = alloc.allocate(100, s1);
    CHECK(tiny != p);
    CHECK(alloc.stats().cuda_malloc_calls == 3);

    // Large: 2 MiB classes. 3 MiB is a 4 MiB block, which a later 2.5 MiB request
    // (also the 4 MiB class) on the same stream reuses.
    void* big = alloc.allocate(3u << 20, s1);
    const std::size_t in_use = 3072 + 512 + (4u << 20);
    CHECK(alloc.stats().bytes_in_use == in_use);
    alloc.deallocate(big);
    void* big2 = alloc.allocate((5u << 20) / 2, s1);
    CHECK(big2 == big);
    CHECK(alloc.stats().cuda_malloc_calls == 4);
    CHECK(alloc.stats().peak_bytes_in_use == in_use);

    alloc.deallocate(big2);
    alloc.deallocate(r);
    alloc.deallocate(tiny);
    CHECK_FALSE(alloc.deallocate(reinterpret_cast<void*>(0x1234)));
    st = alloc.stats();
    CHECK(st.bytes_in_use == 0);
    CHECK(st.bytes_cached == 3072 + 3072 + 512 + (4u << 20));
    alloc.reset_peak();
    CHECK(alloc.stats().peak_bytes_in_use == 0);
    alloc.empty_cache();
    st = alloc.stats();
    CHECK(st.bytes_cached == 0);
    CHECK(st.cuda_free_calls == 4);
    CHECK(alloc.allocate(0, s1) == nullptr);
  }

  TEST_CASE("caching allocator: device_buffer RAII and threads") {
    cuda::caching_allocator alloc;
    cuda::stream s;
    {
      cuda::device_buffer<double> a(1000, s, alloc);
      CHECK(a.size() == 1000);
      CHECK(a.bytes() == 8000);
      CHECK(alloc.stats().bytes_in_use == 8192);
      cuda::device_buffer<double> b = std::move(a);
      CHECK(a.data() == nullptr);
      CHECK(a.empty());
      CHECK(b.size() == 1000);
      CHECK(alloc.stats().bytes_in_use == 8192);
    }
    CHECK(alloc.stats().bytes_in_use == 0);
    CHECK(alloc.stats().bytes_cached == 8192);

    // Threads allocating and freeing on their own streams.
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        try {
          LOOM_CUDA_CHECK(cudaSetDevice(s.device()));
          cuda::stream mine;
          std::mt19937 rng(static_cast<unsigned>(t));
          for (int i = 0; i < 500; ++i) {
            cuda::device_buffer<char> x(1 + rng() % (3u << 20), mine, alloc);
            cuda::device_buffer<char> y(1 + rng() % 4096, mine, alloc);
            if (!x.data() || !y.data())
              ++failures;
          }
          mine.synchronize();
        } catch (...) {
          ++failures;
        }
      });
    }
    for (auto& t : threads)
      t.join();
    CHECK(failures == 0);
    const auto st = alloc.stats();
    CHECK(st.bytes_in_use == 0);
    CHECK(st.allocations == 1 + 4 * 1000);
    CHECK(st.cuda_malloc_calls < st.allocations / 2); // the cache serves most
    alloc.empty_cache();
    CHECK(alloc.stats().bytes_cached == 0);
  }

  TEST_CASE("copies: host -> device -> device -> host round trip, pinned and pageable") {
    cuda::stream s;
    const std::size_t n = (1u << 20) + 3;
    std::mt19937_64 rng(fresh_seed());
    cuda::pinned_buffer<float> h(n);
    for (auto& x : h)
      x = std::uniform_real_distribution<float>(-1e6f, 1e6f)(rng);
    cuda::device_buffer<float> d1(n, s), d2(n, s);
    cuda::copy_to_device(d1, h.span());
    cuda::copy_device_to_device(d2.data(), d1.data(), n, s);
    std::vector<float> back(n, -1.f);
    cuda::copy_to_host(std::span<float>(back), d2);
    s.synchronize();
    CHECK(std::memcmp(back.data(), h.data(), n * sizeof(float)) == 0);

    cuda::pinned_buffer<float> h2(n);
    cuda::copy_to_host(h2.span(), d1, s);
    s.synchronize();
    CHECK(std::memcmp(h2.data(), h.data(), n * sizeof(float)) == 0);

    std::vector<float> too_big(n + 1);
    CHECK_THROWS_AS(cuda::copy_to_device(d1, too_big), loom::invalid_argument_error);
    CHECK_THROWS_AS(cuda::copy_to_host(std::span<float>(too_big), d1),
                    loom::invalid_argument_error);
    cudaPointerAttributes attr{};
    LOOM_CUDA_CHECK(cudaPointerGetAttributes(&attr, h.data()));
    CHECK(attr.type == cudaMemoryTypeHost);
  }

  TEST_CASE("fused kernel: relu(a*b + c)*2 - a vs the CPU, float and double, every size") {
    device_runner runner;
    check_fused<float, fused5>(runner, device_sizes);
    check_fused<double, fused5>(runner, device_sizes);
  }

  TEST_CASE("fused kernel: transcendentals, division and clip vs the CPU") {
    device_runner runner;
    check_fused<float, fused_math>(runner, device_sizes);
    check_fused<double, fused_math>(runner, device_sizes);
  }

  TEST_CASE("fused kernel: every op, int and bool results, casts") {
    device_runner runner;
    check_each_op(runner);
  }

  TEST_CASE("fused kernel: in place and n = 0") {
    using namespace loom;
    cuda::stream s;
    const std::size_t n = 1003;
    std::vector<float> h(n);
    for (std::size_t i = 0; i < n; ++i)
      h[i] = float(i) - 500.f;
    cuda::device_buffer<float> d(n, s);
    cuda::copy_to_device(d, h);
    const auto a = cuda::input(d);
    cuda::evaluate(relu(a) + 1, d.data(), n, s); // out == the input
    cuda::evaluate(a * 0, d.data(), 0, s);       // nothing
    std::vector<float> back(n);
    cuda::copy_to_host(std::span<float>(back), d);
    s.synchronize();
    for (std::size_t i = 0; i < n; ++i)
      CHECK(back[i] == std::max(h[i], 0.f) + 1.f);
  }

} // TEST_SUITE

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  if (!have_gpu())
    std::printf("no CUDA device: the cuda_device test cases are skipped "
                "(the cuda_host ones still run)\n");
  return context.run();
}

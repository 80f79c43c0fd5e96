// gpu_elementwise: GB/s of loom's fused CUDA elementwise kernel against a
// device-to-device cudaMemcpy (the ceiling for a streaming kernel) and against the
// same expression unfused (one kernel per op, intermediates in device memory).
//
//   expression: relu(a * b + c) * 2 - a    (5 ops, 3 inputs, 1 output, float)
//   bytes:      copy 2 arrays (read + write); fused 4 arrays (3 read + 1 written);
//               unfused 13 array passes (mul 3, add 3, relu 2, mul-by-2 2, sub 3)
//   timing:     cudaEvent around each run, median of --iters (20) after 3 warm-up runs
//
// Target: fused GB/s >= 0.85 x the copy's. Without a CUDA device it prints
// "no CUDA device: skipped" and exits 0.
//
//   gpu_elementwise [--n=<floats>] [--iters=<runs>] [--smoke]   (default n = 256M floats, 1 GiB)
//
// --smoke: n = 1M floats and 1 run unless given, a test that every case still runs (ctest
// bench_gpu_elementwise_smoke, skipped without a device); its figures mean nothing.
#include <loom/kernels/cuda/allocator.hpp>
#include <loom/kernels/cuda/error.hpp>
#include <loom/kernels/cuda/expression.cuh>
#include <loom/kernels/cuda/stream.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace cuda = loom::cuda;

namespace {

// Deterministic inputs in [-1, 1) without a host round trip.
__host__ __device__ inline float hash_float(std::uint64_t i, std::uint64_t seed) {
  std::uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

__global__ void fill_kernel(float* p, std::size_t n, std::uint64_t seed) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  for (std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = hash_float(i, seed);
}

// Median milliseconds of `iters` runs of f (each bracketed by events) after 3 warm-ups.
template <class F> double median_ms(cuda::stream& s, int iters, F&& f) {
  for (int i = 0; i < 3; ++i)
    f();
  s.synchronize();
  auto start = cuda::event::timed();
  auto end = cuda::event::timed();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    start.record(s);
    f();
    end.record(s);
    ms.push_back(cuda::event::elapsed_ms(start, end));
  }
  std::sort(ms.begin(), ms.end());
  return ms.size() % 2 ? ms[ms.size() / 2] : (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]) / 2;
}

bool parse_flag(const char* arg, const char* name, long long& value) {
  const std::size_t len = std::strlen(name);
  if (std::strncmp(arg, name, len) != 0 || arg[len] != '=')
    return false;
  char* end = nullptr;
  value = std::strtoll(arg + len + 1, &end, 10);
  return end && *end == '\0' && value > 0;
}

} // namespace

int main(int argc, char** argv) {
  long long n_arg = 0, iters_arg = 0; // 0: not given (parse_flag takes positive values only)
  bool smoke = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--smoke") == 0)
      smoke = true;
    else if (!parse_flag(argv[i], "--n", n_arg) && !parse_flag(argv[i], "--iters", iters_arg)) {
      std::fprintf(stderr, "usage: %s [--n=<floats>] [--iters=<runs>] [--smoke]\n", argv[0]);
      return 2;
    }
  }
  if (n_arg == 0)
    n_arg = smoke ? 1ll << 20 : 256ll << 20;
  if (iters_arg == 0)
    iters_arg = smoke ? 1 : 20;
  if (cuda::device_count() == 0) {
    std::printf("gpu_elementwise: no CUDA device: skipped\n");
    return 0;
  }

  try {
    using namespace loom;
    const int iters = static_cast<int>(iters_arg);
    std::size_t n = static_cast<std::size_t>(n_arg);
    n -= n % 4; // the copy and the fused kernel on whole float4s

    // a, b, c, out and two intermediates for the unfused version.
    std::size_t free_bytes = 0, total_bytes = 0;
    LOOM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    while (n > 4 && 6 * n * sizeof(float) + (256u << 20) > free_bytes)
      n /= 2;
    if (n != static_cast<std::size_t>(n_arg) - static_cast<std::size_t>(n_arg) % 4)
      std::printf("note: n reduced to %zu floats to fit %.1f GiB of free device memory\n", n,
                  free_bytes / double(1u << 30));

    cudaDeviceProp prop{};
    LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, cuda::current_device()));

    cuda::stream s;
    cuda::device_buffer<float> a(n, s), b(n, s), c(n, s), out(n, s), t1(n, s), t2(n, s);
    fill_kernel<<<1024, 256, 0, s>>>(a.data(), n, 1);
    fill_kernel<<<1024, 256, 0, s>>>(b.data(), n, 2);
    fill_kernel<<<1024, 256, 0, s>>>(c.data(), n, 3);
    LOOM_CUDA_CHECK(cudaGetLastError());

    const auto A = cuda::input(a), B = cuda::input(b), C = cuda::input(c);
    const auto T1 = cuda::input(t1), T2 = cuda::input(t2);
    const auto fused = relu(A * B + C) * 2 - A;
    const double array_bytes = double(n) * sizeof(float);

    // The fused result, checked against the host on a sample before timing.
    cuda::evaluate(fused, out.data(), n, s);
    {
      const std::size_t m = std::min<std::size_t>(n, 1u << 20);
      std::vector<float> head(m), tail(m);
      cuda::copy_to_host(head.data(), out.data(), m, s);
      cuda::copy_to_host(tail.data(), out.data() + (n - m), m, s);
      s.synchronize();
      for (std::size_t k = 0; k < 2 * m; ++k) {
        const std::size_t i = k < m ? k : n - m + (k - m);
        const float got = k < m ? head[k] : tail[k - m];
        const float x = hash_float(i, 1), y = hash_float(i, 2), z = hash_float(i, 3);
        const float want = std::max(x * y + z, 0.f) * 2.f - x;
        if (!(std::abs(got - want) <= 1e-5f * (1.f + std::abs(want)))) {
          std::printf("gpu_elementwise: WRONG RESULT at %zu: got %g, want %g\n", i, got, want);
          return 1;
        }
      }
    }

    const double copy_ms = median_ms(s, iters, [&] {
      LOOM_CUDA_CHECK(
          cudaMemcpyAsync(out.data(), a.data(), n * sizeof(float), cudaMemcpyDeviceToDevice, s));
    });
    const double fused_ms = median_ms(s, iters, [&] { cuda::evaluate(fused, out.data(), n, s); });
    // The same tree on pointers one element off: no float4 path.
    const auto A1 = cuda::input(a.data() + 1), B1 = cuda::input(b.data() + 1),
               C1 = cuda::input(c.data() + 1);
    const auto fused_misaligned = relu(A1 * B1 + C1) * 2 - A1;
    const double scalar_ms =
        median_ms(s, iters, [&] { cuda::evaluate(fused_misaligned, out.data() + 1, n - 1, s); });
    const double unfused_ms = median_ms(s, iters, [&] {
      cuda::evaluate(A * B, t1.data(), n, s);
      cuda::evaluate(T1 + C, t2.data(), n, s);
      cuda::evaluate(relu(T2), t1.data(), n, s);
      cuda::evaluate(T1 * 2, t2.data(), n, s);
      cuda::evaluate(T2 - A, out.data(), n, s);
    });

    const double copy_gbs = 2 * array_bytes / (copy_ms * 1e6);
    struct row {
      const char* name;
      double ms;
      double arrays; // array passes it makes
    };
    const row rows[] = {
        {"D2D cudaMemcpy (read + write)", copy_ms, 2},
        {"fused relu(a*b+c)*2-a, 1 kernel", fused_ms, 4},
        {"fused, scalar loads (misaligned by 1)", scalar_ms, 4},
        {"unfused, 5 kernels (13 array passes)", unfused_ms, 13},
    };
    std::printf("gpu_elementwise: %s, %zu floats (%.2f GiB per array), median of %d runs after "
                "3 warm-up runs\n",
                prop.name, n, array_bytes / double(1u << 30), iters);
    std::printf("%-40s %10s %12s %10s %10s %14s\n", "case", "ms", "GB moved", "GB/s", "vs copy",
                "effective GB/s");
    for (const row& r : rows) {
      const double gbs = r.arrays * array_bytes / (r.ms * 1e6);
      // Effective: the expression's own 4 arrays over the time (for the copy, its 2).
      const double effective = (r.arrays == 2 ? 2 : 4) * array_bytes / (r.ms * 1e6);
      std::printf("%-40s %10.3f %12.2f %10.1f %10.3f %14.1f\n", r.name, r.ms,
                  r.arrays * array_bytes / 1e9, gbs, gbs / copy_gbs, effective);
    }
    const double ratio = (4 * array_bytes / (fused_ms * 1e6)) / copy_gbs;
    std::printf("fused / D2D copy: %.3f (target >= 0.85: %s); fused is %.2fx faster than unfused\n",
                ratio, ratio >= 0.85 ? "met" : "NOT met", unfused_ms / fused_ms);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_elementwise: %s\n", e.what());
    return 1;
  }
  return 0;
}

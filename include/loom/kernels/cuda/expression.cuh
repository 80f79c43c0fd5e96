// One generated CUDA kernel per fused elementwise expression (DESIGN.md §2:
// "GPU via one generated CUDA kernel"). The typed tree of expr/expr.hpp, with
// device pointers as leaves, becomes a device-side tree of the same shape; one
// grid-stride kernel evaluates the whole tree per element, so intermediates live
// in registers and each input is read once and the output written once.
//
//   using namespace loom;
//   auto a = cuda::input(pa), b = cuda::input(pb), c = cuda::input(pc); // const float*
//   cuda::evaluate(relu(a * b + c) * 2.0f - a, out, n, stream);         // one kernel
//
// * Leaves: cuda::input(p) (a device pointer to n elements, or a device_buffer) and
//   C++ numbers (scalar_leaf, broadcast). All pointer leaves hold n elements; there
//   is no other broadcasting. Graph leaves (placeholders, variables) are not device
//   memory and are refused at compile time.
// * Ops: every op of expr/ops.hpp, through its scalar form (the tag's apply(),
//   written beside its Eigen form and checked against it by the kernels' test).
// * Loads: when every pointer leaf and the output are aligned to 4 elements, the
//   kernel reads and writes 4 elements per access (float4 for float) and the last
//   n % 4 elements are done one by one; otherwise it is scalar throughout.
// * The output may be one of the inputs exactly (in place), never a partial overlap.
// * Float math is CUDA's (expf, tanhf, ... with fused multiply-add contraction), so it
//   agrees with the CPU kernels to a few ulps, not bit for bit.
// Needs nvcc (a .cu translation unit).
#pragma once

#include <loom/expr/expr.hpp>
#include <loom/expr/ops.hpp>
#include <loom/kernels/cuda/allocator.hpp>
#include <loom/kernels/cuda/error.hpp>
#include <loom/kernels/cuda/stream.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>

namespace loom {

// A leaf of a typed tree reading n elements of T at a device pointer. It lives
// in namespace loom so that loom's operators and functions are found by ADL.
template <element_type T> struct device_leaf {
  static_assert(std::is_arithmetic_v<T>, "loom::cuda::input: only arithmetic element types "
                                         "(float, double, int32, int64, bool) live on a GPU");
  using value_type = T;
  static constexpr int rank = 1;
  using device_kind = gpu;
  static constexpr bool is_leaf = true;
  const T* ptr;
};

namespace cuda {

// A device pointer as a leaf of an expression.
template <class T> constexpr device_leaf<std::remove_cv_t<T>> input(const T* device_ptr) noexcept {
  return {device_ptr};
}
template <class T> device_leaf<T> input(const device_buffer<T>& b) noexcept {
  return {b.data()};
}

namespace detail {

template <class> inline constexpr bool always_false = false;

// -- the device-side tree: trivially copyable, passed to the kernel by value ---------------
template <class T> struct d_leaf {
  using value_type = T;
  const T* p;
};
template <class T> struct d_scalar {
  using value_type = T;
  T v;
};
// One element in device memory, read for every output element (a rank-0 leaf
// of a graph's fused region: a scalar constant or a scalar node's value).
template <class T> struct d_repeat {
  using value_type = T;
  const T* p;
};
template <class Op, class... C> struct d_node;
template <class Op, class C0> struct d_node<Op, C0> {
  using value_type = typename Op::template result<typename C0::value_type>;
  C0 c0;
};
template <class Op, class C0, class C1> struct d_node<Op, C0, C1> {
  using value_type = typename Op::template result<typename C0::value_type, typename C1::value_type>;
  C0 c0;
  C1 c1;
};
template <class Op, class C0, class C1, class C2> struct d_node<Op, C0, C1, C2> {
  using value_type = typename Op::template result<typename C0::value_type, typename C1::value_type,
                                                  typename C2::value_type>;
  C0 c0;
  C1 c1;
  C2 c2;
};

// -- host: typed tree -> device tree ----------------------------------------------------------
template <class E> struct to_device_impl {
  static_assert(always_false<E>,
                "loom::cuda::evaluate: every leaf must be a device pointer (loom::cuda::input(p)) "
                "or a number; graph leaves (placeholders, variables, node outputs) are run by "
                "the executor, not by cuda::evaluate");
};
template <class T> struct to_device_impl<device_leaf<T>> {
  using type = d_leaf<T>;
  static type convert(const device_leaf<T>& l) { return {l.ptr}; }
};
template <class T> struct to_device_impl<scalar_leaf<T>> {
  static_assert(std::is_arithmetic_v<T>, "loom::cuda::evaluate: string scalars have no GPU form");
  using type = d_scalar<T>;
  static type convert(const scalar_leaf<T>& s) { return {s.value}; }
};
template <class Op, class... C> struct to_device_impl<expr<Op, C...>> {
  static_assert(sizeof...(C) >= 1 && sizeof...(C) <= 3, "loom::cuda: ops take 1 to 3 operands");
  using type = d_node<Op, typename to_device_impl<C>::type...>;
  static type convert(const expr<Op, C...>& e) {
    return std::apply([](const C&... c) { return type{to_device_impl<C>::convert(c)...}; },
                      e.children);
  }
};

template <class E> using device_tree_t = typename to_device_impl<std::remove_cvref_t<E>>::type;

template <class E> device_tree_t<E> to_device(const E& e) {
  return to_device_impl<std::remove_cvref_t<E>>::convert(e);
}

// True when every pointer leaf is aligned to 4 of its elements.
template <class T> bool aligned4(const d_leaf<T>& l) {
  return reinterpret_cast<std::uintptr_t>(l.p) % (4 * sizeof(T)) == 0;
}
template <class T> bool aligned4(const d_scalar<T>&) {
  return true;
}
template <class T> bool aligned4(const d_repeat<T>&) {
  return true;
}
template <class Op, class C0> bool aligned4(const d_node<Op, C0>& n) {
  return aligned4(n.c0);
}
template <class Op, class C0, class C1> bool aligned4(const d_node<Op, C0, C1>& n) {
  return aligned4(n.c0) && aligned4(n.c1);
}
template <class Op, class C0, class C1, class C2> bool aligned4(const d_node<Op, C0, C1, C2>& n) {
  return aligned4(n.c0) && aligned4(n.c1) && aligned4(n.c2);
}

// -- device: one element -------------------------------------------------------------------------
template <class T> __host__ __device__ inline T eval1(const d_leaf<T>& l, std::size_t i) {
  return l.p[i];
}
template <class T> __host__ __device__ inline T eval1(const d_scalar<T>& s, std::size_t) {
  return s.v;
}
template <class T> __host__ __device__ inline T eval1(const d_repeat<T>& r, std::size_t) {
  return *r.p;
}
template <class Op, class C0>
__host__ __device__ inline typename d_node<Op, C0>::value_type eval1(const d_node<Op, C0>& n,
                                                                     std::size_t i) {
  return Op::apply(eval1(n.c0, i));
}
template <class Op, class C0, class C1>
__host__ __device__ inline typename d_node<Op, C0, C1>::value_type
eval1(const d_node<Op, C0, C1>& n, std::size_t i) {
  return Op::apply(eval1(n.c0, i), eval1(n.c1, i));
}
template <class Op, class C0, class C1, class C2>
__host__ __device__ inline typename d_node<Op, C0, C1, C2>::value_type
eval1(const d_node<Op, C0, C1, C2>& n, std::size_t i) {
  return Op::apply(eval1(n.c0, i), eval1(n.c1, i), eval1(n.c2, i));
}

// -- device: four elements (one vector access per pointer leaf) ---------------------------------
// 4 elements aligned as one access: 16 bytes (ld.global.v4) for 4-byte types. The
// constant 4-lane loops below are fully unrolled by nvcc.
template <class T> struct alignas(4 * sizeof(T)) pack4 { T v[4]; };

template <class T> __host__ __device__ inline pack4<T> eval4(const d_leaf<T>& l, std::size_t g) {
  return reinterpret_cast<const pack4<T>*>(l.p)[g];
}
template <class T> __host__ __device__ inline pack4<T> eval4(const d_scalar<T>& s, std::size_t) {
  return {{s.v, s.v, s.v, s.v}};
}
template <class T> __host__ __device__ inline pack4<T> eval4(const d_repeat<T>& r, std::size_t) {
  const T v = *r.p;
  return {{v, v, v, v}};
}
template <class Op, class C0>
__host__ __device__ inline pack4<typename d_node<Op, C0>::value_type> eval4(const d_node<Op, C0>& n,
                                                                            std::size_t g) {
  const auto a = eval4(n.c0, g);
  pack4<typename d_node<Op, C0>::value_type> r;
  for (int k = 0; k < 4; ++k)
    r.v[k] = Op::apply(a.v[k]);
  return r;
}
template <class Op, class C0, class C1>
__host__ __device__ inline pack4<typename d_node<Op, C0, C1>::value_type>
eval4(const d_node<Op, C0, C1>& n, std::size_t g) {
  const auto a = eval4(n.c0, g);
  const auto b = eval4(n.c1, g);
  pack4<typename d_node<Op, C0, C1>::value_type> r;
  for (int k = 0; k < 4; ++k)
    r.v[k] = Op::apply(a.v[k], b.v[k]);
  return r;
}
template <class Op, class C0, class C1, class C2>
__host__ __device__ inline pack4<typename d_node<Op, C0, C1, C2>::value_type>
eval4(const d_node<Op, C0, C1, C2>& n, std::size_t g) {
  const auto a = eval4(n.c0, g);
  const auto b = eval4(n.c1, g);
  const auto c = eval4(n.c2, g);
  pack4<typename d_node<Op, C0, C1, C2>::value_type> r;
  for (int k = 0; k < 4; ++k)
    r.v[k] = Op::apply(a.v[k], b.v[k], c.v[k]);
  return r;
}

// -- the kernels' bodies: thread `tid` of `nthreads`, grid-stride. Host-callable so
// that the indexing (vector body, scalar tail) is testable without a GPU. -----------------
template <class Tree, class R>
__host__ __device__ inline void scalar_body(const Tree& t, R* out, std::size_t n, std::size_t tid,
                                            std::size_t nthreads) {
  for (std::size_t i = tid; i < n; i += nthreads)
    out[i] = eval1(t, i);
}

template <class Tree, class R>
__host__ __device__ inline void vector_body(const Tree& t, R* out, std::size_t n, std::size_t tid,
                                            std::size_t nthreads) {
  const std::size_t groups = n / 4;
  pack4<R>* out4 = reinterpret_cast<pack4<R>*>(out);
  for (std::size_t g = tid; g < groups; g += nthreads)
    out4[g] = eval4(t, g);
  for (std::size_t i = groups * 4 + tid; i < n; i += nthreads) // the n % 4 tail
    out[i] = eval1(t, i);
}

inline constexpr int block_threads = 256;

template <class Tree, class R>
__global__ void __launch_bounds__(block_threads) scalar_kernel(Tree t, R* out, std::size_t n) {
  const std::size_t nthreads = std::size_t{gridDim.x} * blockDim.x;
  scalar_body(t, out, n, std::size_t{blockIdx.x} * blockDim.x + threadIdx.x, nthreads);
}

template <class Tree, class R>
__global__ void __launch_bounds__(block_threads) vector_kernel(Tree t, R* out, std::size_t n) {
  const std::size_t nthreads = std::size_t{gridDim.x} * blockDim.x;
  vector_body(t, out, n, std::size_t{blockIdx.x} * blockDim.x + threadIdx.x, nthreads);
}

// Streaming multiprocessors of a device, asked once per device.
inline int sm_count(int device) {
  constexpr int max_devices = 64;
  static std::atomic<int> cache[max_devices] = {};
  if (device < 0 || device >= max_devices) {
    int n = 0;
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n;
  }
  int n = cache[device].load(std::memory_order_relaxed);
  if (n == 0) {
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    cache[device].store(n, std::memory_order_relaxed);
  }
  return n;
}

// Resident blocks of one kernel per SM, asked once per kernel (a template
// argument: the scalar and the vector kernel of one tree have the same type).
template <auto Kernel> int blocks_per_sm() {
  static const int blocks = [] {
    int b = 0;
    LOOM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, Kernel, block_threads, 0));
    return std::max(b, 1);
  }();
  return blocks;
}

// Enough blocks for `work` items, at most what the GPU holds at once (the kernels
// stride over the rest).
template <auto Kernel> unsigned grid_for(std::size_t work) {
  const std::size_t wanted = (work + block_threads - 1) / block_threads;
  const std::size_t resident =
      static_cast<std::size_t>(sm_count(current_device())) * blocks_per_sm<Kernel>();
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min(wanted, resident)));
}

// What launch() does, on the host: every "thread" of a grid of `nthreads` in
// turn. For tests of the kernels' indexing on machines without a GPU; `out` and
// the tree's leaves are host pointers here.
template <class Tree, class R>
void emulate_tree_on_host(const Tree& tree, R* out, std::size_t n, std::size_t nthreads,
                          bool vectorized) {
  for (std::size_t tid = 0; tid < nthreads; ++tid) {
    if (vectorized)
      vector_body(tree, out, n, tid, nthreads);
    else
      scalar_body(tree, out, n, tid, nthreads);
  }
}
template <expression E>
void emulate_on_host(const E& e, value_type_of<E>* out, std::size_t n, std::size_t nthreads,
                     bool vectorized) {
  emulate_tree_on_host(to_device(e), out, n, nthreads, vectorized);
}

// Whether launch() takes the 4-wide path for this tree and output.
template <class Tree, class R>
bool vectorizable_tree(const Tree& tree, const R* out, std::size_t n) {
  return n >= 4 && reinterpret_cast<std::uintptr_t>(out) % (4 * sizeof(R)) == 0 && aligned4(tree);
}

// One kernel over n elements of a device tree into out, on `stream`.
template <class Tree, class R>
void launch(const Tree& tree, R* out, std::size_t n, cudaStream_t stream) {
  if (n == 0)
    return;
  if (vectorizable_tree(tree, out, n)) {
    constexpr auto kernel = &vector_kernel<Tree, R>;
    kernel<<<grid_for<kernel>(n / 4), block_threads, 0, stream>>>(tree, out, n);
  } else {
    constexpr auto kernel = &scalar_kernel<Tree, R>;
    kernel<<<grid_for<kernel>(n), block_threads, 0, stream>>>(tree, out, n);
  }
  LOOM_CUDA_CHECK(cudaGetLastError());
}

} // namespace detail

// Whether evaluate() would take the 4-wide path for these pointers.
template <expression E> bool vectorizable(const E& e, const value_type_of<E>* out, std::size_t n) {
  return detail::vectorizable_tree(detail::to_device(e), out, n);
}

// Evaluates an elementwise tree over n elements into out (device memory), as one
// kernel launched on `stream`. Asynchronous; launch errors throw at once, errors
// during the kernel surface at the next synchronising call.
template <expression E>
void evaluate(const E& e, value_type_of<E>* out, std::size_t n, cudaStream_t stream = nullptr) {
  static_assert(std::is_arithmetic_v<value_type_of<E>>,
                "loom::cuda::evaluate: string results have no GPU form");
  detail::launch(detail::to_device(e), out, n, stream);
}

} // namespace cuda
} // namespace loom

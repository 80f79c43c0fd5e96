// GPU kernels of the non-elementwise math ops (kernels/cpu/math.hpp on the CPU).
//
// add_n sums its inputs element by element in their order, as the CPU does.
// matmul and xw_plus_b run on cuBLAS (sgemm/dgemm): loom's tensors are
// row-major and cuBLAS is column-major, so C = op(A) op(B) is computed as
// C^T = op(B)^T op(A)^T over the same buffers; xw_plus_b adds the bias with a
// kernel afterwards. Reductions merge the input's dimensions into runs of kept
// and reduced ones as the CPU kernel does, then reduce every output element
// over all its reduced runs at once: one thread per output element for short
// reductions, otherwise a block per output element (split over several blocks
// and finished by a second pass when there are few outputs and many inputs).
#pragma once

#include <loom/kernels/checks/math.hpp>
#include <loom/kernels/cuda/common.cuh>
#include <loom/kernels/cuda/elementwise.cuh>
#include <loom/kernels/registry.hpp>

#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace loom::kernels::cuda_kernels {

// -- matmul, xw_plus_b -------------------------------------------------------------------

inline cublasStatus_t gemm_call(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                int n, int k, const float* alpha, const float* a, int lda,
                                const float* b, int ldb, const float* beta, float* c, int ldc) {
  return cublasSgemm(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline cublasStatus_t gemm_call(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                int n, int k, const double* alpha, const double* a, int lda,
                                const double* b, int ldb, const double* beta, double* c, int ldc) {
  return cublasDgemm(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

inline int blas_dim(const node_def& n, std::int64_t d) {
  if (d > INT_MAX)
    throw unimplemented_error("node " + n.describe() + ": a matrix dimension of " +
                              std::to_string(d) + " exceeds cuBLAS's 32-bit sizes");
  return static_cast<int>(std::max<std::int64_t>(d, 1));
}

// C [m, n] = op(A) op(B) (+ C where `accumulate`), row-major on this GPU: the GPU's one
// matrix product (matmul, xw_plus_b, conv2d over patches, batch_matmul per batch).
template <class T>
void gemm_rows(const kernel_context& c, const T* a, bool ta, const T* b, bool tb, T* out,
               std::int64_t m, std::int64_t n, std::int64_t k, bool accumulate) {
  const gpu_context& g = gpu_of(c);
  if (m == 0 || n == 0)
    return;
  if (k == 0) {
    if (!accumulate)
      LOOM_CUDA_CHECK(
          cudaMemsetAsync(out, 0, static_cast<std::size_t>(m * n) * sizeof(T), g.stream));
    return;
  }
  const T one = T(1), beta = accumulate ? T(1) : T(0);
  // Column-major, the buffers hold A^T and B^T; C^T = op(B)^T op(A)^T.
  cuda::check_cublas(gemm_call(g.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                               ta ? CUBLAS_OP_T : CUBLAS_OP_N, blas_dim(c.node, n),
                               blas_dim(c.node, m), blas_dim(c.node, k), &one, b,
                               blas_dim(c.node, tb ? k : n), a, blas_dim(c.node, ta ? m : k), &beta,
                               out, blas_dim(c.node, n)),
                     "gemm");
}

// out ([m, n], allocated) = op(a) op(b), all row-major on this GPU.
template <class T>
void gemm(const kernel_context& c, const any_tensor& a, bool ta, const any_tensor& b, bool tb,
          any_tensor& out) {
  gemm_rows(c, a.template device_data<T>(), ta, b.template device_data<T>(), tb,
            out.template device_data<T>(), out.shape()[0], out.shape()[1], a.shape()[ta ? 0 : 1],
            false);
}

template <class T>
__global__ void add_bias_kernel(T* out, std::int64_t n, std::int64_t cols, const T* bias) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] += bias[i % cols];
}

template <class T> struct matmul_gpu {
  static void run(kernel_context& c) {
    const any_tensor& a = c.input(0);
    const any_tensor& b = c.input(1);
    const bool ta = c.node.attr_or<bool>("transpose_a", false);
    const bool tb = c.node.attr_or<bool>("transpose_b", false);
    c.output = gpu_of(c).allocate(dtype_of<T>, matmul_shape(c.node, a, b, ta, tb));
    gemm<T>(c, a, ta, b, tb, c.output);
  }
};

template <class T> struct xw_plus_b_gpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const any_tensor& w = c.input(1);
    const any_tensor& b = c.input(2);
    const loom::shape out_shape = xw_plus_b_shape(c.node, x, w, b);
    const gpu_context& g = gpu_of(c);
    c.output = g.allocate(dtype_of<T>, out_shape);
    gemm<T>(c, x, false, w, false, c.output);
    const std::int64_t n = c.output.num_elements();
    if (n == 0)
      return;
    add_bias_kernel<T><<<grid_for(n), block_threads, 0, g.stream>>>(
        c.output.template device_data<T>(), n, w.shape()[1], b.template device_data<T>());
    check_launch();
  }
};

// -- add_n -----------------------------------------------------------------------------------

// Up to this many inputs per launch, their addresses in the launch's parameters;
// more inputs take more launches, each adding its inputs to the output in order.
inline constexpr int add_n_per_launch = 64;
template <class T> struct add_n_inputs {
  const T* x[add_n_per_launch];
  int count;
};

// out[e] (or, accumulating, out[e] plus) the inputs' elements e in their order:
// the CPU kernel's order, so both give the same bits.
template <class T>
__global__ void add_n_kernel(T* out, add_n_inputs<T> in, bool accumulate, std::int64_t n) {
  for (std::int64_t e = global_thread(); e < n; e += grid_threads()) {
    T acc = accumulate ? out[e] : in.x[0][e];
    for (int i = accumulate ? 0 : 1; i < in.count; ++i)
      acc += in.x[i][e];
    out[e] = acc;
  }
}

template <class T> struct add_n_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    c.output = g.allocate(c.input(0).type(), add_n_shape(c.node, c.inputs));
    const std::int64_t n = c.output.num_elements();
    if (n == 0)
      return;
    for (std::size_t first = 0; first < c.inputs.size(); first += add_n_per_launch) {
      add_n_inputs<T> in{};
      in.count = static_cast<int>(std::min<std::size_t>(add_n_per_launch, c.inputs.size() - first));
      for (int i = 0; i < in.count; ++i)
        in.x[i] = c.inputs[first + static_cast<std::size_t>(i)]->template device_data<T>();
      add_n_kernel<T><<<grid_for(n), block_threads, 0, g.stream>>>(
          c.output.template device_data<T>(), in, first > 0, n);
      check_launch();
    }
  }
};

// -- reductions ------------------------------------------------------------------------------

// Runs of kept and of reduced dimensions an input merges into.
inline constexpr int max_runs = 8;

// An input as [kept runs..., reduced runs...] with its own strides: output
// element o reads in[base(o) + offset(j)] for j over the reduced elements.
struct reduce_desc {
  int kept = 0, reduced = 0;
  std::int64_t kept_dims[max_runs] = {}, kept_strides[max_runs] = {};
  std::int64_t red_dims[max_runs] = {}, red_strides[max_runs] = {};
};

__device__ inline std::int64_t offset_of(std::int64_t i, int rank, const std::int64_t* dims,
                                         const std::int64_t* strides) {
  std::int64_t off = 0;
  for (int k = rank - 1; k >= 0; --k) {
    const std::int64_t q = i / dims[k];
    off += (i - q * dims[k]) * strides[k];
    i = q;
  }
  return off;
}

template <class T, class Op>
__global__ void __launch_bounds__(block_threads)
    reduce_per_thread(const T* in, T* out, reduce_desc d, std::int64_t outputs, std::int64_t count,
                      T init, std::int64_t divisor) {
  const Op op;
  for (std::int64_t o = global_thread(); o < outputs; o += grid_threads()) {
    const T* p = in + offset_of(o, d.kept, d.kept_dims, d.kept_strides);
    T acc = init;
    for (std::int64_t j = 0; j < count; ++j)
      acc = op(acc, p[offset_of(j, d.reduced, d.red_dims, d.red_strides)]);
    out[o] = divisor > 1 ? T(acc / static_cast<T>(divisor)) : acc;
  }
}

// Block b reduces items b, b + gridDim.x, ...; item = o * splits + s covers the
// reduced elements [s * chunk, (s + 1) * chunk) of output o.
template <class T, class Op>
__global__ void __launch_bounds__(block_threads)
    reduce_per_block(const T* in, T* out, reduce_desc d, std::int64_t outputs, std::int64_t count,
                     std::int64_t splits, std::int64_t chunk, T init, std::int64_t divisor) {
  __shared__ alignas(8) unsigned char scratch_bytes[32 * sizeof(T)];
  T* scratch = reinterpret_cast<T*>(scratch_bytes);
  const Op op;
  for (std::int64_t item = blockIdx.x; item < outputs * splits; item += gridDim.x) {
    const std::int64_t o = item / splits, s = item % splits;
    const T* p = in + offset_of(o, d.kept, d.kept_dims, d.kept_strides);
    const std::int64_t end = (s + 1) * chunk < count ? (s + 1) * chunk : count;
    T acc = init;
    for (std::int64_t j = s * chunk + threadIdx.x; j < end; j += blockDim.x)
      acc = op(acc, p[offset_of(j, d.reduced, d.red_dims, d.red_strides)]);
    acc = block_reduce(acc, op, scratch);
    if (threadIdx.x == 0)
      out[item] = divisor > 1 ? T(acc / static_cast<T>(divisor)) : acc;
  }
}

template <class T, class Op>
void launch_reduce(const gpu_context& g, const T* in, T* out, const reduce_desc& d,
                   std::int64_t outputs, std::int64_t count, T init, std::int64_t divisor) {
  if (outputs == 0)
    return;
  if (count <= 32) {
    reduce_per_thread<T, Op><<<grid_for(outputs), block_threads, 0, g.stream>>>(
        in, out, d, outputs, count, init, divisor);
    check_launch();
    return;
  }
  // A block per output; with few outputs, each split into chunks of >= 4096
  // elements so that about 1024 blocks work.
  const std::int64_t splits = std::clamp<std::int64_t>(
      std::min((count + 4095) / 4096, (1024 + outputs - 1) / outputs), 1, 1024);
  const std::int64_t chunk = (count + splits - 1) / splits;
  const auto blocks = static_cast<unsigned>(std::min(outputs * splits, max_blocks));
  if (splits == 1) {
    reduce_per_block<T, Op><<<blocks, block_threads, 0, g.stream>>>(in, out, d, outputs, count, 1,
                                                                    chunk, init, divisor);
    check_launch();
    return;
  }
  any_tensor partial = g.allocate(dtype_of<T>, loom::shape{outputs * splits});
  T* part = partial.template device_data<T>();
  reduce_per_block<T, Op>
      <<<blocks, block_threads, 0, g.stream>>>(in, part, d, outputs, count, splits, chunk, init, 1);
  check_launch();
  reduce_desc d2; // partial as [outputs, splits]
  d2.kept = 1;
  d2.kept_dims[0] = outputs;
  d2.kept_strides[0] = splits;
  d2.reduced = 1;
  d2.red_dims[0] = splits;
  d2.red_strides[0] = 1;
  // `partial` is freed on return while the kernels may still run: the
  // allocator hands it out again only on this stream, after them.
  launch_reduce<T, Op>(g, part, out, d2, outputs, splits, init, divisor);
}

// Reduces x over the masked axes (a sum, a mean, a max, a min or a product) into a tensor of
// `out_shape`, as the CPU kernel does: with nothing to reduce it shares x's
// buffer; an empty input gives the reduction's identity (NaN for a mean).
enum class reducer { sum, mean, max, min, prod };

// std::min's order: the first argument wins ties (as the CPU's min_fold).
struct min_op {
  template <class T> __device__ T operator()(T a, T b) const { return b < a ? b : a; }
};
struct prod_op {
  template <class T> __device__ T operator()(T a, T b) const { return a * b; }
};

template <class T>
any_tensor reduce(const kernel_context& c, const any_tensor& x, const std::vector<char>& mask,
                  const loom::shape& out_shape, reducer r) {
  const gpu_context& g = gpu_of(c);
  const std::int64_t out_count = out_shape.num_elements();
  T init = T(0);
  if (r == reducer::max)
    init = std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                : std::numeric_limits<T>::lowest();
  else if (r == reducer::min)
    init = std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity()
                                                : std::numeric_limits<T>::max();
  else if (r == reducer::prod)
    init = T(1);
  if (x.num_elements() == 0) {
    any_tensor out = g.allocate(x.type(), out_shape);
    T fill_value = init;
    if (r == reducer::mean && std::numeric_limits<T>::has_quiet_NaN)
      fill_value = std::numeric_limits<T>::quiet_NaN();
    fill<T>(g, out.template device_data<T>(), out_count, fill_value);
    return out;
  }
  const reduction_runs runs = merge_runs(x.shape(), mask);
  if (!runs.any_reduced())
    return x.reshaped(out_shape);
  reduce_desc d;
  std::int64_t count = 1, stride = 1;
  std::vector<std::int64_t> strides(runs.dims.size());
  for (std::size_t k = runs.dims.size(); k-- > 0;) {
    strides[k] = stride;
    stride *= runs.dims[k];
  }
  if (runs.dims.size() > static_cast<std::size_t>(2 * max_runs))
    throw unimplemented_error("node " + c.node.describe() + ": a reduction of shape " +
                              x.shape().to_string() + " over more than " +
                              std::to_string(max_runs) + " separate runs of axes");
  for (std::size_t k = 0; k < runs.dims.size(); ++k) {
    if (runs.reduced[k]) {
      d.red_dims[d.reduced] = runs.dims[k];
      d.red_strides[d.reduced++] = strides[k];
      count *= runs.dims[k];
    } else {
      d.kept_dims[d.kept] = runs.dims[k];
      d.kept_strides[d.kept++] = strides[k];
    }
  }
  any_tensor out = g.allocate(x.type(), out_shape);
  const T* in = x.template device_data<T>();
  T* o = out.template device_data<T>();
  const std::int64_t divisor = r == reducer::mean ? count : 1;
  if (r == reducer::max)
    launch_reduce<T, max_op>(g, in, o, d, out_count, count, init, 1);
  else if (r == reducer::min)
    launch_reduce<T, min_op>(g, in, o, d, out_count, count, init, 1);
  else if (r == reducer::prod)
    launch_reduce<T, prod_op>(g, in, o, d, out_count, count, init, 1);
  else
    launch_reduce<T, sum_op>(g, in, o, d, out_count, count, init, divisor);
  return out;
}

template <class T> struct reduction_gpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const node_def& n = c.node;
    const auto [mask, out_shape] = reduction_of(n, x.shape());
    const reducer r = n.op == "reduce_max"    ? reducer::max
                      : n.op == "reduce_min"  ? reducer::min
                      : n.op == "reduce_prod" ? reducer::prod
                      : n.op == "reduce_mean" ? reducer::mean
                                              : reducer::sum;
    c.output = reduce<T>(c, x, mask, out_shape, r);
  }
};

// The walk of reduce_prod_grad and of the bools' reductions in a reduce_desc.
inline reduce_desc desc_of(const kernel_context& c, const loom::kernels::reduction_walk& w) {
  if (w.kept_dims.size() > static_cast<std::size_t>(max_runs) ||
      w.red_dims.size() > static_cast<std::size_t>(max_runs))
    throw unimplemented_error("node " + c.node.describe() + ": a reduction over more than " +
                              std::to_string(max_runs) + " separate runs of axes");
  reduce_desc d;
  d.kept = static_cast<int>(w.kept_dims.size());
  d.reduced = static_cast<int>(w.red_dims.size());
  for (int k = 0; k < d.kept; ++k) {
    d.kept_dims[k] = w.kept_dims[static_cast<std::size_t>(k)];
    d.kept_strides[k] = w.kept_strides[static_cast<std::size_t>(k)];
  }
  for (int k = 0; k < d.reduced; ++k) {
    d.red_dims[k] = w.red_dims[static_cast<std::size_t>(k)];
    d.red_strides[k] = w.red_strides[static_cast<std::size_t>(k)];
  }
  return d;
}

// reduce_any / reduce_all: a block per output (grid-stride), its threads over the output's
// elements, combined by __syncthreads_or / __syncthreads_and.
__global__ void __launch_bounds__(block_threads)
    logical_reduce_kernel(const bool* in, bool* out, reduce_desc d, std::int64_t outputs,
                          std::int64_t count, bool all) {
  for (std::int64_t o = blockIdx.x; o < outputs; o += gridDim.x) {
    const bool* p = in + offset_of(o, d.kept, d.kept_dims, d.kept_strides);
    int acc = all ? 1 : 0;
    for (std::int64_t j = threadIdx.x; j < count; j += blockDim.x) {
      const bool v = p[offset_of(j, d.reduced, d.red_dims, d.red_strides)];
      acc = all ? (acc && v) : (acc || v);
    }
    const int result = all ? __syncthreads_and(acc) : __syncthreads_or(acc);
    if (threadIdx.x == 0)
      out[o] = result != 0;
  }
}

template <class T> struct logical_reduction_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& x = c.input(0);
    const auto [mask, out_shape] = reduction_of(c.node, x.shape());
    const bool all = c.node.op == "reduce_all";
    c.output = g.allocate(x.type(), out_shape);
    const std::int64_t outputs = out_shape.num_elements();
    if (outputs == 0)
      return;
    if (x.num_elements() == 0) {
      fill<bool>(g, c.output.template device_data<bool>(), outputs, all);
      return;
    }
    const reduce_desc d = desc_of(c, loom::kernels::walk_of(x.shape(), mask));
    logical_reduce_kernel<<<static_cast<unsigned>(std::min(outputs, max_blocks)), block_threads, 0,
                            g.stream>>>(x.template device_data<bool>(),
                                        c.output.template device_data<bool>(), d, outputs,
                                        x.num_elements() / outputs, all);
    check_launch();
  }
};

// reduce_prod's gradient, as the CPU computes it: a thread per output walks its elements
// twice, the exclusive product before each element, then times dy and the product after it.
template <class T>
__global__ void __launch_bounds__(block_threads)
    reduce_prod_grad_kernel(T* out, const T* x, const T* dy, reduce_desc d, std::int64_t outputs,
                            std::int64_t count) {
  for (std::int64_t o = global_thread(); o < outputs; o += grid_threads()) {
    const std::int64_t base = offset_of(o, d.kept, d.kept_dims, d.kept_strides);
    T before = T(1);
    for (std::int64_t j = 0; j < count; ++j) {
      const std::int64_t at = base + offset_of(j, d.reduced, d.red_dims, d.red_strides);
      out[at] = before;
      before *= x[at];
    }
    T after = dy[o];
    for (std::int64_t j = count; j-- > 0;) {
      const std::int64_t at = base + offset_of(j, d.reduced, d.red_dims, d.red_strides);
      out[at] *= after;
      after *= x[at];
    }
  }
}

template <class T> struct reduce_prod_grad_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& dy = c.input(0);
    const any_tensor& x = c.input(1);
    const loom::kernels::reduction_walk w =
        loom::kernels::reduce_prod_grad_of(c.node, dy, x.shape());
    c.output = g.allocate(x.type(), x.shape());
    if (w.outputs == 0 || w.count == 0)
      return;
    const reduce_desc d = desc_of(c, w);
    reduce_prod_grad_kernel<T><<<grid_for(w.outputs), block_threads, 0, g.stream>>>(
        c.output.template device_data<T>(), x.template device_data<T>(),
        dy.template device_data<T>(), d, w.outputs, w.count);
    check_launch();
  }
};

// out[i] = a at i (read through strides), divided by `divisor` when it is > 1.
template <class T>
__global__ void __launch_bounds__(block_threads)
    broadcast_kernel(T* out, std::int64_t n, out_dims d, operand a, std::int64_t divisor) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const T v = load<T>(a, d, i);
    out[i] = divisor > 1 ? T(v / static_cast<T>(divisor)) : v;
  }
}

// dy broadcast back over the reduced axes (divided by their count for a mean).
template <class T> struct reduce_grad_gpu {
  static void run(kernel_context& c) {
    const any_tensor& dy = c.input(0);
    const loom::shape& to = c.input(1).shape();
    const node_def& n = c.node;
    const auto [mask, count] = reduce_grad_of(n, dy, to);
    const std::int64_t divisor = n.attr<std::string>("mode") == "mean" ? count : 1;
    const reduction_runs runs = merge_runs(to, mask);
    const gpu_context& g = gpu_of(c);
    if (to.num_elements() == 0) {
      c.output = g.allocate(dy.type(), to);
      return;
    }
    if (!runs.any_reduced()) { // count is 1: dy itself, as on the CPU
      c.output = dy.reshaped(to);
      return;
    }
    if (runs.dims.size() > static_cast<std::size_t>(max_broadcast_rank))
      throw unimplemented_error("broadcasting beyond rank 6 (shape " +
                                loom::shape(runs.dims).to_string() + ")");
    out_dims d;
    operand a;
    a.p = dy.device_data();
    a.mode = operand::strided;
    d.rank = static_cast<int>(runs.dims.size());
    std::int64_t s = 1;
    for (int k = d.rank - 1; k >= 0; --k) {
      d.dims[k] = runs.dims[static_cast<std::size_t>(k)];
      a.stride[k] = runs.reduced[static_cast<std::size_t>(k)] ? 0 : s;
      if (!runs.reduced[static_cast<std::size_t>(k)])
        s *= d.dims[k];
    }
    c.output = g.allocate(dy.type(), to);
    const std::int64_t total = to.num_elements();
    broadcast_kernel<T><<<grid_for(total), block_threads, 0, g.stream>>>(
        c.output.template device_data<T>(), total, d, a, divisor);
    check_launch();
  }
};

// argmax / argmin along one axis; ties give the first index (one thread per output).
template <class T>
__global__ void __launch_bounds__(block_threads)
    arg_reduce_kernel(const T* in, std::int64_t* out, std::int64_t outer_inner, std::int64_t r,
                      std::int64_t inner, bool is_min) {
  for (std::int64_t k = global_thread(); k < outer_inner; k += grid_threads()) {
    const T* p = in + (k / inner) * r * inner + k % inner;
    std::int64_t best = 0;
    T value = p[0];
    for (std::int64_t j = 1; j < r; ++j) {
      const T v = p[j * inner];
      if (is_min ? v < value : v > value) {
        value = v;
        best = j;
      }
    }
    out[k] = best;
  }
}

template <class T> struct arg_reduction_gpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const node_def& n = c.node;
    const arg_reduction_layout l = arg_reduction_of(n, x.shape());
    const gpu_context& g = gpu_of(c);
    c.output = g.allocate(dtype::i64, l.out);
    const std::int64_t o = l.outer, i = l.inner, r = l.size;
    if (o * i == 0)
      return;
    arg_reduce_kernel<T><<<grid_for(o * i), block_threads, 0, g.stream>>>(
        x.template device_data<T>(), c.output.template device_data<std::int64_t>(), o * i, r, i,
        n.op == "argmin");
    check_launch();
  }
};

inline bool register_math_gpu() {
  register_kernels<matmul_gpu>("matmul", floating_types{}, device_gpu);
  register_kernels<xw_plus_b_gpu>("xw_plus_b", floating_types{}, device_gpu);
  register_kernels<add_n_gpu>("add_n", numeric_types{}, device_gpu);
  for (const char* op : {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"})
    register_kernels<reduction_gpu>(op, numeric_types{}, device_gpu);
  for (const char* op : {"reduce_any", "reduce_all"})
    register_kernels<logical_reduction_gpu>(op, type_list<bool>{}, device_gpu);
  register_kernels<reduce_grad_gpu>("reduce_grad", floating_types{}, device_gpu);
  register_kernels<reduce_prod_grad_gpu>("reduce_prod_grad", floating_types{}, device_gpu);
  register_kernels<arg_reduction_gpu>("argmax", numeric_types{}, device_gpu);
  register_kernels<arg_reduction_gpu>("argmin", numeric_types{}, device_gpu);
  return true;
}

inline const bool math_gpu_registered = register_math_gpu();

} // namespace loom::kernels::cuda_kernels

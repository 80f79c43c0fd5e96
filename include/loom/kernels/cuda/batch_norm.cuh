// GPU kernels of fused batch normalization (kernels/cpu/batch_norm.hpp on the CPU). The
// per-channel sums: blocks of 32 channels x 8 row lanes (a warp reads 32 adjacent channels of
// a row, coalesced), each grid row of blocks summing a share of the rows in double into its
// own partial sums, then a thread per channel adding the partials in order: no atomics, the
// same result every run. The elementwise passes fold the per-channel constants first
// (y = x k + b), as the CPU's.
#pragma once

#include <loom/kernels/checks/batch_norm.hpp>
#include <loom/kernels/cuda/common.cuh>
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <cstdint>

namespace loom::kernels::cuda_kernels {

inline constexpr int bn_channels_per_block = 32, bn_row_lanes = 8;

// partial[(chunk * K + k) * C + c] = sum over the chunk's rows of term(row, c)[k].
template <int K, class Term>
__global__ void __launch_bounds__(bn_channels_per_block* bn_row_lanes)
    channel_partial_sums_kernel(Term term, double* partial, std::int64_t rows,
                                std::int64_t channels) {
  __shared__ double lanes[K][bn_row_lanes][bn_channels_per_block];
  const std::int64_t c =
      static_cast<std::int64_t>(blockIdx.x) * bn_channels_per_block + threadIdx.x;
  double acc[K] = {};
  if (c < channels)
    for (std::int64_t r = static_cast<std::int64_t>(blockIdx.y) * bn_row_lanes + threadIdx.y;
         r < rows; r += static_cast<std::int64_t>(gridDim.y) * bn_row_lanes) {
      double v[K];
      term(r * channels + c, c, v);
      for (int k = 0; k < K; ++k)
        acc[k] += v[k];
    }
  for (int k = 0; k < K; ++k)
    lanes[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < channels)
    for (int k = 0; k < K; ++k) {
      double s = 0;
      for (int lane = 0; lane < bn_row_lanes; ++lane)
        s += lanes[k][lane][threadIdx.x];
      partial[(static_cast<std::int64_t>(blockIdx.y) * K + k) * channels + c] = s;
    }
}

// total[k * C + c] = the chunks' partials added in order.
template <int K>
__global__ void add_partials_kernel(const double* partial, double* total, std::int64_t chunks,
                                    std::int64_t channels) {
  for (std::int64_t i = global_thread(); i < K * channels; i += grid_threads()) {
    const std::int64_t k = i / channels, c = i % channels;
    double s = 0;
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk)
      s += partial[(chunk * K + k) * channels + c];
    total[i] = s;
  }
}

// [K, C] doubles of per-channel sums of term over x's rows, on the kernel's stream.
template <int K, class Term>
any_tensor channel_sums(const gpu_context& g, const channel_layout& l, Term term) {
  any_tensor total = g.allocate(dtype::f64, loom::shape{K, l.channels});
  if (l.channels == 0)
    return total;
  const auto tiles =
      static_cast<unsigned>((l.channels + bn_channels_per_block - 1) / bn_channels_per_block);
  // Enough chunks of rows to fill the GPU, each at least 64 rows.
  const std::int64_t chunks = std::clamp<std::int64_t>(
      std::min<std::int64_t>((l.rows + 63) / 64, 2048 / static_cast<std::int64_t>(tiles)), 1,
      65535);
  any_tensor partial = g.allocate(dtype::f64, loom::shape{chunks * K * l.channels});
  channel_partial_sums_kernel<K>
      <<<dim3(tiles, static_cast<unsigned>(chunks)), dim3(bn_channels_per_block, bn_row_lanes), 0,
         g.stream>>>(term, partial.device_data<double>(), l.rows, l.channels);
  check_launch();
  add_partials_kernel<K><<<grid_for(K * l.channels), block_threads, 0, g.stream>>>(
      partial.device_data<double>(), total.device_data<double>(), chunks, l.channels);
  check_launch();
  return total;
}

template <class T> struct value_term {
  const T* x;
  __device__ void operator()(std::int64_t e, std::int64_t, double* v) const {
    v[0] = static_cast<double>(x[e]);
  }
};

template <class T> struct squared_deviation_term {
  const T* x;
  const double* sums; // the first pass's: mean = sum / n
  double n;
  __device__ void operator()(std::int64_t e, std::int64_t c, double* v) const {
    const double d = static_cast<double>(x[e]) - sums[c] / n;
    v[0] = d * d;
  }
};

template <class T> struct grad_sums_term {
  const T *dy, *x, *mean, *variance;
  double epsilon;
  __device__ void operator()(std::int64_t e, std::int64_t c, double* v) const {
    const double g = static_cast<double>(dy[e]);
    v[0] = g * (static_cast<double>(x[e]) - static_cast<double>(mean[c])) *
           ::rsqrt(static_cast<double>(variance[c]) + epsilon);
    v[1] = g;
  }
};

template <class T>
__global__ void moments_out_kernel(T* out, const double* sums, const double* squares, double n,
                                   double bessel, std::int64_t channels) {
  for (std::int64_t c = global_thread(); c < channels; c += grid_threads()) {
    const double var = squares[c] / n;
    out[c] = static_cast<T>(sums[c] / n);
    out[channels + c] = static_cast<T>(var);
    out[2 * channels + c] = static_cast<T>(var * bessel);
  }
}

template <class T> __global__ void to_dtype_kernel(T* out, const double* in, std::int64_t count) {
  for (std::int64_t i = global_thread(); i < count; i += grid_threads())
    out[i] = static_cast<T>(in[i]);
}

// kb[c] = k, kb[C + c] = b of fused_batch_norm: k = scale rsqrt(variance + epsilon),
// b = offset - mean k.
template <class T>
__global__ void fold_normalize_kernel(T* kb, const T* scale, const T* offset, const T* mean,
                                      const T* variance, double epsilon, std::int64_t channels) {
  for (std::int64_t c = global_thread(); c < channels; c += grid_threads()) {
    const T k = static_cast<T>(static_cast<double>(scale[c]) *
                               ::rsqrt(static_cast<double>(variance[c]) + epsilon));
    kb[c] = k;
    kb[channels + c] = offset[c] - mean[c] * k;
  }
}

// kb of batch_norm_moments_grad: k = 2 (dm1 + dm2 bessel) / n, b = dm0 / n - mean k.
template <class T>
__global__ void fold_moments_grad_kernel(T* kb, const T* dm, const T* mean, double n, double bessel,
                                         std::int64_t channels) {
  for (std::int64_t c = global_thread(); c < channels; c += grid_threads()) {
    const double slope = 2 *
                         (static_cast<double>(dm[channels + c]) +
                          static_cast<double>(dm[2 * channels + c]) * bessel) /
                         n;
    kb[c] = static_cast<T>(slope);
    kb[channels + c] =
        static_cast<T>(static_cast<double>(dm[c]) / n - slope * static_cast<double>(mean[c]));
  }
}

template <class T>
__global__ void scale_shift_kernel(T* out, const T* x, const T* kb, std::int64_t channels,
                                   std::int64_t total) {
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t c = e % channels;
    out[e] = x[e] * kb[c] + kb[channels + c];
  }
}

// out = x k + b with kb [2, C] on the GPU.
template <class T>
void scale_shift(const gpu_context& g, any_tensor& out, const any_tensor& x, const any_tensor& kb,
                 std::int64_t channels) {
  const std::int64_t total = x.num_elements();
  if (total == 0 || channels == 0)
    return;
  scale_shift_kernel<<<grid_for(total), block_threads, 0, g.stream>>>(
      out.template device_data<T>(), x.template device_data<T>(), kb.template device_data<T>(),
      channels, total);
  check_launch();
}

template <class T> struct batch_norm_moments_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& x = c.input(0);
    const channel_layout l = channels_of(c.node, x);
    c.output = g.allocate(dtype_of<T>, loom::shape{3, l.channels});
    if (l.channels == 0)
      return;
    const double n = static_cast<double>(std::max<std::int64_t>(l.rows, 1));
    const T* px = x.template device_data<T>();
    any_tensor sums = channel_sums<1>(g, l, value_term<T>{px});
    any_tensor squares =
        channel_sums<1>(g, l, squared_deviation_term<T>{px, sums.device_data<double>(), n});
    moments_out_kernel<<<grid_for(l.channels), block_threads, 0, g.stream>>>(
        c.output.template device_data<T>(), sums.device_data<double>(),
        squares.device_data<double>(), n, bessel_factor(l.rows), l.channels);
    check_launch();
  }
};

template <class T> struct fused_batch_norm_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& x = c.input(0);
    const channel_layout l = checked_normalize_inputs(c);
    c.output = g.allocate(dtype_of<T>, x.shape());
    if (l.channels == 0)
      return;
    any_tensor kb = g.allocate(dtype_of<T>, loom::shape{2, l.channels});
    fold_normalize_kernel<<<grid_for(l.channels), block_threads, 0, g.stream>>>(
        kb.template device_data<T>(), c.input(1).template device_data<T>(),
        c.input(2).template device_data<T>(), c.input(3).template device_data<T>(),
        c.input(4).template device_data<T>(), c.node.attr<double>("epsilon"), l.channels);
    check_launch();
    scale_shift<T>(g, c.output, x, kb, l.channels);
  }
};

template <class T> struct fused_batch_norm_grad_sums_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& dy = c.input(0);
    const any_tensor& x = c.input(1);
    const channel_layout l = checked_grad_sums_inputs(c);
    c.output = g.allocate(dtype_of<T>, loom::shape{2, l.channels});
    if (l.channels == 0)
      return;
    any_tensor sums = channel_sums<2>(
        g, l,
        grad_sums_term<T>{dy.template device_data<T>(), x.template device_data<T>(),
                          c.input(2).template device_data<T>(),
                          c.input(3).template device_data<T>(), c.node.attr<double>("epsilon")});
    to_dtype_kernel<<<grid_for(2 * l.channels), block_threads, 0, g.stream>>>(
        c.output.template device_data<T>(), sums.device_data<double>(), 2 * l.channels);
    check_launch();
  }
};

template <class T> struct batch_norm_moments_grad_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& dm = c.input(0);
    const any_tensor& x = c.input(1);
    const any_tensor& m = c.input(2);
    const channel_layout l = checked_moments_grad_inputs(c);
    c.output = g.allocate(dtype_of<T>, x.shape());
    if (l.channels == 0)
      return;
    any_tensor kb = g.allocate(dtype_of<T>, loom::shape{2, l.channels});
    fold_moments_grad_kernel<<<grid_for(l.channels), block_threads, 0, g.stream>>>(
        kb.template device_data<T>(), dm.template device_data<T>(), m.template device_data<T>(),
        static_cast<double>(std::max<std::int64_t>(l.rows, 1)), bessel_factor(l.rows), l.channels);
    check_launch();
    scale_shift<T>(g, c.output, x, kb, l.channels);
  }
};

inline bool register_batch_norm_gpu() {
  register_kernels<batch_norm_moments_gpu>("batch_norm_moments", floating_types{}, device_gpu);
  register_kernels<batch_norm_moments_grad_gpu>("batch_norm_moments_grad", floating_types{},
                                                device_gpu);
  register_kernels<fused_batch_norm_gpu>("fused_batch_norm", floating_types{}, device_gpu);
  register_kernels<fused_batch_norm_grad_sums_gpu>("fused_batch_norm_grad_sums", floating_types{},
                                                   device_gpu);
  return true;
}

inline const bool batch_norm_gpu_registered = register_batch_norm_gpu();

} // namespace loom::kernels::cuda_kernels

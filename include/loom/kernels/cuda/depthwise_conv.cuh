// GPU kernels of the depthwise convolution (kernels/cpu/depthwise_conv.hpp on the CPU), direct
// and without atomics: the forward pass a thread per output element over its window; the
// input's gradient a thread per input element, gathering the dy of every output whose window
// reads it; the filter's gradient a block per filter element, its threads over the images and
// output positions, summed by block_reduce.
#pragma once

#include <loom/kernels/checks/depthwise_conv.hpp>
#include <loom/kernels/cuda/common.cuh>
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <cstdint>

namespace loom::kernels::cuda_kernels {

template <class T>
__global__ void depthwise_forward_kernel(T* out, const T* x, const T* f, detail::conv_window w,
                                         std::int64_t m, std::int64_t total) {
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t o = e % w.out_c, k = o / m;
    std::int64_t rest = e / w.out_c;
    const std::int64_t ox = rest % w.out_w;
    rest /= w.out_w;
    const std::int64_t oy = rest % w.out_h, b = rest / w.out_h;
    T sum = T(0);
    for (std::int64_t i = 0; i < w.window_h; ++i) {
      const std::int64_t iy = oy * w.stride_h - w.pad_top + i * w.dilation_h;
      if (iy < 0 || iy >= w.in_h)
        continue;
      for (std::int64_t j = 0; j < w.window_w; ++j) {
        const std::int64_t ix = ox * w.stride_w - w.pad_left + j * w.dilation_w;
        if (ix < 0 || ix >= w.in_w)
          continue;
        sum += x[((b * w.in_h + iy) * w.in_w + ix) * w.in_c + k] *
               f[(i * w.window_w + j) * w.out_c + o];
      }
    }
    out[e] = sum;
  }
}

// The output index along one dimension whose tap t reads input index `in`, or -1.
__device__ inline std::int64_t dw_output_of(std::int64_t in, std::int64_t t, std::int64_t stride,
                                            std::int64_t pad, std::int64_t dilation,
                                            std::int64_t out) {
  const std::int64_t at = in + pad - t * dilation;
  if (at < 0 || at % stride != 0 || at / stride >= out)
    return -1;
  return at / stride;
}

template <class T>
__global__ void depthwise_input_grad_kernel(T* dx, const T* f, const T* dy, detail::conv_window w,
                                            std::int64_t m, std::int64_t total) {
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t k = e % w.in_c;
    std::int64_t rest = e / w.in_c;
    const std::int64_t ix = rest % w.in_w;
    rest /= w.in_w;
    const std::int64_t iy = rest % w.in_h, b = rest / w.in_h;
    T sum = T(0);
    for (std::int64_t i = 0; i < w.window_h; ++i) {
      const std::int64_t oy = dw_output_of(iy, i, w.stride_h, w.pad_top, w.dilation_h, w.out_h);
      if (oy < 0)
        continue;
      for (std::int64_t j = 0; j < w.window_w; ++j) {
        const std::int64_t ox = dw_output_of(ix, j, w.stride_w, w.pad_left, w.dilation_w, w.out_w);
        if (ox < 0)
          continue;
        const T* g = dy + ((b * w.out_h + oy) * w.out_w + ox) * w.out_c + k * m;
        const T* fk = f + (i * w.window_w + j) * w.out_c + k * m;
        for (std::int64_t q = 0; q < m; ++q)
          sum += g[q] * fk[q];
      }
    }
    dx[e] = sum;
  }
}

template <class T>
__global__ void __launch_bounds__(block_threads)
    depthwise_filter_grad_kernel(T* df, const T* x, const T* dy, detail::conv_window w,
                                 std::int64_t m, std::int64_t filter_elements) {
  __shared__ alignas(8) unsigned char scratch_bytes[32 * sizeof(T)];
  T* scratch = reinterpret_cast<T*>(scratch_bytes);
  const std::int64_t positions = w.batch * w.out_h * w.out_w;
  for (std::int64_t e = blockIdx.x; e < filter_elements; e += gridDim.x) {
    const std::int64_t o = e % w.out_c, tap = e / w.out_c, k = o / m;
    const std::int64_t i = tap / w.window_w, j = tap % w.window_w;
    T sum = T(0);
    for (std::int64_t p = threadIdx.x; p < positions; p += blockDim.x) {
      const std::int64_t ox = p % w.out_w, oy = (p / w.out_w) % w.out_h,
                         b = p / (w.out_w * w.out_h);
      const std::int64_t iy = oy * w.stride_h - w.pad_top + i * w.dilation_h;
      const std::int64_t ix = ox * w.stride_w - w.pad_left + j * w.dilation_w;
      if (iy < 0 || iy >= w.in_h || ix < 0 || ix >= w.in_w)
        continue;
      sum += x[((b * w.in_h + iy) * w.in_w + ix) * w.in_c + k] * dy[p * w.out_c + o];
    }
    sum = block_reduce(sum, sum_op{}, scratch);
    if (threadIdx.x == 0)
      df[e] = sum;
  }
}

template <class T> struct depthwise_conv2d_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const detail::conv_window w = loom::kernels::depthwise_forward_window(c);
    c.output = g.allocate(dtype_of<T>, w.output_shape());
    const std::int64_t total = c.output.num_elements();
    if (total == 0)
      return;
    depthwise_forward_kernel<T><<<grid_for(total), block_threads, 0, g.stream>>>(
        c.output.template device_data<T>(), c.input(0).template device_data<T>(),
        c.input(1).template device_data<T>(), w, loom::detail::multiplier_of(w), total);
    check_launch();
  }
};

template <class T> struct depthwise_backprop_input_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const detail::conv_window w = loom::kernels::depthwise_input_grad_window(c);
    c.output = g.allocate(dtype_of<T>, loom::shape{w.batch, w.in_h, w.in_w, w.in_c});
    const std::int64_t total = c.output.num_elements();
    if (total == 0)
      return;
    depthwise_input_grad_kernel<T><<<grid_for(total), block_threads, 0, g.stream>>>(
        c.output.template device_data<T>(), c.input(0).template device_data<T>(),
        c.input(1).template device_data<T>(), w, loom::detail::multiplier_of(w), total);
    check_launch();
  }
};

template <class T> struct depthwise_backprop_filter_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    loom::shape fs;
    const detail::conv_window w = loom::kernels::depthwise_filter_grad_window(c, fs);
    c.output = g.allocate(dtype_of<T>, fs);
    const std::int64_t total = c.output.num_elements();
    if (total == 0)
      return;
    depthwise_filter_grad_kernel<T>
        <<<static_cast<unsigned>(std::min(total, max_blocks)), block_threads, 0, g.stream>>>(
            c.output.template device_data<T>(), c.input(0).template device_data<T>(),
            c.input(1).template device_data<T>(), w, loom::detail::multiplier_of(w), total);
    check_launch();
  }
};

inline bool register_depthwise_conv_gpu() {
  register_kernels<depthwise_conv2d_gpu>("depthwise_conv2d", floating_types{}, device_gpu);
  register_kernels<depthwise_backprop_input_gpu>("depthwise_conv2d_native_backprop_input",
                                                 floating_types{}, device_gpu);
  register_kernels<depthwise_backprop_filter_gpu>("depthwise_conv2d_native_backprop_filter",
                                                  floating_types{}, device_gpu);
  return true;
}

inline const bool depthwise_conv_gpu_registered = register_depthwise_conv_gpu();

} // namespace loom::kernels::cuda_kernels

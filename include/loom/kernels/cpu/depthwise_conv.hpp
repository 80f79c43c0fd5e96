// CPU kernels of the depthwise convolution (graph/ops/depthwise_conv.hpp), direct loops over
// the window with the channels innermost (a depthwise filter has no GEMM to hand to): the
// forward pass an output row per task; the input's gradient an image per task, each output's
// dy added back into the window it read, in order; the filter's gradient a filter tap
// (kh x kw of them) per task, summed over every image and output position.
#pragma once

#include <loom/kernels/checks/depthwise_conv.hpp>
#include <loom/kernels/cpu/parallel_for.hpp>
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <cstdint>

namespace loom::kernels {

// The input row and column tap (i, j) of output (oy, ox) reads; outside the input: < 0 or >=.
inline std::int64_t dw_tap_row(const detail::conv_window& w, std::int64_t oy, std::int64_t i) {
  return oy * w.stride_h - w.pad_top + i * w.dilation_h;
}
inline std::int64_t dw_tap_col(const detail::conv_window& w, std::int64_t ox, std::int64_t j) {
  return ox * w.stride_w - w.pad_left + j * w.dilation_w;
}

template <class T> struct depthwise_conv2d_cpu {
  static void run(kernel_context& c) {
    const detail::conv_window w = depthwise_forward_window(c);
    c.output = any_tensor(dtype_of<T>, w.output_shape());
    const std::int64_t m = multiplier_of(w), ch = w.in_c, oc = w.out_c;
    const T* x = c.input(0).data<T>();
    const T* f = c.input(1).data<T>();
    T* out = c.output.data<T>();
    const std::int64_t taps = w.window_h * w.window_w;
    parallel_for(c.device, w.batch * w.out_h,
                 Eigen::TensorOpCost(static_cast<double>(w.out_w * taps * ch * sizeof(T)),
                                     static_cast<double>(w.out_w * oc * sizeof(T)),
                                     static_cast<double>(w.out_w * taps * oc * 2)),
                 [&](Eigen::Index first, Eigen::Index last) {
                   for (Eigen::Index r = first; r < last; ++r) {
                     const std::int64_t b = r / w.out_h, oy = r % w.out_h;
                     for (std::int64_t ox = 0; ox < w.out_w; ++ox) {
                       T* y = out + (r * w.out_w + ox) * oc;
                       std::fill_n(y, oc, T(0));
                       for (std::int64_t i = 0; i < w.window_h; ++i) {
                         const std::int64_t iy = dw_tap_row(w, oy, i);
                         if (iy < 0 || iy >= w.in_h)
                           continue;
                         for (std::int64_t j = 0; j < w.window_w; ++j) {
                           const std::int64_t ix = dw_tap_col(w, ox, j);
                           if (ix < 0 || ix >= w.in_w)
                             continue;
                           const T* in = x + ((b * w.in_h + iy) * w.in_w + ix) * ch;
                           const T* fk = f + (i * w.window_w + j) * oc;
                           for (std::int64_t k = 0; k < ch; ++k)
                             for (std::int64_t q = 0; q < m; ++q)
                               y[k * m + q] += in[k] * fk[k * m + q];
                         }
                       }
                     }
                   }
                 });
  }
};

template <class T> struct depthwise_backprop_input_cpu {
  static void run(kernel_context& c) {
    const detail::conv_window w = depthwise_input_grad_window(c);
    const loom::shape xs{w.batch, w.in_h, w.in_w, w.in_c};
    c.output = any_tensor(dtype_of<T>, xs);
    const std::int64_t m = multiplier_of(w), ch = w.in_c, oc = w.out_c;
    const T* f = c.input(0).data<T>();
    const T* dy = c.input(1).data<T>();
    T* dx = c.output.data<T>();
    const std::int64_t image = w.in_h * w.in_w * ch;
    parallel_for(c.device, w.batch,
                 Eigen::TensorOpCost(
                     static_cast<double>(w.out_h * w.out_w * oc * sizeof(T)),
                     static_cast<double>(image * sizeof(T)),
                     static_cast<double>(w.out_h * w.out_w * w.window_h * w.window_w * oc * 2)),
                 [&](Eigen::Index first, Eigen::Index last) {
                   for (Eigen::Index b = first; b < last; ++b) {
                     std::fill_n(dx + b * image, image, T(0));
                     for (std::int64_t oy = 0; oy < w.out_h; ++oy)
                       for (std::int64_t ox = 0; ox < w.out_w; ++ox) {
                         const T* g = dy + ((b * w.out_h + oy) * w.out_w + ox) * oc;
                         for (std::int64_t i = 0; i < w.window_h; ++i) {
                           const std::int64_t iy = dw_tap_row(w, oy, i);
                           if (iy < 0 || iy >= w.in_h)
                             continue;
                           for (std::int64_t j = 0; j < w.window_w; ++j) {
                             const std::int64_t ix = dw_tap_col(w, ox, j);
                             if (ix < 0 || ix >= w.in_w)
                               continue;
                             T* to = dx + ((b * w.in_h + iy) * w.in_w + ix) * ch;
                             const T* fk = f + (i * w.window_w + j) * oc;
                             for (std::int64_t k = 0; k < ch; ++k) {
                               T sum = T(0);
                               for (std::int64_t q = 0; q < m; ++q)
                                 sum += g[k * m + q] * fk[k * m + q];
                               to[k] += sum;
                             }
                           }
                         }
                       }
                   }
                 });
  }
};

template <class T> struct depthwise_backprop_filter_cpu {
  static void run(kernel_context& c) {
    loom::shape fs;
    const detail::conv_window w = depthwise_filter_grad_window(c, fs);
    c.output = any_tensor(dtype_of<T>, fs);
    const std::int64_t m = multiplier_of(w), ch = w.in_c, oc = w.out_c;
    const T* x = c.input(0).data<T>();
    const T* dy = c.input(1).data<T>();
    T* df = c.output.data<T>();
    const std::int64_t positions = w.batch * w.out_h * w.out_w;
    parallel_for(c.device, w.window_h * w.window_w,
                 Eigen::TensorOpCost(static_cast<double>(positions * (ch + oc) * sizeof(T)),
                                     static_cast<double>(oc * sizeof(T)),
                                     static_cast<double>(positions * oc * 2)),
                 [&](Eigen::Index first, Eigen::Index last) {
                   for (Eigen::Index tap = first; tap < last; ++tap) {
                     const std::int64_t i = tap / w.window_w, j = tap % w.window_w;
                     T* acc = df + tap * oc;
                     std::fill_n(acc, oc, T(0));
                     for (std::int64_t p = 0; p < positions; ++p) {
                       const std::int64_t ox = p % w.out_w, oy = (p / w.out_w) % w.out_h,
                                          b = p / (w.out_w * w.out_h);
                       const std::int64_t iy = dw_tap_row(w, oy, i), ix = dw_tap_col(w, ox, j);
                       if (iy < 0 || iy >= w.in_h || ix < 0 || ix >= w.in_w)
                         continue;
                       const T* in = x + ((b * w.in_h + iy) * w.in_w + ix) * ch;
                       const T* g = dy + p * oc;
                       for (std::int64_t k = 0; k < ch; ++k)
                         for (std::int64_t q = 0; q < m; ++q)
                           acc[k * m + q] += in[k] * g[k * m + q];
                     }
                   }
                 });
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_depthwise_conv_kernels() {
  register_kernels<depthwise_conv2d_cpu>("depthwise_conv2d", floating_types{});
  register_kernels<depthwise_backprop_input_cpu>("depthwise_conv2d_native_backprop_input",
                                                 floating_types{});
  register_kernels<depthwise_backprop_filter_cpu>("depthwise_conv2d_native_backprop_filter",
                                                  floating_types{});
  return true;
}

inline const bool depthwise_conv_kernels_registered = register_depthwise_conv_kernels();
#endif

} // namespace loom::kernels

// GPU kernels of the convolutions and poolings (kernels/cpu/conv.hpp on the CPU): the
// same im2col and GEMM (cuBLAS), chunk for chunk, so the CPU and the GPU sum a
// convolution's products over the same patches; every gradient is gathered (a thread per
// element of dx sums the windows that cover it), so none needs atomics and each is
// deterministic. A window's maximum is its first largest element, as on the CPU.
#pragma once

#include <loom/graph/ops/conv.hpp>
#include <loom/kernels/checks/conv.hpp>
#include <loom/kernels/cuda/common.cuh>
#include <loom/kernels/cuda/math.cuh>
#include <loom/kernels/registry.hpp>

#include <cstdint>

namespace loom::kernels::cuda_kernels {

// The input row and column of window element (ky, kx) of output (oy, ox).
__device__ inline std::int64_t window_row(const detail::conv_window& w, std::int64_t oy,
                                          std::int64_t ky) {
  return oy * w.stride_h - w.pad_top + ky * w.dilation_h;
}
__device__ inline std::int64_t window_col(const detail::conv_window& w, std::int64_t ox,
                                          std::int64_t kx) {
  return ox * w.stride_w - w.pad_left + kx * w.dilation_w;
}

// patches [(image, oy, ox), (ky, kx, c)] of images [first, first + count).
template <class T>
__global__ void im2col_kernel(T* p, const T* x, detail::conv_window w, std::int64_t first,
                              std::int64_t total) {
  const std::int64_t cols = w.window_h * w.window_w * w.in_c, per_image = w.out_h * w.out_w;
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t r = e / cols, col = e % cols;
    const std::int64_t n = first + r / per_image, o = r % per_image;
    const std::int64_t ch = col % w.in_c, kk = col / w.in_c;
    const std::int64_t y = window_row(w, o / w.out_w, kk / w.window_w);
    const std::int64_t x0 = window_col(w, o % w.out_w, kk % w.window_w);
    p[e] = y >= 0 && y < w.in_h && x0 >= 0 && x0 < w.in_w
               ? x[((n * w.in_h + y) * w.in_w + x0) * w.in_c + ch]
               : T(0);
  }
}

// Calls f(oy, ox, ky, kx) for every window that holds input element (y, x).
template <class F>
__device__ void for_each_window_of(const detail::conv_window& w, std::int64_t y, std::int64_t x,
                                   F f) {
  for (std::int64_t ky = 0; ky < w.window_h; ++ky) {
    const std::int64_t ty = y + w.pad_top - ky * w.dilation_h;
    if (ty < 0 || ty % w.stride_h != 0 || ty / w.stride_h >= w.out_h)
      continue;
    for (std::int64_t kx = 0; kx < w.window_w; ++kx) {
      const std::int64_t tx = x + w.pad_left - kx * w.dilation_w;
      if (tx < 0 || tx % w.stride_w != 0 || tx / w.stride_w >= w.out_w)
        continue;
      f(ty / w.stride_h, tx / w.stride_w, ky, kx);
    }
  }
}

// dx of images [first, first + count) from their patches' gradient.
template <class T>
__global__ void col2im_kernel(T* dx, const T* p, detail::conv_window w, std::int64_t first,
                              std::int64_t total) {
  const std::int64_t cols = w.window_h * w.window_w * w.in_c, per_image = w.out_h * w.out_w;
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t ch = e % w.in_c, pix = e / w.in_c;
    const std::int64_t x = pix % w.in_w, y = (pix / w.in_w) % w.in_h, n = pix / (w.in_w * w.in_h);
    T sum = T(0);
    for_each_window_of(
        w, y, x, [&](std::int64_t oy, std::int64_t ox, std::int64_t ky, std::int64_t kx) {
          sum +=
              p[(n * per_image + oy * w.out_w + ox) * cols + (ky * w.window_w + kx) * w.in_c + ch];
        });
    dx[(first * w.in_h * w.in_w) * w.in_c + e] = sum;
  }
}

template <class T>
void im2col(const kernel_context& c, const detail::conv_window& w, const T* x, std::int64_t first,
            std::int64_t count, T* p) {
  const std::int64_t total = count * w.out_h * w.out_w * w.patch_size();
  if (total == 0)
    return;
  im2col_kernel<<<grid_for(total), block_threads, 0, gpu_of(c).stream>>>(p, x, w, first, total);
  check_launch();
}

template <class T> struct conv2d_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& x = c.input(0);
    const any_tensor& f = c.input(1);
    const detail::conv_window w =
        detail::window_of(c.node, c.decoded<detail::window_attrs>(), x.shape(), &f.shape());
    c.output = g.allocate(x.type(), w.output_shape());
    T* y = c.output.template device_data<T>();
    const T* xs = x.template device_data<T>();
    const std::int64_t rows = w.out_h * w.out_w, cols = w.patch_size();
    if (loom::kernels::pointwise(w)) {
      gemm_rows(c, xs, false, f.template device_data<T>(), false, y, w.batch * rows, w.out_c, cols,
                false);
      return;
    }
    const std::int64_t images = loom::kernels::chunk_images(w);
    any_tensor patches = g.allocate(x.type(), loom::shape{std::min(images, w.batch) * rows, cols});
    for (std::int64_t first = 0; first < w.batch; first += images) {
      const std::int64_t count = std::min(w.batch - first, images);
      im2col(c, w, xs, first, count, patches.template device_data<T>());
      gemm_rows(c, patches.template device_data<T>(), false, f.template device_data<T>(), false,
                y + first * rows * w.out_c, count * rows, w.out_c, cols, false);
    }
  }
};

template <class T> struct conv2d_backprop_input_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& f = c.input(0);
    const any_tensor& dy = c.input(1);
    const loom::shape xs = loom::kernels::backprop_shape(c.inputs, c.node, 2, "input_shape");
    const detail::conv_window w =
        detail::window_of(c.node, c.decoded<detail::window_attrs>(), xs, &f.shape());
    loom::kernels::check_window_dy(c.node, dy, w);
    c.output = g.allocate(dy.type(), xs);
    T* dx = c.output.template device_data<T>();
    const std::int64_t rows = w.out_h * w.out_w, cols = w.patch_size();
    if (loom::kernels::pointwise(w)) {
      gemm_rows(c, dy.template device_data<T>(), false, f.template device_data<T>(), true, dx,
                w.batch * rows, cols, w.out_c, false);
      return;
    }
    const std::int64_t images = loom::kernels::chunk_images(w);
    any_tensor patches = g.allocate(dy.type(), loom::shape{std::min(images, w.batch) * rows, cols});
    for (std::int64_t first = 0; first < w.batch; first += images) {
      const std::int64_t count = std::min(w.batch - first, images);
      gemm_rows(c, dy.template device_data<T>() + first * rows * w.out_c, false,
                f.template device_data<T>(), true, patches.template device_data<T>(), count * rows,
                cols, w.out_c, false);
      const std::int64_t total = count * w.in_h * w.in_w * w.in_c;
      if (total > 0) {
        col2im_kernel<<<grid_for(total), block_threads, 0, g.stream>>>(
            dx, patches.template device_data<T>(), w, first, total);
        check_launch();
      }
    }
  }
};

template <class T> struct conv2d_backprop_filter_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& x = c.input(0);
    const any_tensor& dy = c.input(1);
    const loom::shape fs = loom::kernels::backprop_shape(c.inputs, c.node, 2, "filter_shape");
    const detail::conv_window w =
        detail::window_of(c.node, c.decoded<detail::window_attrs>(), x.shape(), &fs);
    loom::kernels::check_window_dy(c.node, dy, w);
    c.output = g.allocate(dy.type(), fs);
    T* df = c.output.template device_data<T>();
    const std::int64_t rows = w.out_h * w.out_w, cols = w.patch_size();
    const T* xs = x.template device_data<T>();
    if (loom::kernels::pointwise(w) || w.batch == 0) {
      gemm_rows(c, xs, true, dy.template device_data<T>(), false, df, cols, w.out_c, w.batch * rows,
                false);
      return;
    }
    const std::int64_t images = loom::kernels::chunk_images(w);
    any_tensor patches = g.allocate(x.type(), loom::shape{std::min(images, w.batch) * rows, cols});
    for (std::int64_t first = 0; first < w.batch; first += images) {
      const std::int64_t count = std::min(w.batch - first, images);
      im2col(c, w, xs, first, count, patches.template device_data<T>());
      gemm_rows(c, patches.template device_data<T>(), true,
                dy.template device_data<T>() + first * rows * w.out_c, false, df, cols, w.out_c,
                count * rows, first > 0);
    }
  }
};

// The offset in x of output e's window's first largest element in channel ch, -1 if none.
template <class T>
__device__ std::int64_t window_argmax(const T* x, const detail::conv_window& w, std::int64_t n,
                                      std::int64_t oy, std::int64_t ox, std::int64_t ch) {
  std::int64_t best = -1;
  for (std::int64_t ky = 0; ky < w.window_h; ++ky) {
    const std::int64_t y = window_row(w, oy, ky);
    if (y < 0 || y >= w.in_h)
      continue;
    for (std::int64_t kx = 0; kx < w.window_w; ++kx) {
      const std::int64_t x0 = window_col(w, ox, kx);
      if (x0 < 0 || x0 >= w.in_w)
        continue;
      const std::int64_t at = ((n * w.in_h + y) * w.in_w + x0) * w.in_c + ch;
      if (best < 0 || x[at] > x[best])
        best = at;
    }
  }
  return best;
}

// The number of input elements in output (oy, ox)'s window.
__device__ inline std::int64_t window_count(const detail::conv_window& w, std::int64_t oy,
                                            std::int64_t ox) {
  std::int64_t rows = 0, cols = 0;
  for (std::int64_t ky = 0; ky < w.window_h; ++ky) {
    const std::int64_t y = window_row(w, oy, ky);
    rows += y >= 0 && y < w.in_h;
  }
  for (std::int64_t kx = 0; kx < w.window_w; ++kx) {
    const std::int64_t x0 = window_col(w, ox, kx);
    cols += x0 >= 0 && x0 < w.in_w;
  }
  return rows * cols;
}

template <class T>
__global__ void pool_kernel(T* out, const T* x, detail::conv_window w, bool average,
                            std::int64_t total) {
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t ch = e % w.in_c, pix = e / w.in_c;
    const std::int64_t ox = pix % w.out_w, oy = (pix / w.out_w) % w.out_h,
                       n = pix / (w.out_w * w.out_h);
    if (!average) {
      out[e] = x[window_argmax(x, w, n, oy, ox, ch)];
      continue;
    }
    T sum = T(0);
    for (std::int64_t ky = 0; ky < w.window_h; ++ky) {
      const std::int64_t y = window_row(w, oy, ky);
      if (y < 0 || y >= w.in_h)
        continue;
      for (std::int64_t kx = 0; kx < w.window_w; ++kx) {
        const std::int64_t x0 = window_col(w, ox, kx);
        if (x0 >= 0 && x0 < w.in_w)
          sum += x[((n * w.in_h + y) * w.in_w + x0) * w.in_c + ch];
      }
    }
    out[e] = sum / static_cast<T>(window_count(w, oy, ox));
  }
}

// dx: each element the dy of the windows it is the maximum of (x given), or its share of
// every window's dy (average).
template <class T>
__global__ void pool_grad_kernel(T* dx, const T* x, const T* dy, detail::conv_window w,
                                 bool average, std::int64_t total) {
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t ch = e % w.in_c, pix = e / w.in_c;
    const std::int64_t x0 = pix % w.in_w, y = (pix / w.in_w) % w.in_h, n = pix / (w.in_w * w.in_h);
    T sum = T(0);
    for_each_window_of(w, y, x0, [&](std::int64_t oy, std::int64_t ox, std::int64_t, std::int64_t) {
      const T d = dy[((n * w.out_h + oy) * w.out_w + ox) * w.in_c + ch];
      if (average)
        sum += d / static_cast<T>(window_count(w, oy, ox));
      else if (window_argmax(x, w, n, oy, ox, ch) == e)
        sum += d;
    });
    dx[e] = sum;
  }
}

template <class T, bool Average> struct pool_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& x = c.input(0);
    const detail::conv_window w =
        detail::window_of(c.node, c.decoded<detail::window_attrs>(), x.shape(), nullptr);
    c.output = g.allocate(x.type(), w.output_shape());
    const std::int64_t total = c.output.num_elements();
    if (total == 0)
      return;
    pool_kernel<<<grid_for(total), block_threads, 0, g.stream>>>(
        c.output.template device_data<T>(), x.template device_data<T>(), w, Average, total);
    check_launch();
  }
};
template <class T> using max_pool_gpu = pool_gpu<T, false>;
template <class T> using avg_pool_gpu = pool_gpu<T, true>;

// max_pool_grad: inputs (x, y, dy); avg_pool_grad: (dy) and input_shape, or (dy, x).
template <class T, bool Average> struct pool_grad_gpu {
  static void run(kernel_context& c) {
    const gpu_context& g = gpu_of(c);
    const any_tensor& dy = c.input(Average ? 0 : 2);
    const loom::shape xs = Average
                               ? loom::kernels::backprop_shape(c.inputs, c.node, 1, "input_shape")
                               : c.input(0).shape();
    const detail::conv_window w =
        detail::window_of(c.node, c.decoded<detail::window_attrs>(), xs, nullptr);
    loom::kernels::check_window_dy(c.node, dy, w);
    c.output = g.allocate(dy.type(), xs);
    const std::int64_t total = c.output.num_elements();
    if (total == 0)
      return;
    pool_grad_kernel<<<grid_for(total), block_threads, 0, g.stream>>>(
        c.output.template device_data<T>(),
        Average ? static_cast<const T*>(nullptr) : c.input(0).template device_data<T>(),
        dy.template device_data<T>(), w, Average, total);
    check_launch();
  }
};
template <class T> using max_pool_grad_gpu = pool_grad_gpu<T, false>;
template <class T> using avg_pool_grad_gpu = pool_grad_gpu<T, true>;

inline bool register_conv_gpu() {
  register_kernels<conv2d_gpu>("conv2d", floating_types{}, device_gpu);
  register_kernels<conv2d_backprop_input_gpu>("conv2d_backprop_input", floating_types{},
                                              device_gpu);
  register_kernels<conv2d_backprop_filter_gpu>("conv2d_backprop_filter", floating_types{},
                                               device_gpu);
  register_kernels<max_pool_gpu>("max_pool", numeric_types{}, device_gpu);
  register_kernels<max_pool_grad_gpu>("max_pool_grad", numeric_types{}, device_gpu);
  register_kernels<avg_pool_gpu>("avg_pool", floating_types{}, device_gpu);
  register_kernels<avg_pool_grad_gpu>("avg_pool_grad", floating_types{}, device_gpu);
  return true;
}

inline const bool conv_gpu_registered = register_conv_gpu();

} // namespace loom::kernels::cuda_kernels

// CPU kernels of the convolutions and poolings (graph/ops/conv.hpp). conv2d and its backprops
// in float are oneDNN's where loom is built with it (LOOM_HAVE_DNNL, kernels/cpu/dnnl.hpp:
// 6-7x faster on examples/cnn's shapes, docs/dependencies.md). Otherwise, and for double
// always (oneDNN has no f64 convolution), conv2d is a GEMM over the input's patches (im2col): for a
// chunk of images the patches [rows, kh * kw * c], one row per output position, times the filter
// [kh * kw * c, out]; its backprops are the same GEMM transposed, the input's scattered back
// (col2im) an image at a time. A 1x1 convolution with unit strides reads the input as its own
// patches. The chunk bounds the patches' memory (kernels/checks/conv.hpp). The poolings loop over
// windows with the channels innermost, where NHWC keeps them contiguous.
#pragma once

#include <loom/kernels/checks/conv.hpp>
#include <loom/kernels/cpu/gemm.hpp>
#include <loom/kernels/cpu/parallel_for.hpp>
#include <loom/kernels/registry.hpp>
#if defined(LOOM_HAVE_DNNL)
#include <loom/kernels/cpu/dnnl.hpp>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace loom::kernels {

// Calls f(y, x, k) for each element of output position (oy, ox)'s window that lies inside
// the input: its input row and column and its place k among the window's positions.
template <class F>
void for_each_in_window(const detail::conv_window& w, std::int64_t oy, std::int64_t ox, F&& f) {
  for (std::int64_t ky = 0; ky < w.window_h; ++ky) {
    const std::int64_t y = oy * w.stride_h - w.pad_top + ky * w.dilation_h;
    if (y < 0 || y >= w.in_h)
      continue;
    for (std::int64_t kx = 0; kx < w.window_w; ++kx) {
      const std::int64_t x = ox * w.stride_w - w.pad_left + kx * w.dilation_w;
      if (x >= 0 && x < w.in_w)
        f(y, x, ky * w.window_w + kx);
    }
  }
}

// The patches of images [first, last) into p: row (image, oy, ox), column (ky, kx, c).
template <class T>
void im2col(const cpu_device& d, const detail::conv_window& w, const T* x, std::int64_t first,
            std::int64_t last, T* p) {
  const std::int64_t per_image = w.out_h * w.out_w, cols = w.patch_size(), c = w.in_c;
  parallel_for(d, (last - first) * per_image,
               Eigen::TensorOpCost(static_cast<double>(cols * sizeof(T)),
                                   static_cast<double>(cols * sizeof(T)), 0),
               [&](Eigen::Index r0, Eigen::Index r1) {
                 for (Eigen::Index r = r0; r < r1; ++r) {
                   const std::int64_t n = first + r / per_image, o = r % per_image;
                   T* row = p + r * cols;
                   std::fill_n(row, cols, T(0));
                   const T* image = x + n * w.in_h * w.in_w * c;
                   for_each_in_window(w, o / w.out_w, o % w.out_w,
                                      [&](std::int64_t y, std::int64_t xx, std::int64_t k) {
                                        std::memcpy(row + k * c, image + (y * w.in_w + xx) * c,
                                                    static_cast<std::size_t>(c) * sizeof(T));
                                      });
                 }
               });
}

// The patches' gradient of images [first, last) added into dx, an image per task.
template <class T>
void col2im(const cpu_device& d, const detail::conv_window& w, const T* p, std::int64_t first,
            std::int64_t last, T* dx) {
  const std::int64_t per_image = w.out_h * w.out_w, cols = w.patch_size(), c = w.in_c;
  parallel_for(d, last - first,
               Eigen::TensorOpCost(static_cast<double>(per_image * cols * sizeof(T)),
                                   static_cast<double>(per_image * cols * sizeof(T)),
                                   static_cast<double>(per_image * cols)),
               [&](Eigen::Index i0, Eigen::Index i1) {
                 for (Eigen::Index i = i0; i < i1; ++i) {
                   T* image = dx + (first + i) * w.in_h * w.in_w * c;
                   for (std::int64_t o = 0; o < per_image; ++o) {
                     const T* row = p + (i * per_image + o) * cols;
                     for_each_in_window(w, o / w.out_w, o % w.out_w,
                                        [&](std::int64_t y, std::int64_t xx, std::int64_t k) {
                                          T* to = image + (y * w.in_w + xx) * c;
                                          const T* from = row + k * c;
                                          for (std::int64_t j = 0; j < c; ++j)
                                            to[j] += from[j];
                                        });
                   }
                 }
               });
}

// Calls f(first, last, patches) over chunks of images, patches filled for them (or the
// input itself for a pointwise convolution).
template <class T, class F>
void over_patch_chunks(const cpu_device& d, const detail::conv_window& w, const T* x, F&& f) {
  const std::int64_t per_image = w.out_h * w.out_w * w.patch_size();
  if (pointwise(w)) {
    f(std::int64_t{0}, w.batch, x);
    return;
  }
  const std::int64_t images = chunk_images(w);
  std::vector<T> patches(static_cast<std::size_t>(std::min(images, w.batch) * per_image));
  for (std::int64_t first = 0; first < w.batch; first += images) {
    const std::int64_t last = std::min(w.batch, first + images);
    im2col(d, w, x, first, last, patches.data());
    f(first, last, patches.data());
  }
}

template <class T> struct conv2d_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const any_tensor& f = c.input(1);
    const detail::conv_window w =
        window_of(c.node, c.decoded<detail::window_attrs>(), x.shape(), &f.shape());
    c.output = any_tensor(x.type(), w.output_shape());
    T* y = c.output.data<T>();
#if defined(LOOM_HAVE_DNNL)
    if constexpr (std::is_same_v<T, float>)
      if (dnnl_conv::forward(c.device, w, x.data<float>(), f.data<float>(), y))
        return;
#endif
    const std::int64_t rows_per_image = w.out_h * w.out_w;
    over_patch_chunks<T>(
        c.device, w, x.data<T>(), [&](std::int64_t first, std::int64_t last, const T* p) {
          gemm_rows(c.device, p, false, f.data<T>(), false, y + first * rows_per_image * w.out_c,
                    (last - first) * rows_per_image, w.out_c, w.patch_size(), false);
        });
  }
};

// Inputs (filter, dy) and input_shape, or (filter, dy, x).
template <class T> struct conv2d_backprop_input_cpu {
  static void run(kernel_context& c) {
    const any_tensor& f = c.input(0);
    const any_tensor& dy = c.input(1);
    const loom::shape xs = backprop_shape(c.inputs, c.node, 2, "input_shape");
    const detail::conv_window w =
        window_of(c.node, c.decoded<detail::window_attrs>(), xs, &f.shape());
    check_window_dy(c.node, dy, w);
    c.output = any_tensor(dy.type(), xs);
    T* dx = c.output.data<T>();
#if defined(LOOM_HAVE_DNNL)
    if constexpr (std::is_same_v<T, float>)
      if (dnnl_conv::backward_data(c.device, w, f.data<float>(), dy.data<float>(), dx))
        return;
#endif
    const std::int64_t rows_per_image = w.out_h * w.out_w, cols = w.patch_size();
    if (pointwise(w)) {
      gemm_rows(c.device, dy.data<T>(), false, f.data<T>(), true, dx, w.batch * rows_per_image,
                cols, w.out_c, false);
      return;
    }
    std::fill_n(dx, c.output.num_elements(), T(0));
    const std::int64_t images = chunk_images(w);
    std::vector<T> patches(
        static_cast<std::size_t>(std::min(images, w.batch) * rows_per_image * cols));
    for (std::int64_t first = 0; first < w.batch; first += images) {
      const std::int64_t last = std::min(w.batch, first + images);
      gemm_rows(c.device, dy.data<T>() + first * rows_per_image * w.out_c, false, f.data<T>(), true,
                patches.data(), (last - first) * rows_per_image, cols, w.out_c, false);
      col2im(c.device, w, patches.data(), first, last, dx);
    }
  }
};

// Inputs (x, dy) and filter_shape, or (x, dy, filter).
template <class T> struct conv2d_backprop_filter_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const any_tensor& dy = c.input(1);
    const loom::shape fs = backprop_shape(c.inputs, c.node, 2, "filter_shape");
    const detail::conv_window w =
        window_of(c.node, c.decoded<detail::window_attrs>(), x.shape(), &fs);
    check_window_dy(c.node, dy, w);
    c.output = any_tensor(dy.type(), fs);
    T* df = c.output.data<T>();
#if defined(LOOM_HAVE_DNNL)
    if constexpr (std::is_same_v<T, float>)
      if (dnnl_conv::backward_weights(c.device, w, x.data<float>(), dy.data<float>(), df))
        return;
#endif
    const std::int64_t rows_per_image = w.out_h * w.out_w;
    bool accumulate = false;
    if (w.batch == 0)
      std::fill_n(df, c.output.num_elements(), T(0));
    over_patch_chunks<T>(
        c.device, w, x.data<T>(), [&](std::int64_t first, std::int64_t last, const T* p) {
          gemm_rows(c.device, p, true, dy.data<T>() + first * rows_per_image * w.out_c, false, df,
                    w.patch_size(), w.out_c, (last - first) * rows_per_image, accumulate);
          accumulate = true;
        });
  }
};

// Runs f(n, oy, ox) for every output position, rows (n, oy) over the pool.
template <class F> void over_outputs(const cpu_device& d, const detail::conv_window& w, F&& f) {
  const double per_row = static_cast<double>(w.out_w * w.window_h * w.window_w * w.in_c);
  parallel_for(d, w.batch * w.out_h,
               Eigen::TensorOpCost(per_row * 4, w.out_w * w.in_c * 4, per_row),
               [&](Eigen::Index r0, Eigen::Index r1) {
                 for (Eigen::Index r = r0; r < r1; ++r)
                   for (std::int64_t ox = 0; ox < w.out_w; ++ox)
                     f(r / w.out_h, r % w.out_h, ox);
               });
}

// o = max(o, v) per channel (a NaN in v is passed over, as by TF's max pooling). In blocks
// of 8 of a fixed trip count, as keep_larger below, and out of line for the same reason.
template <class T>
[[gnu::noinline]] void keep_max(const T* __restrict v, T* __restrict o, std::int64_t channels) {
  std::int64_t j = 0;
  for (; j + 8 <= channels; j += 8)
    for (int l = 0; l < 8; ++l)
      o[j + l] = v[j + l] > o[j + l] ? v[j + l] : o[j + l];
  for (; j < channels; ++j)
    o[j] = v[j] > o[j] ? v[j] : o[j];
}

template <class T> struct max_pool_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const detail::conv_window w =
        window_of(c.node, c.decoded<detail::window_attrs>(), x.shape(), nullptr);
    c.output = any_tensor(x.type(), w.output_shape());
    const T* in = x.data<T>();
    T* out = c.output.data<T>();
    const std::int64_t ch = w.in_c;
    over_outputs(c.device, w, [&](std::int64_t n, std::int64_t oy, std::int64_t ox) {
      T* o = out + ((n * w.out_h + oy) * w.out_w + ox) * ch;
      std::fill_n(o, ch, std::numeric_limits<T>::lowest());
      const T* image = in + n * w.in_h * w.in_w * ch;
      for_each_in_window(w, oy, ox, [&](std::int64_t y, std::int64_t xx, std::int64_t) {
        keep_max(image + (y * w.in_w + xx) * ch, o, ch);
      });
    });
  }
};

template <class T> struct avg_pool_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const detail::conv_window w =
        window_of(c.node, c.decoded<detail::window_attrs>(), x.shape(), nullptr);
    c.output = any_tensor(x.type(), w.output_shape());
    const T* in = x.data<T>();
    T* out = c.output.data<T>();
    const std::int64_t ch = w.in_c;
    over_outputs(c.device, w, [&](std::int64_t n, std::int64_t oy, std::int64_t ox) {
      T* o = out + ((n * w.out_h + oy) * w.out_w + ox) * ch;
      std::fill_n(o, ch, T(0));
      const T* image = in + n * w.in_h * w.in_w * ch;
      std::int64_t count = 0;
      for_each_in_window(w, oy, ox, [&](std::int64_t y, std::int64_t xx, std::int64_t) {
        const T* v = image + (y * w.in_w + xx) * ch;
        for (std::int64_t j = 0; j < ch; ++j)
          o[j] += v[j];
        ++count;
      });
      for (std::int64_t j = 0; j < ch; ++j)
        o[j] /= static_cast<T>(count);
    });
  }
};

// Runs f(n) for each image over the pool: a gradient's windows overlap within an image only.
template <class F> void over_images(const cpu_device& d, const detail::conv_window& w, F&& f) {
  const double per_image =
      static_cast<double>(w.out_h * w.out_w * w.window_h * w.window_w * w.in_c);
  parallel_for(d, w.batch, Eigen::TensorOpCost(per_image * 4, per_image * 4, per_image),
               [&](Eigen::Index i0, Eigen::Index i1) {
                 for (Eigen::Index n = i0; n < i1; ++n)
                   f(static_cast<std::int64_t>(n));
               });
}

// Where a window element v beats the window's largest so far, per channel: best_value and
// best (at: the element's offset in its image) take it; the first largest stays (strictly
// greater). Branch-free, in blocks of 8 of a fixed trip count: g++ -O2's vectorizer (its
// very-cheap cost model) takes those and not a loop of unknown count, and a branch per
// channel mispredicts on real data. Out of line: inlined, the pointers lose __restrict and
// g++ vectorizes nothing (-fopt-info-vec; the selection 1.03x as fast as the branches,
// against 6.2-6.9x out of line). The index is chosen by a mask, not by `c ? x : best[j]`,
// which g++ made a store only where c: a masked store (vpmaskmovd), microcoded and slow on
// AMD's cores (with the mask, max_pool's gradient 1.7x as fast at examples/cnn's shapes).
template <class T>
void keep_larger_one(const T* __restrict v, T* __restrict best_value, std::int32_t* __restrict best,
                     std::int32_t at, std::int64_t j) {
  const T x = v[j], b = best_value[j];
  const std::int32_t take = -static_cast<std::int32_t>(x > b); // all ones where larger
  best[j] = (best[j] & ~take) | ((at + static_cast<std::int32_t>(j)) & take);
  best_value[j] = x > b ? x : b;
}
template <class T>
[[gnu::noinline]] void keep_larger(const T* __restrict v, T* __restrict best_value,
                                   std::int32_t* __restrict best, std::int32_t at,
                                   std::int64_t channels) {
  std::int64_t j = 0;
  for (; j + 8 <= channels; j += 8)
    for (int l = 0; l < 8; ++l)
      keep_larger_one(v, best_value, best, at, j + l);
  for (; j < channels; ++j)
    keep_larger_one(v, best_value, best, at, j);
}

// Inputs (x, y, dy): each window's dy to its first largest element, in window order.
template <class T> struct max_pool_grad_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const any_tensor& dy = c.input(2);
    const detail::conv_window w =
        window_of(c.node, c.decoded<detail::window_attrs>(), x.shape(), nullptr);
    check_window_dy(c.node, dy, w);
    if (w.in_h * w.in_w * w.in_c > std::numeric_limits<std::int32_t>::max())
      throw invalid_argument_error("node " + c.node.describe() + ": an image of " +
                                   std::to_string(w.in_h * w.in_w * w.in_c) +
                                   " elements, more than max_pool_grad's 2^31 - 1");
    c.output = any_tensor(x.type(), x.shape());
    T* dx = c.output.data<T>();
    std::fill_n(dx, c.output.num_elements(), T(0));
    const T* in = x.data<T>();
    const std::int64_t ch = w.in_c;
    over_images(c.device, w, [&](std::int64_t n) {
      const T* image = in + n * w.in_h * w.in_w * ch;
      T* grad = dx + n * w.in_h * w.in_w * ch;
      // Each channel's largest value so far beside where it is in the image.
      std::vector<std::int32_t> best(static_cast<std::size_t>(ch));
      std::vector<T> best_value(static_cast<std::size_t>(ch));
      for (std::int64_t oy = 0; oy < w.out_h; ++oy)
        for (std::int64_t ox = 0; ox < w.out_w; ++ox) {
          bool empty = true;
          for_each_in_window(w, oy, ox, [&](std::int64_t y, std::int64_t xx, std::int64_t) {
            const auto at = static_cast<std::int32_t>((y * w.in_w + xx) * ch);
            const T* v = image + at;
            if (empty) { // the window's first element: the largest so far
              std::copy_n(v, ch, best_value.data());
              for (std::int64_t j = 0; j < ch; ++j)
                best[static_cast<std::size_t>(j)] = at + static_cast<std::int32_t>(j);
              empty = false;
              return;
            }
            keep_larger(v, best_value.data(), best.data(), at, ch);
          });
          if (empty)
            continue;
          const T* d = dy.data<T>() + ((n * w.out_h + oy) * w.out_w + ox) * ch;
          for (std::int64_t j = 0; j < ch; ++j)
            grad[best[static_cast<std::size_t>(j)]] += d[j];
        }
    });
  }
};

// Inputs (dy) and input_shape, or (dy, x): each window's dy / count over its elements.
template <class T> struct avg_pool_grad_cpu {
  static void run(kernel_context& c) {
    const any_tensor& dy = c.input(0);
    const loom::shape xs = backprop_shape(c.inputs, c.node, 1, "input_shape");
    const detail::conv_window w = window_of(c.node, c.decoded<detail::window_attrs>(), xs, nullptr);
    check_window_dy(c.node, dy, w);
    c.output = any_tensor(dy.type(), xs);
    T* dx = c.output.data<T>();
    std::fill_n(dx, c.output.num_elements(), T(0));
    const std::int64_t ch = w.in_c;
    over_images(c.device, w, [&](std::int64_t n) {
      T* grad = dx + n * w.in_h * w.in_w * ch;
      for (std::int64_t oy = 0; oy < w.out_h; ++oy)
        for (std::int64_t ox = 0; ox < w.out_w; ++ox) {
          std::int64_t count = 0;
          for_each_in_window(w, oy, ox, [&](std::int64_t, std::int64_t, std::int64_t) { ++count; });
          const T* d = dy.data<T>() + ((n * w.out_h + oy) * w.out_w + ox) * ch;
          for_each_in_window(w, oy, ox, [&](std::int64_t y, std::int64_t xx, std::int64_t) {
            T* to = grad + (y * w.in_w + xx) * ch;
            for (std::int64_t j = 0; j < ch; ++j)
              to[j] += d[j] / static_cast<T>(count);
          });
        }
    });
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_conv_cpu() {
  register_kernels<conv2d_cpu>("conv2d", floating_types{});
  register_kernels<conv2d_backprop_input_cpu>("conv2d_backprop_input", floating_types{});
  register_kernels<conv2d_backprop_filter_cpu>("conv2d_backprop_filter", floating_types{});
  register_kernels<max_pool_cpu>("max_pool", numeric_types{});
  register_kernels<max_pool_grad_cpu>("max_pool_grad", numeric_types{});
  register_kernels<avg_pool_cpu>("avg_pool", floating_types{});
  register_kernels<avg_pool_grad_cpu>("avg_pool_grad", floating_types{});
  return true;
}

inline const bool conv_cpu_registered = register_conv_cpu();
#endif

} // namespace loom::kernels

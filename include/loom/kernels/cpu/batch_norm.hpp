// CPU kernels of fused batch normalization (graph/ops/batch_norm.hpp). x is seen as [rows, C]
// (kernels/checks/batch_norm.hpp). The per-channel sums split the rows into a fixed number of
// blocks, each summed in double over the pool, then added in block order: the result is the
// same whatever the thread count. The elementwise passes fold the per-channel constants
// first (y = x k + b), so each element is one multiply-add.
#pragma once

#include <loom/kernels/checks/batch_norm.hpp>
#include <loom/kernels/cpu/parallel_for.hpp>
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace loom::kernels {

// Per channel c, K sums over the rows of term(row, c, sums) (sums: K doubles of that row and
// channel to add to), in blocks of rows summed in order. Returns [K][C].
template <int K, class Term>
std::vector<double> channel_sums(const cpu_device& d, const channel_layout& l, Term&& term) {
  const std::int64_t c = l.channels;
  std::vector<double> total(static_cast<std::size_t>(K * c), 0.0);
  if (l.rows == 0 || c == 0)
    return total;
  constexpr std::int64_t max_blocks = 64;
  const std::int64_t per_block = std::max<std::int64_t>(1, (l.rows + max_blocks - 1) / max_blocks);
  const std::int64_t blocks = (l.rows + per_block - 1) / per_block;
  std::vector<double> partial(static_cast<std::size_t>(blocks * K * c), 0.0);
  const double bytes = static_cast<double>(per_block * c * 8);
  parallel_for(d, blocks, Eigen::TensorOpCost(bytes, 0, static_cast<double>(per_block * c * 3)),
               [&](Eigen::Index first, Eigen::Index last) {
                 for (Eigen::Index b = first; b < last; ++b) {
                   double* sums = partial.data() + b * K * c;
                   const std::int64_t end = std::min(l.rows, (b + 1) * per_block);
                   for (std::int64_t row = b * per_block; row < end; ++row)
                     for (std::int64_t ch = 0; ch < c; ++ch)
                       term(row, ch, sums + ch, c);
                 }
               });
  for (std::int64_t b = 0; b < blocks; ++b)
    for (std::int64_t i = 0; i < K * c; ++i)
      total[static_cast<std::size_t>(i)] += partial[static_cast<std::size_t>(b * K * c + i)];
  return total;
}

// out = x k + b per channel (k and b of C each), the rows split over the pool.
template <class T>
void scale_and_shift(const cpu_device& d, const channel_layout& l, const T* x, const T* k,
                     const T* b, T* out) {
  if (l.channels == 0)
    return;
  const double row_bytes = static_cast<double>(l.channels * sizeof(T));
  parallel_for(d, l.rows,
               Eigen::TensorOpCost(row_bytes, row_bytes, static_cast<double>(2 * l.channels)),
               [&](Eigen::Index first, Eigen::Index last) {
                 for (Eigen::Index row = first; row < last; ++row) {
                   const T* in = x + row * l.channels;
                   T* o = out + row * l.channels;
                   for (std::int64_t ch = 0; ch < l.channels; ++ch)
                     o[ch] = in[ch] * k[ch] + b[ch];
                 }
               });
}

// [3, C]: mean, variance (biased), variance * n / (n - 1). Two passes: the mean, then the
// squared deviations from it (no cancellation for large means).
template <class T> struct batch_norm_moments_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const channel_layout l = channels_of(c.node, x);
    const T* px = x.data<T>();
    const auto sums =
        channel_sums<1>(c.device, l, [&](std::int64_t r, std::int64_t ch, double* s, std::int64_t) {
          s[0] += static_cast<double>(px[r * l.channels + ch]);
        });
    const double n = static_cast<double>(std::max<std::int64_t>(l.rows, 1));
    std::vector<double> mean(sums.size());
    for (std::size_t ch = 0; ch < sums.size(); ++ch)
      mean[ch] = sums[ch] / n;
    const auto squares =
        channel_sums<1>(c.device, l, [&](std::int64_t r, std::int64_t ch, double* s, std::int64_t) {
          const double dev =
              static_cast<double>(px[r * l.channels + ch]) - mean[static_cast<std::size_t>(ch)];
          s[0] += dev * dev;
        });
    c.output = any_tensor(x.type(), loom::shape{3, l.channels});
    T* out = c.output.data<T>();
    const double bessel = bessel_factor(l.rows);
    for (std::int64_t ch = 0; ch < l.channels; ++ch) {
      const double var = squares[static_cast<std::size_t>(ch)] / n;
      out[ch] = static_cast<T>(mean[static_cast<std::size_t>(ch)]);
      out[l.channels + ch] = static_cast<T>(var);
      out[2 * l.channels + ch] = static_cast<T>(var * bessel);
    }
  }
};

// y = x k + b per channel, k = scale rsqrt(variance + epsilon), b = offset - mean k.
template <class T> struct fused_batch_norm_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const channel_layout l = checked_normalize_inputs(c);
    const double epsilon = c.node.attr<double>("epsilon");
    const T *scale = c.input(1).data<T>(), *offset = c.input(2).data<T>(),
            *mean = c.input(3).data<T>(), *variance = c.input(4).data<T>();
    std::vector<T> k(static_cast<std::size_t>(l.channels)), b(k.size());
    for (std::size_t ch = 0; ch < k.size(); ++ch) {
      k[ch] = static_cast<T>(static_cast<double>(scale[ch]) /
                             std::sqrt(static_cast<double>(variance[ch]) + epsilon));
      b[ch] = offset[ch] - mean[ch] * k[ch];
    }
    c.output = any_tensor(x.type(), x.shape());
    scale_and_shift(c.device, l, x.data<T>(), k.data(), b.data(), c.output.data<T>());
  }
};

// [2, C]: sum(dy x_hat) and sum(dy), x_hat = (x - mean) rsqrt(variance + epsilon).
template <class T> struct fused_batch_norm_grad_sums_cpu {
  static void run(kernel_context& c) {
    const any_tensor& dy = c.input(0);
    const any_tensor& x = c.input(1);
    const channel_layout l = checked_grad_sums_inputs(c);
    const double epsilon = c.node.attr<double>("epsilon");
    const T *mean = c.input(2).data<T>(), *variance = c.input(3).data<T>();
    std::vector<double> r(static_cast<std::size_t>(l.channels));
    for (std::size_t ch = 0; ch < r.size(); ++ch)
      r[ch] = 1 / std::sqrt(static_cast<double>(variance[ch]) + epsilon);
    const T *pdy = dy.data<T>(), *px = x.data<T>();
    const auto sums = channel_sums<2>(
        c.device, l, [&](std::int64_t row, std::int64_t ch, double* s, std::int64_t channels) {
          const std::int64_t e = row * channels + ch;
          const double g = static_cast<double>(pdy[e]);
          s[0] += g * (static_cast<double>(px[e]) - static_cast<double>(mean[ch])) *
                  r[static_cast<std::size_t>(ch)];
          s[channels] += g;
        });
    c.output = any_tensor(x.type(), loom::shape{2, l.channels});
    T* out = c.output.data<T>();
    for (std::size_t i = 0; i < sums.size(); ++i)
      out[i] = static_cast<T>(sums[i]);
  }
};

// dx = dm0 / n + (dm1 + dm2 n / (n - 1)) 2 (x - mean) / n, folded to dx = x k + b per channel.
template <class T> struct batch_norm_moments_grad_cpu {
  static void run(kernel_context& c) {
    const any_tensor& dm = c.input(0);
    const any_tensor& x = c.input(1);
    const any_tensor& m = c.input(2);
    const channel_layout l = checked_moments_grad_inputs(c);
    const double n = static_cast<double>(std::max<std::int64_t>(l.rows, 1));
    const double bessel = bessel_factor(l.rows);
    const T *pdm = dm.data<T>(), *mean = m.data<T>();
    std::vector<T> k(static_cast<std::size_t>(l.channels)), b(k.size());
    for (std::int64_t ch = 0; ch < l.channels; ++ch) {
      const double slope = 2 *
                           (static_cast<double>(pdm[l.channels + ch]) +
                            static_cast<double>(pdm[2 * l.channels + ch]) * bessel) /
                           n;
      k[static_cast<std::size_t>(ch)] = static_cast<T>(slope);
      b[static_cast<std::size_t>(ch)] =
          static_cast<T>(static_cast<double>(pdm[ch]) / n - slope * static_cast<double>(mean[ch]));
    }
    c.output = any_tensor(x.type(), x.shape());
    scale_and_shift(c.device, l, x.data<T>(), k.data(), b.data(), c.output.data<T>());
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_batch_norm_kernels() {
  register_kernels<batch_norm_moments_cpu>("batch_norm_moments", floating_types{});
  register_kernels<batch_norm_moments_grad_cpu>("batch_norm_moments_grad", floating_types{});
  register_kernels<fused_batch_norm_cpu>("fused_batch_norm", floating_types{});
  register_kernels<fused_batch_norm_grad_sums_cpu>("fused_batch_norm_grad_sums", floating_types{});
  return true;
}

inline const bool batch_norm_kernels_registered = register_batch_norm_kernels();
#endif

} // namespace loom::kernels

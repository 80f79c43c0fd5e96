// CPU kernels of the strided ops (graph/ops/strided.hpp): transpose, strided_slice and
// its gradient, pad, tile. Each plans a strided copy (kernels/checks/strided.hpp) and
// runs it here, rows of its innermost dimension over the pool; expand_dims and squeeze
// change only a shape (kernels/metadata.hpp).
#pragma once

#include <loom/kernels/checks/strided.hpp>
#include <loom/kernels/cpu/array.hpp>
#include <loom/kernels/cpu/parallel_for.hpp>
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace loom::kernels {

// Runs a coalesced strided copy: each block of rows of the innermost dimension finds
// its first row's offsets once and steps the others' from it.
template <class T>
void run_strided_copy(const cpu_device& device, const strided_copy& c, const T* src, T* dst) {
  const std::int64_t total = c.total();
  if (total == 0)
    return;
  const std::size_t k = c.count.size();
  const std::int64_t inner = c.count.back(), src_step = c.src_stride.back(),
                     dst_step = c.dst_stride.back();
  const Eigen::TensorOpCost per_row(static_cast<double>(inner * sizeof(T)),
                                    static_cast<double>(inner * sizeof(T)),
                                    static_cast<double>(inner));
  parallel_for(device, total / inner, per_row, [&](Eigen::Index first, Eigen::Index last) {
    std::array<std::int64_t, max_strided_dims> at{};
    std::int64_t s = c.src_base, d = c.dst_base;
    for (std::int64_t r = first, dim = static_cast<std::int64_t>(k) - 2; dim >= 0; --dim) {
      const auto u = static_cast<std::size_t>(dim);
      at[u] = r % c.count[u];
      r /= c.count[u];
      s += at[u] * c.src_stride[u];
      d += at[u] * c.dst_stride[u];
    }
    for (Eigen::Index row = first; row < last; ++row) {
      if (src_step == 1 && dst_step == 1)
        copy_row(dst + d, src + s, inner);
      else
        for (std::int64_t j = 0; j < inner; ++j)
          dst[d + j * dst_step] = src[s + j * src_step];
      for (std::int64_t dim = static_cast<std::int64_t>(k) - 2; dim >= 0; --dim) {
        const auto u = static_cast<std::size_t>(dim);
        s += c.src_stride[u];
        d += c.dst_stride[u];
        if (++at[u] < c.count[u])
          break;
        s -= c.count[u] * c.src_stride[u];
        d -= c.count[u] * c.dst_stride[u];
        at[u] = 0;
      }
    }
  });
}

template <class T>
void fill_elements(const cpu_device& device, T* out, std::int64_t n, const T& v) {
  parallel_for(
      device, n, Eigen::TensorOpCost(0, sizeof(T), 1),
      [&](Eigen::Index first, Eigen::Index last) { std::fill(out + first, out + last, v); });
}

template <class T> struct transpose_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    check_strided_rank(c.node, x.shape());
    const std::vector<int> perm = detail::checked_perm(c.node, x.shape());
    c.output = any_tensor(x.type(), detail::transposed_shape(x.shape(), perm));
    run_strided_copy(c.device, transpose_copy(x.shape(), perm), x.data<T>(), c.output.data<T>());
  }
};

template <class T> struct strided_slice_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    check_strided_rank(c.node, x.shape());
    const detail::resolved_slice r =
        resolve_slice(c.node, c.decoded<detail::strided_slice_attrs>(), x.shape());
    c.output = any_tensor(x.type(), r.out);
    run_strided_copy(c.device, slice_copy(x.shape(), r, false), x.data<T>(), c.output.data<T>());
  }
};

template <class T> struct strided_slice_grad_cpu {
  static void run(kernel_context& c) {
    const any_tensor& dy = c.input(0);
    const slice_grad_attrs& a = c.decoded<slice_grad_attrs>();
    const loom::shape x = c.inputs.size() == 2 ? c.input(1).shape() : loom::shape(a.shape);
    check_strided_rank(c.node, x);
    const detail::resolved_slice r = resolve_slice(c.node, a.slice, x);
    check_slice_grad(c.node, dy, r);
    c.output = any_tensor(dy.type(), x);
    fill_elements(c.device, c.output.data<T>(), c.output.num_elements(), T{});
    run_strided_copy(c.device, slice_copy(x, r, true), dy.data<T>(), c.output.data<T>());
  }
};

template <class T> struct pad_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    check_strided_rank(c.node, x.shape());
    const auto paddings = detail::checked_paddings(c.node, x.shape());
    c.output = any_tensor(x.type(), detail::padded_shape(x.shape(), paddings));
    fill_elements(c.device, c.output.data<T>(), c.output.num_elements(), *c.input(1).data<T>());
    run_strided_copy(c.device, pad_copy(x.shape(), c.output.shape(), paddings), x.data<T>(),
                     c.output.data<T>());
  }
};

template <class T> struct tile_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    check_strided_rank(c.node, x.shape());
    const auto multiples = detail::checked_multiples(c.node, x.shape());
    c.output = any_tensor(x.type(), detail::tiled_shape(x.shape(), multiples));
    run_strided_copy(c.device, tile_copy(x.shape(), multiples), x.data<T>(), c.output.data<T>());
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_strided_cpu() {
  register_kernels<transpose_cpu>("transpose", all_types{});
  register_kernels<strided_slice_cpu>("strided_slice", all_types{});
  register_kernels<strided_slice_grad_cpu>("strided_slice_grad", all_types_but_string{});
  register_kernels<pad_cpu>("pad", all_types{});
  register_kernels<tile_cpu>("tile", all_types{});
  return true;
}

inline const bool strided_cpu_registered = register_strided_cpu();
#endif

} // namespace loom::kernels

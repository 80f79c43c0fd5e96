// CPU kernels of the non-elementwise math ops.
//
// matmul and xw_plus_b run the CPU's one GEMM (kernels/cpu/gemm.hpp). Reductions collapse the input
// to alternating runs of kept and reduced dimensions, then reduce one run at a time as [outer, run,
// inner], so any rank and any set of axes needs only three Eigen instantiations per dtype and
// reducer.
#pragma once

#include <loom/kernels/checks/math.hpp>
#include <loom/kernels/cpu/eigen_tensor.hpp>
#include <loom/kernels/cpu/elementwise.hpp>
#include <loom/kernels/cpu/gemm.hpp>
#include <loom/kernels/cpu/state.hpp>
#include <loom/kernels/registry.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace loom::kernels {

using index_t = Eigen::Index;

// op(a) op(b) (+ bias on every row) into out, which is [m, n] and allocated.
template <class T>
void gemm(const cpu_device& d, const any_tensor& a, bool ta, const any_tensor& b, bool tb,
          const T* bias, any_tensor& out) {
  const index_t m = out.shape()[0], n = out.shape()[1], k = a.shape()[ta ? 0 : 1];
  gemm_rows(d, a.data<T>(), ta, b.data<T>(), tb, out.data<T>(), m, n, k, false, bias);
}

template <class T> struct matmul_cpu {
  static void run(kernel_context& c) {
    const any_tensor& a = c.input(0);
    const any_tensor& b = c.input(1);
    const bool ta = c.node.attr_or<bool>("transpose_a", false);
    const bool tb = c.node.attr_or<bool>("transpose_b", false);
    c.output = any_tensor(dtype_of<T>, matmul_shape(c.node, a, b, ta, tb));
    gemm<T>(c.device, a, ta, b, tb, nullptr, c.output);
  }
};

template <class T> struct xw_plus_b_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const any_tensor& w = c.input(1);
    const any_tensor& b = c.input(2);
    c.output = any_tensor(dtype_of<T>, xw_plus_b_shape(c.node, x, w, b));
    gemm<T>(c.device, x, false, w, false, b.data<T>(), c.output);
  }
};

// -- add_n --------------------------------------------------------------------------

// The inputs summed in their order (as the GPU kernel does, so both give the same
// bits), a chunk at a time so the chunk stays in cache while every input is added
// to it. Into input 0's buffer where nothing else reads it.
template <class T> struct add_n_cpu {
  static void run(kernel_context& c) {
    const loom::shape s = add_n_shape(c.node, c.inputs);
    const bool in_place = c.may_forward(0);
    c.output = in_place ? c.input(0) : any_tensor(c.input(0).type(), s);
    T* out = c.output.data<T>();
    const std::size_t k = c.inputs.size();
    const Eigen::TensorOpCost cost(static_cast<double>(k * sizeof(T)),
                                   static_cast<double>(sizeof(T)), static_cast<double>(k));
    parallel_chunks(c.device, c.output.num_elements(), cost,
                    [&](Eigen::DenseIndex first, Eigen::DenseIndex len) {
                      T* o = out + first;
                      if (!in_place)
                        std::copy_n(c.input(0).data<T>() + first, len, o);
                      for (std::size_t i = 1; i < k; ++i) {
                        const T* x = c.input(i).data<T>() + first;
                        for (Eigen::DenseIndex j = 0; j < len; ++j)
                          o[j] += x[j];
                      }
                    });
  }
};

// -- reductions ---------------------------------------------------------------------

// out[o, i] = reduce over j of in[o, j, i].
template <class T, class Reducer>
void reduce_run(const cpu_device& d, const T* in, T* out, index_t o, index_t r, index_t i) {
  using one = Eigen::IndexList<Eigen::type2index<1>>;
  if (o == 1 && i == 1) {
    tensor_map<T, 0> y(out);
    y.device(d) =
        const_tensor_map<T, 1>(in, r).reduce(Eigen::IndexList<Eigen::type2index<0>>(), Reducer());
  } else if (i == 1) { // innermost: Eigen's vectorised inner reduction
    tensor_map<T, 1> y(out, o);
    y.device(d) = const_tensor_map<T, 2>(in, o, r).reduce(one(), Reducer());
  } else {
    tensor_map<T, 2> y(out, o, i);
    y.device(d) = const_tensor_map<T, 3>(in, o, r, i).reduce(one(), Reducer());
  }
}

// The reductions Eigen's Tensor module does not run here (min, prod, and the bools'
// and/or): a plain loop per output row, out[o, :] folded over j with in[o, j, :], the
// inner loop over contiguous elements (vectorised by the compiler), rows over the pool.
// Cheap to instantiate, where each Eigen reducer costs three tensor reductions per dtype.
struct min_fold {
  template <class T> static T identity() {
    return std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity()
                                                : std::numeric_limits<T>::max();
  }
  template <class T> static T apply(T a, T b) { return b < a ? b : a; }
};
struct prod_fold {
  template <class T> static T identity() { return T(1); }
  template <class T> static T apply(T a, T b) { return a * b; }
};
struct and_fold {
  template <class T> static T identity() { return true; }
  template <class T> static T apply(T a, T b) { return a && b; }
};
struct or_fold {
  template <class T> static T identity() { return false; }
  template <class T> static T apply(T a, T b) { return a || b; }
};
template <class R>
concept loop_fold = requires {
  R::template identity<int>();
};

template <class T, class Fold>
void fold_run(const cpu_device& d, const T* in, T* out, index_t o, index_t r, index_t i) {
  parallel_for(d, o,
               Eigen::TensorOpCost(static_cast<double>(r * i * static_cast<index_t>(sizeof(T))),
                                   static_cast<double>(i * static_cast<index_t>(sizeof(T))),
                                   static_cast<double>(r * i)),
               [=](index_t first, index_t last) {
                 for (index_t k = first; k < last; ++k) {
                   T* y = out + k * i;
                   const T* x = in + k * r * i;
                   std::fill_n(y, i, Fold::template identity<T>());
                   for (index_t j = 0; j < r; ++j, x += i)
                     for (index_t e = 0; e < i; ++e)
                       y[e] = Fold::apply(y[e], x[e]);
                 }
               });
}

// Reduces x over the masked axes with Reducer (an Eigen reducer or a fold above); the
// result has x's dtype and `out_shape`. With nothing to reduce it shares x's buffer.
template <class T, class Reducer>
any_tensor reduce_tensor(const cpu_device& d, const any_tensor& x, const std::vector<char>& mask,
                         const loom::shape& out_shape) {
  reduction_runs runs = merge_runs(x.shape(), mask);
  any_tensor cur = x;
  while (runs.any_reduced()) {
    // The longest run first: it shrinks the data the most.
    std::size_t p = 0;
    for (std::size_t k = 0; k < runs.dims.size(); ++k)
      if (runs.reduced[k] && (!runs.reduced[p] || runs.dims[k] > runs.dims[p]))
        p = k;
    index_t o = 1, i = 1;
    for (std::size_t k = 0; k < p; ++k)
      o *= runs.dims[k];
    for (std::size_t k = p + 1; k < runs.dims.size(); ++k)
      i *= runs.dims[k];
    any_tensor next(x.type(), loom::shape{o * i});
    if constexpr (loop_fold<Reducer>)
      fold_run<T, Reducer>(d, cur.data<T>(), next.data<T>(), o, runs.dims[p], i);
    else
      reduce_run<T, Reducer>(d, cur.data<T>(), next.data<T>(), o, runs.dims[p], i);
    cur = std::move(next);
    // Drop the run; its kept neighbours become one run.
    runs.dims.erase(runs.dims.begin() + static_cast<std::ptrdiff_t>(p));
    runs.reduced.erase(runs.reduced.begin() + static_cast<std::ptrdiff_t>(p));
    if (p > 0 && p < runs.dims.size()) {
      runs.dims[p - 1] *= runs.dims[p];
      runs.dims.erase(runs.dims.begin() + static_cast<std::ptrdiff_t>(p));
      runs.reduced.erase(runs.reduced.begin() + static_cast<std::ptrdiff_t>(p));
    }
  }
  return cur.reshaped(out_shape);
}

template <class T> struct reduction_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const node_def& n = c.node;
    const auto [mask, out_shape] = reduction_of(n, x.shape());
    const std::int64_t out_count = out_shape.num_elements();
    const std::int64_t count = out_count == 0 ? 0 : x.num_elements() / out_count;
    const bool is_max = n.op == "reduce_max";
    if (x.num_elements() == 0) { // the reductions' identities (TF: NaN for the mean of nothing)
      c.output = any_tensor(x.type(), out_shape);
      T init = T(0);
      if (is_max)
        init = std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                    : std::numeric_limits<T>::lowest();
      else if (n.op == "reduce_min")
        init = min_fold::identity<T>();
      else if (n.op == "reduce_prod")
        init = T(1);
      else if (n.op == "reduce_mean" && std::numeric_limits<T>::has_quiet_NaN)
        init = std::numeric_limits<T>::quiet_NaN();
      std::fill_n(c.output.data<T>(), out_count, init);
      return;
    }
    if (n.op == "reduce_min") {
      c.output = reduce_tensor<T, min_fold>(c.device, x, mask, out_shape);
      return;
    }
    if (n.op == "reduce_prod") {
      c.output = reduce_tensor<T, prod_fold>(c.device, x, mask, out_shape);
      return;
    }
    if (is_max) {
      c.output = reduce_tensor<T, Eigen::internal::MaxReducer<T>>(c.device, x, mask, out_shape);
      return;
    }
    c.output = reduce_tensor<T, Eigen::internal::SumReducer<T>>(c.device, x, mask, out_shape);
    if (n.op == "reduce_mean" && count > 1) { // count > 1: the buffer is the kernel's own
      auto y = eigen_flat<T>(c.output);
      y.device(c.device) = y / static_cast<T>(count);
    }
  }
};

// reduce_any / reduce_all of bools (TF's Any, All): false / true over nothing.
template <class T> struct logical_reduction_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const auto [mask, out_shape] = reduction_of(c.node, x.shape());
    const bool all = c.node.op == "reduce_all";
    if (x.num_elements() == 0) {
      c.output = any_tensor(x.type(), out_shape);
      std::fill_n(c.output.data<T>(), out_shape.num_elements(), all);
      return;
    }
    c.output = all ? reduce_tensor<T, and_fold>(c.device, x, mask, out_shape)
                   : reduce_tensor<T, or_fold>(c.device, x, mask, out_shape);
  }
};

// reduce_prod's gradient (TF's _ProdGrad): dx = dy times the product of the other elements of
// the element's reduction, the exclusive product before it times the one after it (no
// division, so zeros are right). An output per task: two passes over its elements.
template <class T> struct reduce_prod_grad_cpu {
  static void run(kernel_context& c) {
    const any_tensor& dy = c.input(0);
    const any_tensor& x = c.input(1);
    const reduction_walk w = reduce_prod_grad_of(c.node, dy, x.shape());
    c.output = any_tensor(x.type(), x.shape());
    if (w.outputs == 0 || w.count == 0)
      return;
    std::vector<std::int64_t> at(static_cast<std::size_t>(w.count));
    for (std::int64_t j = 0; j < w.count; ++j)
      at[static_cast<std::size_t>(j)] = walk_offset(j, w.red_dims, w.red_strides);
    const T* in = x.data<T>();
    const T* d = dy.data<T>();
    T* out = c.output.data<T>();
    parallel_for(c.device, w.outputs,
                 Eigen::TensorOpCost(static_cast<double>(w.count * 2 * sizeof(T)),
                                     static_cast<double>(w.count * sizeof(T)),
                                     static_cast<double>(w.count * 4)),
                 [&](index_t first, index_t last) {
                   for (index_t o = first; o < last; ++o) {
                     const std::int64_t base = walk_offset(o, w.kept_dims, w.kept_strides);
                     T before = T(1);
                     for (const std::int64_t a : at) { // dx = the product before it
                       out[base + a] = before;
                       before *= in[base + a];
                     }
                     T after = d[o];
                     for (std::size_t j = at.size(); j-- > 0;) { // times dy and the one after
                       out[base + at[j]] *= after;
                       after *= in[base + at[j]];
                     }
                   }
                 });
  }
};

// dy broadcast back over the reduced axes (divided by their count for a mean).
template <class T> struct reduce_grad_cpu {
  static void run(kernel_context& c) {
    const any_tensor& dy = c.input(0);
    const loom::shape& to = c.input(1).shape();
    const node_def& n = c.node;
    const auto [mask, count] = reduce_grad_of(n, dy, to);
    any_tensor src = dy;
    if (n.attr<std::string>("mode") == "mean" && count > 1) {
      src = any_tensor(dy.type(), dy.shape());
      eigen_flat<T>(src).device(c.device) = eigen_flat<T>(dy) / static_cast<T>(count);
    }
    const reduction_runs runs = merge_runs(to, mask);
    if (!runs.any_reduced() || to.num_elements() == 0) {
      c.output = to.num_elements() == 0 ? any_tensor(dy.type(), to) : src.reshaped(to);
      return;
    }
    std::vector<std::int64_t> from_dims, to_dims;
    for (std::size_t k = 0; k < runs.dims.size(); ++k) {
      to_dims.push_back(runs.dims[k]);
      from_dims.push_back(runs.reduced[k] ? 1 : runs.dims[k]);
    }
    const loom::shape merged_to(std::move(to_dims));
    c.output = broadcast_to<T>(c.device, src.reshaped(loom::shape(std::move(from_dims))), merged_to)
                   .reshaped(to);
  }
};

// argmax / argmin along one axis; ties give the first index.
template <class T> struct arg_reduction_cpu {
  static void run(kernel_context& c) {
    const any_tensor& x = c.input(0);
    const node_def& n = c.node;
    const arg_reduction_layout l = arg_reduction_of(n, x.shape());
    c.output = any_tensor(dtype::i64, l.out);
    const index_t o = l.outer, i = l.inner, r = l.size;
    if (o * i == 0)
      return;
    const T* in = x.data<T>();
    std::int64_t* out = c.output.data<std::int64_t>();
    const bool is_min = n.op == "argmin";
    parallel_for(c.device, o * i,
                 Eigen::TensorOpCost(static_cast<double>(r * static_cast<index_t>(sizeof(T))),
                                     sizeof(std::int64_t), static_cast<double>(r)),
                 [=](index_t first, index_t last) {
                   for (index_t k = first; k < last; ++k) {
                     const T* p = in + (k / i) * r * i + k % i;
                     index_t best = 0;
                     T value = p[0];
                     for (index_t j = 1; j < r; ++j) {
                       const T v = p[j * i];
                       if (is_min ? v < value : v > value) {
                         value = v;
                         best = j;
                       }
                     }
                     out[k] = best;
                   }
                 });
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_math_kernels() {
  register_kernels<matmul_cpu>("matmul", floating_types{});
  register_kernels<xw_plus_b_cpu>("xw_plus_b", floating_types{});
  register_kernels<add_n_cpu>("add_n", numeric_types{});
  for (const char* op : {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod"})
    register_kernels<reduction_cpu>(op, numeric_types{});
  for (const char* op : {"reduce_any", "reduce_all"})
    register_kernels<logical_reduction_cpu>(op, type_list<bool>{});
  register_kernels<reduce_grad_cpu>("reduce_grad", floating_types{});
  register_kernels<reduce_prod_grad_cpu>("reduce_prod_grad", floating_types{});
  register_kernels<arg_reduction_cpu>("argmax", numeric_types{});
  register_kernels<arg_reduction_cpu>("argmin", numeric_types{});
  return true;
}

inline const bool math_kernels_registered = register_math_kernels();
#endif

} // namespace loom::kernels

// Eigen's Tensor module as loom's CPU kernels use it, and any_tensor's views in it
// (eigen_map, eigen_flat). Only the kernel layer includes it: Eigen's Tensor module is about
// 200 K lines, and the headers above the kernels (core/tensor.hpp, the graph, the net layer,
// the cluster settings) never evaluate a tensor expression.
#pragma once

#include <loom/core/dtype.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/expr/ops.hpp>

// Kernels evaluate on Eigen's ThreadPoolDevice, which exists only when this is
// defined before Eigen's Tensor module is first included.
#ifndef EIGEN_USE_THREADS
#define EIGEN_USE_THREADS
#endif
// The IEEE float sqrt, not Eigen's fast estimate (sqrt(inf) would be NaN):
// loom::loom defines it for every unit; this covers a program built by hand
// that includes loom before Eigen.
#ifndef EIGEN_FAST_MATH
#define EIGEN_FAST_MATH 0
#endif
#include <unsupported/Eigen/CXX11/Tensor>

#include <cstddef>
#include <string>

namespace loom {

namespace ops {
// relu_grad's Eigen form (expr/ops.hpp): dy where x > 0, else +0, as a mask and a
// bitwise and per packet. select() over the comparison, which it replaces, built a
// bool per element and converted them back one at a time: 2 % of examples/ctr's
// worker for a pass over 100 K floats. NaN and -0 give +0, as the scalar form.
template <class T> struct relu_grad_fn {
  T operator()(const T& dy, const T& x) const { return x > T(0) ? dy : T(0); }
  template <class P> P packetOp(const P& dy, const P& x) const {
    return Eigen::internal::pand(dy, Eigen::internal::pcmp_lt(Eigen::internal::pzero(x), x));
  }
};
// pow's Eigen form: std::pow per element (Eigen has no packet pow of two tensors).
template <class T> struct pow_fn {
  T operator()(const T& a, const T& b) const { return ops::scalar::pow(a, b); }
};
// cos and sin: Eigen's functors, with their packet forms.
template <class T> struct cos_fn : Eigen::internal::scalar_cos_op<T> {};
template <class T> struct sin_fn : Eigen::internal::scalar_sin_op<T> {};
} // namespace ops

namespace kernels {

template <element_type T, int R>
using tensor_map =
    Eigen::TensorMap<Eigen::Tensor<T, R, Eigen::RowMajor, Eigen::DenseIndex>, Eigen::Aligned>;
template <element_type T, int R>
using const_tensor_map =
    Eigen::TensorMap<Eigen::Tensor<const T, R, Eigen::RowMajor, Eigen::DenseIndex>, Eigen::Aligned>;

// Eigen::array: std::array under g++ and clang, Eigen's own array under nvcc,
// where TensorMap takes nothing else (a graph built in an nvcc unit views
// tensors too).
template <int R>
Eigen::array<Eigen::DenseIndex, static_cast<std::size_t>(R)> eigen_dims(const any_tensor& t) {
  if (t.shape().rank() != R)
    throw invalid_argument_error("tensor of shape " + t.shape().to_string() + " viewed with rank " +
                                 std::to_string(R));
  Eigen::array<Eigen::DenseIndex, static_cast<std::size_t>(R)> d{};
  for (int i = 0; i < R; ++i)
    d[static_cast<std::size_t>(i)] = t.shape()[i];
  return d;
}

// An Eigen view of rank R of a host tensor. The tensor's rank must be R.
template <element_type T, int R> tensor_map<T, R> eigen_map(any_tensor& t) {
  return tensor_map<T, R>(t.data<T>(), kernels::eigen_dims<R>(t));
}
template <element_type T, int R> const_tensor_map<T, R> eigen_map(const any_tensor& t) {
  return const_tensor_map<T, R>(t.data<T>(), kernels::eigen_dims<R>(t));
}
// A rank-1 view over all elements, whatever the rank.
template <element_type T> tensor_map<T, 1> eigen_flat(any_tensor& t) {
  return tensor_map<T, 1>(t.data<T>(), t.num_elements());
}
template <element_type T> const_tensor_map<T, 1> eigen_flat(const any_tensor& t) {
  return const_tensor_map<T, 1>(t.data<T>(), t.num_elements());
}

} // namespace kernels
} // namespace loom

// Tells Eigen that relu_grad_fn has a packet form (its cost: a compare and an and).
template <class T> struct Eigen::internal::functor_traits<loom::ops::relu_grad_fn<T>> {
  enum {
    Cost = 2 * Eigen::NumTraits<T>::AddCost,
    PacketAccess = Eigen::internal::packet_traits<T>::HasCmp
  };
};
template <class T>
struct Eigen::internal::functor_traits<loom::ops::cos_fn<T>>
    : Eigen::internal::functor_traits<Eigen::internal::scalar_cos_op<T>> {};
template <class T>
struct Eigen::internal::functor_traits<loom::ops::sin_fn<T>>
    : Eigen::internal::functor_traits<Eigen::internal::scalar_sin_op<T>> {};

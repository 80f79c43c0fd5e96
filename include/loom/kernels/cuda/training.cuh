// GPU kernels of the optimizer updates (kernels/cpu/training.hpp on the CPU),
// with TF's formulas: each updates the variable and its slots in this GPU's
// memory, in place unless something else holds their buffers (begin_update),
// and outputs the variable's buffer. The variable and its slots
// must live on this GPU (their initializers placed here put them there); one
// that does not is refused with a message naming it.
//
// The hyperparameters (lr, beta1_power, ...) are scalar inputs in device
// memory: the kernels read them there, so that no update waits for the GPU.
#pragma once

#include <loom/kernels/checks/training.hpp>
#include <loom/kernels/cuda/common.cuh>
#include <loom/kernels/cuda/expression.cuh>
#include <loom/kernels/cuda/state.cuh>
#include <loom/kernels/registry.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace loom::detail::cuda_kernels {

using loom::detail::apply_locks;
using loom::detail::apply_ref_name;

// The CPU's begin_update on this GPU: take the locks; check the inputs (the
// CPU's messages) and that every ref lives on this GPU; own the buffers the
// update writes, a shared one copied on this GPU's stream (unshare_refs).
[[nodiscard]] inline apply_locks begin_update(const kernel_context& c, const any_tensor& grad) {
  apply_locks lock(c.refs);
  loom::detail::check_apply_inputs(c, grad);
  for (std::size_t k = 0; k < c.refs.size(); ++k)
    check_on_gpu(c, c.refs[k]->value,
                 (k == 0 ? "variable '" : "slot '") + apply_ref_name(c.node, k) + "'");
  const gpu_context& g = gpu_of(c);
  loom::detail::unshare_refs(c, [&g](const any_tensor& t) { return g.clone(t); });
  return lock;
}

// A scalar hyperparameter input, in device memory; TF accepts only scalars.
template <class T> const T* scalar_input(const kernel_context& c, std::size_t i, const char* what) {
  return loom::detail::apply_scalar_input(c, i, what).template device_data<T>();
}

template <class T> T* ref_data(const kernel_context& c, std::size_t k) {
  return c.refs[k]->value.template device_data<T>();
}

template <class T>
__global__ void gradient_descent_kernel(T* w, const T* alpha, const T* delta, std::int64_t n) {
  const T a = *alpha;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    w[i] -= delta[i] * a;
}

template <class T>
__global__ void momentum_kernel(T* w, T* accum, const T* lr_p, const T* grad, const T* momentum_p,
                                std::int64_t n, bool nesterov) {
  const T lr = *lr_p, momentum = *momentum_p;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const T g = grad[i];
    const T a = accum[i] * momentum + g;
    accum[i] = a;
    if (nesterov)
      w[i] -= g * lr + a * momentum * lr;
    else
      w[i] -= a * lr;
  }
}

template <class T>
__global__ void adagrad_kernel(T* w, T* accum, const T* lr_p, const T* grad, std::int64_t n) {
  const T lr = *lr_p;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const T g = grad[i];
    const T a = accum[i] + g * g;
    accum[i] = a;
    w[i] -= g * lr * (T(1) / ops::scalar::sqrt(a));
  }
}

struct adam_params {
  const void *beta1_power, *beta2_power, *lr, *beta1, *beta2, *epsilon;
};

template <class T>
__global__ void adam_kernel(T* w, T* m, T* v, const T* grad, adam_params p, std::int64_t n,
                            bool nesterov) {
  const T beta1_power = *static_cast<const T*>(p.beta1_power);
  const T beta2_power = *static_cast<const T*>(p.beta2_power);
  const T lr = *static_cast<const T*>(p.lr), beta1 = *static_cast<const T*>(p.beta1);
  const T beta2 = *static_cast<const T*>(p.beta2), epsilon = *static_cast<const T*>(p.epsilon);
  const T alpha = lr * ops::scalar::sqrt(T(T(1) - beta2_power)) / (T(1) - beta1_power);
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const T g = grad[i];
    const T mi = m[i] + (g - m[i]) * (T(1) - beta1);
    const T vi = v[i] + (g * g - v[i]) * (T(1) - beta2);
    m[i] = mi;
    v[i] = vi;
    if (nesterov)
      w[i] -= ((g * (T(1) - beta1) + mi * beta1) * alpha) / (ops::scalar::sqrt(vi) + epsilon);
    else
      w[i] -= (mi * alpha) / (ops::scalar::sqrt(vi) + epsilon);
  }
}

template <class T>
__global__ void rms_prop_kernel(T* w, T* ms, T* mom, const T* grad, const T* lr_p, const T* rho_p,
                                const T* momentum_p, const T* epsilon_p, std::int64_t n) {
  const T lr = *lr_p, rho = *rho_p, momentum = *momentum_p, epsilon = *epsilon_p;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const T g = grad[i];
    const T s = ms[i] + (g * g - ms[i]) * (T(1) - rho);
    ms[i] = s;
    const T mo = mom[i] * momentum + (g * lr) / ops::scalar::sqrt(T(s + epsilon));
    mom[i] = mo;
    w[i] -= mo;
  }
}

template <class T> std::int64_t elements(const kernel_context& c) {
  return c.refs[0]->value.num_elements();
}

template <class T> struct apply_gradient_descent_gpu {
  static void run(kernel_context& c) {
    const T* alpha = scalar_input<T>(c, 1, "alpha");
    const any_tensor& delta = c.input(2);
    const apply_locks lock = begin_update(c, delta);
    const gpu_context& g = gpu_of(c);
    if (const std::int64_t n = elements<T>(c); n > 0) {
      gradient_descent_kernel<T><<<grid_for(n), block_threads, 0, g.stream>>>(
          ref_data<T>(c, 0), alpha, delta.template device_data<T>(), n);
      check_launch();
    }
    c.output = c.refs[0]->value;
  }
};

template <class T> struct apply_momentum_gpu {
  static void run(kernel_context& c) {
    const T* lr = scalar_input<T>(c, 2, "lr");
    const T* momentum = scalar_input<T>(c, 4, "momentum");
    const any_tensor& grad = c.input(3);
    const bool nesterov = c.node.attr_or<bool>("use_nesterov", false);
    const apply_locks lock = begin_update(c, grad);
    const gpu_context& g = gpu_of(c);
    if (const std::int64_t n = elements<T>(c); n > 0) {
      momentum_kernel<T><<<grid_for(n), block_threads, 0, g.stream>>>(
          ref_data<T>(c, 0), ref_data<T>(c, 1), lr, grad.template device_data<T>(), momentum, n,
          nesterov);
      check_launch();
    }
    c.output = c.refs[0]->value;
  }
};

template <class T> struct apply_adagrad_gpu {
  static void run(kernel_context& c) {
    const T* lr = scalar_input<T>(c, 2, "lr");
    const any_tensor& grad = c.input(3);
    const apply_locks lock = begin_update(c, grad);
    const gpu_context& g = gpu_of(c);
    if (const std::int64_t n = elements<T>(c); n > 0) {
      adagrad_kernel<T><<<grid_for(n), block_threads, 0, g.stream>>>(
          ref_data<T>(c, 0), ref_data<T>(c, 1), lr, grad.template device_data<T>(), n);
      check_launch();
    }
    c.output = c.refs[0]->value;
  }
};

template <class T> struct apply_adam_gpu {
  static void run(kernel_context& c) {
    const adam_params p{scalar_input<T>(c, 3, "beta1_power"), scalar_input<T>(c, 4, "beta2_power"),
                        scalar_input<T>(c, 5, "lr"),          scalar_input<T>(c, 6, "beta1"),
                        scalar_input<T>(c, 7, "beta2"),       scalar_input<T>(c, 8, "epsilon")};
    const any_tensor& grad = c.input(9);
    const bool nesterov = c.node.attr_or<bool>("use_nesterov", false);
    const apply_locks lock = begin_update(c, grad);
    const gpu_context& g = gpu_of(c);
    if (const std::int64_t n = elements<T>(c); n > 0) {
      adam_kernel<T><<<grid_for(n), block_threads, 0, g.stream>>>(
          ref_data<T>(c, 0), ref_data<T>(c, 1), ref_data<T>(c, 2), grad.template device_data<T>(),
          p, n, nesterov);
      check_launch();
    }
    c.output = c.refs[0]->value;
  }
};

template <class T> struct apply_rms_prop_gpu {
  static void run(kernel_context& c) {
    const T* lr = scalar_input<T>(c, 3, "lr");
    const T* rho = scalar_input<T>(c, 4, "rho");
    const T* momentum = scalar_input<T>(c, 5, "momentum");
    const T* epsilon = scalar_input<T>(c, 6, "epsilon");
    const any_tensor& grad = c.input(7);
    const apply_locks lock = begin_update(c, grad);
    const gpu_context& g = gpu_of(c);
    if (const std::int64_t n = elements<T>(c); n > 0) {
      rms_prop_kernel<T><<<grid_for(n), block_threads, 0, g.stream>>>(
          ref_data<T>(c, 0), ref_data<T>(c, 1), ref_data<T>(c, 2), grad.template device_data<T>(),
          lr, rho, momentum, epsilon, n);
      check_launch();
    }
    c.output = c.refs[0]->value;
  }
};

inline bool register_training_gpu() {
  register_kernels<apply_gradient_descent_gpu>("apply_gradient_descent", floating_types{},
                                               device_gpu);
  register_kernels<apply_momentum_gpu>("apply_momentum", floating_types{}, device_gpu);
  register_kernels<apply_adagrad_gpu>("apply_adagrad", floating_types{}, device_gpu);
  register_kernels<apply_adam_gpu>("apply_adam", floating_types{}, device_gpu);
  register_kernels<apply_rms_prop_gpu>("apply_rms_prop", floating_types{}, device_gpu);
  return true;
}

inline const bool training_gpu_registered = register_training_gpu();

} // namespace loom::detail::cuda_kernels

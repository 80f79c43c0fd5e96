// CPU kernels of the optimizer updates, with TF's exact formulas
// (tensorflow/core/kernels/training_ops.cc). They update the variable and its
// slots in place unless something else holds their buffers (begin_update),
// and output the variable's buffer, as TF's ref outputs do.
#pragma once

#include <loom/kernels/checks/training.hpp>
#include <loom/kernels/registry.hpp>

#include <cmath>

namespace loom::detail {

// A hyperparameter input's value; TF accepts only scalars.
template <class T> T apply_scalar(const kernel_context& c, std::size_t i, const char* what) {
  return *apply_scalar_input(c, i, what).data<T>();
}

// The chunk [first, first + len) of a tensor's elements, for the update
// kernels below: each runs all of its statements on one chunk before the next,
// so the variable and its slots pass through the cache once per step.
template <class T>
chunk_map<T> chunk(any_tensor& t, Eigen::DenseIndex first, Eigen::DenseIndex len) {
  return chunk_map<T>(t.data<T>() + first, len);
}
template <class T>
chunk_map<const T> chunk(const any_tensor& t, Eigen::DenseIndex first, Eigen::DenseIndex len) {
  return chunk_map<const T>(t.data<T>() + first, len);
}

// Runs update(first, len) over a variable's elements on the pool; `tensors` is
// how many tensors of T each element touches.
template <class T, class F> void update_chunks(const kernel_context& c, int tensors, F&& update) {
  const auto n = static_cast<Eigen::DenseIndex>(c.refs[0]->value.num_elements());
  const Eigen::TensorOpCost cost(static_cast<double>(tensors) * sizeof(T), 2.0 * sizeof(T),
                                 4.0 * tensors);
  parallel_chunks(c.device, n, cost, std::forward<F>(update));
}

// What every update does before it writes: take the locks, check the inputs
// and own the buffers it writes (unshare_refs). The locks are held until the
// update is done.
[[nodiscard]] inline apply_locks begin_update(const kernel_context& c, const any_tensor& grad) {
  apply_locks lock(c.refs);
  check_apply_inputs(c, grad);
  unshare_refs(c, [](const any_tensor& t) { return t.clone(); });
  return lock;
}

template <class T> struct apply_gradient_descent_cpu {
  static void run(kernel_context& c) {
    const T alpha = apply_scalar<T>(c, 1, "alpha");
    const any_tensor& delta = c.input(2);
    variable_resource& var = *c.refs[0];
    const apply_locks lock = begin_update(c, delta);
    update_chunks<T>(c, 2, [&](Eigen::DenseIndex f, Eigen::DenseIndex len) {
      chunk<T>(var.value, f, len) -= chunk<T>(delta, f, len) * alpha;
    });
    c.output = var.value;
  }
};

template <class T> struct apply_momentum_cpu {
  static void run(kernel_context& c) {
    const T lr = apply_scalar<T>(c, 2, "lr");
    const T momentum = apply_scalar<T>(c, 4, "momentum");
    const any_tensor& g = c.input(3);
    const bool nesterov = c.node.attr_or<bool>("use_nesterov", false);
    variable_resource& var = *c.refs[0];
    const apply_locks lock = begin_update(c, g);
    update_chunks<T>(c, 3, [&](Eigen::DenseIndex f, Eigen::DenseIndex len) {
      auto w = chunk<T>(var.value, f, len);
      auto accum = chunk<T>(c.refs[1]->value, f, len);
      const auto grad = chunk<T>(g, f, len);
      accum = accum * momentum + grad;
      if (nesterov)
        w -= grad * lr + accum * momentum * lr;
      else
        w -= accum * lr;
    });
    c.output = var.value;
  }
};

template <class T> struct apply_adagrad_cpu {
  static void run(kernel_context& c) {
    const T lr = apply_scalar<T>(c, 2, "lr");
    const any_tensor& g = c.input(3);
    variable_resource& var = *c.refs[0];
    const apply_locks lock = begin_update(c, g);
    update_chunks<T>(c, 3, [&](Eigen::DenseIndex f, Eigen::DenseIndex len) {
      auto w = chunk<T>(var.value, f, len);
      auto accum = chunk<T>(c.refs[1]->value, f, len);
      const auto grad = chunk<T>(g, f, len);
      accum += grad.square();
      w -= grad * lr * accum.rsqrt();
    });
    c.output = var.value;
  }
};

template <class T> struct apply_adam_cpu {
  static void run(kernel_context& c) {
    const T beta1_power = apply_scalar<T>(c, 3, "beta1_power");
    const T beta2_power = apply_scalar<T>(c, 4, "beta2_power");
    const T lr = apply_scalar<T>(c, 5, "lr");
    const T beta1 = apply_scalar<T>(c, 6, "beta1");
    const T beta2 = apply_scalar<T>(c, 7, "beta2");
    const T epsilon = apply_scalar<T>(c, 8, "epsilon");
    const any_tensor& g = c.input(9);
    const bool nesterov = c.node.attr_or<bool>("use_nesterov", false);
    variable_resource& var = *c.refs[0];
    const apply_locks lock = begin_update(c, g);
    const T alpha = lr * std::sqrt(T(1) - beta2_power) / (T(1) - beta1_power);
    update_chunks<T>(c, 4, [&](Eigen::DenseIndex f, Eigen::DenseIndex len) {
      auto w = chunk<T>(var.value, f, len);
      auto m = chunk<T>(c.refs[1]->value, f, len);
      auto v = chunk<T>(c.refs[2]->value, f, len);
      const auto grad = chunk<T>(g, f, len);
      m += (grad - m) * (T(1) - beta1);
      v += (grad.square() - v) * (T(1) - beta2);
      if (nesterov)
        w -= ((grad * (T(1) - beta1) + m * beta1) * alpha) / (v.sqrt() + v.constant(epsilon));
      else
        w -= (m * alpha) / (v.sqrt() + v.constant(epsilon));
    });
    c.output = var.value;
  }
};

template <class T> struct apply_rms_prop_cpu {
  static void run(kernel_context& c) {
    const T lr = apply_scalar<T>(c, 3, "lr");
    const T rho = apply_scalar<T>(c, 4, "rho");
    const T momentum = apply_scalar<T>(c, 5, "momentum");
    const T epsilon = apply_scalar<T>(c, 6, "epsilon");
    const any_tensor& g = c.input(7);
    variable_resource& var = *c.refs[0];
    const apply_locks lock = begin_update(c, g);
    update_chunks<T>(c, 4, [&](Eigen::DenseIndex f, Eigen::DenseIndex len) {
      auto w = chunk<T>(var.value, f, len);
      auto ms = chunk<T>(c.refs[1]->value, f, len);
      auto mom = chunk<T>(c.refs[2]->value, f, len);
      const auto grad = chunk<T>(g, f, len);
      ms += (grad.square() - ms) * (T(1) - rho);
      mom = mom * momentum + (grad * lr) / (ms + ms.constant(epsilon)).sqrt();
      w -= mom;
    });
    c.output = var.value;
  }
};

inline bool register_training_kernels() {
  register_kernels<apply_gradient_descent_cpu>("apply_gradient_descent", floating_types{});
  register_kernels<apply_momentum_cpu>("apply_momentum", floating_types{});
  register_kernels<apply_adagrad_cpu>("apply_adagrad", floating_types{});
  register_kernels<apply_adam_cpu>("apply_adam", floating_types{});
  register_kernels<apply_rms_prop_cpu>("apply_rms_prop", floating_types{});
  return true;
}

inline const bool training_kernels_registered = register_training_kernels();

} // namespace loom::detail

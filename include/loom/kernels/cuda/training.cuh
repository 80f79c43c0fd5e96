// GPU kernels of the optimizer updates (kernels/cpu/training.hpp on the CPU),
// with TF's formulas: each updates the variable and its slots in this GPU's
// memory, in place unless something else holds their buffers (begin_update),
// and outputs the variable's buffer. The variable and its slots
// must live on this GPU (their initializers placed here put them there); one
// that does not is refused with a message naming it.
//
// The hyperparameters (lr, beta1_power, ...) are scalar inputs in device
// memory: the kernels read them there, so that no update waits for the GPU.
//
// The sparse twins (sparse_apply_*: rows and their indices) update only the
// rows the indices name, of the variable and of every slot, in place as on
// the CPU (LazyAdam for Adam). The indices are checked on their host copy
// with the CPU's message before anything is written (kernels/cuda/ids.cuh,
// the one wait of a sparse update); then repeated indices are grouped on the
// GPU (ids.cuh: a CUB radix sort of the indices with their positions, runs
// and their starts) and one kernel gives each (distinct index, element of a
// row) one thread, which sums that index's gradient rows in their order (the
// CPU's sum) and applies the update rule to the variable and slots there.
// FTRL (apply_ftrl, TF's ApplyFtrlV2) has a dense kernel and a sparse twin
// over the same rule.
#pragma once

#include <loom/kernels/checks/training.hpp>
#include <loom/kernels/cuda/common.cuh>
#include <loom/kernels/cuda/expression.cuh>
#include <loom/kernels/cuda/ids.cuh>
#include <loom/kernels/cuda/state.cuh>
#include <loom/kernels/registry.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace loom::kernels::cuda_kernels {

// The CPU's begin_update on this GPU: take the locks; check the inputs (the
// CPU's messages) and that every ref lives on this GPU; own the buffers the
// update writes, a shared one copied on this GPU's stream (unshare_refs).
[[nodiscard]] inline apply_locks begin_update(const kernel_context& c, const any_tensor& grad) {
  apply_locks lock(c.refs);
  loom::kernels::check_apply_inputs(c, grad);
  for (std::size_t k = 0; k < c.refs.size(); ++k)
    check_on_gpu(c, c.refs[k]->value,
                 (k == 0 ? "variable '" : "slot '") + apply_ref_name(c.node, k) + "'");
  const gpu_context& g = gpu_of(c);
  loom::kernels::unshare_refs(c, [&g](const any_tensor& t) { return g.clone(t); });
  return lock;
}

// A scalar hyperparameter input, in device memory; TF accepts only scalars.
template <class T> const T* scalar_input(const kernel_context& c, std::size_t i, const char* what) {
  return loom::kernels::apply_scalar_input(c, i, what).template device_data<T>();
}

template <class T> T* ref_data(const kernel_context& c, std::size_t k) {
  return c.refs[k]->value.template device_data<T>();
}

struct adam_params {
  const void *beta1_power, *beta2_power, *lr, *beta1, *beta2, *epsilon;
};

// -- the update rules -------------------------------------------------------------------------
// A rule holds device pointers to the variable, its slots and its scalar
// inputs; load() reads the scalars once per thread and gives the rule proper,
// which updates element i of the variable and its slots from gradient g with
// the CPU's formulas. One rule serves the dense op and its sparse twin
// (run_update), as on the CPU.

template <class T> struct gradient_descent_rule {
  T* w;
  const T* alpha_p;
  struct loaded {
    T* w;
    T alpha;
    __device__ void operator()(std::int64_t i, T g) const { w[i] -= g * alpha; }
  };
  __device__ loaded load() const { return {w, *alpha_p}; }
};

template <class T> struct momentum_rule {
  T *w, *accum;
  const T *lr_p, *momentum_p;
  bool nesterov;
  struct loaded {
    T *w, *accum;
    T lr, momentum;
    bool nesterov;
    __device__ void operator()(std::int64_t i, T g) const {
      const T a = accum[i] * momentum + g;
      accum[i] = a;
      if (nesterov)
        w[i] -= g * lr + a * momentum * lr;
      else
        w[i] -= a * lr;
    }
  };
  __device__ loaded load() const { return {w, accum, *lr_p, *momentum_p, nesterov}; }
};

template <class T> struct adagrad_rule {
  T *w, *accum;
  const T* lr_p;
  struct loaded {
    T *w, *accum;
    T lr;
    __device__ void operator()(std::int64_t i, T g) const {
      const T a = accum[i] + g * g;
      accum[i] = a;
      w[i] -= g * lr * (T(1) / ops::scalar::sqrt(a));
    }
  };
  __device__ loaded load() const { return {w, accum, *lr_p}; }
};

template <class T> struct adam_rule {
  T *w, *m, *v;
  adam_params p;
  bool nesterov;
  struct loaded {
    T *w, *m, *v;
    T alpha, beta1, beta2, epsilon;
    bool nesterov;
    __device__ void operator()(std::int64_t i, T g) const {
      const T mi = m[i] + (g - m[i]) * (T(1) - beta1);
      const T vi = v[i] + (g * g - v[i]) * (T(1) - beta2);
      m[i] = mi;
      v[i] = vi;
      if (nesterov)
        w[i] -= ((g * (T(1) - beta1) + mi * beta1) * alpha) / (ops::scalar::sqrt(vi) + epsilon);
      else
        w[i] -= (mi * alpha) / (ops::scalar::sqrt(vi) + epsilon);
    }
  };
  __device__ loaded load() const {
    const T beta1_power = *static_cast<const T*>(p.beta1_power);
    const T beta2_power = *static_cast<const T*>(p.beta2_power);
    const T lr = *static_cast<const T*>(p.lr);
    const T alpha = lr * ops::scalar::sqrt(T(T(1) - beta2_power)) / (T(1) - beta1_power);
    return {w,
            m,
            v,
            alpha,
            *static_cast<const T*>(p.beta1),
            *static_cast<const T*>(p.beta2),
            *static_cast<const T*>(p.epsilon),
            nesterov};
  }
};

template <class T> struct rms_prop_rule {
  T *w, *ms, *mom;
  const T *lr_p, *rho_p, *momentum_p, *epsilon_p;
  struct loaded {
    T *w, *ms, *mom;
    T lr, rho, momentum, epsilon;
    __device__ void operator()(std::int64_t i, T g) const {
      const T s = ms[i] + (g * g - ms[i]) * (T(1) - rho);
      ms[i] = s;
      const T mo = mom[i] * momentum + (g * lr) / ops::scalar::sqrt(T(s + epsilon));
      mom[i] = mo;
      w[i] -= mo;
    }
  };
  __device__ loaded load() const { return {w, ms, mom, *lr_p, *rho_p, *momentum_p, *epsilon_p}; }
};

// FTRL-Proximal, TF's ApplyFtrlV2 (l2_shrinkage 0 is ApplyFtrl); lr_power
// -0.5 takes a square root, as TF's special case, else pow.
template <class T> struct ftrl_rule {
  T *w, *accum, *linear;
  const T *lr_p, *l1_p, *l2_p, *shrinkage_p, *lr_power_p;
  struct loaded {
    T *w, *accum, *linear;
    T lr, l1, l2, shrinkage, lr_power;
    bool root;
    __device__ T power(T x) const {
      if (root)
        return ops::scalar::sqrt(x);
      if constexpr (std::is_same_v<T, float>)
        return ::powf(x, -lr_power);
      else
        return ::pow(x, -lr_power);
    }
    __device__ void operator()(std::int64_t i, T g) const {
      const T old_accum = accum[i], wi = w[i];
      const T new_accum = old_accum + g * g;
      const T new_power = power(new_accum);
      const T lin =
          linear[i] + (g + T(2) * shrinkage * wi - (new_power - power(old_accum)) / lr * wi);
      linear[i] = lin;
      const T quadratic = new_power / lr + T(2) * l2;
      const T magnitude = lin < T(0) ? -lin : lin;
      w[i] = magnitude > l1 ? ((lin > T(0) ? l1 : -l1) - lin) / quadratic : T(0);
      accum[i] = new_accum;
    }
  };
  __device__ loaded load() const {
    const T lr_power = *lr_power_p;
    return {w, accum, linear, *lr_p, *l1_p, *l2_p, *shrinkage_p, lr_power, lr_power == T(-0.5)};
  }
};

// A rule over every element: grad has the variable's shape.
template <class T, class Rule>
__global__ void dense_rule_kernel(Rule rule, const T* grad, std::int64_t n) {
  const auto apply = rule.load();
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    apply(i, grad[i]);
}

// A rule over the rows that the grouped indices name: element j of the row
// of group u gets the sum of its gradient rows' element j, in their order.
template <class T, class Rule>
__global__ void sparse_rule_kernel(Rule rule, id_groups_view ids, const T* rows, std::int64_t row) {
  const auto apply = rule.load();
  const std::int64_t total = static_cast<std::int64_t>(*ids.groups) * row;
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t u = e / row, j = e - u * row;
    const std::int32_t first = ids.start[u], last = first + ids.count[u];
    T g = rows[ids.order[first] * row + j];
#pragma unroll 4
    for (std::int32_t p = first + 1; p < last; ++p)
      g += rows[ids.order[p] * row + j];
    apply(static_cast<std::int64_t>(ids.key[u]) * row + j, g);
  }
}

// Runs an update (the CPU's run_update on this GPU). Dense (apply_*): under
// the locks, owning the buffers it writes (begin_update), the rule over every
// element. Sparse (sparse_apply_*: inputs as the dense op's with the
// gradient's rows at `grad_input`, the indices last): under the locks, the
// CPU's checks, every ref on this GPU, the indices checked on their host copy;
// then the rule over the distinct rows, in place (as on the CPU, no copy of
// the variable). make() gives the rule once the refs are settled.
template <class T, class Make>
void run_update(kernel_context& c, std::size_t grad_input, Make&& make) {
  const any_tensor& grad = c.input(grad_input);
  const gpu_context& g = gpu_of(c);
  if (c.node.op.rfind("sparse_", 0) != 0) {
    const apply_locks lock = begin_update(c, grad);
    if (const std::int64_t n = c.refs[0]->value.num_elements(); n > 0) {
      dense_rule_kernel<T>
          <<<grid_for(n), block_threads, 0, g.stream>>>(make(), grad.template device_data<T>(), n);
      check_launch();
    }
    c.output = c.refs[0]->value;
    return;
  }
  const any_tensor& indices = c.input(c.inputs.size() - 1);
  const apply_locks lock(c.refs);
  loom::kernels::check_sparse_apply_inputs(c, grad, indices);
  for (std::size_t k = 0; k < c.refs.size(); ++k)
    check_on_gpu(c, c.refs[k]->value,
                 (k == 0 ? "variable '" : "slot '") + apply_ref_name(c.node, k) + "'");
  const any_tensor& var = c.refs[0]->value;
  const std::int64_t rows = var.shape()[0];
  const std::int64_t row = rows == 0 ? 0 : var.num_elements() / rows;
  const std::int64_t n = indices.num_elements();
  with_ids(download(g, indices), [&](const auto* id) {
    check_id_range(c.node, id, n, rows, false,
                   [&] { return "variable '" + apply_ref_name(c.node, 0) + "'"; });
  });
  if (n > 0 && row > 0) {
    const id_groups groups = group_ids(g, c.node, indices, rows);
    sparse_rule_kernel<T><<<grid_for(n * row), block_threads, 0, g.stream>>>(
        make(), groups.view(), grad.template device_data<T>(), row);
    check_launch();
  }
  c.output = c.refs[0]->value;
}

template <class T> struct apply_gradient_descent_gpu {
  static void run(kernel_context& c) {
    const T* alpha = scalar_input<T>(c, 1, "alpha");
    run_update<T>(c, 2, [&] { return gradient_descent_rule<T>{ref_data<T>(c, 0), alpha}; });
  }
};

template <class T> struct apply_momentum_gpu {
  static void run(kernel_context& c) {
    const T* lr = scalar_input<T>(c, 2, "lr");
    const T* momentum = scalar_input<T>(c, 4, "momentum");
    const bool nesterov = c.node.attr_or<bool>("use_nesterov", false);
    run_update<T>(c, 3, [&] {
      return momentum_rule<T>{ref_data<T>(c, 0), ref_data<T>(c, 1), lr, momentum, nesterov};
    });
  }
};

template <class T> struct apply_adagrad_gpu {
  static void run(kernel_context& c) {
    const T* lr = scalar_input<T>(c, 2, "lr");
    run_update<T>(c, 3, [&] { return adagrad_rule<T>{ref_data<T>(c, 0), ref_data<T>(c, 1), lr}; });
  }
};

// Sparse: TF's LazyAdam (m and v of the rows a step touches only), as on the CPU.
template <class T> struct apply_adam_gpu {
  static void run(kernel_context& c) {
    const adam_params p{scalar_input<T>(c, 3, "beta1_power"), scalar_input<T>(c, 4, "beta2_power"),
                        scalar_input<T>(c, 5, "lr"),          scalar_input<T>(c, 6, "beta1"),
                        scalar_input<T>(c, 7, "beta2"),       scalar_input<T>(c, 8, "epsilon")};
    const bool nesterov = c.node.attr_or<bool>("use_nesterov", false);
    run_update<T>(c, 9, [&] {
      return adam_rule<T>{ref_data<T>(c, 0), ref_data<T>(c, 1), ref_data<T>(c, 2), p, nesterov};
    });
  }
};

template <class T> struct apply_rms_prop_gpu {
  static void run(kernel_context& c) {
    const T* lr = scalar_input<T>(c, 3, "lr");
    const T* rho = scalar_input<T>(c, 4, "rho");
    const T* momentum = scalar_input<T>(c, 5, "momentum");
    const T* epsilon = scalar_input<T>(c, 6, "epsilon");
    run_update<T>(c, 7, [&] {
      return rms_prop_rule<T>{
          ref_data<T>(c, 0), ref_data<T>(c, 1), ref_data<T>(c, 2), lr, rho, momentum, epsilon};
    });
  }
};

// Inputs (var, accum, linear, grad, lr, l1, l2, l2_shrinkage, lr_power[, indices]).
template <class T> struct apply_ftrl_gpu {
  static void run(kernel_context& c) {
    const T* lr = scalar_input<T>(c, 4, "lr");
    const T* l1 = scalar_input<T>(c, 5, "l1");
    const T* l2 = scalar_input<T>(c, 6, "l2");
    const T* shrinkage = scalar_input<T>(c, 7, "l2_shrinkage");
    const T* lr_power = scalar_input<T>(c, 8, "lr_power");
    run_update<T>(c, 3, [&] {
      return ftrl_rule<T>{ref_data<T>(c, 0), ref_data<T>(c, 1), ref_data<T>(c, 2), lr, l1, l2,
                          shrinkage,         lr_power};
    });
  }
};

// Registers `Kernel` for the dense op and its sparse twin (run_update tells them apart).
template <template <class> class Kernel> void register_update_gpu(const char* op) {
  register_kernels<Kernel>(op, floating_types{}, device_gpu);
  register_kernels<Kernel>(loom::detail::sparse_apply_op(op), floating_types{}, device_gpu);
}

inline bool register_training_gpu() {
  register_update_gpu<apply_gradient_descent_gpu>("apply_gradient_descent");
  register_update_gpu<apply_momentum_gpu>("apply_momentum");
  register_update_gpu<apply_adagrad_gpu>("apply_adagrad");
  register_update_gpu<apply_adam_gpu>("apply_adam");
  register_update_gpu<apply_rms_prop_gpu>("apply_rms_prop");
  register_update_gpu<apply_ftrl_gpu>("apply_ftrl");
  return true;
}

inline const bool training_gpu_registered = register_training_gpu();

} // namespace loom::kernels::cuda_kernels

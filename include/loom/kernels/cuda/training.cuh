// GPU kernels of the optimizer updates (kernels/cpu/training.hpp on the CPU),
// with TF's formulas: each updates the variable and its slots in this GPU's
// memory, in place unless something else holds their buffers (prepare_update),
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

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace loom::kernels::cuda_kernels {

// The CPU's begin_update on this GPU, under the refs' locks: check the inputs
// (the CPU's messages) and that every ref lives on this GPU; own the buffers the
// update writes, a shared one copied on this GPU's stream (unshare_refs).
inline void prepare_update(const kernel_context& c, const any_tensor& grad) {
  loom::kernels::check_apply_inputs(c, grad);
  for (std::size_t k = 0; k < c.refs.size(); ++k)
    check_on_gpu(c, c.refs[k]->value,
                 (k == 0 ? "variable '" : "slot '") + apply_ref_name(c.node, k) + "'");
  const gpu_context& g = gpu_of(c);
  loom::kernels::unshare_refs(c, [&g](const any_tensor& t) { return g.clone(t); });
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
// (run_dense_updates, run_sparse_update), as on the CPU.

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

// A sparse update (sparse_apply_*: inputs as the dense op's with the gradient's rows at
// `grad_input`, the indices last), the CPU's run_update on this GPU: under the locks, the
// CPU's checks, every ref on this GPU, the indices checked on their host copy; then the rule
// over the distinct rows, in place (as on the CPU, no copy of the variable). make() gives
// the rule once the refs are settled.
template <class T, class Make>
void run_sparse_update(kernel_context& c, std::size_t grad_input, Make&& make) {
  const any_tensor& grad = c.input(grad_input);
  const gpu_context& g = gpu_of(c);
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

// -- the updates: each optimizer's inputs and rule --------------------------------------------
// Each gives the index of its gradient input and rule(c), its rule over the node's refs
// and scalar inputs (called once the refs are settled). update_gpu makes the kernels.

template <class T> struct gradient_descent_update { // (var, alpha, grad)
  static constexpr std::size_t grad_input = 2;
  static gradient_descent_rule<T> rule(const kernel_context& c) {
    return {ref_data<T>(c, 0), scalar_input<T>(c, 1, "alpha")};
  }
};

template <class T> struct momentum_update { // (var, accum, lr, grad, momentum)
  static constexpr std::size_t grad_input = 3;
  static momentum_rule<T> rule(const kernel_context& c) {
    return {ref_data<T>(c, 0), ref_data<T>(c, 1), scalar_input<T>(c, 2, "lr"),
            scalar_input<T>(c, 4, "momentum"), c.node.attr_or<bool>("use_nesterov", false)};
  }
};

template <class T> struct adagrad_update { // (var, accum, lr, grad)
  static constexpr std::size_t grad_input = 3;
  static adagrad_rule<T> rule(const kernel_context& c) {
    return {ref_data<T>(c, 0), ref_data<T>(c, 1), scalar_input<T>(c, 2, "lr")};
  }
};

// Sparse: TF's LazyAdam (m and v of the rows a step touches only), as on the CPU.
template <class T> struct adam_update { // (var, m, v, beta1_power, beta2_power, lr, ..., grad)
  static constexpr std::size_t grad_input = 9;
  static adam_rule<T> rule(const kernel_context& c) {
    const adam_params p{scalar_input<T>(c, 3, "beta1_power"), scalar_input<T>(c, 4, "beta2_power"),
                        scalar_input<T>(c, 5, "lr"),          scalar_input<T>(c, 6, "beta1"),
                        scalar_input<T>(c, 7, "beta2"),       scalar_input<T>(c, 8, "epsilon")};
    return {ref_data<T>(c, 0), ref_data<T>(c, 1), ref_data<T>(c, 2), p,
            c.node.attr_or<bool>("use_nesterov", false)};
  }
};

template <class T> struct rms_prop_update { // (var, ms, mom, lr, rho, momentum, epsilon, grad)
  static constexpr std::size_t grad_input = 7;
  static rms_prop_rule<T> rule(const kernel_context& c) {
    return {ref_data<T>(c, 0),
            ref_data<T>(c, 1),
            ref_data<T>(c, 2),
            scalar_input<T>(c, 3, "lr"),
            scalar_input<T>(c, 4, "rho"),
            scalar_input<T>(c, 5, "momentum"),
            scalar_input<T>(c, 6, "epsilon")};
  }
};

// Inputs (var, accum, linear, grad, lr, l1, l2, l2_shrinkage, lr_power[, indices]).
template <class T> struct ftrl_update {
  static constexpr std::size_t grad_input = 3;
  static ftrl_rule<T> rule(const kernel_context& c) {
    return {ref_data<T>(c, 0),
            ref_data<T>(c, 1),
            ref_data<T>(c, 2),
            scalar_input<T>(c, 4, "lr"),
            scalar_input<T>(c, 5, "l1"),
            scalar_input<T>(c, 6, "l2"),
            scalar_input<T>(c, 7, "l2_shrinkage"),
            scalar_input<T>(c, 8, "lr_power")};
  }
};

// -- dense updates: one launch for one or many (PyTorch's fused optimizers) -----------------
// A dense update (apply_*) runs its rule over every element of its variable. The updates of
// a step's variables on one GPU, ready together, run as one launch: each variable gets a
// range of its blocks, and each thread applies the rule to the elements of its variable it
// strides over. Per launch at most `per_launch` variables, as their rules travel in the
// kernel's parameters (4 KiB). One update alone is a batch of one: each element's
// arithmetic is the same either way, and so are the results, to the bit.
template <class T, class Rule> struct rule_batch {
  static constexpr int per_launch = 24;
  Rule rule[per_launch];
  const T* grad[per_launch];
  std::int64_t size[per_launch];
  unsigned first_block[per_launch + 1]; // variable e owns blocks [first_block[e], [e + 1])
  int count;
};

template <class T, class Rule> __global__ void batch_rule_kernel(const rule_batch<T, Rule> b) {
  int e = 0;
  while (e + 1 < b.count && blockIdx.x >= b.first_block[e + 1])
    ++e;
  const auto apply = b.rule[e].load();
  const T* grad = b.grad[e];
  const std::int64_t stride =
      static_cast<std::int64_t>(b.first_block[e + 1] - b.first_block[e]) * blockDim.x;
  for (std::int64_t i =
           static_cast<std::int64_t>(blockIdx.x - b.first_block[e]) * blockDim.x + threadIdx.x;
       i < b.size[e]; i += stride)
    apply(i, grad[i]);
}

// The dense updates of `cs` (each node's kernel_context, one op and dtype), as one launch
// per rule_batch::per_launch of them, under all their refs' locks, taken in one address
// order (a lock at a time would deadlock against another step's batch); each owns the
// buffers it writes first (prepare_update). A variable that two of them update (two
// optimizers of one step) is updated by each in turn, as alone.
template <class T, class Update> void run_dense_updates(std::span<kernel_context* const> cs) {
  std::vector<std::mutex*> mutexes;
  for (const kernel_context* c : cs)
    for (variable_resource* r : c->refs)
      mutexes.push_back(&r->mu);
  std::sort(mutexes.begin(), mutexes.end(), std::less<>{});
  if (std::adjacent_find(mutexes.begin(), mutexes.end()) != mutexes.end()) {
    for (kernel_context* c : cs) {
      kernel_context* const alone[] = {c};
      run_dense_updates<T, Update>(alone);
    }
    return;
  }
  std::vector<std::unique_lock<std::mutex>> locks;
  locks.reserve(mutexes.size());
  for (std::mutex* m : mutexes)
    locks.emplace_back(*m);
  using batch = rule_batch<T, decltype(Update::rule(*cs[0]))>;
  batch b{};
  const auto launch = [&] {
    if (b.count == 0)
      return;
    batch_rule_kernel<T><<<b.first_block[b.count], block_threads, 0, gpu_of(*cs[0]).stream>>>(b);
    check_launch();
    b.count = 0;
  };
  for (kernel_context* c : cs) {
    const any_tensor& grad = c->input(Update::grad_input);
    prepare_update(*c, grad);
    c->output = c->refs[0]->value;
    const std::int64_t n = c->refs[0]->value.num_elements();
    if (n == 0)
      continue;
    const int e = b.count++;
    b.rule[e] = Update::rule(*c);
    b.grad[e] = grad.template device_data<T>();
    b.size[e] = n;
    b.first_block[e + 1] = b.first_block[e] + grid_for(n);
    if (b.count == batch::per_launch)
      launch();
  }
  launch();
}

// An update's kernels: its dense op and sparse twin one node at a time, and its dense op's
// batch kernel.
template <template <class> class Update> struct update_gpu {
  template <class T> struct kernel {
    static void run(kernel_context& c) {
      if (c.node.op.rfind("sparse_", 0) == 0) {
        run_sparse_update<T>(c, Update<T>::grad_input, [&c] { return Update<T>::rule(c); });
      } else {
        kernel_context* const alone[] = {&c};
        run_dense_updates<T, Update<T>>(alone);
      }
    }
    static void run_batch(std::span<kernel_context* const> cs) {
      run_dense_updates<T, Update<T>>(cs);
    }
  };
};

template <template <class> class Update> void register_update_gpu(const char* op) {
  using update = update_gpu<Update>;
  register_kernels<update::template kernel>(op, floating_types{}, device_gpu);
  register_kernels<update::template kernel>(loom::detail::sparse_apply_op(op), floating_types{},
                                            device_gpu);
  [op]<class... Ts>(type_list<Ts...>) {
    (kernel_registry::instance().add_batch(op, dtype_of<Ts>, device_gpu,
                                           &update::template kernel<Ts>::run_batch),
     ...);
  }(floating_types{});
}

inline bool register_training_gpu() {
  register_update_gpu<gradient_descent_update>("apply_gradient_descent");
  register_update_gpu<momentum_update>("apply_momentum");
  register_update_gpu<adagrad_update>("apply_adagrad");
  register_update_gpu<adam_update>("apply_adam");
  register_update_gpu<rms_prop_update>("apply_rms_prop");
  register_update_gpu<ftrl_update>("apply_ftrl");
  return true;
}

inline const bool training_gpu_registered = register_training_gpu();

} // namespace loom::kernels::cuda_kernels

// CPU kernels of the optimizer updates, with TF's exact formulas
// (tensorflow/core/kernels/training_ops.cc). They update the variable and its
// slots in place unless something else holds their buffers (begin_update),
// and output the variable's buffer, as TF's ref outputs do.
#pragma once

#include <loom/kernels/checks/training.hpp>
#include <loom/kernels/cpu/array.hpp>
#include <loom/kernels/registry.hpp>

#include <array>
#include <cmath>

namespace loom::kernels {

// A hyperparameter input's value; TF accepts only scalars.
template <class T> T apply_scalar(const kernel_context& c, std::size_t i, const char* what) {
  return *apply_scalar_input(c, i, what).data<T>();
}

// The elements [first, first + len) of a tensor as an Eigen array, for the update rules
// below: each runs all of its statements on one chunk before the next, so the variable and
// its slots pass through the cache once per step. Where len is a compile-time constant (a
// sparse update's row of one of with_row_width's widths) the array has that fixed size and
// a rule compiles to a few vector instructions per row, with no loop to set up.
template <class Len> constexpr Eigen::Index chunk_size() {
  if constexpr (std::is_integral_v<Len>)
    return Eigen::Dynamic;
  else
    return Len::value;
}
// The most elements a dense update gives its rule at once: 1024 floats of the variable,
// its slots and the gradient (Adam's five arrays: 20 KiB) stay in a core's L1d from the
// rule's first statement to its last.
inline constexpr Eigen::DenseIndex dense_rule_block = 1024;

template <class T, class Len>
Eigen::Map<Eigen::Array<T, chunk_size<Len>(), 1>> chunk(T* elements, Eigen::DenseIndex first,
                                                        Len len) {
  return {elements + first, static_cast<Eigen::Index>(len)};
}
template <class T, class Len>
Eigen::Map<const Eigen::Array<T, chunk_size<Len>(), 1>> chunk(const T* elements,
                                                              Eigen::DenseIndex first, Len len) {
  return {elements + first, static_cast<Eigen::Index>(len)};
}

// Runs update(first, len) over a variable's elements on the pool; `tensors` is
// how many tensors of T each element touches.
template <class T, class F> void update_chunks(const kernel_context& c, int tensors, F&& update) {
  const auto n = static_cast<Eigen::DenseIndex>(c.refs[0]->value.num_elements());
  const Eigen::TensorOpCost cost(static_cast<double>(tensors) * sizeof(T), 2.0 * sizeof(T),
                                 4.0 * tensors);
  parallel_chunks(c.device, n, cost, std::forward<F>(update));
}

// What a dense update does before it writes: take the locks, check the
// inputs and own the buffers it writes (unshare_refs). The locks are held
// until the update is done.
[[nodiscard]] inline apply_locks begin_update(const kernel_context& c, const any_tensor& grad) {
  apply_locks lock(c.refs);
  check_apply_inputs(c, grad);
  unshare_refs(c, [](const any_tensor& t) { return t.clone(); });
  return lock;
}

// The elements an update rule writes: the variable's (0) and its slots' (1, ...),
// as pointers read once per update, not once per row.
template <class T> class update_targets {
public:
  explicit update_targets(const kernel_context& c) {
    for (std::size_t k = 0; k < c.refs.size(); ++k)
      t_[k] = c.refs[k]->value.data<T>();
  }
  T* operator[](std::size_t k) const { return t_[k]; }

private:
  std::array<T*, 4> t_{}; // the most an update has: a variable and 3 slots
};

// Runs an update over its variable. `rule(t, at, grad, grad_at, len)` updates
// the elements [at, at + len) of t[0] (the variable) and its slots t[1...]
// from the gradient's elements [grad_at, grad_at + len); `tensors` is how many
// tensors of T it touches per element.
//
// Dense (apply_*): every element, the gradient at the same offsets, on the
// pool. Sparse (sparse_apply_*): the gradient's rows are summed per distinct
// index; then the rule runs on each touched row of the variable and its slots
// where it is, with the row's length a compile-time constant at the usual
// widths (with_row_width): a rule over Eigen expressions of a dynamic length
// per row costs more in set-up than the arithmetic of 1 to 64 elements (it
// was 10 % of examples/ctr's time), and gathering the rows into blocks for
// one call cost a copy of every row both ways. Rows ahead are prefetched: a
// large table's rows are cache misses. A sparse update writes its rows in
// place, as TF's do: copying a table whose few rows a step changes would cost
// the whole table per step. A step that read the variable (a gather copies
// its rows under the variable's lock; a fetch of the whole variable is a
// copy) keeps what it read.
template <class T, class Rule>
void run_update(kernel_context& c, std::size_t grad_input, int tensors, Rule&& rule) {
  const any_tensor& grad = c.input(grad_input);
  variable_resource& var = *c.refs[0];
  if (c.node.op.rfind("sparse_", 0) != 0) {
    const apply_locks lock = begin_update(c, grad);
    var.changes.reset(); // every row changes
    const update_targets<T> targets(c);
    update_chunks<T>(c, tensors, [&](Eigen::DenseIndex f, Eigen::DenseIndex len) {
      // A rule is several Eigen statements over its elements (Adam's: m, then v, then the
      // variable). Over a pool's chunk of a large variable (a quarter of a thread's share)
      // each statement streamed the chunk from memory again; over blocks this small the
      // later statements find the earlier ones' elements in L1.
      for (Eigen::DenseIndex b = f; b < f + len; b += dense_rule_block)
        rule(targets, b, grad.data<T>(), b, std::min(dense_rule_block, f + len - b));
    });
    c.output = var.value;
    return;
  }
  const any_tensor& indices = c.input(c.inputs.size() - 1); // the sparse twin's last input
  const apply_locks lock(c.refs);
  check_sparse_apply_inputs(c, grad, indices);
  const std::int64_t rows = var.value.shape()[0];
  const std::int64_t row = rows == 0 ? 0 : var.value.num_elements() / rows;
  const std::int64_t n = indices.num_elements();
  with_ids(indices, [&](const auto* id) {
    check_id_range(c.node, id, n, rows, false,
                   [&] { return "variable '" + apply_ref_name(c.node, 0) + "'"; });
    using I = std::remove_cvref_t<decltype(*id)>;
    std::vector<I> distinct;
    const std::vector<std::int32_t> slot = unique_positions<I>(id, n, &distinct);
    const auto u = static_cast<std::int64_t>(distinct.size());
    any_tensor summed = grad; // row k: the sum of distinct[k]'s rows
    if (u != n) {
      summed = any_tensor(grad.type(), loom::shape{u, row});
      T* out = summed.data<T>();
      std::fill_n(out, u * row, T(0));
      with_row_width<T>(row, [&](auto width_constant) {
        const std::int64_t width = width_constant; // a constant where with_row_width makes one
        for (std::int64_t k = 0; k < n; ++k)
          add_row(out + slot[static_cast<std::size_t>(k)] * width, grad.data<T>() + k * width,
                  width_constant);
      });
    }
    if (var.changes) // an incremental checkpoint follows this variable
      for (const I r : distinct)
        var.changes->mark(static_cast<std::int64_t>(r));
    const update_targets<T> targets(c);
    const T* summed_rows = summed.data<T>();
    with_row_width<T>(row, [&](auto width) {
      const Eigen::TensorOpCost per_row(static_cast<double>(2 * tensors * row) * sizeof(T),
                                        static_cast<double>(tensors * row) * sizeof(T),
                                        4.0 * static_cast<double>(tensors * row));
      parallel_for(c.device, u, per_row, [&](Eigen::Index first, Eigen::Index last) {
        for (Eigen::Index r = first; r < last; ++r) {
          if (r + rows_ahead < last)
            for (std::size_t k = 0; k < c.refs.size(); ++k)
              prefetch_row(targets[k] + static_cast<std::int64_t>(
                                            distinct[static_cast<std::size_t>(r + rows_ahead)]) *
                                            width,
                           width);
          rule(targets,
               static_cast<Eigen::DenseIndex>(
                   static_cast<std::int64_t>(distinct[static_cast<std::size_t>(r)]) * width),
               summed_rows, static_cast<Eigen::DenseIndex>(r * width), width);
        }
      });
    });
  });
  c.output = var.value;
}

template <class T> struct apply_gradient_descent_cpu {
  static void run(kernel_context& c) {
    const T alpha = apply_scalar<T>(c, 1, "alpha");
    run_update<T>(c, 2, 2, [&](const auto& t, auto at, const T* g, auto g_at, auto len) {
      chunk<T>(t[0], at, len) -= chunk<T>(g, g_at, len) * alpha;
    });
  }
};

template <class T> struct apply_momentum_cpu {
  static void run(kernel_context& c) {
    const T lr = apply_scalar<T>(c, 2, "lr");
    const T momentum = apply_scalar<T>(c, 4, "momentum");
    const bool nesterov = c.node.attr_or<bool>("use_nesterov", false);
    run_update<T>(c, 3, 3, [&](const auto& t, auto at, const T* g, auto g_at, auto len) {
      auto w = chunk<T>(t[0], at, len);
      auto accum = chunk<T>(t[1], at, len);
      const auto grad = chunk<T>(g, g_at, len);
      accum = accum * momentum + grad;
      if (nesterov)
        w -= grad * lr + accum * momentum * lr;
      else
        w -= accum * lr;
    });
  }
};

template <class T> struct apply_adagrad_cpu {
  static void run(kernel_context& c) {
    const T lr = apply_scalar<T>(c, 2, "lr");
    run_update<T>(c, 3, 3, [&](const auto& t, auto at, const T* g, auto g_at, auto len) {
      auto w = chunk<T>(t[0], at, len);
      auto accum = chunk<T>(t[1], at, len);
      const auto grad = chunk<T>(g, g_at, len);
      accum += grad.square();
      w -= grad * lr * accum.rsqrt();
    });
  }
};

// Sparse: TF's LazyAdam (m and v of the rows a step touches only).
template <class T> struct apply_adam_cpu {
  static void run(kernel_context& c) {
    const T beta1_power = apply_scalar<T>(c, 3, "beta1_power");
    const T beta2_power = apply_scalar<T>(c, 4, "beta2_power");
    const T lr = apply_scalar<T>(c, 5, "lr");
    const T beta1 = apply_scalar<T>(c, 6, "beta1");
    const T beta2 = apply_scalar<T>(c, 7, "beta2");
    const T epsilon = apply_scalar<T>(c, 8, "epsilon");
    const bool nesterov = c.node.attr_or<bool>("use_nesterov", false);
    const T alpha = lr * std::sqrt(T(1) - beta2_power) / (T(1) - beta1_power);
    run_update<T>(c, 9, 4, [&](const auto& t, auto at, const T* g, auto g_at, auto len) {
      auto w = chunk<T>(t[0], at, len);
      auto m = chunk<T>(t[1], at, len);
      auto v = chunk<T>(t[2], at, len);
      const auto grad = chunk<T>(g, g_at, len);
      m += (grad - m) * (T(1) - beta1);
      v += (grad.square() - v) * (T(1) - beta2);
      if (nesterov)
        w -= ((grad * (T(1) - beta1) + m * beta1) * alpha) / (v.sqrt() + epsilon);
      else
        w -= (m * alpha) / (v.sqrt() + epsilon);
    });
  }
};

template <class T> struct apply_rms_prop_cpu {
  static void run(kernel_context& c) {
    const T lr = apply_scalar<T>(c, 3, "lr");
    const T rho = apply_scalar<T>(c, 4, "rho");
    const T momentum = apply_scalar<T>(c, 5, "momentum");
    const T epsilon = apply_scalar<T>(c, 6, "epsilon");
    run_update<T>(c, 7, 4, [&](const auto& t, auto at, const T* g, auto g_at, auto len) {
      auto w = chunk<T>(t[0], at, len);
      auto ms = chunk<T>(t[1], at, len);
      auto mom = chunk<T>(t[2], at, len);
      const auto grad = chunk<T>(g, g_at, len);
      ms += (grad.square() - ms) * (T(1) - rho);
      mom = mom * momentum + (grad * lr) / (ms + epsilon).sqrt();
      w -= mom;
    });
  }
};

// FTRL-Proximal, TF's ApplyFtrlV2 (l2_shrinkage 0 is ApplyFtrl).
template <class T> struct apply_ftrl_cpu {
  static void run(kernel_context& c) {
    const T lr = apply_scalar<T>(c, 4, "lr");
    const T l1 = apply_scalar<T>(c, 5, "l1");
    const T l2 = apply_scalar<T>(c, 6, "l2");
    const T shrinkage = apply_scalar<T>(c, 7, "l2_shrinkage");
    const T lr_power = apply_scalar<T>(c, 8, "lr_power");
    const bool root = lr_power == T(-0.5); // TF's special case: sqrt, not pow
    const auto power = [&](T x) { return root ? std::sqrt(x) : std::pow(x, -lr_power); };
    run_update<T>(c, 3, 4, [&](const auto& t, auto at, const T* g, auto g_at, auto len) {
      // Element by element: FTRL's branch per element needs no temporaries.
      T* w = t[0] + at;
      T* accum = t[1] + at;
      T* linear = t[2] + at;
      const T* grad = g + g_at;
      for (Eigen::DenseIndex j = 0; j < len; ++j) {
        const T new_accum = accum[j] + grad[j] * grad[j];
        const T new_power = power(new_accum);
        linear[j] += grad[j] + T(2) * shrinkage * w[j] - (new_power - power(accum[j])) / lr * w[j];
        const T quadratic = new_power / lr + T(2) * l2;
        w[j] = std::abs(linear[j]) > l1 ? ((linear[j] > T(0) ? l1 : -l1) - linear[j]) / quadratic
                                        : T(0);
        accum[j] = new_accum;
      }
    });
  }
};

// Registers `Kernel` for the dense op and its sparse twin (run_update tells them apart).
template <template <class> class Kernel> void register_update_kernels(const char* op) {
  register_kernels<Kernel>(op, floating_types{});
  register_kernels<Kernel>(detail::sparse_apply_op(op), floating_types{});
}

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_training_kernels() {
  register_update_kernels<apply_gradient_descent_cpu>("apply_gradient_descent");
  register_update_kernels<apply_momentum_cpu>("apply_momentum");
  register_update_kernels<apply_adagrad_cpu>("apply_adagrad");
  register_update_kernels<apply_adam_cpu>("apply_adam");
  register_update_kernels<apply_rms_prop_cpu>("apply_rms_prop");
  register_update_kernels<apply_ftrl_cpu>("apply_ftrl");
  return true;
}

inline const bool training_kernels_registered = register_training_kernels();
#endif

} // namespace loom::kernels

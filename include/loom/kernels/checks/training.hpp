// The host-side part of the optimizer updates that the CPU kernels
// (kernels/cpu/training.hpp) and the GPU kernels (kernels/cuda/training.cuh)
// share: the locks an update holds and the checks of its inputs, with their
// messages. Host code only (no Eigen evaluation), so nvcc compiles it too.
#pragma once

#include <loom/graph/ops/training.hpp>
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace loom::kernels {

// Holds the mutexes of one update's variable and slots for the duration of the
// update, and nothing longer: updates of different variables never wait on
// each other (TF's use_locking=false), but one update never interleaves with
// another update or an assign of the same variable. Mutexes are taken in
// address order so two updates sharing a slot cannot deadlock. A GPU update is
// queued on its stream before they are released, so any later reader or
// update of the variable is ordered after it.
class apply_locks : public ordered_locks {
public:
  explicit apply_locks(std::span<variable_resource* const> refs) {
    for (variable_resource* r : refs)
      add(r->mu);
    lock();
  }
};

// The name of an update's ref input k (its variable for k = 0, else a slot),
// as the graph recorded it, for messages.
inline std::string apply_ref_name(const node_def& n, std::size_t k) {
  return n.attr_or<std::string>(detail::apply_ref_attr(k), "input " + std::to_string(k));
}

// Checks, under the locks, that every ref is initialised and every slot has
// the variable's shape; errors name the variables.
inline void check_apply_refs(const kernel_context& c) {
  const node_def& n = c.node;
  for (std::size_t k = 0; k < c.refs.size(); ++k)
    if (!c.refs[k]->initialized)
      throw failed_precondition_error("node " + n.describe() +
                                      ": attempting to use uninitialized variable '" +
                                      apply_ref_name(n, k) +
                                      "' (run its initializer, or global_variables_initializer, "
                                      "first)");
  const any_tensor& var = c.refs[0]->value;
  for (std::size_t k = 1; k < c.refs.size(); ++k)
    if (c.refs[k]->value.shape() != var.shape())
      throw invalid_argument_error("node " + n.describe() + ": slot '" + apply_ref_name(n, k) +
                                   "' has shape " + c.refs[k]->value.shape().to_string() +
                                   ", but variable '" + apply_ref_name(n, 0) + "' has shape " +
                                   var.shape().to_string());
}

// The same, and a dense gradient of the variable's shape.
inline void check_apply_inputs(const kernel_context& c, const any_tensor& grad) {
  check_apply_refs(c);
  const any_tensor& var = c.refs[0]->value;
  if (grad.shape() != var.shape())
    throw invalid_argument_error(
        "node " + c.node.describe() + ": the gradient has shape " + grad.shape().to_string() +
        ", but variable '" + apply_ref_name(c.node, 0) + "' has shape " + var.shape().to_string());
}

// The same for a sparse update: the gradient's rows have the indices' shape
// followed by a row of the variable.
inline void check_sparse_apply_inputs(const kernel_context& c, const any_tensor& rows,
                                      const any_tensor& indices) {
  check_apply_refs(c);
  const any_tensor& var = c.refs[0]->value;
  if (var.rank() < 1)
    throw invalid_argument_error("node " + c.node.describe() + ": variable '" +
                                 apply_ref_name(c.node, 0) +
                                 "' is a scalar; a sparse update needs rows");
  std::vector<std::int64_t> want = indices.shape().dims();
  want.insert(want.end(), var.shape().dims().begin() + 1, var.shape().dims().end());
  if (rows.shape() != loom::shape(want))
    throw invalid_argument_error(
        "node " + c.node.describe() + ": the gradient's rows have shape " +
        rows.shape().to_string() + ", but indices of shape " + indices.shape().to_string() +
        " into variable '" + apply_ref_name(c.node, 0) + "' of shape " + var.shape().to_string() +
        " need " + loom::shape(want).to_string());
}

// Copy-on-write, under the locks: a ref whose buffer something else still
// holds (a value read earlier in this step, a send still on the wire, a
// fetch) is replaced by copy(buffer) before the update writes it. So every
// reader keeps the value it read, whole, and no update writes memory another
// thread reads (TF's resource variables do the same: PrepareToUpdateVariable).
// In the usual step nothing else holds it and the update stays in place.
template <class Copy> void unshare_refs(const kernel_context& c, Copy&& copy) {
  for (variable_resource* r : c.refs)
    if (!r->value.sole_owner())
      r->value = copy(r->value);
}

// A hyperparameter input (lr, beta1, ...), checked to be a scalar as TF
// requires; the kernel reads its value wherever it lives.
inline const any_tensor& apply_scalar_input(const kernel_context& c, std::size_t i,
                                            const char* what) {
  const any_tensor& t = c.input(i);
  if (t.rank() != 0)
    throw invalid_argument_error("node " + c.node.describe() + ": " + what +
                                 " is not a scalar: " + t.shape().to_string());
  return t;
}

} // namespace loom::kernels

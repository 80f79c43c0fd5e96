// Op definitions of the optimizer updates (TF's training_ops): each takes the
// variable and its slots as references, its hyperparameters as scalar inputs
// (so a learning rate may be a fed placeholder or a decaying tensor) and the
// gradient, updates the variable in place and outputs its new value.
//
// Each has a sparse twin, "sparse_<op>" (TF's SparseApply*), for a gradient
// given as rows and their indices (an indexed_slices): inputs as the dense
// op's with the gradient's rows in its place, and the indices appended. It
// updates only the rows the indices name, of the variable and of every slot
// (for Adam, TF's LazyAdam); repeated indices are summed first.
#pragma once

#include <loom/graph/op_registry.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace loom::detail {

struct apply_op_signature {
  const char* op;
  std::vector<const char*> inputs; // names for messages, in input order
  std::size_t refs;                // the first `refs` inputs are the variable and its slots
  std::size_t grad;                // the gradient's input, which also selects the kernel's dtype
};

inline const std::vector<apply_op_signature>& apply_op_signatures() {
  static const std::vector<apply_op_signature> sigs{
      {"apply_gradient_descent", {"var", "alpha", "delta"}, 1, 2},
      {"apply_momentum", {"var", "accum", "lr", "grad", "momentum"}, 2, 3},
      {"apply_adagrad", {"var", "accum", "lr", "grad"}, 2, 3},
      {"apply_adam",
       {"var", "m", "v", "beta1_power", "beta2_power", "lr", "beta1", "beta2", "epsilon", "grad"},
       3,
       9},
      {"apply_rms_prop", {"var", "ms", "mom", "lr", "rho", "momentum", "epsilon", "grad"}, 3, 7},
      {"apply_ftrl",
       {"var", "accum", "linear", "grad", "lr", "l1", "l2", "l2_shrinkage", "lr_power"},
       3,
       3},
  };
  return sigs;
}

// The key under which an apply node records the name of its ref input k:
// kernels see only the node, and their errors must name the variable.
inline std::string apply_ref_attr(std::size_t k) {
  return "_ref_name_" + std::to_string(k);
}

inline std::string sparse_apply_op(const char* op) {
  return std::string("sparse_") + op;
}

inline void infer_apply(const apply_op_signature& sig, bool sparse, node_def& n,
                        const std::vector<const node_def*>& in) {
  const node_def& var = *in[0];
  auto fail = [&](const std::string& what) {
    throw invalid_argument_error("node " + n.describe() + ": " + what);
  };
  if (var.type != dtype::f32 && var.type != dtype::f64)
    fail("variable '" + var.name + "' is " + std::string(to_string(var.type)) +
         "; optimizers update float32 or float64 variables");
  for (std::size_t k = 0; k < sig.refs; ++k) {
    const node_def& r = *in[k];
    if (r.op != "variable")
      fail(std::string("input '") + sig.inputs[k] + "' " + r.describe() + " is not a variable");
    for (std::size_t j = 0; j < k; ++j)
      if (in[j]->id == r.id)
        fail("variable '" + r.name + "' is passed as both '" + sig.inputs[j] + "' and '" +
             sig.inputs[k] + "'");
    if (!(r.shape == var.shape))
      fail(std::string("slot '") + sig.inputs[k] + "' (variable '" + r.name + "') has shape " +
           r.shape.to_string() + ", but variable '" + var.name + "' has shape " +
           var.shape.to_string());
    n.attrs[apply_ref_attr(k)] = r.name;
  }
  const std::size_t data_inputs = sig.inputs.size(); // the sparse twin's indices come after
  for (std::size_t i = 0; i < data_inputs; ++i) {
    if (in[i]->type != var.type)
      fail(std::string("input '") + sig.inputs[i] + "' " + in[i]->describe() + " is " +
           std::string(to_string(in[i]->type)) + ", but variable '" + var.name + "' is " +
           std::string(to_string(var.type)));
    if (i >= sig.refs && i != sig.grad && in[i]->shape.rank() != 0)
      fail(std::string("'") + sig.inputs[i] + "' must be a scalar, got shape " +
           in[i]->shape.to_string() + " from " + in[i]->describe());
  }
  const node_def& grad = *in[sig.grad];
  if (sparse) {
    const node_def& indices = *in[data_inputs];
    if (indices.type != dtype::i32 && indices.type != dtype::i64)
      fail("the indices " + indices.describe() + " must be int32 or int64, not " +
           std::string(to_string(indices.type)));
    if (var.shape.rank() < 1)
      fail("variable '" + var.name + "' is a scalar; a sparse update needs rows");
    std::vector<std::int64_t> rows = indices.shape.dims();
    rows.insert(rows.end(), var.shape.dims().begin() + 1, var.shape.dims().end());
    if (!grad.shape.compatible_with(loom::shape(rows)))
      fail("the gradient's rows " + grad.describe() + " have shape " + grad.shape.to_string() +
           ", but indices of shape " + indices.shape.to_string() + " into variable '" + var.name +
           "' of shape " + var.shape.to_string() + " need " + loom::shape(rows).to_string());
  } else if (!grad.shape.compatible_with(var.shape)) {
    fail("the gradient " + grad.describe() + " has shape " + grad.shape.to_string() +
         ", but variable '" + var.name + "' has shape " + var.shape.to_string());
  }
  n.type = var.type;
  n.shape = var.shape;
  // The update runs where its variable lives (and with it every slot, which
  // the optimizer colocates with the variable).
  n.colocation_group = var.colocation();
}

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_training_ops() {
  auto& r = op_registry::instance();
  for (const apply_op_signature& sig : apply_op_signatures())
    for (const bool sparse : {false, true})
      r.add({.name = sparse ? sparse_apply_op(sig.op) : std::string(sig.op),
             .num_inputs = static_cast<int>(sig.inputs.size() + (sparse ? 1 : 0)),
             .infer =
                 [&sig, sparse](node_def& n, const std::vector<const node_def*>& in) {
                   infer_apply(sig, sparse, n, in);
                 },
             .stateful = true,
             .ref_inputs = (1u << sig.refs) - 1u,
             .type_input = static_cast<int>(sig.grad)});
  return true;
}

inline const bool training_ops_registered = register_training_ops();
#endif

} // namespace loom::detail

// Op definitions of sources, state and plumbing: constant, fill, placeholder,
// variable, assign / assign_add / assign_sub, identity, no_op, zeros_like,
// ones_like, sum_to_shape (the adjoint of broadcasting).
#pragma once

#include <loom/graph/builder.hpp>
#include <loom/graph/op_registry.hpp>

namespace loom::detail {

inline void infer_from_attrs(node_def& n, const std::vector<const node_def*>&) {
  n.type = n.attr<dtype>("dtype");
  n.shape = n.attr<loom::shape>("shape");
}

inline void infer_same_as_input(node_def& n, const std::vector<const node_def*>& in) {
  n.type = in[0]->type;
  n.shape = in[0]->shape;
}

inline void infer_assign(node_def& n, const std::vector<const node_def*>& in) {
  const node_def& var = *in[0];
  const node_def& value = *in[1];
  if (var.op != "variable")
    throw invalid_argument_error("node " + n.describe() + ": the first input " + var.describe() +
                                 " is not a variable");
  if (value.type != var.type)
    throw invalid_argument_error("node " + n.describe() + ": cannot assign " +
                                 std::string(to_string(value.type)) + " to variable '" + var.name +
                                 "' of dtype " + std::string(to_string(var.type)));
  const bool validate = n.attr_or<bool>("validate_shape", true);
  if (validate && !value.shape.compatible_with(var.shape))
    throw invalid_argument_error("node " + n.describe() + ": cannot assign a value of shape " +
                                 value.shape.to_string() + " to variable '" + var.name +
                                 "' of shape " + var.shape.to_string());
  n.type = var.type;
  n.shape = var.shape;
  n.colocation_group = var.colocation(); // updates run where their variable lives
  n.attrs["_ref_name_0"] = var.name;     // the kernel's errors name the variable
}

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_state_ops() {
  auto& r = op_registry::instance();
  r.add({.name = "constant",
         .num_inputs = 0,
         .infer =
             [](node_def& n, const std::vector<const node_def*>&) {
               const auto& v = n.attr<any_tensor>("value");
               n.type = v.type();
               n.shape = v.shape();
             },
         .type_input = -1});
  // A tensor of attr "shape" filled with attr "value": an initializer's
  // value made where it is used (on the variable's task), not shipped in the
  // graph as a constant of the variable's size. Stateful: two fills are never
  // merged (each stays with its own variable).
  r.add({.name = "fill",
         .num_inputs = 0,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               infer_from_attrs(n, in);
               if (!n.shape.fully_defined())
                 throw invalid_argument_error("node " + n.describe() + ": shape " +
                                              n.shape.to_string() + " is not fully defined");
             },
         .stateful = true,
         .type_input = -1});
  r.add({.name = "placeholder",
         .num_inputs = 0,
         .infer = infer_from_attrs,
         .stateful = true,
         .type_input = -1});
  r.add({.name = "variable",
         .num_inputs = 0,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               infer_from_attrs(n, in);
               if (!n.shape.fully_defined())
                 throw invalid_argument_error("variable '" + n.name +
                                              "' needs a fully defined "
                                              "shape, got " +
                                              n.shape.to_string());
               n.colocation_group = n.name;
             },
         .stateful = true,
         .type_input = -1});
  for (const char* name : {"assign", "assign_add", "assign_sub"})
    r.add({.name = name,
           .num_inputs = 2,
           .infer = infer_assign,
           .stateful = true,
           .ref_inputs = 1u,
           .type_input = 1});
  r.add({.name = "identity",
         .num_inputs = 1,
         .infer = infer_same_as_input,
         .gradient = [](graph&, const node_def&, node_id dy) { return std::vector{dy}; }});
  r.add({.name = "no_op",
         .num_inputs = 0,
         .infer = [](node_def& n, const std::vector<const node_def*>&) { n.shape = {}; },
         .stateful = true,
         .no_output = true,
         .type_input = -1});
  // Their values do not depend on the input's values: a zero gradient (no_node),
  // not "not differentiable", so second-order gradients can pass through them.
  for (const char* name : {"zeros_like", "ones_like"})
    r.add({.name = name,
           .num_inputs = 1,
           .infer = infer_same_as_input,
           .gradient = [](graph&, const node_def&, node_id) { return std::vector{no_node}; }});
  r.add({.name = "sum_to_shape",
         .num_inputs = 2,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               n.type = in[0]->type;
               n.shape = in[1]->shape;
             },
         .gradient =
             [](graph& g, const node_def& n, node_id dy) {
               // Broadcasting dy back: add it to zeros of the original shape.
               return std::vector{build::add(g, build::zeros_like(g, n.inputs[0]), dy), no_node};
             }});
  return true;
}

inline const bool state_ops_registered = register_state_ops();
#endif

} // namespace loom::detail

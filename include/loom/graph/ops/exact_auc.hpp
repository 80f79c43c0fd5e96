// Op definitions of the exact AUC's state (loom::metrics::exact_auc): every (label,
// prediction) pair seen, in a host resource beside an anchor variable (a metric's local
// variable, so a device setter places the pairs where it places the metric's variables, and
// every worker's updates reach one list):
//   exact_auc_update(anchor, labels, predictions)   appends the batch's pairs
//   exact_auc(anchor) -> the area under the ROC curve of every pair so far, ties counted half
//   exact_auc_reset(anchor)                         forgets them
// Kernels in kernels/cpu/exact_auc.hpp (CPU only: host state, as the accumulators').
#pragma once

#include <loom/graph/op_registry.hpp>
#include <loom/graph/ops/sync.hpp>

#include <string>
#include <vector>

namespace loom::detail {

#ifndef LOOM_COMPILED_KERNELS
inline bool register_exact_auc_ops() {
  auto& r = op_registry::instance();
  // Inputs (anchor, labels, predictions): labels and predictions float64 of one shape
  // (a label counts as positive where it is above 0.5).
  r.add({.name = "exact_auc_update",
         .num_inputs = 3,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               attach_to_variable(n, *in[0], "exact_auc");
               for (const node_def* v : {in[1], in[2]})
                 if (v->type != dtype::f64)
                   throw invalid_argument_error("node " + n.describe() +
                                                ": labels and predictions must be float64, got " +
                                                v->describe());
               if (!in[1]->shape.compatible_with(in[2]->shape))
                 throw invalid_argument_error("node " + n.describe() + ": labels " +
                                              in[1]->describe() + " and predictions " +
                                              in[2]->describe() + " differ in shape");
               n.type = dtype::f64;
               n.shape = {};
             },
         .stateful = true,
         .ref_inputs = 1u,
         .no_output = true,
         .type_input = -1});
  // Input the anchor: the value (a float64 scalar), and the reset (no output).
  for (const bool reset : {false, true})
    r.add({.name = reset ? "exact_auc_reset" : "exact_auc",
           .num_inputs = 1,
           .infer =
               [](node_def& n, const std::vector<const node_def*>& in) {
                 attach_to_variable(n, *in[0], "exact_auc");
                 n.type = dtype::f64;
                 n.shape = {};
               },
           .stateful = true,
           .ref_inputs = 1u,
           .no_output = reset,
           .type_input = -1});
  return true;
}

inline const bool exact_auc_ops_registered = register_exact_auc_ops();
#endif

} // namespace loom::detail

// Op definitions of the state that synchronous replicas share on a ps task
// (TF's ConditionalAccumulator and the token queue of SyncReplicasOptimizer,
// without the queue): a gradient accumulator per variable and an int64
// counter that steps raise and wait on. Each op takes a variable as its first
// (reference) input: the resource lives beside that variable, under the
// variable's (container, shared name) plus a suffix, and the op is colocated
// with it, so on a cluster it runs on the variable's task.
//
//   accumulate_gradient(var, grad, local_step)   adds grad unless it is stale
//   take_gradient(var, global_step)               waits for num_required fresh
//                                                 gradients, returns their mean
//   close_accumulator(var)                        wakes a waiting take_gradient
//   reset_accumulator(var, step)                  drops what it holds; fresh
//                                                 gradients are of `step` now
//
// and their sparse twins for gradients of rows (TF's SparseConditional-
// Accumulator), whose rows travel as rows and ids, never as the dense table:
//
//   accumulate_sparse_gradient(var, values, indices, local_step)
//   take_sparse_gradient(var, global_step) -> rows   the mean of each row over
//                                            the gradients that touched it
//   sparse_gradient_indices(var, rows) -> ids        the ids of those rows
//                                                    (ascending)
//   counter_raise(var, value) -> value'           value' = max(value', value)
//   counter_add(var, delta) -> value'
//   counter_wait(var, above) -> value'            waits until value' > above
//
// and the update barrier of synchronous replicas, a counter with an epoch that
// each reset advances (a worker that joined before a reset must not wait on it):
//
//   barrier_wait(var, local_step, epoch) -> value'  waits until value' >
//                                                 local_step; aborted once the
//                                                 barrier's epoch is not `epoch`
//   barrier_reset(var, value) -> epoch'           value' = value, a new epoch
//   barrier_epoch(var) -> epoch
//   is_variable_initialized(var) -> bool
#pragma once

#include <loom/graph/op_registry.hpp>
#include <loom/graph/ops/array.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace loom::detail {

// The resource beside variable `var` named "<shared name>/<suffix>".
inline void attach_to_variable(node_def& n, const node_def& var, const std::string& suffix) {
  if (var.op != "variable")
    throw invalid_argument_error("node " + n.describe() + ": the first input " + var.describe() +
                                 " is not a variable");
  n.colocation_group = var.colocation();
  n.attrs["_ref_name_0"] = var.name;
  n.attrs["resource_container"] = var.attr_or<std::string>("container", "");
  n.attrs["resource_name"] = var.attr_or<std::string>("shared_name", var.name) + "/" + suffix;
}

inline void require_int64_scalar(const node_def& n, const node_def& in, const char* what) {
  if (in.type != dtype::i64 || in.shape.rank() != 0)
    throw invalid_argument_error("node " + n.describe() + ": " + what +
                                 " must be an int64 scalar, got " + in.describe());
}

// A take's inputs (var, global_step) and attr num_required; its dtype.
inline void infer_take(node_def& n, const std::vector<const node_def*>& in) {
  attach_to_variable(n, *in[0], n.attr_or<std::string>("accumulator", "accumulator"));
  require_int64_scalar(n, *in[1], "the global step");
  if (n.attr_or<std::int64_t>("num_required", 1) < 1)
    throw invalid_argument_error("node " + n.describe() + ": num_required must be at least 1");
  n.type = in[0]->type;
}

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_sync_ops() {
  auto& r = op_registry::instance();
  r.add({.name = "accumulate_gradient",
         .num_inputs = 3,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               attach_to_variable(n, *in[0], n.attr_or<std::string>("accumulator", "accumulator"));
               const node_def& var = *in[0];
               const node_def& grad = *in[1];
               if (grad.type != var.type || !grad.shape.compatible_with(var.shape))
                 throw invalid_argument_error("node " + n.describe() + ": gradient " +
                                              grad.describe() + " does not match variable '" +
                                              var.name + "' (" + std::string(to_string(var.type)) +
                                              " " + var.shape.to_string() + ")");
               require_int64_scalar(n, *in[2], "the local step");
               n.type = var.type;
               n.shape = {};
             },
         .stateful = true,
         .ref_inputs = 1u,
         .no_output = true,
         .type_input = 1});
  r.add({.name = "take_gradient",
         .num_inputs = 2,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               infer_take(n, in);
               n.shape = in[0]->shape;
             },
         .stateful = true,
         .ref_inputs = 1u,
         .type_input = -1,
         .blocking = true});
  // Inputs (var, values, indices, local_step): the rows values[i] of var's
  // gradient at ids indices[i] (values: indices' shape + var's row shape).
  r.add({.name = "accumulate_sparse_gradient",
         .num_inputs = 4,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               attach_to_variable(n, *in[0], n.attr_or<std::string>("accumulator", "accumulator"));
               const node_def& var = *in[0];
               const node_def& values = *in[1];
               const node_def& ids = *in[2];
               check_ids(n, ids, "indices");
               if (var.shape.rank() < 1)
                 throw invalid_argument_error("node " + n.describe() + ": variable '" + var.name +
                                              "' is a scalar; a sparse gradient has rows");
               if (values.type != var.type ||
                   !values.shape.compatible_with(gathered_shape(var.shape, ids.shape, 0)))
                 throw invalid_argument_error(
                     "node " + n.describe() + ": rows " + values.describe() + " (" +
                     std::string(to_string(values.type)) + " " + values.shape.to_string() +
                     ") do not match indices of shape " + ids.shape.to_string() +
                     " into variable '" + var.name + "' (" + std::string(to_string(var.type)) +
                     " " + var.shape.to_string() + ")");
               require_int64_scalar(n, *in[3], "the local step");
               n.type = var.type;
               n.shape = {};
             },
         .stateful = true,
         .ref_inputs = 1u,
         .no_output = true,
         .type_input = 1});
  r.add({.name = "take_sparse_gradient",
         .num_inputs = 2,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               infer_take(n, in);
               if (in[0]->shape.rank() < 1)
                 throw invalid_argument_error("node " + n.describe() + ": variable '" +
                                              in[0]->name + "' is a scalar");
               std::vector<std::int64_t> d(in[0]->shape.dims().begin(), in[0]->shape.dims().end());
               d[0] = -1;
               n.shape = loom::shape(std::move(d));
             },
         .stateful = true,
         .ref_inputs = 1u,
         .type_input = -1,
         .blocking = true});
  // Inputs (var, rows): rows is the take_sparse_gradient whose ids it returns.
  r.add({.name = "sparse_gradient_indices",
         .num_inputs = 2,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               attach_to_variable(n, *in[0], n.attr_or<std::string>("accumulator", "accumulator"));
               if (in[1]->op != "take_sparse_gradient")
                 throw invalid_argument_error("node " + n.describe() + ": the second input " +
                                              in[1]->describe() + " is not a take_sparse_gradient");
               n.type = dtype::i64;
               n.shape = loom::shape{-1};
             },
         .stateful = true,
         .ref_inputs = 1u,
         .type_input = 1});
  // Attr "sparse": the accumulator is a sparse one (it is created by whichever
  // op reaches it first, so close must know its kind).
  r.add({.name = "close_accumulator",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               attach_to_variable(n, *in[0], n.attr_or<std::string>("accumulator", "accumulator"));
               n.type = in[0]->type;
               n.shape = {};
             },
         .stateful = true,
         .ref_inputs = 1u,
         .no_output = true,
         .type_input = -1});
  // Inputs (var, step): the step whose gradients are fresh from now on.
  // Attr "sparse" as close_accumulator's.
  r.add({.name = "reset_accumulator",
         .num_inputs = 2,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               attach_to_variable(n, *in[0], n.attr_or<std::string>("accumulator", "accumulator"));
               require_int64_scalar(n, *in[1], "the step");
               n.type = in[0]->type;
               n.shape = {};
             },
         .stateful = true,
         .ref_inputs = 1u,
         .no_output = true,
         .type_input = -1});
  // Attrs of barrier_wait: "counter", "timeout_ms", and for its errors
  // "replica" (the waiting worker's task) and "replicas_to_aggregate".
  r.add({.name = "barrier_wait",
         .num_inputs = 3,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               attach_to_variable(n, *in[0], n.attr<std::string>("counter"));
               require_int64_scalar(n, *in[1], "the local step");
               require_int64_scalar(n, *in[2], "the barrier's epoch");
               n.type = dtype::i64;
               n.shape = {};
             },
         .stateful = true,
         .ref_inputs = 1u,
         .type_input = -1,
         .blocking = true});
  r.add({.name = "barrier_reset",
         .num_inputs = 2,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               attach_to_variable(n, *in[0], n.attr<std::string>("counter"));
               require_int64_scalar(n, *in[1], "the value");
               n.type = dtype::i64;
               n.shape = {};
             },
         .stateful = true,
         .ref_inputs = 1u,
         .type_input = -1});
  r.add({.name = "barrier_epoch",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               attach_to_variable(n, *in[0], n.attr<std::string>("counter"));
               n.type = dtype::i64;
               n.shape = {};
             },
         .stateful = true,
         .ref_inputs = 1u,
         .type_input = -1});
  for (const char* name : {"counter_raise", "counter_add", "counter_wait"})
    r.add({.name = name,
           .num_inputs = 2,
           .infer =
               [](node_def& n, const std::vector<const node_def*>& in) {
                 attach_to_variable(n, *in[0], n.attr<std::string>("counter"));
                 require_int64_scalar(n, *in[1], "the value");
                 n.type = dtype::i64;
                 n.shape = {};
               },
           .stateful = true,
           .ref_inputs = 1u,
           .type_input = -1,
           .blocking = std::string(name) == "counter_wait"});
  r.add({.name = "is_variable_initialized",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               if (in[0]->op != "variable")
                 throw invalid_argument_error("node " + n.describe() + ": the input " +
                                              in[0]->describe() + " is not a variable");
               n.colocation_group = in[0]->colocation();
               n.type = dtype::boolean;
               n.shape = {};
             },
         .stateful = true,
         .ref_inputs = 1u,
         .type_input = -1});
  return true;
}

inline const bool sync_ops_registered = register_sync_ops();
#endif

} // namespace loom::detail

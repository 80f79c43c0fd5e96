// Synchronous replicas (TF's tf.train.SyncReplicasOptimizer), built on state
// beside each variable on its ps task (graph/ops/sync.hpp) instead of TF's
// queues:
//
//   worker step (train_op):  for each variable, accumulate_gradient(var, grad,
//     local_step) on the variable's task (a gradient older than the variable's
//     accumulator is stale and dropped); then barrier_wait(global_step,
//     local_step, local_epoch) on the global step's task, which returns when
//     the update of this step has been applied; local_step = that new global
//     step.
//   chief update (chief_update_op, run in a loop by sync_replicas_chief):
//     for each variable, take_gradient waits for replicas_to_aggregate fresh
//     gradients and returns their mean (for a gradient of rows, an embedding's,
//     the sparse accumulator returns each touched row's mean over the
//     gradients that touched it, as TF's SparseConditionalAccumulator, and its
//     ids: only rows travel and change); the wrapped optimizer applies the
//     means; global_step += 1; counter_raise(global_step, new step) releases
//     every worker waiting in that step.
//
//   chief start (reset_op, run by the chief before its update loop starts):
//     every accumulator drops what it holds and takes gradients of the global
//     step only; the barrier is set to the global step and begins a new epoch.
//     A chief that restarts, or restores a checkpoint older than what the ps
//     tasks hold, so leaves no accumulator or barrier at another step: the
//     workers' waits of the old epoch fail with aborted, and their monitored
//     sessions start again from the chief's step (local_step_init_op reads the
//     global step and the new epoch).
//
// No worker runs ahead: it waits until its step's update is applied. With
// replicas_to_aggregate < total_num_replicas the slowest workers are backups:
// their late gradients are dropped and their wait returns at once. A worker
// that waits longer than barrier_timeout fails with deadline_exceeded, naming
// how many of the gradients arrived and which workers have not sent theirs (a
// dead replica must not hang the others forever); the wait also ends when the
// step is aborted or the ps task stops.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/graph/ops/array.hpp>
#include <loom/graph/ops/sync.hpp>
#include <loom/runtime/session.hpp>
#include <loom/train/optimizer.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace loom {

struct sync_replicas_options {
  // Gradients averaged into each update (TF's replicas_to_aggregate).
  int replicas_to_aggregate = 1;
  // Workers that send gradients; 0 means replicas_to_aggregate. More than
  // replicas_to_aggregate makes the slowest ones backups.
  int total_num_replicas = 0;
  // How long a worker waits for its step's update before it gives up.
  std::chrono::milliseconds barrier_timeout{std::chrono::minutes(5)};
  std::string name = "sync_replicas";
};

class sync_replicas_optimizer {
public:
  sync_replicas_optimizer(optimizer& opt, sync_replicas_options o);

  int replicas_to_aggregate() const noexcept { return o_.replicas_to_aggregate; }
  int total_num_replicas() const noexcept { return o_.total_num_replicas; }

  // Builds the worker's train op (returned) and the chief's update op. The
  // global step is required: it is the clock that says which gradients are fresh.
  template <expression E>
  operation minimize(const E& loss, const variable<std::int64_t, 0>& global_step,
                     std::vector<node_id> var_list = {}) {
    return apply_gradients(opt_.compute_gradients(loss, std::move(var_list)), global_step);
  }

  operation apply_gradients(const std::vector<grad_and_var>& grads_and_vars,
                            const variable<std::int64_t, 0>& global_step);

  // What each worker runs every step.
  operation train_op() const { return checked(train_op_, "train_op"); }
  // What the chief runs in a loop (TF's chief queue runner).
  operation chief_update_op() const { return checked(chief_update_, "chief_update_op"); }
  // What each worker runs once the global step is initialized or restored
  // (TF's local_step_init_op): its local step starts at the global step.
  operation local_step_init_op() const { return checked(local_step_init_, "local_step_init_op"); }
  // What the chief runs once the global step is initialized, restored or
  // joined, before its update loop starts: the accumulators and the barrier
  // at the global step, and a new barrier epoch (see the top of this file).
  operation reset_op() const { return checked(reset_, "reset_op"); }
  // Ends a chief update waiting for gradients, and fails every take until the
  // next reset_op (to stop the chief's loop).
  operation close_op() const { return checked(close_, "close_op"); }
  // Releases every worker still waiting for an update (backups waiting for
  // a step that will not come because training ended).
  operation release_all_op() const { return checked(release_all_, "release_all_op"); }

private:
  operation checked(const std::optional<operation>& op, const char* what) const {
    if (!op)
      throw failed_precondition_error("sync_replicas_optimizer '" + o_.name + "': " + what +
                                      " exists after minimize or apply_gradients");
    return *op;
  }

  optimizer& opt_;
  sync_replicas_options o_;
  std::optional<operation> train_op_, chief_update_, local_step_init_, reset_, close_, release_all_;
};

// Runs the chief update op in a loop on its own session (TF's chief queue
// runner under the Supervisor) until stop(). The loop waits inside the ps
// tasks for gradients; stop() closes the accumulators, which wakes it.
class sync_replicas_chief {
public:
  sync_replicas_chief(const sync_replicas_optimizer& opt, const graph& g,
                      const session_target& target, cluster_session_options o = {})
      : update_(opt.chief_update_op()), close_(opt.close_op()), release_all_(opt.release_all_op()),
        target_(target), options_(o), session_(g, target, std::move(o)),
        thread_([this] { loop(); }) {}
  sync_replicas_chief(const sync_replicas_chief&) = delete;
  sync_replicas_chief& operator=(const sync_replicas_chief&) = delete;
  // A chief dropped while its loop waits for gradients (an error unwound past
  // the caller's stop) must not wait for gradients that will not come: a
  // session of its own closes the accumulators. Waiting workers are not
  // released; a restarted chief's reset_op starts them on a new epoch.
  ~sync_replicas_chief();

  // Stops the loop. `s` (a session on the same cluster, not this loop's)
  // runs the close op; without one the loop ends with its next update or
  // when the cluster stops. Rethrows the error that ended the loop early.
  void stop(session* s);

  std::int64_t updates() const noexcept { return updates_; }

private:
  // One close is enough wherever the loop is: the accumulators stay closed
  // (every take fails) until the next reset_op, and the loop ends on the
  // failure since stopping_ is set.
  void close_loop(session& s) { s.run_nodes({}, {close_.id()}); }

  void loop();

  operation update_, close_, release_all_;
  session_target target_;
  cluster_session_options options_;
  session session_;
  std::atomic<bool> stopping_{false}, finished_{false};
  std::atomic<std::int64_t> updates_{0};
  std::exception_ptr failure_;
  std::thread thread_;
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE sync_replicas_optimizer::sync_replicas_optimizer(optimizer& opt,
                                                                    sync_replicas_options o)
    : opt_(opt), o_(std::move(o)) {
  if (o_.replicas_to_aggregate < 1)
    throw invalid_argument_error("sync_replicas_optimizer: replicas_to_aggregate must be at "
                                 "least 1, got " +
                                 std::to_string(o_.replicas_to_aggregate));
  if (o_.total_num_replicas == 0)
    o_.total_num_replicas = o_.replicas_to_aggregate;
  if (o_.total_num_replicas < 1)
    throw invalid_argument_error("sync_replicas_optimizer: total_num_replicas must be at least "
                                 "1, got " +
                                 std::to_string(o_.total_num_replicas));
}

LOOM_COMPILED_ONCE auto
sync_replicas_optimizer::apply_gradients(const std::vector<grad_and_var>& grads_and_vars,
                                         const variable<std::int64_t, 0>& global_step)
    -> operation {
  graph g = global_step.graph();
  if (train_op_)
    throw failed_precondition_error("sync_replicas_optimizer '" + o_.name +
                                    "': apply_gradients was already called; one "
                                    "sync_replicas_optimizer serves one train op");
  std::vector<grad_and_var> used;
  for (const grad_and_var& gv : grads_and_vars)
    if (gv.grad != no_node)
      used.push_back(gv);
  if (used.empty())
    throw invalid_argument_error("sync_replicas_optimizer '" + o_.name +
                                 "': no gradients provided for any variable");
  const std::string acc = o_.name + "_accumulator";
  const std::string token = o_.name + "_token";
  auto scope = g.name_scope(o_.name);

  // Only the worker's step (its accumulates, the wait, train_op) takes the caller's control
  // dependencies (TF's UPDATE_OPS idiom: batch normalization's updates run with the step).
  // What runs outside a step (the local init, the chief's update and the barrier's
  // close, reset and release) must not: it would need the step's feeds.
  // The worker's own step counter lives on the worker (where the device
  // scope puts ops that are not variables), not on a ps: each worker has one.
  // Beside it, the barrier's epoch its session began in.
  std::string worker_device;
  std::optional<variable<std::int64_t, 0>> local_step, local_epoch;
  const attr_map barrier_attrs{{"counter", token}};
  {
    const scope_guard outside_step = g.control_dependencies(nullptr);
    worker_device = g.node(no_op(g, "local_anchor").id()).requested_device;
    {
      auto on_worker = g.device(worker_device);
      local_step.emplace(g, "local_step", shape{}, zeros_initializer{},
                         variable_options{.trainable = false, .local = true});
      local_epoch.emplace(g, "local_epoch", shape{}, zeros_initializer{},
                          variable_options{.trainable = false, .local = true});
    }
    local_step_init_ =
        group(g,
              {g.add_node("assign", {local_step->id(), global_step.id()}, {}, "local_step_init"),
               g.add_node("assign",
                          {local_epoch->id(), g.add_node("barrier_epoch", {global_step.id()},
                                                         barrier_attrs, "barrier_epoch")},
                          {}, "local_epoch_init")},
              "local_init");
  }

  // Worker: gradients into the accumulators, then wait for the update.
  // A gradient of rows (an embedding's) goes to a sparse accumulator: only
  // the rows and their ids travel, and the chief applies them sparsely.
  std::vector<node_id> accumulated;
  for (const grad_and_var& gv : used) {
    if (const auto rows = detail::as_row_slices(g.node(gv.grad)))
      accumulated.push_back(g.add_node("accumulate_sparse_gradient",
                                       {gv.var, rows->values, rows->indices, local_step->id()},
                                       {{"accumulator", acc}}));
    else
      accumulated.push_back(g.add_node("accumulate_gradient", {gv.var, gv.grad, local_step->id()},
                                       {{"accumulator", acc}}));
  }
  node_id released;
  {
    auto after = g.control_dependencies(accumulated);
    released =
        g.add_node("barrier_wait", {global_step.id(), local_step->id(), local_epoch->id()},
                   {{"counter", token},
                    {"timeout_ms", static_cast<std::int64_t>(o_.barrier_timeout.count())},
                    {"replica", worker_device},
                    {"replicas_to_aggregate", static_cast<std::int64_t>(o_.replicas_to_aggregate)}},
                   "wait_for_update");
  }
  train_op_ = {g, g.add_node("assign", {local_step->id(), released}, {}, "train_op")};
  g.add_to_collection(collection::train_op, train_op_->id());

  const scope_guard chief_outside_step = g.control_dependencies(nullptr);
  // Chief: the means of the fresh gradients, applied; then release.
  std::vector<grad_and_var> means;
  std::vector<node_id> closes, resets;
  const attr_map take_attrs{{"accumulator", acc},
                            {"num_required", static_cast<std::int64_t>(o_.replicas_to_aggregate)}};
  for (const grad_and_var& gv : used) {
    const bool sparse = detail::as_row_slices(g.node(gv.grad)).has_value();
    if (sparse) {
      const node_id rows =
          g.add_node("take_sparse_gradient", {gv.var, global_step.id()}, take_attrs);
      const node_id ids =
          g.add_node("sparse_gradient_indices", {gv.var, rows}, {{"accumulator", acc}});
      means.push_back(
          {g.add_node("indexed_slices", {rows, ids},
                      {{"axis", std::int64_t{0}}, {"dense_shape", g.node(gv.var).shape.dims()}}),
           gv.var});
    } else {
      means.push_back(
          {g.add_node("take_gradient", {gv.var, global_step.id()}, take_attrs), gv.var});
    }
    closes.push_back(
        g.add_node("close_accumulator", {gv.var}, {{"accumulator", acc}, {"sparse", sparse}}));
    resets.push_back(g.add_node("reset_accumulator", {gv.var, global_step.id()},
                                {{"accumulator", acc}, {"sparse", sparse}}));
  }
  operation applied = opt_.apply_gradients(g, means, global_step, "apply");
  chief_update_ = {g, g.add_node("counter_raise", {global_step.id(), applied.id()},
                                 {{"counter", token}}, "release")};
  close_ = group(g, closes, "close_accumulators");
  {
    // The accumulators first: a worker that reads the new epoch finds them reset.
    auto after = g.control_dependencies(resets);
    reset_ = {g, g.add_node("barrier_reset", {global_step.id(), global_step.id()}, barrier_attrs,
                            "reset_barrier")};
  }
  release_all_ = {g, g.add_node("counter_raise",
                                {global_step.id(),
                                 detail::scalar_node(g, std::numeric_limits<std::int64_t>::max())},
                                {{"counter", token}}, "release_all")};
  return *train_op_;
}

LOOM_COMPILED_ONCE sync_replicas_chief::~sync_replicas_chief() {
  stopping_ = true;
  if (thread_.joinable() && !finished_) {
    try {
      session closer(session_.graph_ref(), target_, options_);
      close_loop(closer);
    } catch (...) { // the cluster is gone: the loop's own step fails and ends it
    }
  }
  if (thread_.joinable())
    thread_.join();
}

LOOM_COMPILED_ONCE void sync_replicas_chief::stop(session* s) {
  stopping_ = true;
  if (thread_.joinable()) {
    if (s)
      close_loop(*s);
    thread_.join();
    if (s)
      s->run_nodes({}, {release_all_.id()});
  }
  if (failure_) {
    auto f = std::exchange(failure_, nullptr);
    std::rethrow_exception(f);
  }
}

LOOM_COMPILED_ONCE void sync_replicas_chief::loop() {
  while (!stopping_) {
    try {
      session_.run_nodes({}, {update_.id()});
      ++updates_;
    } catch (const deadline_exceeded_error&) {
      // No gradients arrived within the call deadline (workers still
      // starting, or all of them slow): the accumulators kept what they
      // had, so waiting again loses nothing.
      continue;
    } catch (...) {
      if (!stopping_)
        failure_ = std::current_exception();
      break;
    }
  }
  finished_ = true;
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

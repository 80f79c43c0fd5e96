// The optimizer base (TF 1.x's tf.train.Optimizer): compute_gradients,
// apply_gradients and minimize, slot variables created lazily with TF's
// names ("w/Adam", "w/Adam_1"), the global step incremented after the
// updates, and hyperparameters that are numbers or scalar graph nodes.
//
// A small virtual interface rather than CRTP: an optimizer only builds graph
// nodes, once per model, so dispatch costs nothing where it matters (the
// kernels); code that wraps or chooses optimizers (a replica-synchronising
// wrapper, a training loop, a command-line flag) can hold an `optimizer&`
// without itself becoming a template; and each optimizer's hooks are compiled
// once instead of once per user type.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/graph/gradients.hpp>
#include <loom/graph/hash_embedding.hpp> // add_row_slot
#include <loom/graph/ops/training.hpp>
#include <loom/graph/variables.hpp>
#include <loom/train/global_step.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

// One variable and the gradient to apply to it; grad is no_node where the
// loss does not depend on the variable (TF's (None, var)).
struct grad_and_var {
  node_id grad = no_node;
  node_id var = no_node;
};

// A hyperparameter: a number, or a scalar float/double node (a placeholder fed
// each step, a schedule computed from the global step). Either becomes an
// input of the update ops, cast to each variable's dtype as TF does.
class hyperparameter {
public:
  template <class N>
  requires std::is_arithmetic_v<N> hyperparameter(N value) : value_(static_cast<double>(value)) {}

  template <expression E>
  requires(floating_type<value_type_of<E>>&& rank_of<E> == 0) hyperparameter(const E& node) {
    auto out = lower(node);
    graph_ = out.graph();
    id_ = out.id();
  }

  bool is_node() const noexcept { return graph_.has_value(); }
  node_id id() const noexcept { return id_; }
  double value() const {
    if (is_node())
      throw invalid_argument_error("hyperparameter: node " + graph_->node(id_).describe() +
                                   " has no value before the graph runs");
    return value_;
  }

  // The hyperparameter as a scalar node of dtype t in g: a constant named
  // `name`, or the node itself, cast when its dtype is not t.
  node_id materialize(graph& g, dtype t, const std::string& name) const;

private:
  double value_ = 0;
  std::optional<graph> graph_;
  node_id id_ = no_node;
};

class optimizer {
public:
  virtual ~optimizer() = default;

  const std::string& name() const noexcept { return name_; }

  // -- compute_gradients -------------------------------------------------------
  // The gradients of `loss` with respect to var_list (default: the trainable
  // variables), one pair per variable, in order.
  std::vector<grad_and_var> compute_gradients(graph& g, node_id loss,
                                              std::vector<node_id> var_list = {});
  template <expression E>
  std::vector<grad_and_var> compute_gradients(const E& loss, std::vector<node_id> var_list = {}) {
    static_assert(floating_type<value_type_of<E>>,
                  "loom::optimizer::compute_gradients: the loss must be float or double");
    auto out = lower(loss);
    return compute_gradients(out.graph(), out.id(), std::move(var_list));
  }

  // -- apply_gradients ---------------------------------------------------------
  // One update per variable with a gradient (slots created on first use), then
  // the optimizer's own bookkeeping (Adam's beta powers), then, when given,
  // global_step += 1 after all of them. Returns the train op, named `name`
  // (default: the optimizer's name) and added to the "train_op" collection.
  operation
  apply_gradients(graph& g, const std::vector<grad_and_var>& grads_and_vars,
                  const std::optional<variable<std::int64_t, 0>>& global_step = std::nullopt,
                  const std::string& name = {});
  // The same, in the graph of the global step or, without one, the only graph
  // this optimizer has worked on.
  operation
  apply_gradients(const std::vector<grad_and_var>& grads_and_vars,
                  const std::optional<variable<std::int64_t, 0>>& global_step = std::nullopt,
                  const std::string& name = {});

  // -- minimize ------------------------------------------------------------------
  operation minimize(graph& g, node_id loss,
                     const std::optional<variable<std::int64_t, 0>>& global_step = std::nullopt,
                     std::vector<node_id> var_list = {}, const std::string& name = {});
  template <expression E>
  operation minimize(const E& loss,
                     const std::optional<variable<std::int64_t, 0>>& global_step = std::nullopt,
                     std::vector<node_id> var_list = {}, const std::string& name = {}) {
    static_assert(floating_type<value_type_of<E>>,
                  "loom::optimizer::minimize: the loss must be float or double");
    auto out = lower(loss);
    return minimize(out.graph(), out.id(), global_step, std::move(var_list), name);
  }

  // -- slots -----------------------------------------------------------------------
  // The slot variable `slot_name` ("m", "momentum", ...) of var, if created.
  std::optional<node_id> get_slot(const graph& g, node_id var, std::string_view slot_name) const;
  template <element_type T, int R>
  variable<T, R> get_slot(const output<T, R>& var, std::string_view slot_name) const {
    auto id = get_slot(var.graph(), var.id(), slot_name);
    if (!id)
      throw not_found_error("optimizer '" + name_ + "' has no slot '" + std::string(slot_name) +
                            "' for variable '" + var.name() + "'");
    return variable<T, R>::existing(var.graph(), *id);
  }
  // The names of the slots created so far, sorted (TF's get_slot_names).
  std::vector<std::string> get_slot_names() const;
  // A variable the optimizer keeps once per graph, not per variable (Adam's
  // "beta1_power"), by the name it was requested under.
  std::optional<node_id> get_non_slot_variable(const graph& g, std::string_view name) const;

protected:
  explicit optimizer(std::string name) : name_(std::move(name)) {
    if (name_.empty())
      throw invalid_argument_error("an optimizer needs a name");
  }
  // Copies only through a concrete optimizer, never sliced through the base.
  optimizer(const optimizer&) = default;
  optimizer& operator=(const optimizer&) = default;

  // -- hooks -------------------------------------------------------------------------
  // Creates the slots of the variables about to be updated (TF's _create_slots).
  virtual void create_slots(graph&, const std::vector<node_id>&) {}
  // The update op of one variable (TF's _apply_dense and _apply_sparse),
  // built in its "update_<var>" name scope. `grad` may be a sparse gradient
  // (an indexed_slices node, whose value is the dense gradient): an optimizer
  // builds its update through update(), which then makes the sparse twin of
  // its op, so that only the rows the gradient touches change.
  virtual node_id apply_dense(graph& g, node_id grad, node_id var) = 0;
  // Ops to run after every update (TF's _finish); they are grouped with the
  // updates into the train op.
  virtual std::vector<node_id> finish(graph&, const std::vector<node_id>&) { return {}; }

  // -- helpers for the hooks ---------------------------------------------------------
  // The update node: `op` (an apply_* op of graph/ops/training.hpp) with
  // `inputs`, or, where its gradient input is a sparse gradient of rows
  // (indexed_slices along axis 0), the op's sparse twin, with the gradient's
  // rows in its place and their indices appended: the rows travel to the
  // variable's task as rows and indices, and nothing dense is made.
  static node_id update(graph& g, const char* op, std::vector<node_id> inputs, attr_map attrs = {});

  // A slot of var: a non-trainable variable of var's dtype and shape, named
  // "<var>/<optimizer name>" (uniquified: "w/Adam_1"), filled with
  // initial_value, colocated with var. Returns the existing one when present.
  node_id make_slot(graph& g, node_id var, const std::string& slot_name, double initial_value);
  node_id zeros_slot(graph& g, node_id var, const std::string& slot_name) {
    return make_slot(g, var, slot_name, 0.0);
  }
  node_id slot(const graph& g, node_id var, const std::string& slot_name) const;

  // A scalar variable kept once per graph, of colocate_with's dtype, initial
  // value `initial`, colocated with colocate_with (TF's _create_non_slot_variable).
  node_id make_non_slot_variable(graph& g, const std::string& var_name,
                                 const hyperparameter& initial, node_id colocate_with);
  node_id non_slot_variable(const graph& g, const std::string& var_name) const {
    if (auto id = get_non_slot_variable(g, var_name))
      return *id;
    throw internal_error("optimizer '" + name_ + "': no variable '" + var_name + "'");
  }

  // A hyperparameter as an input of dtype t, made once per apply_gradients
  // and dtype, named like TF's ("Adam/learning_rate").
  node_id hyper(graph& g, const hyperparameter& h, const std::string& hyper_name, dtype t);

  // x as dtype t (itself when it already is).
  static node_id cast_to(graph& g, node_id x, dtype t) {
    if (g.node(x).type == t)
      return x;
    return g.add_node("cast", {x}, {{"dst", t}});
  }

  // Makes `node` run where `with` lives (TF's colocate_with).
  static void colocate(graph& g, node_id node, node_id with);

private:
  struct per_graph {
    graph g;
    std::map<std::pair<node_id, std::string>, node_id> slots;
    std::map<std::string, node_id, std::less<>> non_slot;
  };

  per_graph& state_for(graph& g);
  const per_graph* find_state(const graph& g) const {
    for (const per_graph& st : graphs_)
      if (st.g == g)
        return &st;
    return nullptr;
  }

  static void check_variable(const graph& g, node_id v, const char* where);

  static std::string name_list(const graph& g, const std::vector<node_id>& ids);

  // A non-trainable global variable named `var_name` (uniquified), outside
  // the caller's scopes, colocated with `primary`, whose initializer assigns
  // make_value(g) (built in the variable's own name scope, as TF's is).
  template <class MakeValue>
  node_id make_variable(graph& g, const std::string& var_name, dtype t, const loom::shape& s,
                        const node_def& primary, MakeValue make_value) {
    detail::lifted_scope lift(g);
    node_id v = g.add_node("variable", {},
                           {{"dtype", t},
                            {"shape", s},
                            {"container", primary.attr_or<std::string>("container", "")},
                            {"initializer", std::int64_t{-1}}},
                           var_name);
    node_id init, value;
    {
      auto own = g.name_scope(g.node(v).name + "/");
      value = make_value(g);
      init = g.add_node("assign", {v, value});
    }
    g.mutable_node(v).attrs["initializer"] = std::int64_t{init};
    colocate(g, v, primary.id);
    colocate(g, init, primary.id);
    if (g.node(value).op == "fill") // made on the slot's task, not shipped at its size
      colocate(g, value, primary.id);
    g.add_to_collection(collection::global_variables, v);
    return v;
  }

  std::string name_;
  std::vector<per_graph> graphs_;
  // Set while apply_gradients runs: its name scope, and the hyperparameter
  // nodes made so far, by (name, dtype).
  std::string apply_scope_;
  std::map<std::pair<std::string, dtype>, node_id> prepared_;
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE auto hyperparameter::materialize(graph& g, dtype t,
                                                    const std::string& name) const -> node_id {
  if (t != dtype::f32 && t != dtype::f64)
    throw invalid_argument_error("hyperparameter '" + name + "' for a " +
                                 std::string(to_string(t)) + " variable");
  if (!is_node())
    return detail::constant_node(g,
                                 t == dtype::f32
                                     ? any_tensor::scalar<float>(static_cast<float>(value_))
                                     : any_tensor::scalar<double>(value_),
                                 name);
  if (!(*graph_ == g))
    throw invalid_argument_error("hyperparameter '" + name + "': node " +
                                 graph_->node(id_).describe() +
                                 " belongs to another graph than the variables it updates");
  if (g.node(id_).type == t)
    return id_;
  return g.add_node("cast", {id_}, {{"dst", t}});
}

LOOM_COMPILED_ONCE auto optimizer::compute_gradients(graph& g, node_id loss,
                                                     std::vector<node_id> var_list)
    -> std::vector<grad_and_var> {
  const node_def& l = g.node(loss);
  if (l.type != dtype::f32 && l.type != dtype::f64)
    throw invalid_argument_error("compute_gradients: loss " + l.describe() + " is " +
                                 std::string(to_string(l.type)) +
                                 "; gradients need a float32 or float64 loss");
  if (var_list.empty())
    var_list = g.collection(collection::trainable_variables);
  if (var_list.empty())
    throw invalid_argument_error("no variables to optimize");
  for (node_id v : var_list)
    check_variable(g, v, "compute_gradients");
  state_for(g);
  std::vector<node_id> grads = gradients(g, {loss}, var_list);
  std::vector<grad_and_var> out;
  out.reserve(var_list.size());
  for (std::size_t i = 0; i < var_list.size(); ++i)
    out.push_back({grads[i], var_list[i]});
  return out;
}

LOOM_COMPILED_ONCE auto
optimizer::apply_gradients(graph& g, const std::vector<grad_and_var>& grads_and_vars,
                           const std::optional<variable<std::int64_t, 0>>& global_step,
                           const std::string& name) -> operation {
  std::vector<grad_and_var> used;
  std::vector<node_id> all_vars;
  for (const grad_and_var& gv : grads_and_vars) {
    check_variable(g, gv.var, "apply_gradients");
    all_vars.push_back(gv.var);
    if (gv.grad == no_node)
      continue;
    const node_def& grad = g.node(gv.grad);
    const node_def& var = g.node(gv.var);
    if (grad.type != var.type)
      throw invalid_argument_error("apply_gradients: the gradient " + grad.describe() + " is " +
                                   std::string(to_string(grad.type)) + ", but variable '" +
                                   var.name + "' is " + std::string(to_string(var.type)));
    used.push_back(gv);
  }
  if (used.empty())
    throw invalid_argument_error("no gradients provided for any variable: " +
                                 name_list(g, all_vars));
  if (global_step && !(global_step->graph() == g))
    throw invalid_argument_error("apply_gradients: the global step '" + global_step->name() +
                                 "' belongs to another graph than the variables");
  state_for(g);

  std::vector<node_id> vars;
  for (const grad_and_var& gv : used)
    vars.push_back(gv.var);
  create_slots(g, vars);

  // The train op takes the scope's own name ("Adam", with the updates under
  // "Adam/"), as in TF; the name is chosen before the scope is entered so
  // that the op created last can still have it.
  const std::string base = name.empty() ? name_ : name;
  const std::string outer = g.current_name_scope();
  std::string op_name, scope;
  for (int k = 0;; ++k) {
    op_name = k == 0 ? base : base + "_" + std::to_string(k);
    scope = outer.empty() ? op_name : outer + "/" + op_name;
    if (!g.state().name_uses.count(scope))
      break;
  }
  apply_scope_ = scope;
  prepared_.clear();
  scope_guard reset([this] {
    apply_scope_.clear();
    prepared_.clear();
  });

  std::vector<node_id> all_ops;
  node_id updated = no_node;
  {
    auto in_scope = g.name_scope(scope + "/");
    for (const grad_and_var& gv : used) {
      auto per_var = g.name_scope("update_" + g.node(gv.var).name);
      all_ops.push_back(apply_dense(g, gv.grad, gv.var));
    }
    std::vector<node_id> extra = finish(g, all_ops);
    all_ops.insert(all_ops.end(), extra.begin(), extra.end());
    if (global_step) {
      // Beside the global step, whose increment waits for it: on a cluster
      // the updates' completions go from the ps to the ps, not through a worker.
      updated = group(g, all_ops, "update").id();
      colocate(g, updated, global_step->id());
    }
  }
  node_id train;
  if (global_step) {
    // The increment is made before the dependency scope: a plain constant is
    // built on every task that reads it instead of crossing the network.
    const node_id one = detail::scalar_node(g, std::int64_t{1});
    auto after = g.control_dependencies({updated});
    train = g.add_node("assign_add", {global_step->id(), one}, {}, op_name);
  } else {
    train = group(g, all_ops, op_name).id();
  }
  g.add_to_collection(collection::train_op, train);
  return {g, train};
}

LOOM_COMPILED_ONCE auto
optimizer::apply_gradients(const std::vector<grad_and_var>& grads_and_vars,
                           const std::optional<variable<std::int64_t, 0>>& global_step,
                           const std::string& name) -> operation {
  if (global_step)
    return apply_gradients(global_step->graph(), grads_and_vars, global_step, name);
  if (graphs_.size() != 1)
    throw invalid_argument_error("apply_gradients: optimizer '" + name_ + "' has worked on " +
                                 std::to_string(graphs_.size()) +
                                 " graphs, so the graph of these gradients is ambiguous; pass it: "
                                 "apply_gradients(g, grads_and_vars, ...)");
  graph g = graphs_.front().g;
  return apply_gradients(g, grads_and_vars, global_step, name);
}

LOOM_COMPILED_ONCE auto
optimizer::minimize(graph& g, node_id loss,
                    const std::optional<variable<std::int64_t, 0>>& global_step,
                    std::vector<node_id> var_list, const std::string& name) -> operation {
  std::vector<grad_and_var> gvs = compute_gradients(g, loss, std::move(var_list));
  if (std::all_of(gvs.begin(), gvs.end(),
                  [](const grad_and_var& gv) { return gv.grad == no_node; })) {
    std::vector<node_id> vars;
    for (const grad_and_var& gv : gvs)
      vars.push_back(gv.var);
    throw invalid_argument_error(
        "no gradients provided for any variable, check your graph for ops that do not "
        "support gradients, between variables " +
        name_list(g, vars) + " and loss '" + g.node(loss).name + "'");
  }
  return apply_gradients(g, gvs, global_step, name);
}

LOOM_COMPILED_ONCE auto optimizer::get_slot(const graph& g, node_id var,
                                            std::string_view slot_name) const
    -> std::optional<node_id> {
  const per_graph* st = find_state(g);
  if (!st)
    return std::nullopt;
  auto it = st->slots.find({var, std::string(slot_name)});
  if (it == st->slots.end())
    return std::nullopt;
  return it->second;
}

LOOM_COMPILED_ONCE auto optimizer::get_slot_names() const -> std::vector<std::string> {
  std::vector<std::string> out;
  for (const per_graph& st : graphs_)
    for (const auto& entry : st.slots)
      out.push_back(entry.first.second);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

LOOM_COMPILED_ONCE auto optimizer::get_non_slot_variable(const graph& g,
                                                         std::string_view name) const
    -> std::optional<node_id> {
  const per_graph* st = find_state(g);
  if (!st)
    return std::nullopt;
  auto it = st->non_slot.find(name);
  if (it == st->non_slot.end())
    return std::nullopt;
  return it->second;
}

LOOM_COMPILED_ONCE auto optimizer::update(graph& g, const char* op, std::vector<node_id> inputs,
                                          attr_map attrs) -> node_id {
  const auto& sigs = detail::apply_op_signatures();
  const auto sig = std::find_if(sigs.begin(), sigs.end(),
                                [&](const auto& s) { return std::string_view(s.op) == op; });
  if (sig == sigs.end())
    throw internal_error(std::string("optimizer::update: '") + op + "' is not an apply op");
  const auto rows = detail::as_row_slices(g.node(inputs.at(sig->grad)));
  if (!rows)
    return g.add_node(op, std::move(inputs), std::move(attrs));
  inputs[sig->grad] = rows->values;
  inputs.push_back(rows->indices);
  return g.add_node(detail::sparse_apply_op(op), std::move(inputs), std::move(attrs));
}

LOOM_COMPILED_ONCE auto optimizer::make_slot(graph& g, node_id var, const std::string& slot_name,
                                             double initial_value) -> node_id {
  per_graph& st = state_for(g);
  if (auto it = st.slots.find({var, slot_name}); it != st.slots.end())
    return it->second;
  const node_def primary = g.node(var);
  node_id slot = make_variable(
      g, primary.name + "/" + name_, primary.type, primary.shape, primary,
      [&](graph& gg) { return detail::fill_node(gg, primary.type, primary.shape, initial_value); });
  // A slot of a shard of a partitioned variable is a shard of the slot's
  // own partitioned variable "<variable>/<slot>" (TF's slot_creator copies
  // the save_slice_info), so a saver relays it out with its primary.
  if (primary.has_attr("_partition_of")) {
    node_def& n = g.mutable_node(slot);
    const std::string suffix = n.name.substr(std::min(n.name.size(), primary.name.size() + 1));
    n.attrs["_partition_of"] = primary.attr<std::string>("_partition_of") + "/" + suffix;
    // Its strategy is read from the primary when a saver needs it (a lookup
    // may stamp it after the slot is made).
    n.attrs["_partition_primary"] = primary.name;
    for (const char* key :
         {"_partition_index", "_partition_count", "_partition_axis", "_partition_full_shape"})
      if (auto it = primary.attrs.find(key); it != primary.attrs.end())
        n.attrs[key] = it->second;
  }
  // A hash embedding's rows restart their slots in a row that eviction reuses.
  if (primary.has_attr("_row_slots")) {
    const node_def& n = g.node(slot);
    detail::add_row_slot(g, var, n.attr_or<std::string>("shared_name", n.name), initial_value);
  }
  state_for(g).slots.emplace(std::pair{var, slot_name}, slot);
  return slot;
}

LOOM_COMPILED_ONCE auto optimizer::slot(const graph& g, node_id var,
                                        const std::string& slot_name) const -> node_id {
  if (auto id = get_slot(g, var, slot_name))
    return *id;
  throw internal_error("optimizer '" + name_ + "': no slot '" + slot_name + "' for variable '" +
                       g.node(var).name + "'");
}

LOOM_COMPILED_ONCE auto optimizer::make_non_slot_variable(graph& g, const std::string& var_name,
                                                          const hyperparameter& initial,
                                                          node_id colocate_with) -> node_id {
  per_graph& st = state_for(g);
  if (auto it = st.non_slot.find(var_name); it != st.non_slot.end())
    return it->second;
  const node_def primary = g.node(colocate_with);
  node_id v = make_variable(g, var_name, primary.type, loom::shape{}, primary, [&](graph& gg) {
    return initial.materialize(gg, primary.type, "initial_value");
  });
  state_for(g).non_slot.emplace(var_name, v);
  return v;
}

LOOM_COMPILED_ONCE auto optimizer::hyper(graph& g, const hyperparameter& h,
                                         const std::string& hyper_name, dtype t) -> node_id {
  auto key = std::pair{hyper_name, t};
  if (auto it = prepared_.find(key); it != prepared_.end())
    return it->second;
  const auto in_scope = apply_scope_.empty()
                            ? std::optional<scope_guard>()
                            : std::optional<scope_guard>(g.name_scope(apply_scope_ + "/"));
  node_id id = h.materialize(g, t, hyper_name);
  prepared_.emplace(key, id);
  return id;
}

LOOM_COMPILED_ONCE void optimizer::colocate(graph& g, node_id node, node_id with) {
  const node_def& w = g.node(with);
  std::string group_name = w.colocation();
  std::string device = w.requested_device;
  node_def& n = g.mutable_node(node);
  n.colocation_group = std::move(group_name);
  n.requested_device = std::move(device);
}

LOOM_COMPILED_ONCE auto optimizer::state_for(graph& g) -> per_graph& {
  for (per_graph& st : graphs_)
    if (st.g == g)
      return st;
  graphs_.push_back({g, {}, {}});
  return graphs_.back();
}

LOOM_COMPILED_ONCE void optimizer::check_variable(const graph& g, node_id v, const char* where) {
  const node_def& n = g.node(v);
  if (n.op != "variable")
    throw invalid_argument_error(std::string(where) + ": " + n.describe() + " is not a variable");
  if (n.type != dtype::f32 && n.type != dtype::f64)
    throw invalid_argument_error(std::string(where) + ": invalid type " +
                                 std::string(to_string(n.type)) + " for variable '" + n.name +
                                 "', expected float32 or float64");
}

LOOM_COMPILED_ONCE std::string optimizer::name_list(const graph& g,
                                                    const std::vector<node_id>& ids) {
  std::string s = "[";
  for (std::size_t i = 0; i < ids.size(); ++i)
    s += (i ? ", '" : "'") + g.node(ids[i]).name + "'";
  return s + "]";
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// The runtime graph: nodes in creation order (so ids are a topological order of
// data inputs), with TF's naming, name scopes, device scopes, control
// dependencies, collections and graph-level seeds. A `graph` is a cheap shared
// handle, so typed leaves can hold one and never dangle.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/device_spec.hpp>
#include <loom/core/error.hpp>
#include <loom/graph/node.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/scope.hpp>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace loom {

// TF's standard collection keys.
namespace collection {
inline constexpr std::string_view global_variables = "variables";
inline constexpr std::string_view trainable_variables = "trainable_variables";
inline constexpr std::string_view local_variables = "local_variables";
inline constexpr std::string_view global_step = "global_step";
inline constexpr std::string_view train_op = "train_op";
// The ops a train step must also run (batch normalization's moving averages), TF's UPDATE_OPS.
inline constexpr std::string_view update_ops = "update_ops";
inline constexpr std::string_view regularization_losses = "regularization_losses";
// Metrics' state: local variables a checkpoint does not save (TF's METRIC_VARIABLES).
inline constexpr std::string_view metric_variables = "metric_variables";
// The shadows of an exponential moving average (TF's MOVING_AVERAGE_VARIABLES).
inline constexpr std::string_view moving_average_variables = "moving_average_variables";
} // namespace collection

// A maximal elementwise region lowered from one typed expression: the region's
// root node, its leaves in the order the typed evaluator reads them, and the
// canonical key under which the typed instantiation is cached.
namespace detail {
struct fusion_candidate {
  node_id root = no_node;
  std::string key;
  std::vector<node_id> leaves;
};
} // namespace detail

// Undoes a scope when it goes out of scope.
class [[nodiscard]] scope_guard {
public:
  explicit scope_guard(std::function<void()> undo) : undo_(std::move(undo)) {}
  scope_guard(scope_guard&& o) noexcept : undo_(std::exchange(o.undo_, nullptr)) {}
  scope_guard(const scope_guard&) = delete;
  scope_guard& operator=(const scope_guard&) = delete;
  scope_guard& operator=(scope_guard&&) = delete;
  ~scope_guard() {
    if (undo_)
      undo_();
  }

private:
  std::function<void()> undo_;
};

// A placement policy (TF's device function): called with a node being created
// and the device that the device scopes inside its own scope requested, it
// returns the node's device: a device_spec, or a device string as TF's device
// functions return ("/job:ps/task:0"; each distinct string is parsed once, and
// a malformed one fails naming the node). The library's policies are in
// loom/placement/.
// clang-format off
template <class P>
concept placement_policy =
    std::copy_constructible<std::decay_t<P>> &&
    std::invocable<std::decay_t<P>&, const node_def&, const device_spec&> &&
    (std::convertible_to<std::invoke_result_t<std::decay_t<P>&, const node_def&,
                                              const device_spec&>, device_spec> ||
     std::convertible_to<std::invoke_result_t<std::decay_t<P>&, const node_def&,
                                              const device_spec&>, std::string_view>);
// clang-format on

namespace detail {

// A policy that returns device strings, as one that returns device_specs: each
// distinct string is parsed once (a policy returns few), shared by the copies
// the scope makes.
template <class P> struct parsing_policy {
  P policy;
  std::shared_ptr<std::unordered_map<std::string, device_spec>> parsed =
      std::make_shared<std::unordered_map<std::string, device_spec>>();

  device_spec operator()(const node_def& n, const device_spec& inner) {
    std::string s(std::string_view(policy(n, inner)));
    auto it = parsed->find(s);
    if (it != parsed->end())
      return it->second;
    device_spec d;
    try {
      d = device_spec::from_string(s);
    } catch (const error& e) {
      throw invalid_argument_error("the placement policy of a device scope returned \"" + s +
                                   "\" for node '" + n.name + "' (" + n.op +
                                   "), which is not a device: " + e.message());
    }
    return parsed->emplace(std::move(s), d).first->second;
  }
};

struct graph_state {
  std::deque<node_def> nodes; // a deque keeps references stable as nodes are added
  std::unordered_map<std::string, node_id> by_name;
  std::unordered_map<std::string, int> name_uses;
  std::unordered_map<std::string, node_id> structural; // CSE: structural key -> node
  scope_ptr scope; // the innermost current scope (graph/scope.hpp); null: none
  std::uint64_t device_scope_counter = 0;
  std::map<std::string, std::vector<node_id>, std::less<>> collections;
  std::vector<fusion_candidate> fusions;
  std::unordered_map<node_id, std::size_t> fusion_by_root;
  std::optional<std::int64_t> seed;
  std::int64_t op_seed_counter = 0;
  std::uint64_t version = 0;
  // get_variable's store: full name -> variable node, and the variable-scope stack.
  std::map<std::string, node_id, std::less<>> variable_store;
  struct variable_scope_frame {
    std::string name;
    bool reuse;
  };
  std::vector<variable_scope_frame> variable_scopes;
};
} // namespace detail

class graph {
public:
  graph() : state_(std::make_shared<detail::graph_state>()) {}

  // Adds a node (or returns the existing identical one: structural CSE for
  // stateless ops without an explicit name). Infers its dtype and shape with the
  // op's registered function; errors name the node.
  node_id add_node(std::string op, std::vector<node_id> inputs, attr_map attrs = {},
                   std::string name = {});

  const node_def& node(node_id id) const {
    check_id(id);
    return state_->nodes[static_cast<std::size_t>(id)];
  }
  // For the placer and for passes that annotate nodes; never changes inputs.
  node_def& mutable_node(node_id id) {
    check_id(id);
    ++state_->version;
    return state_->nodes[static_cast<std::size_t>(id)];
  }
  std::size_t size() const noexcept { return state_->nodes.size(); }
  std::uint64_t version() const noexcept { return state_->version; }

  std::optional<node_id> try_find(std::string_view name) const;
  node_id find(std::string_view name) const {
    if (auto id = try_find(name))
      return *id;
    throw not_found_error("no node named '" + std::string(name) + "' in the graph");
  }

  // -- scopes ---------------------------------------------------------------
  // Names of nodes created in the scope are prefixed "scope/". A name ending in
  // '/' is taken as an absolute scope (TF's re-entering of a scope); "" clears.
  scope_guard name_scope(std::string scope);
  std::string current_name_scope() const {
    return state_->scope ? state_->scope->name_scope : std::string();
  }

  // Device scopes (TF's `with tf.device(...)`). `spec` is a device string
  // ("/job:ps/task:0", parsed here, so a malformed one throws at the scope), a
  // device_spec, a placement_policy, or nullptr, which hides every enclosing
  // scope (TF's tf.device(None)). As in TF, when a node is created the scopes
  // apply from the innermost outwards: a spec fills only the fields the inner
  // scopes left unset (so the innermost wins field by field), a policy is
  // called with the node and the device the scopes inside it produced, and a
  // clear stops the walk. An empty string or spec is a no-op, as in TF. The
  // result's to_string() is the node's requested_device. A policy is copied
  // into the scope; pass std::ref(p) to keep state in `p` itself.
  template <class Spec> [[nodiscard]] scope_guard device(Spec&& spec) {
    using S = std::decay_t<Spec>;
    using frame = detail::scope_frame;
    frame f;
    f.k = frame::kind::device_merge;
    if constexpr (std::is_same_v<S, std::nullptr_t>) {
      f.k = frame::kind::device_clear;
    } else if constexpr (std::is_same_v<S, device_spec>) {
      f.spec = std::forward<Spec>(spec);
    } else if constexpr (std::is_convertible_v<const S&, std::string_view>) {
      f.spec = device_spec::from_string(std::string_view(spec));
    } else {
      static_assert(placement_policy<S>,
                    "loom: the type given to graph::device() or graph::on() is not a placement "
                    "policy: it needs operator()(const loom::node_def&, const loom::device_spec&) "
                    "returning a loom::device_spec or a device string");
      if constexpr (placement_policy<S>) {
        f.k = frame::kind::device_function;
        using R = std::invoke_result_t<S&, const node_def&, const device_spec&>;
        if constexpr (std::is_convertible_v<R, device_spec>)
          f.fn = S(std::forward<Spec>(spec));
        else
          f.fn = detail::parsing_policy<S>{S(std::forward<Spec>(spec))};
        f.id = ++state_->device_scope_counter;
      }
    }
    return enter(std::move(f));
  }

  // Runs `body` within device(spec) and returns its result.
  template <class Spec, std::invocable F> decltype(auto) on(Spec&& spec, F&& body) {
    auto scope = device(std::forward<Spec>(spec));
    return std::invoke(std::forward<F>(body));
  }

  // The device the current scopes give `n` (n.requested_device is not read).
  device_spec device_for(const node_def& n) const;
  // The device the current spec scopes request; policy scopes are skipped
  // (they need a node: see device_for).
  std::string current_device() const;

  // Nodes created in the scope run only after every node in `deps`.
  scope_guard control_dependencies(std::vector<node_id> deps);
  // Nodes created in the scope take no control dependency from the enclosing
  // scopes (TF's tf.control_dependencies(None)).
  scope_guard control_dependencies(std::nullptr_t) {
    detail::scope_frame f;
    f.k = detail::scope_frame::kind::control_clear;
    return enter(std::move(f));
  }

  // The scopes in effect now (null: none): what an expression keeps of where
  // it was written (graph/scope.hpp).
  const detail::scope_ptr& current_scope() const noexcept { return state_->scope; }
  // Makes `s`, scopes taken earlier from this graph, the current ones until
  // the guard goes; lowering an expression restores its scopes with it.
  scope_guard restore_scope(detail::scope_ptr s) {
    return scope_guard([st = state_, previous = std::exchange(state_->scope, std::move(s))] {
      st->scope = previous;
    });
  }

  // -- collections ----------------------------------------------------------
  void add_to_collection(std::string_view name, node_id id);
  const std::vector<node_id>& collection(std::string_view name) const;

  // -- seeds (TF's get_seed: graph seed + per-op seed) ----------------------
  void set_random_seed(std::int64_t seed) { state_->seed = seed; }
  std::pair<std::int64_t, std::int64_t> next_seeds(std::optional<std::int64_t> op_seed);

  // -- fusion ---------------------------------------------------------------
  void add_fusion(detail::fusion_candidate c);
  const std::vector<detail::fusion_candidate>& fusions() const noexcept { return state_->fusions; }

  detail::graph_state& state() noexcept { return *state_; }
  const detail::graph_state& state() const noexcept { return *state_; }

  friend bool operator==(const graph& a, const graph& b) noexcept { return a.state_ == b.state_; }

  // Makes `name` unique in the current name scope ("add", "add_1", ...).
  std::string unique_name(const std::string& base);

private:
  // What the device scopes contribute to a CSE key before the node exists: the
  // requested device, or the policy scopes' identities when policies apply.
  std::string device_scope_key() const;

  // The control dependencies of the current scopes, outermost first.
  std::vector<node_id> control_inputs_in_scope() const;

  // Links `f` inside the current scopes until the guard goes.
  scope_guard enter(detail::scope_frame f);

  void check_id(node_id id) const;

  // The attribute "_what" describes what a node's values are, for its error
  // messages ("the embedding t of 1000 rows"); it is no part of the node's
  // identity. Two lookups of the same ids in two tables of as many rows (a
  // field's deep and wide tables) then share their routing to the shards and
  // their unique (as TF's CSE merges their dynamic_partition), and each id
  // travels to a shard once; the shared node's description names both.
  static void join_description(node_def& kept, const node_def& merged);

  std::string structural_key(const node_def& n) const;

  // Small constants take part in CSE by value; large ones are never merged
  // (comparing them would cost more than it saves): their key is the id the node
  // is about to get, unique in this graph.
  void append_tensor_key(std::ostringstream& k, const any_tensor& t) const;

  std::shared_ptr<detail::graph_state> state_;
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE auto graph::add_node(std::string op, std::vector<node_id> inputs, attr_map attrs,
                                        std::string name) -> node_id {
  const detail::op_def& def = detail::op_registry::instance().find(op);
  if (def.num_inputs >= 0 && static_cast<int>(inputs.size()) != def.num_inputs)
    throw invalid_argument_error("op '" + op + "' takes " + std::to_string(def.num_inputs) +
                                 " inputs, got " + std::to_string(inputs.size()));
  for (node_id i : inputs)
    check_id(i);

  node_def n;
  n.op = std::move(op);
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  n.control_inputs = control_inputs_in_scope();
  n.requested_device = device_scope_key(); // stands for the device in the CSE key

  const bool explicit_name = !name.empty();
  std::string key;
  if (!def.stateful && !explicit_name) {
    key = structural_key(n);
    if (auto it = state_->structural.find(key); it != state_->structural.end()) {
      join_description(state_->nodes[static_cast<std::size_t>(it->second)], n);
      return it->second;
    }
  }

  n.name = unique_name(explicit_name ? name : n.op);
  std::vector<const node_def*> in;
  in.reserve(n.inputs.size());
  for (node_id i : n.inputs)
    in.push_back(&node(i));
  if (def.infer)
    def.infer(n, in);
  // Policies see the named, typed node (TF applies device functions to the
  // constructed op).
  n.requested_device.clear();
  n.requested_device = device_for(n).to_string();

  n.id = static_cast<node_id>(state_->nodes.size());
  state_->by_name.emplace(n.name, n.id);
  if (!key.empty())
    state_->structural.emplace(std::move(key), n.id);
  state_->nodes.push_back(std::move(n));
  ++state_->version;
  return state_->nodes.back().id;
}

LOOM_COMPILED_ONCE auto graph::try_find(std::string_view name) const -> std::optional<node_id> {
  auto it = state_->by_name.find(std::string(name));
  if (it == state_->by_name.end())
    return std::nullopt;
  return it->second;
}

LOOM_COMPILED_ONCE auto graph::name_scope(std::string scope) -> scope_guard {
  detail::scope_frame f;
  f.k = detail::scope_frame::kind::name;
  if (scope.empty())
    f.name_scope = "";
  else if (scope.back() == '/')
    f.name_scope = scope.substr(0, scope.size() - 1);
  else
    f.name_scope = unique_name(scope);
  return enter(std::move(f));
}

LOOM_COMPILED_ONCE auto graph::device_for(const node_def& n) const -> device_spec {
  using frame = detail::scope_frame;
  device_spec current;
  for (const frame* f = state_->scope.get(); f && f->k != frame::kind::device_clear;
       f = f->outer.get()) {
    if (f->k == frame::kind::device_function)
      current = f->fn(n, current);
    else if (f->k == frame::kind::device_merge)
      current = device_spec::merged(f->spec, current);
  }
  return current;
}

LOOM_COMPILED_ONCE std::string graph::current_device() const {
  using frame = detail::scope_frame;
  device_spec current;
  for (const frame* f = state_->scope.get(); f && f->k != frame::kind::device_clear;
       f = f->outer.get())
    if (f->k == frame::kind::device_merge)
      current = device_spec::merged(f->spec, current);
  return current.to_string();
}

LOOM_COMPILED_ONCE auto graph::control_dependencies(std::vector<node_id> deps) -> scope_guard {
  for (node_id d : deps)
    check_id(d);
  detail::scope_frame f;
  f.k = detail::scope_frame::kind::control;
  f.deps = std::move(deps);
  return enter(std::move(f));
}

LOOM_COMPILED_ONCE void graph::add_to_collection(std::string_view name, node_id id) {
  check_id(id);
  auto& c = state_->collections[std::string(name)];
  if (std::find(c.begin(), c.end(), id) == c.end())
    c.push_back(id);
}

LOOM_COMPILED_ONCE auto graph::collection(std::string_view name) const
    -> const std::vector<node_id>& {
  static const std::vector<node_id> empty;
  auto it = state_->collections.find(name);
  return it == state_->collections.end() ? empty : it->second;
}

LOOM_COMPILED_ONCE auto graph::next_seeds(std::optional<std::int64_t> op_seed)
    -> std::pair<std::int64_t, std::int64_t> {
  constexpr std::int64_t default_graph_seed = 87654321;
  if (state_->seed)
    return {*state_->seed, op_seed ? *op_seed : ++state_->op_seed_counter};
  if (op_seed)
    return {default_graph_seed, *op_seed};
  return {0, 0}; // nondeterministic: the kernel seeds itself from the OS
}

LOOM_COMPILED_ONCE void graph::add_fusion(detail::fusion_candidate c) {
  if (state_->fusion_by_root.count(c.root))
    return;
  state_->fusion_by_root.emplace(c.root, state_->fusions.size());
  state_->fusions.push_back(std::move(c));
}

LOOM_COMPILED_ONCE std::string graph::unique_name(const std::string& base) {
  std::string scoped = current_name_scope();
  std::string full = scoped.empty() ? base : scoped + "/" + base;
  auto& uses = state_->name_uses;
  auto it = uses.find(full);
  if (it == uses.end()) {
    uses.emplace(full, 0);
    return full;
  }
  std::string candidate;
  do {
    candidate = full + "_" + std::to_string(++it->second);
  } while (uses.count(candidate));
  uses.emplace(candidate, 0);
  return candidate;
}

LOOM_COMPILED_ONCE std::string graph::device_scope_key() const {
  using frame = detail::scope_frame;
  std::string key;
  bool policies = false;
  for (const frame* f = state_->scope.get(); f && f->k != frame::kind::device_clear;
       f = f->outer.get()) {
    if (!f->is_device())
      continue;
    policies = policies || f->k == frame::kind::device_function;
    key += f->k == frame::kind::device_function ? "#" + std::to_string(f->id)
                                                : "|" + f->spec.to_string();
  }
  return policies ? key : current_device();
}

LOOM_COMPILED_ONCE auto graph::control_inputs_in_scope() const -> std::vector<node_id> {
  using frame = detail::scope_frame;
  std::vector<const frame*> frames;
  for (const frame* f = state_->scope.get(); f && f->k != frame::kind::control_clear;
       f = f->outer.get())
    if (f->k == frame::kind::control)
      frames.push_back(f);
  std::vector<node_id> out;
  for (auto it = frames.rbegin(); it != frames.rend(); ++it)
    out.insert(out.end(), (*it)->deps.begin(), (*it)->deps.end());
  return out;
}

LOOM_COMPILED_ONCE auto graph::enter(detail::scope_frame f) -> scope_guard {
  if (f.k != detail::scope_frame::kind::name)
    f.name_scope = current_name_scope();
  f.outer = state_->scope;
  auto inner = std::make_shared<const detail::scope_frame>(std::move(f));
  return restore_scope(std::move(inner));
}

LOOM_COMPILED_ONCE void graph::check_id(node_id id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= state_->nodes.size())
    throw invalid_argument_error("node id " + std::to_string(id) + " is not in this graph");
}

LOOM_COMPILED_ONCE void graph::join_description(node_def& kept, const node_def& merged) {
  const auto theirs = merged.attrs.find("_what");
  if (theirs == merged.attrs.end())
    return;
  const auto& what = std::get<std::string>(theirs->second);
  auto& ours = kept.attrs["_what"];
  if (const auto* had = std::get_if<std::string>(&ours); had && !had->empty()) {
    if (had->find(what) == std::string::npos)
      ours = *had + " and " + what;
  } else {
    ours = what;
  }
}

LOOM_COMPILED_ONCE std::string graph::structural_key(const node_def& n) const {
  std::ostringstream k;
  k.precision(17); // distinct float attributes must give distinct keys
  k << n.op << '(';
  for (node_id i : n.inputs)
    k << i << ',';
  k << ")^(";
  for (node_id i : n.control_inputs)
    k << i << ',';
  k << ")@" << n.requested_device << '{';
  for (auto& [name, v] : n.attrs) {
    if (name == "_what")
      continue;
    k << name << '=';
    std::visit(
        [&](const auto& x) {
          using X = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<X, std::vector<std::int64_t>>)
            for (auto e : x)
              k << e << ' ';
          else if constexpr (std::is_same_v<X, loom::shape>)
            k << x.to_string();
          else if constexpr (std::is_same_v<X, dtype>)
            k << to_string(x);
          else if constexpr (std::is_same_v<X, any_tensor>)
            append_tensor_key(k, x);
          else
            k << x;
        },
        v);
    k << ';';
  }
  k << '}';
  return k.str();
}

LOOM_COMPILED_ONCE void graph::append_tensor_key(std::ostringstream& k, const any_tensor& t) const {
  k << t.describe() << ':';
  if (t.num_elements() > 64) {
    k << "#" << state_->nodes.size();
    return;
  }
  visit_dtype(t.type(), [&]<class T>() {
    for (const T& e : t.flat<T>())
      k << e << ' ';
  });
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

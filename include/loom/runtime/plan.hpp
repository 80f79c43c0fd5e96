// A plan: a request (fetches, targets, fed nodes) compiled once against a
// graph, to run as often as asked (runtime/executor.hpp runs it).
//
// Planning prunes the graph to what the request needs, looks every kernel up,
// replaces each fusable elementwise region by its fused kernel, and counts the
// readers of every value so memory follows the live set.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/device_spec.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/ops/transfer.hpp>
#include <loom/kernels/fused_registry.hpp>
#include <loom/kernels/gpu_backend.hpp>
#include <loom/kernels/registry.hpp>
#include <loom/runtime/interfaces.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace loom::detail {

// The nodes a request needs: the fetches, the targets and, transitively, their
// data and control inputs, stopping at fed nodes (TF's pruning).
LOOM_COMPILED_ONCE std::vector<char> needed_nodes(const graph& g, const run_request& req);

// Where a placed node's kernel runs: a GPU for "/device:GPU:i", else the host.
LOOM_COMPILED_ONCE memory_location location_of(const node_def& n);

// A _send or _recv node as its step uses it: the attributes read once, when the plan is
// made. A ps's step makes hundreds of transfers, and reading each node's "key" and
// "dst_task" by name every step was about 3 % of a ctr task's CPU (#23).
struct transfer_def {
  std::string key{};       // the rendezvous key the _send and its _recv both name
  std::string peer_task{}; // the other end: a _send's destination, a _recv's source
  bool control = false;    // a _send of a control edge: it carries no value
};

class plan {
public:
  // Where a value lives while the plan runs: an index into its values, dense over the
  // nodes the plan reads or writes (not the graph's ids), so that a run allocates for the
  // nodes it needs only, however large the graph.
  using slot = std::uint32_t;
  static constexpr slot no_slot = ~slot{0};

  // A node's unit of work in the plan (TF's NodeItem): a kernel, a fused region, a
  // _send or a _recv. ("A step" is a whole run: step_id, runtime/interfaces.hpp.)
  struct item {
    enum class kind : std::uint8_t { kernel, fused, send, recv };
    kind k = kind::kernel;
    node_id id = no_node; // its node, for its definition and its name
    slot out = no_slot;   // where its value goes
    kernels::kernel_fn kernel = nullptr;
    // A GPU kernel's batch kernel, where its op has one: the executor runs the items that
    // are ready together and share it in one call (kernel_registry::find_batch).
    kernels::batch_kernel_fn batch = nullptr;
    bool blocking = false;    // the kernel may wait for other steps (op_def::blocking)
    bool kept = false;        // a constant on a GPU: made by its first run, then kept
    memory_location where{};  // a kernel's device: its inputs are copied there
    std::vector<slot> inputs; // no_slot at ref-input positions
    std::vector<slot> refs;   // the variable nodes of ref inputs
    transfer_def transfer{};  // a send's or recv's attributes
    // Its kernel's decoded attributes in plan_caches (kernel_context::decoded).
    std::size_t attrs = 0;
    // A fused region: its kernel (the CPU's, or the GPU's for a region on a
    // GPU) and leaves, and the primitive items that compute the same value
    // when the fused kernel declines the shapes.
    kernels::fused_kernel_fn fused = nullptr;
    kernels::gpu_fused_kernel_fn gpu_fused = nullptr;
    std::vector<slot> leaves;
    std::vector<item> fallback;
  };

  // allow_fusion = false runs every fusable region as its primitive ops (the
  // path a process without the region's instantiation takes), for testing.
  // `placed` gives each node id's device (empty: each node's assigned_device);
  // a node on a GPU runs its GPU kernel. A region fuses where all its nodes
  // are on one device whose fused kernel the process has (lowering registers
  // the GPU's only in a unit compiled by nvcc).
  plan(const graph& g, const run_request& req, bool allow_fusion = true,
       std::vector<memory_location> placed = {});

  const std::vector<item>& items() const noexcept { return items_; }
  const run_request& request() const noexcept { return request_; }

  // Has a kernel that may wait for other steps (a blocking op).
  bool blocks() const noexcept { return blocks_; }
  // Has an item that runs on a GPU.
  bool on_gpu() const noexcept { return on_gpu_; }

  // The plan's values: how many, and each one's node.
  std::size_t slots() const noexcept { return nodes_.size(); }
  node_id node_of(slot s) const noexcept { return nodes_[s]; }
  // The slots of the request's fed nodes and fetches, in its order.
  const std::vector<slot>& fed() const noexcept { return fed_; }
  const std::vector<slot>& fetches() const noexcept { return fetches_; }
  // The items that wait on item k, and how many items item k waits on.
  const std::vector<std::size_t>& consumers(std::size_t k) const noexcept { return consumers_[k]; }
  const std::vector<int>& pending() const noexcept { return pending_; }
  // How many items read each slot's value.
  const std::vector<int>& readers() const noexcept { return readers_; }
  // Whether a slot's value is fetched (it lives to the end of the run).
  bool fetched(slot s) const noexcept { return keep_[s] != 0; }
  // Whether a slot holds a variable node's read (read again by each consumer).
  bool reads_variable(slot s) const noexcept { return variable_read_[s] != 0; }
  // How many items (fallbacks included) decode attributes: plan_caches' size.
  std::size_t decoded_items() const noexcept { return decoded_items_; }

private:
  slot slot_of(node_id id);

  item make_item(const graph& g, node_id id, memory_location where = {});

  // The region's nodes other than its root and leaves, or nothing when the
  // graph no longer has the shape lowering recorded.
  static std::optional<std::vector<node_id>> region_interior(const graph& g,
                                                             const fusion_candidate& c);

  run_request request_;
  std::vector<item> items_;
  std::vector<node_id> nodes_;                      // per slot: its node
  std::unordered_map<node_id, slot> slots_;         // per node: its slot (while building)
  std::vector<slot> fed_, fetches_;                 // the request's, in its order
  std::vector<std::vector<std::size_t>> consumers_; // per item: the items waiting on it
  std::vector<int> pending_;                        // per item: how many it waits on
  std::vector<int> readers_;                        // per slot: items reading its value
  std::vector<char> keep_;                          // per slot: fetched
  std::vector<char> variable_read_;                 // per slot: a variable read by an item
  std::size_t decoded_items_ = 0;
  bool on_gpu_ = false; // some item runs on a GPU
  bool blocks_ = false; // some item runs a blocking kernel
};

// What the runs of one plan keep between them, beside the immutable plan, by whoever
// owns it (a local master's plan cache, a worker's registered partition): the kernels'
// decoded attributes, GPU constants' values, and the variables found by name. Shared by
// the plan's concurrent runs, so each under its lock.
class plan_caches {
public:
  explicit plan_caches(const plan& p)
      : attrs_(std::make_unique<kernels::decoded_attrs[]>(p.decoded_items())),
        variables_(p.slots(), nullptr) {}
  plan_caches(const plan_caches&) = delete;
  plan_caches& operator=(const plan_caches&) = delete;

  // An item's decoded attributes (kernel_context::decoded), kept from its first run.
  kernels::decoded_attrs& attrs(const plan::item& s) noexcept { return attrs_[s.attrs]; }

  // A GPU constant's value from an earlier run: a constant never changes, and making it
  // again costs a copy or a kernel on every step. Readers never write it in place: the
  // kept reference makes it shared.
  std::optional<any_tensor> kept(plan::slot s);
  void keep(plan::slot s, const any_tensor& value) {
    std::lock_guard lock(kept_mu_);
    kept_.emplace(s, value);
  }

  // The variable of the variable node in slot s: what resources.variable() returns, kept
  // while the resources' generation() stays the same (a lookup by name costs two
  // attribute reads and two map finds; a ps step reads and updates hundreds of
  // variables). A reset() of the resources changes the generation, and the next lookup
  // asks them again.
  kernels::variable_resource& variable(const plan& p, const graph& g, plan::slot s,
                                       kernels::resource_access& resources);

private:
  std::unique_ptr<kernels::decoded_attrs[]> attrs_; // per item that decodes (plan::item::attrs)
  std::mutex kept_mu_;
  std::unordered_map<plan::slot, any_tensor> kept_;
  std::mutex variables_mu_;
  std::uint64_t variables_generation_ = 0;
  std::vector<kernels::variable_resource*> variables_; // per slot
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE std::vector<char> needed_nodes(const graph& g, const run_request& req) {
  std::unordered_set<node_id> fed(req.fed.begin(), req.fed.end());
  std::vector<char> needed(g.size(), 0);
  std::vector<node_id> stack(req.fetches);
  stack.insert(stack.end(), req.targets.begin(), req.targets.end());
  while (!stack.empty()) {
    node_id id = stack.back();
    stack.pop_back();
    if (needed[static_cast<std::size_t>(id)])
      continue;
    needed[static_cast<std::size_t>(id)] = 1;
    if (fed.count(id))
      continue;
    const node_def& n = g.node(id);
    const op_def& def = op_registry::instance().find(n.op);
    for (std::size_t i = 0; i < n.inputs.size(); ++i)
      if (!(def.ref_inputs >> i & 1u))
        stack.push_back(n.inputs[i]);
    for (node_id c : n.control_inputs)
      stack.push_back(c);
  }
  return needed;
}

LOOM_COMPILED_ONCE memory_location location_of(const node_def& n) {
  if (n.assigned_device.empty())
    return memory_location::host();
  const device_spec d = device_spec::from_string(n.assigned_device);
  if (d.device_type() && *d.device_type() == kernels::device_gpu)
    return memory_location::gpu(d.device_index().value_or(0));
  return memory_location::host();
}

LOOM_COMPILED_ONCE plan::plan(const graph& g, const run_request& req, bool allow_fusion,
                              std::vector<memory_location> placed)
    : request_(req) {
  std::unordered_set<node_id> fed(req.fed.begin(), req.fed.end());
  if (placed.empty())
    for (std::size_t id = 0; id < g.size(); ++id)
      placed.push_back(location_of(g.node(static_cast<node_id>(id))));
  // 1. The nodes the request needs.
  const std::vector<char> needed = needed_nodes(g, req);

  // 2. Consumers within the plan, for fusion.
  std::unordered_map<node_id, std::vector<node_id>> consumers;
  for (std::size_t id = 0; id < g.size(); ++id) {
    if (!needed[id] || fed.count(static_cast<node_id>(id)))
      continue;
    const node_def& n = g.node(static_cast<node_id>(id));
    for (node_id in : n.inputs)
      consumers[in].push_back(n.id);
    for (node_id in : n.control_inputs)
      consumers[in].push_back(n.id);
  }

  // 3. Fusion: largest regions first; a node joins at most one region.
  std::unordered_map<node_id, const fusion_candidate*> fuse_at;
  std::unordered_set<node_id> fused_away;
  std::set<node_id> fetched(req.fetches.begin(), req.fetches.end());
  std::vector<const fusion_candidate*> candidates;
  if (allow_fusion)
    for (auto& c : g.fusions())
      candidates.push_back(&c);
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](auto* a, auto* b) { return a->leaves.size() > b->leaves.size(); });
  for (const fusion_candidate* c : candidates) {
    if (static_cast<std::size_t>(c->root) >= g.size() || !needed[static_cast<std::size_t>(c->root)])
      continue;
    auto interior = region_interior(g, *c);
    const memory_location where = placed[static_cast<std::size_t>(c->root)];
    const auto& fused = kernels::fused_kernel_registry::instance();
    if (!interior ||
        !(where.on_host() ? fused.find(c->key) != nullptr : fused.find_gpu(c->key) != nullptr))
      continue;
    auto at_root = [&](node_id id) { return placed[static_cast<std::size_t>(id)] == where; };
    bool ok = !fed.count(c->root) && !fused_away.count(c->root) && !fuse_at.count(c->root);
    std::unordered_set<node_id> region(interior->begin(), interior->end());
    region.insert(c->root);
    for (node_id id : *interior) {
      if (!ok)
        break;
      const node_def& n = g.node(id);
      ok = needed[static_cast<std::size_t>(id)] && !fed.count(id) && !fetched.count(id) &&
           !fused_away.count(id) && !fuse_at.count(id) && n.control_inputs.empty() && at_root(id);
      for (node_id user : consumers[id])
        ok = ok && region.count(user);
    }
    if (!ok)
      continue;
    fuse_at.emplace(c->root, c);
    fused_away.insert(interior->begin(), interior->end());
  }

  // 4. Items in id order; the slots, fed values' first.
  for (node_id f : req.fed)
    fed_.push_back(slot_of(f));
  std::vector<std::vector<node_id>> after; // per item: its control inputs
  for (std::size_t i = 0; i < g.size(); ++i) {
    const node_id id = static_cast<node_id>(i);
    if (!needed[i] || fed.count(id) || fused_away.count(id))
      continue;
    if (auto it = fuse_at.find(id); it != fuse_at.end()) {
      item s;
      s.k = item::kind::fused;
      s.id = id;
      s.out = slot_of(id);
      s.where = placed[i];
      if (s.where.on_host())
        s.fused = kernels::fused_kernel_registry::instance().find(it->second->key);
      else
        s.gpu_fused = kernels::fused_kernel_registry::instance().find_gpu(it->second->key);
      for (node_id l : it->second->leaves)
        s.leaves.push_back(slot_of(l));
      auto interior = *region_interior(g, *it->second);
      std::sort(interior.begin(), interior.end());
      for (node_id r : interior)
        s.fallback.push_back(make_item(g, r, s.where));
      s.fallback.push_back(make_item(g, id, s.where));
      s.inputs = s.leaves;
      on_gpu_ = on_gpu_ || !s.where.on_host();
      items_.push_back(std::move(s));
    } else {
      items_.push_back(make_item(g, id, placed[i]));
      on_gpu_ = on_gpu_ || !placed[i].on_host();
      blocks_ = blocks_ || items_.back().blocking;
    }
    after.push_back(g.node(id).control_inputs);
  }
  for (node_id f : req.fetches)
    fetches_.push_back(slot_of(f));

  // 5. The dependency graph between items, and how many items read each value.
  std::unordered_map<slot, std::size_t> producer;
  for (std::size_t k = 0; k < items_.size(); ++k)
    producer.emplace(items_[k].out, k);
  consumers_.resize(items_.size());
  pending_.assign(items_.size(), 0);
  readers_.assign(nodes_.size(), 0);
  for (std::size_t k = 0; k < items_.size(); ++k) {
    std::set<std::size_t> deps;
    for (slot in : items_[k].inputs) {
      if (in == no_slot)
        continue;
      ++readers_[in];
      if (auto p = producer.find(in); p != producer.end())
        deps.insert(p->second);
    }
    for (node_id in : after[k])
      if (auto s = slots_.find(in); s != slots_.end())
        if (auto p = producer.find(s->second); p != producer.end())
          deps.insert(p->second);
    for (std::size_t d : deps)
      consumers_[d].push_back(k);
    pending_[k] = static_cast<int>(deps.size());
  }
  // Fed values are not kept: a kernel may forward one that nothing else holds
  // (a tensor a task received for this step, which an assign then adopts
  // without a copy); a caller's own fed tensor is never a sole owner.
  keep_.assign(nodes_.size(), 0);
  for (slot f : fetches_)
    keep_[f] = 1;
  variable_read_.assign(nodes_.size(), 0);
  for (const item& s : items_)
    if (g.node(s.id).op == "variable")
      variable_read_[s.out] = 1;
  slots_.clear(); // only the build needs the way back from node ids
}

LOOM_COMPILED_ONCE auto plan::slot_of(node_id id) -> slot {
  auto [it, added] = slots_.try_emplace(id, static_cast<slot>(nodes_.size()));
  if (added)
    nodes_.push_back(id);
  return it->second;
}

LOOM_COMPILED_ONCE auto plan::make_item(const graph& g, node_id id, memory_location where) -> item {
  const node_def& n = g.node(id);
  const op_def& def = op_registry::instance().find(n.op);
  if (n.op == "placeholder")
    throw invalid_argument_error("you must feed a value for placeholder '" + n.name +
                                 "' with dtype " + std::string(to_string(n.type)) + " and shape " +
                                 n.shape.to_string());
  item s;
  s.id = id;
  s.out = slot_of(id);
  if (n.op == "_send" || n.op == "_recv") {
    s.k = n.op == "_send" ? item::kind::send : item::kind::recv;
    for (node_id in : n.inputs)
      s.inputs.push_back(slot_of(in));
    s.transfer.key = n.attr<std::string>("key");
    if (s.k == item::kind::send) {
      s.transfer.peer_task = n.attr<std::string>("dst_task");
      s.transfer.control = n.attr_or<bool>("control", false);
    } else {
      s.transfer.peer_task = n.attr<std::string>("src_task");
    }
    return s;
  }
  const dtype t = def.type_input < 0 || n.inputs.empty()
                      ? n.type
                      : g.node(n.inputs[static_cast<std::size_t>(def.type_input)]).type;
  s.where = where;
  s.blocking = def.blocking;
  s.kept = n.op == "constant" && !where.on_host();
  s.kernel = kernels::kernel_registry::instance().find_for(
      n, t, where.on_host() ? kernels::device_cpu : kernels::device_gpu);
  if (!where.on_host())
    s.batch = kernels::kernel_registry::instance().find_batch(n.op, t, kernels::device_gpu);
  s.attrs = decoded_items_++;
  for (std::size_t i = 0; i < n.inputs.size(); ++i) {
    if (def.ref_inputs >> i & 1u) {
      s.inputs.push_back(no_slot);
      s.refs.push_back(slot_of(n.inputs[i]));
    } else {
      s.inputs.push_back(slot_of(n.inputs[i]));
    }
  }
  return s;
}

LOOM_COMPILED_ONCE auto plan::region_interior(const graph& g, const fusion_candidate& c)
    -> std::optional<std::vector<node_id>> {
  std::unordered_set<node_id> leaves(c.leaves.begin(), c.leaves.end());
  std::vector<node_id> interior, stack{c.root};
  std::unordered_set<node_id> seen;
  while (!stack.empty()) {
    node_id id = stack.back();
    stack.pop_back();
    if (!seen.insert(id).second)
      continue;
    const node_def& n = g.node(id);
    if (!op_registry::instance().find(n.op).elementwise)
      return std::nullopt;
    if (id != c.root)
      interior.push_back(id);
    for (node_id in : n.inputs)
      if (!leaves.count(in))
        stack.push_back(in);
  }
  return interior;
}

LOOM_COMPILED_ONCE auto plan_caches::kept(plan::slot s) -> std::optional<any_tensor> {
  std::lock_guard lock(kept_mu_);
  auto it = kept_.find(s);
  if (it == kept_.end())
    return std::nullopt;
  return it->second;
}

LOOM_COMPILED_ONCE auto plan_caches::variable(const plan& p, const graph& g, plan::slot s,
                                              kernels::resource_access& resources)
    -> kernels::variable_resource& {
  const std::uint64_t generation = resources.generation();
  if (generation == 0)
    return resources.variable(g.node(p.node_of(s)));
  std::lock_guard lock(variables_mu_);
  if (variables_generation_ != generation) {
    std::fill(variables_.begin(), variables_.end(), nullptr);
    variables_generation_ = generation;
  }
  kernels::variable_resource*& v = variables_[s];
  if (!v)
    v = &resources.variable(g.node(p.node_of(s)));
  return *v;
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// A plan: a request (fetches, targets, fed nodes) compiled once against a
// graph, to run as often as asked (runtime/executor.hpp runs it).
//
// Planning prunes the graph to what the request needs, looks every kernel up,
// replaces each fusable elementwise region by its fused kernel, and counts the
// readers of every value so memory follows the live set.
#pragma once

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

class plan_execution;

// The nodes a request needs: the fetches, the targets and, transitively, their
// data and control inputs, stopping at fed nodes (TF's pruning).
inline std::vector<char> needed_nodes(const graph& g, const run_request& req) {
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

// Where a placed node's kernel runs: a GPU for "/device:GPU:i", else the host.
inline memory_location location_of(const node_def& n) {
  if (n.assigned_device.empty())
    return memory_location::host();
  const device_spec d = device_spec::from_string(n.assigned_device);
  if (d.device_type() && *d.device_type() == device_gpu)
    return memory_location::gpu(d.device_index().value_or(0));
  return memory_location::host();
}

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
  struct step {
    enum class kind : std::uint8_t { kernel, fused, send, recv };
    kind k = kind::kernel;
    node_id id = no_node;
    kernel_fn kernel = nullptr;
    bool blocking = false;       // the kernel may wait for other steps (op_def::blocking)
    bool kept = false;           // a constant on a GPU: made by its first run, then kept
    memory_location where{};     // a kernel's device: its inputs are copied there
    std::vector<node_id> inputs; // no_node at ref-input positions
    std::vector<node_id> refs;   // the variable nodes of ref inputs
    std::vector<node_id> after;  // control inputs
    transfer_def transfer{};     // a send's or recv's attributes
    // A kernel's attributes, as its first run decodes them (kernel_context::decoded).
    std::shared_ptr<decoded_attrs> attrs;
    // A fused region: its kernel (the CPU's, or the GPU's for a region on a
    // GPU) and leaves, and the primitive steps that compute the same value
    // when the fused kernel declines the shapes.
    fused_kernel_fn fused = nullptr;
    gpu_fused_kernel_fn gpu_fused = nullptr;
    std::vector<node_id> leaves;
    std::vector<step> fallback;
  };

  // allow_fusion = false runs every fusable region as its primitive ops (the
  // path a process without the region's instantiation takes), for testing.
  // `placed` gives each node id's device (empty: each node's assigned_device);
  // a node on a GPU runs its GPU kernel. A region fuses where all its nodes
  // are on one device whose fused kernel the process has (lowering registers
  // the GPU's only in a unit compiled by nvcc).
  plan(const graph& g, const run_request& req, bool allow_fusion = true,
       std::vector<memory_location> placed = {})
      : request_(req) {
    std::unordered_set<node_id> fed(req.fed.begin(), req.fed.end());
    if (placed.empty())
      for (std::size_t id = 0; id < g.size(); ++id)
        placed.push_back(location_of(g.node(static_cast<node_id>(id))));
    // 1. The nodes the request needs.
    const std::vector<char> needed = needed_nodes(g, req);

    // 2. Consumers within the plan, for fusion and for releasing values.
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
      if (static_cast<std::size_t>(c->root) >= g.size() ||
          !needed[static_cast<std::size_t>(c->root)])
        continue;
      auto interior = region_interior(g, *c);
      const memory_location where = placed[static_cast<std::size_t>(c->root)];
      const auto& fused = detail::fused_kernel_registry::instance();
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

    // 4. Steps in id order.
    for (std::size_t i = 0; i < g.size(); ++i) {
      const node_id id = static_cast<node_id>(i);
      if (!needed[i] || fed.count(id) || fused_away.count(id))
        continue;
      if (auto it = fuse_at.find(id); it != fuse_at.end()) {
        step s;
        s.k = step::kind::fused;
        s.id = id;
        s.where = placed[i];
        if (s.where.on_host())
          s.fused = detail::fused_kernel_registry::instance().find(it->second->key);
        else
          s.gpu_fused = detail::fused_kernel_registry::instance().find_gpu(it->second->key);
        s.leaves = it->second->leaves;
        auto interior = *region_interior(g, *it->second);
        std::sort(interior.begin(), interior.end());
        for (node_id r : interior)
          s.fallback.push_back(make_step(g, r, s.where));
        s.fallback.push_back(make_step(g, id, s.where));
        s.inputs = s.leaves;
        on_gpu_ = on_gpu_ || !s.where.on_host();
        steps_.push_back(std::move(s));
      } else {
        steps_.push_back(make_step(g, id, placed[i]));
        on_gpu_ = on_gpu_ || !placed[i].on_host();
        blocks_ = blocks_ || steps_.back().blocking;
      }
    }

    // 5. The dependency graph between steps, and how many steps read each value.
    std::unordered_map<node_id, std::size_t> producer;
    for (std::size_t k = 0; k < steps_.size(); ++k)
      producer.emplace(steps_[k].id, k);
    consumers_.resize(steps_.size());
    pending_.assign(steps_.size(), 0);
    readers_.assign(g.size(), 0);
    for (std::size_t k = 0; k < steps_.size(); ++k) {
      std::set<std::size_t> deps;
      for (node_id in : steps_[k].inputs) {
        if (in == no_node)
          continue;
        ++readers_[static_cast<std::size_t>(in)];
        if (auto p = producer.find(in); p != producer.end())
          deps.insert(p->second);
      }
      for (node_id in : steps_[k].after)
        if (auto p = producer.find(in); p != producer.end())
          deps.insert(p->second);
      for (std::size_t d : deps)
        consumers_[d].push_back(k);
      pending_[k] = static_cast<int>(deps.size());
    }
    // Fed values are not kept: a kernel may forward one that nothing else holds
    // (a tensor a task received for this step, which an assign then adopts
    // without a copy); a caller's own fed tensor is never a sole owner.
    keep_.assign(g.size(), 0);
    for (node_id f : req.fetches)
      keep_[static_cast<std::size_t>(f)] = 1;
    variable_read_.assign(g.size(), 0);
    for (const step& s : steps_)
      if (g.node(s.id).op == "variable")
        variable_read_[static_cast<std::size_t>(s.id)] = 1;
  }

  const std::vector<step>& steps() const noexcept { return steps_; }
  const run_request& request() const noexcept { return request_; }

  // Has a kernel that may wait for other steps (a blocking op).
  bool blocks() const noexcept { return blocks_; }

private:
  friend class detail::plan_execution;

  static step make_step(const graph& g, node_id id, memory_location where = {}) {
    const node_def& n = g.node(id);
    const op_def& def = op_registry::instance().find(n.op);
    if (n.op == "placeholder")
      throw invalid_argument_error("you must feed a value for placeholder '" + n.name +
                                   "' with dtype " + std::string(to_string(n.type)) +
                                   " and shape " + n.shape.to_string());
    step s;
    s.id = id;
    s.after = n.control_inputs;
    if (n.op == "_send" || n.op == "_recv") {
      s.k = n.op == "_send" ? step::kind::send : step::kind::recv;
      s.inputs = n.inputs;
      s.transfer.key = n.attr<std::string>("key");
      if (s.k == step::kind::send) {
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
    s.kernel =
        kernel_registry::instance().find_for(n, t, where.on_host() ? device_cpu : device_gpu);
    s.attrs = std::make_shared<decoded_attrs>();
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      if (def.ref_inputs >> i & 1u) {
        s.inputs.push_back(no_node);
        s.refs.push_back(n.inputs[i]);
      } else {
        s.inputs.push_back(n.inputs[i]);
      }
    }
    return s;
  }

  // The region's nodes other than its root and leaves, or nothing when the
  // graph no longer has the shape lowering recorded.
  static std::optional<std::vector<node_id>> region_interior(const graph& g,
                                                             const fusion_candidate& c) {
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

  run_request request_;
  std::vector<step> steps_;
  std::vector<std::vector<std::size_t>> consumers_; // per step: the steps waiting on it
  std::vector<int> pending_;                        // per step: how many it waits on
  std::vector<int> readers_;                        // per node id: steps reading its value
  std::vector<char> keep_;                          // per node id: fetched
  std::vector<char> variable_read_;                 // per node id: a variable read by a step
  bool on_gpu_ = false;                             // some step runs on a GPU
  bool blocks_ = false;                             // some step runs a blocking kernel
  // GPU constants' values, by node id, kept by the plan's first step that made
  // them (shared by its concurrent steps).
  mutable std::mutex kept_mu_;
  mutable std::unordered_map<node_id, any_tensor> kept_;
  // The variables of the steps' variable nodes and ref inputs, by node id, as
  // resource_access::variable() returned them for `variables_generation_`
  // (plan_execution::variable_of): looked up by name once, not every step.
  mutable std::mutex variables_mu_;
  mutable std::uint64_t variables_generation_ = 0;
  mutable std::vector<variable_resource*> variables_;
};

} // namespace loom::detail

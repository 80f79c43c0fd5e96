// The executor: compiles a request (fetches, targets, fed nodes) into a plan
// once, then runs it as often as asked.
//
// Planning prunes the graph to what the request needs, looks every kernel up,
// replaces each fusable elementwise region by its fused kernel, and counts the
// readers of every value so memory follows the live set.
//
// Running is dataflow: a step runs once the steps it depends on have, lowest
// node id first. Without _recv nodes that is exactly node-id order (ids are a
// topological order); with them, a step waiting for a tensor from another task
// never blocks the steps that do not need it, so partitions that feed each
// other (a worker's gradients to a ps, the ps's variables back) cannot deadlock.
#pragma once

#include <loom/core/device_spec.hpp>
#include <loom/expr/eval.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/ops/transfer.hpp>
#include <loom/kernels/gpu_backend.hpp>
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <queue>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace loom {

struct run_request {
  std::vector<node_id> fetches;
  std::vector<node_id> targets;
  std::vector<node_id> fed;
};

// How a step's _send and _recv nodes reach other tasks: implemented by the
// worker service of a cluster task (runtime/rendezvous.hpp).
class step_rendezvous {
public:
  using recv_done = std::function<void(any_tensor value, std::exception_ptr error)>;
  virtual ~step_rendezvous() = default;
  // Starts delivering `value` (empty for a control edge) to the recv of `send`'s key.
  virtual void send(const node_def& send, const any_tensor& value) = 0;
  // Calls done exactly once: with the value, or with the error that ended the wait.
  virtual void recv(const node_def& recv, recv_done done) = 0;
  // Where blocking kernels learn that the step was aborted; nullptr if never.
  virtual step_cancellation* cancellation() noexcept { return nullptr; }
};

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

class plan {
public:
  struct step {
    enum class kind : std::uint8_t { kernel, fused, send, recv };
    kind k = kind::kernel;
    node_id id = no_node;
    kernel_fn kernel = nullptr;
    memory_location where{};     // a kernel's device: its inputs are copied there
    std::vector<node_id> inputs; // no_node at ref-input positions
    std::vector<node_id> refs;   // the variable nodes of ref inputs
    std::vector<node_id> after;  // control inputs
    // A fused region: its kernel and leaves, and the primitive steps that
    // compute the same value when the fused kernel declines the shapes.
    fused_kernel_fn fused = nullptr;
    std::vector<node_id> leaves;
    std::vector<step> fallback;
  };

  // allow_fusion = false runs every fusable region as its primitive ops (the
  // path a process without the region's instantiation takes), for testing.
  // `placed` gives each node id's device (empty: each node's assigned_device);
  // a node on a GPU runs its GPU kernel and is never fused.
  plan(const graph& g, const run_request& req, bool allow_fusion = true,
       std::vector<memory_location> placed = {})
      : request_(req) {
    std::unordered_set<node_id> fed(req.fed.begin(), req.fed.end());
    if (placed.empty())
      for (std::size_t id = 0; id < g.size(); ++id)
        placed.push_back(location_of(g.node(static_cast<node_id>(id))));
    auto on_host = [&](node_id id) { return placed[static_cast<std::size_t>(id)].on_host(); };
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
      if (!interior || !fused_kernel_registry::instance().find(c->key))
        continue;
      bool ok = !fed.count(c->root) && !fused_away.count(c->root) && !fuse_at.count(c->root) &&
                on_host(c->root);
      std::unordered_set<node_id> region(interior->begin(), interior->end());
      region.insert(c->root);
      for (node_id id : *interior) {
        if (!ok)
          break;
        const node_def& n = g.node(id);
        ok = needed[static_cast<std::size_t>(id)] && !fed.count(id) && !fetched.count(id) &&
             !fused_away.count(id) && !fuse_at.count(id) && n.control_inputs.empty() && on_host(id);
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
        s.fused = fused_kernel_registry::instance().find(it->second->key);
        s.leaves = it->second->leaves;
        auto interior = *region_interior(g, *it->second);
        std::sort(interior.begin(), interior.end());
        for (node_id r : interior)
          s.fallback.push_back(make_step(g, r));
        s.fallback.push_back(make_step(g, id));
        s.inputs = s.leaves;
        steps_.push_back(std::move(s));
      } else {
        steps_.push_back(make_step(g, id, placed[i]));
        on_gpu_ = on_gpu_ || !placed[i].on_host();
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

  // Runs the plan. `values` is indexed by node id and holds the fed values on
  // entry; on return it holds the fetched ones. A plan with _send or _recv
  // nodes needs a rendezvous.
  void run(const graph& g, std::vector<any_tensor>& values, const cpu_device& device,
           resource_access& resources, step_rendezvous* rendezvous = nullptr) const {
    // What a _recv's callback touches outlives this call if the step fails
    // while a recv is still outstanding.
    struct arrivals {
      std::mutex mu;
      std::condition_variable cv;
      std::deque<std::tuple<std::size_t, any_tensor, std::exception_ptr>> items;
    };
    auto arrived = std::make_shared<arrivals>();
    std::vector<int> pending = pending_;
    std::vector<int> readers = readers_;
    std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> ready;
    for (std::size_t k = 0; k < steps_.size(); ++k)
      if (pending[k] == 0)
        ready.push(k);
    std::size_t done = 0, waiting = 0;

    // A plan with GPU steps keeps, beside each value, its copy at the other
    // location (host or GPU), made when the first reader elsewhere needs it.
    std::vector<any_tensor> elsewhere(on_gpu_ ? values.size() : 0);
    auto release = [&](node_id id) {
      if (keep_[static_cast<std::size_t>(id)])
        return;
      values[static_cast<std::size_t>(id)] = {};
      if (on_gpu_)
        elsewhere[static_cast<std::size_t>(id)] = {};
    };
    // The value of `id` at `where`: itself, or its copy there.
    auto value_at = [&](node_id id, memory_location where) -> const any_tensor& {
      const any_tensor& v = values[static_cast<std::size_t>(id)];
      if (!on_gpu_ || v.empty() || v.location() == where)
        return v;
      any_tensor& copy = elsewhere[static_cast<std::size_t>(id)];
      if (copy.empty() || copy.location() != where)
        copy = at_location(v, where);
      return copy;
    };
    auto finish = [&](std::size_t k) {
      ++done;
      const step& s = steps_[k];
      for (node_id in : s.inputs)
        if (in != no_node && --readers[static_cast<std::size_t>(in)] == 0)
          release(in);
      if (readers[static_cast<std::size_t>(s.id)] == 0)
        release(s.id);
      for (std::size_t c : consumers_[k])
        if (--pending[c] == 0)
          ready.push(c);
    };

    while (done < steps_.size()) {
      if (ready.empty()) {
        if (waiting == 0)
          throw internal_error("executor: no step is ready and none is waiting (a cycle?)");
        std::unique_lock lock(arrived->mu);
        arrived->cv.wait(lock, [&] { return !arrived->items.empty(); });
        auto items = std::move(arrived->items);
        arrived->items.clear();
        lock.unlock();
        for (auto& [k, value, error] : items) {
          --waiting;
          if (error)
            std::rethrow_exception(error);
          values[static_cast<std::size_t>(steps_[k].id)] = std::move(value);
          finish(k);
        }
        continue;
      }
      const std::size_t k = ready.top();
      ready.pop();
      const step& s = steps_[k];
      switch (s.k) {
      case step::kind::recv:
        if (!rendezvous)
          throw internal_error("executor: a _recv node without a rendezvous");
        ++waiting;
        rendezvous->recv(g.node(s.id), [arrived, k](any_tensor v, std::exception_ptr e) {
          std::lock_guard lock(arrived->mu);
          arrived->items.emplace_back(k, std::move(v), std::move(e));
          arrived->cv.notify_one();
        });
        continue;
      case step::kind::send:
        if (!rendezvous)
          throw internal_error("executor: a _send node without a rendezvous");
        rendezvous->send(g.node(s.id), value_at(s.inputs[0], memory_location::host()));
        break;
      case step::kind::fused:
        reread_variables(g, s, values, resources);
        if (on_gpu_) // a fused region runs on the host: its leaves are read there
          for (node_id l : s.leaves) {
            any_tensor& v = values[static_cast<std::size_t>(l)];
            if (!v.empty() && !v.on_host()) {
              value_at(l, memory_location::host());
              std::swap(v, elsewhere[static_cast<std::size_t>(l)]);
            }
          }
        run_fused(g, s, values, device, resources);
        break;
      case step::kind::kernel: {
        if (reread_variables(g, s, values, resources) && on_gpu_)
          for (node_id in : s.inputs)
            if (in != no_node && variable_read_[static_cast<std::size_t>(in)])
              elsewhere[static_cast<std::size_t>(in)] = {}; // the read may have changed
        std::uint32_t forwardable = 0;
        for (std::size_t i = 0; i < s.inputs.size() && i < 32; ++i) {
          const node_id in = s.inputs[i];
          if (in != no_node && readers[static_cast<std::size_t>(in)] == 1 &&
              !keep_[static_cast<std::size_t>(in)])
            forwardable |= 1u << i;
        }
        std::vector<const any_tensor*> inputs;
        inputs.reserve(s.inputs.size());
        for (node_id in : s.inputs)
          inputs.push_back(in == no_node ? nullptr : &value_at(in, s.where));
        run_step(g, s, inputs, values, device, resources, forwardable,
                 rendezvous ? rendezvous->cancellation() : nullptr);
        break;
      }
      }
      finish(k);
    }
    if (on_gpu_) // what the caller fetches, it reads on the host
      for (node_id f : request_.fetches)
        values[static_cast<std::size_t>(f)] = any_tensor(value_at(f, memory_location::host()));
  }

private:
  // TF reads a variable when its consumer runs, not when the variable's node
  // does: a read under a control dependency on an update sees the update.
  // True when the step reads a variable.
  bool reread_variables(const graph& g, const step& s, std::vector<any_tensor>& values,
                        resource_access& resources) const {
    bool read = false;
    for (node_id in : s.inputs) {
      if (in == no_node || !variable_read_[static_cast<std::size_t>(in)])
        continue;
      any_tensor& v = values[static_cast<std::size_t>(in)];
      if (v.empty())
        continue;
      variable_resource& r = resources.variable(g.node(in));
      std::lock_guard lock(r.mu);
      if (r.initialized) {
        read = read || !v.shares_buffer_with(r.value);
        v = r.value;
      }
    }
    return read;
  }

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
      return s;
    }
    const dtype t = def.type_input < 0 || n.inputs.empty()
                        ? n.type
                        : g.node(n.inputs[static_cast<std::size_t>(def.type_input)]).type;
    s.where = where;
    s.kernel =
        kernel_registry::instance().find_for(n, t, where.on_host() ? device_cpu : device_gpu);
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

  static void run_fused(const graph& g, const step& s, std::vector<any_tensor>& values,
                        const cpu_device& device, resource_access& resources) {
    std::vector<const any_tensor*> leaves;
    leaves.reserve(s.leaves.size());
    for (node_id l : s.leaves)
      leaves.push_back(&values[static_cast<std::size_t>(l)]);
    any_tensor out;
    if (s.fused(device, leaves, out, g.node(s.id).name)) {
      values[static_cast<std::size_t>(s.id)] = std::move(out);
      return;
    }
    for (const step& f : s.fallback) {
      std::vector<const any_tensor*> inputs;
      inputs.reserve(f.inputs.size());
      for (node_id in : f.inputs)
        inputs.push_back(in == no_node ? nullptr : &values[static_cast<std::size_t>(in)]);
      run_step(g, f, inputs, values, device, resources);
    }
    for (const step& f : s.fallback)
      if (f.id != s.id)
        values[static_cast<std::size_t>(f.id)] = {};
  }

  // Runs a kernel step on `inputs` (its data inputs, at the step's location).
  static void run_step(const graph& g, const step& s, std::span<const any_tensor* const> inputs,
                       std::vector<any_tensor>& values, const cpu_device& device,
                       resource_access& resources, std::uint32_t forwardable = 0,
                       step_cancellation* cancellation = nullptr) {
    const node_def& n = g.node(s.id);
    std::vector<variable_resource*> refs;
    refs.reserve(s.refs.size());
    for (node_id r : s.refs)
      refs.push_back(&resources.variable(g.node(r)));
    kernel_context ctx{n, inputs, refs, device, resources, {}, forwardable, cancellation};
    if (s.where.on_host()) {
      s.kernel(ctx);
    } else {
      gpu_backend* gpu = gpu_backend::registered();
      if (!gpu)
        throw internal_error("node " + n.describe() + " is placed on " + s.where.to_string() +
                             " but this process has no GPU backend");
      gpu->run(s.where.device, s.kernel, ctx);
    }
    values[static_cast<std::size_t>(s.id)] = std::move(ctx.output);
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
};

} // namespace loom

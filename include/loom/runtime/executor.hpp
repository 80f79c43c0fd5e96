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
#include <loom/runtime/interfaces.hpp>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <queue>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace loom {

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
  // Delivers what send() has held back. A rendezvous may hold sends back to
  // carry a burst of them to a task as one message; the executor flushes
  // before the step can wait (for a recv, in a blocking kernel) and when it
  // ends, so nothing it waits for hangs on a held send.
  virtual void flush() {}
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
    bool blocking = false;       // the kernel may wait for other steps (op_def::blocking)
    bool kept = false;           // a constant on a GPU: made by its first run, then kept
    memory_location where{};     // a kernel's device: its inputs are copied there
    std::vector<node_id> inputs; // no_node at ref-input positions
    std::vector<node_id> refs;   // the variable nodes of ref inputs
    std::vector<node_id> after;  // control inputs
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
      const auto& fused = fused_kernel_registry::instance();
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
          s.fused = fused_kernel_registry::instance().find(it->second->key);
        else
          s.gpu_fused = fused_kernel_registry::instance().find_gpu(it->second->key);
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

  // Runs the plan on the calling thread, which waits there for its recvs.
  // `values` is indexed by node id and holds the fed values on entry; on
  // return it holds the fetched ones. A plan with _send or _recv nodes needs a
  // rendezvous.
  void run(const graph& g, std::vector<any_tensor>& values, const cpu_device& device,
           resource_access& resources, step_rendezvous* rendezvous = nullptr) const {
    auto st =
        std::make_shared<execution>(*this, g, std::move(values), device, resources, rendezvous);
    while (!advance(st)) {
      std::unique_lock lock(st->mu);
      st->cv.wait(lock, [&] { return !st->arrived.empty(); });
    }
    values = std::move(st->values);
  }

  // Called once when a started step ends: with the values (as run() leaves
  // them), or with the error that ended it.
  using done_fn = std::function<void(std::vector<any_tensor>& values, std::exception_ptr error)>;

  // Runs the plan on the calling thread until it waits for a recv, then
  // returns; the thread that delivers the recv's value runs it on (TF's
  // executor continues where a recv completes too). A task's io thread that
  // receives a step's tensor so runs the step's next kernels itself, without
  // waking a thread that waits for it. `done` runs on the thread that ends the
  // step. Not for a plan that blocks(): its kernels would wait on that thread.
  // g, device, resources and rendezvous must outlive the step: `done` is the
  // place to release them.
  void start(const graph& g, std::vector<any_tensor> values, const cpu_device& device,
             resource_access& resources, step_rendezvous& rendezvous, done_fn done) const {
    if (blocks_)
      throw internal_error("executor: a plan with blocking kernels cannot run as continuations");
    auto st =
        std::make_shared<execution>(*this, g, std::move(values), device, resources, &rendezvous);
    st->on_done = std::move(done);
    drive(st);
  }

  // Has a kernel that may wait for other steps (a blocking op).
  bool blocks() const noexcept { return blocks_; }

private:
  // One step of the plan in flight: what run() and start() keep between the
  // kernels they run. Shared with the recv callbacks, which may come late
  // (the step failed while a recv was outstanding).
  struct execution {
    execution(const plan& p, const graph& g, std::vector<any_tensor> fed, const cpu_device& d,
              resource_access& r, step_rendezvous* rv)
        : g(g), values(std::move(fed)), device(d), resources(r), rendezvous(rv),
          pending(p.pending_), readers(p.readers_), elsewhere(p.on_gpu_ ? values.size() : 0) {
      for (std::size_t k = 0; k < p.steps_.size(); ++k)
        if (pending[k] == 0)
          ready.push(k);
    }
    const graph& g;
    std::vector<any_tensor> values; // by node id
    const cpu_device& device;
    resource_access& resources;
    step_rendezvous* rendezvous;
    std::vector<int> pending; // per step: inputs not yet computed
    std::vector<int> readers; // per node id: steps yet to read it
    std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> ready;
    // A plan with GPU steps keeps, beside each value, its copy at the other
    // location (host or GPU), made when the first reader elsewhere needs it.
    std::vector<any_tensor> elsewhere;
    std::size_t done = 0, waiting = 0;

    std::mutex mu; // guards what follows: recv callbacks come from other threads
    std::condition_variable cv;
    std::deque<std::tuple<std::size_t, any_tensor, std::exception_ptr>> arrived;
    bool suspended = false; // started, and no thread runs it: an arrival resumes it
    bool ended = false;     // started, and done was called: arrivals are dropped
    done_fn on_done;        // set: started (start()), else run()
  };

  // Runs what is ready. True when every step ran; false when the step waits
  // for a recv (a started step is then suspended, under the lock that its
  // next arrival takes).
  bool advance(const std::shared_ptr<execution>& st) const {
    execution& x = *st;
    while (x.done < steps_.size()) {
      if (x.ready.empty()) {
        if (x.waiting == 0)
          throw internal_error("executor: no step is ready and none is waiting (a cycle?)");
        x.rendezvous->flush();
        std::deque<std::tuple<std::size_t, any_tensor, std::exception_ptr>> items;
        {
          std::lock_guard lock(x.mu);
          if (x.arrived.empty()) {
            x.suspended = static_cast<bool>(x.on_done);
            return false;
          }
          items.swap(x.arrived);
        }
        for (auto& [k, value, error] : items) {
          --x.waiting;
          if (error)
            std::rethrow_exception(error);
          x.values[static_cast<std::size_t>(steps_[k].id)] = std::move(value);
          finish(x, k);
        }
        continue;
      }
      const std::size_t k = x.ready.top();
      x.ready.pop();
      const step& s = steps_[k];
      switch (s.k) {
      case step::kind::recv:
        if (!x.rendezvous)
          throw internal_error("executor: a _recv node without a rendezvous");
        ++x.waiting;
        x.rendezvous->recv(x.g.node(s.id), [this, st, k](any_tensor v, std::exception_ptr e) {
          bool resume = false;
          {
            std::lock_guard lock(st->mu);
            if (st->ended)
              return;
            st->arrived.emplace_back(k, std::move(v), std::move(e));
            resume = std::exchange(st->suspended, false);
            if (!st->on_done)
              st->cv.notify_one();
          }
          if (resume)
            drive(st);
        });
        continue;
      case step::kind::send:
        if (!x.rendezvous)
          throw internal_error("executor: a _send node without a rendezvous");
        x.rendezvous->send(x.g.node(s.id), value_at(x, s.inputs[0], memory_location::host()));
        break;
      case step::kind::fused:
        reread_inputs(x, s);
        run_fused(x, s);
        break;
      case step::kind::kernel: {
        if (s.kept && reuse_kept(x, s))
          break;
        reread_inputs(x, s);
        std::uint32_t forwardable = 0;
        for (std::size_t i = 0; i < s.inputs.size() && i < 32; ++i) {
          const node_id in = s.inputs[i];
          if (in != no_node && x.readers[static_cast<std::size_t>(in)] == 1 &&
              !keep_[static_cast<std::size_t>(in)])
            forwardable |= 1u << i;
        }
        std::vector<const any_tensor*> inputs;
        inputs.reserve(s.inputs.size());
        for (node_id in : s.inputs)
          inputs.push_back(in == no_node ? nullptr : &value_at(x, in, s.where));
        if (s.blocking && x.rendezvous)
          x.rendezvous->flush();
        run_step(x.g, s, inputs, x.values, x.device, x.resources, forwardable,
                 x.rendezvous ? x.rendezvous->cancellation() : nullptr);
        if (s.kept)
          keep(x, s);
        break;
      }
      }
      finish(x, k);
    }
    if (x.rendezvous)
      x.rendezvous->flush();
    if (on_gpu_) // what the caller fetches, it reads on the host
      for (node_id f : request_.fetches)
        x.values[static_cast<std::size_t>(f)] = any_tensor(value_at(x, f, memory_location::host()));
    return true;
  }

  // A started step: runs it until it waits or ends; at its end calls on_done.
  void drive(const std::shared_ptr<execution>& st) const {
    std::exception_ptr error;
    try {
      if (!advance(st))
        return; // an arrival resumes it
    } catch (...) {
      error = std::current_exception();
    }
    done_fn done;
    {
      std::lock_guard lock(st->mu);
      st->ended = true;
      done = std::move(st->on_done);
    }
    done(st->values, error);
  }

  void release(execution& x, node_id id) const {
    if (!keep_[static_cast<std::size_t>(id)])
      release_value(x, id);
  }
  void release_value(execution& x, node_id id) const {
    x.values[static_cast<std::size_t>(id)] = {};
    if (on_gpu_)
      x.elsewhere[static_cast<std::size_t>(id)] = {};
  }

  // The value of `id` at `where`: itself, or its copy there.
  const any_tensor& value_at(execution& x, node_id id, memory_location where) const {
    const any_tensor& v = x.values[static_cast<std::size_t>(id)];
    if (!on_gpu_ || v.empty() || v.location() == where)
      return v;
    any_tensor& copy = x.elsewhere[static_cast<std::size_t>(id)];
    if (copy.empty() || copy.location() != where)
      copy = at_location(v, where);
    return copy;
  }

  void finish(execution& x, std::size_t k) const {
    ++x.done;
    const step& s = steps_[k];
    for (node_id in : s.inputs)
      if (in != no_node && --x.readers[static_cast<std::size_t>(in)] == 0)
        release(x, in);
    if (x.readers[static_cast<std::size_t>(s.id)] == 0)
      release(x, s.id);
    for (std::size_t c : consumers_[k])
      if (--x.pending[c] == 0)
        x.ready.push(c);
  }

  // A GPU constant's value from an earlier step of this plan: a constant never
  // changes, and making it again costs a copy or a kernel on every step.
  // Readers never write it in place: the kept reference makes it shared.
  bool reuse_kept(execution& x, const step& s) const {
    std::lock_guard lock(kept_mu_);
    auto it = kept_.find(s.id);
    if (it == kept_.end())
      return false;
    x.values[static_cast<std::size_t>(s.id)] = it->second;
    return true;
  }
  void keep(execution& x, const step& s) const {
    std::lock_guard lock(kept_mu_);
    kept_.emplace(s.id, x.values[static_cast<std::size_t>(s.id)]);
  }

  // A step's variable inputs, read again (reread_variables); a copy at the
  // other location of a read that changed is dropped.
  void reread_inputs(execution& x, const step& s) const {
    if (reread_variables(x.g, s, x.values, x.resources) && on_gpu_)
      for (node_id in : s.inputs)
        if (in != no_node && variable_read_[static_cast<std::size_t>(in)])
          x.elsewhere[static_cast<std::size_t>(in)] = {}; // the read may have changed
  }

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
    s.blocking = def.blocking;
    s.kept = n.op == "constant" && !where.on_host();
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

  // A fused region at its location: the fused kernel, or its primitive steps
  // where the kernel declines the shapes. Its leaves are read at the region's
  // location, copied there once if they are elsewhere.
  void run_fused(execution& x, const step& s) const {
    std::vector<const any_tensor*> leaves;
    leaves.reserve(s.leaves.size());
    for (node_id l : s.leaves)
      leaves.push_back(&value_at(x, l, s.where));
    any_tensor out;
    const std::string& name = x.g.node(s.id).name;
    if (s.where.on_host() ? s.fused(x.device, leaves, out, name)
                          : gpu_of(x.g.node(s.id), s.where)
                                .run_fused(s.where.device, s.gpu_fused, leaves, out, name)) {
      x.values[static_cast<std::size_t>(s.id)] = std::move(out);
      return;
    }
    for (const step& f : s.fallback) {
      std::vector<const any_tensor*> inputs;
      inputs.reserve(f.inputs.size());
      for (node_id in : f.inputs)
        inputs.push_back(in == no_node ? nullptr : &value_at(x, in, f.where));
      run_step(x.g, f, inputs, x.values, x.device, x.resources);
    }
    for (const step& f : s.fallback)
      if (f.id != s.id)
        release_value(x, f.id);
  }

  // The GPU backend that runs node n on `where`; one clear error without one.
  static gpu_backend& gpu_of(const node_def& n, memory_location where) {
    gpu_backend* gpu = gpu_backend::registered();
    if (!gpu)
      throw internal_error("node " + n.describe() + " is placed on " + where.to_string() +
                           " but this process has no GPU backend");
    return *gpu;
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
    if (s.where.on_host())
      s.kernel(ctx);
    else
      gpu_of(n, s.where).run(s.where.device, s.kernel, ctx);
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
  bool blocks_ = false;                             // some step runs a blocking kernel
  // GPU constants' values, by node id, kept by the plan's first step that made
  // them (shared by its concurrent steps).
  mutable std::mutex kept_mu_;
  mutable std::unordered_map<node_id, any_tensor> kept_;
};

} // namespace loom

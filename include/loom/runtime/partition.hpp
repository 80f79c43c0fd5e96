// Partitioning (TF's graph_partition): the nodes a request needs, placed on
// devices, split into one graph per task. Every edge between tasks becomes a
// _send on the producer's task and a _recv on the consumer's, keyed by the
// producer's name and the consumer's task, so each tensor crosses once per
// step however many nodes on that task read it.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/serialize.hpp>
#include <loom/placement/placer.hpp>
#include <loom/runtime/executor.hpp>

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace loom::detail {

// One task's part of a request.
struct graph_partition {
  std::string task;             // "/job:ps/replica:0/task:0"
  detail::graph_image image;    // nodes with ids local to the partition
  std::vector<node_id> fetches; // local ids of the request's fetches on this task
  std::vector<node_id> fed;     // local ids of the request's fed nodes on this task
  std::vector<node_id> targets; // local ids of the nodes to run (all but ref-only variables)
  // Where fetches and fed are in the request's fetches and fed nodes, in the same order:
  // a master hands the task its feeds, and takes its fetches, as lists.
  std::vector<std::size_t> fetch_at, fed_at;
};

// What both masters give the placer for a session: its soft placement,
// logging and device filters, the device of the nodes that ask for none, and
// which kernels this program has.
LOOM_COMPILED_ONCE placer_options session_placement(bool allow_soft_placement,
                                                    bool log_device_placement,
                                                    std::vector<std::string> device_filters,
                                                    std::string default_device);

// The nodes to place for a request: those it runs, and the variables that its
// updates only reference (they must exist where the update runs, but are not
// read). ref_only is set for the latter.
LOOM_COMPILED_ONCE std::vector<node_def> nodes_to_place(const graph& g, const run_request& req,
                                                        std::set<node_id>& ref_only);

// `placed` holds nodes_to_place() with assigned_device set (placement/placer.hpp).
LOOM_COMPILED_ONCE std::vector<graph_partition> partition_graph(const graph& g,
                                                                const run_request& req,
                                                                const std::vector<node_def>& placed,
                                                                const std::set<node_id>& ref_only);

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE placer_options session_placement(bool allow_soft_placement,
                                                    bool log_device_placement,
                                                    std::vector<std::string> device_filters,
                                                    std::string default_device) {
  placer_options po;
  po.allow_soft_placement = allow_soft_placement;
  po.log_device_placement = log_device_placement;
  po.device_filters = std::move(device_filters);
  po.default_device = std::move(default_device);
  po.has_kernel = [](std::string_view op, dtype, std::string_view device_type) {
    return kernels::placeable_on(op, device_type);
  };
  return po;
}

LOOM_COMPILED_ONCE std::vector<node_def> nodes_to_place(const graph& g, const run_request& req,
                                                        std::set<node_id>& ref_only) {
  std::vector<char> needed = needed_nodes(g, req);
  const std::set<node_id> fed(req.fed.begin(), req.fed.end());
  for (std::size_t i = 0; i < needed.size(); ++i) {
    if (!needed[i] || fed.count(static_cast<node_id>(i)))
      continue;
    const node_def& n = g.node(static_cast<node_id>(i));
    const op_def& def = op_registry::instance().find(n.op);
    for (std::size_t k = 0; k < n.inputs.size(); ++k)
      if ((def.ref_inputs >> k & 1u) && !needed[static_cast<std::size_t>(n.inputs[k])]) {
        needed[static_cast<std::size_t>(n.inputs[k])] = 1;
        ref_only.insert(n.inputs[k]);
      }
  }
  std::vector<node_def> out;
  for (std::size_t i = 0; i < needed.size(); ++i)
    if (needed[i])
      out.push_back(g.node(static_cast<node_id>(i)));
  return out;
}

LOOM_COMPILED_ONCE std::vector<graph_partition> partition_graph(const graph& g,
                                                                const run_request& req,
                                                                const std::vector<node_def>& placed,
                                                                const std::set<node_id>& ref_only) {
  auto task_of = [](const node_def& n) {
    const device_spec d = device_spec::from_string(n.assigned_device);
    return "/job:" + d.job().value_or("localhost") +
           "/replica:" + std::to_string(d.replica().value_or(0)) +
           "/task:" + std::to_string(d.task().value_or(0));
  };
  std::map<node_id, const node_def*> by_id;
  std::map<node_id, std::string> task;
  for (const node_def& n : placed) {
    by_id.emplace(n.id, &n);
    task.emplace(n.id, task_of(n));
  }
  std::map<node_id, std::size_t> fed; // each fed node's position in req.fed
  for (std::size_t i = 0; i < req.fed.size(); ++i)
    fed.emplace(req.fed[i], i);

  std::map<std::string, graph_partition> parts;
  // Local id of a value on a task: the node itself, or the _recv that brings it.
  std::map<std::pair<std::string, node_id>, node_id> local;
  std::map<std::pair<std::string, node_id>, node_id> local_control;
  auto part = [&](const std::string& t) -> graph_partition& {
    auto& p = parts[t];
    p.task = t;
    p.image.version = detail::graph_format_version;
    return p;
  };
  auto add = [](graph_partition& p, node_def n) {
    n.id = static_cast<node_id>(p.image.nodes.size());
    p.image.nodes.push_back(std::move(n));
    return p.image.nodes.back().id;
  };
  // A constant read on another task is built there too (it is immutable, and
  // small next to sending it every step): only its registration carries it.
  auto copied_to_readers = [&](node_id id) {
    const node_def& n = *by_id.at(id);
    return n.op == "constant" && n.control_inputs.empty() && !fed.count(id);
  };
  // Which tasks read each node, by data and by control edges, and which build
  // their own copy of a constant.
  std::map<node_id, std::set<std::string>> data_readers, control_readers, copies;
  for (const node_def& n : placed) {
    if (fed.count(n.id))
      continue;
    const op_def& def = op_registry::instance().find(n.op);
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      const node_id in = n.inputs[i];
      if (task.at(in) == task.at(n.id))
        continue;
      if (def.ref_inputs >> i & 1u)
        throw invalid_argument_error("node " + n.describe() + " on " + task.at(n.id) +
                                     " updates variable '" + by_id.at(in)->name + "' on " +
                                     task.at(in) + ": an update must run where its variable lives");
      (copied_to_readers(in) ? copies : data_readers)[in].insert(task.at(n.id));
    }
    for (node_id in : n.control_inputs)
      if (task.at(in) != task.at(n.id))
        control_readers[in].insert(task.at(n.id));
  }
  auto recv_into = [&](const std::string& t, node_id src, bool control) {
    auto& cache = control ? local_control : local;
    if (auto it = cache.find({t, src}); it != cache.end())
      return it->second;
    const node_def& s = *by_id.at(src);
    node_def r;
    r.op = "_recv";
    r.name = "_recv/" + s.name + (control ? "/control" : "") + "/to" + t;
    r.type = control ? dtype::f32 : s.type;
    r.shape = control ? loom::shape{} : s.shape;
    r.attrs = {{"key", s.name + (control ? "^" : "") + "->" + t},
               {"src_task", task.at(src)},
               {"dtype", r.type},
               {"shape", r.shape}};
    r.assigned_device = t;
    graph_partition& p = part(t);
    const node_id id = add(p, std::move(r));
    p.targets.push_back(id);
    cache[{t, src}] = id;
    return id;
  };

  for (const node_def& src : placed) { // placed is in id order: a topological order
    const std::string& t = task.at(src.id);
    graph_partition& p = part(t);
    node_def n = src;
    if (fed.count(n.id)) { // fed: a placeholder for the value the client sends
      n.op = "placeholder";
      n.inputs.clear();
      n.control_inputs.clear();
      n.attrs = {{"dtype", n.type}, {"shape", n.shape}};
    } else {
      for (node_id& in : n.inputs) {
        auto here = local.find({t, in}); // produced on t, or a constant copied to t
        in = here != local.end() ? here->second : recv_into(t, in, false);
      }
      for (node_id& in : n.control_inputs)
        in = task.at(in) == t ? local.at({t, in}) : recv_into(t, in, true);
    }
    const node_id id = add(p, std::move(n));
    local[{t, src.id}] = id;
    if (auto c = copies.find(src.id); c != copies.end())
      for (const std::string& dst : c->second) {
        node_def copy = src;
        copy.assigned_device = dst;
        local[{dst, src.id}] = add(part(dst), std::move(copy));
      }
    if (!ref_only.count(src.id))
      p.targets.push_back(id);
    if (fed.count(src.id)) {
      p.fed.push_back(id);
      p.fed_at.push_back(fed.at(src.id));
    }
    for (bool control : {false, true}) {
      const auto& readers = control ? control_readers : data_readers;
      auto it = readers.find(src.id);
      if (it == readers.end())
        continue;
      for (const std::string& dst : it->second) {
        node_def s;
        s.op = "_send";
        s.name = "_send/" + src.name + (control ? "/control" : "") + "/to" + dst;
        s.inputs = {id};
        s.attrs = {{"key", src.name + (control ? "^" : "") + "->" + dst},
                   {"dst_task", dst},
                   {"control", control}};
        s.assigned_device = t;
        p.targets.push_back(add(p, std::move(s)));
      }
    }
  }
  for (std::size_t i = 0; i < req.fetches.size(); ++i) {
    const node_id f = req.fetches[i];
    graph_partition& p = parts.at(task.at(f));
    p.fetches.push_back(local.at({p.task, f}));
    p.fetch_at.push_back(i);
  }
  // Fused regions whose root, interior and leaves all landed on one task.
  for (const fusion_candidate& c : g.fusions()) {
    auto root = task.find(c.root);
    if (root == task.end())
      continue;
    graph_partition& p = parts.at(root->second);
    fusion_candidate local_c{local.at({p.task, c.root}), c.key, {}};
    bool ok = true;
    for (node_id l : c.leaves) {
      auto it = local.find({p.task, l});
      if (it == local.end()) {
        ok = false;
        break;
      }
      local_c.leaves.push_back(it->second);
    }
    if (ok)
      p.image.fusions.push_back(std::move(local_c));
  }
  std::vector<graph_partition> out;
  for (auto& [t, p] : parts)
    out.push_back(std::move(p));
  return out;
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// The master of a session without a target (TF's DirectSession): it places the
// nodes a request needs on this process's devices, compiles the request into a
// plan once per graph version, and runs the plan on its own thread pool over
// its own resource containers.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/kernels/cpu/cpu_pool.hpp>
#include <loom/runtime/captured_step.hpp>
#include <loom/runtime/executor.hpp>
#include <loom/runtime/interfaces.hpp>
#include <loom/runtime/partition.hpp>
#include <loom/runtime/resource_manager.hpp>
#include <loom/runtime/step_tracer.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace loom::detail {

class local_master final : public master_interface {
public:
  explicit local_master(const session_options& o)
      : cpu_(detail::intra_op_threads(o.intra_op_threads)), allow_fusion_(!o.disable_fusion),
        gpu_graphs_(o.gpu_graphs),
        placement_(
            session_placement(o.allow_soft_placement, o.log_device_placement, {}, local_cpu)),
        placement_log_(o.placement_log) {}

  std::vector<any_tensor> run(const graph& g, const run_request& req, std::vector<any_tensor> feeds,
                              step_stats* trace) override;

private:
  static constexpr const char* local_task = "/job:localhost/replica:0/task:0";
  static constexpr const char* local_cpu = "/job:localhost/replica:0/task:0/device:CPU:0";

  // A request's plan, and what its runs keep.
  struct cached_plan {
    cached_plan(const graph& g, const run_request& req, bool allow_fusion,
                std::vector<memory_location> placed)
        : p(g, req, allow_fusion, std::move(placed)), caches(p) {}
    const plan p;
    plan_caches caches;
    captured_step capture; // its CUDA graph, for a plan on one GPU
  };

  cached_plan& plan_for(const graph& g, const run_request& req);

  // Places the nodes a request runs on this process's devices (the placer's
  // rules and messages, as on a cluster): each node id's location.
  std::vector<memory_location> place_nodes(const graph& g, const run_request& req) const;

  resource_manager resources_;
  kernels::cpu_pool cpu_; // the intra-op pool its steps' CPU kernels run on
  std::map<std::string, std::unique_ptr<cached_plan>> plans_;
  std::uint64_t planned_version_ = 0;
  bool allow_fusion_ = true;
  bool gpu_graphs_ = true;
  std::uint64_t traced_steps_ = 0; // a local step's id in its trace
  placer_options placement_;
  mutable placement_log placement_log_; // each node's line once for the session's graph
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE auto local_master::run(const graph& g, const run_request& req,
                                          std::vector<any_tensor> feeds, step_stats* trace)
    -> std::vector<any_tensor> {
  cached_plan& c = plan_for(g, req);
  if (!trace && gpu_graphs_ && c.p.on_gpu())
    return c.capture.run(c.p, c.caches, g, std::move(feeds), cpu_.device(), resources_);
  if (!trace)
    return run_plan(c.p, c.caches, g, std::move(feeds), cpu_.device(), resources_);
  // One task, on the client's own clock.
  this_thread_role() = "client";
  step_tracer tracer;
  const std::int64_t start = steady_now_ns();
  auto fetched =
      run_plan(c.p, c.caches, g, std::move(feeds), cpu_.device(), resources_, nullptr, &tracer);
  *trace = step_stats{++traced_steps_, start, steady_now_ns(), {}};
  task_trace t = tracer.finish();
  trace->tasks.push_back({local_task, std::move(t.nodes), std::move(t.thread_roles), 0, 0, 0, true,
                          std::move(t.gpu_memory)});
  return fetched;
}

LOOM_COMPILED_ONCE auto local_master::plan_for(const graph& g, const run_request& req)
    -> cached_plan& {
  if (g.version() != planned_version_) { // plans of an older graph are stale
    plans_.clear();
    planned_version_ = g.version();
  }
  const std::string key = req.key(g.version());
  auto it = plans_.find(key);
  if (it == plans_.end())
    it =
        plans_
            .emplace(key, std::make_unique<cached_plan>(g, req, allow_fusion_, place_nodes(g, req)))
            .first;
  return *it->second;
}

LOOM_COMPILED_ONCE auto local_master::place_nodes(const graph& g, const run_request& req) const
    -> std::vector<memory_location> {
  std::set<node_id> ref_only;
  std::vector<node_def> nodes = nodes_to_place(g, req, ref_only);
  std::vector<device_spec> devices{device_spec::from_string(local_cpu)};
  for (int i = 0, n = gpu_count(); i < n; ++i)
    devices.push_back(device_spec::from_string("/job:localhost/replica:0/task:0/device:GPU:" +
                                               std::to_string(i)));
  place(nodes, devices, placement_, placement_log_);
  std::vector<memory_location> placed(g.size());
  for (const node_def& n : nodes)
    placed[static_cast<std::size_t>(n.id)] = location_of(n);
  return placed;
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

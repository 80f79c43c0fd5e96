// The graph partitions that masters registered on a task (TF's GraphMgr): each
// planned once when it is registered, kept with what its runs cache, and found
// by handle for every step a master runs of it (runtime/step_driver.hpp runs it).
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/graph/graph.hpp>
#include <loom/kernels/registry.hpp>
#include <loom/runtime/executor.hpp>
#include <loom/runtime/interfaces.hpp>
#include <loom/runtime/plan.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

namespace loom::detail {

// A partition a master registered: its graph, the plan of the master's request
// on it (immutable), and what the plan's runs keep (plan_caches). Shared by the
// steps that run it, so a deregistration never pulls it from under one.
struct registered_partition {
  registered_partition(graph partition, const run_request& req);
  registered_partition(const registered_partition&) = delete;
  registered_partition& operator=(const registered_partition&) = delete;

  const graph g;
  const plan p; // after g, which it is made from
  plan_caches caches;
  bool may_wait = false;       // has a _recv or a blocking kernel: a step of it may wait
  std::set<std::string> peers; // the tasks it sends to or receives from
};

class graph_manager {
public:
  // `task` names the task in errors ("/job:ps/replica:0/task:0").
  explicit graph_manager(std::string task) : task_(std::move(task)) {}

  // Plans `partition` for `req` (node ids of the partition) and returns its handle.
  std::uint64_t add(graph partition, const run_request& req);

  void remove(std::uint64_t handle) {
    std::lock_guard lock(mu_);
    partitions_.erase(handle);
  }

  std::size_t size() const {
    std::lock_guard lock(mu_);
    return partitions_.size();
  }

  // The partition `handle`, for a step with `feeds` values: aborted_error where the task
  // has none by that handle, invalid_argument_error where the feeds are not its fed nodes'.
  std::shared_ptr<registered_partition> find(std::uint64_t handle, std::size_t feeds) const;

private:
  std::string task_;
  mutable std::mutex mu_;
  std::map<std::uint64_t, std::shared_ptr<registered_partition>> partitions_;
  std::uint64_t next_handle_ = 0;
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE registered_partition::registered_partition(graph partition,
                                                              const run_request& req)
    : g(std::move(partition)), p(g, req), caches(p) {
  for (const plan::item& s : p.items()) {
    const node_def& n = g.node(s.id);
    may_wait = may_wait || s.k == plan::item::kind::recv ||
               (s.k == plan::item::kind::kernel && op_registry::instance().find(n.op).blocking);
    if (s.k == plan::item::kind::recv || s.k == plan::item::kind::send)
      peers.insert(s.transfer.peer_task);
  }
}

LOOM_COMPILED_ONCE std::uint64_t graph_manager::add(graph partition, const run_request& req) {
  auto part = std::make_shared<registered_partition>(std::move(partition), req);
  std::lock_guard lock(mu_);
  const std::uint64_t handle = ++next_handle_;
  partitions_.emplace(handle, std::move(part));
  return handle;
}

LOOM_COMPILED_ONCE auto graph_manager::find(std::uint64_t handle, std::size_t feeds) const
    -> std::shared_ptr<registered_partition> {
  std::shared_ptr<registered_partition> part;
  {
    std::lock_guard lock(mu_);
    auto it = partitions_.find(handle);
    if (it == partitions_.end())
      // Aborted, as TF's worker says: the task restarted since the session
      // registered the graph, and a recreated session registers it again.
      throw aborted_error(task_ + " has no registered graph " + std::to_string(handle) +
                          " (the task restarted since the session registered it)");
    part = it->second;
  }
  if (feeds != part->p.fed().size())
    throw invalid_argument_error(task_ + ": a step of graph " + std::to_string(handle) + " needs " +
                                 std::to_string(part->p.fed().size()) + " feeds, got " +
                                 std::to_string(feeds));
  return part;
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

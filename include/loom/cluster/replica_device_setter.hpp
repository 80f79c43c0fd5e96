// replica_device_setter from a cluster (TF's replica_device_setter(cluster=...)):
// ps_tasks is the number of tasks of ps_device's job in the cluster.
//
//   auto setter = loom::make_replica_device_setter(cluster, {.worker_device =
//   "/job:worker/task:1"}); auto scope = g.device(setter);
#pragma once

#include <loom/cluster/cluster_spec.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/device_spec.hpp>
#include <loom/core/error.hpp>
#include <loom/placement/replica_device_setter.hpp>
#include <loom/placement/strategies.hpp>

#include <concepts>
#include <string>
#include <utility>

namespace loom {

namespace detail {
LOOM_COMPILED_ONCE replica_options with_cluster_ps_tasks(const cluster_spec& cluster,
                                                         replica_options o);
} // namespace detail

// The strategy is made as Strategy(ps_tasks).
template <class Strategy = round_robin>
requires std::constructible_from<Strategy, int> replica_device_setter<Strategy>
make_replica_device_setter(const cluster_spec& cluster, replica_options options = {}) {
  return replica_device_setter<Strategy>(
      detail::with_cluster_ps_tasks(cluster, std::move(options)));
}

// With a strategy made by the caller (e.g. greedy_load_balancing with a custom load).
template <class Strategy>
replica_device_setter<Strategy> make_replica_device_setter(const cluster_spec& cluster,
                                                           replica_options options,
                                                           Strategy strategy) {
  return replica_device_setter<Strategy>(detail::with_cluster_ps_tasks(cluster, std::move(options)),
                                         std::move(strategy));
}

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE replica_options with_cluster_ps_tasks(const cluster_spec& cluster,
                                                         replica_options o) {
  device_spec ps;
  try {
    ps = device_spec::from_string(o.ps_device);
  } catch (const error& e) {
    throw invalid_argument_error("make_replica_device_setter: ps_device: " + e.message());
  }
  if (!ps.job())
    throw invalid_argument_error("make_replica_device_setter: ps_device \"" + o.ps_device +
                                 "\" names no job, so the cluster cannot say how many ps tasks "
                                 "there are; pass ps_tasks to replica_device_setter instead");
  if (!cluster.has_job(*ps.job()))
    throw invalid_argument_error("make_replica_device_setter: the cluster " + cluster.to_string() +
                                 " has no job '" + *ps.job() + "' for ps_device \"" + o.ps_device +
                                 "\"");
  o.ps_tasks = cluster.num_tasks(*ps.job());
  return o;
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

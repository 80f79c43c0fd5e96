// TF's tf.train.replica_device_setter as a placement policy: ps ops
// (variables by default) go to the ps tasks chosen by a strategy, every other
// op to the worker device, each merged with the device the inner scopes
// requested. The rules are TF's _ReplicaDeviceChooser.device_function:
//
//   if not merge_devices and current is set:   current
//   if ps_tasks and ps_device and op in ps_ops:
//     d = ps_device
//     if d.job and (current.job unset or current.job == d.job): d.task = strategy(node)
//     d merged with current (current wins)
//   else: worker_device merged with current (current wins)
//
// So an inner `g.device("/job:worker/task:1")` scope keeps a variable on the
// worker without consuming a ps task, and an inner "/cpu:0" only fills the
// device type. With a cluster_spec, use make_replica_device_setter in
// loom/cluster/ (ps_tasks = the number of tasks of ps_device's job).
#pragma once

#include <loom/core/device_spec.hpp>
#include <loom/core/error.hpp>
#include <loom/graph/node.hpp>
#include <loom/placement/policy.hpp>
#include <loom/placement/strategies.hpp>

#include <algorithm>
#include <concepts>
#include <string>
#include <utility>
#include <vector>

namespace loom {

// TF's parameters, for designated initializers:
//   replica_device_setter({.ps_tasks = 2, .worker_device = "/job:worker/task:1"})
struct replica_options {
  int ps_tasks = 0;                  // 0: no ps placement, every op to the worker
  std::string ps_device = "/job:ps"; // "" for no ps job
  std::string worker_device = "/job:worker";
  bool merge_devices = true; // false: a node with a device keeps it unchanged
  std::vector<std::string> ps_ops = detail::variable_op_ids(); // op ids placed on ps tasks
};

template <class Strategy = round_robin> class replica_device_setter {
  static_assert(ps_strategy<Strategy>,
                "loom::replica_device_setter<Strategy>: Strategy must be a copyable type "
                "callable as int(const loom::node_def&) returning a ps task index");

public:
  // The strategy is made from the number of ps tasks (Strategy(ps_tasks)).
  explicit replica_device_setter(
      const replica_options& o) requires std::constructible_from<Strategy, int>
      : replica_device_setter(o, Strategy(o.ps_tasks)) {}

  replica_device_setter(replica_options o, Strategy strategy)
      : options_(std::move(o)), strategy_(std::move(strategy)),
        ps_device_(parse("ps_device", options_.ps_device)),
        worker_device_(parse("worker_device", options_.worker_device)) {
    if (options_.ps_tasks < 0)
      throw invalid_argument_error("replica_device_setter: ps_tasks must not be negative, got " +
                                   std::to_string(options_.ps_tasks));
  }

  device_spec operator()(const node_def& n, const device_spec& current) {
    if (!options_.merge_devices && !current.empty())
      return current;
    if (options_.ps_tasks > 0 && !ps_device_.empty() && is_ps_op(n)) {
      device_spec d = ps_device_;
      if (d.job() && (!current.job() || current.job() == d.job())) {
        const int task = static_cast<int>(strategy_(n));
        if (task < 0 || task >= options_.ps_tasks)
          throw invalid_argument_error("replica_device_setter: the ps strategy chose task " +
                                       std::to_string(task) + " for node " + n.describe() +
                                       ", but there are " + std::to_string(options_.ps_tasks) +
                                       " ps tasks");
        d.with_task(task);
      }
      return device_spec::merged(std::move(d), current);
    }
    return device_spec::merged(worker_device_, current);
  }

  const replica_options& options() const noexcept { return options_; }
  const Strategy& strategy() const noexcept { return strategy_; }

private:
  static device_spec parse(const char* what, const std::string& s) {
    try {
      return device_spec::from_string(s);
    } catch (const error& e) {
      throw invalid_argument_error(std::string("replica_device_setter: ") + what + ": " +
                                   e.message());
    }
  }
  bool is_ps_op(const node_def& n) const {
    return std::find(options_.ps_ops.begin(), options_.ps_ops.end(), n.op) != options_.ps_ops.end();
  }

  replica_options options_;
  Strategy strategy_;
  device_spec ps_device_;
  device_spec worker_device_;
};

replica_device_setter(const replica_options&)->replica_device_setter<round_robin>;
template <class Strategy>
replica_device_setter(replica_options, Strategy) -> replica_device_setter<Strategy>;

} // namespace loom

// Parameter-server strategies for replica_device_setter: which ps task gets
// the next ps op (TF's _RoundRobinStrategy and GreedyLoadBalancingStrategy).
//
// A strategy is a copyable type callable as `int s(const node_def&)`,
// returning a task index in [0, num_tasks). Copies of a library strategy share
// their state (as every use of one TF device function does), so two scopes
// opened with the same replica_device_setter continue one round robin.
#pragma once

#include <loom/core/dtype.hpp>
#include <loom/core/error.hpp>
#include <loom/core/shape.hpp>
#include <loom/graph/node.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace loom {

// clang-format off
template <class S>
concept ps_strategy = std::copy_constructible<S> && std::invocable<S&, const node_def&> &&
                      std::convertible_to<std::invoke_result_t<S&, const node_def&>, int>;
// clang-format on

namespace detail {
inline void check_num_tasks(const char* who, int num_tasks) {
  if (num_tasks <= 0)
    throw invalid_argument_error(std::string(who) +
                                 ": the number of ps tasks must be positive, got " +
                                 std::to_string(num_tasks));
}
} // namespace detail

// Tasks 0, 1, ..., num_tasks - 1, 0, 1, ... in the order ps ops are created.
class round_robin {
public:
  explicit round_robin(int num_tasks) : num_tasks_(num_tasks) {}

  int operator()(const node_def&) const {
    detail::check_num_tasks("loom::round_robin", num_tasks_);
    const int task = *next_ % num_tasks_;
    *next_ = (task + 1) % num_tasks_;
    return task;
  }
  int num_tasks() const noexcept { return num_tasks_; }

private:
  int num_tasks_;
  std::shared_ptr<int> next_ = std::make_shared<int>(0);
};

// TF's byte_size_load_fn: the bytes of the node's single output, from its
// shape and dtype (falling back to a "shape" attribute, as TF does for
// variables whose output shape is not yet known). Strings count
// sizeof(std::string) per element.
struct byte_size_load {
  std::int64_t operator()(const node_def& n) const {
    loom::shape s = n.shape;
    if (!s.fully_defined()) {
      if (const auto* attr = n.has_attr("shape") ? &n.attrs.find("shape")->second : nullptr)
        if (const auto* a = std::get_if<loom::shape>(attr))
          s = *a;
    }
    if (!s.fully_defined())
      throw invalid_argument_error("byte_size_load: node " + n.describe() +
                                   " has the partial shape " + s.to_string() +
                                   "; its size in bytes is unknown");
    return s.num_elements() * static_cast<std::int64_t>(size_of(n.type));
  }
};

// TF's GreedyLoadBalancingStrategy: the least loaded task so far (the lowest
// index among equals), then adds load(node) to it.
template <class LoadFn = byte_size_load> class greedy_load_balancing {
  static_assert(std::is_invocable_v<LoadFn&, const node_def&> &&
                    std::is_arithmetic_v<std::invoke_result_t<LoadFn&, const node_def&>>,
                "loom::greedy_load_balancing<LoadFn>: LoadFn must be callable as "
                "number(const loom::node_def&)");

public:
  explicit greedy_load_balancing(int num_tasks, LoadFn load = {})
      : load_(std::move(load)), loads_(std::make_shared<std::vector<double>>(
                                    static_cast<std::size_t>(num_tasks > 0 ? num_tasks : 0), 0.0)) {
  }

  int operator()(const node_def& n) {
    detail::check_num_tasks("loom::greedy_load_balancing", static_cast<int>(loads_->size()));
    std::vector<double>& loads = *loads_;
    std::size_t best = 0;
    for (std::size_t t = 1; t < loads.size(); ++t)
      if (loads[t] < loads[best])
        best = t;
    loads[best] += static_cast<double>(load_(n));
    return static_cast<int>(best);
  }

  // The load assigned to each task so far.
  const std::vector<double>& loads() const noexcept { return *loads_; }
  int num_tasks() const noexcept { return static_cast<int>(loads_->size()); }

private:
  LoadFn load_;
  std::shared_ptr<std::vector<double>> loads_;
};

} // namespace loom

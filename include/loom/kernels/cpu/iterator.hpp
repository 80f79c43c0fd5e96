// CPU kernels of the iterator ops (graph/ops/iterator.hpp): the iterator is a resource
// in the task's container "iterators" under its dataset's key, made from the process's
// dataset_registry at its first pull or restore. A pull keeps its element's tensors
// under its ticket until the step's components take them; only the last few tickets
// are kept (a step takes its tensors right after its pull), so an element whose
// components a step does not run costs memory only until later pulls.
#pragma once

#include <loom/core/log.hpp>
#include <loom/graph/ops/iterator.hpp>
#include <loom/kernels/registry.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace loom::kernels {

struct iterator_resource : resource_base {
  using clock = std::chrono::steady_clock;
  struct pulled {
    std::int64_t ticket = 0;
    std::vector<std::optional<any_tensor>> parts; // nullopt once a component took it
    float wait_ms = 0;
  };
  static constexpr std::size_t tickets_kept = 4;
  // Whether the input keeps up: over each window of this many pulls after the first
  // (which starts the pipeline's threads), the share of the time between pulls that
  // was spent waiting for the element; above slow_share, said once in the log.
  static constexpr std::int64_t window = 50;
  static constexpr double slow_share = 0.1;

  std::mutex mu;
  std::unique_ptr<detail::component_iterator> it; // made at the first pull or restore
  std::int64_t pulls = 0;                         // tickets given, over every pass
  std::int64_t pass_first_ticket = 0;             // the current pass's first
  std::deque<pulled> recent;                      // the last tickets_kept pulls, oldest first
  std::optional<clock::time_point> last_pull_end;
  double window_wait_ms = 0, window_total_ms = 0;
  std::int64_t window_pulls = 0;
  bool said_slow = false;

  // Under mu: the element of `ticket`, or an error naming the node.
  pulled& find(std::int64_t ticket, const node_def& n) {
    for (auto& p : recent)
      if (p.ticket == ticket)
        return p;
    throw internal_error("node " + n.describe() + ": the element of pull " +
                         std::to_string(ticket) + " is gone (" + std::to_string(tickets_kept) +
                         " later pulls came before this step's components ran)");
  }
  // Under mu: the wait and the time since the last pull, counted over a window.
  void account(const node_def& n, clock::time_point start, clock::time_point end) {
    const double wait = std::chrono::duration<double, std::milli>(end - start).count();
    if (last_pull_end) {
      window_wait_ms += wait;
      window_total_ms += std::chrono::duration<double, std::milli>(end - *last_pull_end).count();
      if (++window_pulls == window) {
        if (!said_slow && window_wait_ms > slow_share * window_total_ms) {
          said_slow = true;
          char line[400];
          std::snprintf(line, sizeof line,
                        "iterator '%s': the input pipeline does not keep up: over %lld steps "
                        "the steps waited %.2f ms a step for their batches, %.0f %% of the "
                        "%.2f ms between steps (read ahead more: prefetch, map's "
                        "num_parallel_calls, a parallel interleave)",
                        n.name.c_str(), static_cast<long long>(window), window_wait_ms / window,
                        100 * window_wait_ms / window_total_ms, window_total_ms / window);
          logging::warn(line);
        }
        window_wait_ms = window_total_ms = 0;
        window_pulls = 0;
      }
    }
    last_pull_end = end;
  }
};

inline std::shared_ptr<iterator_resource> iterator_of(kernel_context& c) {
  const std::string& key = c.node.attr<std::string>("dataset");
  const node_def& n = c.node;
  return std::dynamic_pointer_cast<iterator_resource>(
      c.resources.resource("iterators", key, [&]() -> std::shared_ptr<resource_base> {
        auto r = std::make_shared<iterator_resource>();
        detail::dataset_registry::instance().find(key, n); // fails now where the dataset is unknown
        return r;
      }));
}

// A one-shot iterator's pass, made at its first pull or restore.
inline void make_iterator(iterator_resource& r, const node_def& n) {
  r.it = detail::dataset_registry::instance().find(n.attr<std::string>("dataset"), n)({});
}

template <class T> struct iterator_get_next_cpu {
  static void run(kernel_context& c) {
    auto r = iterator_of(c);
    std::lock_guard lock(r->mu);
    if (!r->it) {
      if (c.node.attr_or<bool>("initializable", false))
        throw failed_precondition_error(
            "iterator " + c.node.describe() +
            ": not initialized: run its initializer() before the first pull "
            "(make_initializable_iterator)");
      make_iterator(*r, c.node);
    }
    const auto start = iterator_resource::clock::now();
    auto parts = r->it->next();
    const auto end = iterator_resource::clock::now();
    if (!parts)
      throw out_of_range_error("iterator " + c.node.describe() + ": end of input after " +
                               std::to_string(r->pulls - r->pass_first_ticket) + " elements");
    r->account(c.node, start, end);
    iterator_resource::pulled p;
    p.ticket = r->pulls++;
    for (auto& t : *parts)
      p.parts.emplace_back(std::move(t));
    p.wait_ms = std::chrono::duration<float, std::milli>(end - start).count();
    r->recent.push_back(std::move(p));
    if (r->recent.size() > iterator_resource::tickets_kept)
      r->recent.pop_front();
    c.output = any_tensor::scalar<std::int64_t>(r->recent.back().ticket);
  }
};

template <class T> struct iterator_component_cpu {
  static void run(kernel_context& c) {
    auto r = iterator_of(c);
    const auto index = static_cast<std::size_t>(c.node.attr<std::int64_t>("index"));
    std::lock_guard lock(r->mu);
    auto& p = r->find(*c.input(0).data<std::int64_t>(), c.node);
    if (index >= p.parts.size() || !p.parts[index])
      throw internal_error("node " + c.node.describe() + ": element " + std::to_string(p.ticket) +
                           (index >= p.parts.size()
                                ? " has " + std::to_string(p.parts.size()) + " tensors"
                                : "'s tensor was taken already"));
    any_tensor t = std::move(*p.parts[index]);
    p.parts[index].reset();
    const node_def& n = c.node;
    if (t.type() != n.type || t.rank() != n.shape.rank())
      throw internal_error("node " + n.describe() + ": the pipeline gave " + t.describe() +
                           " for a component of " + std::string(to_string(n.type)) +
                           n.shape.to_string());
    c.output = std::move(t);
  }
};

template <class T> struct iterator_wait_ms_cpu {
  static void run(kernel_context& c) {
    auto r = iterator_of(c);
    std::lock_guard lock(r->mu);
    c.output = any_tensor::scalar<float>(r->find(*c.input(0).data<std::int64_t>(), c.node).wait_ms);
  }
};

template <class T> struct iterator_save_cpu {
  static void run(kernel_context& c) {
    auto r = iterator_of(c);
    std::lock_guard lock(r->mu);
    if (!r->it) // not pulled yet: the position of a fresh pass
      make_iterator(*r, c.node);
    std::ostringstream out;
    r->it->save(out);
    c.output = any_tensor::scalar<std::string>(std::move(out).str());
  }
};

template <class T> struct iterator_restore_cpu {
  static void run(kernel_context& c) {
    auto r = iterator_of(c);
    std::lock_guard lock(r->mu);
    make_iterator(*r, c.node); // a restore goes into a fresh pass
    std::istringstream in(*c.input(0).data<std::string>());
    r->it->restore(in);
    r->recent.clear();
    r->last_pull_end.reset();
  }
};

// A new pass of an initializable iterator, made from the initializer's inputs.
template <class T> struct iterator_init_cpu {
  static void run(kernel_context& c) {
    auto r = iterator_of(c);
    std::vector<any_tensor> args;
    for (const any_tensor* in : c.inputs)
      args.push_back(*in);
    auto pass = detail::dataset_registry::instance().find(c.node.attr<std::string>("dataset"),
                                                          c.node)(args);
    std::lock_guard lock(r->mu);
    r->it = std::move(pass);
    r->pass_first_ticket = r->pulls;
    r->recent.clear();
    r->last_pull_end.reset();
    r->window_wait_ms = r->window_total_ms = 0;
    r->window_pulls = 0;
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_iterator_kernels() {
  register_kernels<iterator_get_next_cpu>("iterator_get_next", type_list<std::int64_t>{});
  register_kernels<iterator_component_cpu>(
      "iterator_component",
      type_list<float, double, std::int32_t, std::int64_t, bool, std::string>{});
  register_kernels<iterator_wait_ms_cpu>("iterator_wait_ms", type_list<float>{});
  register_kernels<iterator_init_cpu>("iterator_init", type_list<std::int64_t>{});
  register_kernels<iterator_save_cpu>("iterator_save", type_list<std::string>{});
  register_kernels<iterator_restore_cpu>("iterator_restore", type_list<std::string>{});
  return true;
}

inline const bool iterator_kernels_registered = register_iterator_kernels();
#endif

} // namespace loom::kernels

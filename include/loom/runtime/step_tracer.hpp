// What the executor records of a traced step on one task (run_options'
// trace_level::full): each node's start and end on this task's steady clock
// and the thread that ran it. The executor holds a pointer to one only while
// tracing, so an untraced step pays one null test per node: no clock read, no
// allocation.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/graph/graph.hpp>
#include <loom/runtime/plan.hpp>
#include <loom/runtime/step_stats.hpp>
#include <loom/runtime/thread_role.hpp>

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace loom::detail {

// Nanoseconds on this host's steady clock (Linux: CLOCK_MONOTONIC, one per host).
inline std::int64_t steady_now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The OS id of the calling thread (what top and perf show), read once per thread.
inline std::int64_t this_thread_os_id() noexcept {
  thread_local const std::int64_t id = static_cast<std::int64_t>(::syscall(SYS_gettid));
  return id;
}

// One step of one partition on one task. Not locked: a step's plan runs on one
// thread at a time, and the executor's lock orders the threads it moves between.
class step_tracer {
public:
  // `received_ns`: when the task received the request to run the step.
  explicit step_tracer(std::int64_t received_ns = steady_now_ns()) {
    trace_.received_ns = received_ns;
    if (kernels::gpu_backend* b = kernels::gpu_backend::registered())
      for (int d = 0; d < b->device_count(); ++d)
        b->reset_memory_peak(d); // the peak the timeline shows is the step's
  }

  // The executor asked for a _recv's value at `at`.
  void requested(node_id recv, std::int64_t at) { requested_[recv] = at; }

  // An item of the plan ran on this thread from start to end; for a _recv, its
  // value had arrived at `arrived`.
  void ran(const graph& g, const plan::item& s, std::int64_t start, std::int64_t end,
           std::int64_t arrived = 0);

  // The trace, answered at `answered_ns`; the tracer is spent.
  task_trace finish(std::int64_t answered_ns = steady_now_ns()) {
    trace_.answered_ns = answered_ns;
    if (kernels::gpu_backend* b = kernels::gpu_backend::registered())
      for (int d = 0; d < b->device_count(); ++d)
        if (const gpu_memory_info m = b->memory(d); m.allocated || m.cached || m.peak)
          trace_.gpu_memory.push_back({d, m.allocated, m.cached, m.peak});
    return std::move(trace_);
  }

private:
  task_trace trace_;
  std::unordered_map<node_id, std::int64_t> requested_;
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE void step_tracer::ran(const graph& g, const plan::item& s, std::int64_t start,
                                         std::int64_t end, std::int64_t arrived) {
  const node_def& n = g.node(s.id);
  node_exec_stats st;
  st.node_name = n.name;
  st.op = s.k == plan::item::kind::fused ? "fused" : n.op;
  st.start_ns = start;
  st.end_ns = end;
  st.thread_id = this_thread_os_id();
  trace_.thread_roles.try_emplace(st.thread_id, this_thread_role());
  if (s.k == plan::item::kind::fused)
    for (const plan::item& f : s.fallback)
      if (f.id != s.id)
        st.fused_nodes.push_back(g.node(f.id).name);
  if (s.k == plan::item::kind::send || s.k == plan::item::kind::recv) {
    st.transfer_key = s.transfer.key;
    st.peer_task = s.transfer.peer_task;
  }
  if (s.k == plan::item::kind::recv) {
    st.requested_ns = requested_[s.id];
    st.arrived_ns = arrived;
  }
  trace_.nodes.push_back(std::move(st));
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// How the cluster master puts the traces of a step's tasks on one clock, the
// client's (runtime/step_stats.hpp). Each task timed its part on its own
// steady clock; the hosts' clocks differ by anything. What bounds each task's
// offset (client time = task time + offset) is causality:
//
// - its run_graph round trip: the task received the request after the client
//   sent it, and answered before the client had the answer, so
//     sent <= received + offset  and  answered + offset <= answer seen;
// - every tensor it exchanged: a _recv's value reached the receiver after the
//   _send that carried it had run on the sender (the value leaves when the
//   executor flushes its sends, after the _send node), so
//     recv.arrived + offset_R >= send.end + offset_S.
//
// The true offsets satisfy all of these. The alignment takes, per task, the
// task's own clock where the round trip allows it (offset 0: a task on the
// client's host, whose steady clock is the host's, is then exact), else the
// middle of the round trip (NTP's estimate, exact when the two directions
// take as long); then it moves the offsets that are estimates, within their
// round trips, until no tensor arrives before its send ended. So every node
// of a task lies within the client's step, and a transfer's arrow never points
// back in time.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/runtime/step_stats.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace loom::detail {

// One task's part of a traced step as the client saw it.
struct timed_task_trace {
  std::string task;
  task_trace trace;           // on the task's clock
  std::int64_t sent_ns = 0;   // the client's clock: before the request went out
  std::int64_t answer_ns = 0; // the client's clock: once the answer was in
};

// The step's stats, every time on the client's clock.
LOOM_COMPILED_ONCE step_stats align_step_trace(std::uint64_t step_id, std::int64_t start_ns,
                                               std::int64_t end_ns,
                                               std::vector<timed_task_trace> tasks);

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE step_stats align_step_trace(std::uint64_t step_id, std::int64_t start_ns,
                                               std::int64_t end_ns,
                                               std::vector<timed_task_trace> tasks) {
  const std::size_t n = tasks.size();
  std::vector<std::int64_t> lo(n), hi(n), offset(n);
  std::vector<bool> same(n);
  for (std::size_t i = 0; i < n; ++i) {
    const timed_task_trace& t = tasks[i];
    lo[i] = t.sent_ns - t.trace.received_ns;
    hi[i] = t.answer_ns - t.trace.answered_ns;
    if (lo[i] > hi[i]) { // only a clock that ran at another rate over the step
      const std::int64_t middle = hi[i] + (lo[i] - hi[i]) / 2;
      lo[i] = hi[i] = middle;
    }
    same[i] = lo[i] <= 0 && 0 <= hi[i];
    offset[i] = same[i] ? 0 : lo[i] + (hi[i] - lo[i]) / 2;
  }

  // Each transfer between two tasks: offset[r] - offset[s] >= bound.
  struct constraint {
    std::size_t s, r;
    std::int64_t bound;
  };
  std::vector<constraint> constraints;
  {
    std::map<std::string, std::pair<std::size_t, std::int64_t>> sends; // key -> (task, end)
    for (std::size_t i = 0; i < n; ++i)
      for (const node_exec_stats& ns : tasks[i].trace.nodes)
        if (ns.is_send())
          sends[ns.transfer_key] = {i, ns.end_ns};
    for (std::size_t i = 0; i < n; ++i)
      for (const node_exec_stats& ns : tasks[i].trace.nodes)
        if (ns.is_recv())
          if (auto it = sends.find(ns.transfer_key); it != sends.end() && it->second.first != i)
            constraints.push_back({it->second.first, i, it->second.second - ns.arrived_ns});
  }
  // Relaxation: a violated transfer moves the receiver later and the sender
  // earlier, half each where their round trips leave room, the rest on
  // whichever can. Tasks taken on their own clock stay. Few tasks, few rounds.
  for (int round = 0; round < 64; ++round) {
    bool moved = false;
    for (const constraint& c : constraints) {
      std::int64_t deficit = c.bound - (offset[c.r] - offset[c.s]);
      if (deficit <= 0)
        continue;
      const std::int64_t up = same[c.r] ? 0 : hi[c.r] - offset[c.r];
      const std::int64_t down = same[c.s] ? 0 : offset[c.s] - lo[c.s];
      const std::int64_t raise = std::min(up, std::max(deficit / 2, deficit - down));
      offset[c.r] += raise;
      deficit -= raise;
      const std::int64_t lower = std::min(down, deficit);
      offset[c.s] -= lower;
      moved = moved || raise > 0 || lower > 0;
    }
    if (!moved)
      break;
  }

  step_stats out;
  out.step_id = step_id;
  out.start_ns = start_ns;
  out.end_ns = end_ns;
  out.tasks.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    task_step_stats ts;
    ts.task = std::move(tasks[i].task);
    ts.clock_offset_ns = offset[i];
    ts.offset_min_ns = lo[i];
    ts.offset_max_ns = hi[i];
    ts.same_clock = same[i];
    ts.node_stats = std::move(tasks[i].trace.nodes);
    ts.thread_roles = std::move(tasks[i].trace.thread_roles);
    ts.gpu_memory = std::move(tasks[i].trace.gpu_memory);
    for (node_exec_stats& ns : ts.node_stats) {
      ns.start_ns += offset[i];
      ns.end_ns += offset[i];
      if (ns.is_recv()) {
        ns.requested_ns += offset[i];
        ns.arrived_ns += offset[i];
      }
    }
    out.tasks.push_back(std::move(ts));
  }
  return out;
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

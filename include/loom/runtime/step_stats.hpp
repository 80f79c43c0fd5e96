// What a traced step records of itself (TF's RunOptions.trace_level and
// RunMetadata.step_stats): with run_options{.trace_level = trace_level::full}
// a session run fills a run_metadata with every node each task of the step ran
// (when, on which thread) and the tensors the tasks sent each other.
// loom::timeline (runtime/timeline.hpp) writes it in Chrome's trace format.
//
// Every time is in nanoseconds on the client's steady clock (the process that
// called session::run). A remote task's times are moved onto it by the offset
// its run_graph round trip allows (runtime/trace_alignment.hpp): the task's
// own clock where that lies within the round trip (a task on the client's
// host: Linux's steady clock is the host's), else the middle of the round
// trip, then shifted within it so that no tensor arrives before it was sent.
// docs/observability.md, "A step's timeline".
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace loom {

// TF's RunOptions.TraceLevel. TF's SOFTWARE_TRACE records what `full` does
// here; its HARDWARE_TRACE (GPU kernel times from CUPTI) has no counterpart: a
// node on a GPU is timed on the host, from its launch to the launch's return.
enum class trace_level : std::uint8_t { none, full };

// TF's RunOptions, for session::run.
struct run_options {
  ::loom::trace_level trace_level = ::loom::trace_level::none;
};

// One node's run on its task (TF's NodeExecStats).
struct node_exec_stats {
  std::string node_name;
  std::string op; // "fused" for a fused elementwise region
  // The thread ran the node from start to end: for a _recv, from taking the
  // arrived value to handing it on (its wait is requested..arrived).
  std::int64_t start_ns = 0, end_ns = 0;
  std::int64_t thread_id = 0; // the OS thread (Linux tid) that ran it
  // A fused region: the other nodes it computed, which did not run on their own.
  std::vector<std::string> fused_nodes;
  // A _send or _recv: the rendezvous key both share, and the task at the other end.
  std::string transfer_key, peer_task;
  // A _recv: when the executor asked for the value, and when it reached this task.
  std::int64_t requested_ns = 0, arrived_ns = 0;

  bool is_send() const noexcept { return op == "_send"; }
  bool is_recv() const noexcept { return op == "_recv"; }

  template <class A> void serialize(A& ar) {
    ar(node_name, op, start_ns, end_ns, thread_id, fused_nodes, transfer_key, peer_task,
       requested_ns, arrived_ns);
  }
};

// One GPU's memory on a task at the end of its part of a traced step: loom's device
// allocator's bytes (loom::gpu_memory), the peak the step's own (a traced step starts it
// again; steps that ran beside it share it).
struct device_memory_stats {
  int device = 0; // the task's GPU:device
  std::int64_t allocated = 0, cached = 0, peak = 0;

  template <class A> void serialize(A& ar) { ar(device, allocated, cached, peak); }
};

// One task's part of a step (TF's DeviceStepStats; loom traces by task).
struct task_step_stats {
  std::string task; // "/job:ps/replica:0/task:0"
  std::vector<node_exec_stats> node_stats;
  // What each thread that ran a node is: "io", "runner", "client" (runtime/thread_role.hpp).
  std::map<std::int64_t, std::string> thread_roles;
  // The task's steady clock + clock_offset_ns = the client's. The run_graph
  // round trip allows offsets in [offset_min_ns, offset_max_ns];
  // same_clock: the task's own clock lay within them and was taken as is.
  std::int64_t clock_offset_ns = 0, offset_min_ns = 0, offset_max_ns = 0;
  bool same_clock = true;
  std::vector<device_memory_stats> gpu_memory; // each GPU the task's allocator used
};

// TF's StepStats.
struct step_stats {
  std::uint64_t step_id = 0;
  // Before the client asked any task to run its part, and after the last answer.
  std::int64_t start_ns = 0, end_ns = 0;
  std::vector<task_step_stats> tasks; // in the order the master started them
};

// TF's RunMetadata (its step_stats; no cost or partition graphs).
struct run_metadata {
  ::loom::step_stats step_stats;
};

namespace detail {

// A task's part of a traced step on the task's own steady clock, as the task
// sends it back with its run_graph answer: when it received the request, when
// it answered, and its nodes.
struct task_trace {
  std::int64_t received_ns = 0, answered_ns = 0;
  std::vector<node_exec_stats> nodes;
  std::map<std::int64_t, std::string> thread_roles;
  std::vector<device_memory_stats> gpu_memory;
  template <class A> void serialize(A& ar) {
    ar(received_ns, answered_ns, nodes, thread_roles, gpu_memory);
  }
};

} // namespace detail

} // namespace loom

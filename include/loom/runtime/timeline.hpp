// A traced step in Chrome's trace format (TF's timeline.Timeline and its
// generate_chrome_trace_format): open the file in chrome://tracing or
// https://ui.perfetto.dev.
//
//   loom::run_metadata md;
//   sess.run(train_op, feeds, {.trace_level = loom::trace_level::full}, &md);
//   std::ofstream("step.trace.json") << loom::timeline(md).chrome_trace_json();
//
// One process per task (in the order the master started them), one thread per
// OS thread that ran the task's nodes, named by its role ("io thread 4242"); each node a complete
// event ("X") named by its op, its node name in args.name; each tensor sent between tasks a flow
// arrow from its _send to its _recv ("s" to "f", category "transfer", named by
// its rendezvous key); each _recv's wait, from when the executor asked for the
// value to its arrival, an async span ("b"/"e", category "recv wait"); each GPU a task
// used, a counter ("C", "GPU:i memory") of its allocator's bytes allocated, cached and
// the step's peak, at the end of the task's last node. Times
// are microseconds from the step's start on the client's clock
// (runtime/step_stats.hpp says how tasks' clocks are aligned); otherData
// carries the step's id and length and each task's clock offset.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/runtime/step_stats.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

class timeline {
public:
  explicit timeline(const run_metadata& metadata) : stats_(metadata.step_stats) {}
  explicit timeline(const step_stats& stats) : stats_(stats) {}

  std::string chrome_trace_json() const;

private:
  // Microseconds with three decimals: from the step's start, or a length.
  std::string micros(std::int64_t ns) const { return duration(stats_.start_ns, ns); }
  static std::string duration(std::int64_t from_ns, std::int64_t to_ns) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(to_ns - from_ns) / 1000.0);
    return buf;
  }
  static std::int64_t middle(std::int64_t a, std::int64_t b) { return a + (b - a) / 2; }

  // A JSON string literal.
  static std::string quoted(std::string_view s);

  step_stats stats_;
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE std::string timeline::chrome_trace_json() const {
  std::string out = "{\"traceEvents\":[\n";
  bool first = true;
  auto event = [&](const std::string& e) {
    out += first ? "" : ",\n";
    out += e;
    first = false;
  };
  const auto& tasks = stats_.tasks;
  for (std::size_t pid = 0; pid < tasks.size(); ++pid) {
    const task_step_stats& t = tasks[pid];
    const std::string p = std::to_string(pid);
    event(R"({"name":"process_name","ph":"M","pid":)" + p + R"(,"args":{"name":)" + quoted(t.task) +
          "}}");
    event(R"({"name":"process_sort_index","ph":"M","pid":)" + p + R"(,"args":{"sort_index":)" + p +
          "}}");
    std::set<std::int64_t> threads;
    for (const node_exec_stats& n : t.node_stats)
      threads.insert(n.thread_id);
    for (const std::int64_t tid : threads) {
      const auto role = t.thread_roles.find(tid);
      event(R"({"name":"thread_name","ph":"M","pid":)" + p + R"(,"tid":)" + std::to_string(tid) +
            R"(,"args":{"name":)" +
            quoted((role == t.thread_roles.end() ? std::string("thread") : role->second) +
                   " thread " + std::to_string(tid)) +
            "}}");
    }
    for (const node_exec_stats& n : t.node_stats) {
      std::string args = R"("name":)" + quoted(n.node_name) + R"(,"op":)" + quoted(n.op);
      if (!n.fused_nodes.empty()) {
        args += R"(,"fused_nodes":[)";
        for (std::size_t i = 0; i < n.fused_nodes.size(); ++i)
          args += (i ? "," : "") + quoted(n.fused_nodes[i]);
        args += "]";
      }
      if (n.is_send() || n.is_recv())
        args += R"(,"key":)" + quoted(n.transfer_key) +
                (n.is_send() ? R"(,"to":)" : R"(,"from":)") + quoted(n.peer_task);
      event(R"({"name":)" + quoted(n.op) + R"(,"cat":"op","ph":"X","pid":)" + p + R"(,"tid":)" +
            std::to_string(n.thread_id) + R"(,"ts":)" + micros(n.start_ns) + R"(,"dur":)" +
            duration(n.start_ns, n.end_ns) + R"(,"args":{)" + args + "}}");
    }
    std::int64_t last = t.node_stats.empty() ? stats_.end_ns : t.node_stats.front().end_ns;
    for (const node_exec_stats& n : t.node_stats)
      last = std::max(last, n.end_ns);
    for (const device_memory_stats& m : t.gpu_memory)
      event(R"({"name":"GPU:)" + std::to_string(m.device) + R"( memory","ph":"C","pid":)" + p +
            R"(,"ts":)" + micros(last) + R"(,"args":{"allocated":)" + std::to_string(m.allocated) +
            R"(,"cached":)" + std::to_string(m.cached) + R"(,"peak":)" + std::to_string(m.peak) +
            "}}");
  }
  // Transfers: an arrow from each _send to its _recv, and each _recv's wait.
  std::map<std::string, std::pair<std::size_t, const node_exec_stats*>> sends;
  for (std::size_t pid = 0; pid < tasks.size(); ++pid)
    for (const node_exec_stats& n : tasks[pid].node_stats)
      if (n.is_send())
        sends[n.transfer_key] = {pid, &n};
  std::uint64_t id = 0;
  for (std::size_t pid = 0; pid < tasks.size(); ++pid)
    for (const node_exec_stats& n : tasks[pid].node_stats) {
      if (!n.is_recv())
        continue;
      ++id;
      const std::string common = R"(,"id":)" + std::to_string(id) + R"(,"pid":)" +
                                 std::to_string(pid) + R"(,"tid":)" + std::to_string(n.thread_id);
      event(R"({"name":)" + quoted(n.transfer_key) + R"(,"cat":"recv wait","ph":"b")" + common +
            R"(,"ts":)" + micros(n.requested_ns) + "}");
      event(R"({"name":)" + quoted(n.transfer_key) + R"(,"cat":"recv wait","ph":"e")" + common +
            R"(,"ts":)" + micros(std::max(n.requested_ns, n.arrived_ns)) + "}");
      auto s = sends.find(n.transfer_key);
      if (s == sends.end())
        continue;
      const node_exec_stats& send = *s->second.second;
      // Each end inside its node's slice, so that viewers bind the arrow to it.
      event(R"({"name":)" + quoted(n.transfer_key) + R"(,"cat":"transfer","ph":"s","id":)" +
            std::to_string(id) + R"(,"pid":)" + std::to_string(s->second.first) + R"(,"tid":)" +
            std::to_string(send.thread_id) + R"(,"ts":)" +
            micros(middle(send.start_ns, send.end_ns)) + "}");
      event(R"({"name":)" + quoted(n.transfer_key) + R"(,"cat":"transfer","ph":"f","bp":"e")" +
            common + R"(,"ts":)" + micros(middle(n.start_ns, n.end_ns)) + "}");
    }
  out += "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{\"step_id\":\"" +
         std::to_string(stats_.step_id) + R"(","step_duration_us":)" +
         duration(stats_.start_ns, stats_.end_ns) + R"(,"clocks":{)";
  for (std::size_t pid = 0; pid < tasks.size(); ++pid) {
    const task_step_stats& t = tasks[pid];
    out += (pid ? "," : "") + quoted(t.task) + ":" +
           quoted(t.same_clock ? "the client's steady clock"
                               : "offset " + duration(0, t.clock_offset_ns) + " us, within [" +
                                     duration(0, t.offset_min_ns) + ", " +
                                     duration(0, t.offset_max_ns) + "] by the round trip");
  }
  out += "}}}\n";
  return out;
}

LOOM_COMPILED_ONCE std::string timeline::quoted(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\t': out += "\\t"; break;
    default:
      if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
        out += buf;
      } else {
        out += c;
      }
    }
  }
  return out + "\"";
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// The messages between a master (in a client's session) and the worker
// service of every task, carried as metadata of net/ calls; tensors travel as
// the calls' payloads, never inside the metadata (string tensors excepted:
// string_values). docs/wire-protocol.md lists the methods.
#pragma once

#include <loom/cluster/cluster_spec.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/graph/serialize.hpp>
#include <loom/runtime/step_stats.hpp>

#include <cereal/types/map.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace loom::protocol {

// String tensors are not payloads (their elements are not one buffer), so
// they travel in the metadata: `positions` says where each one goes back in
// the list of values, between the payloads, which keep their order.
struct string_values {
  std::vector<std::uint32_t> positions;
  std::vector<any_tensor> values;
  template <class A> void serialize(A& ar) { ar(positions, values); }

  // Moves the string tensors out of `all`; the others stay, in order.
  static string_values take(std::vector<any_tensor>& all);

  // Puts the string tensors back among `payloads`.
  void restore(std::vector<any_tensor>& payloads) &&;
};

// Method names.
inline constexpr const char* cluster_info = "loom.cluster_info";
inline constexpr const char* register_graph = "loom.register_graph";
inline constexpr const char* deregister_graph = "loom.deregister_graph";
inline constexpr const char* run_graph = "loom.run_graph";
inline constexpr const char* rendezvous_put = "loom.rendezvous_put";
inline constexpr const char* abort_step = "loom.abort_step";
inline constexpr const char* reset = "loom.reset";
inline constexpr const char* shutdown = "loom.shutdown";

// A cluster spec on the wire: job -> {task index -> address}.
struct cluster_def {
  std::map<std::string, std::map<int, std::string>> jobs;

  static cluster_def of(const cluster_spec& c);
  cluster_spec spec() const {
    cluster_spec c;
    for (const auto& [job, tasks] : jobs)
      c.add_job(job, cluster_spec::job_def(tasks));
    return c;
  }
  template <class A> void serialize(A& ar) { ar(jobs); }
};

struct cluster_info_reply {
  cluster_def cluster;
  std::string job;
  int task = 0;
  // A random id of the server: a session in the same process finds it by this.
  std::uint64_t instance = 0;
  int gpus = 0; // GPUs the task can place nodes on
  template <class A> void serialize(A& ar) { ar(cluster, job, task, instance, gpus); }
};

// A partition to run on the receiving task: the serialized graph (graph/
// serialize.hpp), what it fetches and what the client feeds, as node ids of
// that graph.
struct register_graph_request {
  std::string graph;
  std::vector<std::int32_t> fetches;
  std::vector<std::int32_t> fed;
  std::vector<std::int32_t> targets;
  template <class A> void serialize(A& ar) { ar(graph, fetches, fed, targets); }
};

struct register_graph_reply {
  std::uint64_t handle = 0;
  template <class A> void serialize(A& ar) { ar(handle); }
};

struct deregister_graph_request {
  std::uint64_t handle = 0;
  template <class A> void serialize(A& ar) { ar(handle); }
};

// One step of a registered partition. Payloads: the fed values, in the order
// of register_graph_request::fed. Reply payloads: the fetched values.
struct run_graph_request {
  std::uint64_t handle = 0;
  std::uint64_t step_id = 0;
  string_values strings{}; // the fed string tensors
  bool trace = false;      // run_options' trace_level::full: answer with the step's trace
  template <class A> void serialize(A& ar) { ar(handle, step_id, strings, trace); }
};

struct run_graph_reply {
  string_values strings{};               // the fetched string tensors
  std::vector<detail::task_trace> trace; // a traced step's: one, on the task's clock
  template <class A> void serialize(A& ar) { ar(strings, trace); }
};

// The values of a burst of _sends to one task, for the _recvs with the same
// keys in step `step_id`. Payloads: the values, in the order of `keys`,
// skipping the control edges (`carries_value[i] == 0`), which have none.
struct rendezvous_put_request {
  std::uint64_t step_id = 0;
  std::vector<std::string> keys;
  std::vector<std::uint8_t> carries_value;
  string_values strings{}; // the values that are string tensors
  template <class A> void serialize(A& ar) { ar(step_id, keys, carries_value, strings); }
};

struct abort_step_request {
  std::uint64_t step_id = 0;
  std::string reason;
  template <class A> void serialize(A& ar) { ar(step_id, reason); }
};

struct reset_request {
  std::vector<std::string> containers; // empty: all
  template <class A> void serialize(A& ar) { ar(containers); }
};

} // namespace loom::protocol

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::protocol {

LOOM_COMPILED_ONCE auto string_values::take(std::vector<any_tensor>& all) -> string_values {
  string_values s;
  auto is_string = [](const any_tensor& t) { return !t.empty() && t.type() == dtype::string; };
  if (std::none_of(all.begin(), all.end(), is_string))
    return s;
  std::vector<any_tensor> rest;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (is_string(all[i])) {
      s.positions.push_back(static_cast<std::uint32_t>(i));
      s.values.push_back(std::move(all[i]));
    } else {
      rest.push_back(std::move(all[i]));
    }
  }
  all = std::move(rest);
  return s;
}

LOOM_COMPILED_ONCE void string_values::restore(std::vector<any_tensor>& payloads) && {
  if (values.empty())
    return;
  if (positions.size() != values.size())
    throw data_loss_error("a message has " + std::to_string(values.size()) +
                          " string tensors but " + std::to_string(positions.size()) + " positions");
  const std::size_t n = payloads.size() + values.size();
  std::vector<any_tensor> all;
  all.reserve(n);
  std::size_t next_string = 0, next_payload = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (next_string < positions.size() && positions[next_string] == i)
      all.push_back(std::move(values[next_string++]));
    else if (next_payload < payloads.size())
      all.push_back(std::move(payloads[next_payload++]));
    else
      break;
  }
  if (next_string != values.size())
    throw data_loss_error("a message places its string tensors at invalid positions");
  payloads = std::move(all);
}

LOOM_COMPILED_ONCE auto cluster_def::of(const cluster_spec& c) -> cluster_def {
  cluster_def d;
  for (const auto& job : c.jobs())
    for (int t : c.task_indices(job))
      d.jobs[job][t] = c.task_address(job, t);
  return d;
}

} // namespace loom::protocol

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

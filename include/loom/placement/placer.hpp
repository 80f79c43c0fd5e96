// The placer: gives every node one fully specified device
// ("/job:J/replica:R/task:T/device:TYPE:IDX") from the available devices,
// honouring what the device scopes requested, colocation groups, TF's
// ConfigProto options allow_soft_placement, log_device_placement and
// device_filters, and which kernels exist.
//
// Rules:
// - Visible devices: the available ones matching at least one device filter
//   ("/job:ps", "/job:worker/task:1"), or all of them when there are no
//   filters (TF's device_filters).
// - Colocation: nodes sharing node_def::colocation_group (a variable, its
//   initializer and assign ops, optimizer slots and apply ops; see
//   graph/ops/state.hpp and training.hpp) get one device. The group's request
//   is its anchor's (the node named like the group, i.e. the variable, else
//   the first member), completed by the compatible requests of the other
//   members; a member request that conflicts with it is ignored, as TF does
//   for reference edges (logged with log_device_placement). A node with a
//   reference input and no group joins its input's group.
// - Choice: among visible devices that match the request and have a kernel
//   for every member (options.has_kernel; none given means every op runs
//   everywhere), unset fields prefer the default device's job, then its
//   replica and task (only within that job), then CPU, then index 0, then
//   the lowest device name.
// - No such device: with allow_soft_placement, the same job/replica/task on
//   another device type (CPU first), else any visible device, and one line on
//   the log saying why; without it, invalid_argument_error naming the node,
//   the request and the available devices (TF's "Cannot assign a device for
//   operation ...").
// - log_device_placement: one line per node, in node order, in TF's format
//   "name: (op): /job:worker/replica:0/task:0/device:CPU:0". The lines go to
//   a placement_log, which prints each distinct line once: a session keeps
//   one for its graph, so a node's placement is printed once (as TF prints it
//   when it places the graph), not again for every distinct set of fetches.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/device_spec.hpp>
#include <loom/core/dtype.hpp>
#include <loom/core/error.hpp>
#include <loom/core/log.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/node.hpp>
#include <loom/graph/op_registry.hpp>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace loom {

struct placer_options {
  bool allow_soft_placement = false;
  bool log_device_placement = false;
  // Only devices matching one of these are visible (TF's ConfigProto.device_filters).
  std::vector<std::string> device_filters{};
  // Whether a kernel for (op id, dtype, device type) exists; empty: all do.
  std::function<bool(std::string_view op, dtype type, std::string_view device_type)> has_kernel{};
  // The session's task ("/job:worker/replica:0/task:1"): fills the job,
  // replica and task a request leaves unset. Empty: the lowest device name.
  std::string default_device{};
};

namespace detail::placer_impl {

LOOM_COMPILED_ONCE std::string list_devices(const std::vector<device_spec>& ds);

LOOM_COMPILED_ONCE bool compatible(const device_spec& a, const device_spec& b);

inline bool fully_specified(const device_spec& d) {
  return d.job() && d.replica() && d.task() && d.device_type() && d.device_index();
}

LOOM_COMPILED_ONCE auto name_key(const device_spec& d);

} // namespace detail::placer_impl

// Where the placer's lines go: the library's logger (core/log.hpp) at `level`, or a
// stream of the caller's. Each distinct line is printed once over the log's life; a line
// that changes (a node placed anew after its graph grew) is printed again. Sessions place
// concurrently, hence the lock.
class placement_log {
public:
  placement_log() = default;
  explicit placement_log(std::ostream& out) : out_(&out) {}
  explicit placement_log(std::ostream* out) : out_(out) {} // null: the logger

  // Where each node went is info, as TF's log_device_placement; a request not honoured warns.
  void print(std::string line, logging::level level = logging::level::info);

private:
  std::ostream* out_ = nullptr;
  std::mutex mu_;
  std::set<std::string> printed_;
};

class placer {
public:
  // Lines go to `log` (each distinct line once across the placements that share it).
  placer(std::vector<device_spec> devices, placer_options options, placement_log& log)
      : placer(std::move(devices), std::move(options), nullptr, &log) {}
  // Lines go to the logger, every line of this placer's placements.
  explicit placer(std::vector<device_spec> devices, placer_options options = {})
      : placer(std::move(devices), std::move(options), std::make_unique<placement_log>(), nullptr) {
  }
  // Lines go to `out`, every line of this placer's placements.
  placer(std::vector<device_spec> devices, placer_options options, std::ostream& out)
      : placer(std::move(devices), std::move(options), std::make_unique<placement_log>(out),
               nullptr) {}

  // The devices that device_filters leave visible.
  const std::vector<device_spec>& visible_devices() const noexcept { return visible_; }

  // Sets assigned_device of every node. Node ids (node_def::id) identify
  // inputs; inputs outside `nodes` are ignored.
  void place(std::vector<node_def>& nodes) const;

  // Places every node of `g` (sets node_def::assigned_device in the graph).
  void place(graph& g) const;

private:
  placer(std::vector<device_spec> devices, placer_options options,
         std::unique_ptr<placement_log> own_log, placement_log* log);

  // A node with a reference input (assign, apply_*) and no group runs where
  // the referenced node lives (TF's placer colocates reference edges).
  static void colocate_ref_inputs(std::vector<node_def>& nodes,
                                  const std::unordered_map<node_id, std::size_t>& by_id);

  static device_spec requested(const node_def& n);

  bool kernels_on(const std::vector<node_def>& nodes, const std::vector<std::size_t>& members,
                  const device_spec& d) const;

  // The preferred device among `candidates` for `request` (see the header).
  device_spec best(const std::vector<device_spec>& candidates, const device_spec& request) const;

  device_spec choose(const std::vector<node_def>& nodes, const std::vector<std::size_t>& members,
                     std::size_t anchor, const device_spec& request) const;

  // "'n' (op) as float32, ..." for the members lacking a kernel on every device in `ds`.
  std::string missing_kernels(const std::vector<node_def>& nodes,
                              const std::vector<std::size_t>& members,
                              const std::vector<device_spec>& ds) const;

  std::string filter_list() const;

  placer_options options_;
  std::unique_ptr<placement_log> own_log_; // when made with an ostream
  placement_log* log_;
  std::vector<device_spec> devices_;
  std::vector<device_spec> filters_;
  std::vector<device_spec> visible_;
  device_spec default_;
};

// One-shot forms.
inline void place(std::vector<node_def>& nodes, std::vector<device_spec> devices,
                  placer_options options, placement_log& log) {
  placer(std::move(devices), std::move(options), log).place(nodes);
}
inline void place(std::vector<node_def>& nodes, std::vector<device_spec> devices,
                  placer_options options = {}) {
  placer(std::move(devices), std::move(options)).place(nodes);
}
inline void place(std::vector<node_def>& nodes, std::vector<device_spec> devices,
                  placer_options options, std::ostream& log) {
  placer(std::move(devices), std::move(options), log).place(nodes);
}
inline void place(graph& g, std::vector<device_spec> devices, placer_options options = {}) {
  placer(std::move(devices), std::move(options)).place(g);
}
inline void place(graph& g, std::vector<device_spec> devices, placer_options options,
                  std::ostream& log) {
  placer(std::move(devices), std::move(options), log).place(g);
}

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail::placer_impl {

LOOM_COMPILED_ONCE std::string list_devices(const std::vector<device_spec>& ds) {
  std::string out = "[";
  for (std::size_t i = 0; i < ds.size(); ++i)
    out += (i ? ", " : " ") + ds[i].to_string();
  return out + (ds.empty() ? "]" : " ]");
}

LOOM_COMPILED_ONCE bool compatible(const device_spec& a, const device_spec& b) {
  return (!a.job() || !b.job() || a.job() == b.job()) &&
         (!a.replica() || !b.replica() || a.replica() == b.replica()) &&
         (!a.task() || !b.task() || a.task() == b.task()) &&
         (!a.device_type() || !b.device_type() || a.device_type() == b.device_type()) &&
         (!a.device_index() || !b.device_index() || a.device_index() == b.device_index());
}

LOOM_COMPILED_ONCE auto name_key(const device_spec& d) {
  return std::make_tuple(*d.job(), *d.replica(), *d.task(), *d.device_type(), *d.device_index());
}
} // namespace loom::detail::placer_impl

namespace loom {

LOOM_COMPILED_ONCE void placement_log::print(std::string line, logging::level level) {
  std::lock_guard lock(mu_);
  if (!printed_.insert(line).second)
    return;
  if (out_)
    *out_ << line << '\n';
  else
    logging::write(level, line);
}

LOOM_COMPILED_ONCE void placer::place(std::vector<node_def>& nodes) const {
  namespace impl = detail::placer_impl;
  std::unordered_map<node_id, std::size_t> by_id;
  for (std::size_t i = 0; i < nodes.size(); ++i)
    by_id.emplace(nodes[i].id, i);
  colocate_ref_inputs(nodes, by_id);

  // Groups in order of their first member.
  std::vector<std::vector<std::size_t>> groups;
  std::map<std::string, std::size_t, std::less<>> group_of;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const std::string& g = nodes[i].colocation_group;
    if (g.empty()) {
      groups.push_back({i});
      continue;
    }
    auto [it, fresh] = group_of.emplace(g, groups.size());
    if (fresh)
      groups.emplace_back();
    groups[it->second].push_back(i);
  }

  for (const auto& members : groups) {
    std::size_t anchor = members.front();
    for (std::size_t m : members)
      if (nodes[m].name == nodes[m].colocation_group) {
        anchor = m;
        break;
      }
    device_spec request = requested(nodes[anchor]);
    for (std::size_t m : members) {
      if (m == anchor || nodes[m].requested_device.empty())
        continue;
      const device_spec r = requested(nodes[m]);
      if (impl::compatible(request, r)) {
        request = device_spec::merged(r, request);
      } else if (options_.log_device_placement) {
        log_->print("Ignoring device specification " + r.to_string() + " for node '" +
                        nodes[m].name + "' because it is colocated with '" + nodes[anchor].name +
                        "', which requests " + request.to_string(),
                    logging::level::warn);
      }
    }
    const device_spec chosen = choose(nodes, members, anchor, request);
    const std::string name = chosen.to_string();
    for (std::size_t m : members)
      nodes[m].assigned_device = name;
  }

  if (options_.log_device_placement)
    for (const node_def& n : nodes)
      log_->print(n.name + ": (" + n.op + "): " + n.assigned_device);
}

LOOM_COMPILED_ONCE void placer::place(graph& g) const {
  std::vector<node_def> nodes;
  nodes.reserve(g.size());
  for (std::size_t i = 0; i < g.size(); ++i)
    nodes.push_back(g.node(static_cast<node_id>(i)));
  place(nodes);
  for (const node_def& n : nodes) {
    node_def& target = g.mutable_node(n.id);
    target.assigned_device = n.assigned_device;
    target.colocation_group = n.colocation_group;
  }
}

LOOM_COMPILED_ONCE placer::placer(std::vector<device_spec> devices, placer_options options,
                                  std::unique_ptr<placement_log> own_log, placement_log* log)
    : options_(std::move(options)), own_log_(std::move(own_log)), log_(log ? log : own_log_.get()) {
  namespace impl = detail::placer_impl;
  for (const device_spec& d : devices) {
    if (!impl::fully_specified(d))
      throw invalid_argument_error("placer: available device '" + d.to_string() +
                                   "' is not fully specified; expected "
                                   "/job:J/replica:R/task:T/device:TYPE:INDEX");
    if (std::find(devices_.begin(), devices_.end(), d) == devices_.end())
      devices_.push_back(d);
  }
  if (devices_.empty())
    throw invalid_argument_error("placer: no devices are available");
  for (const std::string& f : options_.device_filters) {
    try {
      filters_.push_back(device_spec::from_string(f));
    } catch (const error& e) {
      throw invalid_argument_error("placer: device filter \"" + f + "\": " + e.message());
    }
  }
  for (const device_spec& d : devices_)
    if (filters_.empty() || std::any_of(filters_.begin(), filters_.end(),
                                        [&](const device_spec& f) { return d.matches(f); }))
      visible_.push_back(d);
  if (visible_.empty())
    throw invalid_argument_error("placer: device_filters " + filter_list() +
                                 " match none of the available devices " +
                                 impl::list_devices(devices_));
  try {
    default_ = device_spec::from_string(options_.default_device);
  } catch (const error& e) {
    throw invalid_argument_error("placer: default_device: " + e.message());
  }
}

LOOM_COMPILED_ONCE void
placer::colocate_ref_inputs(std::vector<node_def>& nodes,
                            const std::unordered_map<node_id, std::size_t>& by_id) {
  const detail::op_registry& reg = detail::op_registry::instance();
  for (node_def& n : nodes) {
    if (!n.colocation_group.empty() || !reg.contains(n.op))
      continue;
    const std::uint32_t refs = reg.find(n.op).ref_inputs;
    for (std::size_t k = 0; k < n.inputs.size() && k < 32; ++k) {
      if (!(refs & (1u << k)))
        continue;
      auto it = by_id.find(n.inputs[k]);
      if (it == by_id.end())
        continue;
      const node_def& src = nodes[it->second];
      n.colocation_group = src.colocation_group.empty() ? src.name : src.colocation_group;
      break;
    }
  }
}

LOOM_COMPILED_ONCE auto placer::requested(const node_def& n) -> device_spec {
  try {
    return device_spec::from_string(n.requested_device);
  } catch (const error& e) {
    throw invalid_argument_error("placer: node " + n.describe() + ": " + e.message());
  }
}

LOOM_COMPILED_ONCE bool placer::kernels_on(const std::vector<node_def>& nodes,
                                           const std::vector<std::size_t>& members,
                                           const device_spec& d) const {
  if (!options_.has_kernel)
    return true;
  return std::all_of(members.begin(), members.end(), [&](std::size_t m) {
    return options_.has_kernel(nodes[m].op, nodes[m].type, *d.device_type());
  });
}

LOOM_COMPILED_ONCE auto placer::best(const std::vector<device_spec>& candidates,
                                     const device_spec& request) const -> device_spec {
  auto key = [&](const device_spec& d) {
    const bool in_default_job = default_.job() && d.job() == default_.job();
    const int job_miss = !request.job() && default_.job() && !in_default_job;
    const int replica_miss = !request.replica() && default_.replica() && in_default_job &&
                             d.replica() != default_.replica();
    const int task_miss = !request.task() && default_.task() && in_default_job &&
                          (!default_.replica() || d.replica() == default_.replica()) &&
                          d.task() != default_.task();
    const int not_cpu = !request.device_type() && !d.is_cpu();
    const int index = request.device_index() ? 0 : *d.device_index();
    return std::make_tuple(job_miss, replica_miss, task_miss, not_cpu, index,
                           detail::placer_impl::name_key(d));
  };
  return *std::min_element(
      candidates.begin(), candidates.end(),
      [&](const device_spec& a, const device_spec& b) { return key(a) < key(b); });
}

LOOM_COMPILED_ONCE auto placer::choose(const std::vector<node_def>& nodes,
                                       const std::vector<std::size_t>& members, std::size_t anchor,
                                       const device_spec& request) const -> device_spec {
  namespace impl = detail::placer_impl;
  std::vector<device_spec> matching, runnable;
  for (const device_spec& d : visible_)
    if (d.matches(request)) {
      matching.push_back(d);
      if (kernels_on(nodes, members, d))
        runnable.push_back(d);
    }
  if (!runnable.empty())
    return best(runnable, request);

  const node_def& n = nodes[anchor];
  std::string who = "operation " + n.describe();
  if (members.size() > 1)
    who += " and the " + std::to_string(members.size() - 1) + " node(s) colocated with it";
  std::string why;
  if (matching.empty()) {
    why = "it was explicitly assigned to " + request.to_string() + " but available devices are " +
          impl::list_devices(visible_);
    const bool hidden = std::any_of(devices_.begin(), devices_.end(),
                                    [&](const device_spec& d) { return d.matches(request); });
    if (hidden)
      why += " (device_filters " + filter_list() + " hide the devices that match it)";
  } else {
    why = "no kernel for " + missing_kernels(nodes, members, matching) +
          " on the devices matching " + request.to_string() + " " + impl::list_devices(matching);
  }
  if (!options_.allow_soft_placement)
    throw invalid_argument_error("Cannot assign a device for " + who + ": " + why +
                                 ". Make sure the device specification refers to a valid "
                                 "device, or enable allow_soft_placement.");

  // Soft placement: the same job/replica/task on any device type, then anywhere.
  device_spec task_only;
  task_only.with_job(request.job()).with_replica(request.replica()).with_task(request.task());
  std::vector<device_spec> fallback;
  for (const device_spec& d : visible_)
    if (d.matches(task_only) && kernels_on(nodes, members, d))
      fallback.push_back(d);
  if (fallback.empty()) {
    task_only = device_spec{};
    for (const device_spec& d : visible_)
      if (kernels_on(nodes, members, d))
        fallback.push_back(d);
  }
  if (fallback.empty())
    throw invalid_argument_error("Cannot assign a device for " + who + ": " + why +
                                 "; soft placement found no visible device with kernels for " +
                                 missing_kernels(nodes, members, visible_) + " either");
  const device_spec chosen = best(fallback, task_only);
  log_->print("loom placer: soft placement of " + who + ": " + why + "; placed on " +
                  chosen.to_string(),
              logging::level::warn);
  return chosen;
}

LOOM_COMPILED_ONCE std::string placer::missing_kernels(const std::vector<node_def>& nodes,
                                                       const std::vector<std::size_t>& members,
                                                       const std::vector<device_spec>& ds) const {
  std::string out;
  for (std::size_t m : members) {
    const node_def& n = nodes[m];
    const bool none = std::none_of(ds.begin(), ds.end(), [&](const device_spec& d) {
      return options_.has_kernel(n.op, n.type, *d.device_type());
    });
    if (none)
      out += (out.empty() ? "" : ", ") + n.describe() + " as " + std::string(to_string(n.type));
  }
  return out.empty() ? "the colocated nodes together" : out;
}

LOOM_COMPILED_ONCE std::string placer::filter_list() const {
  std::string out = "[";
  for (std::size_t i = 0; i < options_.device_filters.size(); ++i)
    out += (i ? ", \"" : "\"") + options_.device_filters[i] + "\"";
  return out + "]";
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// A session runs a graph: in this process (TF's tf.Session() with no target),
// or on a cluster through a server's target (tf.Session("grpc://...")), where
// a master places, partitions and runs it across the tasks (runtime/master.hpp).
// Fetches are typed: an output<T, R> or expression comes back as tensor<T, R>,
// an operation as nothing, several fetches as a tuple. Feeds are checked at
// compile time (dtype, rank) and at run time (shape).
#pragma once

#include <loom/graph/lower.hpp>
#include <loom/graph/output.hpp>
#include <loom/runtime/executor.hpp>
#include <loom/runtime/master.hpp>
#include <loom/runtime/resource_manager.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

namespace loom {

// One feed: a node (usually a placeholder) and the value it takes this run.
class feed {
public:
  template <class T, int R, class U, int R2>
  feed(const output<T, R>& node, const tensor<U, R2>& value)
      : graph_(node.graph()), id_(node.id()), value_(value.value()) {
    static_assert(std::is_same_v<T, U>, "loom::feed: the fed tensor's dtype differs from the "
                                        "placeholder's");
    static_assert(R == R2, "loom::feed: the fed tensor's rank differs from the placeholder's");
  }
  // A number for a rank-0 node.
  template <class T, class S>
  requires std::is_arithmetic_v<S> feed(const output<T, 0>& node, S value)
      : graph_(node.graph()), id_(node.id()), value_(any_tensor::scalar<T>(static_cast<T>(value))) {
  }

  const graph& graph_ref() const noexcept { return graph_; }
  node_id id() const noexcept { return id_; }
  const any_tensor& value() const noexcept { return value_; }

private:
  graph graph_;
  node_id id_;
  any_tensor value_;
};
using feed_dict = std::vector<feed>;

// The result of fetching an operation.
struct nothing {};

template <class... F> struct fetch_list { std::tuple<F...> items; };
// Several fetches in one run: sess.run(fetches(train_op, loss), feeds).
template <class... F> fetch_list<std::remove_cvref_t<F>...> fetches(F&&... f) {
  return {{std::forward<F>(f)...}};
}

struct session_options {
  // Threads of the intra-op pool; 0 means one per hardware thread.
  int intra_op_threads = 0;
  // Run fusable elementwise regions as their primitive ops, as a process
  // without the regions' instantiations does (for tests and comparisons).
  bool disable_fusion = false;
  // TF's ConfigProto options over this process's devices,
  // /job:localhost/replica:0/task:0/device:CPU:0 and, where a GPU backend is
  // linked in (loom/cuda/backend.hpp) and finds GPUs, .../device:GPU:i. A node
  // whose device request names another device (a GPU this process lacks, a ps
  // task), or a GPU for an op without a GPU kernel, fails the run naming it and
  // the available devices, unless allow_soft_placement runs it on the CPU and
  // says so on placement_log. A node without a request runs on the CPU.
  bool allow_soft_placement = false;
  bool log_device_placement = false;
  std::ostream* placement_log = &std::cerr;
};

class session {
public:
  explicit session(graph g, session_options o = {})
      : graph_(std::move(g)), resources_(std::make_shared<resource_manager>()), pool_(threads(o)),
        device_(&pool_, threads(o)), allow_fusion_(!o.disable_fusion) {
    placement_.allow_soft_placement = o.allow_soft_placement;
    placement_.log_device_placement = o.log_device_placement;
    placement_.default_device = local_cpu;
    placement_.has_kernel = [](std::string_view op, dtype, std::string_view device_type) {
      return placeable_on(op, device_type);
    };
    placement_log_ = o.placement_log;
  }

  // A session on a cluster: `target` is a server's target() ("loom://host:port").
  // Variables live in the tasks' resource containers, shared with every other
  // session on the cluster.
  session(graph g, const session_target& target, cluster_session_options o = {})
      : graph_(std::move(g)), resources_(std::make_shared<resource_manager>()), pool_(1),
        device_(&pool_, 1),
        master_(std::make_unique<cluster_master>(target.address, std::move(o))) {}

  // Clears the named resource containers (all when empty) on every task of the
  // cluster behind `target` (TF's tf.Session.reset).
  static void reset(const std::string& target, const std::vector<std::string>& containers = {}) {
    cluster_master(target).reset(containers);
  }

  // Tells every task of the cluster behind `target` (only those of `jobs`,
  // when given) to stop serving: their servers' join() return.
  static void shutdown_cluster(const std::string& target,
                               const std::vector<std::string>& jobs = {}) {
    cluster_master(target).shutdown_cluster(jobs);
  }

  session(const session&) = delete;
  session& operator=(const session&) = delete;

  // A fetch is an expression, an operation or fetches(a, b, ...), whose
  // values come back as a tuple.
  template <class F> auto run(const F& fetch, const feed_dict& feeds = {}) {
    auto [ids, finish] = resolve_all(fetch);
    std::vector<any_tensor> values = execute(ids, feeds);
    return finish(values);
  }

  // The same step also fetches `extra` nodes, returned untyped and in order
  // (for hooks that watch a training loop: monitored_training_session).
  template <class F>
  auto run_with_extra(const F& fetch, const feed_dict& feeds, const std::vector<node_id>& extra) {
    auto [ids, finish] = resolve_all(fetch);
    ids.insert(ids.end(), extra.begin(), extra.end());
    std::vector<any_tensor> values = execute(ids, feeds);
    std::vector<any_tensor> extra_values;
    extra_values.reserve(extra.size());
    for (node_id id : extra)
      extra_values.push_back(take(values, id));
    return std::make_pair(finish(values), std::move(extra_values));
  }

  // Runs by node ids, for untyped callers (optimizers, the supervisor, tools).
  std::vector<any_tensor> run_nodes(const std::vector<node_id>& fetch_ids,
                                    const std::vector<node_id>& target_ids,
                                    const std::vector<std::pair<node_id, any_tensor>>& feeds = {}) {
    std::vector<node_id> ids = fetch_ids;
    for (node_id t : target_ids)
      ids.push_back(-2 - t); // targets encoded below zero
    feed_dict none;
    std::vector<any_tensor> values = execute(ids, none, &feeds);
    std::vector<any_tensor> out; // one value per fetch, in order
    out.reserve(fetch_ids.size());
    for (node_id id : fetch_ids)
      out.push_back(take(values, id));
    return out;
  }

  const graph& graph_ref() const noexcept { return graph_; }
  resource_manager& resources() noexcept { return *resources_; }
  const cpu_device& device() const noexcept { return device_; }

private:
  static int threads(const session_options& o) {
    if (o.intra_op_threads > 0)
      return o.intra_op_threads;
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }

  template <class F> auto resolve_all(const F& fetch) {
    if constexpr (requires { fetch.items; }) {
      auto resolved =
          std::apply([&](const auto&... f) { return std::make_tuple(resolve(f)...); }, fetch.items);
      std::vector<node_id> ids;
      std::apply([&](const auto&... r) { (ids.push_back(r.first), ...); }, resolved);
      return std::make_pair(std::move(ids), [resolved](std::vector<any_tensor>& values) {
        return std::apply([&](const auto&... r) { return std::make_tuple(r.second(values)...); },
                          resolved);
      });
    } else {
      auto [id, finish] = resolve(fetch);
      return std::make_pair(std::vector<node_id>{id}, finish);
    }
  }

  // A fetch's node id (targets below zero) and how to turn its value into the result.
  template <class F> auto resolve(const F& f) {
    if constexpr (std::is_same_v<F, operation>) {
      check_graph(f.graph());
      return std::make_pair(-2 - f.id(), [](std::vector<any_tensor>&) { return nothing{}; });
    } else if constexpr (expression<F>) {
      auto out = lower(f);
      check_graph(out.graph());
      using T = value_type_of<F>;
      constexpr int R = rank_of<F>;
      const node_id id = out.id();
      return std::make_pair(id, [this, id](std::vector<any_tensor>& values) {
        return tensor<T, R>::from(take(values, id), "fetch of '" + graph_.node(id).name + "'");
      });
    } else {
      static_assert(expression<F> || std::is_same_v<F, operation>,
                    "loom::session::run: a fetch must be an expression (output, variable, "
                    "placeholder, ...) or an operation");
    }
  }

  // A fetched value that shares its buffer with state (a variable, a constant,
  // a feed) is copied, so later updates never change a returned tensor.
  static any_tensor take(std::vector<any_tensor>& values, node_id id) {
    any_tensor& v = values[static_cast<std::size_t>(id)];
    return v.sole_owner() ? v : v.clone();
  }

  void check_graph(const graph& g) const {
    if (!(g == graph_))
      throw invalid_argument_error("a fetch belongs to another graph than the session's");
  }

  std::vector<any_tensor>
  execute(const std::vector<node_id>& ids, const feed_dict& feeds,
          const std::vector<std::pair<node_id, any_tensor>>* raw_feeds = nullptr) {
    run_request req;
    for (node_id id : ids) { // a node fetched twice is computed and sent once
      auto& list = id <= -2 ? req.targets : req.fetches;
      const node_id n = id <= -2 ? -2 - id : id;
      if (std::find(list.begin(), list.end(), n) == list.end())
        list.push_back(n);
    }
    std::vector<any_tensor> values(graph_.size());
    auto add_feed = [&](node_id id, const any_tensor& v) {
      check_feed(id, v);
      values[static_cast<std::size_t>(id)] = v;
      req.fed.push_back(id);
    };
    for (const feed& f : feeds) {
      if (!(f.graph_ref() == graph_))
        throw invalid_argument_error("a feed belongs to another graph than the session's");
      add_feed(f.id(), f.value());
    }
    if (raw_feeds)
      for (auto& [id, v] : *raw_feeds)
        add_feed(id, v);

    std::sort(req.fed.begin(), req.fed.end());
    if (master_)
      master_->run(graph_, req, values);
    else
      plan_for(req).run(graph_, values, device_, *resources_);
    return values;
  }

  void check_feed(node_id id, const any_tensor& v) const {
    const node_def& n = graph_.node(id);
    if (v.type() != n.type)
      throw invalid_argument_error(
          "feed for '" + n.name + "': a " + std::string(to_string(v.type())) +
          " tensor cannot feed a node of dtype " + std::string(to_string(n.type)));
    if (!v.shape().compatible_with(n.shape))
      throw invalid_argument_error("feed for '" + n.name + "': shape " + v.shape().to_string() +
                                   " is incompatible with the node's shape " + n.shape.to_string());
  }

  const plan& plan_for(const run_request& req) {
    if (graph_.version() != planned_version_) { // plans of an older graph are stale
      plans_.clear();
      planned_version_ = graph_.version();
    }
    std::string key = std::to_string(graph_.version()) + "|";
    for (auto v : {&req.fetches, &req.targets, &req.fed}) {
      for (node_id id : *v)
        key += std::to_string(id) + ",";
      key += "|";
    }
    auto it = plans_.find(key);
    if (it == plans_.end())
      it = plans_.emplace(key, std::make_unique<plan>(graph_, req, allow_fusion_, place_nodes(req)))
               .first;
    return *it->second;
  }

  static constexpr const char* local_cpu = "/job:localhost/replica:0/task:0/device:CPU:0";

  // Places the nodes a request runs on this process's devices (the placer's
  // rules and messages, as on a cluster): each node id's location.
  std::vector<memory_location> place_nodes(const run_request& req) const {
    std::set<node_id> ref_only;
    std::vector<node_def> nodes = nodes_to_place(graph_, req, ref_only);
    std::vector<device_spec> devices{device_spec::from_string(local_cpu)};
    for (int i = 0, n = gpu_count(); i < n; ++i)
      devices.push_back(device_spec::from_string("/job:localhost/replica:0/task:0/device:GPU:" +
                                                 std::to_string(i)));
    place(nodes, devices, placement_, *placement_log_);
    std::vector<memory_location> placed(graph_.size());
    for (const node_def& n : nodes)
      placed[static_cast<std::size_t>(n.id)] = location_of(n);
    return placed;
  }

  graph graph_;
  std::shared_ptr<resource_manager> resources_;
  Eigen::ThreadPool pool_;
  cpu_device device_;
  std::map<std::string, std::unique_ptr<plan>> plans_;
  std::uint64_t planned_version_ = 0;
  std::unique_ptr<cluster_master> master_; // set for a session on a cluster
  bool allow_fusion_ = true;
  placer_options placement_; // a local session's
  std::ostream* placement_log_ = &std::cerr;
};

} // namespace loom

// A session runs a graph: in this process (TF's tf.Session() with no target),
// or on a cluster through a server's target (tf.Session("grpc://...")), where
// a master places, partitions and runs it across the tasks. Either way it runs
// through a detail::master_interface (runtime/interfaces.hpp): the local master
// (runtime/local_master.hpp) or the cluster master (runtime/master.hpp), made
// by the runtime linked into the program, so this header compiles neither.
// Fetches are typed: an output<T, R> or expression comes back as tensor<T, R>,
// an operation as nothing, several fetches as a tuple. Feeds are checked at
// compile time (dtype, rank) and at run time (shape).
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/graph/lower.hpp>
#include <loom/graph/output.hpp>
#include <loom/runtime/interfaces.hpp>

#include <algorithm>
#include <memory>
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

namespace detail {
// What a braced list {a, b} given to session::run converts to, only to say
// what to write instead (TF's sess.run([a, b]) is loom::fetches(a, b)).
struct braced_fetches {
  template <class... F>
  requires(sizeof...(F) >= 2) braced_fetches(const F&...) {
    static_assert(sizeof...(F) == 0, "loom::session::run: to fetch several values write "
                                     "sess.run(loom::fetches(a, b, ...)), not sess.run({a, b}); "
                                     "the values come back as a tuple");
  }
};
} // namespace detail

template <class... F> struct fetch_list { std::tuple<F...> items; };
// Several fetches in one run: sess.run(fetches(train_op, loss), feeds).
template <class... F> fetch_list<std::remove_cvref_t<F>...> fetches(F&&... f) {
  return {{std::forward<F>(f)...}};
}

class session {
public:
  explicit session(graph g, session_options o = {})
      : graph_(std::move(g)), master_(detail::runtime_factory::linked().local_master(o)) {}

  // A session on a cluster: `target` is a server's target() ("loom://host:port").
  // Variables live in the tasks' resource containers, shared with every other
  // session on the cluster.
  session(graph g, const session_target& target, cluster_session_options o = {})
      : graph_(std::move(g)),
        master_(detail::runtime_factory::linked().cluster_master(target.address, std::move(o))) {}

  // Clears the named resource containers (all when empty) on every task of the
  // cluster behind `target` (TF's tf.Session.reset). The tasks are asked at
  // once; a task not reached within o.connect_timeout fails the call with
  // unavailable, naming it, after the others were reset.
  static void reset(const std::string& target, const std::vector<std::string>& containers = {},
                    cluster_session_options o = {}) {
    detail::runtime_factory::linked().reset(target, containers, std::move(o));
  }

  // Tells every task of the cluster behind `target` (only those of `jobs`,
  // when given) to stop serving: their servers' join() return. The tasks are
  // told at once, and the call returns within o.connect_timeout (after
  // reaching the target) whether or not each was reached: the report names
  // those that were not, and so does one line on stderr unless o.quiet.
  static shutdown_report shutdown_cluster(const std::string& target,
                                          const std::vector<std::string>& jobs = {},
                                          cluster_session_options o = {}) {
    return detail::runtime_factory::linked().shutdown_cluster(target, jobs, std::move(o));
  }

  // Asks every task of the cluster behind `target` (only those of `jobs`,
  // when given) whether it serves, all at once, within o.connect_timeout
  // (after reaching the target), printing nothing. A chief closing its
  // training uses it to tell a worker that is gone from one still working.
  static ping_report ping_cluster(const std::string& target,
                                  const std::vector<std::string>& jobs = {},
                                  cluster_session_options o = {}) {
    return detail::runtime_factory::linked().ping_cluster(target, jobs, std::move(o));
  }

  session(const session&) = delete;
  session& operator=(const session&) = delete;

  // A fetch is an expression, an operation or fetches(a, b, ...), whose
  // values come back as a tuple.
  template <class F> auto run(const F& fetch, const feed_dict& feeds = {}) {
    auto [req, finish] = resolve_all(fetch);
    std::vector<any_tensor> fetched = execute(req, feeds);
    return finish(fetched);
  }

  // TF's sess.run(fetches, feed_dict, options, run_metadata): with
  // options.trace_level = trace_level::full the step is traced on every task
  // it runs on, into metadata->step_stats (runtime/step_stats.hpp; written
  // out by loom::timeline, runtime/timeline.hpp).
  template <class F>
  auto run(const F& fetch, const feed_dict& feeds, const run_options& options,
           run_metadata* metadata) {
    auto [req, finish] = resolve_all(fetch);
    std::vector<any_tensor> fetched = execute(req, feeds, nullptr, trace_into(options, metadata));
    return finish(fetched);
  }

  // sess.run({a, b}): a compile error that names loom::fetches(a, b) (the
  // conversion's static_assert); never runs.
  void run(detail::braced_fetches, const feed_dict& = {}) {}

  // The same step also fetches `extra` nodes, returned untyped and in order
  // (for hooks that watch a training loop: monitored_training_session).
  template <class F>
  auto run_with_extra(const F& fetch, const feed_dict& feeds, const std::vector<node_id>& extra,
                      const run_options& options = {}, run_metadata* metadata = nullptr) {
    auto [req, finish] = resolve_all(fetch);
    std::vector<std::size_t> at;
    at.reserve(extra.size());
    for (node_id id : extra)
      at.push_back(add_once(req.fetches, id));
    std::vector<any_tensor> fetched = execute(req, feeds, nullptr, trace_into(options, metadata));
    std::vector<any_tensor> extra_values;
    extra_values.reserve(extra.size());
    for (std::size_t i : at)
      extra_values.push_back(take(fetched, i));
    return std::make_pair(finish(fetched), std::move(extra_values));
  }

  // Runs by node ids, for untyped callers (optimizers, the supervisor, tools).
  std::vector<any_tensor> run_nodes(const std::vector<node_id>& fetch_ids,
                                    const std::vector<node_id>& target_ids,
                                    const std::vector<std::pair<node_id, any_tensor>>& feeds = {});

  const graph& graph_ref() const noexcept { return graph_; }

private:
  // A node fetched or run twice is computed and sent once: its position in `list`.
  static std::size_t add_once(std::vector<node_id>& list, node_id id);

  // The request a fetch makes, and how to turn the step's values into its result.
  template <class F> auto resolve_all(const F& fetch) {
    detail::run_request req;
    if constexpr (requires { fetch.items; }) {
      // Braces: the fetches lower in their order (a call's arguments have none).
      auto finishers =
          std::apply([&](const auto&... f) { return std::tuple{resolve(f, req)...}; }, fetch.items);
      return std::make_pair(std::move(req), [finishers](std::vector<any_tensor>& fetched) {
        return std::apply(
            [&](const auto&... finish) { return std::make_tuple(finish(fetched)...); }, finishers);
      });
    } else {
      auto finish = resolve(fetch, req);
      return std::make_pair(std::move(req), finish);
    }
  }

  // Adds a fetch to `req` (an operation as a target); returns how to turn
  // its value into the result.
  template <class F> auto resolve(const F& f, detail::run_request& req) {
    if constexpr (std::is_same_v<F, operation>) {
      check_graph(f.graph(), f.id(), "target");
      add_once(req.targets, f.id());
      return [](std::vector<any_tensor>&) { return nothing{}; };
    } else if constexpr (expression<F>) {
      auto out = lower(f);
      check_graph(out.graph(), out.id(), "fetch");
      using T = value_type_of<F>;
      constexpr int R = rank_of<F>;
      const node_id id = out.id();
      const std::size_t at = add_once(req.fetches, id);
      return [this, id, at](std::vector<any_tensor>& fetched) {
        return tensor<T, R>::from(take(fetched, at), "fetch of '" + graph_.node(id).name + "'");
      };
    } else {
      static_assert(expression<F> || std::is_same_v<F, operation>,
                    "loom::session::run: a fetch must be an expression (output, variable, "
                    "placeholder, ...) or an operation");
    }
  }

  // A fetched value that shares its buffer with state (a variable, a constant,
  // a feed) is copied, so later updates never change a returned tensor.
  static any_tensor take(std::vector<any_tensor>& fetched, std::size_t at) {
    any_tensor& v = fetched[at];
    return v.sole_owner() ? v : v.clone();
  }

  // Where a run with `options` leaves its trace: nowhere unless traced.
  // A failed step leaves it empty.
  static step_stats* trace_into(const run_options& options, run_metadata* metadata);

  // `what` (a fetch, a target or a feed) is node `id` of `g`, which must be the session's graph.
  void check_graph(const graph& g, node_id id, const char* what) const {
    if (!(g == graph_))
      throw invalid_argument_error(std::string(what) + " " + g.node(id).describe() +
                                   " belongs to another graph than the session's");
  }

  // Runs `req` with `feeds` (and `raw_feeds`), which it adds to req.fed; returns the
  // values of req.fetches, in its order. A node fed twice takes the last value.
  std::vector<any_tensor>
  execute(detail::run_request& req, const feed_dict& feeds,
          const std::vector<std::pair<node_id, any_tensor>>* raw_feeds = nullptr,
          step_stats* trace = nullptr);

  void check_feed(node_id id, const any_tensor& v) const;

  graph graph_;
  std::unique_ptr<detail::master_interface> master_;
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE auto session::run_nodes(const std::vector<node_id>& fetch_ids,
                                           const std::vector<node_id>& target_ids,
                                           const std::vector<std::pair<node_id, any_tensor>>& feeds)
    -> std::vector<any_tensor> {
  detail::run_request req;
  std::vector<std::size_t> at;
  at.reserve(fetch_ids.size());
  for (node_id f : fetch_ids)
    at.push_back(add_once(req.fetches, f));
  for (node_id t : target_ids)
    add_once(req.targets, t);
  feed_dict none;
  std::vector<any_tensor> fetched = execute(req, none, &feeds);
  std::vector<any_tensor> out; // one value per fetch, in order
  out.reserve(fetch_ids.size());
  for (std::size_t i : at)
    out.push_back(take(fetched, i));
  return out;
}

LOOM_COMPILED_ONCE std::size_t session::add_once(std::vector<node_id>& list, node_id id) {
  auto it = std::find(list.begin(), list.end(), id);
  if (it != list.end())
    return static_cast<std::size_t>(it - list.begin());
  list.push_back(id);
  return list.size() - 1;
}

LOOM_COMPILED_ONCE auto session::trace_into(const run_options& options, run_metadata* metadata)
    -> step_stats* {
  if (metadata)
    metadata->step_stats = {};
  if (options.trace_level == trace_level::none)
    return nullptr;
  if (!metadata)
    throw invalid_argument_error("session::run: run_options asks for a trace "
                                 "(trace_level::full) but no run_metadata was given to hold it");
  return &metadata->step_stats;
}

LOOM_COMPILED_ONCE auto
session::execute(detail::run_request& req, const feed_dict& feeds,
                 const std::vector<std::pair<node_id, any_tensor>>* raw_feeds, step_stats* trace)
    -> std::vector<any_tensor> {
  struct fed_value {
    node_id id;
    std::size_t order; // later feeds of a node win
    const any_tensor* value;
  };
  std::vector<fed_value> fed;
  auto add_feed = [&](node_id id, const any_tensor& v) {
    check_feed(id, v);
    fed.push_back({id, fed.size(), &v});
  };
  for (const feed& f : feeds) {
    check_graph(f.graph_ref(), f.id(), "feed");
    add_feed(f.id(), f.value());
  }
  if (raw_feeds)
    for (auto& [id, v] : *raw_feeds)
      add_feed(id, v);
  // By node id (a request's key does not depend on the feeds' order), the last of a
  // node's values kept.
  std::sort(fed.begin(), fed.end(), [](const fed_value& a, const fed_value& b) {
    return a.id != b.id ? a.id < b.id : a.order < b.order;
  });
  std::vector<any_tensor> values;
  values.reserve(fed.size());
  for (std::size_t i = 0; i < fed.size(); ++i) {
    if (i + 1 < fed.size() && fed[i + 1].id == fed[i].id)
      continue;
    req.fed.push_back(fed[i].id);
    values.push_back(*fed[i].value);
  }
  return master_->run(graph_, req, std::move(values), trace);
}

LOOM_COMPILED_ONCE void session::check_feed(node_id id, const any_tensor& v) const {
  const node_def& n = graph_.node(id);
  if (v.type() != n.type)
    throw invalid_argument_error(
        "feed for '" + n.name + "': a " + std::string(to_string(v.type())) +
        " tensor cannot feed a node of dtype " + std::string(to_string(n.type)));
  if (!v.shape().compatible_with(n.shape))
    throw invalid_argument_error("feed for '" + n.name + "': shape " + v.shape().to_string() +
                                 " is incompatible with the node's shape " + n.shape.to_string());
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

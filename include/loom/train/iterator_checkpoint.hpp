// Input positions in checkpoints (TF's iterator saveables,
// tf.data.experimental.make_saveable_from_iterator): the saver saves, beside the
// variables, the position of each iterator of its graph (collection::iterators) as
// the string tensor "<iterator>/.iterator_state", and a restore puts it back, so a
// worker restarted from a checkpoint continues its epoch where the checkpoint left it.
//
// The position is taken by an iterator_save node on the iterator's task, between two
// of its session's steps (the chief saves between its steps), and restored by an
// iterator_restore node there, before the next pull. An iterator saved is the one of
// the saving program's graph: in between-graph replication the chief's, as TF's;
// another worker starts its input over when it restarts.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/ops/iterator.hpp>
#include <loom/runtime/session.hpp>

#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace loom::detail {

class iterator_checkpoint {
public:
  static std::string key(const std::string& iterator) { return iterator + "/.iterator_state"; }

  iterator_checkpoint() = default;
  // The save and restore nodes of every iterator of g, beside it; made under the
  // caller's scopes (the saver clears them).
  explicit iterator_checkpoint(graph& g);

  bool empty() const noexcept { return iterators_.empty(); }

  // Each iterator's position, as (checkpoint key, string scalar), in one run.
  std::vector<std::pair<std::string, any_tensor>> save(session& s) const;

  // Puts each iterator back where `read(key)` says, in one run; read throws where a
  // checkpoint lacks a position (as it does for a missing variable).
  void restore(session& s, const std::function<any_tensor(const std::string&)>& read) const;

private:
  struct saved {
    std::string name; // the iterator's (its get_next node's) name
    node_id save, value, restore;
  };
  std::vector<saved> iterators_;
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE iterator_checkpoint::iterator_checkpoint(graph& g) {
  for (node_id pull : g.collection(collection::iterators)) {
    const node_def& n = g.node(pull);
    saved s{n.name, no_node, no_node, no_node};
    const attr_map dataset{{"dataset", n.attr<std::string>("dataset")}};
    s.save = g.add_node("iterator_save", {}, dataset, n.name + "/save_state");
    s.value = g.add_node("placeholder", {}, {{"dtype", dtype::string}, {"shape", loom::shape{}}},
                         n.name + "/restore_state/value");
    s.restore = g.add_node("iterator_restore", {s.value}, dataset, n.name + "/restore_state");
    for (node_id id : {s.save, s.value, s.restore})
      g.mutable_node(id).colocation_group = n.colocation();
    iterators_.push_back(std::move(s));
  }
}

LOOM_COMPILED_ONCE auto iterator_checkpoint::save(session& s) const
    -> std::vector<std::pair<std::string, any_tensor>> {
  std::vector<node_id> ids;
  for (const auto& i : iterators_)
    ids.push_back(i.save);
  std::vector<std::pair<std::string, any_tensor>> out;
  if (ids.empty())
    return out;
  std::vector<any_tensor> states = s.run_nodes(ids, {});
  for (std::size_t k = 0; k < states.size(); ++k)
    out.emplace_back(key(iterators_[k].name), std::move(states[k]));
  return out;
}

LOOM_COMPILED_ONCE void
iterator_checkpoint::restore(session& s,
                             const std::function<any_tensor(const std::string&)>& read) const {
  std::vector<std::pair<node_id, any_tensor>> feeds;
  std::vector<node_id> targets;
  for (const auto& i : iterators_) {
    any_tensor state = read(key(i.name));
    if (state.type() != dtype::string || state.rank() != 0)
      throw data_loss_error("checkpoint: tensor '" + key(i.name) + "' is " + state.describe() +
                            ", not an iterator's position (a string scalar)");
    feeds.emplace_back(i.value, std::move(state));
    targets.push_back(i.restore);
  }
  if (!targets.empty())
    s.run_nodes({}, targets, feeds);
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

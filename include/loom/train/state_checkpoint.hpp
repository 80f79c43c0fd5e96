// State of the graph's stateful nodes that no variable holds, in checkpoints, each piece a
// string scalar beside the variables:
// - input positions (TF's iterator saveables, tf.data.experimental.make_saveable_from_iterator):
//   each iterator of the graph (collection::iterators) as "<iterator>/.iterator_state", so a
//   worker restarted from a checkpoint continues its epoch where the checkpoint left it;
// - hash embeddings' admission counts (graph/hash_embedding.hpp, admit_after > 1): each saved
//   shard's count-min sketch as "<keys>/.admission_counts", so a restarted ps admits an id
//   after as many lookups as the one that saved it would have.
//
// A piece is taken by a save node on its task between two of its session's steps (the chief
// saves between its steps) and put back by a restore node there, before the next step. An
// iterator saved is the one of the saving program's graph: in between-graph replication the
// chief's, as TF's; another worker starts its input over when it restarts. A checkpoint
// without a position is refused (as a missing variable is); one without admission counts
// (saved before the table admitted by count) leaves the shard counting anew.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/hash_embedding.hpp>
#include <loom/graph/ops/iterator.hpp>
#include <loom/runtime/session.hpp>
#include <loom/train/checkpoint_relayout.hpp> // saved_variable

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::detail {

class state_checkpoint {
public:
  static std::string iterator_key(const std::string& iterator) {
    return iterator + "/.iterator_state";
  }
  static std::string admission_key(const std::string& keys) { return keys + "/.admission_counts"; }

  state_checkpoint() = default;
  // The save and restore nodes of every iterator of g and of the admission counts of every
  // hash table shard among `vars`, beside each; made under the caller's scopes (the saver
  // clears them).
  state_checkpoint(graph& g, const std::vector<saved_variable>& vars);

  enum class kind { iterator, admission };

  bool empty() const noexcept { return pieces_.empty(); }
  bool holds(kind k) const noexcept {
    return std::any_of(pieces_.begin(), pieces_.end(), [&](const piece& p) { return p.of == k; });
  }

  // Each piece, as (checkpoint key, string scalar), in one run.
  std::vector<std::pair<std::string, any_tensor>> save(session& s) const;

  // Puts each piece back (those of kind `only`, where given) from `read(key)`, in one run,
  // where `has` says the checkpoint holds it; a missing position is read all the same (read
  // throws, naming it). A chief restarted beside a ps that kept running restores only its
  // iterators: the ps's counts are newer than the checkpoint's.
  void restore(session& s, const std::function<bool(const std::string&)>& has,
               const std::function<any_tensor(const std::string&)>& read,
               std::optional<kind> only = std::nullopt) const;

private:
  struct piece {
    kind of;
    std::string key;
    node_id save, value, restore;
  };
  std::vector<piece> pieces_;
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE state_checkpoint::state_checkpoint(graph& g,
                                                      const std::vector<saved_variable>& vars) {
  auto value_of = [&](const std::string& name) {
    return g.add_node("placeholder", {}, {{"dtype", dtype::string}, {"shape", loom::shape{}}},
                      name);
  };
  auto colocate = [&](const piece& p, const std::string& group) {
    for (node_id id : {p.save, p.value, p.restore})
      g.mutable_node(id).colocation_group = group;
  };
  for (node_id pull : g.collection(collection::iterators)) {
    const node_def& n = g.node(pull);
    const attr_map dataset{{"dataset", n.attr<std::string>("dataset")}};
    piece p{kind::iterator, iterator_key(n.name), no_node, no_node, no_node};
    p.save = g.add_node("iterator_save", {}, dataset, n.name + "/save_state");
    p.value = value_of(n.name + "/restore_state/value");
    p.restore = g.add_node("iterator_restore", {p.value}, dataset, n.name + "/restore_state");
    colocate(p, g.node(pull).colocation());
    pieces_.push_back(std::move(p));
  }
  for (const saved_variable& v : vars) {
    const node_def& rows = g.node(v.variable);
    if (rows.attr_or<std::int64_t>("_admit_after", 1) < 2)
      continue;
    const std::string keys_name = rows.name.substr(0, rows.name.size() - 4) + "keys";
    const auto keys = g.try_find(keys_name);
    if (!keys)
      throw invalid_argument_error("saver: the table rows '" + rows.name +
                                   "' admit by count but have no keys '" + keys_name + "'");
    piece p{kind::admission, admission_key(keys_name), no_node, no_node, no_node};
    p.save =
        g.add_node("hash_embedding_admission_save", {*keys}, {}, keys_name + "/save_admission");
    p.value = value_of(keys_name + "/restore_admission/value");
    p.restore = g.add_node("hash_embedding_admission_restore", {*keys, p.value},
                           {{"admission_counters", rows.attr<std::int64_t>("_admission_counters")}},
                           keys_name + "/restore_admission");
    colocate(p, rows.colocation());
    pieces_.push_back(std::move(p));
  }
}

LOOM_COMPILED_ONCE auto state_checkpoint::save(session& s) const
    -> std::vector<std::pair<std::string, any_tensor>> {
  std::vector<node_id> ids;
  for (const piece& p : pieces_)
    ids.push_back(p.save);
  std::vector<std::pair<std::string, any_tensor>> out;
  if (ids.empty())
    return out;
  std::vector<any_tensor> values = s.run_nodes(ids, {});
  for (std::size_t k = 0; k < values.size(); ++k)
    out.emplace_back(pieces_[k].key, std::move(values[k]));
  return out;
}

LOOM_COMPILED_ONCE void
state_checkpoint::restore(session& s, const std::function<bool(const std::string&)>& has,
                          const std::function<any_tensor(const std::string&)>& read,
                          std::optional<kind> only) const {
  std::vector<std::pair<node_id, any_tensor>> feeds;
  std::vector<node_id> targets;
  for (const piece& p : pieces_) {
    if ((only && p.of != *only) || (p.of == kind::admission && !has(p.key)))
      continue;
    any_tensor value = read(p.key);
    if (value.type() != dtype::string || value.rank() != 0)
      throw data_loss_error(
          "checkpoint: tensor '" + p.key + "' is " + value.describe() + ", not " +
          (p.of == kind::iterator ? "an iterator's position" : "a hash table's admission counts") +
          " (a string scalar)");
    feeds.emplace_back(p.value, std::move(value));
    targets.push_back(p.restore);
  }
  if (!targets.empty())
    s.run_nodes({}, targets, feeds);
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

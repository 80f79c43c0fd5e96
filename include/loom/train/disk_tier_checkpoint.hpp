// Hash embeddings' disk tiers in checkpoints (graph/hash_embedding.hpp, disk_tier_dir): the
// rows a shard keeps on disk are not in its variables, so the saver saves them beside
// those, as "<rows>/.disk_tier/keys" (int64 [n]), "<rows>/.disk_tier/rows" ([n, dim]) and
// "<rows>/.disk_tier/<slot variable>" ([n, dim]) for each optimizer slot of the rows, in
// either format; a restore assigns the variables first, then refills each tier with the ids
// its memory tier does not hold.
//
// A save reads the variables while training may go on, and a row may move between the
// tiers meanwhile. So a save begins each tier first (hash_embedding_tier_begin: from then
// the shard keeps the record of every id moved back into memory), reads the variables, and
// takes the tiers last (hash_embedding_tier_export: the ids on disk and those kept). A row
// is then in the variables read or in the tier taken, or both, when the restore takes the
// memory tier's; none is lost. A checkpoint without these tensors restores an empty tier.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/hash_embedding.hpp>
#include <loom/runtime/session.hpp>
#include <loom/train/checkpoint_relayout.hpp> // saved_variable

#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace loom::detail {

class disk_tier_checkpoint {
public:
  static std::string key(const std::string& rows, const std::string& part) {
    return rows + "/.disk_tier/" + part;
  }

  disk_tier_checkpoint() = default;
  // The save and restore nodes of every saved rows variable with a disk tier, beside it;
  // made under the caller's scopes (the saver clears them).
  disk_tier_checkpoint(graph& g, const std::vector<saved_variable>& vars);

  // What hash_embedding_tier_import takes: n ids' rows then each slot's, [n, parts x dim],
  // from the checkpoint's [n, dim] parts (checked; `path` and `rows` name them in errors).
  static any_tensor records_of(const std::string& path, const std::string& rows, std::int64_t n,
                               std::int64_t dim, dtype type, const std::vector<any_tensor>& parts);

  bool empty() const noexcept { return tiers_.empty(); }
  // The tensors save() gives.
  std::size_t record_count() const noexcept;

  // A save's start, before it reads the variables.
  void begin(session& s) const;
  // Each tier as (checkpoint key, tensor), in one run, after the variables were read.
  std::vector<std::pair<std::string, any_tensor>> save(session& s) const;
  // After the variables were restored: each tier from what `read(key)` gives, where `has`
  // says the checkpoint holds it.
  void restore(session& s, const std::function<bool(const std::string&)>& has,
               const std::function<any_tensor(const std::string&)>& read) const;

private:
  struct tier {
    std::string rows;               // the rows variable's name
    std::vector<std::string> parts; // "keys", "rows", then each slot variable's name
    dtype type = dtype::f32;
    std::int64_t dim = 0;
    node_id begin = no_node;
    std::vector<node_id> exported; // the snapshot's parts, in `parts` order
    node_id ids = no_node, records = no_node, removed = no_node, import = no_node;
  };
  std::vector<tier> tiers_;
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE
disk_tier_checkpoint::disk_tier_checkpoint(graph& g, const std::vector<saved_variable>& vars) {
  for (const saved_variable& v : vars) {
    const node_def& rows = g.node(v.variable);
    const auto dir = rows.attr_or<std::string>("_disk_tier", "");
    if (dir.empty())
      continue;
    tier t;
    t.rows = rows.name;
    t.type = rows.type;
    t.dim = rows.shape[1];
    const std::string keys_name = rows.name.substr(0, rows.name.size() - 4) + "keys";
    const auto keys = g.try_find(keys_name);
    if (!keys)
      throw invalid_argument_error("saver: the table rows '" + rows.name +
                                   "' have a disk tier but no keys '" + keys_name + "'");
    const std::string slots = rows.attr_or<std::string>("_row_slots", "");
    t.parts = {"keys", "rows"};
    for (const auto& [slot, initial] : row_slots(rows))
      t.parts.push_back(slot);
    t.begin = g.add_node("hash_embedding_tier_begin", {*keys}, {}, rows.name + "/tier_begin");
    const node_id exported = g.add_node("hash_embedding_tier_export", {*keys, v.variable},
                                        {{"_row_slots", slots}}, rows.name + "/tier_export");
    for (std::size_t p = 0; p < t.parts.size(); ++p)
      t.exported.push_back(g.add_node("hash_embedding_changed_values",
                                      {*keys, v.variable, exported},
                                      {{"part", static_cast<std::int64_t>(p)},
                                       {"_row_slots", slots},
                                       {"snapshot", std::string("hash_tier_export")}}));
    t.ids = g.add_node("placeholder", {}, {{"dtype", dtype::i64}, {"shape", loom::shape{-1}}},
                       rows.name + "/tier_restore_ids");
    t.removed = g.add_node("placeholder", {}, {{"dtype", dtype::i64}, {"shape", loom::shape{-1}}},
                           rows.name + "/tier_restore_removed");
    const auto width = t.dim * static_cast<std::int64_t>(t.parts.size() - 1);
    t.records =
        g.add_node("placeholder", {}, {{"dtype", t.type}, {"shape", loom::shape{-1, width}}},
                   rows.name + "/tier_restore_records");
    t.import =
        g.add_node("hash_embedding_tier_import", {*keys, v.variable, t.ids, t.records, t.removed},
                   {{"disk_tier_dir", dir},
                    {"evict_when_full", true},
                    {"admit_after", rows.attr_or<std::int64_t>("_admit_after", 1)},
                    {"_row_slots", slots}},
                   rows.name + "/tier_import");
    // All on the shard's task: only the tier's tensors travel, once.
    for (node_id id : {t.begin, exported, t.ids, t.records, t.removed, t.import})
      g.mutable_node(id).colocation_group = rows.colocation();
    for (node_id id : t.exported)
      g.mutable_node(id).colocation_group = rows.colocation();
    tiers_.push_back(std::move(t));
  }
}

LOOM_COMPILED_ONCE any_tensor disk_tier_checkpoint::records_of(
    const std::string& path, const std::string& rows, std::int64_t n, std::int64_t dim, dtype type,
    const std::vector<any_tensor>& parts) {
  const auto count = static_cast<std::int64_t>(parts.size());
  any_tensor records(type, loom::shape{n, count * dim});
  const std::size_t row_bytes = static_cast<std::size_t>(dim) * size_of(type);
  for (std::int64_t p = 0; p < count; ++p) {
    const any_tensor& part = parts[static_cast<std::size_t>(p)];
    if (part.type() != type || !(part.shape() == loom::shape{n, dim}))
      throw data_loss_error("checkpoint " + path + ": the disk tier of '" + rows + "': part " +
                            std::to_string(p) + " is " + part.describe() + ", not " +
                            std::to_string(n) + " rows of " + std::to_string(dim) + " " +
                            std::string(to_string(type)));
    auto* to = static_cast<unsigned char*>(records.raw_data());
    const auto* from = static_cast<const unsigned char*>(part.raw_data());
    for (std::int64_t k = 0; k < n; ++k)
      std::memcpy(to + static_cast<std::size_t>(k * count + p) * row_bytes,
                  from + static_cast<std::size_t>(k) * row_bytes, row_bytes);
  }
  return records;
}

LOOM_COMPILED_ONCE std::size_t disk_tier_checkpoint::record_count() const noexcept {
  std::size_t n = 0;
  for (const tier& t : tiers_)
    n += t.parts.size();
  return n;
}

LOOM_COMPILED_ONCE void disk_tier_checkpoint::begin(session& s) const {
  std::vector<node_id> targets;
  for (const tier& t : tiers_)
    targets.push_back(t.begin);
  if (!targets.empty())
    s.run_nodes({}, targets, {});
}

LOOM_COMPILED_ONCE auto disk_tier_checkpoint::save(session& s) const
    -> std::vector<std::pair<std::string, any_tensor>> {
  std::vector<node_id> fetches;
  for (const tier& t : tiers_)
    fetches.insert(fetches.end(), t.exported.begin(), t.exported.end());
  std::vector<std::pair<std::string, any_tensor>> out;
  if (fetches.empty())
    return out;
  std::vector<any_tensor> values = s.run_nodes(fetches, {});
  std::size_t k = 0;
  for (const tier& t : tiers_)
    for (const std::string& part : t.parts)
      out.emplace_back(key(t.rows, part), std::move(values[k++]));
  return out;
}

LOOM_COMPILED_ONCE void
disk_tier_checkpoint::restore(session& s, const std::function<bool(const std::string&)>& has,
                              const std::function<any_tensor(const std::string&)>& read) const {
  std::vector<std::pair<node_id, any_tensor>> feeds;
  std::vector<node_id> targets;
  for (const tier& t : tiers_) {
    if (!has(key(t.rows, "keys")))
      continue; // saved without a tier: it starts empty
    any_tensor ids = read(key(t.rows, "keys"));
    if (ids.type() != dtype::i64 || ids.rank() != 1)
      throw data_loss_error("checkpoint: tensor '" + key(t.rows, "keys") + "' is " +
                            ids.describe() + ", not a disk tier's ids (int64 [n])");
    std::vector<any_tensor> parts;
    for (std::size_t p = 1; p < t.parts.size(); ++p) {
      const std::string name = key(t.rows, t.parts[p]);
      if (!has(name))
        throw not_found_error("checkpoint: the disk tier of '" + t.rows + "' lacks '" + name +
                              "' (saved with other optimizer slots?)");
      parts.push_back(read(name));
    }
    feeds.emplace_back(t.records, records_of("", t.rows, ids.num_elements(), t.dim, t.type, parts));
    feeds.emplace_back(t.ids, std::move(ids));
    feeds.emplace_back(t.removed, any_tensor(dtype::i64, loom::shape{0}));
    targets.push_back(t.import);
  }
  if (!targets.empty())
    s.run_nodes({}, targets, feeds);
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

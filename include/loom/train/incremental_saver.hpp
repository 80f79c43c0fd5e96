// Incremental checkpoints of hash-table embeddings (DeepRec's incremental
// checkpoints, Monolith's): after a full checkpoint, an increment holds only the
// rows of each table shard written since the last save, so a table of 10^8 rows
// that a few thousand steps touched saves those rows, not the table.
//
//   loom::incremental_saver saver(g);
//   saver.save(sess, dir + "/model", step);            // full: the chain's base
//   saver.save_increment(sess, dir + "/model", step);  // what changed since
//   saver.restore(sess, *loom::latest_checkpoint(dir)); // base, then every increment
//
// A full save is a saver's (train/saver.hpp: either format, sharded or not). An
// increment is one file of loom's format (core/checkpoint_format.hpp: written
// atomically, every tensor checksummed) holding, for each table shard, the row
// numbers written since the last save (rows an eviction emptied included: their
// key is -1) with their keys, rows and optimizer slots; every other variable
// whole (they are the small ones where tables are large); the iterators'
// positions and the admission counts, whole (train/state_checkpoint.hpp: each shard's
// count-min sketch, admission_counters bytes); and its link: the base's file name, the previous
// link's and its place in the chain. A restore walks the links back to the base, refusing a chain
// with a missing link (naming it) or a damaged one (a checksum), restores the base and applies each
// increment in order.
//
// How a shard knows what changed (kernels/context.hpp's row_changes): a save begins
// an epoch on every shard (hash_embedding_changes) under the shard's locks, and every
// write of a row in place (a lookup's new row or eviction, a sparse update, a
// scatter) stamps it with the running epoch, so a row written during a save is in
// this increment or in the next, never in neither. The changed rows' keys, values and
// slots are copied under the same locks (hash_embedding_changed_values hands them
// out), so an increment taken while other workers train pairs each key with its row.
// A shard that cannot tell (its task restarted, or its rows were assigned whole)
// answers with every row.
#pragma once

#include <loom/core/checkpoint_format.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/hash_embedding.hpp>
#include <loom/runtime/session.hpp>
#include <loom/train/checkpoint_state.hpp>
#include <loom/train/disk_tier_checkpoint.hpp>
#include <loom/train/saver.hpp>
#include <loom/train/saver_options.hpp>
#include <loom/train/state_checkpoint.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

class incremental_saver {
public:
  // The variables and options of the full checkpoints (saver_options; var_names'
  // renaming is refused: an increment names its variables by their nodes). Make it
  // after the optimizer, as a saver: a table's slots are the ones made by then.
  explicit incremental_saver(graph& g, saver_options o = {});

  // A full checkpoint (saver::save), the base of the increments after it.
  std::string save(session& s, const std::string& prefix,
                   std::optional<std::int64_t> global_step = {});

  // An increment of the chain of the last save or restore: "prefix-<step>" (or
  // prefix), loom's format. failed_precondition before any full save or restore.
  std::string save_increment(session& s, const std::string& prefix,
                             std::optional<std::int64_t> global_step = {});

  // A full checkpoint of either format, or an increment: its base, then each link.
  void restore(session& s, const std::string& path);

  // Whether `path` is an increment (loom's file holding a link).
  static bool is_increment(const std::string& path);

  // Whether a full save or a restore began a chain that save_increment extends.
  bool has_chain() const noexcept { return !base_.empty(); }

  // Takes over the checkpoints of an earlier run (saver::recover_last_checkpoints): its
  // full ones, which max_to_keep counts; increments go with their base.
  void recover_last_checkpoints(const std::vector<std::string>& paths) {
    full_.recover_last_checkpoints(full_ones(paths));
  }

  // The full saver behind the base checkpoints.
  saver& full() noexcept { return full_; }

private:
  // One table shard: its variables and the nodes that save and restore its rows.
  struct shard {
    std::string keys_name, rows_name;
    std::vector<std::string> slot_names;
    node_id since = no_node, next = no_node, changed = no_node; // changed: row numbers
    std::vector<node_id> snapshot_parts; // their keys, rows and slots, copied with them
    node_id at = no_node;                // restore: row numbers
    std::vector<node_id> values;         // restore: keys, rows, slots at them
    std::vector<node_id> patches;        // restore: the patch, then a scatter_update per slot
    // With a disk tier (the rows' _disk_tier): the snapshot's parts after the memory's are
    // the ids the tier took since the last save, their rows and every slot's, and the ids
    // it let go; restored by a tier import after the memory's patches (names as
    // disk_tier_checkpoint.hpp's, and "removed").
    std::vector<std::string> tier_parts; // "keys", "rows", each slot variable, "removed"
    std::int64_t dim = 0;
    dtype type = dtype::f32;
    node_id tier_ids = no_node, tier_records = no_node, tier_removed = no_node,
            tier_patch = no_node;
  };

  static saver_options without_renames(saver_options o) {
    if (!o.var_names.empty())
      throw invalid_argument_error("incremental_saver: var_names is not supported (an "
                                   "increment names its variables by their nodes); give var_list");
    return o;
  }
  static std::vector<std::string> full_ones(const std::vector<std::string>& paths) {
    std::vector<std::string> out;
    for (const std::string& p : paths)
      if (checkpoint_exists(p) && !is_increment(p))
        out.push_back(p);
    return out;
  }
  const std::string& name_of(std::size_t variable) const {
    return graph_.node(full_.variables()[variable].variable).name;
  }

  // Every shard begins epoch `next` (since -1: no rows asked).
  void begin_epochs(session& s, std::int64_t next);
  void apply_increment(session& s, const checkpoint_reader& r);
  // Writes the state file of `path`'s directory: the full saver's checkpoints, then
  // this chain's increments.
  void record_increment(const std::string& path);
  // Deletes the increments in `dir` whose base the full saver no longer keeps (found
  // by their links, so those of an earlier process's chains too).
  void drop_orphaned_increments(const std::string& dir);

  graph graph_;
  saver full_;
  std::vector<shard> shards_;
  std::vector<std::size_t> whole_; // indices into full_.variables(): saved whole
  // The chain being written: its base, its links so far, and the epoch its shards
  // run (the last save's `next`); epoch_counter_ gives each save a new one.
  std::string base_;
  std::vector<std::string> links_;
  std::int64_t epoch_ = 0, epoch_counter_ = 0;
};

namespace detail {
// increment_sequence_key, which marks an increment, is saver.hpp's: a saver refuses one.
inline constexpr const char* increment_base_key = "_increment/base";
inline constexpr const char* increment_previous_key = "_increment/previous";
inline std::string increment_rows_key(const std::string& rows) {
  return rows + "/.changed_rows";
}
} // namespace detail

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE incremental_saver::incremental_saver(graph& g, saver_options o)
    : graph_(g), full_(g, without_renames(std::move(o))) {
  auto no_names = g.name_scope("");
  auto no_deps = g.control_dependencies(nullptr);
  auto no_device = g.device(nullptr);
  auto names = g.name_scope("save_increment");
  const auto& vars = full_.variables();
  std::vector<bool> in_table(vars.size(), false);
  auto index_of = [&](const std::string& name) -> std::optional<std::size_t> {
    for (std::size_t i = 0; i < vars.size(); ++i)
      if (g.node(vars[i].variable).name == name)
        return i;
    return std::nullopt;
  };
  for (std::size_t i = 0; i < vars.size(); ++i) {
    const node_def& rows = g.node(vars[i].variable);
    if (!rows.attrs.contains("_row_slots")) // a hash table's rows carry their slots' list
      continue;
    shard sh;
    sh.rows_name = rows.name;
    sh.keys_name = rows.name.substr(0, rows.name.size() - std::string("rows").size()) + "keys";
    const auto keys_at = index_of(sh.keys_name);
    if (!keys_at)
      throw invalid_argument_error("incremental_saver: the table rows '" + rows.name +
                                   "' are saved without their keys '" + sh.keys_name + "'");
    in_table[i] = in_table[*keys_at] = true;
    std::vector<std::size_t> slot_at;
    std::vector<std::int64_t> parts{0, 1}; // of the snapshot: keys, rows, then each slot's
    std::int64_t part = 2;
    for (const auto& [slot, initial] : detail::row_slots(rows)) {
      if (auto k = index_of(slot)) { // a slot the saver does not save is skipped
        sh.slot_names.push_back(slot);
        slot_at.push_back(*k);
        parts.push_back(part);
        in_table[*k] = true;
      }
      ++part;
    }
    const node_id keys = g.find(sh.keys_name);
    const node_id rows_id = vars[i].variable;
    auto scalar = [&](const std::string& what) {
      return g.add_node("placeholder", {}, {{"dtype", dtype::i64}, {"shape", loom::shape{}}},
                        rows.name + "/" + what);
    };
    sh.since = scalar("since");
    sh.next = scalar("next");
    const std::string slots_list = rows.attr_or<std::string>("_row_slots", "");
    const auto tier_dir = rows.attr_or<std::string>("_disk_tier", "");
    attr_map changes_attrs{{"_row_slots", slots_list}};
    if (!tier_dir.empty())
      changes_attrs["disk_tier_dir"] = tier_dir;
    sh.changed = g.add_node("hash_embedding_changes", {keys, rows_id, sh.since, sh.next},
                            std::move(changes_attrs), rows.name + "/changes");
    std::vector<node_id> targets{keys, rows_id};
    for (std::size_t k : slot_at)
      targets.push_back(vars[k].variable);
    if (!tier_dir.empty()) { // the tier's parts: keys, rows, every slot, removed
      sh.tier_parts = {"keys", "rows"};
      for (const auto& [slot, initial] : detail::row_slots(rows))
        sh.tier_parts.push_back(slot);
      sh.tier_parts.push_back("removed");
      for (std::size_t k = 0; k < sh.tier_parts.size(); ++k)
        parts.push_back(part++);
      sh.dim = rows.shape[1];
      sh.type = rows.type;
      const auto width = sh.dim * static_cast<std::int64_t>(sh.tier_parts.size() - 2);
      auto ids = [&](const char* what) {
        return g.add_node("placeholder", {}, {{"dtype", dtype::i64}, {"shape", loom::shape{-1}}},
                          rows.name + "/" + what);
      };
      sh.tier_ids = ids("tier_patch_ids");
      sh.tier_removed = ids("tier_patch_removed");
      sh.tier_records =
          g.add_node("placeholder", {}, {{"dtype", sh.type}, {"shape", loom::shape{-1, width}}},
                     rows.name + "/tier_patch_records");
      sh.tier_patch = g.add_node("hash_embedding_tier_import",
                                 {keys, rows_id, sh.tier_ids, sh.tier_records, sh.tier_removed},
                                 {{"disk_tier_dir", tier_dir},
                                  {"evict_when_full", true},
                                  {"admit_after", rows.attr_or<std::int64_t>("_admit_after", 1)},
                                  {"_row_slots", slots_list}},
                                 rows.name + "/tier_patch");
      for (node_id id : {sh.tier_ids, sh.tier_records, sh.tier_removed, sh.tier_patch})
        g.mutable_node(id).colocation_group = rows.colocation();
    }
    for (std::int64_t p : parts)
      sh.snapshot_parts.push_back(
          g.add_node("hash_embedding_changed_values", {keys, rows_id, sh.changed},
                     {{"part", p}, {"_row_slots", slots_list}, {"tier", !tier_dir.empty()}}));
    sh.at = g.add_node("placeholder", {}, {{"dtype", dtype::i64}, {"shape", loom::shape{-1}}},
                       rows.name + "/restore_rows");
    for (node_id t : targets) {
      const node_def& v = g.node(t);
      loom::shape sh_shape = v.shape.rank() == 1 ? loom::shape{-1} : loom::shape{-1, v.shape[1]};
      sh.values.push_back(g.add_node("placeholder", {}, {{"dtype", v.type}, {"shape", sh_shape}},
                                     v.name + "/restore_values"));
    }
    sh.patches.push_back(
        g.add_node("hash_embedding_patch", {keys, rows_id, sh.at, sh.values[0], sh.values[1]}));
    for (std::size_t k = 2; k < targets.size(); ++k)
      sh.patches.push_back(g.add_node("scatter_update", {targets[k], sh.at, sh.values[k]}));
    // Everything of a shard runs on its task: the row numbers never travel.
    for (node_id id : {sh.since, sh.next, sh.changed, sh.at})
      g.mutable_node(id).colocation_group = rows.colocation();
    for (const auto& ids : {sh.snapshot_parts, sh.values, sh.patches})
      for (node_id id : ids)
        g.mutable_node(id).colocation_group = rows.colocation();
    shards_.push_back(std::move(sh));
  }
  for (std::size_t i = 0; i < vars.size(); ++i)
    if (!in_table[i])
      whole_.push_back(i);
}

LOOM_COMPILED_ONCE bool incremental_saver::is_increment(const std::string& path) {
  // From the file's first tensor's name alone, which an increment writes first: a full
  // checkpoint of loom's format may be gigabytes, and a reader checks every byte.
  std::ifstream in(path, std::ios::binary);
  char head[detail::ckpt::file_header_bytes + 4];
  if (!in.read(head, sizeof head) ||
      !std::equal(detail::ckpt::magic.begin(), detail::ckpt::magic.end(), head))
    return false;
  const auto length = detail::ckpt::get_le<std::uint32_t>(
      reinterpret_cast<const unsigned char*>(head) + detail::ckpt::file_header_bytes);
  const std::string_view key = detail::increment_sequence_key;
  std::string name(key.size(), '\0');
  return length == key.size() && in.read(name.data(), static_cast<std::streamsize>(key.size())) &&
         name == key;
}

LOOM_COMPILED_ONCE void incremental_saver::begin_epochs(session& s, std::int64_t next) {
  std::vector<std::pair<node_id, any_tensor>> feeds;
  std::vector<node_id> run;
  for (const shard& sh : shards_) {
    feeds.emplace_back(sh.since, any_tensor::scalar<std::int64_t>(-1));
    feeds.emplace_back(sh.next, any_tensor::scalar(next));
    run.push_back(sh.changed);
  }
  if (!run.empty())
    s.run_nodes({}, run, feeds);
  epoch_ = next;
}

LOOM_COMPILED_ONCE std::string incremental_saver::save(session& s, const std::string& prefix,
                                                       std::optional<std::int64_t> global_step) {
  // A new process's full saver adopts the directory's checkpoints to keep from its
  // state file, which lists increments too: it is given the full ones alone.
  if (full_.last_checkpoints().empty())
    if (auto st = get_checkpoint_state(detail::ckpt::parent_dir(prefix)))
      recover_last_checkpoints(st->all_model_checkpoint_paths);
  // The epoch begins before the variables are read: a row written while they are
  // is stamped with it, and so in the first increment whatever the full save read.
  // From here the stamps no longer say what changed since the chain's last link: a
  // failed save leaves no chain, and the next save must be full.
  base_.clear();
  links_.clear();
  begin_epochs(s, ++epoch_counter_);
  const std::string path = full_.save(s, prefix, global_step);
  base_ = path;
  links_.clear();
  drop_orphaned_increments(detail::ckpt::parent_dir(path));
  return path;
}

LOOM_COMPILED_ONCE std::string
incremental_saver::save_increment(session& s, const std::string& prefix,
                                  std::optional<std::int64_t> global_step) {
  if (base_.empty())
    throw failed_precondition_error("incremental_saver::save_increment: no chain to extend; "
                                    "save a full checkpoint (save) or restore one first");
  if (prefix.empty())
    throw invalid_argument_error("incremental_saver::save_increment: empty checkpoint prefix");
  const std::string path = global_step ? prefix + "-" + std::to_string(*global_step) : prefix;
  if (path == base_ || std::find(links_.begin(), links_.end(), path) != links_.end())
    throw invalid_argument_error("incremental_saver::save_increment: " + path +
                                 " is already in the chain it extends");
  const std::int64_t next = ++epoch_counter_;
  std::vector<std::pair<node_id, any_tensor>> feeds;
  std::vector<node_id> fetch;
  for (const shard& sh : shards_) {
    feeds.emplace_back(sh.since, any_tensor::scalar(epoch_));
    feeds.emplace_back(sh.next, any_tensor::scalar(next));
    fetch.push_back(sh.changed);
    fetch.insert(fetch.end(), sh.snapshot_parts.begin(), sh.snapshot_parts.end());
  }
  const auto& vars = full_.variables();
  for (std::size_t i : whole_)
    fetch.push_back(vars[i].variable);
  std::vector<any_tensor> values = s.run_nodes(fetch, {}, feeds);
  std::vector<std::pair<std::string, any_tensor>> records;
  auto file_name = [](const std::string& p) {
    return std::filesystem::path(p).filename().string();
  };
  records.emplace_back(detail::increment_sequence_key,
                       any_tensor::scalar(static_cast<std::int64_t>(links_.size() + 1)));
  records.emplace_back(detail::increment_base_key, any_tensor::scalar(file_name(base_)));
  records.emplace_back(detail::increment_previous_key,
                       any_tensor::scalar(file_name(links_.empty() ? base_ : links_.back())));
  std::size_t at = 0;
  for (const shard& sh : shards_) {
    records.emplace_back(detail::increment_rows_key(sh.rows_name), std::move(values[at++]));
    records.emplace_back(sh.keys_name, std::move(values[at++]));
    records.emplace_back(sh.rows_name, std::move(values[at++]));
    for (const std::string& slot : sh.slot_names)
      records.emplace_back(slot, std::move(values[at++]));
    for (const std::string& part : sh.tier_parts)
      records.emplace_back(detail::disk_tier_checkpoint::key(sh.rows_name, part),
                           std::move(values[at++]));
  }
  for (std::size_t i : whole_)
    records.emplace_back(name_of(i), std::move(values[at++]));
  for (auto& piece : full_.state().save(s))
    records.push_back(std::move(piece));
  write_checkpoint_file(path, records.size(), [&](std::size_t i) { return records[i]; });
  epoch_ = next; // only once the increment is on disk: a failed one is taken again
  links_.push_back(path);
  record_increment(path);
  return path;
}

LOOM_COMPILED_ONCE void incremental_saver::record_increment(const std::string& path) {
  std::vector<std::string> listed = full_.last_checkpoints();
  if (std::find(listed.begin(), listed.end(), base_) == listed.end())
    listed.push_back(base_);
  listed.insert(listed.end(), links_.begin(), links_.end());
  write_checkpoint_state(detail::ckpt::parent_dir(path), listed);
}

LOOM_COMPILED_ONCE void incremental_saver::drop_orphaned_increments(const std::string& dir) {
  const std::vector<std::string>& kept = full_.last_checkpoints();
  for (const std::string& f : detail::checkpoint_files_in(dir)) {
    if (!is_increment(f))
      continue;
    std::string base;
    try {
      base = (std::filesystem::path(dir) /
              checkpoint_reader(f).read_tensor(detail::increment_base_key).data<std::string>()[0])
                 .string();
    } catch (const error&) {
      continue; // a damaged increment: left for a person to look at
    }
    const auto same = [&](const std::string& p) {
      return std::filesystem::path(p).filename() == std::filesystem::path(base).filename();
    };
    if (!same(base_) && std::none_of(kept.begin(), kept.end(), same))
      ::unlink(f.c_str());
  }
}

LOOM_COMPILED_ONCE void incremental_saver::restore(session& s, const std::string& path) {
  // The links from `path` back to the base, each checked (structure and checksums)
  // before anything is restored.
  std::vector<std::unique_ptr<checkpoint_reader>> links;
  std::string at = path;
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  while (is_increment(at)) {
    auto r = std::make_unique<checkpoint_reader>(at);
    for (const auto& e : r->entries())
      if (!e.crc_ok)
        r->read(e); // throws data_loss, naming the file and the tensor
    const std::int64_t seq = *r->read_tensor(detail::increment_sequence_key).data<std::int64_t>();
    if (!links.empty()) {
      const std::int64_t after =
          *links.back()->read_tensor(detail::increment_sequence_key).data<std::int64_t>();
      if (seq != after - 1)
        throw data_loss_error("incremental checkpoint " + links.back()->path() + " (link " +
                              std::to_string(after) + ") names " + at +
                              " as its previous link, which is link " + std::to_string(seq));
    }
    const std::string previous =
        (dir / *r->read_tensor(detail::increment_previous_key).data<std::string>()).string();
    links.push_back(std::move(r));
    if (!checkpoint_exists(previous))
      throw not_found_error("incremental checkpoint " + path + ": its chain's link " + previous +
                            (seq == 1 ? " (the full checkpoint it is based on)" : "") +
                            " is missing");
    at = previous;
  }
  if (!links.empty()) {
    const std::string base =
        (dir / *links.back()->read_tensor(detail::increment_base_key).data<std::string>()).string();
    if (*links.back()->read_tensor(detail::increment_sequence_key).data<std::int64_t>() != 1 ||
        std::filesystem::path(base).filename() != std::filesystem::path(at).filename())
      throw data_loss_error("incremental checkpoint " + path + ": its chain reaches " + at +
                            ", a full checkpoint, but is based on " + base);
  }
  full_.restore(s, at);
  for (auto it = links.rbegin(); it != links.rend(); ++it)
    apply_increment(s, **it);
  if (!links.empty() && !full_.state().empty()) {
    const checkpoint_reader& last = *links.front();
    full_.state().restore(
        s, [&](const std::string& key) { return last.has_tensor(key); },
        [&](const std::string& key) { return last.read_tensor(key); });
  }
  // The chain continues from what was restored.
  begin_epochs(s, ++epoch_counter_);
  base_ = at;
  links_.clear();
  for (auto it = links.rbegin(); it != links.rend(); ++it)
    links_.push_back((*it)->path());
}

LOOM_COMPILED_ONCE void incremental_saver::apply_increment(session& s, const checkpoint_reader& r) {
  auto read = [&](const std::string& name) {
    if (!r.has_tensor(name))
      throw not_found_error("incremental checkpoint " + r.path() + ": no tensor '" + name +
                            "' (it was written by another graph)");
    return r.read_tensor(name);
  };
  std::vector<std::pair<node_id, any_tensor>> feeds;
  std::vector<node_id> run;
  for (const shard& sh : shards_) {
    feeds.emplace_back(sh.at, read(detail::increment_rows_key(sh.rows_name)));
    feeds.emplace_back(sh.values[0], read(sh.keys_name));
    feeds.emplace_back(sh.values[1], read(sh.rows_name));
    for (std::size_t k = 0; k < sh.slot_names.size(); ++k)
      feeds.emplace_back(sh.values[k + 2], read(sh.slot_names[k]));
    run.insert(run.end(), sh.patches.begin(), sh.patches.end());
  }
  const auto& vars = full_.variables();
  for (std::size_t i : whole_) {
    any_tensor v = read(name_of(i));
    if (v.type() != vars[i].type || !(v.shape() == vars[i].shape))
      throw invalid_argument_error("incremental checkpoint " + r.path() + ": tensor '" +
                                   name_of(i) + "' is " + v.describe() + ", the variable is " +
                                   std::string(to_string(vars[i].type)) +
                                   vars[i].shape.to_string());
    feeds.emplace_back(vars[i].value, std::move(v));
    run.push_back(vars[i].assign);
  }
  s.run_nodes({}, run, feeds);
  // The tiers after the memory's patches, which they read (an id back in memory leaves
  // its tier).
  feeds.clear();
  run.clear();
  for (const shard& sh : shards_) {
    if (sh.tier_parts.empty())
      continue;
    std::vector<any_tensor> parts;
    for (std::size_t p = 1; p + 1 < sh.tier_parts.size(); ++p)
      parts.push_back(read(detail::disk_tier_checkpoint::key(sh.rows_name, sh.tier_parts[p])));
    any_tensor ids = read(detail::disk_tier_checkpoint::key(sh.rows_name, "keys"));
    feeds.emplace_back(sh.tier_records,
                       detail::disk_tier_checkpoint::records_of(
                           r.path(), sh.rows_name, ids.num_elements(), sh.dim, sh.type, parts));
    feeds.emplace_back(sh.tier_ids, std::move(ids));
    feeds.emplace_back(sh.tier_removed,
                       read(detail::disk_tier_checkpoint::key(sh.rows_name, "removed")));
    run.push_back(sh.tier_patch);
  }
  if (!run.empty())
    s.run_nodes({}, run, feeds);
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

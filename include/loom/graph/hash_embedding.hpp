// Hash-table embeddings (beyond TF core: TensorFlow Recommenders-Addons'
// dynamic_embedding, Monolith's hash tables): an embedding keyed by arbitrary
// non-negative int64 ids, no vocabulary and no collisions, whose rows are made
// on the ps the first time an id is looked up.
//
//   loom::hash_embedding<float> emb(g, "user", 16, {.capacity_per_shard = 1 << 20,
//                                                   .num_shards = 2});
//   auto rows = emb.lookup(ids);          // ids' shape + [16]
//   auto count = emb.size();              // rows made so far
//
// Each shard is two ordinary variables on one task (the device scope places
// them: replica_device_setter deals shards over the ps tasks): "rows"
// [capacity, dim] and "keys" [capacity] int64, keys[r] the id row r holds or
// -1. A step routes each id to shard id % num_shards (as "mod"), sends each
// shard its distinct ids once, and there `hash_embedding_rows` turns them into
// row numbers, giving a new id the next free row, initialized from a normal
// distribution whose draw is a function of (seed, id) alone; then the rows are
// gathered as from any variable. So the gradient is an indexed_slices of
// `rows`, and every optimizer's sparse apply and slots work unchanged; the
// saver saves keys and rows with the rest (names "<name>/part_<i>_of_<n>/...",
// so a checkpoint never restores into another shard count by mistake).
//
// The ids -> row index lives beside the keys variable and is rebuilt from it
// whenever the variable's buffer changes (an initializer or a restore).
// Capacity is fixed per shard (its rows are allocated when initialized); a
// shard that would need more fails the step with resource_exhausted, naming
// it, unless it evicts.
//
// Eviction (steps_to_live, evict_when_full): each shard counts its lookups (its
// clock) and keeps its rows in the order they were last looked up. A lookup first
// removes the rows not looked up in the last steps_to_live lookups; and where a
// full shard needs rows for new ids, it takes them from the least recently looked
// up (LRU, not LFU: admission already keeps out the ids seen too rarely, and
// recency follows a stream whose popular ids change; it costs 16 bytes a row and
// O(1) a lookup), never one this step looks up. An evicted row's key becomes -1,
// so a checkpoint saved after holds it no more; the row and its optimizer slots
// (recorded by the optimizer when it makes them) restart when a new id takes it;
// the id's admission counts start over.
//
// Admission (admit_after > 1, DeepRec's counter filter): an id becomes a row
// in the step in which it has been looked up in admit_after steps (a step's
// repeats of an id count once: each shard gets its distinct ids once). Until
// then it is given row 0 of its shard, which admission reserves and which no
// id ever holds: the shard's rows are multiplied by a mask that is 0 for it,
// so such a lookup is zeros and its gradient is zeros (row 0 then stays zero
// under every optimizer's update: its slots stay at their start). The counts
// are a count-min sketch per shard beside the index, 4 rows of one-byte
// counters with conservative updates (an id's count errs only upwards: it may
// be admitted early, never late), admission_counters bytes per shard, in the
// ps's memory; a saver saves each shard's beside its variables and a restore puts
// them back (train/state_checkpoint.hpp), so a restarted ps counts on.
//
// A disk tier (disk_tier_dir): capacity_per_shard becomes the memory tier's rows, and a
// full shard moves the row least recently looked up, with its optimizer slots, to a
// file of fixed-size records on its task's local disk (kernels/cpu/row_file.hpp says why
// not RocksDB) instead of dropping it; a lookup of an id held there moves it back into
// memory (making room the same way) before the step's gather, so lookups and sparse
// applies see one table, and a row's values and slots are those it would have had in
// memory. Rows age out on disk as in memory (steps_to_live: each lookup lets go of the
// rows aged by then, in time for their number, and a save leaves aged rows out). The tier
// is the process's (it starts empty); a saver saves it beside the table's variables and a
// restore refills it (train/disk_tier_checkpoint.hpp).
#pragma once

#include <loom/graph/builder.hpp>
#include <loom/graph/lower.hpp> // scalar_node
#include <loom/graph/op_registry.hpp>
#include <loom/graph/ops/array.hpp>
#include <loom/graph/ops/embedding_lookup.hpp>
#include <loom/graph/ops/summary.hpp>
#include <loom/graph/ops/sync.hpp> // attach_to_variable
#include <loom/graph/variables.hpp>

#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace loom::detail {

// The optimizer slots of a hash embedding's rows, which eviction restarts in a row it
// gives to a new id: attr "_row_slots" of the rows variable and of its lookups, a
// line "<initial value> <slot variable>" each. An optimizer's make_slot records a
// slot (add_row_slot) on the rows and on the lookups built already; a lookup built
// later copies the rows' list.
inline std::vector<std::pair<std::string, double>> row_slots(const node_def& n) {
  std::vector<std::pair<std::string, double>> out;
  const auto text = n.attr_or<std::string>("_row_slots", "");
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t space = text.find(' ', at), end = text.find('\n', at);
    if (space == std::string::npos || end == std::string::npos || space > end)
      throw internal_error("node " + n.describe() + ": _row_slots is malformed");
    out.emplace_back(text.substr(space + 1, end - space - 1),
                     std::stod(text.substr(at, space - at)));
    at = end + 1;
  }
  return out;
}

inline void add_row_slot(graph& g, node_id rows, const std::string& slot, double initial) {
  const std::string rows_name = g.node(rows).name;
  char value[32];
  const auto printed = std::to_chars(value, value + sizeof value, initial);
  const std::string line = std::string(value, printed.ptr) + " " + slot + "\n";
  auto append = [&](node_id id) {
    auto& attr = g.mutable_node(id).attrs["_row_slots"];
    if (!std::holds_alternative<std::string>(attr))
      attr = std::string();
    std::get<std::string>(attr) += line;
  };
  append(rows);
  for (node_id id = 0; id < static_cast<node_id>(g.size()); ++id)
    if (const node_def& n = g.node(id);
        n.op == "hash_embedding_rows" && n.attr_or<std::string>("_ref_name_1", "") == rows_name)
      append(id);
}

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
// A per-shard count's input: a hash embedding's keys variable, int64 [capacity].
inline void require_hash_keys(const node_def& n, const node_def& keys) {
  if (keys.op != "variable" || keys.type != dtype::i64 || keys.shape.rank() != 1)
    throw invalid_argument_error("node " + n.describe() +
                                 ": its input must be a hash embedding's keys");
}

// A lookup's inputs (keys, rows, ids), checked, and its node put beside them with its
// index (a resource beside the keys, which sit beside the rows).
inline void check_hash_lookup(node_def& n, const std::vector<const node_def*>& in) {
  const node_def& keys = *in[0];
  const node_def& rows = *in[1];
  if (keys.op != "variable" || rows.op != "variable")
    throw invalid_argument_error("node " + n.describe() + ": keys and rows must be variables");
  if (keys.type != dtype::i64 || keys.shape.rank() != 1 || rows.shape.rank() != 2 ||
      keys.shape[0] != rows.shape[0])
    throw invalid_argument_error("node " + n.describe() + ": keys " + keys.describe() + " " +
                                 keys.shape.to_string() + " and rows " + rows.describe() + " " +
                                 rows.shape.to_string() +
                                 " must be int64 [capacity] and [capacity, dim] of one capacity");
  if (in[2]->type != dtype::i64)
    throw invalid_argument_error("node " + n.describe() + ": the ids " + in[2]->describe() +
                                 " must be int64");
  attach_to_variable(n, keys, "hash_index");
  n.attrs["_ref_name_1"] = rows.name;
}

inline bool register_hash_embedding_ops() {
  auto& r = op_registry::instance();
  // Inputs (keys, rows, ids): keys an int64 [capacity] variable, rows a
  // [capacity, dim] variable, ids int64 of any shape. Output: the row of each
  // id, int64 of ids' shape (0 for an id not admitted yet). Attrs: init_stddev,
  // seed, admit_after (1: every id at once), admission_counters, steps_to_live,
  // evict_when_full, _row_slots.
  r.add({.name = "hash_embedding_rows",
         .num_inputs = 3,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               check_hash_lookup(n, in);
               n.type = dtype::i64;
               n.shape = in[2]->shape;
             },
         .stateful = true,
         .ref_inputs = 0b011u,
         .type_input = 1});
  // The same inputs and attrs; output: the rows of the ids, ids' shape + [dim], zeros
  // for an id without a row. It makes no row, counts nothing and ages no row (an
  // evaluation's lookup); not differentiable.
  r.add({.name = "hash_embedding_read",
         .num_inputs = 3,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               check_hash_lookup(n, in);
               n.type = in[1]->type;
               std::vector<std::int64_t> dims = in[2]->shape.dims();
               dims.push_back(in[1]->shape[1]);
               n.shape = loom::shape(std::move(dims));
             },
         .stateful = true,
         .ref_inputs = 0b011u,
         .type_input = 1});
  // Input (keys): what a shard's index counts, int64 scalar, by attr "of": "waiting"
  // (an estimate of the ids counted and not admitted: linear counting over the
  // sketch's first row; 0 without admission); since the shard's process started,
  // "evicted", "made" (rows made), "lookups" (ids looked up, a step's distinct ids
  // once), "hits" (those that had rows in memory), "spilled" and "promoted" (rows moved
  // to the disk tier and back); and the disk tier's "on_disk" (rows) and "disk_bytes"
  // (its file's size).
  r.add({.name = "hash_embedding_count",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               require_hash_keys(n, *in[0]);
               const auto of = n.attr_or<std::string>("of", "");
               if (of != "waiting" && of != "evicted" && of != "made" && of != "lookups" &&
                   of != "hits" && of != "on_disk" && of != "disk_bytes" && of != "spilled" &&
                   of != "promoted")
                 throw invalid_argument_error("node " + n.describe() + ": counts \"" + of +
                                              "\"; it counts waiting, evicted, made, lookups, "
                                              "hits, on_disk, disk_bytes, spilled or promoted");
               attach_to_variable(n, *in[0], "hash_index");
               n.type = dtype::i64;
               n.shape = {};
             },
         .stateful = true,
         .type_input = -1});
  // Inputs (keys, rows, since, next; int64 scalars): an incremental checkpoint's
  // question (train/incremental_saver.hpp). With attr disk_tier_dir, its snapshot also
  // holds what the shard's disk tier took and let go since `since`. since < 0: epoch `next` begins,
  // and no rows (a full save's start, or a restore's end). Otherwise the rows written since epoch
  // `since` began, and epoch `next` begins; every row where the shard cannot tell (its
  // task restarted, or its rows were assigned whole). Output: int64 row numbers [n].
  // Their keys, values and slots (attr _row_slots) are copied under the same locks, for
  // hash_embedding_changed_values to hand out: one consistent snapshot, while training
  // goes on.
  r.add({.name = "hash_embedding_changes",
         .num_inputs = 4,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               check_hash_lookup(n, in);
               require_int64_scalar(n, *in[2], "since");
               require_int64_scalar(n, *in[3], "next");
               attach_to_variable(n, *in[0], "hash_increment");
               n.type = dtype::i64;
               n.shape = loom::shape{-1};
             },
         .stateful = true,
         .ref_inputs = 0b011u,
         .type_input = -1});
  // Inputs (keys, rows, the row numbers hash_embedding_changes gave): part `part` of its
  // snapshot: 0 the keys [n], 1 the rows [n, dim], 2 + k slot k's rows [n, dim]. With attr
  // snapshot "hash_tier_export", of hash_embedding_tier_export's (input 2 its ids).
  r.add({.name = "hash_embedding_changed_values",
         .num_inputs = 3,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               check_hash_lookup(n, in);
               const auto snapshot = n.attr_or<std::string>("snapshot", "hash_increment");
               if (snapshot != "hash_increment" && snapshot != "hash_tier_export")
                 throw invalid_argument_error("node " + n.describe() + ": snapshot \"" + snapshot +
                                              "\": hash_increment or hash_tier_export");
               attach_to_variable(n, *in[0], snapshot);
               const auto part = n.attr_or<std::int64_t>("part", -1);
               const auto slots = static_cast<std::int64_t>(row_slots(n).size());
               // With attr tier (an increment's of a table with a disk tier), the tier's
               // parts follow: its ids, rows, each slot's rows, and the ids it let go.
               const bool tier = n.attr_or<bool>("tier", false);
               if (part < 0 || part >= 2 + slots + (tier ? 3 + slots : 0))
                 throw invalid_argument_error(
                     "node " + n.describe() + ": part " + std::to_string(part) +
                     " of the keys, the rows and the slots in _row_slots" +
                     (tier ? ", then the tier's ids, rows, slots and removed ids" : ""));
               const std::int64_t q = part - (2 + slots); // within the tier's parts
               const bool ids = part == 0 || q == 0 || q == 2 + slots;
               n.type = ids ? dtype::i64 : in[1]->type;
               n.shape = ids ? loom::shape{-1} : loom::shape{-1, in[1]->shape[1]};
             },
         .stateful = true,
         .ref_inputs = 0b011u,
         .type_input = -1});
  // Inputs (keys, rows, row numbers [n], their keys [n], their rows [n, dim]): an
  // increment restored into a shard (its slots by scatter_update). Output: int64 n.
  r.add({.name = "hash_embedding_patch",
         .num_inputs = 5,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               check_hash_lookup(n, in);
               if (in[3]->type != dtype::i64 || in[4]->type != in[1]->type)
                 throw invalid_argument_error("node " + n.describe() + ": the keys " +
                                              in[3]->describe() + " must be int64 and the rows " +
                                              in[4]->describe() + " of the table's dtype");
               n.type = dtype::i64;
               n.shape = {};
             },
         .stateful = true,
         .ref_inputs = 0b011u,
         .type_input = 1});
  // A disk tier in checkpoints (train/disk_tier_checkpoint.hpp). Input (keys): a save's
  // start; from here the records of ids moving back into memory are kept for the save.
  // Output: int64 0.
  r.add({.name = "hash_embedding_tier_begin",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               require_hash_keys(n, *in[0]);
               attach_to_variable(n, *in[0], "hash_index");
               n.type = dtype::i64;
               n.shape = {};
             },
         .stateful = true,
         .type_input = -1});
  // Inputs (keys, rows): the ids of the tier and those kept since the save's start, int64
  // [n]; their keys, rows and slots (_row_slots) for hash_embedding_changed_values with
  // attr snapshot "hash_tier_export". Ends the save's keeping.
  r.add({.name = "hash_embedding_tier_export",
         .num_inputs = 2,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               require_hash_keys(n, *in[0]);
               if (in[1]->op != "variable" || in[1]->shape.rank() != 2)
                 throw invalid_argument_error("node " + n.describe() + ": rows " +
                                              in[1]->describe() +
                                              " must be a [capacity, dim] variable");
               attach_to_variable(n, *in[0], "hash_index");
               n.attrs["_ref_name_1"] = in[1]->name;
               n.type = dtype::i64;
               n.shape = loom::shape{-1};
             },
         .stateful = true,
         .ref_inputs = 0b011u,
         .type_input = 1});
  // Inputs (keys, rows, ids [n], records [n, (1 + slots) x dim]: each id's row, then each
  // slot's, removed [r]): a restore's disk tier, after its variables (a full checkpoint's,
  // into the tier the assigns emptied; an increment's, after its memory patch): the removed
  // ids leave the tier, the others are written, and the ids the memory tier holds leave it.
  // Attrs as a lookup's. Output: int64, the records written.
  r.add({.name = "hash_embedding_tier_import",
         .num_inputs = 5,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               check_hash_lookup(n, in);
               if (in[4]->type != dtype::i64 || in[4]->shape.rank() != 1)
                 throw invalid_argument_error("node " + n.describe() + ": the removed ids " +
                                              in[4]->describe() + " must be int64 [r]");
               if (in[3]->type != in[1]->type || in[3]->shape.rank() != 2)
                 throw invalid_argument_error("node " + n.describe() + ": the records " +
                                              in[3]->describe() +
                                              " must be [n, width] of the "
                                              "table's dtype");
               n.type = dtype::i64;
               n.shape = {};
             },
         .stateful = true,
         .ref_inputs = 0b011u,
         .type_input = 1});
  // Admission counts in checkpoints (train/state_checkpoint.hpp). Input (keys): the
  // shard's counts, a string scalar ("" before its first lookup).
  r.add({.name = "hash_embedding_admission_save",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               require_hash_keys(n, *in[0]);
               attach_to_variable(n, *in[0], "hash_index");
               n.type = dtype::string;
               n.shape = {};
             },
         .stateful = true,
         .type_input = -1});
  // Inputs (keys, counts: what hash_embedding_admission_save gave); attr admission_counters
  // (the table's). The shard's counts replaced. Output: int64, the counters restored.
  r.add({.name = "hash_embedding_admission_restore",
         .num_inputs = 2,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               require_hash_keys(n, *in[0]);
               if (in[1]->type != dtype::string || in[1]->shape.rank() != 0)
                 throw invalid_argument_error("node " + n.describe() +
                                              ": restores from a string "
                                              "scalar, not " +
                                              in[1]->describe());
               if (n.attr_or<std::int64_t>("admission_counters", 0) < 4)
                 throw invalid_argument_error("node " + n.describe() +
                                              ": needs admission_counters of 4 or more");
               attach_to_variable(n, *in[0], "hash_index");
               n.type = dtype::i64;
               n.shape = {};
             },
         .stateful = true,
         .type_input = -1});
  // Input (keys): the count of ids a shard holds, int64 scalar.
  r.add({.name = "hash_embedding_size",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               require_hash_keys(n, *in[0]);
               n.colocation_group = in[0]->colocation();
               n.attrs["_ref_name_0"] = in[0]->name;
               n.type = dtype::i64;
               n.shape = {};
             },
         .stateful = true,
         .ref_inputs = 1u,
         .type_input = -1});
  return true;
}

inline const bool hash_embedding_ops_registered = register_hash_embedding_ops();
#endif

} // namespace loom::detail

namespace loom {

struct hash_embedding_options {
  // Rows each shard can hold (allocated, with their slots, when initialized).
  std::int64_t capacity_per_shard = 1 << 20;
  std::int64_t num_shards = 1;
  // A new id's row: normal(0, init_stddev), drawn from (seed, id).
  double init_stddev = 0.05;
  std::int64_t seed = 0;
  // Admission: an id becomes a row once looked up in this many steps (1 to 255); until
  // then its lookup is zeros and its gradient is dropped. 1: at once, no counting.
  std::int64_t admit_after = 1;
  // The bytes of each shard's count-min sketch (admit_after > 1): give it several times
  // the distinct ids a shard sees, or ids are admitted early (their counts err upwards).
  std::int64_t admission_counters = std::int64_t{1} << 22;
  // Eviction (either makes a row's optimizer slots restart with it): a row not
  // looked up in this many lookups of its shard is removed (each worker step looks
  // each shard up once: in async training, one global step; 0: never) ...
  std::int64_t steps_to_live = 0;
  // ... and a full shard gives a new id the row least recently looked up, instead of
  // failing the step.
  bool evict_when_full = false;
  // Tiered storage: a directory on each shard's task's local disk (made if missing). A
  // full shard moves the row least recently looked up there instead of dropping it
  // (evict_when_full is implied), and a lookup moves it back: capacity_per_shard is then
  // the rows each shard keeps in memory, and the table is as large as the disk. "": none.
  std::string disk_tier_dir{};
};

// What a hash embedding's lookup does to the table: a training step's (counts the ids,
// makes their rows, marks them used) or an evaluation's (reads the rows there are, zeros
// for the others, and changes nothing).
enum class hash_lookup { train, read_only };

template <floating_type T> class hash_embedding {
public:
  struct shard {
    variable<std::int64_t, 1> keys;
    variable<T, 2> rows;
  };

  hash_embedding(graph& g, const std::string& name, std::int64_t dim, hash_embedding_options o = {})
      : g_(g), name_(name), dim_(dim), o_(o) {
    if (dim < 1 || o.capacity_per_shard < 1 || o.num_shards < 1)
      throw invalid_argument_error("hash_embedding '" + name + "': dim " + std::to_string(dim) +
                                   ", capacity_per_shard " + std::to_string(o.capacity_per_shard) +
                                   " and num_shards " + std::to_string(o.num_shards) +
                                   " must each be 1 or more");
    if (o.admit_after < 1 || o.admit_after > 255)
      throw invalid_argument_error("hash_embedding '" + name + "': admit_after " +
                                   std::to_string(o.admit_after) +
                                   " must be 1 (every id at once) to 255 (one-byte counts)");
    if (o.admit_after > 1 && (o.capacity_per_shard < 2 || o.admission_counters < 4))
      throw invalid_argument_error(
          "hash_embedding '" + name + "': with admit_after " + std::to_string(o.admit_after) +
          " a shard needs a capacity_per_shard of 2 or more (row 0 is the default row; it has " +
          std::to_string(o.capacity_per_shard) + ") and 4 or more admission_counters (it has " +
          std::to_string(o.admission_counters) + ")");
    if (o.steps_to_live < 0)
      throw invalid_argument_error("hash_embedding '" + name + "': steps_to_live " +
                                   std::to_string(o.steps_to_live) +
                                   " must be 0 (never evict by age) or more");
    if (!o.disk_tier_dir.empty())
      o_.evict_when_full = o.evict_when_full = true;
    if ((o.steps_to_live > 0 || o.evict_when_full) &&
        o.capacity_per_shard > std::numeric_limits<std::int32_t>::max())
      throw invalid_argument_error("hash_embedding '" + name +
                                   "': with eviction a shard holds at "
                                   "most 2^31 - 1 rows; capacity_per_shard is " +
                                   std::to_string(o.capacity_per_shard));
    for (std::int64_t p = 0; p < o.num_shards; ++p) {
      const std::string part =
          name + "/part_" + std::to_string(p) + "_of_" + std::to_string(o.num_shards);
      variable<T, 2> rows(g, part + "/rows", shape{o.capacity_per_shard, dim}, zeros_initializer{});
      g.mutable_node(rows.id()).attrs["_row_slots"] = std::string(); // its optimizers' slots
      // What a saver saves the tier and the admission counts by (train/disk_tier_checkpoint.hpp,
      // train/state_checkpoint.hpp).
      if (!o.disk_tier_dir.empty())
        g.mutable_node(rows.id()).attrs["_disk_tier"] = o.disk_tier_dir;
      if (!o.disk_tier_dir.empty() || o.admit_after > 1)
        g.mutable_node(rows.id()).attrs["_admit_after"] = o.admit_after;
      if (o.admit_after > 1)
        g.mutable_node(rows.id()).attrs["_admission_counters"] = o.admission_counters;
      // The keys live where their rows do: made outside the device scope (a
      // device function such as replica_device_setter deals out rows, not
      // keys) and put beside the rows.
      std::optional<variable<std::int64_t, 1>> keys;
      {
        auto no_device = g.device(nullptr);
        keys.emplace(g, part + "/keys", shape{o.capacity_per_shard}, constant_initializer{-1.0},
                     variable_options{.trainable = false});
      }
      for (node_id id :
           {keys->id(), keys->initializer().id(), g.node(keys->initializer().id()).inputs.at(1)}) {
        node_def& n = g.mutable_node(id);
        n.colocation_group = rows.node().colocation();
        n.requested_device = rows.node().requested_device;
      }
      shards_.push_back({*keys, rows});
    }
  }

  const std::string& name() const noexcept { return name_; }
  std::int64_t dim() const noexcept { return dim_; }
  const std::vector<shard>& shards() const noexcept { return shards_; }

  // The rows of ids (non-negative int64, any shape): ids' shape + [dim]. Each
  // shard gets its distinct ids once. In training, ids it has not seen get new rows
  // (with admission, once admitted; zeros until then); read_only (an evaluation),
  // they are zeros, and the table does not change.
  template <expression I>
  output<T, rank_of<I> + 1> lookup(const I& ids, hash_lookup mode = hash_lookup::train) const {
    static_assert(std::is_same_v<value_type_of<I>, std::int64_t>,
                  "loom::hash_embedding::lookup: the ids must be int64");
    auto li = lower(ids);
    graph g = li.graph();
    // Routed as "mod" over an unbounded id space: shard id % n, key id / n.
    const attr_map route{{"num_shards", o_.num_shards},
                         {"strategy", std::string("mod")},
                         {"rows", std::numeric_limits<std::int64_t>::max()},
                         {"_what", "hash embedding '" + name_ + "' (ids must be non-negative)"}};
    return {g, detail::sharded_rows(
                   g, li.id(), route, dim_, "loom::hash_embedding::lookup",
                   [&](std::int64_t p, node_id distinct) {
                     const shard& s = shards_[static_cast<std::size_t>(p)];
                     attr_map attrs{{"init_stddev", o_.init_stddev},
                                    {"seed", o_.seed * 1000003 + p},
                                    {"admit_after", o_.admit_after},
                                    {"admission_counters", o_.admission_counters},
                                    {"steps_to_live", o_.steps_to_live},
                                    {"evict_when_full", o_.evict_when_full}};
                     if (!o_.disk_tier_dir.empty())
                       attrs["disk_tier_dir"] = o_.disk_tier_dir;
                     if (mode == hash_lookup::read_only)
                       return g.add_node("hash_embedding_read",
                                         {s.keys.id(), s.rows.id(), distinct}, std::move(attrs));
                     attrs["_row_slots"] =
                         s.rows.node().template attr_or<std::string>("_row_slots", "");
                     const node_id row_numbers =
                         g.add_node("hash_embedding_rows", {s.keys.id(), s.rows.id(), distinct},
                                    std::move(attrs));
                     const node_id rows = g.add_node("resource_gather", {s.rows.id(), row_numbers});
                     if (o_.admit_after == 1)
                       return rows;
                     return mask_default_row(g, s, rows, row_numbers);
                   })};
  }

  // An estimate of the ids counted and not admitted yet, over every shard (0
  // without admission): linear counting over each shard's sketch.
  output<std::int64_t, 0> waiting() const {
    return sum_over_shards("hash_embedding_count", "waiting");
  }

  // The rows made over every shard since their tasks started: the ids admitted (again,
  // for an id evicted and admitted anew).
  output<std::int64_t, 0> admitted() const {
    return sum_over_shards("hash_embedding_count", "made");
  }

  // The ids evicted over every shard since their tasks started.
  output<std::int64_t, 0> evicted() const {
    return sum_over_shards("hash_embedding_count", "evicted");
  }

  // The count of ids with rows, over every shard (in memory and on disk).
  output<std::int64_t, 0> size() const {
    if (o_.disk_tier_dir.empty())
      return sum_over_shards("hash_embedding_size");
    graph g = g_;
    return {g, g.add_node("add", {sum_over_shards("hash_embedding_size").id(), on_disk().id()})};
  }

  // The rows in the disk tiers of every shard (0 without one).
  output<std::int64_t, 0> on_disk() const {
    return sum_over_shards("hash_embedding_count", "on_disk");
  }

  // Scalar summaries of each shard "<name>/part_<i>_of_<n>/...", in the summaries
  // collection (so the chief's summary hook writes them to its event file): "rows"
  // (ids held in memory), "made" (rows made), "waiting", "evicted", "hit_rate" (the
  // share of looked-up ids that had rows in memory; these four since the shard's task
  // started) and "bytes" (what its capacity allocates: rows, keys and the optimizer
  // slots made so far); with a disk tier, "on_disk" (its rows), "disk_bytes" (its
  // file's size), "spilled" and "promoted" (rows moved out and back in since the task
  // started). Call it after the optimizer made its slots.
  void add_summaries() const {
    graph g = g_;
    for (const shard& s : shards_) {
      const std::string& rows_name = s.rows.node().name;
      const std::string part = rows_name.substr(0, rows_name.size() - std::string("/rows").size());
      auto count = [&](const char* of) {
        return output<std::int64_t, 0>{
            g, g.add_node("hash_embedding_count", {s.keys.id()}, {{"of", std::string(of)}})};
      };
      scalar_summary(part + "/rows",
                     output<std::int64_t, 0>{g, g.add_node("hash_embedding_size", {s.keys.id()})});
      for (const char* of : {"made", "waiting", "evicted"})
        scalar_summary(part + "/" + of, count(of));
      if (!o_.disk_tier_dir.empty())
        for (const char* of : {"on_disk", "disk_bytes", "spilled", "promoted"})
          scalar_summary(part + "/" + of, count(of));
      const node_id hits = g.add_node("cast", {count("hits").id()}, {{"dst", dtype::f64}});
      const node_id lookups = g.add_node("cast", {count("lookups").id()}, {{"dst", dtype::f64}});
      const node_id one = detail::scalar_node(g, 1.0);
      scalar_summary(
          part + "/hit_rate",
          output<double, 0>{g, g.add_node("div", {hits, g.add_node("maximum", {lookups, one})})});
      const auto& rows_shape = s.rows.node().shape;
      const auto slots = static_cast<std::int64_t>(detail::row_slots(s.rows.node()).size());
      const std::int64_t bytes =
          rows_shape[0] * (rows_shape[1] * static_cast<std::int64_t>(sizeof(T)) * (1 + slots) +
                           static_cast<std::int64_t>(sizeof(std::int64_t)));
      scalar_summary(part + "/bytes", output<std::int64_t, 0>{g, detail::scalar_node(g, bytes)});
    }
  }

private:
  // The sum over the shards of a per-shard count (an op of the shard's keys; `of`: what
  // hash_embedding_count counts).
  output<std::int64_t, 0> sum_over_shards(const char* op, const char* of = nullptr) const {
    graph g = g_;
    node_id total = no_node;
    for (const shard& s : shards_) {
      attr_map attrs;
      if (of)
        attrs["of"] = std::string(of);
      const node_id count = g.add_node(op, {s.keys.id()}, std::move(attrs));
      total = total == no_node ? count : g.add_node("add", {total, count});
    }
    return {g, total};
  }

  // The shard's rows with zeros, and so no gradient, for the ids given the default
  // row 0 (admission); on the shard's task, so that the mask never travels.
  static node_id mask_default_row(graph& g, const shard& s, node_id rows, node_id row_numbers) {
    const node_id zero = detail::scalar_node(g, std::int64_t{0});
    const node_id admitted_ids = g.add_node("not_equal", {row_numbers, zero});
    const node_id admitted = g.add_node("cast", {admitted_ids}, {{"dst", dtype_of<T>}});
    const node_id column = g.add_node("expand_dims", {admitted}, {{"axis", std::int64_t{-1}}});
    const node_id masked = g.add_node("mul", {rows, column});
    for (node_id id : {zero, admitted_ids, admitted, column, masked}) {
      node_def& n = g.mutable_node(id);
      n.colocation_group = s.rows.node().colocation();
      n.requested_device = s.rows.node().requested_device;
    }
    return masked;
  }

  graph g_;
  std::string name_;
  std::int64_t dim_;
  hash_embedding_options o_;
  std::vector<shard> shards_;
};

} // namespace loom

// CPU kernels of hash-table embeddings (graph/hash_embedding.hpp): the
// ids -> row index of a shard, kept beside its keys variable and rebuilt from
// the keys whenever their buffer changes (an initializer, a restore), the
// admission's counts of the ids not admitted yet, eviction's order, and the
// disk tier's file.
#pragma once

#include <loom/graph/hash_embedding.hpp>
#include <loom/kernels/cpu/count_min_sketch.hpp>
#include <loom/kernels/cpu/row_file.hpp>
#include <loom/kernels/cpu/sync.hpp> // attached_resource
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace loom::kernels {

// The rows that hold ids in the order eviction takes them, least recently looked
// up first, and each one's last lookup by its shard's clock: a doubly linked list
// threaded through row numbers, so a lookup moves a row to the back and an
// eviction takes the front in O(1), 16 bytes a row.
class row_recency {
public:
  explicit row_recency(std::int64_t capacity)
      : prev_(static_cast<std::size_t>(capacity), none), next_(prev_),
        last_(static_cast<std::size_t>(capacity), 0) {}

  // Row r looked up at `now`: to the back (added if it was not in).
  void touch(std::int64_t r, std::int64_t now) {
    const auto i = static_cast<std::int32_t>(r);
    if (in(i))
      unlink(i);
    prev_[at(i)] = back_;
    next_[at(i)] = none;
    (back_ == none ? front_ : next_[at(back_)]) = i;
    back_ = i;
    last_[at(i)] = now;
  }

  void remove(std::int64_t r) {
    const auto i = static_cast<std::int32_t>(r);
    if (in(i))
      unlink(i);
  }

  // The least recently looked-up row, -1 if none holds an id.
  std::int64_t oldest() const noexcept { return front_; }
  std::int64_t last_lookup(std::int64_t r) const { return last_[static_cast<std::size_t>(r)]; }

private:
  static constexpr std::int32_t none = -1;
  static std::size_t at(std::int32_t i) { return static_cast<std::size_t>(i); }
  bool in(std::int32_t i) const { return prev_[at(i)] != none || front_ == i; }
  void unlink(std::int32_t i) {
    (prev_[at(i)] == none ? front_ : next_[at(prev_[at(i)])]) = next_[at(i)];
    (next_[at(i)] == none ? back_ : prev_[at(next_[at(i)])]) = prev_[at(i)];
    prev_[at(i)] = next_[at(i)] = none;
  }

  std::vector<std::int32_t> prev_, next_;
  std::vector<std::int64_t> last_;
  std::int32_t front_ = none, back_ = none;
};

struct hash_index : resource_base {
  std::mutex mu;
  std::unordered_map<std::int64_t, std::int64_t> row_of;
  // The keys buffer row_of describes, held: while it lives no other buffer
  // can take its address, so a buffer that is not this one means the keys
  // were replaced (an initializer, a restore) and the index is rebuilt.
  // Inserts write into this buffer in place and keep it.
  any_tensor built_from;
  std::int64_t used = 0;               // rows [0, used) have been given out
  std::vector<std::int64_t> free_rows; // rows below used that eviction freed
  // With admission: the counts of ids not admitted yet (made at the first
  // lookup), and how many ids they admitted (for waiting's estimate).
  std::optional<count_min_sketch> counts;
  std::int64_t admitted_by_count = 0;
  // With eviction: the shard's lookups so far (its clock), the rows by recency,
  // and the ids evicted since the process started.
  std::int64_t clock = 0;
  std::optional<row_recency> recency;
  std::int64_t evicted = 0;
  // Since the process started: the ids looked up (a step's distinct ids of this
  // shard), those that had rows in memory, and the rows made.
  std::int64_t lookups = 0, hits = 0, made = 0;
  // With a disk tier: its file (opened at the first lookup), and the rows moved out to
  // it and back in since the process started.
  std::optional<row_file> disk;
  std::int64_t spilled = 0, promoted = 0;
  // With steps_to_live too: the lookups' steps_to_live (a save's export ages the tier by it).
  std::int64_t disk_steps_to_live = 0;
  // While a save reads the table (from hash_embedding_tier_begin to _export): the records
  // of the ids moved back into memory, kept for the save, which may have read the memory
  // tier before they came back.
  bool saving = false;
  std::vector<std::int64_t> kept_ids;
  std::vector<unsigned char> kept_records;
  // Where increments are taken (the rows' row_changes exist): the ids the tier took and
  // those it let go (back into memory, or aged out), each in one map, with the epoch it
  // happened in, as the rows' stamps are: an increment answers those of its epoch or later.
  std::unordered_map<std::int64_t, std::uint32_t> tier_took, tier_let_go;
  // The next rebuild keeps the tier: the keys were patched by an increment, not replaced.
  bool keep_tier_at_rebuild = false;

  void took(std::int64_t id, const row_changes* changed) {
    if (changed) {
      tier_took[id] = changed->epoch;
      tier_let_go.erase(id);
    }
  }
  void let_go(std::int64_t id, const row_changes* changed) {
    if (changed) {
      tier_let_go[id] = changed->epoch;
      tier_took.erase(id);
    }
  }

  // Makes row_of describe `keys` (held under its variable's lock); the first
  // `reserved` rows hold no id (admission's default row). With `evicting`, the
  // rows found count as looked up now, in row order (an index made by lookups that
  // did not evict is rebuilt so).
  void sync(const any_tensor& keys, std::int64_t reserved, bool evicting) {
    if (!built_from.empty() && built_from.shares_buffer_with(keys) && (recency || !evicting))
      return;
    row_of.clear();
    free_rows.clear();
    used = reserved;
    recency.reset();
    // The table was replaced whole (an initializer, a restore), and so is its tier; unless
    // an increment patched the keys, whose tier patch follows.
    if (disk && !keep_tier_at_rebuild)
      disk->clear();
    keep_tier_at_rebuild = false;
    if (evicting)
      recency.emplace(keys.num_elements());
    const std::int64_t* k = keys.data<std::int64_t>();
    for (std::int64_t r = 0, n = keys.num_elements(); r < n; ++r)
      if (k[r] >= 0) {
        row_of.emplace(k[r], r);
        used = std::max(used, r + 1);
        if (recency)
          recency->touch(r, clock);
      }
    for (std::int64_t r = reserved; r < used; ++r)
      if (k[r] < 0)
        free_rows.push_back(r);
    built_from = keys;
  }

  // Frees row r (its id to keys[r] = -1); the id's counts start over.
  void evict(std::int64_t r, std::int64_t* keys) {
    if (counts) {
      counts->forget(keys[r]);
      admitted_by_count = std::max<std::int64_t>(0, admitted_by_count - 1);
    }
    free_row(r, keys);
    ++evicted;
  }

  // Every row on disk not looked up in the disk_steps_to_live lookups up to `now` (> 0):
  // removed as a row in memory would have been (evicted; its counts start over), in time for
  // their number (row_file keeps its rows in the order of their last lookups).
  void age_disk(std::int64_t now, const row_changes* changed) {
    for (std::int64_t id : disk->erase_aged(now - disk_steps_to_live))
      aged_out(id, changed);
  }

  // Frees row r, whose id the disk tier now holds (still admitted).
  void spill(std::int64_t r, std::int64_t* keys) {
    free_row(r, keys);
    ++spilled;
  }

  // A row for a new id: one eviction freed, else the next never used.
  std::int64_t take_row() {
    if (free_rows.empty())
      return used++;
    const std::int64_t r = free_rows.back();
    free_rows.pop_back();
    return r;
  }

  std::int64_t holding() const noexcept { return static_cast<std::int64_t>(row_of.size()); }

private:
  // The bookkeeping of an id the disk tier let go of for its age.
  void aged_out(std::int64_t id, const row_changes* changed) {
    let_go(id, changed);
    if (counts) {
      counts->forget(id);
      admitted_by_count = std::max<std::int64_t>(0, admitted_by_count - 1);
    }
    ++evicted;
  }

  void free_row(std::int64_t r, std::int64_t* keys) {
    row_of.erase(keys[r]);
    keys[r] = -1;
    recency->remove(r);
    free_rows.push_back(r);
  }
};

// A normal(0, stddev) number that depends on (seed, id, k) alone, so a row's
// initial value does not depend on which ids came first.
inline double hashed_normal(std::uint64_t seed, std::uint64_t id, std::uint64_t k) {
  auto mix = [](std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  };
  const std::uint64_t h1 = mix(seed ^ mix(id * 0x100000001b3ULL + k));
  const std::uint64_t h2 = mix(h1);
  const double u1 = (static_cast<double>(h1 >> 11) + 0.5) / 9007199254740992.0;
  const double u2 = static_cast<double>(h2 >> 11) / 9007199254740992.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// The variable node of slot `name` in node n's _row_slots, in n's resource container:
// what resource_access::variable finds it by.
inline node_def row_slot_variable(const node_def& n, const std::string& name) {
  node_def v;
  v.op = "variable";
  v.name = name;
  v.attrs["container"] = n.attr_or<std::string>("resource_container", "");
  return v;
}

// A lookup's attributes, decoded once per plan item.
struct hash_rows_attrs {
  std::string table;
  std::int64_t admit_after, admission_counters, steps_to_live;
  bool evict_when_full;
  std::string disk_tier_dir; // "": none
  std::uint64_t seed;
  double init_stddev;
  // The optimizer slots of the rows (graph/hash_embedding.hpp's _row_slots): each
  // restarts at its initial value in a row that eviction gives to a new id.
  std::vector<std::pair<node_def, double>> slots;

  explicit hash_rows_attrs(const node_def& n)
      : table("hash embedding shard '" + n.attr_or<std::string>("_ref_name_1", "?") + "'"),
        admit_after(n.attr_or<std::int64_t>("admit_after", 1)),
        admission_counters(n.attr_or<std::int64_t>("admission_counters", 1 << 22)),
        steps_to_live(n.attr_or<std::int64_t>("steps_to_live", 0)),
        evict_when_full(n.attr_or<bool>("evict_when_full", false)),
        disk_tier_dir(n.attr_or<std::string>("disk_tier_dir", "")),
        seed(static_cast<std::uint64_t>(n.attr_or<std::int64_t>("seed", 0))),
        init_stddev(n.attr_or<double>("init_stddev", 0.05)) {
    for (const auto& [name, initial] : detail::row_slots(n))
      slots.emplace_back(row_slot_variable(n, name), initial);
  }
  bool evicting() const noexcept { return steps_to_live > 0 || evict_when_full; }
};

// What both lookups do first, under their locks: check the table is initialized, and
// make the index describe its keys.
inline void sync_index(const kernel_context& c, const hash_rows_attrs& a, variable_resource& keys,
                       const variable_resource& rows, hash_index& index) {
  if (!keys.initialized || !rows.initialized)
    throw failed_precondition_error("node " + c.node.describe() + ": " + a.table +
                                    " is not initialized (run its initializers, or "
                                    "global_variables_initializer, first)");
  index.sync(keys.value, a.admit_after > 1 ? 1 : 0, a.evicting());
}

// The shard's disk tier, opened at its first lookup: "<disk_tier_dir>/<rows variable's name,
// '/' as '.'>.rows", its records a row's values and then each slot's (payload_bytes).
inline row_file& disk_tier(const kernel_context& c, const hash_rows_attrs& a, hash_index& index,
                           std::size_t payload_bytes) {
  if (!index.disk) {
    std::error_code failed;
    std::filesystem::create_directories(a.disk_tier_dir, failed);
    if (failed)
      throw failed_precondition_error("node " + c.node.describe() + ": " + a.table +
                                      ": cannot make its disk tier's directory " + a.disk_tier_dir +
                                      " (" + failed.message() + ")");
    std::string file = c.node.attr_or<std::string>("_ref_name_1", "rows");
    std::replace(file.begin(), file.end(), '/', '.');
    index.disk.emplace(a.disk_tier_dir + "/" + file, payload_bytes);
  }
  if (index.disk->payload_bytes() != payload_bytes)
    throw failed_precondition_error(
        "node " + c.node.describe() + ": " + a.table + ": its disk tier's rows hold " +
        std::to_string(index.disk->payload_bytes()) + " bytes each, this lookup's " +
        std::to_string(payload_bytes) + " (an optimizer's slots added after rows moved to disk)");
  return *index.disk;
}

template <class T> struct hash_embedding_rows_cpu {
  static void run(kernel_context& c) {
    const hash_rows_attrs& a = c.decoded<hash_rows_attrs>();
    variable_resource& keys_var = *c.refs[0];
    variable_resource& rows_var = *c.refs[1];
    const any_tensor& ids = c.input(2);
    auto index = attached_resource<hash_index>(c);
    // A row that eviction gives to a new id restarts its slots too.
    std::vector<variable_resource*> slots;
    ordered_locks lock{&keys_var.mu, &rows_var.mu, &index->mu};
    if (a.evicting())
      for (const auto& [slot, initial] : a.slots) {
        slots.push_back(&c.resources.variable(slot));
        lock.add(slots.back()->mu);
      }
    lock.lock();
    sync_index(c, a, keys_var, rows_var, *index);
    const std::int64_t reserved = a.admit_after > 1 ? 1 : 0;
    if (a.admit_after > 1 && keys_var.value.data<std::int64_t>()[0] >= 0)
      throw failed_precondition_error(
          "node " + c.node.describe() + ": " + a.table + " holds id " +
          std::to_string(keys_var.value.data<std::int64_t>()[0]) +
          " in row 0, the default row of admission (admit_after " + std::to_string(a.admit_after) +
          "): it was made or saved without admission, and takes none now");
    if (a.admit_after > 1 && !index->counts)
      index->counts.emplace(a.admission_counters);
    const std::int64_t now = ++index->clock;
    const std::int64_t capacity = keys_var.value.num_elements();
    const std::int64_t width = rows_var.value.shape()[1];
    const std::size_t row_bytes = static_cast<std::size_t>(width) * sizeof(T);
    row_file* disk = a.disk_tier_dir.empty()
                         ? nullptr
                         : &disk_tier(c, a, *index, row_bytes * (1 + slots.size()));
    // Rows on disk age out there as in memory: each lookup first lets go of those aged by now
    // (no I/O; the tier's age order finds them), so an id found on disk below is live.
    if (disk && a.steps_to_live > 0) {
      index->disk_steps_to_live = a.steps_to_live;
      index->age_disk(now, rows_var.changes.get());
    }
    const std::int64_t* id = ids.data<std::int64_t>();
    const std::int64_t n = ids.num_elements();
    any_tensor out(dtype::i64, ids.shape());
    std::int64_t* row_of = out.data<std::int64_t>();
    // The ids with rows get them; the others are -1 here. Room for every id admitted in this
    // step, or moved back in from the disk tier, is counted before anything else changes. The ids
    // are distinct (each shard gets a step's distinct ids), so an id's count after this step
    // is its count now + 1.
    std::vector<char> admit(static_cast<std::size_t>(n), 0);
    std::vector<std::int64_t> from_disk; // positions k of the ids the disk tier holds
    std::int64_t fresh = 0;
    for (std::int64_t k = 0; k < n; ++k) {
      if (id[k] < 0)
        throw invalid_argument_error("node " + c.node.describe() + ": id " + std::to_string(id[k]) +
                                     " of " + a.table + " is negative");
      if (auto it = index->row_of.find(id[k]); it != index->row_of.end()) {
        row_of[k] = it->second;
        continue;
      }
      row_of[k] = -1;
      if (disk && disk->find(id[k])) {
        from_disk.push_back(k);
        admit[static_cast<std::size_t>(k)] = 1;
        ++fresh;
        continue;
      }
      admit[static_cast<std::size_t>(k)] =
          a.admit_after == 1 || index->counts->count(id[k]) + 1 >= a.admit_after;
      fresh += admit[static_cast<std::size_t>(k)];
    }
    const std::int64_t found = n - std::count(row_of, row_of + n, std::int64_t{-1});
    // With eviction, the rows not looked up in this step may go to make room.
    const std::int64_t most = capacity - reserved - (a.evict_when_full ? found : index->holding());
    if (fresh > most)
      throw resource_exhausted_error(
          "node " + c.node.describe() + ": " + a.table + " is full: " +
          std::to_string(index->holding()) + " of " + std::to_string(capacity - reserved) +
          " rows used and " + std::to_string(fresh) + " new ids in this step" +
          (a.evict_when_full ? std::string(", beside ") + std::to_string(found) +
                                   " ids it holds that this step looks up"
                             : std::string()) +
          " (give it a larger capacity_per_shard, or more shards)");
    // The rows coming back from disk, read before anything changes.
    std::vector<unsigned char> back(from_disk.size() * (disk ? disk->payload_bytes() : 0));
    for (std::size_t j = 0; j < from_disk.size(); ++j)
      disk->get(*disk->find(id[from_disk[j]]), back.data() + j * disk->payload_bytes());
    index->lookups += n;
    index->hits += found;
    if (index->recency)
      for (std::int64_t k = 0; k < n; ++k)
        if (row_of[k] >= 0)
          index->recency->touch(row_of[k], now);
    const auto expired = [&] {
      const std::int64_t r = index->recency->oldest();
      return r >= 0 && index->recency->last_lookup(r) <= now - a.steps_to_live;
    };
    // The buffers written (by a new row or an eviction) are owned first, so a value
    // read earlier (a save in progress) keeps what it read; the index keeps the keys it
    // describes.
    if (fresh > 0 || (a.steps_to_live > 0 && expired())) {
      index->built_from = {};
      for (variable_resource* v : {&keys_var, &rows_var})
        if (!v->value.sole_owner())
          v->value = v->value.clone();
      for (variable_resource* v : slots)
        if (v->initialized && !v->value.sole_owner())
          v->value = v->value.clone();
      index->built_from = keys_var.value;
    }
    std::int64_t* keys = keys_var.value.data<std::int64_t>();
    row_changes* changed = rows_var.changes.get(); // an incremental checkpoint's, if any
    T* rows = rows_var.value.data<T>();
    const auto evict_oldest = [&] {
      const std::int64_t r = index->recency->oldest();
      index->evict(r, keys);
      if (changed)
        changed->mark(r);
    };
    // Moves the least recently looked-up row to the disk tier: its record is written
    // first, so a full disk fails the step with the row still in memory.
    std::vector<unsigned char> record(disk ? disk->payload_bytes() : 0);
    const auto spill_oldest = [&] {
      const std::int64_t r = index->recency->oldest();
      std::memcpy(record.data(), rows + r * width, row_bytes);
      for (std::size_t s = 0; s < slots.size(); ++s) {
        T* to = reinterpret_cast<T*>(record.data() + (1 + s) * row_bytes);
        if (slots[s]->initialized)
          std::copy_n(slots[s]->value.data<T>() + r * width, width, to);
        else
          std::fill_n(to, width, static_cast<T>(a.slots[s].second));
      }
      disk->put(keys[r], index->recency->last_lookup(r), record.data());
      index->took(keys[r], changed);
      index->spill(r, keys);
      if (changed)
        changed->mark(r);
    };
    if (a.steps_to_live > 0) // rows not looked up in the last steps_to_live lookups
      while (expired())
        evict_oldest();
    while (a.evict_when_full && capacity - reserved - index->holding() < fresh)
      disk ? spill_oldest() : evict_oldest(); // not looked up now: `most` says so
    // The rows back from disk, with their slots.
    for (std::size_t j = 0; j < from_disk.size(); ++j) {
      const std::int64_t k = from_disk[j];
      const unsigned char* from = back.data() + j * disk->payload_bytes();
      const std::int64_t r = index->take_row();
      index->row_of.emplace(id[k], r);
      keys[r] = id[k];
      std::memcpy(rows + r * width, from, row_bytes);
      for (std::size_t s = 0; s < slots.size(); ++s)
        if (slots[s]->initialized)
          std::memcpy(slots[s]->value.data<T>() + r * width, from + (1 + s) * row_bytes, row_bytes);
      disk->erase(id[k]);
      index->let_go(id[k], changed);
      if (index->saving) {
        index->kept_ids.push_back(id[k]);
        index->kept_records.insert(index->kept_records.end(), from, from + disk->payload_bytes());
      }
      ++index->promoted;
      index->recency->touch(r, now);
      if (changed)
        changed->mark(r);
      row_of[k] = r;
    }
    for (std::int64_t k = 0; k < n; ++k) {
      if (row_of[k] >= 0)
        continue;
      if (a.admit_after > 1) {
        index->counts->add(id[k]);
        if (!admit[static_cast<std::size_t>(k)]) {
          row_of[k] = 0; // the default row: zeros, its gradient masked (lookup)
          continue;
        }
        ++index->admitted_by_count;
      }
      const std::int64_t r = index->take_row();
      ++index->made;
      index->row_of.emplace(id[k], r);
      keys[r] = id[k];
      for (std::int64_t j = 0; j < width; ++j)
        rows[r * width + j] =
            static_cast<T>(a.init_stddev * hashed_normal(a.seed, static_cast<std::uint64_t>(id[k]),
                                                         static_cast<std::uint64_t>(j)));
      for (std::size_t s = 0; s < slots.size(); ++s)
        if (slots[s]->initialized)
          std::fill_n(slots[s]->value.data<T>() + r * width, width,
                      static_cast<T>(a.slots[s].second));
      if (index->recency)
        index->recency->touch(r, now);
      if (changed)
        changed->mark(r);
      row_of[k] = r;
    }
    c.output = std::move(out);
  }
};

// A disk tier's records (each a row, then every slot's: `parts` rows of `width` values of
// `type`), m of them, as `parts` tensors [m, width]: what a snapshot hands out.
inline std::vector<any_tensor> split_records(const unsigned char* records, std::int64_t m,
                                             std::int64_t width, dtype type, std::size_t parts) {
  const std::size_t row_bytes = static_cast<std::size_t>(width) * size_of(type);
  std::vector<any_tensor> out;
  for (std::size_t p = 0; p < parts; ++p) {
    any_tensor part(type, loom::shape{m, width});
    auto* to = static_cast<unsigned char*>(part.raw_data());
    for (std::int64_t k = 0; k < m; ++k)
      std::memcpy(to + static_cast<std::size_t>(k) * row_bytes,
                  records + (static_cast<std::size_t>(k) * parts + p) * row_bytes, row_bytes);
    out.push_back(std::move(part));
  }
  return out;
}

// An evaluation's lookup: the rows of the ids there are (in memory or on disk), zeros for
// the others; it makes, counts, moves and ages nothing (no clock tick, no recency, no
// admission count).
template <class T> struct hash_embedding_read_cpu {
  static void run(kernel_context& c) {
    const hash_rows_attrs& a = c.decoded<hash_rows_attrs>();
    variable_resource& keys_var = *c.refs[0];
    variable_resource& rows_var = *c.refs[1];
    const any_tensor& ids = c.input(2);
    auto index = attached_resource<hash_index>(c);
    ordered_locks lock{&keys_var.mu, &rows_var.mu, &index->mu};
    lock.lock();
    sync_index(c, a, keys_var, rows_var, *index);
    const std::int64_t width = rows_var.value.shape()[1];
    const std::int64_t* id = ids.data<std::int64_t>();
    const std::int64_t n = ids.num_elements();
    std::vector<std::int64_t> dims = ids.shape().dims();
    dims.push_back(width);
    any_tensor out(rows_var.value.type(), loom::shape(std::move(dims)));
    T* to = out.data<T>();
    const T* rows = rows_var.value.data<T>();
    const row_file* disk = index->disk ? &*index->disk : nullptr;
    for (std::int64_t k = 0; k < n; ++k) {
      const auto it = index->row_of.find(id[k]);
      if (it != index->row_of.end()) {
        std::copy_n(rows + it->second * width, width, to + k * width);
      } else if (const row_file::entry* e = disk ? disk->find(id[k]) : nullptr) {
        disk->get(*e, to + k * width, static_cast<std::size_t>(width) * sizeof(T)); // its row
      } else {
        std::fill_n(to + k * width, width, T(0));
      }
    }
    c.output = std::move(out);
  }
};

// What an incremental save takes of a shard: the changed rows' keys, values and slots,
// copied by hash_embedding_changes and handed out by hash_embedding_changed_values.
struct hash_increment : resource_base {
  std::mutex mu;
  std::vector<any_tensor> parts; // keys [n], rows [n, dim], each slot's [n, dim]
  std::vector<bool> given;       // each part is handed out once, then let go
};

// An incremental checkpoint's question (graph/hash_embedding.hpp): under the shard's
// keys, rows and slots locks (every writer of its rows holds the first two), so that a
// row is either in this epoch's answer, its keys, values and slots copied together, or
// stamped with the next one.
template <class T> struct hash_embedding_changes_cpu {
  static void run(kernel_context& c) {
    variable_resource& keys_var = *c.refs[0];
    variable_resource& rows_var = *c.refs[1];
    const std::int64_t since = *c.input(2).data<std::int64_t>();
    const std::int64_t next = *c.input(3).data<std::int64_t>();
    if (next < 1 || next > std::int64_t{UINT32_MAX} || (since >= 0 && next <= since))
      throw invalid_argument_error("node " + c.node.describe() + ": epochs since " +
                                   std::to_string(since) + " and next " + std::to_string(next) +
                                   " (next must be in [1, 2^32) and after since)");
    std::vector<variable_resource*> slots;
    for (const auto& [name, initial] : detail::row_slots(c.node))
      slots.push_back(&c.resources.variable(row_slot_variable(c.node, name)));
    auto snapshot = attached_resource<hash_increment>(c);
    // The shard's index (beside the snapshot), for what its disk tier took and let go.
    auto index = sibling_resource<hash_index>(c, "hash_increment", "hash_index");
    const bool tier = !c.node.attr_or<std::string>("disk_tier_dir", "").empty();
    ordered_locks lock{&keys_var.mu, &rows_var.mu, &snapshot->mu, &index->mu};
    for (variable_resource* v : slots)
      lock.add(v->mu);
    lock.lock();
    std::vector<variable_resource*> sources{&keys_var, &rows_var};
    sources.insert(sources.end(), slots.begin(), slots.end());
    for (const variable_resource* v : sources)
      if (!v->initialized)
        throw failed_precondition_error("node " + c.node.describe() + ": hash embedding shard '" +
                                        c.node.attr_or<std::string>("_ref_name_1", "?") +
                                        "' or one of its slots is not initialized");
    const std::int64_t capacity = rows_var.value.shape()[0];
    std::vector<std::int64_t> rows;
    // The shard can tell what changed since `since` only where it has stamped every
    // write since then: its stamps exist and have been in epoch `since` or later.
    row_changes* changed = rows_var.changes.get();
    if (since >= 0) {
      if (changed == nullptr || changed->epoch < since) {
        rows.resize(static_cast<std::size_t>(capacity));
        for (std::int64_t r = 0; r < capacity; ++r)
          rows[static_cast<std::size_t>(r)] = r;
      } else {
        const auto from = static_cast<std::uint32_t>(since);
        for (std::int64_t r = 0; r < capacity; ++r)
          if (changed->epoch_of[static_cast<std::size_t>(r)] >= from)
            rows.push_back(r);
      }
    }
    if (changed == nullptr) {
      rows_var.changes = std::make_shared<row_changes>(capacity);
      changed = rows_var.changes.get();
    } else if (since < 0) {
      // A full save's or a restore's start: what was written before is in it, so the
      // stamps start over, and a saver whose epochs count from 1 again (a restarted
      // chief) is not answered with rows an earlier one's epochs stamped.
      std::fill(changed->epoch_of.begin(), changed->epoch_of.end(), 0u);
    }
    changed->epoch = static_cast<std::uint32_t>(next);
    const auto n = static_cast<std::int64_t>(rows.size());
    c.output = any_tensor(dtype::i64, loom::shape{n});
    std::copy(rows.begin(), rows.end(), c.output.data<std::int64_t>());
    // The rows' keys, values and slots, copied row by row as bytes (any float dtype).
    snapshot->parts.clear();
    snapshot->given.assign(sources.size(), false);
    for (const variable_resource* v : sources) {
      const any_tensor& from = v->value;
      const std::int64_t width = from.rank() == 1 ? 1 : from.shape()[1];
      const std::size_t row_bytes = static_cast<std::size_t>(width) * size_of(from.type());
      any_tensor part(from.type(), from.rank() == 1 ? loom::shape{n} : loom::shape{n, width});
      auto* to = static_cast<unsigned char*>(part.raw_data());
      const auto* base = static_cast<const unsigned char*>(from.raw_data());
      for (std::int64_t k = 0; k < n; ++k)
        std::memcpy(to + static_cast<std::size_t>(k) * row_bytes,
                    base + static_cast<std::size_t>(rows[static_cast<std::size_t>(k)]) * row_bytes,
                    row_bytes);
      snapshot->parts.push_back(std::move(part));
    }
    // The disk tier's part: the ids it took since `since` and holds, their rows and slots
    // (its records), and the ids it let go; then its sets start over with the epoch.
    // What an earlier epoch did is in a save already (a failed increment asks the same
    // `since` again, so nothing after it goes).
    const auto forget_before = [&](std::unordered_map<std::int64_t, std::uint32_t>& m) {
      for (auto it = m.begin(); it != m.end();)
        it = since < 0 || it->second < static_cast<std::uint32_t>(since) ? m.erase(it)
                                                                         : std::next(it);
    };
    forget_before(index->tier_took);
    forget_before(index->tier_let_go);
    if (tier) {
      std::vector<std::int64_t> took, let_go;
      for (const auto& [id, epoch] : index->tier_let_go)
        let_go.push_back(id);
      std::vector<unsigned char> records;
      const row_file* disk = index->disk ? &*index->disk : nullptr;
      if (disk)
        for (const auto& [id, epoch] : index->tier_took)
          if (const row_file::entry* e = disk->find(id)) {
            records.resize((took.size() + 1) * disk->payload_bytes());
            disk->get(*e, records.data() + took.size() * disk->payload_bytes());
            took.push_back(id);
          }
      const std::int64_t width = rows_var.value.shape()[1];
      const auto m = static_cast<std::int64_t>(took.size());
      auto ids_part = [](const std::vector<std::int64_t>& ids) {
        any_tensor t(dtype::i64, loom::shape{static_cast<std::int64_t>(ids.size())});
        std::copy(ids.begin(), ids.end(), t.data<std::int64_t>());
        return t;
      };
      snapshot->parts.push_back(ids_part(took));
      for (any_tensor& part :
           split_records(records.data(), m, width, rows_var.value.type(), 1 + slots.size()))
        snapshot->parts.push_back(std::move(part));
      snapshot->parts.push_back(ids_part(let_go));
      snapshot->given.assign(snapshot->parts.size(), false);
    }
  }
};

// A part of the snapshot hash_embedding_changes took (its row numbers, an input, order
// this after it), handed out once: the snapshot holds no memory between saves.
template <class T> struct hash_embedding_changed_values_cpu {
  static void run(kernel_context& c) {
    auto snapshot = attached_resource<hash_increment>(c);
    std::lock_guard lock(snapshot->mu);
    const auto part = static_cast<std::size_t>(c.node.attr<std::int64_t>("part"));
    // The parts of the rows given (a disk tier's, after them, have rows of their own).
    const bool of_rows = part < 2 + detail::row_slots(c.node).size();
    if (part >= snapshot->parts.size() || snapshot->given[part] ||
        (of_rows && snapshot->parts[part].shape()[0] != c.input(2).num_elements()))
      throw failed_precondition_error("node " + c.node.describe() +
                                      ": no snapshot of these rows (hash_embedding_changes or "
                                      "hash_embedding_tier_export runs first, in the same step)");
    c.output = std::move(snapshot->parts[part]);
    snapshot->given[part] = true;
    if (std::all_of(snapshot->given.begin(), snapshot->given.end(), [](bool g) { return g; }))
      snapshot->parts.clear();
  }
};

// An increment restored into a shard: its rows and keys written at their row numbers,
// into buffers of the shard's own (so the index, which holds the keys' buffer, is
// rebuilt at the next lookup).
template <class T> struct hash_embedding_patch_cpu {
  static void run(kernel_context& c) {
    variable_resource& keys_var = *c.refs[0];
    variable_resource& rows_var = *c.refs[1];
    const any_tensor& at = c.input(2);
    const any_tensor& keys = c.input(3);
    const any_tensor& values = c.input(4);
    auto index = attached_resource<hash_index>(c);
    ordered_locks lock{&keys_var.mu, &rows_var.mu, &index->mu};
    lock.lock();
    if (!keys_var.initialized || !rows_var.initialized)
      throw failed_precondition_error("node " + c.node.describe() +
                                      ": the shard is not initialized (restore its base first)");
    const std::int64_t capacity = rows_var.value.shape()[0];
    const std::int64_t width = rows_var.value.shape()[1];
    const std::int64_t n = at.num_elements();
    if (at.rank() != 1 || keys.rank() != 1 || keys.num_elements() != n || values.rank() != 2 ||
        values.shape()[0] != n || values.shape()[1] != width)
      throw invalid_argument_error("node " + c.node.describe() + ": row numbers " +
                                   at.shape().to_string() + ", keys " + keys.shape().to_string() +
                                   " and rows " + values.shape().to_string() +
                                   " do not fit a shard of " + rows_var.value.shape().to_string());
    const std::int64_t* row = at.data<std::int64_t>();
    for (std::int64_t k = 0; k < n; ++k)
      if (row[k] < 0 || row[k] >= capacity)
        throw invalid_argument_error("node " + c.node.describe() + ": row " +
                                     std::to_string(row[k]) + " is outside the shard's " +
                                     std::to_string(capacity) + " rows");
    for (variable_resource* v : {&keys_var, &rows_var})
      if (!v->value.sole_owner())
        v->value = v->value.clone();
    // Written in place or not, the keys changed: the index is rebuilt, keeping the disk
    // tier, which the increment's tier patch updates next.
    index->built_from = {};
    index->keep_tier_at_rebuild = true;
    std::int64_t* to_keys = keys_var.value.data<std::int64_t>();
    T* to_rows = rows_var.value.data<T>();
    for (std::int64_t k = 0; k < n; ++k) {
      to_keys[row[k]] = keys.data<std::int64_t>()[k];
      std::copy_n(values.data<T>() + k * width, width, to_rows + row[k] * width);
    }
    rows_var.changes.reset(); // a restore: the saver begins the next epoch after it
    c.output = any_tensor::scalar(n);
  }
};

// A save's start on a shard with a disk tier: the records of ids that move back into
// memory from now on are kept until the save takes the tier (hash_embedding_tier_export).
template <class T> struct hash_embedding_tier_begin_cpu {
  static void run(kernel_context& c) {
    auto index = attached_resource<hash_index>(c);
    std::lock_guard lock(index->mu);
    index->saving = true;
    index->kept_ids.clear();
    index->kept_records.clear();
    c.output = any_tensor::scalar(std::int64_t{0});
  }
};

// A save's copy of a shard's disk tier, after the save read its variables: the ids on disk
// and those kept since hash_embedding_tier_begin (output, int64 [n]), and their keys, rows
// and slots as the parts of a snapshot that hash_embedding_changed_values hands out
// (resource "hash_tier_export"). A row is then in the variables read, or here, or both
// (a restore takes the memory tier's).
template <class T> struct hash_embedding_tier_export_cpu {
  static void run(kernel_context& c) {
    variable_resource& keys_var = *c.refs[0];
    variable_resource& rows_var = *c.refs[1];
    auto index = attached_resource<hash_index>(c);
    // Beside the index, under the name the snapshot's readers attach to.
    auto snapshot = sibling_resource<hash_increment>(c, "hash_index", "hash_tier_export");
    ordered_locks lock{&keys_var.mu, &rows_var.mu, &index->mu, &snapshot->mu};
    lock.lock();
    const std::int64_t width = rows_var.value.shape()[1];
    const std::size_t row_bytes = static_cast<std::size_t>(width) * sizeof(T);
    const std::size_t slots = detail::row_slots(c.node).size();
    const std::size_t record = row_bytes * (1 + slots);
    if (index->disk && index->disk->payload_bytes() != record)
      throw failed_precondition_error("node " + c.node.describe() + ": the disk tier's rows hold " +
                                      std::to_string(index->disk->payload_bytes()) +
                                      " bytes each, the table's " + std::to_string(record));
    // A checkpoint holds no row aged out (as in memory, where each lookup removes them).
    if (index->disk && index->disk_steps_to_live > 0)
      index->age_disk(index->clock, rows_var.changes.get());
    std::vector<std::int64_t> ids;
    std::vector<unsigned char> records;
    if (index->disk) {
      records.resize(static_cast<std::size_t>(index->disk->rows()) * record);
      index->disk->for_each([&](std::int64_t id, const row_file::entry& e) {
        index->disk->get(e, records.data() + ids.size() * record);
        ids.push_back(id);
      });
    }
    for (std::size_t k = 0; k < index->kept_ids.size(); ++k)
      if (!index->disk || !index->disk->find(index->kept_ids[k])) {
        ids.push_back(index->kept_ids[k]);
        records.insert(records.end(),
                       index->kept_records.begin() + static_cast<std::ptrdiff_t>(k * record),
                       index->kept_records.begin() + static_cast<std::ptrdiff_t>((k + 1) * record));
      }
    index->saving = false;
    index->kept_ids.clear();
    index->kept_records.clear();
    const auto n = static_cast<std::int64_t>(ids.size());
    snapshot->parts.clear();
    snapshot->parts.push_back(any_tensor(dtype::i64, loom::shape{n}));
    std::copy(ids.begin(), ids.end(), snapshot->parts[0].data<std::int64_t>());
    for (any_tensor& part :
         split_records(records.data(), n, width, rows_var.value.type(), 1 + slots))
      snapshot->parts.push_back(std::move(part));
    snapshot->given.assign(snapshot->parts.size(), false);
    c.output = snapshot->parts[0].clone();
  }
};

// A restore's disk tier (the ids, and their rows then each slot's, as one [n, (1 + slots) x
// dim] tensor, and ids removed), after the restore wrote the variables: the index is rebuilt
// from the keys restored (a full checkpoint's assigns empty the tier; an increment's patch
// keeps it), the removed ids leave the tier, every id given is written, and the ids the
// memory tier holds leave it. Output: the records written, int64.
template <class T> struct hash_embedding_tier_import_cpu {
  static void run(kernel_context& c) {
    const hash_rows_attrs& a = c.decoded<hash_rows_attrs>();
    variable_resource& keys_var = *c.refs[0];
    variable_resource& rows_var = *c.refs[1];
    const any_tensor& ids = c.input(2);
    const any_tensor& records = c.input(3);
    const any_tensor& removed = c.input(4);
    auto index = attached_resource<hash_index>(c);
    ordered_locks lock{&keys_var.mu, &rows_var.mu, &index->mu};
    lock.lock();
    sync_index(c, a, keys_var, rows_var, *index);
    const std::int64_t width = rows_var.value.shape()[1];
    const std::int64_t n = ids.num_elements();
    const auto per_row = width * static_cast<std::int64_t>(1 + a.slots.size());
    if (ids.rank() != 1 || records.rank() != 2 || records.shape()[0] != n ||
        records.shape()[1] != per_row)
      throw invalid_argument_error(
          "node " + c.node.describe() + ": ids " + ids.shape().to_string() + " and records " +
          records.shape().to_string() + " do not fit " + a.table + " (records of " +
          std::to_string(per_row) + ": its rows, then each of its " +
          std::to_string(a.slots.size()) + " slots')");
    row_file& disk = disk_tier(c, a, *index, static_cast<std::size_t>(per_row) * sizeof(T));
    const std::int64_t* id = ids.data<std::int64_t>();
    for (std::int64_t k = 0; k < n; ++k)
      if (id[k] < 0)
        throw invalid_argument_error("node " + c.node.describe() + ": id " + std::to_string(id[k]) +
                                     " of " + a.table + "'s disk tier is negative");
    for (std::int64_t k = 0, r = removed.num_elements(); k < r; ++k)
      disk.erase(removed.data<std::int64_t>()[k]);
    std::int64_t written = 0;
    for (std::int64_t k = 0; k < n; ++k) {
      if (index->row_of.count(id[k]))
        continue; // the memory tier's row is the save's (it was read with the variables)
      disk.erase(id[k]);
      disk.put(id[k], index->clock, records.data<T>() + k * per_row);
      ++written;
    }
    for (const auto& [held, row] : index->row_of) // an id moved back into memory
      disk.erase(held);
    c.output = any_tensor::scalar(written);
  }
};

// A save's copy of a shard's admission counts, as above.
template <class T> struct hash_embedding_admission_save_cpu {
  static void run(kernel_context& c) {
    auto index = attached_resource<hash_index>(c);
    std::lock_guard lock(index->mu);
    c.output = any_tensor::scalar(
        index->counts ? saved_admission_counts::encode(*index->counts, index->admitted_by_count)
                      : std::string());
  }
};

// A restore's admission counts (input 1, what hash_embedding_admission_save gave), into
// a sketch of the table's admission_counters bytes. Output: int64, the counters restored.
template <class T> struct hash_embedding_admission_restore_cpu {
  static void run(kernel_context& c) {
    const std::string& saved = c.input(1).data<std::string>()[0];
    auto index = attached_resource<hash_index>(c);
    std::lock_guard lock(index->mu);
    index->counts.reset();
    index->admitted_by_count = 0;
    if (saved.empty()) { // saved before the shard counted anything
      c.output = any_tensor::scalar(std::int64_t{0});
      return;
    }
    const std::int64_t bytes =
        count_min_sketch::bytes_for(c.node.attr<std::int64_t>("admission_counters"));
    auto decoded = saved_admission_counts::decode(saved, bytes);
    if (!decoded)
      throw invalid_argument_error(
          "node " + c.node.describe() + ": the admission counts saved are " +
          std::to_string(static_cast<std::int64_t>(saved.size()) - 8) +
          " counters, the table's sketch has " + std::to_string(bytes) +
          " (admission_counters): restore into a table made with the admission_counters it was "
          "saved with");
    index->counts.emplace(std::move(decoded->first));
    index->admitted_by_count = decoded->second;
    c.output = any_tensor::scalar(bytes);
  }
};

template <class T> struct hash_embedding_size_cpu {
  static void run(kernel_context& c) {
    variable_resource& keys_var = *c.refs[0];
    std::lock_guard lock(keys_var.mu);
    std::int64_t count = 0;
    if (keys_var.initialized) {
      const std::int64_t* k = keys_var.value.data<std::int64_t>();
      for (std::int64_t r = 0, n = keys_var.value.num_elements(); r < n; ++r)
        count += k[r] >= 0;
    }
    c.output = any_tensor::scalar(count);
  }
};

// What a shard's index counts (attr "of"; graph/hash_embedding.hpp lists them).
template <class T> struct hash_embedding_count_cpu {
  static void run(kernel_context& c) {
    const std::string& of = c.node.attr<std::string>("of");
    auto index = attached_resource<hash_index>(c);
    std::lock_guard lock(index->mu);
    std::int64_t count = 0;
    if (of == "waiting")
      count = index->counts ? index->counts->waiting(index->admitted_by_count) : 0;
    else if (of == "evicted")
      count = index->evicted;
    else if (of == "made")
      count = index->made;
    else if (of == "lookups")
      count = index->lookups;
    else if (of == "hits")
      count = index->hits;
    else if (of == "on_disk")
      count = index->disk ? index->disk->rows() : 0;
    else if (of == "disk_bytes")
      count = index->disk ? index->disk->bytes() : 0;
    else if (of == "spilled")
      count = index->spilled;
    else if (of == "promoted")
      count = index->promoted;
    c.output = any_tensor::scalar(count);
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_hash_embedding_kernels() {
  register_kernels<hash_embedding_rows_cpu>("hash_embedding_rows", floating_types{});
  register_kernels<hash_embedding_read_cpu>("hash_embedding_read", floating_types{});
  register_kernels<hash_embedding_size_cpu>("hash_embedding_size", type_list<std::int64_t>{});
  register_kernels<hash_embedding_changes_cpu>("hash_embedding_changes", type_list<std::int64_t>{});
  register_kernels<hash_embedding_patch_cpu>("hash_embedding_patch", floating_types{});
  register_kernels<hash_embedding_changed_values_cpu>("hash_embedding_changed_values",
                                                      type_list<std::int64_t, float, double>{});
  register_kernels<hash_embedding_count_cpu>("hash_embedding_count", type_list<std::int64_t>{});
  register_kernels<hash_embedding_tier_begin_cpu>("hash_embedding_tier_begin",
                                                  type_list<std::int64_t>{});
  register_kernels<hash_embedding_tier_export_cpu>("hash_embedding_tier_export", floating_types{});
  register_kernels<hash_embedding_tier_import_cpu>("hash_embedding_tier_import", floating_types{});
  register_kernels<hash_embedding_admission_save_cpu>("hash_embedding_admission_save",
                                                      type_list<std::string>{});
  register_kernels<hash_embedding_admission_restore_cpu>("hash_embedding_admission_restore",
                                                         type_list<std::int64_t>{});
  return true;
}

inline const bool hash_embedding_kernels_registered = register_hash_embedding_kernels();
#endif

} // namespace loom::kernels

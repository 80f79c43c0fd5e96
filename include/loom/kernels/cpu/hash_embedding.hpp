// CPU kernels of hash-table embeddings (graph/hash_embedding.hpp): the
// ids -> row index of a shard, kept beside its keys variable and rebuilt from
// the keys whenever their buffer changes (an initializer, a restore), and the
// admission's counts of the ids not admitted yet.
#pragma once

#include <loom/graph/hash_embedding.hpp>
#include <loom/kernels/cpu/sync.hpp> // attached_resource
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace loom::kernels {

// A count-min sketch of one-byte counters: 4 rows of `width`, an id's count the
// least of its 4 counters. Conservative updates (only the counters at that least
// are raised) keep the error small; it is only ever upwards.
class count_min_sketch {
public:
  static constexpr int depth = 4;

  explicit count_min_sketch(std::int64_t bytes)
      : width_(std::max<std::int64_t>(1, bytes / depth)),
        counters_(static_cast<std::size_t>(width_ * depth), 0) {}

  std::int64_t bytes() const noexcept { return width_ * depth; }

  // The id's count as it stands.
  int count(std::int64_t id) const {
    int least = 255;
    for (int d = 0; d < depth; ++d)
      least = std::min<int>(least, counters_[slot(id, d)]);
    return least;
  }

  // Counts the id once more (up to 255); its count after.
  int add(std::int64_t id) {
    std::array<std::size_t, depth> at{};
    int least = 255;
    for (int d = 0; d < depth; ++d) {
      at[static_cast<std::size_t>(d)] = slot(id, d);
      least = std::min<int>(least, counters_[at[static_cast<std::size_t>(d)]]);
    }
    const int after = std::min(least + 1, 255);
    for (std::size_t k : at)
      counters_[k] = static_cast<std::uint8_t>(std::max<int>(counters_[k], after));
    return after;
  }

  // The distinct ids counted, estimated from the first row's empty counters
  // (linear counting: -width ln(empty / width)); with none empty, at least that of one.
  std::int64_t distinct() const {
    const auto empty = std::count(counters_.begin(), counters_.begin() + width_, 0);
    const double w = static_cast<double>(width_);
    return static_cast<std::int64_t>(
        std::llround(-w * std::log(static_cast<double>(std::max<std::int64_t>(empty, 1)) / w)));
  }

private:
  std::size_t slot(std::int64_t id, int d) const {
    std::uint64_t x =
        static_cast<std::uint64_t>(id) + 0x9e3779b97f4a7c15ULL * static_cast<std::uint64_t>(d + 1);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return static_cast<std::size_t>(d) * static_cast<std::size_t>(width_) +
           static_cast<std::size_t>(x % static_cast<std::uint64_t>(width_));
  }

  std::int64_t width_;
  std::vector<std::uint8_t> counters_;
};

struct hash_index : resource_base {
  std::mutex mu;
  std::unordered_map<std::int64_t, std::int64_t> row_of;
  // The keys buffer row_of describes, held: while it lives no other buffer
  // can take its address, so a buffer that is not this one means the keys
  // were replaced (an initializer, a restore) and the index is rebuilt.
  // Inserts write into this buffer in place and keep it.
  any_tensor built_from;
  std::int64_t used = 0; // rows given out: the next free row
  // With admission: the counts of ids not admitted yet (made at the first
  // lookup), and how many ids they admitted (for waiting's estimate).
  std::optional<count_min_sketch> counts;
  std::int64_t admitted_by_count = 0;

  // Makes row_of describe `keys` (held under its variable's lock); the first
  // `reserved` rows hold no id (admission's default row).
  void sync(const any_tensor& keys, std::int64_t reserved) {
    if (!built_from.empty() && built_from.shares_buffer_with(keys))
      return;
    row_of.clear();
    used = reserved;
    const std::int64_t* k = keys.data<std::int64_t>();
    for (std::int64_t r = 0, n = keys.num_elements(); r < n; ++r)
      if (k[r] >= 0) {
        row_of.emplace(k[r], r);
        used = std::max(used, r + 1);
      }
    built_from = keys;
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

template <class T> struct hash_embedding_rows_cpu {
  static void run(kernel_context& c) {
    variable_resource& keys_var = *c.refs[0];
    variable_resource& rows_var = *c.refs[1];
    const any_tensor& ids = c.input(2);
    auto index = attached_resource<hash_index>(c);
    const std::string table =
        "hash embedding shard '" + c.node.attr_or<std::string>("_ref_name_1", "?") + "'";
    // Lock order: keys, rows, index (only this kernel takes more than one).
    std::scoped_lock lock(keys_var.mu, rows_var.mu, index->mu);
    if (!keys_var.initialized || !rows_var.initialized)
      throw failed_precondition_error("node " + c.node.describe() + ": " + table +
                                      " is not initialized (run its initializers, or "
                                      "global_variables_initializer, first)");
    const auto admit_after = c.node.attr_or<std::int64_t>("admit_after", 1);
    index->sync(keys_var.value, admit_after > 1 ? 1 : 0);
    if (admit_after > 1 && keys_var.value.data<std::int64_t>()[0] >= 0)
      throw failed_precondition_error(
          "node " + c.node.describe() + ": " + table + " holds id " +
          std::to_string(keys_var.value.data<std::int64_t>()[0]) +
          " in row 0, the default row of admission (admit_after " + std::to_string(admit_after) +
          "): it was made or saved without admission, and takes none now");
    if (admit_after > 1 && !index->counts)
      index->counts.emplace(c.node.attr_or<std::int64_t>("admission_counters", 1 << 22));
    const std::int64_t capacity = keys_var.value.num_elements();
    const std::int64_t width = rows_var.value.shape()[1];
    const std::int64_t* id = ids.data<std::int64_t>();
    const std::int64_t n = ids.num_elements();
    // Room for every id admitted in this step, counted before anything changes. The
    // ids are distinct (each shard gets a step's distinct ids), so an id's count
    // after this step is its count now + 1.
    std::vector<char> admit(static_cast<std::size_t>(n), 0);
    std::int64_t fresh = 0;
    for (std::int64_t k = 0; k < n; ++k) {
      if (id[k] < 0)
        throw invalid_argument_error("node " + c.node.describe() + ": id " + std::to_string(id[k]) +
                                     " of " + table + " is negative");
      if (index->row_of.count(id[k]) != 0)
        continue;
      admit[static_cast<std::size_t>(k)] =
          admit_after == 1 || index->counts->count(id[k]) + 1 >= admit_after;
      fresh += admit[static_cast<std::size_t>(k)];
    }
    if (index->used + fresh > capacity)
      throw resource_exhausted_error(
          "node " + c.node.describe() + ": " + table + " is full: " + std::to_string(index->used) +
          " of " + std::to_string(capacity) + " rows used and " + std::to_string(fresh) +
          " new ids in this step (give it a larger "
          "capacity_per_shard, or more shards)");
    const auto seed = static_cast<std::uint64_t>(c.node.attr_or<std::int64_t>("seed", 0));
    const double stddev = c.node.attr_or<double>("init_stddev", 0.05);
    std::int64_t* keys = keys_var.value.data<std::int64_t>();
    T* rows = rows_var.value.data<T>();
    any_tensor out(dtype::i64, ids.shape());
    std::int64_t* row_of = out.data<std::int64_t>();
    for (std::int64_t k = 0; k < n; ++k) {
      if (admit_after > 1 && index->row_of.count(id[k]) == 0) {
        index->counts->add(id[k]);
        if (!admit[static_cast<std::size_t>(k)]) {
          row_of[k] = 0; // the default row: zeros, its gradient masked (lookup)
          continue;
        }
        ++index->admitted_by_count;
      }
      auto [it, inserted] = index->row_of.try_emplace(id[k], index->used);
      if (inserted) {
        const std::int64_t r = index->used++;
        keys[r] = id[k];
        for (std::int64_t j = 0; j < width; ++j)
          rows[r * width + j] =
              static_cast<T>(stddev * hashed_normal(seed, static_cast<std::uint64_t>(id[k]),
                                                    static_cast<std::uint64_t>(j)));
      }
      row_of[k] = it->second;
    }
    c.output = std::move(out);
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

template <class T> struct hash_embedding_waiting_cpu {
  static void run(kernel_context& c) {
    auto index = attached_resource<hash_index>(c);
    std::lock_guard lock(index->mu);
    std::int64_t waiting = 0;
    if (index->counts)
      waiting = std::max<std::int64_t>(0, index->counts->distinct() - index->admitted_by_count);
    c.output = any_tensor::scalar(waiting);
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_hash_embedding_kernels() {
  register_kernels<hash_embedding_rows_cpu>("hash_embedding_rows", floating_types{});
  register_kernels<hash_embedding_size_cpu>("hash_embedding_size", type_list<std::int64_t>{});
  register_kernels<hash_embedding_waiting_cpu>("hash_embedding_waiting", type_list<std::int64_t>{});
  return true;
}

inline const bool hash_embedding_kernels_registered = register_hash_embedding_kernels();
#endif

} // namespace loom::kernels

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
// it. Rows are never evicted.
#pragma once

#include <loom/graph/builder.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/ops/array.hpp>
#include <loom/graph/ops/embedding_lookup.hpp>
#include <loom/graph/ops/sync.hpp> // attach_to_variable
#include <loom/graph/variables.hpp>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace loom::detail {

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_hash_embedding_ops() {
  auto& r = op_registry::instance();
  // Inputs (keys, rows, ids): keys an int64 [capacity] variable, rows a
  // [capacity, dim] variable, ids int64 of any shape. Output: the row of each
  // id, int64 of ids' shape. Attrs: init_stddev, seed.
  r.add({.name = "hash_embedding_rows",
         .num_inputs = 3,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               const node_def& keys = *in[0];
               const node_def& rows = *in[1];
               if (keys.op != "variable" || rows.op != "variable")
                 throw invalid_argument_error("node " + n.describe() +
                                              ": keys and rows must be variables");
               if (keys.type != dtype::i64 || keys.shape.rank() != 1 || rows.shape.rank() != 2 ||
                   keys.shape[0] != rows.shape[0])
                 throw invalid_argument_error(
                     "node " + n.describe() + ": keys " + keys.describe() + " " +
                     keys.shape.to_string() + " and rows " + rows.describe() + " " +
                     rows.shape.to_string() +
                     " must be int64 [capacity] and [capacity, dim] of one capacity");
               if (in[2]->type != dtype::i64)
                 throw invalid_argument_error("node " + n.describe() + ": the ids " +
                                              in[2]->describe() + " must be int64");
               // The index is a resource beside the keys (which sit beside the rows).
               attach_to_variable(n, keys, "hash_index");
               n.attrs["_ref_name_1"] = rows.name;
               n.type = dtype::i64;
               n.shape = in[2]->shape;
             },
         .stateful = true,
         .ref_inputs = 0b011u,
         .type_input = 1});
  // Input (keys): the count of ids a shard holds, int64 scalar.
  r.add({.name = "hash_embedding_size",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               if (in[0]->op != "variable" || in[0]->type != dtype::i64 || in[0]->shape.rank() != 1)
                 throw invalid_argument_error("node " + n.describe() +
                                              ": its input must be a hash embedding's keys");
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
};

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
    for (std::int64_t p = 0; p < o.num_shards; ++p) {
      const std::string part =
          name + "/part_" + std::to_string(p) + "_of_" + std::to_string(o.num_shards);
      variable<T, 2> rows(g, part + "/rows", shape{o.capacity_per_shard, dim}, zeros_initializer{});
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
  // shard gets its distinct ids once; ids it has not seen get new rows.
  template <expression I> output<T, rank_of<I> + 1> lookup(const I& ids) const {
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
                     const node_id row_numbers = g.add_node(
                         "hash_embedding_rows", {s.keys.id(), s.rows.id(), distinct},
                         {{"init_stddev", o_.init_stddev}, {"seed", o_.seed * 1000003 + p}});
                     return g.add_node("resource_gather", {s.rows.id(), row_numbers});
                   })};
  }

  // The count of ids with rows, over every shard.
  output<std::int64_t, 0> size() const {
    graph g = g_;
    node_id total = no_node;
    for (const shard& s : shards_) {
      const node_id count = g.add_node("hash_embedding_size", {s.keys.id()});
      total = total == no_node ? count : g.add_node("add", {total, count});
    }
    return {g, total};
  }

private:
  graph g_;
  std::string name_;
  std::int64_t dim_;
  hash_embedding_options o_;
  std::vector<shard> shards_;
};

} // namespace loom

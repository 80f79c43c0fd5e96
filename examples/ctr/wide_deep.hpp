// The wide & deep click model of examples/ctr (TF's DNNLinearCombinedClassifier
// on Criteo-like features), shared by the example and benchmarks/sparse_step:
//
//   deep: per field an embedding (embedding_lookup for single-hot fields,
//         embedding_lookup_sparse with the mean for multi-hot ones), joined
//         with the dense features, through hidden layers (relu) to one logit;
//   wide: per field a weight per id (an embedding of dimension 1, summed over
//         a multi-hot field's ids) plus a linear term of the dense features;
//   logit = deep + wide, trained on sigmoid cross entropy.
//
// Every table is a partitioned variable (fixed_size_partitioner(shards)), so
// replica_device_setter deals its shards over the ps tasks, and a step sends
// each shard only the distinct ids that live there.
#pragma once

#include "click_data.hpp"

#include <loom/api.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ctr {

struct model_options {
  std::vector<std::int64_t> vocab; // rows of each field's tables
  std::int64_t embedding_dim = 16;
  std::vector<std::int64_t> hidden{256, 128}; // the deep part's hidden layers
  std::int64_t shards = 2;                    // shards of each table
  std::int64_t seed = 1;
  // Hash-table embeddings (loom::hash_embedding) instead of partitioned
  // variables: the ids fed are 62-bit hashes of (field, id), no vocabulary.
  bool hash_tables = false;
  // With hash_tables: an id gets its rows once looked up in this many steps (admission;
  // 1: at once).
  std::int64_t admit_after = 1;
  // With hash_tables: each table's rows per shard at most (0: room for every id of its
  // field), and its eviction (hash_embedding_options).
  std::int64_t max_rows_per_shard = 0;
  std::int64_t steps_to_live = 0;
  bool evict_when_full = false;
  // With hash_tables: a directory on the ps tasks' disks for the rows max_rows_per_shard
  // leaves no room for in memory (tiered storage; "": none).
  std::string disk_tier_dir{};
};

// What the model reads: placeholders fed a batch of examples (feeds()), or the
// tensors an input pipeline's iterator gives each step (click_files.hpp).
struct model_inputs {
  std::vector<loom::output<std::int64_t, 1>> ids; // single-hot fields, [batch] each
  std::vector<loom::sparse_tensor<std::int64_t>> multi_ids;
  loom::output<float, 2> dense; // [batch, num_dense]
  loom::output<float, 2> label; // [batch, 1]
};

inline model_inputs placeholder_inputs(loom::graph& g) {
  std::vector<loom::output<std::int64_t, 1>> ids;
  std::vector<loom::sparse_tensor<std::int64_t>> multi_ids;
  for (int k = 0; k < num_single_hot; ++k)
    ids.push_back(
        loom::placeholder<std::int64_t, 1>(g, loom::shape{-1}, "ids_" + std::to_string(k)));
  for (int k = 0; k < num_multi_hot; ++k)
    multi_ids.push_back(loom::sparse_placeholder<std::int64_t>(
        g, "multi_ids_" + std::to_string(num_single_hot + k)));
  return {std::move(ids), std::move(multi_ids),
          loom::placeholder<float, 2>(g, loom::shape{-1, num_dense}, "dense"),
          loom::placeholder<float, 2>(g, loom::shape{-1, 1}, "label")};
}

struct wide_deep {
  bool hash_tables;
  std::vector<loom::output<std::int64_t, 1>> ids; // single-hot fields, [batch]
  std::vector<loom::sparse_tensor<std::int64_t>> multi_ids;
  loom::output<float, 2> dense;
  loom::output<float, 2> label; // [batch, 1]
  std::vector<loom::partitioned_variable<float, 2>> deep_tables, wide_tables;
  std::vector<loom::hash_embedding<float>> deep_hashed, wide_hashed; // with hash_tables
  // Per field, what the batch looked up: its deep embedding [batch, dim] and its wide weight
  // [batch, 1] (a multi-hot field's combined: the mean, the sum); examples/ctr summarizes them.
  std::vector<loom::output<float, 2>> deep_embedded, wide_embedded;
  std::vector<loom::variable<float, 2>> dnn_kernels; // the deep part's layers, input first
  std::vector<loom::variable<float, 1>> dnn_biases;
  std::optional<loom::variable<float, 2>> dense_weights; // the wide part's dense features
  std::optional<loom::variable<float, 1>> linear_bias;
  // An evaluation's logit: with hash tables over read-only lookups (hash_lookup::read_only),
  // so that evaluating changes no table; otherwise the logit.
  std::optional<loom::output<float, 2>> eval_logit;
  loom::output<float, 2> logit;
  loom::output<float, 2> probability;
  loom::output<float, 0> loss; // the mean over the batch
  loom::output<float, 2> eval_probability;

  wide_deep(loom::graph& g, const model_options& o) : wide_deep(g, o, placeholder_inputs(g)) {}
  wide_deep(loom::graph& g, const model_options& o, model_inputs in)
      : hash_tables(o.hash_tables), ids(std::move(in.ids)), multi_ids(std::move(in.multi_ids)),
        dense(std::move(in.dense)), label(std::move(in.label)), logit(build(g, o)),
        probability(loom::lower(loom::sigmoid(logit))),
        loss(loom::named(loom::reduce_mean(loom::sigmoid_cross_entropy_with_logits(label, logit)),
                         "loss")),
        eval_probability(loom::lower(loom::sigmoid(*eval_logit))) {}

  // The feeds of a batch of examples (the inputs being placeholders or not: a fed node
  // takes the fed value).
  loom::feed_dict feeds(const std::vector<example>& batch) const {
    const auto n = static_cast<std::int64_t>(batch.size());
    loom::feed_dict f;
    for (int k = 0; k < num_single_hot; ++k) {
      loom::tensor<std::int64_t, 1> t(loom::shape{n});
      for (std::int64_t i = 0; i < n; ++i)
        t(i) = fed_id(k, batch[static_cast<std::size_t>(i)].ids[static_cast<std::size_t>(k)]);
      f.emplace_back(ids[static_cast<std::size_t>(k)], t);
    }
    for (int k = 0; k < num_multi_hot; ++k) {
      std::vector<std::int64_t> at, values;
      for (std::int64_t i = 0; i < n; ++i) {
        const auto& list =
            batch[static_cast<std::size_t>(i)].multi_ids[static_cast<std::size_t>(k)];
        for (std::int64_t j = 0; j < max_ids_per_field && list[static_cast<std::size_t>(j)] >= 0;
             ++j) {
          at.push_back(i);
          at.push_back(j);
          values.push_back(fed_id(num_single_hot + k, list[static_cast<std::size_t>(j)]));
        }
      }
      const auto nnz = static_cast<std::int64_t>(values.size());
      const auto& sp = multi_ids[static_cast<std::size_t>(k)];
      f.emplace_back(sp.indices, loom::tensor<std::int64_t, 2>(loom::shape{nnz, 2}, std::move(at)));
      f.emplace_back(sp.values, loom::tensor<std::int64_t, 1>(loom::shape{nnz}, std::move(values)));
      f.emplace_back(sp.dense_shape,
                     loom::tensor<std::int64_t, 1>(loom::shape{2}, {n, max_ids_per_field}));
    }
    loom::tensor<float, 2> d(loom::shape{n, num_dense}), y(loom::shape{n, 1});
    for (std::int64_t i = 0; i < n; ++i) {
      const example& e = batch[static_cast<std::size_t>(i)];
      for (int j = 0; j < num_dense; ++j)
        d(i, j) = e.dense[static_cast<std::size_t>(j)];
      y(i, 0) = e.label;
    }
    f.emplace_back(dense, d);
    f.emplace_back(label, y);
    return f;
  }

  // The id fed for a field's id: itself, or with hash tables a 62-bit hash
  // of (field, id), as a feature hashed without a vocabulary would be.
  std::int64_t fed_id(int field, std::int32_t id) const {
    if (!hash_tables)
      return id;
    return static_cast<std::int64_t>(
        mix(static_cast<std::uint64_t>(field) << 32 ^ static_cast<std::uint32_t>(id)) >> 2);
  }

private:
  loom::output<float, 2> build(loom::graph& g, const model_options& o) {
    if (o.vocab.size() != static_cast<std::size_t>(num_fields))
      throw loom::invalid_argument_error("ctr::wide_deep: " + std::to_string(o.vocab.size()) +
                                         " vocabularies for " + std::to_string(num_fields) +
                                         " fields");
    if (ids.size() != static_cast<std::size_t>(num_single_hot) ||
        multi_ids.size() != static_cast<std::size_t>(num_multi_hot))
      throw loom::invalid_argument_error("ctr::wide_deep: inputs for " +
                                         std::to_string(ids.size()) + " single-hot and " +
                                         std::to_string(multi_ids.size()) + " multi-hot fields");

    std::vector<loom::output<float, 2>> deep_in, wide_in, deep_read, wide_read;
    for (int f = 0; f < num_fields; ++f) {
      const std::int64_t rows = o.vocab[static_cast<std::size_t>(f)];
      const std::string field = "field_" + std::to_string(f);
      if (o.hash_tables) {
        // Room for every id of the field, spread by hash over the shards, or the cap.
        std::int64_t capacity = rows / o.shards + rows / (4 * o.shards) + 64;
        if (o.max_rows_per_shard > 0)
          capacity = std::min(capacity, o.max_rows_per_shard);
        // Admission's counts: 4 counters a row per id the shard may see, 4 KiB to 1 MiB.
        const std::int64_t counters = std::clamp<std::int64_t>(16 * rows / o.shards, 4096, 1 << 20);
        const loom::hash_embedding_options table{.capacity_per_shard = capacity,
                                                 .num_shards = o.shards,
                                                 .admit_after = o.admit_after,
                                                 .admission_counters = counters,
                                                 .steps_to_live = o.steps_to_live,
                                                 .evict_when_full = o.evict_when_full,
                                                 .disk_tier_dir = o.disk_tier_dir};
        auto deep = table;
        deep.init_stddev = 1.0 / std::sqrt(static_cast<double>(o.embedding_dim));
        deep.seed = o.seed * 1000 + 2 * f;
        deep_hashed.emplace_back(g, field + "/embedding", o.embedding_dim, deep);
        auto wide = table;
        wide.init_stddev = 0;
        wide_hashed.emplace_back(g, field + "/wide", 1, wide);
        for (const auto mode : {loom::hash_lookup::train, loom::hash_lookup::read_only}) {
          auto& deep_to = mode == loom::hash_lookup::train ? deep_in : deep_read;
          auto& wide_to = mode == loom::hash_lookup::train ? wide_in : wide_read;
          if (f < num_single_hot) {
            const auto& at = ids[static_cast<std::size_t>(f)];
            deep_to.push_back(deep_hashed.back().lookup(at, mode));
            wide_to.push_back(wide_hashed.back().lookup(at, mode));
          } else {
            const auto& sp = multi_ids[static_cast<std::size_t>(f - num_single_hot)];
            deep_to.push_back(loom::embedding_lookup_sparse(deep_hashed.back(), sp, std::nullopt,
                                                            loom::combiner::mean, mode));
            wide_to.push_back(loom::embedding_lookup_sparse(wide_hashed.back(), sp, std::nullopt,
                                                            loom::combiner::sum, mode));
          }
        }
        continue;
      }
      const loom::fixed_size_partitioner shards{std::min(o.shards, rows)};
      deep_tables.push_back(loom::get_variable<float, 2>(
          g, field + "/embedding", loom::shape{rows, o.embedding_dim},
          loom::truncated_normal_initializer{
              .stddev = 1.0 / std::sqrt(static_cast<double>(o.embedding_dim)),
              .seed = o.seed * 1000 + 2 * f},
          shards));
      wide_tables.push_back(loom::get_variable<float, 2>(g, field + "/wide", loom::shape{rows, 1},
                                                         loom::zeros_initializer{}, shards));
      if (f < num_single_hot) {
        const auto& at = ids[static_cast<std::size_t>(f)];
        deep_in.push_back(loom::embedding_lookup(deep_tables.back(), at));
        wide_in.push_back(loom::embedding_lookup(wide_tables.back(), at));
      } else {
        const auto& sp = multi_ids[static_cast<std::size_t>(f - num_single_hot)];
        deep_in.push_back(loom::embedding_lookup_sparse(deep_tables.back(), sp, std::nullopt,
                                                        loom::combiner::mean));
        wide_in.push_back(loom::embedding_lookup_sparse(wide_tables.back(), sp, std::nullopt,
                                                        loom::combiner::sum));
      }
    }
    deep_embedded = deep_in;
    wide_embedded = wide_in;
    std::int64_t width = static_cast<std::int64_t>(num_fields) * o.embedding_dim + num_dense;
    std::vector<std::int64_t> units = o.hidden;
    units.push_back(1); // the deep part's logit
    for (std::size_t k = 0; k < units.size(); ++k) {
      const std::string name = "dnn/layer_" + std::to_string(k);
      dnn_kernels.emplace_back(g, name + "/kernel", loom::shape{width, units[k]},
                               loom::glorot_uniform_initializer{
                                   .seed = o.seed * 1000 + 100 + static_cast<std::int64_t>(k)});
      dnn_biases.emplace_back(g, name + "/bias", loom::shape{units[k]}, loom::zeros_initializer{});
      width = units[k];
    }
    dense_weights.emplace(g, "linear/dense_weights", loom::shape{num_dense, 1},
                          loom::zeros_initializer{});
    linear_bias.emplace(g, "linear/bias", loom::shape{1}, loom::zeros_initializer{});
    const auto trained = network(deep_in, wide_in, "logit");
    eval_logit = hash_tables ? network(deep_read, wide_read, "eval_logit") : trained;
    return trained;
  }

  // The logit of the looked-up embeddings: the deep part's layers over them and the dense
  // features, plus the wide part's weights.
  loom::output<float, 2> network(std::vector<loom::output<float, 2>> deep_in,
                                 std::vector<loom::output<float, 2>> wide_in,
                                 const std::string& name) const {
    deep_in.push_back(dense);
    loom::output<float, 2> h = loom::concat(deep_in, 1);
    for (std::size_t k = 0; k < dnn_kernels.size(); ++k) {
      const bool relu = k + 1 < dnn_kernels.size();
      h = relu ? loom::lower(loom::relu(loom::xw_plus_b(h, dnn_kernels[k], dnn_biases[k])))
               : loom::lower(loom::xw_plus_b(h, dnn_kernels[k], dnn_biases[k]));
    }
    wide_in.push_back(loom::lower(loom::xw_plus_b(dense, *dense_weights, *linear_bias)));
    // One node for the sum, as TF's linear model has (tf.add_n), and no gradient
    // node for it: a chain of adds would reduce dy to each term's shape.
    return loom::named(h + loom::add_n(wide_in), name);
  }
};

} // namespace ctr

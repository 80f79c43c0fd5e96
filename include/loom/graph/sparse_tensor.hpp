// Sparse tensors and the lookup of multi-hot features (TF's tf.SparseTensor,
// tf.sparse_placeholder and tf.nn.embedding_lookup_sparse): a batch of
// variable-length id lists, as (indices [N, rank], values [N], dense_shape
// [rank]), each row's embeddings combined into one by sum, mean or sqrtn,
// optionally weighted.
#pragma once

#include <loom/graph/hash_embedding.hpp>
#include <loom/graph/ops/array.hpp>
#include <loom/graph/ops/embedding_lookup.hpp>
#include <loom/graph/partitioned_variable.hpp>
#include <loom/graph/variables.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace loom {

// A sparse tensor of rank 2 (a batch of id lists): value k is at
// (indices[k, 0], indices[k, 1]) of a dense_shape[0] x dense_shape[1] tensor.
template <element_type T> struct sparse_tensor {
  output<std::int64_t, 2> indices;
  output<T, 1> values;
  output<std::int64_t, 1> dense_shape;
};

// Three placeholders fed together (tf.sparse_placeholder): "<name>/indices",
// "<name>/values", "<name>/shape".
template <element_type T> sparse_tensor<T> sparse_placeholder(graph& g, const std::string& name) {
  return {placeholder<std::int64_t, 2>(g, shape{-1, 2}, name + "/indices"),
          placeholder<T, 1>(g, shape{-1}, name + "/values"),
          placeholder<std::int64_t, 1>(g, shape{2}, name + "/shape")};
}

// How embedding_lookup_sparse combines a row's embeddings.
enum class combiner { sum, mean, sqrtn };

namespace detail {

// Combines each row's embeddings, looked up by lookup(ids) -> [n, dim].
template <class T, element_type I, class Lookup>
output<T, 2> combine_sparse(const sparse_tensor<I>& sp_ids,
                            const std::optional<sparse_tensor<T>>& sp_weights, combiner how,
                            Lookup lookup) {
  graph g = sp_ids.values.graph();
  const node_id rows_of =
      g.add_node("sparse_segment_ids", {sp_ids.indices.id(), sp_ids.dense_shape.id()},
                 {{"_what", "sparse tensor '" + sp_ids.values.name() + "'"}});
  const output<std::int64_t, 1> segment(g, rows_of);
  const auto batch =
      gather(sp_ids.dense_shape,
             output<std::int64_t, 0>(g, loom::detail::scalar_node(g, std::int64_t{0})));
  const output<T, 2> embedded = lookup(sp_ids.values);
  // The weights: sp_weights' values, or ones.
  const output<T, 1> weights =
      sp_weights ? sp_weights->values : lower(cast<T>(sp_ids.values) * T(0) + T(1));
  const auto column = reshape(weights, {-1, 1});
  const auto summed = unsorted_segment_sum(lower(embedded * column), segment, batch);
  if (how == combiner::sum)
    return summed;
  const auto norm = how == combiner::mean
                        ? unsorted_segment_sum(weights, segment, batch)
                        : lower(sqrt(unsorted_segment_sum(lower(square(weights)), segment, batch)));
  const auto by = reshape(norm, {-1, 1});
  // An empty row: 0, not 0 / 0.
  return lower(where(not_equal(by, T(0)), summed / by, summed * T(0)));
}

} // namespace detail

// For each row of sp_ids, its ids' embeddings combined (TF's
// embedding_lookup_sparse): sum, mean (divided by the weights' sum) or sqrtn
// (by the square root of their squares' sum), each embedding weighted by the
// matching value of sp_weights when given (weights 1 otherwise). A row with
// no ids gives zeros. The lookup is embedding_lookup's (shards, strategy,
// max_norm), so each shard receives its distinct ids once and its gradient
// is sparse. Indices out of the dense shape or out of row-major order fail
// the step naming the sparse tensor.
template <class T, element_type I>
output<T, 2>
embedding_lookup_sparse(const std::vector<output<T, 2>>& params, const sparse_tensor<I>& sp_ids,
                        const std::type_identity_t<std::optional<sparse_tensor<T>>>& sp_weights,
                        combiner how = combiner::mean,
                        partition_strategy strategy = partition_strategy::mod,
                        std::optional<double> max_norm = std::nullopt) {
  static_assert(detail::id_type<I>,
                "loom::embedding_lookup_sparse: the ids must be int32 or int64");
  return detail::combine_sparse<T>(sp_ids, sp_weights, how, [&](const output<I, 1>& ids) {
    return embedding_lookup(params, ids, strategy, max_norm);
  });
}
// The same over a hash-table embedding (its ids are int64; `mode`: hash_embedding::lookup's).
template <class T>
output<T, 2>
embedding_lookup_sparse(const hash_embedding<T>& params, const sparse_tensor<std::int64_t>& sp_ids,
                        const std::type_identity_t<std::optional<sparse_tensor<T>>>& sp_weights,
                        combiner how = combiner::mean, hash_lookup mode = hash_lookup::train) {
  return detail::combine_sparse<T>(
      sp_ids, sp_weights, how,
      [&](const output<std::int64_t, 1>& ids) { return params.lookup(ids, mode); });
}
template <class T, element_type I>
output<T, 2>
embedding_lookup_sparse(const output<T, 2>& params, const sparse_tensor<I>& sp_ids,
                        const std::type_identity_t<std::optional<sparse_tensor<T>>>& sp_weights,
                        combiner how = combiner::mean,
                        partition_strategy strategy = partition_strategy::mod,
                        std::optional<double> max_norm = std::nullopt) {
  return embedding_lookup_sparse(std::vector<output<T, 2>>{params}, sp_ids, sp_weights, how,
                                 strategy, max_norm);
}
template <class T, element_type I>
output<T, 2>
embedding_lookup_sparse(const partitioned_variable<T, 2>& params, const sparse_tensor<I>& sp_ids,
                        const std::type_identity_t<std::optional<sparse_tensor<T>>>& sp_weights,
                        combiner how = combiner::mean,
                        partition_strategy strategy = partition_strategy::mod,
                        std::optional<double> max_norm = std::nullopt) {
  if (params.axis() != 0)
    throw invalid_argument_error("loom::embedding_lookup_sparse: '" + params.name() +
                                 "' is partitioned along axis " + std::to_string(params.axis()) +
                                 "; a lookup needs its rows split (axis 0)");
  return embedding_lookup_sparse(params.parts(), sp_ids, sp_weights, how, strategy, max_norm);
}

} // namespace loom

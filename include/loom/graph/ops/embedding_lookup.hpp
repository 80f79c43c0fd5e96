// The routing of ids over the shards of an embedding, and embedding_lookup over it
// (tf.nn.embedding_lookup): which shard holds a row under TF's partition strategies
// ("mod", "div"), and the ops a lookup over shards is built from (shard_slots,
// shard_unique, gather_shards and its gradient gather_shards_grad), which
// hash_embedding builds on too. Kernels are in kernels/cpu/array.hpp, their argument
// checks in kernels/checks/array.hpp.
#pragma once

#include <loom/graph/op_registry.hpp>
#include <loom/graph/ops/array.hpp>
#include <loom/graph/ops/math.hpp>
#include <loom/graph/output.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom::detail {

// The ids and attrs of a shard_slots or shard_unique node.
inline void check_route(const node_def& n, const node_def& ids) {
  check_ids(n, ids, "ids");
  const std::string strategy = n.attr<std::string>("strategy");
  if (strategy != "mod" && strategy != "div")
    throw invalid_argument_error("node " + n.describe() + ": partition strategy '" + strategy +
                                 "'; expected \"mod\" or \"div\"");
  if (n.attr<std::int64_t>("num_shards") < 1)
    throw invalid_argument_error("node " + n.describe() + ": " +
                                 std::to_string(n.attr<std::int64_t>("num_shards")) + " shards");
}

// Which shard of an embedding of `rows` rows split over `n` shards holds `id`,
// and its row there (TF's partition strategies): "mod", shard id % n and row
// id / n; "div", contiguous ranges, the first rows % n shards one row longer.
struct shard_route {
  std::int64_t shard, row;
};
inline shard_route route_id(std::int64_t id, std::int64_t n, std::int64_t rows, bool div) {
  if (!div)
    return {id % n, id / n};
  const std::int64_t per = rows / n, extras = rows % n, long_part = extras * (per + 1);
  if (id < long_part)
    return {id / (per + 1), id % (per + 1)};
  return {extras + (id - long_part) / per, (id - long_part) % per};
}

// The id that row `row` of shard p holds: route_id's inverse.
inline std::int64_t id_at(std::int64_t p, std::int64_t row, std::int64_t n, std::int64_t rows,
                          bool div) {
  if (!div)
    return row * n + p;
  return p * (rows / n) + std::min(p, rows % n) + row;
}

// The rows shard p holds under each strategy.
inline std::int64_t shard_rows(std::int64_t p, std::int64_t n, std::int64_t rows, bool div) {
  if (div)
    return rows / n + (p < rows % n ? 1 : 0);
  return rows > p ? (rows - p + n - 1) / n : 0;
}

// The rows of `ids` (any shape) spread over route's num_shards shards
// (route: the attrs of shard_slots): each id's slot among its shard's distinct
// rows (one shard_slots), each shard's distinct rows once (shard_unique) as
// rows_at(p, distinct) -> a node of their rows on the shard's task, and one
// gather_shards that puts each id's row back where the id was: ids' shape +
// [width]. The one routing of embedding_lookup over shards and of hash_embedding.
// Few nodes, as they run for every table of a step (a wide model has dozens):
// per field 1 + shards, per table one, and in the gradient one per table and shard
// (gather_shards_grad). Routing as TF does (per shard a partition of the ids, their
// unique values and positions, a gather of the rows; per table a stitch) took four
// per field and shard, shards + 1 per table, and two per table and shard in the
// gradient.
template <class RowsAt>
node_id sharded_rows(graph& g, node_id ids, attr_map route, std::int64_t width,
                     const std::string& who, RowsAt rows_at) {
  const loom::shape ids_shape = g.node(ids).shape;
  const std::int64_t n = std::get<std::int64_t>(route.at("num_shards"));
  node_id flat = ids;
  if (ids_shape.rank() != 1)
    flat = g.add_node("reshape", {flat}, {{"dims", std::vector<std::int64_t>{-1}}});
  std::vector<node_id> inputs{g.add_node("shard_slots", {flat}, route)};
  for (std::int64_t p = 0; p < n; ++p) {
    route["shard"] = p;
    // Each distinct id once to the shard's task.
    inputs.push_back(rows_at(p, g.add_node("shard_unique", {flat, inputs.front()}, route)));
  }
  const node_id rows = g.add_node("gather_shards", inputs, {{"N", n}});
  if (ids_shape.rank() == 1)
    return rows;
  std::vector<std::int64_t> dims = ids_shape.dims();
  for (std::size_t k = 1; k < dims.size(); ++k)
    if (dims[k] < 0)
      throw invalid_argument_error(who + ": ids of shape " + ids_shape.to_string() +
                                   " over shards need every dimension but the first known");
  if (!dims.empty()) // (one id, rank 0: its row alone)
    dims.front() = -1;
  dims.push_back(width);
  return g.add_node("reshape", {rows}, {{"dims", dims}});
}
// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_shard_routing_ops() {
  auto& r = op_registry::instance();

  // shard_slots: input ids (int32/int64, any shape) -> int64, for each id where its
  // row is among the distinct rows of its shard (numbered in the order they first
  // occur), as position * num_shards + shard. An id outside [0, rows) fails the
  // step naming the embedding.
  // shard_unique: inputs (ids, their shard_slots), attr "shard" -> the distinct
  // rows of shard `shard`, in that order (what the shard's gather takes).
  r.add({.name = "shard_slots",
         .num_inputs = 1,
         .infer = [](node_def& n, const std::vector<const node_def*>& in) {
           check_route(n, *in[0]);
           n.type = dtype::i64;
           n.shape = loom::shape{in[0]->shape.fully_defined() ? in[0]->shape.num_elements() : -1};
         }});
  r.add({.name = "shard_unique",
         .num_inputs = 2,
         .infer = [](node_def& n, const std::vector<const node_def*>& in) {
           check_route(n, *in[0]);
           check_ids(n, *in[1], "slots");
           const std::int64_t shard = n.attr<std::int64_t>("shard");
           if (shard < 0 || shard >= n.attr<std::int64_t>("num_shards"))
             throw invalid_argument_error("node " + n.describe() + ": no shard " +
                                          std::to_string(shard) + " among " +
                                          std::to_string(n.attr<std::int64_t>("num_shards")));
           n.type = in[0]->type;
           n.shape = loom::shape{-1};
         }});

  // Inputs (slots, rows_0 ... rows_{N-1}), attr "N": out[k, ...] =
  // rows_{slots[k] % N}[slots[k] / N, ...], the rows of each shard put back
  // where their ids were (shard_slots numbers them). Its gradient with
  // respect to rows_p is gather_shards_grad(dy, slots) of shard p.
  r.add({.name = "gather_shards",
         .num_inputs = -1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               const auto parts = static_cast<std::size_t>(n.attr<std::int64_t>("N"));
               if (parts == 0 || in.size() != parts + 1)
                 throw invalid_argument_error("node " + n.describe() +
                                              ": needs slots and N shards' rows, got " +
                                              std::to_string(in.size()) + " inputs");
               check_ids(n, *in[0], "slots");
               if (in[0]->shape.rank() != 1)
                 throw invalid_argument_error("node " + n.describe() + ": the slots " +
                                              in[0]->describe() + " must be a vector");
               const node_def& first = *in[1];
               if (first.shape.rank() < 1)
                 throw invalid_argument_error("node " + n.describe() + ": rows " +
                                              first.describe() + " must have rank 1 or more");
               std::vector<std::int64_t> d = first.shape.dims();
               d.front() = -1;
               for (std::size_t i = 2; i <= parts; ++i)
                 if (in[i]->type != first.type || !in[i]->shape.compatible_with(loom::shape(d)))
                   throw invalid_argument_error(
                       "node " + n.describe() + ": rows " + in[i]->describe() + " of shape " +
                       in[i]->shape.to_string() + " do not match " + first.describe() +
                       " of shape " + first.shape.to_string());
               d.front() = in[0]->shape[0];
               n.type = first.type;
               n.shape = loom::shape(std::move(d));
             },
         .gradient =
             [](graph& g, const node_def& n, node_id dy) {
               const std::int64_t parts = n.attr<std::int64_t>("N");
               std::vector<node_id> d{no_node};
               for (std::int64_t p = 0; p < parts; ++p)
                 d.push_back(g.add_node("gather_shards_grad", {dy, n.inputs[0]},
                                        {{"N", parts}, {"shard", p}}));
               return d;
             },
         .type_input = 1});
  // Inputs (dy, slots), attrs "N", "shard": the rows of dy whose slots name
  // shard `shard`, summed at their rows there: [rows the slots name] + dy's
  // row shape. (Every row of a shard_unique is named by a slot, so the count
  // is the largest named row's plus one.)
  r.add({.name = "gather_shards_grad",
         .num_inputs = 2,
         .infer = [](node_def& n, const std::vector<const node_def*>& in) {
           check_ids(n, *in[1], "slots");
           if (in[0]->shape.rank() < 1 || in[1]->shape.rank() != 1 ||
               !loom::shape{in[0]->shape[0]}.compatible_with(in[1]->shape))
             throw invalid_argument_error(
                 "node " + n.describe() + ": the adjoint " + in[0]->describe() + " of shape " +
                 in[0]->shape.to_string() + " needs a row per slot of " + in[1]->describe() +
                 " of shape " + in[1]->shape.to_string());
           std::vector<std::int64_t> d = in[0]->shape.dims();
           d.front() = -1;
           n.type = in[0]->type;
           n.shape = loom::shape(std::move(d));
         }});
  return true;
}

inline const bool shard_routing_ops_registered = register_shard_routing_ops();
#endif

} // namespace loom::detail

namespace loom {

// How embedding_lookup splits ids over shards (TF's partition_strategy).
enum class partition_strategy { mod, div };

// The rows of an embedding at ids (tf.nn.embedding_lookup): ids' shape plus
// the embedding's dimension. The embedding is one rank-2 variable or a list
// of shards of it (a partitioned variable), split by `strategy` as TF splits
// them ("mod": row id of shard id % n at id / n; "div": contiguous ranges).
// Each shard's lookup runs on its own task (the gather is colocated with it)
// and gets only the distinct ids that shard holds, each once per step; the
// rows come back and are put in order where the lookup was written. With
// `max_norm`, each row whose L2 norm exceeds it is scaled down to it (TF's
// max_norm). The gradient reaches every shard as rows and indices.
template <class T, expression I>
output<T, rank_of<I> + 1> embedding_lookup(const std::vector<output<T, 2>>& shards, const I& ids,
                                           partition_strategy strategy = partition_strategy::mod,
                                           std::optional<double> max_norm = std::nullopt) {
  static_assert(detail::id_type<value_type_of<I>>,
                "loom::embedding_lookup: the ids must be int32 or int64");
  if (shards.empty())
    throw invalid_argument_error("loom::embedding_lookup: no shards to look ids up in");
  auto li = lower(ids);
  graph g = li.graph();
  const node_def first = shards.front().node();
  const std::string what =
      shards.size() == 1
          ? "'" + first.name + "'"
          : "'" + first.name + "' and its " + std::to_string(shards.size() - 1) + " other shard(s)";
  std::int64_t rows = 0;
  for (const auto& s : shards) {
    if (!(s.graph() == g))
      throw invalid_argument_error("loom::embedding_lookup: the shards and the ids belong to "
                                   "different graphs");
    const loom::shape& sh = s.node().shape;
    if (!sh.fully_defined() || sh[1] != first.shape[1])
      throw invalid_argument_error("loom::embedding_lookup: shard " + s.node().describe() +
                                   " of shape " + sh.to_string() + " does not match " +
                                   first.describe() + " of shape " + first.shape.to_string() +
                                   " (shards differ in rows only)");
    rows += sh[0];
  }
  const auto n = static_cast<std::int64_t>(shards.size());
  const bool div = strategy == partition_strategy::div;
  // The shards of a partitioned variable remember how ids are spread over
  // them, so that a saver can restore them into another number of shards;
  // one variable looked up two ways would mean two tables in one.
  if (n > 1)
    for (const auto& s : shards)
      if (s.node().op == "variable" && s.node().has_attr("_partition_of")) {
        node_def& v = g.mutable_node(s.id());
        const std::string want = div ? "div" : "mod";
        const std::string had = v.attr_or<std::string>("_partition_strategy", want);
        if (had != want)
          throw invalid_argument_error(
              "loom::embedding_lookup: partitioned variable '" +
              v.attr<std::string>("_partition_of") + "' is looked up with the \"" + had +
              "\" strategy elsewhere and with \"" + want + "\" here; one table, one strategy");
        v.attrs["_partition_strategy"] = want;
      }
  for (std::int64_t p = 0; p < n; ++p)
    if (const std::int64_t want = detail::shard_rows(p, n, rows, div);
        shards[static_cast<std::size_t>(p)].node().shape[0] != want)
      throw invalid_argument_error(
          "loom::embedding_lookup: shard " + std::to_string(p) + " " +
          shards[static_cast<std::size_t>(p)].node().describe() + " has " +
          std::to_string(shards[static_cast<std::size_t>(p)].node().shape[0]) +
          " rows, but the \"" + (div ? "div" : "mod") + "\" strategy puts " + std::to_string(want) +
          " of " + std::to_string(rows) +
          " rows in it (save and restore "
          "with the same strategy and shard count)");
  node_id looked_up;
  if (n == 1) {
    looked_up = gather(shards.front(), li).id();
  } else {
    const attr_map route{
        {"num_shards", n},
        {"strategy", std::string(div ? "div" : "mod")},
        {"rows", rows},
        {"_what", "the embedding " + what + " of " + std::to_string(rows) + " rows"}};
    looked_up = detail::sharded_rows(g, li.id(), route, first.shape[1], "loom::embedding_lookup",
                                     [&](std::int64_t p, node_id distinct) {
                                       return g.add_node(
                                           "resource_gather",
                                           {shards[static_cast<std::size_t>(p)].id(), distinct});
                                     });
  }
  output<T, rank_of<I> + 1> out(g, looked_up);
  if (!max_norm)
    return out;
  const T limit = static_cast<T>(*max_norm);
  return lower(out * minimum(T(1), limit / sqrt(reduce_sum(square(out), rank_of<I>, keepdims))));
}
template <class T, expression I>
output<T, rank_of<I> + 1> embedding_lookup(const output<T, 2>& params, const I& ids,
                                           partition_strategy strategy = partition_strategy::mod,
                                           std::optional<double> max_norm = std::nullopt) {
  return embedding_lookup(std::vector<output<T, 2>>{params}, ids, strategy, max_norm);
}

} // namespace loom

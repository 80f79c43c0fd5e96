// Op definitions of the index ops that sparse models are built from (TF's
// array_ops and the segment ops of math_ops): gather, indexed_slices (a sparse
// gradient, dense where it is read), unsorted_segment_sum, unique and
// unique_index, concat and its gradient, dynamic_stitch (the routing of ids over an
// embedding's shards, and embedding_lookup, are graph/ops/embedding_lookup.hpp's).
// Kernels are in kernels/cpu/array.hpp, their argument checks in kernels/checks/array.hpp.
//
// A sparse gradient in the graph: the gradient of gather(params, ids) with
// respect to params is an `indexed_slices` node with inputs (values, indices):
// the rows dy and the ids they belong to. Its value, where something reads it,
// is the dense gradient (the rows summed into zeros of params' shape); what
// understands sparse gradients (the optimizers' sparse applies, the sum of
// gradients) reads its two inputs instead, so the dense tensor is never made
// on the way to a variable (a node nothing reads is never run).
#pragma once

#include <loom/graph/builder.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/ops/math.hpp>
#include <loom/graph/output.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::detail {

inline void check_ids(const node_def& n, const node_def& ids, const char* role) {
  if (ids.type != dtype::i32 && ids.type != dtype::i64)
    throw invalid_argument_error("node " + n.describe() + ": the " + role + " " + ids.describe() +
                                 " must be int32 or int64, not " +
                                 std::string(to_string(ids.type)));
}

// `axis` of a rank-r tensor, negative counting from the end, checked.
inline int normalized_axis(const node_def& n, std::int64_t axis, int rank, const char* what) {
  if (axis < -rank || axis >= rank)
    throw invalid_argument_error("node " + n.describe() + ": axis " + std::to_string(axis) +
                                 " is outside the " + what + "'s rank " + std::to_string(rank));
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

// params[:axis] + ids + params[axis + 1:]: the shape of a gather, and of the
// values of an indexed_slices.
inline loom::shape gathered_shape(const loom::shape& params, const loom::shape& ids, int axis) {
  std::vector<std::int64_t> d(params.dims().begin(), params.dims().begin() + axis);
  d.insert(d.end(), ids.dims().begin(), ids.dims().end());
  d.insert(d.end(), params.dims().begin() + axis + 1, params.dims().end());
  return loom::shape(std::move(d));
}

// The number of segments of an unsorted_segment_sum when its input is a
// constant, else -1 (known when the step runs).
inline std::int64_t constant_count(const node_def& count) {
  if (count.op != "constant")
    return -1;
  const auto& v = count.attr<any_tensor>("value");
  return v.type() == dtype::i32 ? *v.data<std::int32_t>() : *v.data<std::int64_t>();
}

// The gradient of a gather along `axis` from `params`, as an indexed_slices
// of dy at ids: its dense shape is params' static shape, or, where that is
// not fully known (rows gathered in the step), params' shape when it runs.
inline node_id gather_gradient(graph& g, node_id dy, node_id ids, node_id params,
                               std::int64_t axis) {
  const loom::shape& s = g.node(params).shape;
  if (s.fully_defined())
    return g.add_node("indexed_slices", {dy, ids}, {{"axis", axis}, {"dense_shape", s.dims()}});
  return g.add_node("indexed_slices", {dy, ids, params}, {{"axis", axis}});
}

// The (values, indices) of a gradient of rows: an indexed_slices along axis
// 0 with a static dense shape, what the sparse applies and accumulators take.
// nullopt for any other gradient.
struct row_slices {
  node_id values, indices;
};
inline std::optional<row_slices> as_row_slices(const node_def& grad) {
  if (grad.op != "indexed_slices" || grad.inputs.size() != 2 ||
      grad.attr<std::int64_t>("axis") != 0)
    return std::nullopt;
  return row_slices{grad.inputs[0], grad.inputs[1]};
}

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_array_ops() {
  auto& r = op_registry::instance();

  // Inputs (params, ids); attrs "axis" (default 0), "drop_negative" (a
  // negative id gives a row of zeros instead of an error: the gradient of
  // unsorted_segment_sum, which drops negative segments as TF's does).
  // resource_gather is the gather from a variable (TF's ResourceGather): it
  // reads the rows through its reference, under the variable's lock, on the
  // variable's task, so a step sends the ids there and receives the rows, and
  // no copy of the whole variable is ever held by a step.
  for (const char* name : {"gather", "resource_gather"}) {
    const bool of_variable = std::string(name) == "resource_gather";
    r.add({.name = name,
           .num_inputs = 2,
           .infer =
               [of_variable](node_def& n, const std::vector<const node_def*>& in) {
                 const node_def& params = *in[0];
                 if (of_variable && params.op != "variable")
                   throw invalid_argument_error("node " + n.describe() + ": params " +
                                                params.describe() + " is not a variable");
                 check_ids(n, *in[1], "ids");
                 if (params.shape.rank() < 1)
                   throw invalid_argument_error("node " + n.describe() + ": params " +
                                                params.describe() + " must have rank 1 or more");
                 const int axis = normalized_axis(n, n.attr_or<std::int64_t>("axis", 0),
                                                  params.shape.rank(), "params");
                 n.attrs["axis"] = std::int64_t{axis};
                 n.attrs["_params_name"] =
                     of_variable ? "variable '" + params.name + "'" : params.describe();
                 n.type = params.type;
                 n.shape = gathered_shape(params.shape, in[1]->shape, axis);
                 if (of_variable)
                   n.colocation_group = params.colocation();
               },
           .gradient =
               [](graph& g, const node_def& n, node_id dy) {
                 return std::vector{
                     gather_gradient(g, dy, n.inputs[1], n.inputs[0], n.attr<std::int64_t>("axis")),
                     no_node};
               },
           .ref_inputs = of_variable ? 1u : 0u,
           .read_refs = of_variable ? 1u : 0u});
  }

  // Inputs (values, indices[, like]); attrs "axis", "dense_shape" (without
  // `like`: its dense shape is like's when the step runs). Its value: zeros
  // of the dense shape with values[..., i, ...] added at index indices[i]
  // along axis (duplicates summed).
  r.add({.name = "indexed_slices",
         .num_inputs = -1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               if (in.size() != 2 && in.size() != 3)
                 throw invalid_argument_error("node " + n.describe() +
                                              ": takes values, indices and optionally a tensor "
                                              "of the dense shape");
               check_ids(n, *in[1], "indices");
               const loom::shape dense =
                   in.size() == 3 ? in[2]->shape
                                  : loom::shape(n.attr<std::vector<std::int64_t>>("dense_shape"));
               const int axis =
                   normalized_axis(n, n.attr<std::int64_t>("axis"), dense.rank(), "dense shape");
               const loom::shape want = gathered_shape(dense, in[1]->shape, axis);
               if (!in[0]->shape.compatible_with(want))
                 throw invalid_argument_error(
                     "node " + n.describe() + ": values " + in[0]->describe() + " of shape " +
                     in[0]->shape.to_string() + " do not match indices of shape " +
                     in[1]->shape.to_string() + " into " + dense.to_string() + " (expected " +
                     want.to_string() + ")");
               n.type = in[0]->type;
               n.shape = dense;
             },
         .gradient =
             [](graph& g, const node_def& n, node_id dy) {
               std::vector<node_id> d{g.add_node("gather", {dy, n.inputs[1]},
                                                 {{"axis", n.attr<std::int64_t>("axis")}}),
                                      no_node};
               if (n.inputs.size() == 3)
                 d.push_back(no_node);
               return d;
             }});

  // Inputs (data, segment_ids, num_segments): out[s, ...] = the sum of the
  // data[i..., ...] whose segment_ids[i...] is s; a negative id is dropped
  // (TF's semantics).
  r.add({.name = "unsorted_segment_sum",
         .num_inputs = 3,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               const node_def& data = *in[0];
               const node_def& ids = *in[1];
               check_ids(n, ids, "segment ids");
               check_ids(n, *in[2], "number of segments");
               if (in[2]->shape.rank() != 0)
                 throw invalid_argument_error("node " + n.describe() + ": the number of segments " +
                                              in[2]->describe() + " must be a scalar");
               const int k = ids.shape.rank();
               std::vector<std::int64_t> lead;
               if (data.shape.rank() >= k)
                 lead.assign(data.shape.dims().begin(), data.shape.dims().begin() + k);
               if (data.shape.rank() < k || !loom::shape(lead).compatible_with(ids.shape))
                 throw invalid_argument_error(
                     "node " + n.describe() + ": data of shape " + data.shape.to_string() +
                     " must begin with the segment ids' shape " + ids.shape.to_string());
               std::vector<std::int64_t> d{constant_count(*in[2])};
               d.insert(d.end(), data.shape.dims().begin() + k, data.shape.dims().end());
               n.type = data.type;
               n.shape = loom::shape(std::move(d));
             },
         .gradient =
             [](graph& g, const node_def& n, node_id dy) {
               return std::vector{g.add_node("gather", {dy, n.inputs[1]},
                                             {{"axis", std::int64_t{0}}, {"drop_negative", true}}),
                                  no_node, no_node};
             },
         .type_input = 0});

  // Input x (a vector of ids): unique -> its distinct values in the order they
  // first occur; unique_index -> int32, for each element of x the position of
  // its value in unique(x) (TF's tf.unique returns both).
  for (const bool index : {false, true})
    r.add({.name = index ? "unique_index" : "unique",
           .num_inputs = 1,
           .infer = [index](node_def& n, const std::vector<const node_def*>& in) {
             check_ids(n, *in[0], "input");
             if (in[0]->shape.rank() != 1)
               throw invalid_argument_error("node " + n.describe() + ": the input " +
                                            in[0]->describe() + " must be a vector, got shape " +
                                            in[0]->shape.to_string());
             n.type = index ? dtype::i32 : in[0]->type;
             n.shape = index ? in[0]->shape : loom::shape{-1};
           }});

  // Inputs x_0 ... x_k, attr "axis": joined along axis.
  r.add({.name = "concat",
         .num_inputs = -1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               if (in.empty())
                 throw invalid_argument_error("node " + n.describe() + ": concat needs an input");
               const node_def& first = *in[0];
               if (first.shape.rank() < 1)
                 throw invalid_argument_error("node " + n.describe() + ": " + first.describe() +
                                              " is a scalar; concat joins tensors of rank 1 or "
                                              "more");
               const int axis = normalized_axis(n, n.attr_or<std::int64_t>("axis", 0),
                                                first.shape.rank(), "inputs");
               n.attrs["axis"] = std::int64_t{axis};
               std::vector<std::int64_t> d = first.shape.dims();
               for (std::size_t i = 1; i < in.size(); ++i) {
                 const node_def& x = *in[i];
                 bool fits = x.type == first.type && x.shape.rank() == first.shape.rank();
                 for (int a = 0; fits && a < first.shape.rank(); ++a) {
                   const auto ua = static_cast<std::size_t>(a);
                   if (a == axis)
                     d[ua] = d[ua] < 0 || x.shape[a] < 0 ? -1 : d[ua] + x.shape[a];
                   else if (d[ua] < 0)
                     d[ua] = x.shape[a];
                   else if (x.shape[a] >= 0 && x.shape[a] != d[ua])
                     fits = false;
                 }
                 if (!fits)
                   throw invalid_argument_error(
                       "node " + n.describe() + ": " + x.describe() + " (" +
                       std::string(to_string(x.type)) + ", shape " + x.shape.to_string() +
                       ") cannot be joined with " + first.describe() + " (" +
                       std::string(to_string(first.type)) + ", shape " + first.shape.to_string() +
                       ") along axis " + std::to_string(axis));
               }
               n.type = first.type;
               n.shape = loom::shape(std::move(d));
             },
         .gradient =
             [](graph& g, const node_def& n, node_id dy) {
               std::vector<node_id> dxs;
               std::vector<node_id> inputs{dy};
               inputs.insert(inputs.end(), n.inputs.begin(), n.inputs.end());
               for (std::size_t k = 0; k < n.inputs.size(); ++k)
                 dxs.push_back(g.add_node("concat_grad", inputs,
                                          {{"axis", n.attr<std::int64_t>("axis")},
                                           {"index", static_cast<std::int64_t>(k)}}));
               return dxs;
             }});
  // Inputs (dy, x_0 ... x_k), attrs "axis", "index": the part of dy that
  // concat took from x_index.
  r.add({.name = "concat_grad",
         .num_inputs = -1,
         .infer = [](node_def& n, const std::vector<const node_def*>& in) {
           const auto index = static_cast<std::size_t>(n.attr<std::int64_t>("index"));
           n.type = in[0]->type;
           n.shape = in.at(index + 1)->shape;
         }});

  // The routing of ids over an embedding's shards. Attrs "num_shards", "strategy"
  // ("mod" or "div"), "rows" (of the whole embedding), "_what" (for errors).
  // Inputs (indices [N, rank] int64, dense_shape [rank] int64): indices[:, 0],
  // the row of each value of a sparse tensor, once the indices are checked to
  // lie inside the dense shape and to be in row-major order without repeats
  // (what TF's sparse ops assume; tf.sparse.reorder sorts them).
  r.add({.name = "sparse_segment_ids",
         .num_inputs = 2,
         .infer = [](node_def& n, const std::vector<const node_def*>& in) {
           if (in[0]->type != dtype::i64 || in[0]->shape.rank() != 2)
             throw invalid_argument_error("node " + n.describe() + ": the indices " +
                                          in[0]->describe() + " must be an int64 matrix");
           if (in[1]->type != dtype::i64 || in[1]->shape.rank() != 1)
             throw invalid_argument_error("node " + n.describe() + ": the dense shape " +
                                          in[1]->describe() + " must be an int64 vector");
           n.type = dtype::i64;
           n.shape = loom::shape{in[0]->shape[0]};
         }});

  // Inputs (data_0 ... data_{N-1}, indices_0 ... indices_{N-1}), attr "N":
  // merged[indices_i[j], ...] = data_i[j, ...] (TF's dynamic_stitch, with the
  // data first so that they select the kernel's dtype).
  r.add({.name = "dynamic_stitch",
         .num_inputs = -1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               const auto parts = static_cast<std::size_t>(n.attr<std::int64_t>("N"));
               if (parts == 0 || in.size() != 2 * parts)
                 throw invalid_argument_error("node " + n.describe() + ": needs N data and N " +
                                              "index inputs, got " + std::to_string(in.size()));
               const node_def& first = *in[0];
               for (std::size_t i = 0; i < parts; ++i) {
                 check_ids(n, *in[parts + i], "indices");
                 if (in[i]->type != first.type || in[i]->shape.rank() != first.shape.rank())
                   throw invalid_argument_error("node " + n.describe() + ": data " +
                                                in[i]->describe() + " does not match " +
                                                first.describe());
               }
               std::vector<std::int64_t> d = first.shape.dims();
               d.front() = -1;
               n.type = first.type;
               n.shape = loom::shape(std::move(d));
             },
         .gradient =
             [](graph& g, const node_def& n, node_id dy) {
               const auto parts = static_cast<std::size_t>(n.attr<std::int64_t>("N"));
               std::vector<node_id> d(2 * parts, no_node);
               for (std::size_t i = 0; i < parts; ++i)
                 d[i] = g.add_node("gather", {dy, n.inputs[parts + i]});
               return d;
             }});
  return true;
}

inline const bool array_ops_registered = register_array_ops();
#endif

} // namespace loom::detail

namespace loom {

namespace detail {
template <class T>
inline constexpr bool id_type = std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>;
} // namespace detail

// The slices of params at ids along axis (tf.gather): params[:axis] + ids'
// shape + params[axis + 1:]. An id outside [0, params.shape[axis]) fails the
// step naming params and the id. Its gradient with respect to params is
// sparse (an indexed_slices). Where params is a variable, it runs on the
// variable's task.
template <expression P, expression I>
output<value_type_of<P>, rank_of<P> + rank_of<I> - 1> gather(const P& params, const I& ids,
                                                             int axis = 0) {
  static_assert(rank_of<P> >= 1, "loom::gather: params must have rank 1 or more");
  static_assert(detail::id_type<value_type_of<I>>, "loom::gather: the ids must be int32 or int64");
  auto lp = lower(params);
  auto li = lower(ids);
  graph g = detail::common_graph("gather", lp, li);
  const char* op = g.node(lp.id()).op == "variable" ? "resource_gather" : "gather";
  return {g, g.add_node(op, {lp.id(), li.id()}, {{"axis", std::int64_t{axis}}})};
}

// out[s, ...] = the sum of data[i..., ...] over the i whose segment id is s,
// for s in [0, num_segments) (tf.math.unsorted_segment_sum); a negative id is
// dropped, one of num_segments or more fails the step. num_segments is a
// number or a scalar int32/int64 expression (a batch size known when the step
// runs).
template <expression D, expression I, class N>
output<value_type_of<D>, rank_of<D> - rank_of<I> + 1>
unsorted_segment_sum(const D& data, const I& segment_ids, const N& num_segments) {
  static_assert(rank_of<D> >= rank_of<I>,
                "loom::unsorted_segment_sum: data must begin with the segment ids' shape");
  static_assert(detail::id_type<value_type_of<I>>,
                "loom::unsorted_segment_sum: the segment ids must be int32 or int64");
  auto ld = lower(data);
  auto li = lower(segment_ids);
  graph g = detail::common_graph("unsorted_segment_sum", ld, li);
  node_id count;
  if constexpr (std::is_integral_v<N>) {
    count = detail::scalar_node(g, static_cast<std::int64_t>(num_segments));
  } else {
    static_assert(expression<N> && rank_of<N> == 0 && detail::id_type<value_type_of<N>>,
                  "loom::unsorted_segment_sum: num_segments must be a number or a scalar int32 "
                  "or int64 expression");
    count = lower(num_segments).id();
  }
  return {g, g.add_node("unsorted_segment_sum", {ld.id(), li.id(), count})};
}

// The distinct values of a vector of ids in the order they first occur, and
// for each id its position among them (tf.unique): ids == gather(values, index).
template <expression X>
std::pair<output<value_type_of<X>, 1>, output<std::int32_t, 1>> unique(const X& ids) {
  static_assert(rank_of<X> == 1, "loom::unique: the ids must be a vector");
  static_assert(detail::id_type<value_type_of<X>>, "loom::unique: the ids must be int32 or int64");
  auto lx = lower(ids);
  graph g = lx.graph();
  return {{g, g.add_node("unique", {lx.id()})}, {g, g.add_node("unique_index", {lx.id()})}};
}

// The tensors joined along axis (tf.concat); every other dimension must agree.
template <class T, int R> output<T, R> concat(const std::vector<output<T, R>>& values, int axis) {
  static_assert(R >= 1, "loom::concat: joins tensors of rank 1 or more");
  if (values.empty())
    throw invalid_argument_error("loom::concat: no tensors to join");
  graph g = values.front().graph();
  std::vector<node_id> ids;
  for (const auto& v : values) {
    if (!(v.graph() == g))
      throw invalid_argument_error("loom::concat: the tensors belong to different graphs");
    ids.push_back(v.id());
  }
  return {g, g.add_node("concat", std::move(ids), {{"axis", std::int64_t{axis}}})};
}

} // namespace loom

// Summary ops (TF's tf.summary.scalar / histogram / merge / merge_all): each
// outputs a serialized Summary proto (core/summary_format.hpp) in a string
// scalar, which a summary_writer (train/summary_writer.hpp) writes to a
// TensorBoard event file. Kernels are in kernels/cpu/summary.hpp.
//
// The kernels are CPU-only, as TF's: a summary is a few bytes of protobuf made
// once every many steps, and its bytes go to a file on the host; a GPU kernel
// would copy the values to the host anyway. A summary of a value computed on
// a GPU receives it as any CPU consumer does. Under a GPU device scope a
// summary op needs allow_soft_placement (as in TF), which puts it on the CPU.
#pragma once

#include <loom/core/dtype.hpp>
#include <loom/core/error.hpp>
#include <loom/graph/builder.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/output.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace loom {

namespace collection {
// TF's GraphKeys.SUMMARIES: every summary op, for merge_all_summaries.
inline constexpr std::string_view summaries = "summaries";
} // namespace collection

} // namespace loom

namespace loom::detail {

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_summary_ops() {
  auto& r = op_registry::instance();
  const auto fail = [](const node_def& n, const std::string& why) {
    return invalid_argument_error("node " + n.describe() + ": " + why);
  };
  const auto check_numeric = [fail](const node_def& n, const node_def& in) {
    if (in.type != dtype::f32 && in.type != dtype::f64 && in.type != dtype::i32 &&
        in.type != dtype::i64)
      throw fail(n, "summarizes numbers (float, double, int32, int64), not " +
                        std::string(to_string(in.type)) + " " + in.describe());
    if (n.attr<std::string>("tag").empty())
      throw fail(n, "a summary's tag must not be empty");
  };
  // Input: a numeric scalar; attr tag. Output: a Summary with one
  // simple_value (a float, as TF's: its dtype is float whatever the input's).
  r.add({.name = "scalar_summary",
         .num_inputs = 1,
         .infer = [=](node_def& n, const std::vector<const node_def*>& in) {
           check_numeric(n, *in[0]);
           if (in[0]->shape.rank() != 0)
             throw fail(n, "scalar_summary logs a scalar, but " + in[0]->describe() + " is " +
                               in[0]->shape.to_string() +
                               "; reduce it first (reduce_mean) or use histogram_summary");
           n.type = dtype::string;
           n.shape = loom::shape{};
         }});
  // Input: numbers of any shape; attr tag. Output: a Summary with one
  // HistogramProto over TF's default buckets.
  r.add({.name = "histogram_summary",
         .num_inputs = 1,
         .infer = [=](node_def& n, const std::vector<const node_def*>& in) {
           check_numeric(n, *in[0]);
           n.type = dtype::string;
           n.shape = loom::shape{};
         }});
  // Inputs: one or more serialized Summaries (string scalars). Output: their
  // values in one Summary; a tag seen twice fails the step, as TF's
  // MergeSummary.
  r.add({.name = "merge_summary",
         .num_inputs = -1,
         .infer =
             [=](node_def& n, const std::vector<const node_def*>& in) {
               if (in.empty())
                 throw fail(n, "merges one summary or more, got none");
               for (const node_def* i : in)
                 if (i->type != dtype::string || i->shape.rank() != 0)
                   throw fail(n, "merges serialized summaries (string scalars), not " +
                                     std::string(to_string(i->type)) + i->shape.to_string() + " " +
                                     i->describe());
               n.type = dtype::string;
               n.shape = loom::shape{};
             },
         .type_input = -1});
  return true;
}

inline const bool summary_ops_registered = register_summary_ops();
#endif

// The tag a summary named `name` gets: the name under the current name scope.
// Not made unique, unlike a node's name: the tag is what TensorBoard shows, and
// "loss" beside a loss node itself named "loss" should stay "loss" (a tag used
// twice fails merge_summary, naming it).
inline std::string summary_tag(const graph& g, const std::string& name) {
  const std::string scope = g.current_name_scope();
  return scope.empty() ? name : scope + "/" + name;
}

template <class E>
output<std::string, 0> add_summary_node(const char* op, const std::string& name, const E& value) {
  auto v = lower(value);
  graph g = v.graph();
  const node_id id = g.add_node(op, {v.id()}, {{"tag", summary_tag(g, name)}}, name);
  g.add_to_collection(collection::summaries, id);
  return {g, id};
}

} // namespace loom::detail

namespace loom {

// A summary of one number per step (tf.summary.scalar): its tag is `name` under
// the current name scope; written as a float, as TF's.
template <expression E>
output<std::string, 0> scalar_summary(const std::string& name, const E& value) {
  static_assert(numeric_type<value_type_of<E>>,
                "loom::scalar_summary: summarizes numbers (float, double, int32, int64)");
  static_assert(rank_of<E> == 0, "loom::scalar_summary: logs one value per step, so the tensor "
                                 "must be a scalar (rank 0); reduce it first (reduce_mean) or use "
                                 "histogram_summary");
  return detail::add_summary_node("scalar_summary", name, value);
}

// The distribution of a tensor's values in each step (tf.summary.histogram),
// over TF's default buckets. A NaN or an infinity fails the step naming the
// tag (as TF's kernel does: it cannot be bucketed).
template <expression E>
output<std::string, 0> histogram_summary(const std::string& name, const E& values) {
  static_assert(numeric_type<value_type_of<E>>,
                "loom::histogram_summary: summarizes numbers (float, double, int32, int64)");
  return detail::add_summary_node("histogram_summary", name, values);
}

// One Summary with the values of all of `summaries` (tf.summary.merge).
inline output<std::string, 0> merge_summary(const std::vector<output<std::string, 0>>& summaries,
                                            const std::string& name = "merged_summary") {
  if (summaries.empty())
    throw invalid_argument_error("merge_summary: no summaries to merge");
  graph g = summaries.front().graph();
  std::vector<node_id> ids;
  for (const auto& s : summaries) {
    if (s.graph() != g)
      throw invalid_argument_error("merge_summary: " + s.name() + " is in another graph");
    ids.push_back(s.id());
  }
  return {g, g.add_node("merge_summary", std::move(ids), {}, name)};
}

// Every summary of the graph in one (tf.summary.merge_all); none where the
// graph has no summary (TF returns None).
inline std::optional<output<std::string, 0>> merge_all_summaries(graph& g) {
  const auto& ids = g.collection(collection::summaries);
  if (ids.empty())
    return std::nullopt;
  std::vector<output<std::string, 0>> all;
  for (node_id id : ids)
    all.emplace_back(g, id);
  return merge_summary(all, "merged_summaries");
}

} // namespace loom

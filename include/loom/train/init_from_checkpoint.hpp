// Warm start (TF's tf.train.init_from_checkpoint): variables of this graph take
// their initial values from a TensorFlow checkpoint, under other names.
//
//   loom::init_from_checkpoint(g, "/models/tf/model.ckpt-1000",
//                              {{"tf_scope/", "loom_scope/"},   // a scope to a scope
//                               {"emb", "embedding/table"}});  // a tensor to a variable
//   s.run(loom::global_variables_initializer(g));              // reads them
//
// Each entry maps a checkpoint name to this graph's: a variable's name (or a
// partitioned variable's, for all its shards), or a scope ending in '/' ("/"
// alone: every variable), whose every variable takes the checkpoint's tensor of
// the same name under the checkpoint's scope. As in TF, the matched variables'
// initializers are replaced by a read of the checkpoint (restore_slice, on the
// variable's task: the checkpoint must be at that path there), so the values
// are read when the initializers run, never held in the graph; a partitioned
// variable's shards each read their slice of the checkpoint's tensor, whether it
// was saved whole or in another partitioning. Call it before building the
// initializer op (global_variables_initializer reads the initializers then).
//
// Checked here, each a clear error: an entry that matches no variable (the
// nearest variable names), a tensor the checkpoint lacks (the nearest tensor
// names), a dtype or shape that differs (both).
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor_bundle.hpp>
#include <loom/core/tensor_slice.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/node.hpp>
#include <loom/train/checkpoint_state.hpp>
#include <loom/train/saver.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

// `checkpoint`: a TF checkpoint's prefix, or a directory (its latest checkpoint).
// `assignment_map`: {checkpoint name, graph name} pairs, as TF's dict.
LOOM_COMPILED_ONCE void
init_from_checkpoint(graph& g, const std::string& checkpoint,
                     const std::vector<std::pair<std::string, std::string>>& assignment_map);

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE void
init_from_checkpoint(graph& g, const std::string& checkpoint,
                     const std::vector<std::pair<std::string, std::string>>& assignment_map) {
  std::string prefix = checkpoint;
  std::error_code ec;
  if (std::filesystem::is_directory(checkpoint, ec)) {
    const auto latest = latest_checkpoint(checkpoint);
    if (!latest)
      throw not_found_error("init_from_checkpoint: directory " + checkpoint +
                            " has no checkpoint (no 'checkpoint' state file naming one)");
    prefix = *latest;
  }
  if (!std::filesystem::is_regular_file(tensor_bundle::index_path(prefix), ec))
    throw not_found_error("init_from_checkpoint: " + prefix + " is no TensorFlow checkpoint (no " +
                          tensor_bundle::index_path(prefix) +
                          "; loom-ckpt convert writes one from loom's format)");
  const tensor_bundle::reader reader(prefix);

  // The graph's variables by name: a partitioned variable's shards (in order)
  // under the whole's name.
  std::map<std::string, std::vector<node_id>> vars;
  for (node_id id : g.collection(collection::global_variables)) {
    const node_def& n = g.node(id);
    if (!n.has_attr("_partition_of")) {
      vars[n.name] = {id};
      continue;
    }
    auto& shards = vars[n.attr<std::string>("_partition_of")];
    const auto index = static_cast<std::size_t>(n.attr<std::int64_t>("_partition_index"));
    if (shards.size() <= index)
      shards.resize(index + 1, no_node);
    shards[index] = id;
  }
  std::vector<std::string> var_names;
  for (const auto& [name, ids] : vars)
    var_names.push_back(name);

  // Checks tensor `name` against variable `var`, then makes its shards'
  // initializers read it: all checked before the graph changes.
  std::vector<std::pair<std::string, std::string>> plan; // tensor, variable
  auto check = [&](const std::string& tensor, const std::string& var) {
    const tensor_bundle::entry* e = reader.find(tensor);
    if (!e) {
      std::vector<std::string> names;
      for (const tensor_bundle::entry* t : reader.entries())
        names.push_back(t->key);
      throw not_found_error("init_from_checkpoint: checkpoint " + prefix + " has no tensor '" +
                            tensor + "' for variable '" + var + "'" +
                            detail::nearest_of(tensor, names));
    }
    const node_def& first = g.node(vars.at(var).front());
    const loom::shape full =
        first.has_attr("_partition_of")
            ? loom::shape(first.attr<std::vector<std::int64_t>>("_partition_full_shape"))
            : first.shape;
    if (e->tf_dtype != tensor_bundle::tf_dtype_of(first.type) || e->shape != full)
      throw invalid_argument_error("init_from_checkpoint: tensor '" + tensor + "' of checkpoint " +
                                   prefix + " is " + e->dtype_name() + e->shape.to_string() +
                                   ", variable '" + var + "' is " +
                                   std::string(to_string(first.type)) + full.to_string());
    plan.emplace_back(tensor, var);
  };
  for (const auto& [tensor, current] : assignment_map) {
    const std::string entry =
        "init_from_checkpoint: assignment map entry {'" + tensor + "': '" + current + "'}";
    if (vars.contains(current)) {
      check(tensor, current);
      continue;
    }
    if (current.empty() || current.back() != '/')
      throw not_found_error(entry + " names no variable of the graph" +
                            detail::nearest_of(current, var_names));
    if (tensor.empty() || tensor.back() != '/')
      throw invalid_argument_error(entry + " maps a scope to '" + tensor +
                                   "', which is no scope: a scope maps to a scope ('scope/')");
    const std::string scope = current == "/" ? "" : current;
    const std::string from = tensor == "/" ? "" : tensor;
    bool matched = false;
    for (const std::string& name : var_names)
      if (name.starts_with(scope)) {
        check(from + name.substr(scope.size()), name);
        matched = true;
      }
    if (!matched)
      throw not_found_error(entry + ": no variable of the graph is in scope '" + current + "'" +
                            detail::nearest_of(current, var_names));
  }

  for (const auto& [tensor, var] : plan) {
    const std::vector<node_id>& shards = vars.at(var);
    for (node_id id : shards) {
      if (id == no_node)
        throw invalid_argument_error("init_from_checkpoint: partitioned variable '" + var +
                                     "' lacks a shard among the global variables");
      const node_def n = g.node(id);
      attr_map attrs{{"prefix", prefix},
                     {"tensor_name", tensor},
                     {"shape_and_slice", std::string()},
                     {"dtype", n.type},
                     {"shape", n.shape}};
      if (const auto part = detail::slice_of(n)) // the shard's rows of the whole
        attrs["shape_and_slice"] = detail::slice_spec(part->first, part->second);
      auto no_names = g.name_scope("");
      auto no_deps = g.control_dependencies(nullptr);
      auto no_device = g.device(nullptr);
      const node_id read =
          g.add_node("restore_slice", {}, std::move(attrs), n.name + "/init_from_checkpoint");
      g.mutable_node(read).colocation_group = n.colocation();
      const node_id init =
          g.add_node("assign", {id, read}, {}, n.name + "/init_from_checkpoint/assign");
      g.mutable_node(id).attrs["initializer"] = std::int64_t{init};
    }
  }
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

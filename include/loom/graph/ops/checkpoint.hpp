// Op definitions of the checkpoint ops: save_shard, the write of one task's part of a
// sharded checkpoint (TF's SaveV2 on each device of a sharded Saver), and
// restore_slice, the read of one variable's value, or a slice of it, from a
// TensorFlow checkpoint on the task that runs it (TF's RestoreV2, as
// tf.train.init_from_checkpoint puts it in a variable's initializer). The saver
// (train/saver.hpp) places one save_shard beside each task's variables;
// init_from_checkpoint (train/init_from_checkpoint.hpp) makes the restore_slice
// nodes. The kernels are in kernels/cpu/checkpoint.hpp, the file formats in
// core/checkpoint_format.hpp (loom's) and core/tensor_bundle.hpp (TensorFlow's).
#pragma once

#include <loom/core/error.hpp>
#include <loom/graph/op_registry.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace loom::detail {

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_checkpoint_ops() {
  auto& r = op_registry::instance();
  // Inputs: the checkpoint's path (a string scalar), then the tensors to save.
  // Attrs: names (a string tensor, one per saved tensor), shard, num_shards,
  // format ("loom" or "tensorflow") and, for TensorFlow's, shape_and_slices (a
  // string tensor: "" for a whole tensor, else TF's save_slice_info spec of the
  // part, "10 4 0,4:0,4"). Writes loom's "<path>.data-<shard>-of-<num_shards>" or
  // TF's data file "<path>.data-0000<shard>-of-0000<num_shards>". Its output, a
  // string vector, is the index entries of what it wrote, TF's format only (key,
  // BundleEntryProto, key, ...; empty for loom's): the saver writes the index from
  // them. Blocking: a big shard's write must not hold a task's io thread.
  r.add({.name = "save_shard",
         .num_inputs = -1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               const auto fail = [&](const std::string& why) {
                 return invalid_argument_error("node " + n.describe() + ": " + why);
               };
               if (in.empty() || in[0]->type != dtype::string || in[0]->shape.rank() != 0)
                 throw fail("its first input must be the checkpoint's path, a string scalar");
               const auto saved = static_cast<std::int64_t>(in.size() - 1);
               const any_tensor& names = n.attr<any_tensor>("names");
               if (names.type() != dtype::string || names.num_elements() != saved)
                 throw fail("names " + names.describe() + " must be one string per saved tensor (" +
                            std::to_string(saved) + ")");
               const auto format = n.attr_or<std::string>("format", "loom");
               if (format != "loom" && format != "tensorflow")
                 throw fail("format '" + format + "': \"loom\" or \"tensorflow\"");
               if (format == "tensorflow") {
                 const any_tensor& specs = n.attr<any_tensor>("shape_and_slices");
                 if (specs.type() != dtype::string || specs.num_elements() != saved)
                   throw fail("shape_and_slices " + specs.describe() +
                              " must be one string per saved tensor (" + std::to_string(saved) +
                              ")");
               }
               const auto shard = n.attr<std::int64_t>("shard");
               const auto count = n.attr<std::int64_t>("num_shards");
               if (count < 1 || shard < 0 || shard >= count)
                 throw fail("shard " + std::to_string(shard) + " of " + std::to_string(count));
               n.type = dtype::string;
               n.shape = loom::shape{-1};
             },
         .stateful = true,
         .type_input = -1,
         .blocking = true});
  // No inputs. Attrs: prefix (a TF checkpoint), tensor_name, shape_and_slice ("" for
  // the whole tensor, else a save_slice_info spec), dtype and shape (of the value read:
  // the slice's). Reads on the task it runs on: the checkpoint must be at that path
  // there (TF's assumption too). Blocking: a big tensor's read must not hold a
  // task's io thread.
  r.add({.name = "restore_slice",
         .num_inputs = 0,
         .infer =
             [](node_def& n, const std::vector<const node_def*>&) {
               n.type = n.attr<dtype>("dtype");
               n.shape = n.attr<loom::shape>("shape");
             },
         .stateful = true,
         .type_input = -1,
         .blocking = true});
  return true;
}

inline const bool checkpoint_ops_registered = register_checkpoint_ops();
#endif

} // namespace loom::detail

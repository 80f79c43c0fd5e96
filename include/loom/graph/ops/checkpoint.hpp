// Op definition of save_shard, the write of one task's part of a sharded
// checkpoint (TF's SaveV2 on each device of a sharded Saver). The saver
// (train/saver.hpp) places one beside each task's variables; the kernel is in
// kernels/cpu/checkpoint.hpp, the file format in core/checkpoint_format.hpp.
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
  // Attrs: names (a string tensor, one per saved tensor), shard, num_shards.
  // Writes "<path>.data-<shard>-of-<num_shards>"; no output. Blocking: a big
  // shard's write must not hold a task's io thread.
  r.add({.name = "save_shard",
         .num_inputs = -1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               const auto fail = [&](const std::string& why) {
                 return invalid_argument_error("node " + n.describe() + ": " + why);
               };
               if (in.empty() || in[0]->type != dtype::string || in[0]->shape.rank() != 0)
                 throw fail("its first input must be the checkpoint's path, a string scalar");
               const any_tensor& names = n.attr<any_tensor>("names");
               if (names.type() != dtype::string ||
                   names.num_elements() != static_cast<std::int64_t>(in.size() - 1))
                 throw fail("names " + names.describe() + " must be one string per saved tensor (" +
                            std::to_string(in.size() - 1) + ")");
               const auto shard = n.attr<std::int64_t>("shard");
               const auto count = n.attr<std::int64_t>("num_shards");
               if (count < 1 || shard < 0 || shard >= count)
                 throw fail("shard " + std::to_string(shard) + " of " + std::to_string(count));
               n.shape = loom::shape{};
             },
         .stateful = true,
         .no_output = true,
         .blocking = true});
  return true;
}

inline const bool checkpoint_ops_registered = register_checkpoint_ops();
#endif

} // namespace loom::detail

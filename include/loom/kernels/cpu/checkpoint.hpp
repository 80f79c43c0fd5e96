// CPU kernel of save_shard (graph/ops/checkpoint.hpp): the task writes the
// values of its own variables to its shard of a sharded checkpoint, durably
// (core/durable_file.hpp), so that no saved byte crosses the network. The
// manifest that makes the checkpoint whole is the saver's, written after
// every shard (train/saver.hpp).
#pragma once

#include <loom/core/checkpoint_format.hpp>
#include <loom/graph/ops/checkpoint.hpp>
#include <loom/kernels/registry.hpp>

#include <cstdint>
#include <string>
#include <utility>

namespace loom::detail {

template <class T> struct save_shard_cpu {
  static void run(kernel_context& c) {
    const std::string& path = c.input(0).template data<std::string>()[0];
    const any_tensor& names = c.node.attr<any_tensor>("names");
    const std::string* name = names.data<std::string>();
    write_checkpoint_file(checkpoint_shard_path(path, c.node.attr<std::int64_t>("shard"),
                                                c.node.attr<std::int64_t>("num_shards")),
                          c.inputs.size() - 1, [&](std::size_t i) {
                            return std::pair<std::string, any_tensor>(name[i], c.input(i + 1));
                          });
  }
};

inline bool register_checkpoint_kernels() {
  register_kernels<save_shard_cpu>("save_shard", type_list<std::string>{});
  return true;
}

inline const bool checkpoint_kernels_registered = register_checkpoint_kernels();

} // namespace loom::detail

// What a saver (train/saver.hpp) is made with: the variables it saves, under
// which names, how many checkpoints it keeps, and how they lie on disk.
#pragma once

#include <loom/core/byte_progress.hpp>
#include <loom/core/error.hpp>
#include <loom/graph/node.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

// How a checkpoint lies on disk.
enum class checkpoint_format {
  loom,       // loom's own: one file (core/checkpoint_format.hpp)
  tensorflow, // TensorFlow's V2 tensor bundle, which TF restores (core/tensor_bundle.hpp)
};

// A format by its name, "loom" or "tensorflow" (a flag's value).
inline checkpoint_format checkpoint_format_from(std::string_view name) {
  if (name == "loom")
    return checkpoint_format::loom;
  if (name == "tensorflow")
    return checkpoint_format::tensorflow;
  throw invalid_argument_error("checkpoint format '" + std::string(name) +
                               "': \"loom\" or \"tensorflow\"");
}

struct saver_options {
  // Checkpoints kept on disk; older ones are deleted. 0 or less keeps every
  // file and lists only the newest in the state file (TF's max_to_keep=None).
  int max_to_keep = 5;
  // Variable nodes to save; empty: the global_variables collection.
  std::vector<node_id> var_list{};
  // Or the variables to save under other names (TF's Saver(var_list={name:
  // variable})): each variable under its checkpoint name; a shard of a
  // partitioned variable under the name of the whole (TF's dict of a name and a
  // PartitionedVariable). Not with var_list.
  std::vector<std::pair<std::string, node_id>> var_names{};
  // Each task writes its own variables' shard of the checkpoint (above).
  bool sharded = false;
  // The format save writes; restore reads either. TF's by default: its save and
  // restore measured no slower than loom's own (docs/benchmarks.md,
  // "Checkpoints"), and TF reads it.
  checkpoint_format format = checkpoint_format::tensorflow;
  // A save or restore of at least this many bytes says in the log (on each task that
  // writes a shard) each time it has done this many more, and its total and rate at
  // the end (core/byte_progress.hpp); smaller ones log nothing.
  std::uint64_t progress_every_bytes = detail::byte_progress::default_every;
};

} // namespace loom

// monitored_session_options: what a monitored_training_session (train/monitored_session.hpp)
// is told: the chief or not, checkpoints and summaries, hooks, sync replicas, and the
// waits and deadlines of its recovery, readiness and shutdown.
#pragma once

#include <loom/runtime/interfaces.hpp>
#include <loom/train/hooks.hpp>
#include <loom/train/saver_options.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom {

class sync_replicas_optimizer;

struct monitored_session_options {
  std::string master; // the worker's server.target()
  bool is_chief = true;
  int num_workers = 1; // workers that close() waits for before shutdown
  std::string checkpoint_dir{};
  double save_checkpoint_secs = 600; // 0: not by time
  std::int64_t save_checkpoint_steps = 0;
  // Incremental checkpoints (train/incremental_saver.hpp): between the full ones, an
  // increment of the hash tables' rows written since the last save, when this many
  // seconds have passed or the global step has advanced this many (0: not by time, not
  // by steps; both 0: no increments). A restore follows the newest increment's chain.
  double save_increment_secs = 0;
  std::int64_t save_increment_steps = 0;
  int max_checkpoints_to_keep = 5;
  // Where checkpoint_dir holds checkpoints but none is intact (and its state
  // file names none that exists), the chief refuses to initialize over them
  // unless this is set (find_checkpoint_to_restore).
  bool initialize_over_damaged_checkpoints = false;
  // Each ps task writes its own variables' shard of every checkpoint (saver_options::sharded;
  // the tasks and the chief must see checkpoint_dir at the same path).
  bool sharded_checkpoints = false;
  // The checkpoints' format (saver_options::format: TF's by default); a restore
  // reads either.
  loom::checkpoint_format checkpoint_format = loom::checkpoint_format::tensorflow;
  // Where the chief writes the graph's summaries (merge_all_summaries) for
  // TensorBoard, by a summary_saver_hook; empty: checkpoint_dir, as TF's.
  // Nothing is written where the graph has no summary.
  std::string summary_dir{};
  std::int64_t save_summaries_steps = 100; // 0: not by steps
  double save_summaries_secs = 0;          // 0: not by time
  // Examples a global step trains on (the batch, times replicas_to_aggregate
  // with sync replicas); > 0: those summaries add the cluster's examples/s
  // (summary_saver_options::examples_per_global_step).
  std::int64_t examples_per_global_step = 0;
  std::vector<std::shared_ptr<session_run_hook>> hooks{};
  std::vector<std::shared_ptr<session_run_hook>> chief_only_hooks{};
  sync_replicas_optimizer* sync_replicas = nullptr;
  cluster_session_options config{};
  // Between readiness checks of a waiting worker, and before the first
  // attempt of a recovery; later attempts wait twice as long as the one
  // before, at most max_recovery_wait.
  std::chrono::milliseconds recovery_wait{1000};
  std::chrono::milliseconds max_recovery_wait{std::chrono::seconds(30)};
  // How long one recovery (from the failure to the next step that succeeds)
  // may go on before the error is thrown; 0: without end (TF's). A ps gone for
  // longer (a run that ended without this worker, a host that died) is a job
  // to restart, which the error tells its scheduler.
  std::chrono::milliseconds recovery_deadline{std::chrono::minutes(10)};
  // How long a worker waits for the chief to initialize the variables.
  std::chrono::milliseconds ready_timeout{std::chrono::minutes(10)};
  // How long the chief waits in close() for the other workers to finish, at
  // most (a worker that is gone is not waited for).
  std::chrono::milliseconds shutdown_wait{std::chrono::minutes(2)};
  // Whether the chief shuts the cluster down in close(), and when it gives up
  // (a step or the session's creation failed for good: the ps tasks would
  // otherwise serve forever), and which jobs.
  bool shutdown_cluster = true;
  std::vector<std::string> shutdown_jobs{"ps"};
  // Prefix of this session's log lines ("worker: restored ..."). They go to the library's
  // logger (core/log.hpp): stderr, with the time, level and task in front.
  std::string label = "worker";
};

} // namespace loom

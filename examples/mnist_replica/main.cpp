// Seed 002: the distributed MNIST program (between-graph replication, 1 ps and
// 2 workers by default, async or --sync_replicas) as one cluster binary with
// the seed's flags, on Fashion-MNIST. Every task runs the same binary:
//
//   mnist_replica --ps_hosts=127.0.0.1:2222 --worker_hosts=127.0.0.1:2223,127.0.0.1:2224
//                 --job_name=ps --task_index=0
//   mnist_replica ... --job_name=worker --task_index=0 --train_steps=2000 [--sync_replicas]
//   mnist_replica ... --job_name=worker --task_index=1 --train_steps=2000 [--sync_replicas]
//
// or all at once: loom-launch --ps 1 --workers 2 -- mnist_replica --train_steps=2000,
// or under Slurm: srun -n 3 mnist_replica --jobs=ps:1,worker:2 (docs/deploying.md).
// Variables live on the ps tasks (replica_device_setter), each worker computes
// gradients on its own batches; worker 0 is the chief: it initializes or
// restores, saves checkpoints, and when training ends shuts the cluster down,
// so every task exits 0.
#include <loom/data/mnist.hpp>
#include <loom/loom.hpp>

#include "../common/mnist_input.hpp"
#include "../common/seed_mlp.hpp"
#include "../common/worker_device.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

int main(int argc, char** argv) try {
  // [snippet:flags]
  loom::flags flags("Seed 002: distributed training of the seed's MLP on Fashion-MNIST.");
  loom::define_cluster_flags(flags, {.ps_hosts = "127.0.0.1:2222",
                                     .worker_hosts = "127.0.0.1:2223,127.0.0.1:2224",
                                     .task_index = -1});
  flags
      .define_string("data_dir", std::string(loom::data::default_fashion_mnist_dir),
                     "Directory with the (Fashion-)MNIST IDX files")
      .define_int("replicas_to_aggregate", 0,
                  "Number of replicas to aggregate before parameter update is applied (For "
                  "sync_replicas mode only; default: num_workers)")
      .define_int("hidden_units", 100, "Number of units in the hidden layer of the NN")
      .define_int("train_steps", 1000000, "Number of (global) training steps to perform")
      .define_int("batch_size", 100, "Training batch size")
      .define_int("num_gpus", 0,
                  "GPUs of each machine; > 0: a worker computes on GPU task_index % num_gpus, "
                  "the variables stay on the ps CPUs (needs a build with CUDA)")
      .define_float("learning_rate", 0.01, "Learning rate")
      .define_bool("sync_replicas", false,
                   "Use the sync_replicas (synchronized replicas) mode, wherein the parameter "
                   "updates from workers are aggregated before applied to avoid stale gradients")
      .define_string("checkpoint_dir", "",
                     "Where the chief saves and restores checkpoints (default: a new "
                     "temporary directory, as the seed's tempfile.mkdtemp())")
      .define_string("checkpoint_format", "tensorflow",
                     "The checkpoints' format: loom (its own) or tensorflow (TF's V2 checkpoint, "
                     "which TF's Saver restores)")
      .define_float("save_checkpoint_secs", 60, "Seconds between checkpoints (0: not by time)")
      .define_int("save_checkpoint_steps", 0, "Global steps between checkpoints (0: not by steps)")
      .define_string("logdir", "",
                     "Where the chief writes TensorBoard summaries (loss, accuracy, examples/s, "
                     "weight histograms; default: --checkpoint_dir)")
      .define_int("save_summaries_steps", 100, "Global steps between summaries (0: none)")
      .define_int("log_every", 100, "Print progress every this many local steps")
      .define_int("trace_step", 0,
                  "Trace this worker's local step N (from 1) on every task it runs on and write "
                  "it in Chrome's trace format (TF's FULL_TRACE and timeline; 0: none)")
      .define_string("trace_file", "",
                     "Where --trace_step's trace goes (default: "
                     "timeline-worker<task>-step<N>.json in --logdir, else here)")
      .define_int("seed", 1, "Graph-level random seed (initial weights); batches use seed+task")
      .define_int("shutdown_wait_secs", 120,
                  "How long the chief waits, at most, for the other workers to finish before it "
                  "shuts the ps tasks down (a worker that is gone is not waited for)")
      .define_int("barrier_timeout_secs", 120,
                  "With --sync_replicas: how long a worker waits for its step's update");
  if (!flags.parse(argc, argv))
    return 0;
  // [snippet-end:flags]

  // The cluster and this task: flags, TF_CONFIG, srun or mpirun
  // (loom/cluster/cluster_resolver.hpp).
  // [snippet:resolve-cluster]
  const auto role = loom::resolve_cluster(flags).require_task();
  const std::string job = role.job_name;
  const std::int64_t task_index = role.task_index;
  std::printf("job name = %s\ntask index = %lld\n", job.c_str(),
              static_cast<long long>(task_index));
  std::fflush(stdout);
  // [snippet-end:resolve-cluster]

  // [snippet:server]
  const auto& cluster = role.cluster;
  const int num_workers = cluster.num_tasks("worker");
  loom::server server(cluster, job, static_cast<int>(task_index));
  if (job == "ps") {
    server.join();
    return 0;
  }
  // [snippet-end:server]
  // [snippet:is-chief]
  const bool is_chief = task_index == 0;
  // [snippet-end:is-chief]

  // [snippet:data]
  const auto mnist = loom::data::read_mnist(flags.get_string("data_dir"));
  const auto hidden = flags.get_int("hidden_units");
  const auto batch_size = flags.get_int("batch_size");
  const auto seed = flags.get_int("seed");
  // [snippet-end:data]

  // [snippet:device-setter]
  loom::graph g;
  g.set_random_seed(seed);
  // The seed's worker_device: a GPU with --num_gpus, else the CPU.
  const std::string worker_task = "/job:worker/task:" + std::to_string(task_index);
  const std::string worker_device =
      loom::examples::worker_device(worker_task, task_index, flags.get_int("num_gpus"));
  auto scope = g.device(loom::make_replica_device_setter(
      cluster, {.ps_device = "/job:ps/cpu:0", .worker_device = worker_device}));
  // [snippet-end:device-setter]
  // [snippet:global-step]
  auto global_step = loom::create_global_step(g);
  // [snippet-end:global-step]
  // [snippet:model]
  loom::examples::seed_mlp model(g, hidden);
  auto& x = model.x;
  auto& y_ = model.y_;
  auto& cross_entropy = model.cross_entropy;
  auto& accuracy = model.accuracy;
  // [snippet-end:model]

  // [snippet:adam]
  loom::adam_optimizer adam{flags.get_float("learning_rate")};
  // [snippet-end:adam]
  // [snippet:sync-replicas]
  std::unique_ptr<loom::sync_replicas_optimizer> sync;
  std::int64_t replicas_to_aggregate = 1;
  std::optional<loom::operation> train_step;
  if (flags.get_bool("sync_replicas")) {
    replicas_to_aggregate = flags.get_int("replicas_to_aggregate") > 0
                                ? flags.get_int("replicas_to_aggregate")
                                : num_workers;
    sync = std::make_unique<loom::sync_replicas_optimizer>(
        adam, loom::sync_replicas_options{
                  .replicas_to_aggregate = static_cast<int>(replicas_to_aggregate),
                  .total_num_replicas = num_workers,
                  .barrier_timeout = std::chrono::seconds(flags.get_int("barrier_timeout_secs")),
                  .name = "mnist_sync_replicas"});
    train_step = sync->minimize(cross_entropy, global_step);
  } else {
    // [snippet:async-minimize]
    train_step = adam.minimize(cross_entropy, global_step);
    // [snippet-end:async-minimize]
  }
  // [snippet-end:sync-replicas]

  // What the chief's summary_saver_hook writes for TensorBoard (merge_all_summaries), with
  // examples/s (monitored_session_options::examples_per_global_step).
  // [snippet:summaries]
  loom::scalar_summary("loss", cross_entropy);
  loom::scalar_summary("accuracy", accuracy);
  loom::histogram_summary("hid_w", model.hid_w);
  loom::histogram_summary("sm_w", model.sm_w);
  // [snippet-end:summaries]

  // [snippet:monitored-session]
  std::string checkpoint_dir = flags.get_string("checkpoint_dir");
  if (checkpoint_dir.empty() && is_chief) {
    auto dir =
        std::filesystem::temp_directory_path() / ("mnist_replica-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    checkpoint_dir = dir.string();
  }

  const std::string label = "Worker " + std::to_string(task_index);
  auto loss_id = loom::lower(cross_entropy).id();
  loom::monitored_session_options o{
      .master = server.target(),
      .is_chief = is_chief,
      .num_workers = num_workers,
      .checkpoint_dir = checkpoint_dir,
      .save_checkpoint_secs = flags.get_float("save_checkpoint_secs"),
      .save_checkpoint_steps = flags.get_int("save_checkpoint_steps"),
      .checkpoint_format = loom::checkpoint_format_from(flags.get_string("checkpoint_format")),
      .summary_dir = flags.get_string("logdir"),
      .save_summaries_steps = flags.get_int("save_summaries_steps"),
      .examples_per_global_step = batch_size * replicas_to_aggregate,
      .hooks = {std::make_shared<loom::stop_at_step_hook>(flags.get_int("train_steps")),
                std::make_shared<loom::nan_guard_hook>(loss_id),
                std::make_shared<loom::logging_hook>(
                    loss_id, loom::logging_options{.label = label,
                                                   .every_n_steps = flags.get_int("log_every"),
                                                   .batch_size = batch_size,
                                                   .examples_per_global_step =
                                                       batch_size * replicas_to_aggregate,
                                                   .last_step = flags.get_int("train_steps")})},
      .sync_replicas = sync.get(),
      // [snippet:session-config]
      .config = {.allow_soft_placement = true,
                 .device_filters = {"/job:ps", worker_task},
                 .step_timeout = std::chrono::milliseconds(0)},
      // [snippet-end:session-config]
      .shutdown_wait = std::chrono::seconds(flags.get_int("shutdown_wait_secs")),
      .label = label};
  if (is_chief)
    std::printf("%s: Initializing session...\n", label.c_str());
  else
    std::printf("%s: Waiting for session to be initialized...\n", label.c_str());
  std::fflush(stdout);
  loom::monitored_training_session sess(g, std::move(o));
  std::printf("%s: Session initialization complete.\n", label.c_str());
  // [snippet-end:monitored-session]

  // [snippet:training-loop]
  // mnist.train.next_batch(batch_size), as an input pipeline on its own thread.
  auto batches = loom::examples::mnist_batches(mnist.train, batch_size,
                                               static_cast<std::uint64_t>(seed + task_index))
                     .make_iterator();
  using clock = std::chrono::steady_clock;
  const auto begin = clock::now();
  // The seed prints time.time(); here the same instant as a person reads it, then the
  // seconds since the epoch.
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  std::printf("Training begins @ %s (%lld)\n", when, static_cast<long long>(now));
  std::fflush(stdout);
  std::int64_t local_step = 0;
  const std::int64_t trace_step = flags.get_int("trace_step");
  while (!sess.should_stop()) {
    auto [images, labels] = *batches.next(); // repeated: never the end
    if (++local_step != trace_step) {
      sess.run(*train_step, {{x, images}, {y_, labels}});
      continue;
    }
    loom::run_metadata trace;
    sess.run(*train_step, {{x, images}, {y_, labels}}, {.trace_level = loom::trace_level::full},
             &trace);
    std::string path = flags.get_string("trace_file");
    if (path.empty()) {
      const std::string name = "timeline-worker" + std::to_string(task_index) + "-step" +
                               std::to_string(trace_step) + ".json";
      const std::string logdir = flags.get_string("logdir");
      if (!logdir.empty())
        std::filesystem::create_directories(logdir);
      path = logdir.empty() ? name : (std::filesystem::path(logdir) / name).string();
    }
    std::ofstream out(path);
    out << loom::timeline(trace).chrome_trace_json();
    out.close();
    if (!out)
      throw loom::failed_precondition_error("--trace_step: cannot write " + path);
    std::printf("%s: wrote the trace of local step %lld to %s\n", label.c_str(),
                static_cast<long long>(trace_step), path.c_str());
  }
  const double secs = std::chrono::duration<double>(clock::now() - begin).count();
  std::printf("%s: Training ends: %lld local steps, global step %lld\n", label.c_str(),
              static_cast<long long>(local_step), static_cast<long long>(sess.global_step()));
  std::printf("Training elapsed time: %f s (%.0f examples/s on this worker)\n", secs,
              static_cast<double>(local_step * batch_size) / secs);
  // [snippet-end:training-loop]

  // [snippet:validation]
  auto& s = sess.raw_session();
  const auto val_labels = loom::data::one_hot(mnist.validation.labels, 10);
  const float val_xent = s.run(cross_entropy, {{x, mnist.validation.images}, {y_, val_labels}});
  std::printf("After %lld training step(s), validation cross entropy = %g\n",
              static_cast<long long>(sess.global_step()), static_cast<double>(val_xent));
  // [snippet-end:validation]
  // [snippet:test-accuracy]
  const float test_acc =
      s.run(accuracy, {{x, mnist.test.images}, {y_, loom::data::one_hot(mnist.test.labels, 10)}});
  std::printf("%s: test accuracy = %.4f\n", label.c_str(), static_cast<double>(test_acc));
  // [snippet-end:test-accuracy]
  std::fflush(stdout);
  // [snippet:close]
  sess.close();
  return 0;
  // [snippet-end:close]
} catch (const loom::error& e) {
  std::cerr << "mnist_replica: " << e.what() << "\n";
  return 1;
}

// The convolutional network of TensorFlow's "Deep MNIST for experts" (examples/common/
// deep_cnn.hpp) as a cluster binary with seed 002's flags, on Fashion-MNIST: variables on
// the ps tasks, each worker computing on its own batches, async or --sync_replicas,
// --num_gpus as mnist_replica; --batch_norm adds batch normalization, whose moving averages
// move with each step (the update ops run with the train op). The test accuracy comes from
// loom::metrics::accuracy over the test set in batches.
//
//   loom-launch --ps 1 --workers 2 -- cnn --train_steps=2000 [--sync_replicas] [--batch_norm]
#include <loom/data/batcher.hpp>
#include <loom/data/mnist.hpp>
#include <loom/loom.hpp>

#include "../common/deep_cnn.hpp"
#include "../common/worker_device.hpp"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

namespace {

// The rows [first, first + n) of a dataset's images and labels.
template <class T>
loom::tensor<T, 2> rows_of(const loom::tensor<T, 2>& t, std::int64_t first, std::int64_t n) {
  const std::int64_t width = t.dim(1);
  loom::tensor<T, 2> out(loom::shape{n, width});
  std::copy_n(t.data() + first * width, n * width, out.data());
  return out;
}
loom::tensor<std::int64_t, 1> rows_of(const loom::tensor<std::int64_t, 1>& t, std::int64_t first,
                                      std::int64_t n) {
  loom::tensor<std::int64_t, 1> out(loom::shape{n});
  std::copy_n(t.data() + first, n, out.data());
  return out;
}

} // namespace

int main(int argc, char** argv) try {
  loom::flags flags("Deep MNIST for experts' CNN, trained on Fashion-MNIST by a cluster.");
  loom::define_cluster_flags(flags, {.ps_hosts = "127.0.0.1:2222",
                                     .worker_hosts = "127.0.0.1:2223,127.0.0.1:2224",
                                     .task_index = -1});
  flags
      .define_string("data_dir", std::string(loom::data::default_fashion_mnist_dir),
                     "Directory with the (Fashion-)MNIST IDX files")
      .define_int("replicas_to_aggregate", 0,
                  "Replicas to aggregate before an update (--sync_replicas; default: workers)")
      .define_int("train_steps", 2000, "Number of (global) training steps to perform")
      .define_int("batch_size", 50, "Training batch size")
      .define_int("num_gpus", 0,
                  "GPUs of each machine; > 0: a worker computes on GPU task_index % num_gpus")
      .define_float("learning_rate", 1e-4, "Adam's learning rate (the tutorial's)")
      .define_bool("sync_replicas", false, "Aggregate the workers' gradients before each update")
      .define_bool("batch_norm", false, "Batch normalization after the convolutions and fc1")
      .define_string("checkpoint_dir", "", "Where the chief saves checkpoints (default: none)")
      .define_int("log_every", 100, "Print progress every this many local steps")
      .define_int("eval_batch", 500, "Test images per evaluation step")
      .define_int("seed", 1,
                  "Graph-level random seed (initial weights, dropout); batches "
                  "use seed+task")
      .define_int("shutdown_wait_secs", 120,
                  "How long the chief waits for the other workers before it shuts the ps down")
      .define_int("barrier_timeout_secs", 120,
                  "With --sync_replicas: how long a worker waits for its step's update");
  if (!flags.parse(argc, argv))
    return 0;

  const auto role = loom::resolve_cluster(flags).require_task();
  const std::string job = role.job_name;
  const std::int64_t task_index = role.task_index;
  const auto& cluster = role.cluster;
  const int num_workers = cluster.num_tasks("worker");
  loom::server server(cluster, job, static_cast<int>(task_index));
  if (job == "ps") {
    server.join();
    return 0;
  }
  const bool is_chief = task_index == 0;
  const auto mnist = loom::data::read_mnist(flags.get_string("data_dir"));
  const auto batch_size = flags.get_int("batch_size");
  const auto seed = flags.get_int("seed");

  loom::graph g;
  g.set_random_seed(seed);
  const std::string worker_task = "/job:worker/task:" + std::to_string(task_index);
  const std::string worker_device =
      loom::examples::worker_device(worker_task, task_index, flags.get_int("num_gpus"));
  std::optional<loom::scope_guard> on_ps(g.device(loom::make_replica_device_setter(
      cluster, {.ps_device = "/job:ps/cpu:0", .worker_device = worker_device})));
  auto global_step = loom::create_global_step(g);
  loom::examples::deep_cnn model(g, flags.get_bool("batch_norm"));
  on_ps.reset();
  // The test accuracy's totals are this worker's own: each worker evaluates the test set.
  // [snippet:test-accuracy]
  auto accuracy = [&] {
    auto on_worker = g.device(worker_task);
    return loom::metrics::accuracy(model.labels, model.predictions);
  }();
  // [snippet-end:test-accuracy]

  loom::adam_optimizer adam{flags.get_float("learning_rate")};
  std::unique_ptr<loom::sync_replicas_optimizer> sync;
  std::int64_t replicas_to_aggregate = 1;
  std::optional<loom::operation> train_step;
  {
    // Batch normalization's moving averages move with every step (TF's UPDATE_OPS idiom).
    // [snippet:update-ops]
    auto after = g.control_dependencies(g.collection(loom::collection::update_ops));
    if (flags.get_bool("sync_replicas")) {
      replicas_to_aggregate = flags.get_int("replicas_to_aggregate") > 0
                                  ? flags.get_int("replicas_to_aggregate")
                                  : num_workers;
      sync = std::make_unique<loom::sync_replicas_optimizer>(
          adam, loom::sync_replicas_options{
                    .replicas_to_aggregate = static_cast<int>(replicas_to_aggregate),
                    .total_num_replicas = num_workers,
                    .barrier_timeout = std::chrono::seconds(flags.get_int("barrier_timeout_secs")),
                    .name = "cnn_sync_replicas"});
      train_step = sync->minimize(model.loss, global_step);
    } else {
      train_step = adam.minimize(model.loss, global_step);
    }
    // [snippet-end:update-ops]
  }

  const std::string label = "Worker " + std::to_string(task_index);
  const auto loss_id = loom::lower(model.loss).id();
  loom::monitored_session_options o{
      .master = server.target(),
      .is_chief = is_chief,
      .num_workers = num_workers,
      .checkpoint_dir = flags.get_string("checkpoint_dir"),
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
      .config = {.allow_soft_placement = true,
                 .device_filters = {"/job:ps", worker_task},
                 .step_timeout = std::chrono::milliseconds(0)},
      .shutdown_wait = std::chrono::seconds(flags.get_int("shutdown_wait_secs")),
      .label = label};
  loom::monitored_training_session sess(g, std::move(o));
  std::printf("%s: Session initialization complete.\n", label.c_str());

  loom::data::batcher batches(mnist.train, batch_size,
                              static_cast<std::uint64_t>(seed + task_index));
  using clock = std::chrono::steady_clock;
  const auto begin = clock::now();
  std::int64_t local_step = 0;
  while (!sess.should_stop()) {
    auto b = batches.next_batch();
    sess.run(*train_step, {{model.x, b.images}, {model.labels, b.labels}, {model.training, true}});
    ++local_step;
  }
  const double secs = std::chrono::duration<double>(clock::now() - begin).count();
  std::printf("%s: Training ends: %lld local steps, global step %lld\n", label.c_str(),
              static_cast<long long>(local_step), static_cast<long long>(sess.global_step()));
  std::printf("Training elapsed time: %f s (%.0f examples/s on this worker)\n", secs,
              static_cast<double>(local_step * batch_size) / secs);

  // The test set through the metric, a batch at a time (all 10 000 images at once would
  // hold a gigabyte of activations).
  auto& s = sess.raw_session();
  s.run(accuracy.reset);
  const std::int64_t n = mnist.test.labels.dim(0), step = flags.get_int("eval_batch");
  for (std::int64_t first = 0; first < n; first += step) {
    const std::int64_t count = std::min(step, n - first);
    s.run(accuracy.update, {{model.x, rows_of(mnist.test.images, first, count)},
                            {model.labels, rows_of(mnist.test.labels, first, count)},
                            {model.training, false}});
  }
  std::printf("%s: test accuracy = %.4f\n", label.c_str(), s.run(accuracy.value).flat()[0]);
  std::fflush(stdout);
  sess.close();
  return 0;
} catch (const loom::error& e) {
  std::cerr << "cnn: " << e.what() << "\n";
  return 1;
}

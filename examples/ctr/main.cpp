// examples/ctr: a wide & deep click-through model (26 categorical fields, the
// last 4 multi-hot, 13 dense features, embeddings of dimension 16, two hidden
// layers) trained across ps and worker tasks with sparse updates: each step
// sends each table shard only the distinct ids of the batch that live there
// and gets their rows back; the gradients go back as rows and ids.
//
// The data are generated click logs (click_data.hpp): Zipf-distributed ids
// over vocabularies of 10^3 to --max_vocab rows, labels drawn from a random
// teacher model whose own AUC is the best any model can reach. The flags are
// seed 002's (mnist_replica's), so it launches the same way:
//
//   loom-launch --ps 1 --workers 2 -- ctr --train_steps=3000 [--sync_replicas]
//
// `ctr --write_data=DIR` writes the same streams to files instead of training
// (for benchmarks/tf/ctr_tf.py, which trains TensorFlow on them), also as TFRecord
// files of tf.Example and as Criteo-layout TSV (--write_formats, click_files.hpp);
// `ctr --train_files=GLOB --format=tfrecord|tsv` trains from such files through an
// input pipeline that each step reads without feeds (make_one_shot_iterator), each
// worker its shard of the files.
#include <loom/loom.hpp>

#include "click_data.hpp"
#include "click_files.hpp"
#include "wide_deep.hpp"

#include "../common/worker_device.hpp"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <sys/resource.h>
#include <unistd.h>
#include <utility>
#include <vector>

namespace {

// A directory made now and removed, with what it holds, when this goes out of scope.
struct removed_at_exit {
  explicit removed_at_exit(std::filesystem::path p) : path(std::move(p)) {
    std::filesystem::create_directories(path);
  }
  removed_at_exit(const removed_at_exit&) = delete;
  removed_at_exit& operator=(const removed_at_exit&) = delete;
  ~removed_at_exit() {
    std::error_code ignored; // a directory already gone, or busy, is not worth failing the run
    std::filesystem::remove_all(path, ignored);
  }
  std::filesystem::path path;
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    out.push_back(item);
  return out;
}

std::vector<std::int64_t> parse_list(const std::string& flag, const std::string& text) {
  std::vector<std::int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      std::size_t used = 0;
      out.push_back(std::stoll(item, &used));
      if (used != item.size() || out.back() < 1)
        throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw loom::invalid_argument_error("--" + flag + "=" + text + ": '" + item +
                                         "' is not a positive integer");
    }
  }
  return out;
}

// The test AUC of the model, and the teacher's on the same examples.
std::pair<double, double> evaluate(loom::session& s, const ctr::wide_deep& model,
                                   ctr::example_source test, std::int64_t n) {
  std::vector<float> scores, teacher, labels;
  constexpr std::int64_t chunk = 4096;
  for (std::int64_t done = 0; done < n; done += chunk) {
    std::vector<ctr::example> batch;
    for (std::int64_t i = done; i < std::min(n, done + chunk); ++i)
      batch.push_back(test.next());
    const auto p = s.run(model.eval_probability, model.feeds(batch));
    for (std::size_t i = 0; i < batch.size(); ++i) {
      scores.push_back(p(static_cast<std::int64_t>(i), 0));
      teacher.push_back(batch[i].teacher_probability);
      labels.push_back(batch[i].label);
    }
  }
  return {ctr::auc(scores, labels), ctr::auc(teacher, labels)};
}

// The same from files: the model's scores on the test files' batches, fed into the
// iterator's outputs `in`, and the teacher's on the same examples (the test stream,
// which the files hold in order).
std::pair<double, double> evaluate_files(loom::session& s, const ctr::wide_deep& model,
                                         const ctr::file_batch_handles& in,
                                         const loom::data::any_dataset<ctr::file_batch>& test,
                                         ctr::example_source teacher_stream) {
  std::vector<float> scores, teacher, labels;
  for (auto& batch : test) {
    loom::feed_dict f{{std::get<0>(in), std::get<0>(batch)}};
    const auto feed_sparse = [&](const loom::sparse_tensor<std::int64_t>& sp,
                                 const loom::data::sparse_value<std::int64_t>& v) {
      f.emplace_back(sp.indices, v.indices);
      f.emplace_back(sp.values, v.values);
      f.emplace_back(sp.dense_shape, v.dense_shape);
    };
    feed_sparse(std::get<1>(in), std::get<1>(batch));
    feed_sparse(std::get<2>(in), std::get<2>(batch));
    feed_sparse(std::get<3>(in), std::get<3>(batch));
    feed_sparse(std::get<4>(in), std::get<4>(batch));
    f.emplace_back(std::get<5>(in), std::get<5>(batch));
    f.emplace_back(std::get<6>(in), std::get<6>(batch));
    const auto p = s.run(model.eval_probability, f);
    const auto& y = std::get<6>(batch);
    for (std::int64_t i = 0; i < p.dim(0); ++i) {
      scores.push_back(p(i, 0));
      labels.push_back(y(i, 0));
      teacher.push_back(teacher_stream.next().teacher_probability);
    }
  }
  return {ctr::auc(scores, labels), ctr::auc(teacher, labels)};
}

// The AUC of the batch the step trains on (the Mann-Whitney statistic, ties
// counted half, as ctr::auc): the share of the batch's (click, no click) pairs
// that the model scores in the right order. In the graph, so that only the
// steps that write a summary compute it ([batch, batch] comparisons); NaN for a
// batch without a click or without a miss (a summary writes NaN as it is).
loom::output<float, 0> batch_auc(const ctr::wide_deep& m) {
  const auto p_row = loom::reshape(m.probability, {1, -1}); // [1, batch]
  const auto clicked_row = loom::reshape(m.label, {1, -1});
  // [batch, batch]: 1 where example i was clicked and example j was not.
  const auto pairs = loom::lower(m.label * (1.0f - clicked_row));
  const auto ordered = loom::cast<float>(m.probability > p_row) +
                       0.5f * loom::cast<float>(loom::equal(m.probability, p_row));
  return loom::named(loom::reduce_sum(pairs * ordered) / loom::reduce_sum(pairs), "batch_auc");
}

} // namespace

int main(int argc, char** argv) try {
  loom::flags flags("examples/ctr: a wide & deep click model with sharded embeddings, trained "
                    "with sparse updates on generated click logs.");
  loom::define_cluster_flags(flags, {.ps_hosts = "127.0.0.1:2222",
                                     .worker_hosts = "127.0.0.1:2223,127.0.0.1:2224",
                                     .task_index = -1});
  flags
      .define_int("replicas_to_aggregate", 0,
                  "Number of replicas to aggregate before parameter update is applied (For "
                  "sync_replicas mode only; default: num_workers)")
      .define_int("train_steps", 3000, "Number of (global) training steps to perform")
      .define_int("batch_size", 256, "Training batch size")
      .define_float("learning_rate", 0.1, "Adagrad's learning rate")
      .define_bool("sync_replicas", false,
                   "Use the sync_replicas (synchronized replicas) mode, wherein the parameter "
                   "updates from workers are aggregated before applied to avoid stale gradients")
      .define_string("checkpoint_dir", "",
                     "Where the chief saves and restores checkpoints (default: a new temporary "
                     "directory, removed when the chief ends)")
      .define_string("checkpoint_format", "tensorflow",
                     "The checkpoints' format: loom (its own) or tensorflow (TF's V2 checkpoint, "
                     "which TF's Saver restores)")
      .define_float("save_checkpoint_secs", 60, "Seconds between checkpoints (0: not by time)")
      .define_int("save_increment_steps", 0,
                  "With --hash_embeddings: between the full checkpoints, an incremental one "
                  "(the tables' rows written since the last save) every this many global steps "
                  "(0: none)")
      .define_string("logdir", "",
                     "Where the chief writes TensorBoard summaries (loss, the batch's AUC, "
                     "examples/s, histograms of the looked-up embeddings and of the weights; "
                     "default: --checkpoint_dir)")
      .define_int("save_summaries_steps", 100, "Global steps between summaries (0: none)")
      .define_bool("sharded_checkpoints", true,
                   "Each ps task writes its own tables' shard of a checkpoint (every task must "
                   "see --checkpoint_dir at the same path); false: the chief writes one file")
      .define_int("intra_op_threads", 0,
                  "Threads of this task's kernels (TF's intra_op_parallelism_threads; 0: "
                  "LOOM_INTRA_OP_THREADS, which loom-launch sets to each task's share of the "
                  "cores, else one per core)")
      .define_int("num_gpus", 0,
                  "GPUs of each machine; > 0: a worker computes its dense network on GPU "
                  "task_index % num_gpus (the tables stay on the ps tasks' CPUs)")
      .define_int("log_every", 200, "Print progress every this many local steps")
      .define_int("seed", 1, "Seed of the data, the teacher and the initial weights")
      .define_int("min_vocab", 1000, "Rows of the smallest field's tables")
      .define_int("max_vocab", 1000000, "Rows of the largest field's tables (up to 10^7)")
      .define_float("zipf_exponent", 1.2, "Exponent of the ids' Zipf distributions")
      .define_int("embedding_dim", 16, "Dimension of the deep part's embeddings")
      .define_string("hidden_units", "256,128", "The deep part's hidden layers")
      .define_int("shards", 2, "Shards of each table, dealt over the ps tasks")
      .define_bool("hash_embeddings", false,
                   "Hash-table embeddings (loom::hash_embedding: ids hashed to 62 bits, rows "
                   "made on first lookup) instead of partitioned variables")
      .define_int("admit_after", 1,
                  "With --hash_embeddings: an id gets its rows once looked up in this many "
                  "steps; until then its lookup is zeros and its gradient is dropped (1: at once)")
      .define_int("max_rows_per_shard", 0,
                  "With --hash_embeddings: the rows of each table's shard at most (0: room for "
                  "every id of its field's vocabulary); a full shard fails the step unless it "
                  "evicts")
      .define_int("steps_to_live", 0,
                  "With --hash_embeddings: remove a row not looked up in this many lookups of "
                  "its shard (one per worker step; 0: never)")
      .define_bool("evict_when_full", false,
                   "With --hash_embeddings: a full shard gives a new id the row least recently "
                   "looked up")
      .define_string("disk_tier_dir", "",
                     "With --hash_embeddings: a directory on each ps task's local disk where a "
                     "full shard moves its least recently looked-up rows, and from which a "
                     "lookup moves them back (tiered storage; max_rows_per_shard is then the "
                     "rows in memory); checkpoints and increments hold it")
      .define_int("test_examples", 50000, "Examples of the test set")
      .define_int("shutdown_wait_secs", 120,
                  "How long the chief waits, at most, for the other workers to finish")
      .define_int("barrier_timeout_secs", 120,
                  "With --sync_replicas: how long a worker waits for its step's update")
      .define_string("write_data", "",
                     "Write the data to this directory instead of training: test.bin and "
                     "train_<i>.bin (i = 0, 1, ...: worker i's stream) and meta.txt (the "
                     "vocabularies), for benchmarks/tf/ctr_tf.py")
      .define_string("data_dir", "",
                     "Read the data from the files --write_data wrote there (train_<task "
                     "index>.bin, test.bin) instead of generating it; the other data flags must "
                     "be those it was written with")
      .define_string("write_formats", "bin",
                     "With --write_data: the formats written, a list of bin (the binary records "
                     "ctr_tf.py reads), tfrecord (train-<i>.tfrecord, test.tfrecord: tf.Example) "
                     "and tsv (train-<i>.tsv, test.tsv: Criteo's layout)")
      .define_string("train_files", "",
                     "Train from these files (a glob, e.g. DIR/train-*.tfrecord) through an "
                     "input pipeline, each worker its shard, instead of generating the data")
      .define_string("test_files", "",
                     "With --train_files: the test set's files (a glob; default: the test "
                     "stream generated in memory, as the ids of --format=tfrecord are; "
                     "--format=tsv needs them, its ids being hashed)")
      .define_string("format", "tfrecord", "With --train_files: tfrecord or tsv")
      .define_int("input_threads", 2, "With --train_files: threads parsing the batches")
      .define_int("write_workers", 2, "With --write_data: train streams to write")
      .define_int("write_examples", 0,
                  "With --write_data: examples per train stream (default: train_steps x "
                  "batch_size)");
  if (!flags.parse(argc, argv))
    return 0;

  const ctr::generator::options data{.seed = static_cast<std::uint64_t>(flags.get_int("seed")),
                                     .min_vocab = flags.get_int("min_vocab"),
                                     .max_vocab = flags.get_int("max_vocab"),
                                     .zipf_exponent = flags.get_float("zipf_exponent")};
  // Tables sized by their vocabularies hold every row; hash tables hold the ids seen.
  const std::int64_t most_vocab = flags.get_bool("hash_embeddings") ? 1000000000 : 10000000;
  if (data.max_vocab > most_vocab)
    throw loom::invalid_argument_error(
        "--max_vocab=" + std::to_string(data.max_vocab) + ": at most " +
        (flags.get_bool("hash_embeddings") ? "10^9 (ids are int32 in the data files)"
                                           : "10^7 (10^9 with --hash_embeddings)"));
  const auto batch_size = flags.get_int("batch_size");

  if (const std::string dir = flags.get_string("write_data"); !dir.empty()) {
    std::filesystem::create_directories(dir);
    ctr::generator test(data, 0);
    {
      std::ofstream meta(dir + "/meta.txt");
      meta << "seed=" << data.seed << "\nvocab=";
      for (std::size_t f = 0; f < test.vocab().size(); ++f)
        meta << (f ? "," : "") << test.vocab()[f];
      meta << "\nrecord_bytes=" << sizeof(ctr::example) << "\n";
      if (!meta)
        throw loom::invalid_argument_error("cannot write " + dir + "/meta.txt");
    }
    const std::int64_t n = flags.get_int("write_examples") > 0
                               ? flags.get_int("write_examples")
                               : flags.get_int("train_steps") * batch_size;
    for (const std::string& format : split_list(flags.get_string("write_formats"))) {
      // Each format from fresh generators: the same streams in every format.
      const auto write = [&](auto train_name, const std::string& test_name, auto write_stream) {
        ctr::generator test_stream(data, 0);
        write_stream(dir + "/" + test_name, test_stream, flags.get_int("test_examples"));
        for (std::int64_t w = 0; w < flags.get_int("write_workers"); ++w) {
          ctr::generator train(data, static_cast<std::uint64_t>(w + 1));
          write_stream(dir + "/" + train_name(w), train, n);
        }
        std::printf("wrote %s/%s and %lld train stream(s) of %lld examples (%s)\n", dir.c_str(),
                    test_name.c_str(), static_cast<long long>(flags.get_int("write_workers")),
                    static_cast<long long>(n), train_name(0).c_str());
      };
      const auto numbered = [](const char* ext) {
        return [ext](std::int64_t w) {
          char name[32];
          std::snprintf(name, sizeof name, "train-%05lld.%s", static_cast<long long>(w), ext);
          return std::string(name);
        };
      };
      if (format == "bin")
        write([](std::int64_t w) { return "train_" + std::to_string(w) + ".bin"; }, "test.bin",
              ctr::write_examples);
      else if (format == "tfrecord")
        write(numbered("tfrecord"), "test.tfrecord", ctr::write_tfrecord);
      else if (format == "tsv")
        write(numbered("tsv"), "test.tsv", ctr::write_tsv);
      else
        throw loom::invalid_argument_error("--write_formats: '" + format +
                                           "' is not bin, tfrecord or tsv");
    }
    std::fflush(stdout);
    return 0;
  }

  const auto role = loom::resolve_cluster(flags).require_task();
  const std::string job = role.job_name;
  const std::int64_t task_index = role.task_index;
  const auto& cluster = role.cluster;
  const int num_workers = cluster.num_tasks("worker");
  loom::server server(cluster, job, static_cast<int>(task_index),
                      {.intra_op_threads = static_cast<int>(flags.get_int("intra_op_threads"))});
  if (job == "ps") {
    server.join();
    rusage usage{};
    ::getrusage(RUSAGE_SELF, &usage); // ru_maxrss: KiB on Linux
    std::printf("ps %lld: peak resident memory %.0f MB\n", static_cast<long long>(task_index),
                static_cast<double>(usage.ru_maxrss) * 1024 / 1e6);
    std::fflush(stdout);
    return 0;
  }
  const bool is_chief = task_index == 0;

  loom::graph g;
  const std::string worker_task = "/job:worker/task:" + std::to_string(task_index);
  // TF's deployment of a click model: the tables on CPU ps tasks, each worker's dense
  // network (the MLP, the wide part's weights, the loss and their gradients) on its GPU. The
  // rows a step gathers come from the ps to the worker's host, are copied to the GPU once,
  // and their gradients are summed per distinct row there before they go back as rows.
  const std::string worker_device =
      loom::examples::worker_device(worker_task, task_index, flags.get_int("num_gpus"));
  auto scope = g.device(loom::make_replica_device_setter(
      cluster, {.ps_device = "/job:ps/cpu:0", .worker_device = worker_device}));
  auto global_step = loom::create_global_step(g);
  const ctr::generator sample(data, 0);
  const ctr::model_options model_options{
      .vocab = sample.vocab(),
      .embedding_dim = flags.get_int("embedding_dim"),
      .hidden = parse_list("hidden_units", flags.get_string("hidden_units")),
      .shards = flags.get_int("shards"),
      .seed = flags.get_int("seed"),
      .hash_tables = flags.get_bool("hash_embeddings"),
      .admit_after = flags.get_int("admit_after"),
      .max_rows_per_shard = flags.get_int("max_rows_per_shard"),
      .steps_to_live = flags.get_int("steps_to_live"),
      .evict_when_full = flags.get_bool("evict_when_full"),
      .disk_tier_dir = flags.get_string("disk_tier_dir")};
  // From files: the model reads what the iterator gives each step, on this worker.
  const std::string train_files = flags.get_string("train_files");
  const std::string format = flags.get_string("format");
  std::optional<ctr::file_batch_handles> file_inputs;
  std::optional<loom::output<float, 0>> input_wait;
  if (!train_files.empty()) {
    if (format == "tsv" && flags.get_string("test_files").empty())
      throw loom::invalid_argument_error("--format=tsv needs --test_files (its ids are hashed)");
    auto it = loom::make_one_shot_iterator(
        g, ctr::file_batches(train_files, format, num_workers, task_index, batch_size,
                             static_cast<int>(flags.get_int("input_threads")), sample.vocab()));
    file_inputs = it.get_next();
    input_wait = it.wait_ms();
  }
  ctr::wide_deep model = file_inputs
                             ? ctr::wide_deep(g, model_options, ctr::inputs_of(*file_inputs))
                             : ctr::wide_deep(g, model_options);
  std::int64_t rows = 0;
  for (std::int64_t v : sample.vocab())
    rows += v;
  // The tables' bytes with their Adagrad slots: a row per id of the vocabularies, or
  // the hash tables' capacities (allocated when initialized) with their keys.
  double table_bytes =
      static_cast<double>(rows) * static_cast<double>(flags.get_int("embedding_dim") + 1) * 4 * 2;
  if (model_options.hash_tables) {
    table_bytes = 0;
    for (const auto* tables : {&model.deep_hashed, &model.wide_hashed})
      for (const auto& t : *tables)
        for (const auto& shard : t.shards())
          table_bytes += static_cast<double>(shard.rows.node().shape[0]) *
                         static_cast<double>(t.dim() * 4 * 2 + 8);
  }
  if (is_chief)
    std::printf("ctr: %d fields, %lld ids in the vocabularies%s (%.0f MB of tables with their "
                "Adagrad slots), %lld shards per table over %d ps task(s)\n",
                ctr::num_fields, static_cast<long long>(rows),
                model_options.hash_tables ? ", hash tables" : ", a row each", table_bytes / 1e6,
                static_cast<long long>(flags.get_int("shards")), cluster.num_tasks("ps"));

  // With hash tables: the rows the deep tables hold (a size a user can read), those on
  // disk, the ids waiting for admission and the ids evicted.
  std::optional<loom::output<std::int64_t, 0>> hashed_rows, disk_rows, waiting_ids, evicted_ids;
  for (const auto& t : model.deep_hashed) {
    hashed_rows = hashed_rows ? loom::lower(*hashed_rows + t.size()) : t.size();
    disk_rows = disk_rows ? loom::lower(*disk_rows + t.on_disk()) : t.on_disk();
    waiting_ids = waiting_ids ? loom::lower(*waiting_ids + t.waiting()) : t.waiting();
    evicted_ids = evicted_ids ? loom::lower(*evicted_ids + t.evicted()) : t.evicted();
  }

  loom::adagrad_optimizer adagrad{flags.get_float("learning_rate")};
  std::unique_ptr<loom::sync_replicas_optimizer> sync;
  std::int64_t replicas_to_aggregate = 1;
  std::optional<loom::operation> train_step;
  if (flags.get_bool("sync_replicas")) {
    replicas_to_aggregate = flags.get_int("replicas_to_aggregate") > 0
                                ? flags.get_int("replicas_to_aggregate")
                                : num_workers;
    sync = std::make_unique<loom::sync_replicas_optimizer>(
        adagrad, loom::sync_replicas_options{
                     .replicas_to_aggregate = static_cast<int>(replicas_to_aggregate),
                     .total_num_replicas = num_workers,
                     .barrier_timeout = std::chrono::seconds(flags.get_int("barrier_timeout_secs")),
                     .name = "ctr_sync_replicas"});
    train_step = sync->minimize(model.loss, global_step);
  } else {
    train_step = adagrad.minimize(model.loss, global_step);
  }

  // What the chief's summary_saver_hook writes for TensorBoard (merge_all_summaries), with
  // examples/s (monitored_session_options::examples_per_global_step). The histograms are of
  // what the step has on the worker anyway: the rows the batch looked up (a table whole would
  // cross the network and be bucketed at every summary: 66 M floats at --max_vocab 10^6) and
  // the dense weights.
  loom::scalar_summary("loss", model.loss);
  if (input_wait)
    loom::scalar_summary("input_wait_ms", *input_wait);
  loom::scalar_summary("auc", batch_auc(model));
  loom::histogram_summary("embeddings/deep", loom::concat(model.deep_embedded, 1));
  loom::histogram_summary("embeddings/wide", loom::concat(model.wide_embedded, 1));
  for (std::size_t k = 0; k < model.dnn_kernels.size(); ++k)
    loom::histogram_summary("dnn/layer_" + std::to_string(k) + "/kernel", model.dnn_kernels[k]);
  loom::histogram_summary("linear/dense_weights", *model.dense_weights);
  // The deep hash tables' shards: rows held and made, ids waiting and evicted, hit rate, bytes.
  for (const auto& t : model.deep_hashed)
    t.add_summaries();

  // Without --checkpoint_dir the chief checkpoints into a directory of its own, as the seed's
  // mnist_replica does, and removes it when it ends: at the default vocabulary the tables and
  // their Adagrad slots make each checkpoint about half a gigabyte, too much to leave behind.
  std::string checkpoint_dir = flags.get_string("checkpoint_dir");
  std::optional<removed_at_exit> scratch_checkpoints;
  if (checkpoint_dir.empty() && is_chief) {
    scratch_checkpoints.emplace(std::filesystem::temp_directory_path() /
                                ("ctr-" + std::to_string(::getpid())));
    checkpoint_dir = scratch_checkpoints->path.string();
  }
  const std::string label = "Worker " + std::to_string(task_index);
  loom::monitored_session_options o{
      .master = server.target(),
      .is_chief = is_chief,
      .num_workers = num_workers,
      .checkpoint_dir = checkpoint_dir,
      .save_checkpoint_secs = flags.get_float("save_checkpoint_secs"),
      .save_increment_steps = flags.get_int("save_increment_steps"),
      .sharded_checkpoints = flags.get_bool("sharded_checkpoints"),
      .checkpoint_format = loom::checkpoint_format_from(flags.get_string("checkpoint_format")),
      .summary_dir = flags.get_string("logdir"),
      .save_summaries_steps = flags.get_int("save_summaries_steps"),
      .examples_per_global_step = batch_size * replicas_to_aggregate,
      .hooks = {std::make_shared<loom::stop_at_step_hook>(flags.get_int("train_steps")),
                std::make_shared<loom::nan_guard_hook>(model.loss.id()),
                std::make_shared<loom::logging_hook>(
                    model.loss.id(),
                    loom::logging_options{.label = label,
                                          .every_n_steps = flags.get_int("log_every"),
                                          .batch_size = batch_size,
                                          .examples_per_global_step =
                                              batch_size * replicas_to_aggregate,
                                          .last_step = flags.get_int("train_steps")})},
      .sync_replicas = sync.get(),
      // Soft placement: with --num_gpus, what has no GPU kernel (the summaries, the AUC's
      // sort) stays on the worker's CPU, as in TF.
      .config = {.allow_soft_placement = true,
                 .device_filters = {"/job:ps", worker_task},
                 .step_timeout = std::chrono::milliseconds(0)},
      .shutdown_wait = std::chrono::seconds(flags.get_int("shutdown_wait_secs")),
      .label = label};
  std::printf("%s: %s\n", label.c_str(),
              is_chief ? "Initializing session..." : "Waiting for session to be initialized...");
  std::fflush(stdout);
  loom::monitored_training_session sess(g, std::move(o));
  std::printf("%s: Session initialization complete.\n", label.c_str());
  std::fflush(stdout);

  // The data: generated here, or read from the files --write_data wrote.
  const std::string data_dir = flags.get_string("data_dir");
  auto source = [&](const std::string& file, std::uint64_t stream) {
    return data_dir.empty() ? ctr::example_source(data, stream)
                            : ctr::example_source(ctr::read_examples(data_dir + "/" + file));
  };
  using clock = std::chrono::steady_clock;
  const auto begin = clock::now();
  std::int64_t local_step = 0;
  if (file_inputs) { // each step reads its batch from the pipeline, no feed
    while (!sess.should_stop()) {
      sess.run(*train_step);
      local_step += !sess.input_ended(); // the step that found the end trained on nothing
    }
  } else {
    ctr::example_source train = source("train_" + std::to_string(task_index) + ".bin",
                                       static_cast<std::uint64_t>(task_index + 1));
    std::vector<ctr::example> batch(static_cast<std::size_t>(batch_size));
    while (!sess.should_stop()) {
      for (auto& e : batch)
        e = train.next();
      sess.run(*train_step, model.feeds(batch));
      ++local_step;
    }
  }
  const double secs = std::chrono::duration<double>(clock::now() - begin).count();
  std::printf("%s: Training ends: %lld local steps, global step %lld, %.1f s (%.0f examples/s "
              "on this worker)\n",
              label.c_str(), static_cast<long long>(local_step),
              static_cast<long long>(sess.global_step()), secs,
              static_cast<double>(local_step * batch_size) / secs);
  std::fflush(stdout);
  const auto [test_auc, teacher_auc] =
      file_inputs && !flags.get_string("test_files").empty()
          ? evaluate_files(sess.raw_session(), model, *file_inputs,
                           ctr::file_batches(flags.get_string("test_files"), format, 1, 0, 4096,
                                             static_cast<int>(flags.get_int("input_threads")),
                                             sample.vocab(), /*drop_remainder=*/false),
                           ctr::example_source(data, 0))
          : evaluate(sess.raw_session(), model, source("test.bin", 0),
                     flags.get_int("test_examples"));
  std::printf("%s: test AUC = %.4f (the teacher's AUC, the best possible: %.4f)\n", label.c_str(),
              test_auc, teacher_auc);
  if (hashed_rows)
    std::printf("%s: the hash-table embeddings hold %lld rows (%lld of them on disk); about "
                "%lld more ids wait for admission; %lld were evicted\n",
                label.c_str(), static_cast<long long>(sess.raw_session().run(*hashed_rows)),
                static_cast<long long>(sess.raw_session().run(*disk_rows)),
                static_cast<long long>(sess.raw_session().run(*waiting_ids)),
                static_cast<long long>(sess.raw_session().run(*evicted_ids)));
  std::fflush(stdout);
  sess.close();
  return 0;
} catch (const loom::error& e) {
  std::cerr << "ctr: " << e.what() << "\n";
  return 1;
} catch (const std::exception& e) {
  std::cerr << "ctr: " << e.what() << "\n";
  return 1;
}

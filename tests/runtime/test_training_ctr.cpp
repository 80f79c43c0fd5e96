// examples/ctr as processes: the wide & deep click model's partitioned tables trained with
// sparse updates, async and with sync replicas and hash-table embeddings, from its click logs
// in memory, as TFRecord and as TSV files; a ps killed and restarted from incremental
// checkpoints. A CTest entry of its own (training_ctr) in
// test_training_processes.
#include "training_cluster.hpp"

#include <loom/train/incremental_saver.hpp>

#include <memory>

using namespace loom::testing::training;

// -- examples/ctr: the wide & deep click model with sharded embeddings -----------------------

namespace {

void require_ctr() {
  if (const std::string why = lt::missing_example("ctr"); !why.empty())
    FAIL(why);
}

// (the model's test AUC, the teacher's) as a worker printed them.
std::pair<double, double> aucs(const std::string& out) {
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_search(out, m,
                                    std::regex("test AUC = ([0-9.]+) \\(the teacher's AUC, the "
                                               "best possible: ([0-9.]+)\\)")),
                  out);
  return {std::stod(m[1].str()), std::stod(m[2].str())};
}

// Small tables (169 248 rows) and a high learning rate: the teacher's AUC within 0.03 in
// 1000 async steps (0.019 short of it; 2500 steps at 10^5 rows and 0.1 came 0.020 short).
std::vector<std::string> ctr_flags(const temp_dir& d, const std::string& steps) {
  return {"--train_steps=" + steps, "--max_vocab=20000", "--learning_rate=0.5",
          "--test_examples=20000",  "--log_every=500",   "--checkpoint_dir=" + d.path.string(),
          "--shutdown_wait_secs=30"};
}

} // namespace

TEST_CASE("examples/ctr, async, 1 ps + 2 workers: partitioned tables trained with sparse updates "
          "reach the teacher's AUC within 0.03" *
          lt::needs_examples()) {
  require_ctr();
  cluster_flags cf(1, 2);
  temp_dir dir;
  lt::child ps(lt::example("ctr"), cf.task("ps", 0));
  lt::child w0(lt::example("ctr"), args(cf.task("worker", 0), ctr_flags(dir, "1000")));
  lt::child w1(lt::example("ctr"), args(cf.task("worker", 1), ctr_flags(dir, "1000")));
  expect_exit(w0, 0, 300s);
  expect_exit(w1, 0, 60s);
  expect_exit(ps, 0, 60s);
  CHECK(final_global_step(w0.output()) == local_steps(w0.output()) + local_steps(w1.output()));
  for (const lt::child* w : {&w0, &w1}) {
    const auto [model, teacher] = aucs(w->output());
    INFO(w->output());
    CHECK(model > 0.8);
    CHECK(model >= teacher - 0.03);
  }
  check_event_file_tags(dir, {"loss", "auc", "examples/s", "embeddings/deep", "embeddings/wide",
                              "dnn/layer_0/kernel", "linear/dense_weights"});
  // ctr saves sharded by default, in TF's format: the ps task wrote the tables' data file
  // of the final checkpoint, the chief the partitioning records' and the index.
  const auto latest = loom::latest_checkpoint(dir.path.string());
  REQUIRE(latest);
  const loom::tensor_bundle::reader r(*latest);
  CHECK(r.num_shards() == 2);
  REQUIRE(r.find("global_step"));
  CHECK(r.find("global_step")->shard_id == 0);
}

TEST_CASE("examples/ctr --num_gpus beyond the process's GPUs: one error naming the flag" *
          lt::needs_examples()) {
  require_ctr();
  cluster_flags cf(1, 1);
  // The worker refuses before it asks anything of the ps, which need not run.
  lt::child w0(lt::example("ctr"), args(cf.task("worker", 0), {"--num_gpus=64"}));
  expect_exit(w0, 1, 60s);
  INFO(w0.output());
  CHECK(contains(w0.output(), "--num_gpus=64 but this process has "));
  CHECK(contains(w0.output(), "GPU(s): a build with CUDA (LOOM_ENABLE_CUDA) on a machine with "
                              "GPUs is needed"));
}

TEST_CASE("examples/ctr without --checkpoint_dir: the chief checkpoints into a temporary "
          "directory and removes it when it ends" *
          lt::needs_examples()) {
  require_ctr();
  cluster_flags cf(1, 1);
  temp_dir tmp; // the tasks' TMPDIR, where the chief makes its directory
  const lt::env_overrides env{{"TMPDIR", tmp.path.string()}};
  lt::child ps(lt::example("ctr"), cf.task("ps", 0), env);
  lt::child w0(lt::example("ctr"),
               args(cf.task("worker", 0), {"--train_steps=50", "--max_vocab=2000",
                                           "--test_examples=1000", "--log_every=50"}),
               env);
  expect_exit(w0, 0, 120s);
  expect_exit(ps, 0, 60s);
  INFO(w0.output());
  // It saved there (a checkpoint at the first step and one at the end), and left nothing.
  CHECK(contains(w0.output(), "saved checkpoint " + (tmp.path / "ctr-").string()));
  CHECK(std::filesystem::is_empty(tmp.path));
}

TEST_CASE("examples/ctr from its click logs written as TFRecord and as TSV files, 1 ps + 1 "
          "worker: each step reads its batch through the input pipeline until the files end, "
          "and both train the model as the logs in memory do" *
          lt::needs_examples()) {
  require_ctr();
  temp_dir dir;
  const std::vector<std::string> data_flags{"--max_vocab=20000", "--test_examples=5000",
                                            "--learning_rate=0.5"};
  {
    lt::child write(lt::example("ctr"),
                    args({"--write_data=" + dir.path.string(), "--write_formats=tfrecord,tsv",
                          "--write_workers=1", "--write_examples=76800"},
                         data_flags));
    expect_exit(write, 0, 120s);
  }
  for (const std::string format : {"tfrecord", "tsv"}) {
    CAPTURE(format);
    cluster_flags cf(1, 1);
    temp_dir ckpt;
    lt::child ps(lt::example("ctr"), cf.task("ps", 0));
    lt::child w0(lt::example("ctr"),
                 args(args(cf.task("worker", 0), data_flags),
                      {"--train_files=" + (dir.path / ("train-*." + format)).string(),
                       "--test_files=" + (dir.path / ("test." + format)).string(),
                       "--format=" + format, "--train_steps=100000", "--log_every=100",
                       "--checkpoint_dir=" + ckpt.path.string()}));
    expect_exit(w0, 0, 180s);
    expect_exit(ps, 0, 60s);
    INFO(w0.output());
    // The end of the files ended training: 76 800 examples are 300 batches of 256.
    CHECK(local_steps(w0.output()) == 300);
    const auto [model, teacher] = aucs(w0.output());
    CHECK(model > 0.75);
    CHECK(model <= teacher);
  }
}

// Sync replicas and hash tables in one run: the partitioned tables' sync path is
// tested in process (test_sync), the hash tables' async one too (test_distributed).
TEST_CASE("examples/ctr with hash-table embeddings and sync replicas, 1 ps + 2 workers: sparse "
          "accumulators, one global step per aggregated update, rows made at an id's second "
          "lookup (admission), full shards evicting, the teacher's AUC within 0.03" *
          lt::needs_examples()) {
  require_ctr();
  cluster_flags cf(1, 2);
  temp_dir dir;
  lt::child ps(lt::example("ctr"), cf.task("ps", 0));
  lt::child w0(lt::example("ctr"), args(cf.task("worker", 0), ctr_flags(dir, "800"),
                                        "--hash_embeddings", "--admit_after=2", "--sync_replicas",
                                        "--max_rows_per_shard=3000", "--evict_when_full"));
  lt::child w1(lt::example("ctr"), args(cf.task("worker", 1), ctr_flags(dir, "800"),
                                        "--hash_embeddings", "--admit_after=2", "--sync_replicas",
                                        "--max_rows_per_shard=3000", "--evict_when_full"));
  expect_exit(w0, 0, 300s);
  expect_exit(w1, 0, 60s);
  expect_exit(ps, 0, 60s);
  check_took_part_in_every_update(w0, 800);
  check_took_part_in_every_update(w1, 800);
  for (const lt::child* w : {&w0, &w1}) {
    const auto [model, teacher] = aucs(w->output());
    INFO(w->output());
    CHECK(model > 0.8);
    CHECK(model >= teacher - 0.03);
    // Only ids seen twice have rows; those seen once wait; the largest fields' shards (12 564
    // rows for their vocabularies) hold 3 000 and evict. Held and waiting are fewer than the
    // 169 248 ids of the vocabularies; with the evicted, most of them.
    const auto held = captured(w->output(), "hash-table embeddings hold ([0-9]+) rows");
    const auto waiting = captured(w->output(), "about ([0-9]+) more ids wait for admission");
    const auto evicted = captured(w->output(), "; ([0-9]+) were evicted");
    REQUIRE(held.size() == 1);
    REQUIRE(waiting.size() == 1);
    REQUIRE(evicted.size() == 1);
    CHECK(held[0] > 50000);
    CHECK(waiting[0] > 5000);
    CHECK(evicted[0] > 10000);
    CHECK(held[0] + waiting[0] + evicted[0] > 100000);
    CHECK(held[0] + waiting[0] < 169248);
  }
}

TEST_CASE("examples/ctr, hash tables with a disk tier, admission and incremental checkpoints: "
          "the ps killed after a full checkpoint and 5 increments, restarted, resumes from the "
          "newest increment" *
          lt::needs_examples()) {
  require_ctr();
  cluster_flags cf(1, 2);
  temp_dir dir;
  auto flags = [&](int task) {
    return args(cf.task("worker", task), ctr_flags(dir, "1500"), "--hash_embeddings",
                "--max_rows_per_shard=3000", "--admit_after=2",
                "--disk_tier_dir=" + (dir.path / "tier").string(), "--save_checkpoint_secs=0",
                "--save_increment_steps=50");
  };
  auto ps = std::make_unique<lt::child>(lt::example("ctr"), cf.task("ps", 0));
  lt::child w0(lt::example("ctr"), flags(0));
  lt::child w1(lt::example("ctr"), flags(1));
  const auto deadline = std::chrono::steady_clock::now() + 180s;
  while (captured(w0.output(), "saved incremental checkpoint [^\n]*model.ckpt-([0-9]+)").size() <
         5) {
    REQUIRE_MESSAGE(w0.running(), w0.report());
    REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline, w0.report());
    std::this_thread::sleep_for(10ms);
  }
  ps->kill();
  const auto killed = std::chrono::steady_clock::now();
  const std::size_t restored_before = captured(w0.output(), "restored [^\n]*ckpt-([0-9]+)").size();
  ps = std::make_unique<lt::child>(lt::example("ctr"), cf.task("ps", 0));
  while (captured(w0.output(), "restored [^\n]*ckpt-([0-9]+)").size() == restored_before) {
    REQUIRE_MESSAGE(w0.running(), w0.report());
    REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline + 60s, w0.report());
    std::this_thread::sleep_for(10ms);
  }
  const double resumed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  expect_exit(w0, 0, 300s);
  expect_exit(w1, 0, 60s);
  expect_exit(*ps, 0, 60s);
  // The chief restored the newest increment it had saved, whose chain is a full checkpoint
  // and the increments after it.
  std::smatch m;
  const std::string out = w0.output();
  REQUIRE_MESSAGE(std::regex_search(out, m, std::regex("restored ([^\n]*model.ckpt-[0-9]+)")), out);
  const std::string restored = m[1].str();
  CHECK_MESSAGE(loom::incremental_saver::is_increment(restored), restored);
  const auto saved = captured(out.substr(0, out.find("restored " + restored)),
                              "saved incremental checkpoint [^\n]*model.ckpt-([0-9]+)");
  REQUIRE(saved.size() >= 5);
  CHECK(restored.ends_with("model.ckpt-" + std::to_string(saved.back())));
  MESSAGE("the ps killed after " << saved.size() << " increments; the chief restored " << restored
                                 << " " << resumed << " s after the kill");
  for (const lt::child* w : {&w0, &w1}) {
    const auto [model, teacher] = aucs(w->output());
    INFO(w->output());
    CHECK(model > 0.75);
  }
  for (const auto& f : loom::detail::checkpoint_files_in(dir.path.string()))
    if (loom::incremental_saver::is_increment(f))
      CHECK_MESSAGE(loom::checkpoint_reader(f).all_ok(), f);
  // The restarted ps's tables kept rows on disk (its tiers restored, then trained on).
  const auto on_disk = captured(out, "rows \\(([0-9]+) of them on disk\\)");
  REQUIRE_MESSAGE(on_disk.size() == 1, out);
  CHECK(on_disk[0] > 0);
}

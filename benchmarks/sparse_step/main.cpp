// The step of an embedding model on a parameter-server cluster, as the table
// grows: what a step costs must depend on the batch, not on the table.
//
// The cluster (2 ps tasks, 1 worker) runs in this process as loom::server
// objects on loopback TCP. The model: a table of N rows x 16, partitioned in
// 2 shards ("mod") dealt over the 2 ps tasks; a batch of B examples x 26 ids
// drawn from a Zipf distribution over the N rows; logit = the sum of the
// looked-up rows times a weight vector; sigmoid cross entropy against random
// labels; Adagrad. A step sends each shard only its distinct ids and gets
// their rows; the gradient goes back as rows and ids, applied in place.
//
//   1. tables of 10^5, 10^6, 10^7 and 5 x 10^7 rows at B = 1024: median step
//      time and bytes on the wire per step, each against the 10^5 table (the
//      baseline); (a) with the same ids in every table (Zipf over 10^5 items
//      spread over the table), what the table's size alone costs, target: 5 x
//      10^7 within 1.2 x of 10^5; (b) Zipf over the whole table, where a
//      larger vocabulary brings more distinct ids per batch.
//   2. B = 256, 1024, 4096 at 10^6 rows (Zipf over them): the bytes grow with
//      the batch.
//
// Bytes on the wire: the loopback interface's transmitted bytes
// (/proc/net/dev) over the steps, both directions (anything else using
// loopback meanwhile counts too: run it on a quiet machine). Beside them,
// what moving the table whole would cost (a pull and a push of 2 x N x 16 x 4
// bytes), the dense equivalent.
//
//   3. with --tf: examples/ctr (1 ps + 2 workers, async, loom-launch) against
//      the same model in TensorFlow (benchmarks/tf/ctr_tf.py, 1 ps + 2 worker
//      processes, tf.compat.v1) on the same files (`ctr --write_data`):
//      examples/s per worker with both workers training, and the test AUC of
//      each, alternating loom and TF runs (--rounds, medians). TensorFlow is
//      installed from PyPI (tensorflow-cpu 2.15.1) into a virtual environment
//      in the build directory by this benchmark, never by `make test`; where
//      that fails, part 3 says so and the benchmark exits 1. `--threads=N`
//      gives each task of both N threads (loom's --intra_op_threads, TF's
//      intra_op_parallelism_threads and inter_op_parallelism_threads); by
//      default each framework's own, one per core (3 tasks share this
//      machine's cores, so each task's pool oversubscribes them).
//      Where jemalloc's shared library is installed, each round also runs TF with
//      it preloaded (TF's CPU guides advise it; loom's programs link it), and the
//      ratio against that run is printed beside the stock one.
//
//   4. with --big: a model whose tables total more than 4 GiB (4 tables of
//      18 x 10^6 x 16 floats, 4.6 GB), each in 2 shards over 2 ps tasks,
//      trains a few steps with sparse SGD, is checkpointed (one file fetched by
//      the saver, then sharded: each ps writes its own), and the sharded
//      checkpoint is restored into a cluster of 3 ps tasks with each table in 3
//      shards; every looked-up row must equal its value before the save. Prints
//      the time of each phase.
//
// `sparse_step --smoke` runs one small table for a few steps (a test that it
// still runs; its figures mean nothing; part 4 at 1000 rows a table). `--max_rows=N` stops
// part 1 there; `--only_tf` and `--only_big` run part 3 or 4 alone.
#include "../bench_util.hpp"
#include "../raw_tcp.hpp"

#ifndef LOOM_CTR
#define LOOM_CTR ""
#define LOOM_LAUNCH ""
#endif

#include <loom/loom.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using clk = std::chrono::steady_clock;

constexpr std::int64_t dim = 16, fields = 26;

// Bytes the loopback interface has transmitted, or -1 where it cannot be read.
long long loopback_bytes() {
  std::ifstream in("/proc/net/dev");
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos)
      continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name != "lo")
      continue;
    std::istringstream fields_in(line.substr(colon + 1));
    long long v[9] = {};
    for (long long& x : v)
      fields_in >> x;
    return v[8]; // the first transmit column
  }
  return -1;
}

// Zipf(1.2) ranks over `ranks` items, scattered over a table of n rows by a
// fixed map (rank * a mod n, a odd and large): the same ranks give the same
// number of distinct rows per batch in any table, spread over all of it.
class zipf_ids {
public:
  zipf_ids(std::int64_t ranks, std::int64_t n, std::uint64_t seed)
      : ranks_(ranks), n_(n), rng_(seed) {}
  std::int64_t next() {
    const double s = 1.2, u = std::uniform_real_distribution<double>()(rng_);
    const double x = std::pow(1.0 - u + u * std::pow(static_cast<double>(ranks_) + 1.0, 1.0 - s),
                              1.0 / (1.0 - s));
    const auto rank = std::clamp<std::int64_t>(static_cast<std::int64_t>(x) - 1, 0, ranks_ - 1);
    return static_cast<std::int64_t>((static_cast<std::uint64_t>(rank) * 2654435761ULL) %
                                     static_cast<std::uint64_t>(n_));
  }

private:
  std::int64_t ranks_, n_;
  std::mt19937_64 rng_;
};

struct result {
  double step_seconds;
  double bytes_per_step; // -1: unknown
  double init_seconds;
};

// `ranks`: ids are Zipf over that many items (the whole table where it is rows).
result measure(loom::server& worker, std::int64_t rows, std::int64_t ranks, std::int64_t batch,
               int steps) {
  loom::graph g;
  auto scope =
      g.device(loom::replica_device_setter({.ps_tasks = 2, .worker_device = "/job:worker/task:0"}));
  loom::placeholder<std::int64_t, 2> ids(g, loom::shape{-1, fields}, "ids");
  loom::placeholder<float, 2> labels(g, loom::shape{-1, 1}, "labels");
  auto table = loom::get_variable<float, 2>(
      g, "table", loom::shape{rows, dim},
      loom::random_uniform_initializer{.minval = -0.05, .maxval = 0.05, .seed = 1},
      loom::fixed_size_partitioner{2});
  loom::variable<float, 2> w(g, "w", loom::shape{dim, 1},
                             loom::random_uniform_initializer{-0.1, 0.1, 2});
  auto looked_up = loom::embedding_lookup(table, ids); // [B, 26, 16]
  auto pooled = loom::reduce_sum(looked_up, 1);        // [B, 16]
  auto logit = loom::matmul(loom::lower(pooled), w);
  auto loss =
      loom::lower(loom::reduce_mean(loom::sigmoid_cross_entropy_with_logits(labels, logit)));
  auto train = loom::adagrad_optimizer{0.05}.minimize(loss);

  loom::session s(g, worker.target());
  const auto t0 = clk::now();
  s.run(loom::global_variables_initializer(g));
  const double init = std::chrono::duration<double>(clk::now() - t0).count();

  zipf_ids draw(ranks, rows, 7);
  std::mt19937 coin(3);
  auto feeds = [&] {
    loom::tensor<std::int64_t, 2> x(loom::shape{batch, fields});
    loom::tensor<float, 2> y(loom::shape{batch, 1});
    for (std::int64_t i = 0; i < batch; ++i) {
      for (std::int64_t f = 0; f < fields; ++f)
        x(i, f) = draw.next();
      y(i, 0) = static_cast<float>(coin() & 1u);
    }
    return loom::feed_dict{{ids, x}, {labels, y}};
  };
  // Batches made before the clock starts: the step is measured, not the sampler.
  std::vector<loom::feed_dict> made;
  for (int i = 0; i < 8; ++i)
    made.push_back(feeds());
  for (int i = 0; i < 3; ++i)
    s.run(train, made[static_cast<std::size_t>(i) % made.size()]);
  int k = 0;
  const long long before = loopback_bytes();
  const double secs = loom::bench::median_seconds(
      [&] { s.run(train, made[static_cast<std::size_t>(k++) % made.size()]); }, steps);
  const long long after = loopback_bytes();
  loom::session::reset(worker.target()); // frees the table on the ps tasks
  return {secs, before < 0 || after < 0 ? -1.0 : static_cast<double>(after - before) / k, init};
}

// -- part 3: examples/ctr against TensorFlow ------------------------------------------------

struct ctr_run {
  double rate = 0; // examples/s per worker, the mean of the workers'
  double auc = 0;  // worker 0's test AUC
  double teacher = 0;
};

// The mean of the per-worker rates and the first AUC a run printed.
ctr_run parse_ctr(const std::string& out, const std::string& what) {
  ctr_run r;
  int workers = 0;
  for (std::size_t at = out.find("examples/s on this worker"); at != std::string::npos;
       at = out.find("examples/s on this worker", at + 1)) {
    const std::size_t open = out.rfind('(', at);
    r.rate += std::stod(out.substr(open + 1, at - open - 1));
    ++workers;
  }
  const std::size_t a = out.find("test AUC = ");
  const std::size_t t = out.find("best possible: ");
  if (workers == 0 || a == std::string::npos || t == std::string::npos)
    throw std::runtime_error(what + " printed no rate or AUC:\n" + out);
  r.rate /= workers;
  r.auc = std::stod(out.substr(a + 11));
  r.teacher = std::stod(out.substr(t + 15));
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int compare_with_tensorflow(int rounds, int steps, int threads) {
  namespace fs = std::filesystem;
  using loom::bench::shell_quote;
  const std::string ctr = LOOM_CTR, launch = LOOM_LAUNCH, script = LOOM_CTR_TF;
  if (ctr.empty() || launch.empty()) {
    std::fprintf(stderr, "sparse_step --tf: built without examples/ctr or loom-launch\n");
    return 1;
  }
  const fs::path venv = fs::path(LOOM_BUILD_DIR) / "tf-venv";
  const std::string python = (venv / "bin" / "python").string();
  if (loom::bench::run_command(shell_quote(python) + " -c 'import tensorflow'").status != 0) {
    std::printf("\n3. installing tensorflow-cpu 2.15.1 from PyPI into %s ...\n",
                venv.string().c_str());
    std::fflush(stdout);
    const auto r = loom::bench::run_command("python3 -m venv " + shell_quote(venv.string()) +
                                            " && " + shell_quote((venv / "bin" / "pip").string()) +
                                            " install -q tensorflow-cpu==2.15.1");
    if (r.status != 0) {
      std::fprintf(stderr, "sparse_step --tf: cannot install TensorFlow (is PyPI reachable?):\n%s",
                   r.output.c_str());
      return 1;
    }
  }
  const fs::path data =
      fs::temp_directory_path() / ("sparse_step-ctr-" + std::to_string(::getpid()));
  const std::string common = " --train_steps=" + std::to_string(steps) + " --log_every=100000";
  const std::string loom_threads =
      threads > 0 ? " --intra_op_threads=" + std::to_string(threads) : std::string();
  const std::string tf_threads = threads > 0 ? " --threads " + std::to_string(threads) : "";
  auto write =
      loom::bench::run_command(shell_quote(ctr) + " --write_data=" + shell_quote(data.string()) +
                               common + " --test_examples=20000");
  if (write.status != 0) {
    std::fprintf(stderr, "sparse_step --tf: ctr --write_data failed:\n%s", write.output.c_str());
    return 1;
  }
  // A checkpoint directory per round: one a round before wrote holds global
  // step `steps`, and a chief restoring it trains one step, whose examples/s
  // mean nothing. Both without summaries: ctr_tf.py's MonitoredTrainingSession has
  // save_summaries_steps=None, and ctr's chief would otherwise write histograms
  // every 100 steps.
  // TensorFlow as its pip wheel runs (glibc's malloc), and, where jemalloc's shared library
  // is installed, with it preloaded (TF's CPU performance guides advise tcmalloc or
  // jemalloc; loom's programs link jemalloc): the ratio against each.
#ifdef LOOM_JEMALLOC_SHARED
  const std::string jemalloc = LOOM_JEMALLOC_SHARED;
#else
  const std::string jemalloc;
#endif
  std::vector<double> loom_rate, tf_rate, loom_auc, tf_auc, tf_jemalloc_rate, tf_jemalloc_auc;
  double teacher = 0;
  for (int round = 0; round < rounds; ++round) {
    const auto l = loom::bench::run_command(
        shell_quote(launch) + " --ps 1 --workers 2 -- " + shell_quote(ctr) +
        " --data_dir=" + shell_quote(data.string()) + common + loom_threads +
        " --test_examples=20000 --save_summaries_steps=0 --checkpoint_dir=" +
        shell_quote((data / ("ckpt-" + std::to_string(round))).string()));
    const std::string tf_command = "TF_CPP_MIN_LOG_LEVEL=2 " + shell_quote(python) + " " +
                                   shell_quote(script) + " --data_dir " +
                                   shell_quote(data.string()) + " --train_steps " +
                                   std::to_string(steps) + " --log_every 100000" + tf_threads;
    const auto t = loom::bench::run_command(tf_command);
    const ctr_run lr = parse_ctr(l.output, "loom's ctr");
    const ctr_run tr = parse_ctr(t.output, "TensorFlow's ctr_tf.py");
    loom_rate.push_back(lr.rate);
    tf_rate.push_back(tr.rate);
    loom_auc.push_back(lr.auc);
    tf_auc.push_back(tr.auc);
    teacher = lr.teacher;
    std::printf("   round %d: loom %.0f examples/s per worker (AUC %.4f), TensorFlow %.0f (AUC "
                "%.4f)",
                round + 1, lr.rate, lr.auc, tr.rate, tr.auc);
    if (!jemalloc.empty()) {
      const ctr_run tj = parse_ctr(
          loom::bench::run_command("LD_PRELOAD=" + shell_quote(jemalloc) + " " + tf_command).output,
          "TensorFlow's ctr_tf.py with jemalloc");
      tf_jemalloc_rate.push_back(tj.rate);
      tf_jemalloc_auc.push_back(tj.auc);
      std::printf(", TensorFlow with jemalloc %.0f (AUC %.4f)", tj.rate, tj.auc);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  std::error_code ec;
  fs::remove_all(data, ec);
  std::printf("\n3. examples/ctr, 1 ps + 2 workers, async, %d global steps of 256, medians of %d "
              "alternating runs, %s\n%-24s %22s %12s\n",
              steps, rounds,
              threads > 0 ? (std::to_string(threads) + " thread(s) a task").c_str()
                          : "each framework's default threads",
              "", "examples/s per worker", "test AUC");
  std::printf("%-24s %22.0f %12.4f\n", "TensorFlow 2.15 (v1)", median(tf_rate), median(tf_auc));
  if (!tf_jemalloc_rate.empty())
    std::printf("%-24s %22.0f %12.4f\n", "  with jemalloc", median(tf_jemalloc_rate),
                median(tf_jemalloc_auc));
  std::printf("%-24s %22.0f %12.4f\n", "loom", median(loom_rate), median(loom_auc));
  std::printf("loom / TensorFlow: %.2f x the examples/s; AUC difference %+.4f (the teacher's AUC: "
              "%.4f)\n",
              median(loom_rate) / median(tf_rate), median(loom_auc) - median(tf_auc), teacher);
  if (!tf_jemalloc_rate.empty())
    std::printf("loom / TensorFlow with jemalloc preloaded: %.2f x the examples/s\n",
                median(loom_rate) / median(tf_jemalloc_rate));
  else
    std::printf("(TensorFlow with jemalloc not run: no libjemalloc.so.2 was found at configure "
                "time; Debian: libjemalloc2)\n");
  return 0;
}

// -- part 4: a model of more than 4 GiB, saved on 2 ps tasks, restored on 3 -----------------

struct big_model {
  loom::graph g;
  loom::placeholder<std::int64_t, 1> ids{g, loom::shape{-1}, "ids"};
  std::vector<loom::partitioned_variable<float, 2>> tables;
  std::vector<loom::output<float, 2>> rows;
  std::optional<loom::operation> train;

  big_model(int ps_tasks, std::int64_t table_rows) {
    auto scope = g.device(
        loom::replica_device_setter({.ps_tasks = ps_tasks, .worker_device = "/job:worker/task:0"}));
    std::optional<loom::output<float, 0>> loss;
    for (int t = 0; t < 4; ++t) {
      tables.push_back(loom::get_variable<float, 2>(
          g, "table_" + std::to_string(t), loom::shape{table_rows, dim},
          loom::random_uniform_initializer{.minval = -1, .maxval = 1, .seed = 10 + t},
          loom::fixed_size_partitioner{ps_tasks}));
      rows.push_back(loom::embedding_lookup(tables.back(), ids));
      auto term = loom::lower(loom::reduce_sum(loom::square(rows.back())));
      loss = loss ? loom::lower(*loss + term) : term;
    }
    train = loom::gradient_descent_optimizer{0.01}.minimize(*loss);
  }
};

int big_model_round_trip(std::int64_t table_rows) {
  namespace fs = std::filesystem;
  const double gb = 4.0 * static_cast<double>(table_rows) * dim * 4 / 1e9;
  std::printf("\n4. a model of %.2f GB (4 tables of %lld x %lld floats): 2 ps tasks -> checkpoint "
              "-> 3 ps tasks\n",
              gb, static_cast<long long>(table_rows), static_cast<long long>(dim));
  const fs::path dir =
      fs::temp_directory_path() / ("sparse_step-big-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  loom::tensor<std::int64_t, 1> probe(loom::shape{1000});
  for (std::int64_t i = 0; i < 1000; ++i)
    probe(i) = (i * 7919 * 1000003) % table_rows;
  std::vector<loom::tensor<float, 2>> before;
  auto phase = [](const char* what, clk::time_point t0) {
    std::printf("   %-44s %8.1f s\n", what, std::chrono::duration<double>(clk::now() - t0).count());
    std::fflush(stdout);
  };
  std::string path;
  {
    const auto addrs = loom::bench::raw::free_addresses(3);
    const auto cluster = loom::cluster_spec::from_flags(addrs[0] + "," + addrs[1], addrs[2]);
    loom::server ps0(cluster, "ps", 0), ps1(cluster, "ps", 1), worker(cluster, "worker", 0);
    big_model m(2, table_rows);
    loom::session s(m.g, worker.target());
    auto t0 = clk::now();
    s.run(loom::global_variables_initializer(m.g));
    phase("initialize on 2 ps tasks", t0);
    t0 = clk::now();
    for (int step = 0; step < 20; ++step)
      s.run(*m.train, {{m.ids, probe}});
    phase("20 sparse steps", t0);
    for (const auto& r : m.rows)
      before.push_back(s.run(r, {{m.ids, probe}}));
    // loom's format, whose files this part reports (checkpoint_formats compares TF's).
    loom::saver saver(m.g, {.format = loom::checkpoint_format::loom});
    t0 = clk::now();
    path = saver.save(s, (dir / "model").string());
    phase("save (one file, fetched in groups)", t0);
    std::printf("   checkpoint: %.2f GB\n", static_cast<double>(fs::file_size(path)) / 1e9);
    fs::remove(path);
    // Each ps task writes its own shard, in parallel; the restore below reads them.
    loom::saver sharded(m.g, {.sharded = true, .format = loom::checkpoint_format::loom});
    t0 = clk::now();
    path = sharded.save(s, (dir / "sharded").string());
    phase("save sharded (each ps writes its own shard)", t0);
    for (const auto& shard : loom::checkpoint_reader(path).shard_paths())
      std::printf("   %s: %.2f GB\n", fs::path(shard).filename().c_str(),
                  static_cast<double>(fs::file_size(shard)) / 1e9);
    loom::session::shutdown_cluster(worker.target());
    ps0.join();
    ps1.join();
    worker.join();
  }
  bool same = true;
  {
    const auto addrs = loom::bench::raw::free_addresses(4);
    const auto cluster =
        loom::cluster_spec::from_flags(addrs[0] + "," + addrs[1] + "," + addrs[2], addrs[3]);
    loom::server ps0(cluster, "ps", 0), ps1(cluster, "ps", 1), ps2(cluster, "ps", 2),
        worker(cluster, "worker", 0);
    big_model m(3, table_rows);
    loom::session s(m.g, worker.target());
    auto t0 = clk::now();
    loom::saver(m.g).restore(s, path);
    phase("restore the sharded checkpoint into 3 shards on 3 ps", t0);
    for (std::size_t t = 0; t < m.rows.size(); ++t) {
      const auto after = s.run(m.rows[t], {{m.ids, probe}});
      for (std::int64_t i = 0; i < 1000; ++i)
        for (std::int64_t d = 0; d < dim; ++d)
          same = same && after(i, d) == before[t](i, d);
    }
    loom::session::shutdown_cluster(worker.target());
    ps0.join();
    ps1.join();
    ps2.join();
    worker.join();
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  std::printf("   every probed row as before the save: %s\n", same ? "yes" : "NO");
  return same ? 0 : 1;
}

std::string bytes(double b) {
  char buf[32];
  if (b < 0)
    return "n/a";
  if (b >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2f MB", b / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.1f KB", b / 1e3);
  return buf;
}

} // namespace

int main(int argc, char** argv) try {
  bool smoke = false, tf = false, only_tf = false, big = false, only_big = false;
  int rounds = 3, threads = 0;
  std::int64_t max_rows = 50000000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--smoke")
      smoke = true;
    else if (a == "--tf")
      tf = true;
    else if (a == "--only_tf")
      tf = only_tf = true;
    else if (a == "--big")
      big = true;
    else if (a == "--only_big")
      big = only_big = true;
    else if (a.rfind("--rounds=", 0) == 0)
      rounds = std::max(1, std::stoi(a.substr(9)));
    else if (a.rfind("--max_rows=", 0) == 0)
      max_rows = std::stoll(a.substr(11));
    else if (a.rfind("--threads=", 0) == 0)
      threads = std::max(0, std::stoi(a.substr(10)));
    else {
      std::fprintf(stderr,
                   "sparse_step: unknown argument %s (--smoke, --max_rows=N, --tf, --only_tf, "
                   "--rounds=N, --threads=N, --big, --only_big)\n",
                   a.c_str());
      return 2;
    }
  }
  if (only_tf)
    return compare_with_tensorflow(rounds, 3000, threads);
  if (only_big)
    return big_model_round_trip(18000000);
  const auto addrs = loom::bench::raw::free_addresses(3);
  const auto cluster = loom::cluster_spec::from_flags(addrs[0] + "," + addrs[1], addrs[2]);
  loom::server ps0(cluster, "ps", 0), ps1(cluster, "ps", 1);
  loom::server worker(cluster, "worker", 0);
  std::printf("sparse_step: 2 ps tasks + 1 worker in this process over loopback TCP; a table of N "
              "x %lld (2 shards, one per ps), %lld ids per example, Adagrad\n",
              static_cast<long long>(dim), static_cast<long long>(fields));

  const int steps = smoke ? 3 : 30;
  std::vector<std::int64_t> sizes =
      smoke ? std::vector<std::int64_t>{10000}
            : std::vector<std::int64_t>{100000, 1000000, 10000000, 50000000};
  const std::int64_t batch = smoke ? 64 : 1024;
  // a: the same ids (Zipf over 10^5 items) in every table, so each step
  // touches as many rows: what the table's size alone costs. b: Zipf over the
  // whole table, as a larger vocabulary brings more distinct ids per batch.
  for (const bool whole : {false, true}) {
    std::printf("\n1%s. table size, batch %lld, ids Zipf over %s\n%-12s %12s %10s %16s %10s "
                "%18s %10s\n",
                whole ? "b" : "a", static_cast<long long>(batch),
                whole ? "the whole table" : "10^5 items spread over the table", "rows", "step (ms)",
                "ratio", "wire bytes/step", "ratio", "dense equivalent", "init (s)");
    std::optional<result> base;
    for (std::int64_t n : sizes) {
      if (n > max_rows)
        break;
      const result r =
          measure(worker, n, whole ? n : std::min<std::int64_t>(n, 100000), batch, steps);
      if (!base)
        base = r;
      std::printf("%-12lld %12.2f %10.3f %16s %10.3f %18s %10.1f\n", static_cast<long long>(n),
                  r.step_seconds * 1e3, r.step_seconds / base->step_seconds,
                  bytes(r.bytes_per_step).c_str(),
                  base->bytes_per_step > 0 ? r.bytes_per_step / base->bytes_per_step : 0.0,
                  bytes(2.0 * static_cast<double>(n) * dim * 4).c_str(), r.init_seconds);
      std::fflush(stdout);
    }
    if (smoke)
      break;
  }
  if (!smoke) {
    std::printf("\n2. batch size, 10^6 rows\n%-12s %12s %16s %18s\n", "batch", "step (ms)",
                "wire bytes/step", "bytes per example");
    for (std::int64_t b : {256, 1024, 4096}) {
      const result r = measure(worker, 1000000, 1000000, b, steps);
      std::printf("%-12lld %12.2f %16s %18.0f\n", static_cast<long long>(b), r.step_seconds * 1e3,
                  bytes(r.bytes_per_step).c_str(), r.bytes_per_step / static_cast<double>(b));
      std::fflush(stdout);
    }
  }
  loom::session::shutdown_cluster(worker.target());
  ps0.join();
  ps1.join();
  worker.join();
  int status = tf ? compare_with_tensorflow(rounds, 3000, threads) : 0;
  if (big || smoke)
    status |= big_model_round_trip(smoke ? 1000 : 18000000);
  return status;
} catch (const std::exception& e) {
  std::fprintf(stderr, "sparse_step: %s\n", e.what());
  return 1;
}

// Save and restore times of loom's checkpoint format against TensorFlow's (the
// tensor bundle), on a cluster of 2 ps tasks in this process:
//
//   1. examples/ctr's model (wide_deep at its default vocabularies, every table in 2
//      shards, Adagrad's slots), saved sharded as examples/ctr saves it;
//   2. a large model: 4 tables of `--big_rows` x 16 floats (default 18 x 10^6: 4.61 GB),
//      each in 2 shards, saved as one file fetched by the saver and sharded.
//
// Each round saves and restores in both formats, the order alternating between
// rounds; the medians and their ratio (TF's / loom's) are printed. Every restore is
// checked: a probe of rows equals its value before the save.
//
//   checkpoint_formats [--rounds=N] [--big_rows=N] [--only=ctr|big] [--smoke]
#include "../bench_util.hpp"
#include "../raw_tcp.hpp"
#include "click_data.hpp"
#include "wide_deep.hpp"

#include <loom/loom.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using loom::bench::seconds_of;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// 2 ps tasks and a worker in this process.
struct cluster {
  std::vector<std::string> addrs = loom::bench::raw::free_addresses(3);
  loom::cluster_spec spec = loom::cluster_spec::from_flags(addrs[0] + "," + addrs[1], addrs[2]);
  loom::server ps0{spec, "ps", 0}, ps1{spec, "ps", 1}, worker{spec, "worker", 0};
  ~cluster() {
    loom::session::shutdown_cluster(worker.target());
    ps0.join();
    ps1.join();
    worker.join();
  }
};

struct figures {
  std::map<std::string, std::vector<double>> seconds; // "<what> <format>" -> each round's
  void add(const std::string& what, loom::checkpoint_format f, double s) {
    seconds[what + (f == loom::checkpoint_format::loom ? " loom" : " tf")].push_back(s);
  }
  void print(const std::vector<std::string>& whats) const {
    std::printf("   %-36s %10s %10s %8s\n", "median of rounds (s)", "loom", "TF", "TF/loom");
    for (const auto& w : whats) {
      const double l = median(seconds.at(w + " loom")), t = median(seconds.at(w + " tf"));
      std::printf("   %-36s %10.3f %10.3f %8.3f\n", w.c_str(), l, t, t / l);
    }
    std::fflush(stdout);
  }
};

constexpr loom::checkpoint_format formats[] = {loom::checkpoint_format::loom,
                                               loom::checkpoint_format::tensorflow};
const char* name_of(loom::checkpoint_format f) {
  return f == loom::checkpoint_format::loom ? "loom" : "tf";
}

bool equal(const std::vector<loom::tensor<float, 2>>& a,
           const std::vector<loom::tensor<float, 2>>& b) {
  if (a.size() != b.size())
    return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!std::equal(a[i].flat().begin(), a[i].flat().end(), b[i].flat().begin(), b[i].flat().end()))
      return false;
  return true;
}

int ctr_model(int rounds, const fs::path& dir) {
  const ctr::generator sample({.seed = 1, .min_vocab = 1000, .max_vocab = 1000000}, 0);
  cluster c;
  loom::graph g;
  auto scope = g.device(loom::make_replica_device_setter(
      c.spec, {.ps_device = "/job:ps/cpu:0", .worker_device = "/job:worker/task:0"}));
  auto step = loom::create_global_step(g);
  ctr::wide_deep model(g, {.vocab = sample.vocab(), .shards = 2});
  loom::adagrad_optimizer adagrad{0.05};
  adagrad.minimize(model.loss, step);
  std::int64_t rows = 0;
  for (std::int64_t v : sample.vocab())
    rows += v;
  loom::session s(g, c.worker.target());
  s.run(loom::global_variables_initializer(g));
  std::printf("\n1. examples/ctr's model: %zu fields, %lld table rows, 2 shards each, Adagrad; "
              "sharded saves (each ps writes its own)\n",
              sample.vocab().size(), static_cast<long long>(rows));
  figures f;
  for (int r = 0; r < rounds; ++r)
    for (int k = 0; k < 2; ++k) {
      const auto format = formats[(r + k) % 2];
      loom::saver saver(g, {.max_to_keep = 1, .sharded = true, .format = format});
      std::string path;
      f.add("save", format, seconds_of([&] {
              path = saver.save(s, (dir / (std::string("ctr-") + name_of(format))).string(), r);
            }));
      if (r == 0)
        std::printf("   %s checkpoint: %.1f MB\n", name_of(format),
                    static_cast<double>(loom::bench::checkpoint_bytes(path)) / 1e6);
      f.add("restore", format, seconds_of([&] { saver.restore(s, path); }));
    }
  f.print({"save", "restore"});
  return 0;
}

int big_model(int rounds, std::int64_t table_rows, const fs::path& dir) {
  constexpr std::int64_t dim = 16;
  cluster c;
  loom::graph g;
  loom::placeholder<std::int64_t, 1> ids{g, loom::shape{-1}, "ids"};
  std::vector<loom::output<float, 2>> looked_up;
  std::optional<loom::operation> train; // moves the probed rows between a save and its restore
  {
    auto scope = g.device(loom::make_replica_device_setter(
        c.spec, {.ps_device = "/job:ps/cpu:0", .worker_device = "/job:worker/task:0"}));
    for (int t = 0; t < 4; ++t)
      looked_up.push_back(loom::embedding_lookup(
          loom::get_variable<float, 2>(
              g, "table_" + std::to_string(t), loom::shape{table_rows, dim},
              loom::random_uniform_initializer{.minval = -1, .maxval = 1, .seed = 10 + t},
              loom::fixed_size_partitioner{2}),
          ids));
    std::optional<loom::output<float, 0>> loss;
    for (const auto& rows : looked_up) {
      auto term = loom::lower(loom::reduce_sum(loom::square(rows)));
      loss = loss ? loom::lower(*loss + term) : term;
    }
    train = loom::gradient_descent_optimizer{0.1}.minimize(*loss);
  }
  loom::tensor<std::int64_t, 1> probe_ids(loom::shape{1000});
  for (std::int64_t i = 0; i < 1000; ++i)
    probe_ids(i) = (i * 7919 * 1000003) % table_rows;
  auto probe_all = [&](loom::session& s) {
    std::vector<loom::tensor<float, 2>> out;
    for (const auto& rows : looked_up)
      out.push_back(s.run(rows, {{ids, probe_ids}}));
    return out;
  };
  loom::session s(g, c.worker.target());
  s.run(loom::global_variables_initializer(g));
  const auto before = probe_all(s);
  std::printf("\n2. a model of %.2f GB (4 tables of %lld x %lld floats, 2 shards each on 2 ps "
              "tasks)\n",
              4.0 * static_cast<double>(table_rows) * dim * 4 / 1e9,
              static_cast<long long>(table_rows), static_cast<long long>(dim));
  figures f;
  bool same = true;
  for (int r = 0; r < rounds; ++r)
    for (int k = 0; k < 2; ++k) {
      const auto format = formats[(r + k) % 2];
      const std::string prefix = (dir / (std::string("big-") + name_of(format))).string();
      {
        loom::saver one_file(g, {.max_to_keep = 1, .format = format});
        std::string path;
        f.add("save (one file, by the saver)", format,
              seconds_of([&] { path = one_file.save(s, prefix + "-one", r); }));
        std::error_code ec;
        fs::remove(path, ec);
        fs::remove(path + ".index", ec);
        fs::remove(path + ".data-00000-of-00001", ec);
      }
      loom::saver sharded(g, {.max_to_keep = 1, .sharded = true, .format = format});
      std::string path;
      f.add("save (sharded, each ps its own)", format,
            seconds_of([&] { path = sharded.save(s, prefix, r); }));
      if (r == 0)
        std::printf("   %s checkpoint: %.2f GB\n", name_of(format),
                    static_cast<double>(loom::bench::checkpoint_bytes(path)) / 1e9);
      s.run(*train, {{ids, probe_ids}});
      f.add("restore (read and fed by the saver)", format,
            seconds_of([&] { sharded.restore(s, path); }));
      same = same && equal(before, probe_all(s));
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(dir))
        if (e.path().filename().string().rfind(fs::path(prefix).filename().string(), 0) == 0)
          fs::remove(e.path(), ec);
    }
  f.print({"save (one file, by the saver)", "save (sharded, each ps its own)",
           "restore (read and fed by the saver)"});
  std::printf("   every probed row as before the save: %s\n", same ? "yes" : "NO");
  return same ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) try {
  int rounds = 5;
  std::int64_t big_rows = 18'000'000;
  std::string only;
  bool smoke = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--smoke")
      smoke = true;
    else if (a.rfind("--rounds=", 0) == 0)
      rounds = std::stoi(a.substr(9));
    else if (a.rfind("--big_rows=", 0) == 0)
      big_rows = std::stoll(a.substr(11));
    else if (a.rfind("--only=", 0) == 0)
      only = a.substr(7);
    else {
      std::fprintf(stderr, "usage: checkpoint_formats [--rounds=N] [--big_rows=N] [--only=ctr|big] "
                           "[--smoke]\n");
      return 2;
    }
  }
  if (smoke) {
    rounds = 1;
    big_rows = 1000;
    only = "big";
  }
  const fs::path dir =
      fs::temp_directory_path() / ("checkpoint_formats-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  int failed = 0;
  if (only.empty() || only == "ctr")
    failed += ctr_model(rounds, dir);
  if (only.empty() || only == "big")
    failed += big_model(rounds, big_rows, dir);
  std::error_code ec;
  fs::remove_all(dir, ec);
  return failed ? 1 : 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "checkpoint_formats: %s\n", e.what());
  return 1;
}

// Incremental checkpoints of a hash-table embedding (train/incremental_saver.hpp)
// against full ones, on a ps task and a worker in this process:
//
//   1. a table of --rows ids (2 shards of dim --dim, Adagrad) is filled, then saved
//      whole (the chain's base, sharded: the ps writes its own rows, as examples/ctr
//      saves);
//   2. --increments times: --steps training steps of --batch ids drawn uniformly from
//      the table's, then an increment; its bytes and seconds against the full
//      checkpoint's, and its rows against the distinct ids the steps touched (the goal:
//      the same count, so bytes in proportion to the rows touched);
//   3. the ps and worker are shut down (the table's memory goes with them), a new pair
//      started, and the chain restored: the base, then each increment; every key, row
//      and slot value is compared with the values before the shutdown; then the base
//      alone into another new pair, for scale.
//
//   incremental_checkpoint [--rows=N] [--dim=N] [--steps=N] [--batch=N]
//                          [--increments=N] [--smoke]
#include "../bench_util.hpp"
#include "../raw_tcp.hpp"

#include <loom/loom.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

namespace {

namespace fs = std::filesystem;
using loom::bench::seconds_of;
// A ps task and a worker in this process.
struct cluster {
  std::vector<std::string> addrs = loom::bench::raw::free_addresses(2);
  loom::cluster_spec spec = loom::cluster_spec::from_flags(addrs[0], addrs[1]);
  loom::server ps{spec, "ps", 0}, worker{spec, "worker", 0};
  ~cluster() {
    loom::session::shutdown_cluster(worker.target());
    ps.join();
    worker.join();
  }
};

struct model {
  loom::graph g;
  loom::placeholder<std::int64_t, 1> ids{g, loom::shape{-1}, "ids"};
  std::optional<loom::hash_embedding<float>> table;
  std::optional<loom::output<float, 2>> rows;
  std::optional<loom::operation> train;
  std::vector<loom::node_id> state; // every variable, fetched to compare

  model(const loom::cluster_spec& spec, std::int64_t capacity, std::int64_t dim) {
    auto scope = g.device(loom::make_replica_device_setter(
        spec, {.ps_device = "/job:ps/cpu:0", .worker_device = "/job:worker/task:0"}));
    auto step = loom::create_global_step(g);
    table.emplace(
        g, "table", dim,
        loom::hash_embedding_options{.capacity_per_shard = capacity / 2 + 1, .num_shards = 2});
    rows = table->lookup(ids);
    train = loom::adagrad_optimizer{0.1}.minimize(loom::lower(loom::reduce_sum(*rows)), step);
    state = g.collection(loom::collection::global_variables);
  }
};

loom::tensor<std::int64_t, 1> ids_of(const std::vector<std::int64_t>& v) {
  return {loom::shape{static_cast<std::int64_t>(v.size())}, v};
}

bool same_values(const std::vector<loom::any_tensor>& a, const std::vector<loom::any_tensor>& b) {
  if (a.size() != b.size())
    return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].type() != b[i].type() || !(a[i].shape() == b[i].shape()))
      return false;
    const auto bytes =
        static_cast<std::size_t>(a[i].num_elements()) * (a[i].type() == loom::dtype::i64 ? 8 : 4);
    if (std::memcmp(a[i].raw_data(), b[i].raw_data(), bytes) != 0)
      return false;
  }
  return true;
}

} // namespace

int main(int argc, char** argv) try {
  std::int64_t rows = 10'000'000, dim = 16, steps = 100, batch = 1024;
  int increments = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) {
      return a.rfind(flag, 0) == 0
                 ? std::optional<long long>(std::stoll(a.substr(std::strlen(flag))))
                 : std::nullopt;
    };
    if (a == "--smoke") {
      rows = 100'000;
      steps = 10;
      increments = 2;
    } else if (auto v = value("--rows=")) {
      rows = *v;
    } else if (auto d = value("--dim=")) {
      dim = *d;
    } else if (auto s = value("--steps=")) {
      steps = *s;
    } else if (auto b = value("--batch=")) {
      batch = *b;
    } else if (auto n = value("--increments=")) {
      increments = static_cast<int>(*n);
    } else {
      std::fprintf(stderr, "incremental_checkpoint: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  char tmpl[] = "/tmp/loom_incremental_XXXXXX";
  if (::mkdtemp(tmpl) == nullptr)
    throw std::runtime_error("mkdtemp failed");
  const fs::path dir = tmpl;
  struct removed {
    fs::path p;
    ~removed() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{dir};
  const std::string prefix = (dir / "model").string();
  std::printf(
      "incremental_checkpoint: a hash table of %lld rows x %lld floats in 2 shards on a ps, "
      "Adagrad; %d increments of %lld steps of %lld uniform ids\n",
      static_cast<long long>(rows), static_cast<long long>(dim), increments,
      static_cast<long long>(steps), static_cast<long long>(batch));

  std::vector<loom::any_tensor> before;
  std::string newest, base;
  double full_save = 0;
  std::uint64_t full_bytes = 0;
  int failures = 0;
  {
    cluster c;
    model m(c.spec, rows, dim);
    loom::incremental_saver saver(m.g, {.max_to_keep = 1, .sharded = true});
    loom::session s(m.g, c.worker.target());
    s.run(loom::global_variables_initializer(m.g));
    const double fill = seconds_of([&] {
      for (std::int64_t first = 0; first < rows; first += 1 << 17) {
        std::vector<std::int64_t> v;
        for (std::int64_t id = first; id < std::min(rows, first + (1 << 17)); ++id)
          v.push_back(id);
        s.run(*m.rows, {{m.ids, ids_of(v)}});
      }
    });
    std::printf("   filled %lld rows in %.1f s\n", static_cast<long long>(rows), fill);
    full_save = seconds_of([&] { base = saver.save(s, prefix, 0); });
    full_bytes = loom::bench::checkpoint_bytes(base);
    std::printf("   full checkpoint: %.1f MB in %.2f s\n", static_cast<double>(full_bytes) / 1e6,
                full_save);
    std::printf("   %-10s %10s %10s %12s %10s %12s %12s\n", "increment", "touched", "rows in", "MB",
                "s", "bytes/full", "s/full");
    std::mt19937_64 rng(7);
    std::uniform_int_distribution<std::int64_t> any_id(0, rows - 1);
    std::int64_t step = 0;
    for (int k = 1; k <= increments; ++k) {
      std::unordered_set<std::int64_t> touched;
      for (std::int64_t t = 0; t < steps; ++t) {
        std::vector<std::int64_t> v(static_cast<std::size_t>(batch));
        for (auto& id : v)
          touched.insert(id = any_id(rng));
        s.run(*m.train, {{m.ids, ids_of(v)}});
        ++step;
      }
      std::string path;
      const double secs = seconds_of([&] { path = saver.save_increment(s, prefix, step); });
      const std::uint64_t bytes = fs::file_size(path);
      std::int64_t in_file = 0;
      const loom::checkpoint_reader r(path);
      for (const auto& e : r.entries())
        if (e.name.ends_with("/.changed_rows"))
          in_file += e.shape.num_elements();
      std::printf("   %-10d %10zu %10lld %12.2f %10.3f %12.4f %12.4f\n", k, touched.size(),
                  static_cast<long long>(in_file), static_cast<double>(bytes) / 1e6, secs,
                  static_cast<double>(bytes) / static_cast<double>(full_bytes), secs / full_save);
      if (in_file != static_cast<std::int64_t>(touched.size())) {
        std::printf("   ** increment %d holds %lld rows for %zu touched\n", k,
                    static_cast<long long>(in_file), touched.size());
        ++failures;
      }
      newest = path;
    }
    before = s.run_nodes(m.state, {});
  } // the ps and the worker shut down: the table's memory goes with them
  // Each restore into a new ps and worker: the chain (the values compared), then the
  // base alone for scale.
  double restore_seconds[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    cluster c;
    model m(c.spec, rows, dim);
    loom::incremental_saver saver(m.g, {.max_to_keep = 1, .sharded = true});
    loom::session s(m.g, c.worker.target());
    restore_seconds[k] = seconds_of([&] { saver.restore(s, k == 0 ? newest : base); });
    if (k == 0 && !same_values(before, s.run_nodes(m.state, {}))) {
      std::printf("   ** the chain restored other values than those before the shutdown\n");
      ++failures;
    }
  }
  std::printf("   restore into a new ps: the base and %d increments %.2f s (every key, row and "
              "slot as before the shutdown: %s); the base alone %.2f s\n",
              increments, restore_seconds[0], failures == 0 ? "yes" : "NO", restore_seconds[1]);
  return failures == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "incremental_checkpoint: %s\n", e.what());
  return 1;
}

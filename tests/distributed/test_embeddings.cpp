// An embedding table on a ps task, trained from a worker with sparse updates:
// the lookup and the update run on the ps (the placement log says so), so a
// step moves ids and rows, never the table; only the looked-up rows change.
#include <loom/api.hpp>
#include <loom/kernels/cpu/count_min_sketch.hpp>
#include <loom/train/saver.hpp>

#include <doctest/doctest.h>
#include <support/cluster.hpp>
#include <support/messages.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

using loom::shape;
using loom::tensor;
using loom::testing::contains;
using loom::testing::local_cluster;

namespace {

// A feed of these ids into a placeholder of ids.
loom::feed_dict feed_ids(const loom::placeholder<std::int64_t, 1>& ids,
                         std::vector<std::int64_t> list) {
  const auto n = static_cast<std::int64_t>(list.size());
  return loom::feed_dict{{ids, tensor<std::int64_t, 1>(shape{n}, std::move(list))}};
}

} // namespace

TEST_CASE("an embedding table on the ps: lookups and sparse updates run there, only the touched "
          "rows change") {
  local_cluster cluster(1, 1);
  loom::graph g;
  constexpr std::int64_t rows = 50000, dim = 8;
  loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
  loom::placeholder<float, 2> target(g, shape{-1, dim}, "target");
  auto table = g.on("/job:ps/task:0", [&] {
    return loom::variable<float, 2>(g, "table", shape{rows, dim},
                                    loom::random_uniform_initializer{-1, 1, 7});
  });
  auto looked_up = g.on("/job:worker/task:0", [&] { return loom::gather(table, ids); });
  auto loss = g.on("/job:worker/task:0",
                   [&] { return loom::lower(loom::reduce_sum(loom::square(looked_up - target))); });
  auto train = loom::adagrad_optimizer{0.5}.minimize(loss);

  std::ostringstream placed;
  loom::cluster_session_options o = loom::testing::quiet();
  o.log_device_placement = true;
  o.placement_log = &placed;
  loom::session s(g, cluster.target(), o);
  s.run(loom::global_variables_initializer(g));
  const auto before = s.run(table);

  const tensor<std::int64_t, 1> batch(shape{4}, {49999, 3, 3, 12345});
  const tensor<float, 2> goal(shape{4, dim}, 0.25f);
  float first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    auto [l, _] = s.run(loom::fetches(loss, train), {{ids, batch}, {target, goal}});
    (step == 0 ? first : last) = static_cast<float>(l);
  }
  CHECK(last < first * 0.1f); // it learns

  const std::string log = placed.str();
  INFO(log);
  CHECK(contains(log, looked_up.name() + ": (resource_gather): /job:ps/replica:0/task:0"));
  CHECK(contains(log, ": (sparse_apply_adagrad): /job:ps/replica:0/task:0"));
  CHECK_FALSE(contains(log, "(apply_adagrad)")); // no dense update of the table

  const auto after = s.run(table);
  int changed_rows = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    bool changed = false;
    for (std::int64_t k = 0; k < dim; ++k)
      changed |= after(r, k) != before(r, k);
    changed_rows += changed;
    if (changed)
      CHECK((r == 3 || r == 12345 || r == 49999));
  }
  CHECK(changed_rows == 3);
}

namespace {

// An embedding of 10 rows of width 2, row r = (r, -r), split into 3 shards
// over 2 ps tasks as `strategy` splits it.
struct sharded_embedding {
  loom::graph g;
  std::vector<loom::output<float, 2>> shards;
  explicit sharded_embedding(loom::partition_strategy strategy) {
    const bool div = strategy == loom::partition_strategy::div;
    for (std::int64_t p = 0; p < 3; ++p) {
      std::vector<float> values;
      for (std::int64_t r = 0; r < 10; ++r)
        if ((div ? (r < 4 ? 0 : r < 7 ? 1 : 2) : r % 3) == p) {
          values.push_back(static_cast<float>(r));
          values.push_back(static_cast<float>(-r));
        }
      const auto rows = static_cast<std::int64_t>(values.size() / 2);
      shards.push_back(g.on("/job:ps/task:" + std::to_string(p % 2), [&] {
        return loom::variable<float, 2>(
            g, "emb/part_" + std::to_string(p),
            loom::constant(g, tensor<float, 2>(shape{rows, 2}, values)));
      }));
    }
  }
};

} // namespace

TEST_CASE("embedding_lookup over shards on two ps tasks: TF's mod and div rules, each shard's "
          "lookup on its task, only the touched rows trained") {
  for (const auto strategy : {loom::partition_strategy::mod, loom::partition_strategy::div}) {
    const bool div = strategy == loom::partition_strategy::div;
    INFO((div ? "div" : "mod"));
    local_cluster cluster(2, 1);
    sharded_embedding e(strategy);
    loom::placeholder<std::int64_t, 2> ids(e.g, shape{-1, 2}, "ids");
    auto rows = e.g.on("/job:worker/task:0",
                       [&] { return loom::embedding_lookup(e.shards, ids, strategy); });
    static_assert(decltype(rows)::rank == 3);
    auto train = e.g.on("/job:worker/task:0", [&] {
      return loom::gradient_descent_optimizer{0.5}.minimize(loom::reduce_sum(rows));
    });
    std::ostringstream placed;
    loom::cluster_session_options o = loom::testing::quiet();
    o.log_device_placement = true;
    o.placement_log = &placed;
    loom::session s(e.g, cluster.target(), o);
    s.run(loom::global_variables_initializer(e.g));
    const tensor<std::int64_t, 2> batch(shape{3, 2}, {9, 0, 4, 4, 7, 5});
    const auto got = s.run(rows, {{ids, batch}});
    REQUIRE(got.shape() == shape{3, 2, 2});
    for (std::int64_t i = 0; i < 3; ++i)
      for (std::int64_t j = 0; j < 2; ++j) {
        CHECK(got(i, j, 0) == static_cast<float>(batch(i, j)));
        CHECK(got(i, j, 1) == -static_cast<float>(batch(i, j)));
      }
    // A batch whose ids all live past shard 0 (its part of the stitch is empty).
    const tensor<std::int64_t, 2> later(shape{1, 2}, {div ? 7 : 4, div ? 8 : 7});
    const auto got_later = s.run(rows, {{ids, later}});
    for (std::int64_t j = 0; j < 2; ++j) {
      CHECK(got_later(0, j, 0) == static_cast<float>(later(0, j)));
      CHECK(got_later(0, j, 1) == -static_cast<float>(later(0, j)));
    }
    const std::string log = placed.str();
    INFO(log);
    for (int p = 0; p < 3; ++p)
      CHECK(contains(log, "(resource_gather): /job:ps/replica:0/task:" + std::to_string(p % 2)));

    s.run(train, {{ids, batch}});
    // Every shard is updated on its task by the sparse apply, never densely.
    const std::string with_train = placed.str();
    for (int p = 0; p < 2; ++p)
      CHECK(contains(with_train, "(sparse_apply_gradient_descent): /job:ps/replica:0/task:" +
                                     std::to_string(p)));
    CHECK_FALSE(contains(with_train, "(apply_gradient_descent)"));
    // Each looked-up row moved by -0.5 per lookup (id 4 twice); no other row moved.
    const std::vector<float> times = {1, 0, 0, 0, 2, 1, 0, 1, 0, 1}; // lookups per row
    auto after = s.run(loom::embedding_lookup(
        e.shards,
        loom::constant(e.g, tensor<std::int64_t, 1>(shape{10}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9})),
        strategy));
    for (std::int64_t r = 0; r < 10; ++r) {
      CHECK(after(r, 0) ==
            doctest::Approx(static_cast<float>(r) - 0.5f * times[static_cast<std::size_t>(r)]));
      CHECK(after(r, 1) ==
            doctest::Approx(-static_cast<float>(r) - 0.5f * times[static_cast<std::size_t>(r)]));
    }
    // An id beyond the embedding fails the step naming it.
    const auto what = loom::testing::message_of<loom::invalid_argument_error>([&] {
      s.run(rows, {{ids, tensor<std::int64_t, 2>(shape{1, 2}, {3, 10})}});
    });
    CHECK(contains(what, "id 10 (at position 1) is outside [0, 10) of the embedding 'emb/part_0' "
                         "and its 2 other shard(s) of 10 rows"));
  }
}

TEST_CASE("embedding_lookup refuses shards that do not fit the strategy, and applies max_norm") {
  sharded_embedding e(loom::partition_strategy::mod);
  loom::placeholder<std::int64_t, 1> ids(e.g, shape{-1}, "ids");
  // mod puts 4, 3, 3 rows in the shards; div wants 4, 3, 3 too, but other rows.
  // Two shards swapped give 3, 4, 3: refused for both.
  std::vector<loom::output<float, 2>> swapped{e.shards[1], e.shards[0], e.shards[2]};
  const auto what = loom::testing::message_of<loom::invalid_argument_error>(
      [&] { loom::embedding_lookup(swapped, ids); });
  CHECK(contains(what, "shard 0"));
  CHECK(contains(what, "the \"mod\" strategy puts 4 of 10 rows in it"));

  loom::graph g;
  loom::variable<float, 2> table(
      g, "table", loom::constant(g, tensor<float, 2>(shape{2, 2}, {3, 4, 0.3f, 0.4f})));
  loom::placeholder<std::int64_t, 1> at(g, shape{-1}, "at");
  auto clipped = loom::embedding_lookup(table, at, loom::partition_strategy::mod, 1.0);
  loom::session s(g);
  s.run(table.initializer());
  const auto got = s.run(clipped, {{at, tensor<std::int64_t, 1>(shape{2}, {0, 1})}});
  CHECK(got(0, 0) == doctest::Approx(0.6f)); // norm 5 -> 1
  CHECK(got(0, 1) == doctest::Approx(0.8f));
  CHECK(got(1, 0) == doctest::Approx(0.3f)); // norm 0.5: kept
  CHECK(got(1, 1) == doctest::Approx(0.4f));
}

TEST_CASE("partitioners: TF's arithmetic, and a partitioning that cannot be is one error") {
  using loom::dtype;
  CHECK(loom::fixed_size_partitioner{3}(shape{10, 4}, dtype::f32).shards == 3);
  // 1000 x 64 floats = 256 000 bytes per 1000 rows; 256 KiB per shard at least.
  CHECK(
      loom::min_max_variable_partitioner{.max_partitions = 8}(shape{1000, 64}, dtype::f32).shards ==
      1);
  CHECK(loom::min_max_variable_partitioner{.max_partitions = 8,
                                           .min_slice_size = 64 << 10}(shape{1000, 64}, dtype::f32)
            .shards == 4);
  CHECK(loom::min_max_variable_partitioner{.max_partitions = 3,
                                           .min_slice_size = 1}(shape{1000, 64}, dtype::f32)
            .shards == 3);
  // 256 bytes per row, at most 1000 bytes per shard: 3 rows each, 4 shards for 10 rows.
  CHECK(loom::variable_axis_size_partitioner{.max_shard_bytes = 1000}(shape{10, 64}, dtype::f32)
            .shards == 4);
  CHECK(loom::variable_axis_size_partitioner{.max_shard_bytes = 1000,
                                             .max_shards = 2}(shape{10, 64}, dtype::f32)
            .shards == 2);

  loom::graph g;
  const auto zero = loom::testing::message_of<loom::invalid_argument_error>([&] {
    loom::get_variable<float, 2>(g, "none", shape{10, 4}, loom::zeros_initializer{},
                                 loom::fixed_size_partitioner{0});
  });
  CHECK(contains(zero, "the partitioner of 'none' yields 0 shard(s) along axis 0 of size 10"));
  CHECK(contains(loom::testing::message_of<loom::invalid_argument_error>([&] {
                   loom::get_variable<float, 2>(g, "many", shape{2, 4}, loom::zeros_initializer{},
                                                loom::fixed_size_partitioner{3});
                 }),
                 "yields 3 shard(s) along axis 0 of size 2"));
}

TEST_CASE("a partitioned variable: shards name/part_i over the ps tasks round-robin, TF's split, "
          "looked up and trained where they live") {
  local_cluster cluster(2, 1);
  loom::graph g;
  auto ps_scope = g.device(loom::replica_device_setter({.ps_tasks = 2}));
  auto emb = loom::get_variable<float, 2>(g, "emb", shape{11, 4},
                                          loom::random_uniform_initializer{-1, 1, 5},
                                          loom::fixed_size_partitioner{3});
  REQUIRE(emb.shards().size() == 3);
  CHECK(emb.shards()[0].name() == "emb/part_0");
  CHECK(emb.shards()[2].name() == "emb/part_2");
  CHECK(emb.shards()[0].shape() == shape{4, 4}); // 11 = 4 + 4 + 3
  CHECK(emb.shards()[1].shape() == shape{4, 4});
  CHECK(emb.shards()[2].shape() == shape{3, 4});
  loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
  auto rows = loom::embedding_lookup(emb, ids, loom::partition_strategy::div);
  auto whole = emb.value();
  auto train = loom::adam_optimizer{0.1}.minimize(loom::reduce_sum(rows));

  std::ostringstream placed;
  loom::cluster_session_options o = loom::testing::quiet();
  o.log_device_placement = true;
  o.placement_log = &placed;
  loom::session s(g, cluster.target(), o);
  s.run(emb.initializer());
  s.run(loom::global_variables_initializer(g));
  const auto before = s.run(whole);
  CHECK(before.shape() == shape{11, 4});
  // Seeded shards differ (seed + i).
  CHECK(before(0, 0) != before(4, 0));
  // div: the lookup of id r is row r of the whole value.
  const auto got = s.run(rows, {{ids, tensor<std::int64_t, 1>(shape{3}, {10, 0, 5})}});
  for (std::int64_t k = 0; k < 4; ++k) {
    CHECK(got(0, k) == before(10, k));
    CHECK(got(1, k) == before(0, k));
    CHECK(got(2, k) == before(5, k));
  }
  s.run(train, {{ids, tensor<std::int64_t, 1>(shape{2}, {10, 5})}});
  const auto after = s.run(whole);
  for (std::int64_t r = 0; r < 11; ++r)
    for (std::int64_t k = 0; k < 4; ++k) {
      if (r == 10 || r == 5)
        CHECK(after(r, k) != before(r, k));
      else
        CHECK(after(r, k) == before(r, k)); // LazyAdam: untouched rows stay
    }
  const std::string log = placed.str();
  INFO(log);
  CHECK(contains(log, "emb/part_0: (variable): /job:ps/replica:0/task:0"));
  CHECK(contains(log, "emb/part_1: (variable): /job:ps/replica:0/task:1"));
  CHECK(contains(log, "emb/part_2: (variable): /job:ps/replica:0/task:0"));
  CHECK(contains(log, "(sparse_apply_adam): /job:ps/replica:0/task:1"));
}

TEST_CASE("two tables of as many rows looked up with the same ids share the ids' routing to "
          "their shards; each gets its own rows, and a bad id names both") {
  local_cluster cluster(2, 1);
  loom::graph g;
  auto ps_scope = g.device(loom::replica_device_setter({.ps_tasks = 2}));
  auto deep = loom::get_variable<float, 2>(g, "deep", shape{10, 3},
                                           loom::random_uniform_initializer{-1, 1, 5},
                                           loom::fixed_size_partitioner{2});
  auto wide = loom::get_variable<float, 2>(g, "wide", shape{10, 1},
                                           loom::random_uniform_initializer{-1, 1, 7},
                                           loom::fixed_size_partitioner{2});
  loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
  // "div": row r of a table's whole value is id r's row.
  auto deep_rows = loom::embedding_lookup(deep, ids, loom::partition_strategy::div);
  auto wide_rows = loom::embedding_lookup(wide, ids, loom::partition_strategy::div);
  // As TF's CSE merges the two lookups' dynamic_partition: one routing (the distinct ids of
  // each shard, each id's slot among them) for both tables, then per table a gather from each
  // shard and one gather_shards of their rows.
  std::map<std::string, int> ops;
  for (std::size_t k = 0; k < g.size(); ++k)
    ++ops[g.node(static_cast<loom::node_id>(k)).op];
  CHECK(ops["shard_unique"] == 2);
  CHECK(ops["shard_slots"] == 1);
  CHECK(ops["resource_gather"] == 4);
  CHECK(ops["gather_shards"] == 2);

  loom::session s(g, cluster.target(), loom::testing::quiet());
  s.run(loom::global_variables_initializer(g));
  const auto deep_all = s.run(deep.value());
  const auto wide_all = s.run(wide.value());
  const tensor<std::int64_t, 1> batch(shape{4}, {7, 2, 7, 9});
  const auto [d, w] = s.run(loom::fetches(deep_rows, wide_rows), {{ids, batch}});
  for (std::int64_t i = 0; i < 4; ++i) {
    for (std::int64_t k = 0; k < 3; ++k)
      CHECK(d(i, k) == deep_all(batch(i), k));
    CHECK(w(i, 0) == wide_all(batch(i), 0));
  }
  const auto what = loom::testing::message_of<loom::invalid_argument_error>([&] {
    s.run(wide_rows, {{ids, tensor<std::int64_t, 1>(shape{2}, {3, 10})}});
  });
  CHECK(contains(what, "id 10 (at position 1) is outside [0, 10) of the embedding 'deep/part_0'"));
  CHECK(contains(what, "the embedding 'wide/part_0'"));
}

TEST_CASE("a variable larger than a frame is initialized on its task: the graph carries no "
          "value of its size") {
  local_cluster cluster(1, 1);
  loom::graph g;
  constexpr std::int64_t rows = 1 << 21, dim = 9; // 75.5 MB of floats, above a frame's 64 MiB
  auto table = g.on("/job:ps/task:0", [&] {
    return loom::variable<float, 2>(g, "big", shape{rows, dim}, loom::zeros_initializer{});
  });
  loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
  auto train = g.on("/job:worker/task:0", [&] {
    return loom::adagrad_optimizer{0.5}.minimize(loom::reduce_sum(loom::gather(table, ids) - 1.0f));
  });
  loom::session s(g, cluster.target(), loom::testing::quiet());
  s.run(loom::global_variables_initializer(g)); // the table and its Adagrad slot, on the ps
  s.run(train, {{ids, tensor<std::int64_t, 1>(shape{2}, {rows - 1, 0})}});
  auto corner =
      loom::gather(table, loom::constant(g, tensor<std::int64_t, 1>(shape{3}, {0, 1, rows - 1})));
  const auto got = s.run(corner);
  CHECK(got(0, 0) < 0.0f);  // trained
  CHECK(got(1, 0) == 0.0f); // untouched, zero from the fill
  CHECK(got(2, 8) < 0.0f);
}

// -- hash-table embeddings --------------------------------------------------------------------

TEST_CASE("a hash embedding over 2 ps tasks: rows made on first lookup, the same row for an id "
          "every time, sparse training, a size a user can read") {
  local_cluster cluster(2, 1);
  loom::graph g;
  loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
  std::optional<loom::hash_embedding<float>> emb;
  {
    auto _ = g.device(
        loom::replica_device_setter({.ps_tasks = 2, .worker_device = "/job:worker/task:0"}));
    emb.emplace(g, "users", 4,
                loom::hash_embedding_options{
                    .capacity_per_shard = 100, .num_shards = 2, .init_stddev = 0.5, .seed = 3});
  }
  auto rows = g.on("/job:worker/task:0", [&] { return emb->lookup(ids); });
  auto train = g.on("/job:worker/task:0", [&] {
    return loom::adagrad_optimizer{0.5}.minimize(loom::lower(loom::reduce_sum(rows)));
  });
  auto size = emb->size();
  std::ostringstream placed;
  loom::cluster_session_options o = loom::testing::quiet();
  o.log_device_placement = true;
  o.placement_log = &placed;
  loom::session s(g, cluster.target(), o);
  s.run(loom::global_variables_initializer(g));
  CHECK(s.run(size) == 0);

  // Ids far beyond any vocabulary, one twice.
  const tensor<std::int64_t, 1> batch(shape{4}, {7000000001LL, 42, 7000000001LL, 3});
  const auto first = s.run(rows, {{ids, batch}});
  CHECK(s.run(size) == 3);
  for (std::int64_t k = 0; k < 4; ++k) {
    CHECK(first(0, k) == first(2, k)); // one id, one row
    CHECK(first(0, k) != first(1, k));
    CHECK(std::abs(first(1, k)) < 5.0f); // drawn from normal(0, 0.5)
  }
  // Looked up again, in another order: the same rows, nothing new.
  const tensor<std::int64_t, 1> again(shape{2}, {3, 42});
  const auto second = s.run(rows, {{ids, again}});
  for (std::int64_t k = 0; k < 4; ++k) {
    CHECK(second(0, k) == first(3, k));
    CHECK(second(1, k) == first(1, k));
  }
  CHECK(s.run(size) == 3);
  const std::string log = placed.str();
  INFO(log);
  CHECK(contains(log, "(hash_embedding_rows): /job:ps/replica:0/task:0"));
  CHECK(contains(log, "(hash_embedding_rows): /job:ps/replica:0/task:1"));

  // Training moves only the looked-up rows, by sparse applies on the ps.
  s.run(train, {{ids, tensor<std::int64_t, 1>(shape{1}, std::int64_t{42})}});
  const auto trained = s.run(rows, {{ids, batch}});
  for (std::int64_t k = 0; k < 4; ++k) {
    CHECK(trained(1, k) < first(1, k)); // the gradient of a sum is 1: it went down
    CHECK(trained(0, k) == first(0, k));
    CHECK(trained(3, k) == first(3, k));
  }
  CHECK(contains(placed.str(), "(sparse_apply_adagrad)"));
  CHECK_FALSE(contains(placed.str(), "(apply_adagrad)"));
}

TEST_CASE("a hash embedding's first rows depend on (seed, id) only, not on the order ids came") {
  auto rows_of = [](std::vector<std::int64_t> order) {
    loom::graph g;
    loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
    loom::hash_embedding<float> emb(g, "e", 3,
                                    {.capacity_per_shard = 10, .num_shards = 1, .seed = 9});
    auto rows = emb.lookup(ids);
    loom::session s(g);
    s.run(loom::global_variables_initializer(g));
    const auto n = static_cast<std::int64_t>(order.size());
    s.run(rows, {{ids, tensor<std::int64_t, 1>(shape{n}, order)}});
    return s.run(rows, {{ids, tensor<std::int64_t, 1>(shape{2}, {5, 77})}});
  };
  const auto a = rows_of({5, 77});
  const auto b = rows_of({77, 1, 5});
  for (std::int64_t i = 0; i < 2; ++i)
    for (std::int64_t k = 0; k < 3; ++k)
      CHECK(a(i, k) == b(i, k));
}

TEST_CASE("a hash embedding saves and restores with the rest; after a restore, new ids still get "
          "new rows") {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("loom-hash-" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(dir);
  auto build = [](loom::graph& g) {
    return loom::hash_embedding<float>(g, "e", 2, {.capacity_per_shard = 8, .num_shards = 2});
  };
  tensor<float, 2> before;
  {
    loom::graph g;
    loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
    auto emb = build(g);
    auto rows = emb.lookup(ids);
    loom::session s(g);
    s.run(loom::global_variables_initializer(g));
    before = s.run(rows, {{ids, tensor<std::int64_t, 1>(shape{3}, {10, 11, 12})}});
    loom::saver(g).save(s, dir + "/model");
  }
  loom::graph g;
  loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
  auto emb = build(g);
  auto rows = emb.lookup(ids);
  auto size = emb.size();
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  s.run(rows,
        {{ids, tensor<std::int64_t, 1>(shape{1}, std::int64_t{99})}}); // an index, then a restore
  loom::saver(g).restore(s, dir + "/model");
  CHECK(s.run(size) == 3);
  const auto after = s.run(rows, {{ids, tensor<std::int64_t, 1>(shape{3}, {10, 11, 12})}});
  for (std::int64_t i = 0; i < 3; ++i)
    for (std::int64_t k = 0; k < 2; ++k)
      CHECK(after(i, k) == before(i, k));
  s.run(rows, {{ids, tensor<std::int64_t, 1>(shape{2}, {13, 10})}});
  CHECK(s.run(size) == 4);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a full hash embedding shard and a negative id are clear errors that change nothing") {
  loom::graph g;
  loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
  loom::hash_embedding<float> emb(g, "small", 2, {.capacity_per_shard = 3, .num_shards = 1});
  auto rows = emb.lookup(ids);
  auto size = emb.size();
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  s.run(rows, {{ids, tensor<std::int64_t, 1>(shape{2}, {1, 2})}});
  const std::string full = loom::testing::message_of<loom::resource_exhausted_error>([&] {
    s.run(rows, {{ids, tensor<std::int64_t, 1>(shape{3}, {3, 4, 1})}});
  });
  CHECK(contains(full, "hash embedding shard 'small/part_0_of_1/rows' is full: 2 of 3 rows used "
                       "and 2 new ids in this step"));
  CHECK(s.run(size) == 2);
  const std::string negative = loom::testing::message_of<loom::invalid_argument_error>([&] {
    s.run(rows, {{ids, tensor<std::int64_t, 1>(shape{1}, std::int64_t{-5})}});
  });
  CHECK(contains(negative, "id -5"));
  CHECK(contains(negative, "hash embedding 'small'"));
  CHECK(s.run(size) == 2);
}

TEST_CASE("hash embedding admission: an id gets its row in the step it is looked up the "
          "admit_after-th time; until then its lookup is zeros and its gradient is dropped") {
  loom::graph g;
  loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
  loom::hash_embedding<float> emb(g, "adm", 3,
                                  {.capacity_per_shard = 10,
                                   .num_shards = 2,
                                   .init_stddev = 0.5,
                                   .seed = 1,
                                   .admit_after = 3,
                                   .admission_counters = 4096});
  // The same table without admission: an admitted row starts as its row does.
  loom::hash_embedding<float> plain(
      g, "plain", 3, {.capacity_per_shard = 10, .num_shards = 2, .init_stddev = 0.5, .seed = 1});
  auto rows = emb.lookup(ids);
  auto plain_rows = plain.lookup(ids);
  auto train = loom::adam_optimizer{0.1}.minimize(loom::reduce_sum(rows));
  auto size = emb.size();
  auto waiting = emb.waiting();
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  auto feed = [&](std::vector<std::int64_t> list) { return feed_ids(ids, std::move(list)); };
  auto all_zero = [](const tensor<float, 2>& t) {
    for (std::int64_t i = 0; i < t.shape()[0]; ++i)
      for (std::int64_t k = 0; k < t.shape()[1]; ++k)
        if (t(i, k) != 0.0f)
          return false;
    return true;
  };
  auto table_zero = [&] {
    return all_zero(s.run(emb.shards()[0].rows)) && all_zero(s.run(emb.shards()[1].rows));
  };

  CHECK(all_zero(s.run(rows, feed({5, 6, 5})))); // seen once (a step's repeats count once)
  CHECK(s.run(size) == 0);
  CHECK(s.run(waiting) == 2);
  s.run(train, feed({5})); // seen twice: still zeros, and the gradient is dropped
  CHECK(table_zero());
  CHECK(s.run(size) == 0);

  const auto third = s.run(rows, feed({5, 7})); // 5 seen 3 times: admitted
  const auto expected = s.run(plain_rows, feed({5}));
  for (std::int64_t k = 0; k < 3; ++k) {
    CHECK(third(0, k) == expected(0, k));
    CHECK(third(1, k) == 0.0f);
  }
  CHECK(s.run(size) == 1);
  CHECK(s.run(waiting) == 2); // 6 and 7

  s.run(train, feed({5, 7}));                     // 7 seen twice: its gradient is dropped
  const auto trained = s.run(rows, feed({5, 7})); // 7 seen 3 times: admitted
  const auto seven = s.run(plain_rows, feed({7}));
  for (std::int64_t k = 0; k < 3; ++k) {
    CHECK(trained(0, k) < third(0, k)); // the gradient of a sum: it went down
    CHECK(trained(1, k) == seven(0, k));
  }
  // Row 0 of each shard, the default row, is still zero after the updates.
  for (const auto& shard : emb.shards()) {
    const auto table = s.run(shard.rows);
    for (std::int64_t k = 0; k < 3; ++k)
      CHECK(table(0, k) == 0.0f);
  }
  CHECK(s.run(size) == 2);
  CHECK(s.run(waiting) == 1); // 6
}

TEST_CASE("hash embedding admission: the counts are a count-min sketch that errs only upwards, "
          "and bad options and a table made without admission are clear errors") {
  loom::kernels::count_min_sketch counts(4 * 4096);
  CHECK(counts.bytes() == 4 * 4096);
  for (int round = 1; round <= 3; ++round)
    for (std::int64_t id = 0; id < 1000; ++id)
      CHECK(counts.add(id * 7919) >= round);
  std::int64_t exact = 0;
  for (std::int64_t id = 0; id < 1000; ++id)
    exact += counts.count(id * 7919) == 3;
  CHECK(exact >= 990); // 4 rows of 4096 for 1000 ids: almost every count exact
  CHECK(std::abs(counts.distinct() - 1000) < 50);

  loom::graph g;
  for (const auto& [o, want] : std::vector<std::pair<loom::hash_embedding_options, std::string>>{
           {{.admit_after = 0}, "admit_after 0 must be 1 (every id at once) to 255"},
           {{.admit_after = 256}, "admit_after 256 must be 1"},
           {{.capacity_per_shard = 1, .admit_after = 2}, "a capacity_per_shard of 2 or more"},
           {{.admit_after = 2, .admission_counters = 3}, "4 or more admission_counters"}}) {
    const std::string what = loom::testing::message_of<loom::invalid_argument_error>(
        [&] { loom::hash_embedding<float>(g, "bad", 2, o); });
    CHECK_MESSAGE(contains(what, want), what);
  }

  // A table saved without admission restored into one with it: row 0 holds an id.
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("loom-admit-" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(dir);
  {
    loom::graph g0;
    loom::placeholder<std::int64_t, 1> ids(g0, shape{-1}, "ids");
    loom::hash_embedding<float> emb(g0, "t", 2, {.capacity_per_shard = 4});
    auto rows = emb.lookup(ids);
    loom::session s(g0);
    s.run(loom::global_variables_initializer(g0));
    s.run(rows, {{ids, tensor<std::int64_t, 1>(shape{1}, std::int64_t{42})}});
    loom::saver(g0).save(s, dir + "/model");
  }
  loom::graph g1;
  loom::placeholder<std::int64_t, 1> ids(g1, shape{-1}, "ids");
  loom::hash_embedding<float> emb(g1, "t", 2, {.capacity_per_shard = 4, .admit_after = 2});
  auto rows = emb.lookup(ids);
  loom::session s(g1);
  s.run(loom::global_variables_initializer(g1));
  loom::saver(g1).restore(s, dir + "/model");
  const std::string held = loom::testing::message_of<loom::failed_precondition_error>([&] {
    s.run(rows, {{ids, tensor<std::int64_t, 1>(shape{1}, std::int64_t{7})}});
  });
  CHECK_MESSAGE(contains(held, "'t/part_0_of_1/rows' holds id 42 in row 0, the default row of "
                               "admission (admit_after 2)"),
                held);
  std::filesystem::remove_all(dir);
}

TEST_CASE("hash embedding admission: the counts are saved and restored with the table, in "
          "either format and in increments, so a restored table admits an id when the one that "
          "saved it would have") {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("loom-counts-" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(dir);
  struct table {
    loom::graph g;
    loom::placeholder<std::int64_t, 1> ids{g, shape{-1}, "ids"};
    loom::hash_embedding<float> emb;
    loom::output<float, 2> rows;
    loom::output<std::int64_t, 0> size, waiting;
    loom::session s{g};
    explicit table(std::int64_t counters)
        : emb(g, "adm", 2,
              {.capacity_per_shard = 8,
               .num_shards = 2,
               .admit_after = 3,
               .admission_counters = counters}),
          rows(emb.lookup(ids)), size(emb.size()), waiting(emb.waiting()) {
      s.run(loom::global_variables_initializer(g));
    }
    void look_up(std::vector<std::int64_t> list) { s.run(rows, feed_ids(ids, std::move(list))); }
  };
  for (const auto format : {loom::checkpoint_format::loom, loom::checkpoint_format::tensorflow}) {
    CAPTURE(static_cast<int>(format));
    {
      table saved(4096);
      saved.look_up({5, 6, 9});
      saved.look_up({5, 6}); // 5 and 6 seen twice, 9 once
      loom::saver(saved.g, {.format = format}).save(saved.s, dir + "/model");
    }
    table restored(4096);
    loom::saver(restored.g).restore(restored.s, dir + "/model");
    CHECK(restored.s.run(restored.waiting) == 3);
    restored.look_up({5, 6, 9}); // a third time for 5 and 6: admitted; 9 waits
    CHECK(restored.s.run(restored.size) == 2);
    CHECK(restored.s.run(restored.waiting) == 1);

    table other(8192); // another sketch: one clear error
    const std::string what = loom::testing::message_of<loom::invalid_argument_error>(
        [&] { loom::saver(other.g).restore(other.s, dir + "/model"); });
    CHECK_MESSAGE(contains(what, "the admission counts saved are 4096 counters, the table's "
                                 "sketch has 8192 (admission_counters)"),
                  what);
  }
  { // An increment holds the counts as they were at its save.
    table saved(4096);
    loom::incremental_saver chain(saved.g);
    chain.save(saved.s, dir + "/chain");
    saved.look_up({7});
    saved.look_up({7, 8});
    chain.save_increment(saved.s, dir + "/chain", 1);
  }
  table restored(4096);
  loom::incremental_saver(restored.g).restore(restored.s, dir + "/chain-1");
  restored.look_up({7, 8});
  CHECK(restored.s.run(restored.size) == 1); // 7, seen 3 times; 8 twice
  std::filesystem::remove_all(dir);
}

TEST_CASE("hash embedding eviction: a full shard gives a new id the row least recently looked "
          "up, with its optimizer slots restarted; a step that needs more rows than it may take "
          "is an error that changes nothing") {
  loom::graph g;
  loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
  loom::hash_embedding<float> emb(
      g, "lru", 2, {.capacity_per_shard = 3, .init_stddev = 0.5, .evict_when_full = true});
  loom::hash_embedding<float> plain(g, "plain", 2, {.capacity_per_shard = 8, .init_stddev = 0.5});
  auto rows = emb.lookup(ids);
  auto plain_rows = plain.lookup(ids);
  loom::adam_optimizer adam{0.1};
  auto train = adam.minimize(loom::reduce_sum(rows));
  const auto& shard = emb.shards()[0];
  auto m = adam.get_slot(shard.rows, "m");
  auto v = adam.get_slot(shard.rows, "v");
  auto size = emb.size();
  auto evicted = emb.evicted();
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  auto feed = [&](std::vector<std::int64_t> list) { return feed_ids(ids, std::move(list)); };
  auto row_holding = [&](std::int64_t id) {
    const auto keys = s.run(shard.keys);
    for (std::int64_t r = 0; r < 3; ++r)
      if (keys(r) == id)
        return r;
    return std::int64_t{-1};
  };

  s.run(train, feed({1, 2, 3})); // rows 0, 1, 2; their slots move
  s.run(rows, feed({1, 2}));     // 3 is now the least recently looked up
  const std::int64_t was_three = row_holding(3);
  CHECK(s.run(m)(was_three, 0) != 0.0f);
  const auto four = s.run(rows, feed({4}));
  CHECK(row_holding(3) == -1);
  CHECK(row_holding(4) == was_three);
  const auto expected = s.run(plain_rows, feed({4}));
  CHECK(four(0, 0) == expected(0, 0)); // a new row, as a fresh table makes it
  CHECK(four(0, 1) == expected(0, 1));
  for (std::int64_t k = 0; k < 2; ++k) { // and its slots restarted
    CHECK(s.run(m)(was_three, k) == 0.0f);
    CHECK(s.run(v)(was_three, k) == 0.0f);
  }
  CHECK(s.run(size) == 3);
  CHECK(s.run(evicted) == 1);
  CHECK(s.run(emb.admitted()) == 4);

  // 2 new ids beside 2 held ids looked up in the same step: one row may go, not two.
  const std::string full = loom::testing::message_of<loom::resource_exhausted_error>([&] {
    s.run(rows, feed({1, 2, 5, 6}));
  });
  CHECK_MESSAGE(contains(full, "'lru/part_0_of_1/rows' is full: 3 of 3 rows used and 2 new ids in "
                               "this step, beside 2 ids it holds that this step looks up"),
                full);
  CHECK(s.run(evicted) == 1);
  CHECK(row_holding(4) == was_three);
  s.run(rows, feed({1, 5})); // 2 and 4: 2 is the older
  CHECK(row_holding(2) == -1);
  CHECK(row_holding(4) == was_three);
  CHECK(s.run(evicted) == 2);
}

TEST_CASE("hash embedding eviction by age: a row not looked up in steps_to_live lookups is "
          "removed, a checkpoint no longer holds it, and with admission it starts over") {
  loom::graph g;
  loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
  loom::hash_embedding<float> emb(
      g, "ttl", 2,
      {.capacity_per_shard = 8, .admit_after = 2, .admission_counters = 4096, .steps_to_live = 2});
  auto rows = emb.lookup(ids);
  auto size = emb.size();
  auto evicted = emb.evicted();
  auto waiting = emb.waiting();
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  auto look_up = [&](std::int64_t id) {
    return s.run(rows, {{ids, tensor<std::int64_t, 1>(shape{1}, id)}})(0, 0);
  };
  auto held = [&](std::int64_t id) {
    const auto keys = s.run(emb.shards()[0].keys);
    for (std::int64_t r = 0; r < keys.shape()[0]; ++r)
      if (keys(r) == id)
        return true;
    return false;
  };
  look_up(1);                // lookup 1: counted
  CHECK(look_up(1) != 0.0f); // lookup 2: admitted
  look_up(2);                // lookup 3
  CHECK(held(1));            // looked up at 2, not yet 2 lookups ago
  look_up(2);                // lookup 4: 1 was last looked up at 2 <= 4 - 2
  CHECK_FALSE(held(1));
  CHECK(s.run(size) == 1);
  CHECK(s.run(evicted) == 1);
  CHECK(look_up(1) == 0.0f); // back, and counted from the start: waits again
  CHECK(s.run(waiting) == 1);
  CHECK(look_up(1) != 0.0f); // lookup 6: admitted again, and 2 (looked up at 4) is removed
  CHECK(held(1));
  CHECK_FALSE(held(2));
  CHECK(s.run(evicted) == 2);

  loom::graph bad;
  const std::string what = loom::testing::message_of<loom::invalid_argument_error>(
      [&] { loom::hash_embedding<float>(bad, "bad", 2, {.steps_to_live = -1}); });
  CHECK_MESSAGE(contains(what, "steps_to_live -1 must be 0 (never evict by age) or more"), what);
}

TEST_CASE("hash embedding summaries: each shard's rows, rows made, ids waiting and evicted, hit "
          "rate and bytes, as scalar summaries") {
  loom::graph g;
  loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
  loom::hash_embedding<float> emb(g, "t", 2, {.capacity_per_shard = 4, .evict_when_full = true});
  auto rows = emb.lookup(ids);
  auto train = loom::adam_optimizer{0.1}.minimize(loom::reduce_sum(rows));
  emb.add_summaries();
  auto merged = loom::merge_all_summaries(g);
  REQUIRE(merged);
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  auto feed = [&](std::vector<std::int64_t> list) { return feed_ids(ids, std::move(list)); };
  s.run(train, feed({1, 2, 3, 4}));
  s.run(train, feed({1, 5})); // one hit in 6 ids looked up; 5 evicts 2
  const std::string summary = s.run(*merged).item();
  // A Summary.Value: its tag (field 1) and its simple_value (field 2, a float).
  auto value = [](const std::string& tag, float v) {
    std::string bytes = "\x0a" + std::string(1, static_cast<char>(tag.size())) + tag + "\x15";
    char f[4];
    std::memcpy(f, &v, 4);
    return bytes + std::string(f, 4);
  };
  CHECK(contains(summary, value("t/part_0_of_1/rows", 4)));
  CHECK(contains(summary, value("t/part_0_of_1/made", 5)));
  CHECK(contains(summary, value("t/part_0_of_1/waiting", 0)));
  CHECK(contains(summary, value("t/part_0_of_1/evicted", 1)));
  CHECK(contains(summary, value("t/part_0_of_1/hit_rate", static_cast<float>(1.0 / 6))));
  // Rows, Adam's two slots (4 x 2 floats each) and the keys (4 int64).
  CHECK(contains(summary, value("t/part_0_of_1/bytes", 3 * 4 * 2 * 4 + 4 * 8)));
}

TEST_CASE("a read-only hash embedding lookup (an evaluation's) reads the rows there are, zeros "
          "for the other ids, and changes nothing: no row made, counted or marked used") {
  loom::graph g;
  loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
  loom::hash_embedding<float> lru(
      g, "lru", 2, {.capacity_per_shard = 2, .init_stddev = 0.5, .evict_when_full = true});
  loom::hash_embedding<float> admitting(
      g, "adm", 2, {.capacity_per_shard = 4, .admit_after = 2, .admission_counters = 4096});
  auto train = lru.lookup(ids);
  auto read = lru.lookup(ids, loom::hash_lookup::read_only);
  auto admit_train = admitting.lookup(ids);
  auto admit_read = admitting.lookup(ids, loom::hash_lookup::read_only);
  auto size = lru.size();
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  auto feed = [&](std::vector<std::int64_t> list) { return feed_ids(ids, std::move(list)); };
  const auto trained = s.run(train, feed({1, 2}));
  const auto evaluated = s.run(read, feed({1, 3}));
  for (std::int64_t k = 0; k < 2; ++k) {
    CHECK(evaluated(0, k) == trained(0, k));
    CHECK(evaluated(1, k) == 0.0f); // 3 has no row, and gets none
  }
  CHECK(s.run(size) == 2);
  s.run(train, feed({3})); // 1 and 2 were last used by the same step: 1 goes first
  const auto keys = s.run(lru.shards()[0].keys);
  CHECK(keys(0) == 3); // the read of 1 did not mark it used
  CHECK(keys(1) == 2);

  s.run(admit_read, feed({7}));
  s.run(admit_read, feed({7}));
  CHECK(s.run(admit_train, feed({7}))(0, 0) == 0.0f); // its first counted lookup
  CHECK(s.run(admit_train, feed({7}))(0, 0) != 0.0f); // its second: admitted
  CHECK(s.run(admit_read, feed({7}))(0, 0) == s.run(admit_train, feed({7}))(0, 0));
}

// A hash embedding with a disk tier (graph/hash_embedding.hpp, disk_tier_dir): rows a full
// memory tier moves out are on disk, come back when looked up, and the table trains as
// the same table all in memory does, value for value; its bad inputs are one error each.
#include <loom/api.hpp>
#include <loom/kernels/cpu/row_file.hpp>
#include <loom/train/disk_tier_checkpoint.hpp>
#include <loom/train/incremental_saver.hpp>
#include <loom/train/saver.hpp>

#include <doctest/doctest.h>
#include <support/messages.hpp>
#include <support/scratch_dir.hpp>

#include <signal.h>
#include <sys/resource.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

using loom::shape;
using loom::tensor;
using loom::testing::contains;

namespace {

loom::feed_dict feed_tier_ids(const loom::placeholder<std::int64_t, 1>& ids,
                              std::vector<std::int64_t> list) {
  const auto n = static_cast<std::int64_t>(list.size());
  return loom::feed_dict{{ids, tensor<std::int64_t, 1>(shape{n}, std::move(list))}};
}

// `count` distinct ids of [0, range), drawn from `random`.
std::vector<std::int64_t> distinct_ids(std::mt19937_64& random, int count, std::int64_t range) {
  std::set<std::int64_t> drawn;
  std::uniform_int_distribution<std::int64_t> id(0, range - 1);
  while (static_cast<int>(drawn.size()) < count)
    drawn.insert(id(random));
  return {drawn.begin(), drawn.end()};
}

// Two tables of one seed: "tiered" keeps 8 rows in memory and the rest in `dir`, "memory"
// holds every row in memory. Each step trains both on the same ids with Adam (whose slots
// must move with their rows), a loss whose gradient differs from row to row.
struct two_tables {
  loom::graph g;
  loom::placeholder<std::int64_t, 1> ids{g, shape{-1}, "ids"};
  loom::hash_embedding<float> tiered, memory;
  loom::output<float, 2> tiered_rows, memory_rows, tiered_read, memory_read;
  loom::operation train;

  explicit two_tables(const std::string& dir)
      : tiered(g, "tiered", 3,
               {.capacity_per_shard = 8, .init_stddev = 0.5, .seed = 7, .disk_tier_dir = dir}),
        memory(g, "memory", 3, {.capacity_per_shard = 256, .init_stddev = 0.5, .seed = 7}),
        tiered_rows(tiered.lookup(ids)), memory_rows(memory.lookup(ids)),
        tiered_read(tiered.lookup(ids, loom::hash_lookup::read_only)),
        memory_read(memory.lookup(ids, loom::hash_lookup::read_only)),
        train(loom::adam_optimizer{0.05}.minimize(
            loom::reduce_sum(loom::square(tiered_rows - 0.3f)) +
            loom::reduce_sum(loom::square(memory_rows - 0.3f)))) {}
};

// The rows of every id of [0, range) in both tables, read without changing either.
void check_same_rows(loom::session& s, two_tables& t, std::int64_t range) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(range));
  for (std::int64_t i = 0; i < range; ++i)
    all[static_cast<std::size_t>(i)] = i;
  const auto tiered = s.run(t.tiered_read, feed_tier_ids(t.ids, all));
  const auto memory = s.run(t.memory_read, feed_tier_ids(t.ids, all));
  for (std::int64_t i = 0; i < range; ++i)
    for (std::int64_t k = 0; k < 3; ++k) {
      INFO("id " << i << ", column " << k);
      REQUIRE(tiered(i, k) == memory(i, k));
    }
}

} // namespace

TEST_CASE("a disk tier: rows moved out of a full memory tier and back train as the same table "
          "all in memory does, value for value, slots included") {
  loom::testing::scratch_dir dir;
  two_tables t(dir / "tier");
  auto on_disk = t.tiered.on_disk();
  auto size = t.tiered.size();
  auto memory_size = t.memory.size();
  const auto& shard = t.tiered.shards()[0];
  loom::session s(t.g);
  s.run(loom::global_variables_initializer(t.g));
  std::mt19937_64 random(11);
  for (int step = 0; step < 60; ++step) // 40 ids through 8 rows: most steps move rows
    s.run(t.train, feed_tier_ids(t.ids, distinct_ids(random, 1 + step % 8, 40)));
  CHECK(s.run(on_disk) > 20);
  CHECK(s.run(size) == s.run(memory_size));
  std::int64_t in_memory = 0;
  const auto keys = s.run(shard.keys);
  for (std::int64_t r = 0; r < 8; ++r)
    in_memory += keys(r) >= 0;
  CHECK(in_memory + s.run(on_disk) == s.run(size));
  check_same_rows(s, t, 40);

  // Its file: one record (id, last lookup, values and Adam's m and v) per row it made.
  const std::string file = dir / "tier/tiered.part_0_of_1.rows";
  REQUIRE(std::filesystem::exists(file));
  const auto record = 16 + 3 * 4 * 3;
  CHECK(std::filesystem::file_size(file) % record == 0);
  CHECK(static_cast<std::int64_t>(std::filesystem::file_size(file) / record) >= s.run(on_disk));
  CHECK(s.run(loom::output<std::int64_t, 0>{t.g,
                                            t.g.add_node("hash_embedding_count", {shard.keys.id()},
                                                         {{"of", std::string("promoted")}})}) > 0);
}

TEST_CASE("a disk tier: a step that needs more room than the disk has fails with one clear error, "
          "nothing is lost, and training goes on once there is room") {
  loom::testing::scratch_dir dir;
  two_tables t(dir / "tier");
  loom::session s(t.g);
  s.run(loom::global_variables_initializer(t.g));
  std::mt19937_64 random(5);
  for (int step = 0; step < 10; ++step)
    s.run(t.train, feed_tier_ids(t.ids, distinct_ids(random, 6, 200)));
  // The process's file size limit stands in for a full disk: writes past it fail (EFBIG;
  // SIGXFSZ ignored), as ENOSPC does.
  const std::string file = dir / "tier/tiered.part_0_of_1.rows";
  rlimit before{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &before) == 0);
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit small = before;
  small.rlim_cur = std::filesystem::file_size(file);
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  // New ids need records past the file's end: a step fails within a few.
  std::string message = "<no exception>";
  for (int step = 0; step < 20 && message == "<no exception>"; ++step)
    message = loom::testing::message_of<loom::resource_exhausted_error>(
        [&] { s.run(t.train, feed_tier_ids(t.ids, distinct_ids(random, 8, 200))); });
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &before) == 0);
  ::signal(SIGXFSZ, old_handler);
  CHECK_MESSAGE(contains(message, "the disk tier's file " + file + ": no room for another row"),
                message);
  check_same_rows(s, t, 200); // every row in memory or on disk, as before the failed step
  for (int step = 0; step < 10; ++step)
    s.run(t.train, feed_tier_ids(t.ids, distinct_ids(random, 8, 200)));
  check_same_rows(s, t, 200);
}

TEST_CASE("a disk tier: a directory that cannot be made and another process's file are each "
          "one clear error") {
  loom::testing::scratch_dir dir;
  {
    std::ofstream(dir / "a_file") << "x";
    loom::graph g;
    loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
    loom::hash_embedding<float> emb(
        g, "t", 2, {.capacity_per_shard = 4, .disk_tier_dir = dir / "a_file/tier"});
    auto rows = emb.lookup(ids);
    loom::session s(g);
    s.run(loom::global_variables_initializer(g));
    const std::string message = loom::testing::message_of<loom::failed_precondition_error>(
        [&] { s.run(rows, feed_tier_ids(ids, {1})); });
    CHECK_MESSAGE(contains(message, "cannot make its disk tier's directory " + dir / "a_file/tier"),
                  message);
  }
  {
    // Two sessions (two tasks) given one directory and table: the second cannot take the file.
    loom::graph g;
    loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
    loom::hash_embedding<float> emb(g, "t", 2,
                                    {.capacity_per_shard = 4, .disk_tier_dir = dir / "shared"});
    auto rows = emb.lookup(ids);
    loom::session first(g), second(g);
    first.run(loom::global_variables_initializer(g));
    second.run(loom::global_variables_initializer(g));
    first.run(rows, feed_tier_ids(ids, {1}));
    const std::string message = loom::testing::message_of<loom::failed_precondition_error>(
        [&] { second.run(rows, feed_tier_ids(ids, {1})); });
    CHECK_MESSAGE(contains(message, "another process uses it"), message);
    CHECK_MESSAGE(contains(message, dir / "shared/t.part_0_of_1.rows"), message);
  }
}

TEST_CASE("a disk tier in checkpoints: saved beside the variables in either format, sharded or "
          "not, and restored into a fresh process's tier; training goes on value for value") {
  for (const auto format : {loom::checkpoint_format::loom, loom::checkpoint_format::tensorflow})
    for (const bool sharded : {false, true}) {
      CAPTURE(static_cast<int>(format));
      CAPTURE(sharded);
      loom::testing::scratch_dir dir;
      std::string path;
      std::mt19937_64 random(3);
      {
        two_tables t(dir / "tier_a");
        loom::saver saver(t.g, {.sharded = sharded, .format = format});
        loom::session s(t.g);
        s.run(loom::global_variables_initializer(t.g));
        for (int step = 0; step < 30; ++step)
          s.run(t.train, feed_tier_ids(t.ids, distinct_ids(random, 8, 200)));
        REQUIRE(s.run(t.tiered.on_disk()) > 50);
        path = saver.save(s, dir / "model.ckpt", 30);
      }
      // Another process's table: its tier's directory empty; the checkpoint refills it.
      two_tables t(dir / "tier_b");
      loom::saver saver(t.g, {.sharded = sharded, .format = format});
      loom::session s(t.g);
      saver.restore(s, path);
      CHECK(s.run(t.tiered.size()) == s.run(t.memory.size()));
      CHECK(s.run(t.tiered.on_disk()) > 50);
      check_same_rows(s, t, 200);
      for (int step = 0; step < 20; ++step) // the slots came back too
        s.run(t.train, feed_tier_ids(t.ids, distinct_ids(random, 8, 200)));
      check_same_rows(s, t, 200);
    }
}

TEST_CASE("a disk tier in checkpoints: a row that moves back into memory after a save read the "
          "variables is in the save's tier") {
  loom::testing::scratch_dir dir;
  two_tables t(dir / "tier");
  const auto& shard = t.tiered.shards()[0];
  loom::saver saver(t.g);
  loom::session s(t.g);
  s.run(loom::global_variables_initializer(t.g));
  s.run(t.train, feed_tier_ids(t.ids, {1, 2, 3, 4, 5, 6, 7, 8}));
  s.run(t.train, feed_tier_ids(t.ids, {9, 10, 11, 12})); // 1-4 go to disk
  // What a save does, with a step between its reading of the variables and of the tiers.
  loom::detail::disk_tier_checkpoint tiers(t.g, saver.variables());
  tiers.begin(s);
  const auto keys = s.run(shard.keys);          // the variables read: 1-4 are not among them
  s.run(t.train, feed_tier_ids(t.ids, {1, 2})); // 1 and 2 back into memory, 5 and 6 out
  std::set<std::int64_t> held;
  for (std::int64_t r = 0; r < 8; ++r)
    if (keys(r) >= 0)
      held.insert(keys(r));
  for (const auto& [name, tensor] : tiers.save(s))
    if (name == "tiered/part_0_of_1/rows/.disk_tier/keys")
      for (std::int64_t k = 0; k < tensor.num_elements(); ++k)
        held.insert(tensor.data<std::int64_t>()[k]);
  for (std::int64_t id = 1; id <= 12; ++id)
    CHECK_MESSAGE(held.count(id) == 1, "id " << id << " is in neither tier of the save");
}

TEST_CASE("a disk tier in incremental checkpoints: a full checkpoint and 3 increments, rows moving "
          "between the tiers in each, restore both tiers; training goes on value for value") {
  loom::testing::scratch_dir dir;
  std::string last;
  std::mt19937_64 random(9);
  {
    two_tables t(dir / "tier_a");
    loom::incremental_saver saver(t.g);
    loom::session s(t.g);
    s.run(loom::global_variables_initializer(t.g));
    for (int step = 0; step < 10; ++step)
      s.run(t.train, feed_tier_ids(t.ids, distinct_ids(random, 8, 200)));
    saver.save(s, dir / "model.ckpt", 10);
    for (int link = 1; link <= 3; ++link) {
      for (int step = 0; step < 8; ++step)
        s.run(t.train, feed_tier_ids(t.ids, distinct_ids(random, 8, 200)));
      last = saver.save_increment(s, dir / "model.ckpt", 10 + link);
    }
    REQUIRE(loom::incremental_saver::is_increment(last));
  }
  two_tables t(dir / "tier_b");
  loom::incremental_saver saver(t.g);
  loom::session s(t.g);
  saver.restore(s, last);
  CHECK(s.run(t.tiered.size()) == s.run(t.memory.size()));
  CHECK(s.run(t.tiered.on_disk()) > 30);
  check_same_rows(s, t, 200);
  for (int step = 0; step < 20; ++step)
    s.run(t.train, feed_tier_ids(t.ids, distinct_ids(random, 8, 200)));
  check_same_rows(s, t, 200);
}

TEST_CASE("a hash table saved in one count of shards is refused by a table of another count, "
          "in either format, with one error naming both counts") {
  loom::testing::scratch_dir dir;
  auto tiered_table = [&](loom::graph& g, std::int64_t shards) {
    return loom::hash_embedding<float>(
        g, "t", 2, {.capacity_per_shard = 2, .num_shards = shards, .disk_tier_dir = dir / "tier"});
  };
  for (const auto format : {loom::checkpoint_format::loom, loom::checkpoint_format::tensorflow}) {
    CAPTURE(static_cast<int>(format));
    {
      loom::graph g;
      loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
      auto t = tiered_table(g, 2);
      auto rows = t.lookup(ids);
      loom::session s(g);
      s.run(loom::global_variables_initializer(g));
      for (std::int64_t id = 1; id <= 8; id += 2) // 4 of them end on disk
        s.run(rows, feed_tier_ids(ids, {id, id + 1}));
      loom::saver(g, {.format = format}).save(s, dir / "model");
    }
    loom::graph g;
    auto t = tiered_table(g, 3);
    loom::session s(g);
    s.run(loom::global_variables_initializer(g));
    const std::string what = loom::testing::message_of<loom::invalid_argument_error>(
        [&] { loom::saver(g).restore(s, dir / "model"); });
    CHECK_MESSAGE(contains(what, "hash embedding 't' was saved in 2 shards and has 3 here: a hash "
                                 "table restores only into the shard count it was saved with"),
                  what);
  }
}

TEST_CASE("a disk tier's file lets go of its aged rows oldest first, each once, through "
          "erases, puts again and rebuilds of its age order") {
  loom::testing::scratch_dir dir;
  loom::kernels::row_file tier(dir / "t.rows", sizeof(double));
  const auto put = [&](std::int64_t id, std::int64_t last_lookup) {
    const double payload = static_cast<double>(id);
    tier.put(id, last_lookup, &payload);
  };
  using ids = std::vector<std::int64_t>;
  put(10, 5);
  put(11, 1);
  put(12, 3);
  put(13, 9);
  CHECK(tier.erase_aged(0) == ids{});
  CHECK(tier.erase_aged(3) == ids{11, 12});
  CHECK(tier.rows() == 2);
  CHECK(tier.find(11) == nullptr);
  // Erased and put again with the same last lookup: two entries in the order, one id.
  tier.erase(10);
  put(10, 5);
  CHECK(tier.erase_aged(5) == ids{10});
  // Erased and put again later: its first entry is not its age.
  put(20, 4);
  tier.erase(20);
  put(20, 8);
  CHECK(tier.erase_aged(6) == ids{});
  CHECK(tier.erase_aged(8) == ids{20});
  // Thousands of rows come and go (promoted back to memory): the order is rebuilt from the
  // rows held, and keeps them.
  put(8, 55);
  for (std::int64_t id = 1000; id < 6000; ++id) {
    put(id, 50);
    tier.erase(id);
  }
  CHECK(tier.erase_aged(54) == ids{13});
  CHECK(tier.erase_aged(55) == ids{8});
  CHECK(tier.rows() == 0);
  // The aged rows' records are reused, and a record holds what was put there.
  loom::kernels::row_file small(dir / "small.rows", sizeof(double));
  for (std::int64_t id : {1, 2}) {
    const double payload = static_cast<double>(id);
    small.put(id, id, &payload);
  }
  const std::int64_t bytes = small.bytes();
  CHECK(small.erase_aged(2) == ids{1, 2});
  for (std::int64_t id : {3, 4}) {
    const double payload = static_cast<double>(id);
    small.put(id, 9, &payload);
  }
  CHECK(small.bytes() == bytes);
  double payload = 0;
  small.get(*small.find(4), &payload);
  CHECK(payload == 4.0);
}

TEST_CASE("a disk tier ages its rows out as memory does: each lookup lets go of those aged, "
          "never in a checkpoint once aged") {
  loom::testing::scratch_dir dir;
  loom::graph g;
  loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
  loom::hash_embedding<float> t(
      g, "t", 2, {.capacity_per_shard = 2, .steps_to_live = 6, .disk_tier_dir = dir / "tier"});
  auto rows = t.lookup(ids);
  auto on_disk = t.on_disk();
  auto evicted = t.evicted();
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  // Lookups 1-4 (the shard's clock): ids 1 and 2 move to disk; then id 100 alone, so no
  // lookup brings them back.
  for (std::int64_t id : {1, 2, 3, 4, 100, 100, 100, 100})
    s.run(rows, feed_tier_ids(ids, {id}));
  // Lookup 7 let id 1 go (last looked up at 1), lookup 8 id 2 (at 2). Id 3 moved out at
  // lookup 5 and is live.
  CHECK(s.run(on_disk) == 1);
  loom::saver(g, {.format = loom::checkpoint_format::loom}).save(s, dir / "model");
  const loom::any_tensor saved =
      loom::checkpoint_reader(dir / "model").read_tensor("t/part_0_of_1/rows/.disk_tier/keys");
  REQUIRE(saved.num_elements() == 1);
  CHECK(saved.data<std::int64_t>()[0] == 3);
  CHECK(s.run(on_disk) == 1);
  for (int step = 0; step < 8; ++step) // lookup 9 lets id 3 go, lookup 10 memory's id 4
    s.run(rows, feed_tier_ids(ids, {100}));
  CHECK(s.run(on_disk) == 0);
  CHECK(s.run(evicted) == 4);
}

// Incremental checkpoints (train/incremental_saver.hpp): an increment holds the rows
// written since the last save (new rows, evicted ones, updated ones with their slots)
// and every other variable; a chain of increments restores every value exactly; a
// chain with a missing or damaged link is refused, naming the file.
#include <loom/api.hpp>
#include <loom/train/incremental_saver.hpp>

#include <doctest/doctest.h>
#include <support/messages.hpp>
#include <support/process.hpp>
#include <support/scratch_dir.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace incremental_saver_tests {

namespace fs = std::filesystem;
using loom::testing::contains;
using loom::testing::message_of;
using loom::testing::scratch_dir;

// A hash table of 2 shards of 4 rows that evicts when full, trained by Adagrad (a slot),
// beside a dense variable.
struct model {
  loom::graph g;
  loom::placeholder<std::int64_t, 1> ids{g, loom::shape{-1}, "ids"};
  loom::hash_embedding<float> emb{
      g, "emb", 3, {.capacity_per_shard = 4, .num_shards = 2, .evict_when_full = true}};
  loom::variable<float, 1> w{g, "w", loom::shape{3}, loom::constant_initializer{0.5}};
  loom::output<float, 2> looked_up = emb.lookup(ids);
  loom::operation train =
      loom::adagrad_optimizer{0.5}.minimize(loom::lower(loom::reduce_sum(looked_up * w)));
  loom::output<float, 2> read = emb.lookup(ids, loom::hash_lookup::read_only);

  void step(loom::session& s, std::vector<std::int64_t> v) const {
    const auto n = static_cast<std::int64_t>(v.size());
    s.run(train, {{ids, loom::tensor<std::int64_t, 1>(loom::shape{n}, std::move(v))}});
  }
  // Every variable's value, by name.
  std::vector<std::pair<std::string, loom::any_tensor>> values(loom::session& s) const {
    std::vector<loom::node_id> vars = g.collection(loom::collection::global_variables);
    std::vector<loom::any_tensor> got = s.run_nodes(vars, {});
    std::vector<std::pair<std::string, loom::any_tensor>> out;
    for (std::size_t i = 0; i < vars.size(); ++i)
      out.emplace_back(g.node(vars[i]).name, std::move(got[i]));
    return out;
  }
};

loom::session_options opts() {
  return {.intra_op_threads = 1};
}

// The rows an increment holds, over every shard.
std::int64_t rows_in(const std::string& path) {
  loom::checkpoint_reader r(path);
  std::int64_t n = 0;
  for (const auto& e : r.entries())
    if (contains(e.name, "/.changed_rows"))
      n += e.shape.num_elements();
  return n;
}

// The model, its incremental saver, a directory and an initialized session.
struct chain {
  model m;
  loom::incremental_saver saver{m.g};
  scratch_dir dir;
  loom::session s{m.g, opts()};
  chain() { s.run(loom::global_variables_initializer(m.g)); }
};

bool same(const loom::any_tensor& a, const loom::any_tensor& b) {
  if (a.type() != b.type() || !(a.shape() == b.shape()))
    return false;
  if (a.type() == loom::dtype::i64)
    return std::equal(a.data<std::int64_t>(), a.data<std::int64_t>() + a.num_elements(),
                      b.data<std::int64_t>());
  return std::equal(a.data<float>(), a.data<float>() + a.num_elements(), b.data<float>());
}

TEST_CASE_FIXTURE(
    chain, "increments hold the rows written since the last save; a chain restores every value") {
  CHECK(contains(message_of<loom::failed_precondition_error>(
                     [&] { saver.save_increment(s, dir / "model", 1); }),
                 "save a full checkpoint (save) or restore one first"));
  m.step(s, {0, 1, 2, 3, 4, 5}); // shard 0: 0, 2, 4; shard 1: 1, 3, 5
  const std::string base = saver.save(s, dir / "model", 1);
  m.step(s, {2, 7}); // 2 updated, 7 a new row of shard 1
  const std::string first = saver.save_increment(s, dir / "model", 2);
  CHECK(first == dir / "model-2");
  CHECK(rows_in(first) == 2);
  m.step(s, {9, 11}); // shard 1 is full (1, 3, 5, 7): 9 and 11 evict 1 and 3
  const std::string second = saver.save_increment(s, dir / "model", 3);
  CHECK(rows_in(second) == 2); // the rows 9 and 11 took
  // A lookup without an update: 13 evicts 5 and takes its row (its slot restarted).
  s.run(m.looked_up, {{m.ids, loom::tensor<std::int64_t, 1>(loom::shape{1}, {13})}});
  const std::string third = saver.save_increment(s, dir / "model", 4);
  CHECK(rows_in(third) == 1);
  const std::string fourth = saver.save_increment(s, dir / "model", 5);
  CHECK(rows_in(fourth) == 0); // nothing written since
  CHECK(loom::latest_checkpoint(dir.path) == fourth);
  CHECK(loom::incremental_saver::is_increment(fourth));
  CHECK_FALSE(loom::incremental_saver::is_increment(base));
  const auto want = m.values(s);

  loom::session fresh(m.g, opts());
  saver.restore(fresh, fourth);
  const auto got = m.values(fresh);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    CHECK_MESSAGE(same(got[i].second, want[i].second), got[i].first);
  // The index is rebuilt from the restored keys: id 9 has its row, id 1 has none.
  const auto rows =
      fresh.run(m.read, {{m.ids, loom::tensor<std::int64_t, 1>(loom::shape{2}, {9, 1})}});
  CHECK(rows(0, 0) != 0.0f);
  CHECK(rows(1, 0) == 0.0f);

  // The restored chain goes on: the next increment follows the fourth.
  m.step(fresh, {4});
  const std::string fifth = saver.save_increment(fresh, dir / "model", 6);
  CHECK(rows_in(fifth) == 1);
  CHECK(loom::checkpoint_reader(fifth).read_tensor("_increment/previous").data<std::string>()[0] ==
        "model-5");
}

TEST_CASE_FIXTURE(chain, "a chain with a missing or damaged link is refused, naming the file") {
  m.step(s, {0, 1});
  saver.save(s, dir / "model", 1);
  m.step(s, {2});
  const std::string first = saver.save_increment(s, dir / "model", 2);
  m.step(s, {3});
  const std::string second = saver.save_increment(s, dir / "model", 3);

  // A saver restores no increment.
  loom::saver plain(m.g);
  CHECK(contains(message_of<loom::invalid_argument_error>([&] { plain.restore(s, second); }),
                 "is an increment of a chain: restore it with loom::incremental_saver"));

  // A damaged link: its checksum.
  const std::string copy = dir / "copy";
  fs::copy_file(first, copy);
  {
    std::fstream f(first, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  const std::string damaged = message_of<loom::data_loss_error>([&] { saver.restore(s, second); });
  CHECK_MESSAGE(contains(damaged, first), damaged);

  // A missing link.
  fs::remove(first);
  const std::string missing = message_of<loom::not_found_error>([&] { saver.restore(s, second); });
  CHECK_MESSAGE(contains(missing, "its chain's link " + first + " is missing"), missing);
  fs::rename(copy, first);
  saver.restore(s, second); // whole again

  // A missing base.
  fs::remove(dir / "model-1.index");
  const std::string no_base = message_of<loom::not_found_error>([&] { saver.restore(s, second); });
  CHECK_MESSAGE(contains(no_base, "(the full checkpoint it is based on) is missing"), no_base);
}

TEST_CASE_FIXTURE(chain,
                  "a shard whose rows were assigned whole since the last save gives every row") {
  m.step(s, {0, 1});
  saver.save(s, dir / "model", 1);
  s.run(loom::global_variables_initializer(m.g)); // every row assigned: the stamps go
  const std::string path = saver.save_increment(s, dir / "model", 2);
  CHECK(rows_in(path) == 8); // both shards' 4 rows
  m.step(s, {5});
  CHECK(rows_in(saver.save_increment(s, dir / "model", 3)) == 1);
}

TEST_CASE("increments go with their base: max_to_keep counts full checkpoints") {
  model m;
  loom::incremental_saver saver(m.g, {.max_to_keep = 1});
  loom::incremental_saver restarted(m.g, {.max_to_keep = 1}); // a restarted chief's, below
  scratch_dir dir;
  loom::session s(m.g, opts());
  s.run(loom::global_variables_initializer(m.g));
  saver.save(s, dir / "model", 1);
  m.step(s, {0});
  const std::string old_link = saver.save_increment(s, dir / "model", 2);
  const std::string base = saver.save(s, dir / "model", 3); // the first base goes, its link too
  CHECK_FALSE(fs::exists(old_link));
  CHECK_FALSE(fs::exists(dir / "model-1.index"));
  m.step(s, {1});
  const std::string link = saver.save_increment(s, dir / "model", 4);
  const auto state = loom::get_checkpoint_state(dir.path);
  REQUIRE(state);
  CHECK(state->all_model_checkpoint_paths == std::vector<std::string>{base, link});
  // Another saver (a restarted chief's) finds the chain through the state file, and drops
  // it with its base.
  restarted.restore(s, *loom::latest_checkpoint(dir.path));
  restarted.save(s, dir / "model", 5);
  CHECK_FALSE(fs::exists(link));
  CHECK(fs::exists(dir / "model-5.index"));
}

TEST_CASE_FIXTURE(
    chain, "loom-ckpt says which link of which chain an increment is, and its rows per shard") {
  const std::string tool = LOOM_CKPT_BIN;
  if (tool.empty()) {
    MESSAGE("LOOM_BUILD_TOOLS is off: loom-ckpt not built, skipped");
    return;
  }
  saver.save(s, dir / "model", 1);
  m.step(s, {0, 1, 3});
  saver.save_increment(s, dir / "model", 2);
  m.step(s, {5});
  const std::string path = saver.save_increment(s, dir / "model", 3);
  loom::testing::child c(tool, {path});
  const auto st = c.wait(std::chrono::seconds(60));
  REQUIRE_MESSAGE(st, c.report());
  CHECK_MESSAGE(st->success(), c.output());
  CHECK_MESSAGE(contains(c.output(), "incremental checkpoint: link 2 of the chain based on "
                                     "model-1 (previous: model-2)\n"),
                c.output());
  CHECK_MESSAGE(contains(c.output(), "emb/part_0_of_2: 0\n"), c.output());
  CHECK_MESSAGE(contains(c.output(), "emb/part_1_of_2: 1\n"), c.output()); // id 5
}

TEST_CASE("a restarted chief's saver, counting its epochs from 1 again, is answered with the "
          "rows written since its own full save") {
  model m;
  loom::incremental_saver saver(m.g);
  loom::incremental_saver restarted(m.g); // a restarted chief's, on a ps that kept running
  scratch_dir dir;
  loom::session s(m.g, opts());
  s.run(loom::global_variables_initializer(m.g));
  saver.save(s, dir / "model", 1);
  for (std::int64_t step = 2; step <= 4; ++step) { // the first saver's epochs go to 4
    m.step(s, {step});
    saver.save_increment(s, dir / "model", step);
  }
  restarted.save(s, dir / "model", 5); // its epoch 1
  m.step(s, {6});
  CHECK(rows_in(restarted.save_increment(s, dir / "model", 6)) == 1);
}

} // namespace incremental_saver_tests

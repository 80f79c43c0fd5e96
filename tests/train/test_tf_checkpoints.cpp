// TensorFlow's checkpoint format in loom programs: checkpoints TensorFlow wrote
// (tests/data/tf_checkpoints) restore into loom models bit for bit (the seed MLP with
// its Adam slots; a 3-way partitioned embedding into 2 and 5 shards), the saver writes
// TF's format under TF's names (partitioned variables as their slices of the whole,
// var_names), init_from_checkpoint warm-starts under other names, and every bad input
// is one clear error that leaves a good checkpoint as it was.
#include <loom/api.hpp>
#include <loom/core/tensor_bundle.hpp>
#include <loom/train/init_from_checkpoint.hpp>
#include <loom/train/saver.hpp>

#include <doctest/doctest.h>
#include <support/messages.hpp>
#include <support/scratch_dir.hpp>

#include <unistd.h>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace tf_checkpoints {

namespace fs = std::filesystem;
using loom::shape;
using loom::testing::contains;
using loom::testing::scratch_dir;

const std::string fixtures = std::string(LOOM_TEST_SOURCE_DIR) + "/tests/data/tf_checkpoints/";

// What TF read back from a fixture (PREFIX.expected.txt): each tensor's values as
// the file writes them (floats as the hex of their bits), by name.
std::map<std::string, std::vector<std::string>> expected_values(const std::string& prefix) {
  std::ifstream in(prefix + ".expected.txt");
  REQUIRE(in);
  std::map<std::string, std::vector<std::string>> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string kind, name, dtype, dims, value;
    fields >> kind >> name >> dtype >> dims;
    if (kind != "tensor")
      continue;
    auto& values = out[name];
    while (fields >> value)
      values.push_back(value);
  }
  return out;
}

std::string bits_of(float v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", std::bit_cast<std::uint32_t>(v));
  return buf;
}
std::vector<std::string> values_of(const loom::any_tensor& t) {
  std::vector<std::string> out;
  if (t.type() == loom::dtype::f32)
    for (float v : t.flat<float>())
      out.push_back(bits_of(v));
  else if (t.type() == loom::dtype::i64)
    for (std::int64_t v : t.flat<std::int64_t>())
      out.push_back(std::to_string(v));
  return out;
}
template <class T, int R> std::vector<std::string> values_of(const loom::tensor<T, R>& t) {
  return values_of(t.value());
}
// Rows [begin, begin + n) of a [rows, width] tensor's expected values.
std::vector<std::string> rows_of(const std::vector<std::string>& all, std::int64_t width,
                                 std::int64_t begin, std::int64_t n) {
  return {all.begin() + begin * width, all.begin() + (begin + n) * width};
}

// The seed MLP (20 -> 8 -> 3) under the fixture's names, with Adam's slots.
struct seed_mlp {
  loom::graph g;
  loom::placeholder<float, 2> x{g, shape{-1, 20}, "x"};
  loom::variable<float, 2> hid_w{g, "hid_w", shape{20, 8}, loom::zeros_initializer{}};
  loom::variable<float, 1> hid_b{g, "hid_b", shape{8}, loom::zeros_initializer{}};
  loom::variable<float, 2> sm_w{g, "sm_w", shape{8, 3}, loom::zeros_initializer{}};
  loom::variable<float, 1> sm_b{g, "sm_b", shape{3}, loom::zeros_initializer{}};
  loom::variable<std::int64_t, 0> step = loom::create_global_step(g);
  loom::adam_optimizer adam{0.01};
  loom::operation train =
      adam.minimize(loom::reduce_sum(loom::square(
                        loom::matmul(loom::relu(loom::matmul(x, hid_w) + hid_b), sm_w) + sm_b)),
                    step);
};

TEST_CASE("TF's MLP checkpoint with Adam slots restores into a loom model bit for bit") {
  const std::string prefix = fixtures + "mlp_adam/model.ckpt-3";
  const auto expected = expected_values(prefix);
  seed_mlp m;
  loom::saver saver(m.g);
  loom::session s(m.g);
  saver.restore(s, prefix);
  // Every variable loom made is one TF saved, under TF's name: the weights, Adam's
  // slots (w/Adam, w/Adam_1), beta1_power, beta2_power and global_step.
  CHECK(saver.variables().size() == expected.size());
  for (const auto& v : saver.variables()) {
    INFO(v.name);
    REQUIRE(expected.contains(v.name));
    CHECK(values_of(s.run_nodes({v.variable}, {})[0]) == expected.at(v.name));
  }
  CHECK(s.run(m.step).item() == 3);
}

// A [10, 4] embedding "emb" in `shards` parts with Adagrad's slots, read by a lookup
// spread by `strategy`, or by none (its whole value).
struct embedding {
  loom::graph g;
  loom::partitioned_variable<float, 2> emb;
  loom::placeholder<std::int64_t, 1> ids{g, shape{-1}, "ids"};
  loom::adagrad_optimizer adagrad{0.1};
  std::optional<loom::output<float, 2>> looked_up;
  embedding(std::int64_t shards, std::optional<loom::partition_strategy> strategy)
      : emb(loom::get_variable<float, 2>(g, "emb", shape{10, 4}, loom::zeros_initializer{},
                                         loom::fixed_size_partitioner{shards})) {
    if (strategy)
      looked_up = loom::embedding_lookup(emb, ids, *strategy);
    adagrad.minimize(loom::reduce_sum(loom::square(looked_up ? *looked_up : emb.value())));
  }
};

TEST_CASE("TF's 3-way partitioned embedding restores into 2 and 5 shards bit for bit") {
  const std::string prefix = fixtures + "partitioned/model.ckpt-2";
  const auto expected = expected_values(prefix);
  for (const std::int64_t shards : {2, 3, 5}) {
    INFO(shards << " shards");
    {
      // No lookup says how ids spread: each shard is its slice of TF's whole
      // tensor, as TF restores it into its own partitioning.
      embedding e(shards, std::nullopt);
      loom::saver saver(e.g, {.var_list = e.g.collection(loom::collection::global_variables)});
      loom::session s(e.g);
      saver.restore(s, prefix);
      std::int64_t begin = 0;
      for (std::int64_t p = 0; p < shards; ++p) {
        const auto& shard = e.emb.shards()[static_cast<std::size_t>(p)];
        const auto slot = e.adagrad.get_slot(e.g, shard.id(), "accumulator");
        REQUIRE(slot);
        const auto value = s.run(shard);
        const std::int64_t n = value.shape()[0];
        CHECK(values_of(value) == rows_of(expected.at("emb"), 4, begin, n));
        CHECK(values_of(s.run_nodes({*slot}, {})[0]) ==
              rows_of(expected.at("emb/Adagrad"), 4, begin, n));
        begin += n;
      }
      CHECK(begin == 10);
    }
    {
      // Looked up with "mod" (TF's default, as the fixture was): every id keeps
      // the row TF trained for it, in any count of shards.
      embedding e(shards, loom::partition_strategy::mod);
      loom::saver saver(e.g);
      loom::session s(e.g);
      saver.restore(s, prefix);
      loom::tensor<std::int64_t, 1> all(shape{10});
      for (std::int64_t i = 0; i < 10; ++i)
        all(i) = i;
      const auto got = s.run(*e.looked_up, {{e.ids, all}});
      for (std::int64_t id = 0; id < 10; ++id) {
        // TF's 3 shards hold id i at row i / 3 of shard i % 3: rows 0-3, 4-6, 7-9.
        const auto at = loom::detail::id_at(id % 3, id / 3, 3, 10, true);
        CHECK(values_of(got).at(static_cast<std::size_t>(id * 4)) ==
              expected.at("emb").at(static_cast<std::size_t>(at * 4)));
      }
    }
  }
}

// The saver's TF format, read back by the bundle reader (as TF reads it): TF's names,
// a partitioned variable as one tensor with its parts' slices.
TEST_CASE("the saver writes TF's format under TF's names, restored by either reader") {
  scratch_dir dir;
  embedding e(3, loom::partition_strategy::div);
  loom::saver saver(e.g, {.max_to_keep = 2, .format = loom::checkpoint_format::tensorflow});
  loom::session s(e.g);
  s.run(loom::global_variables_initializer(e.g));
  for (std::int64_t p = 0; p < 3; ++p) {
    const auto& shard = e.emb.shards()[static_cast<std::size_t>(p)];
    loom::tensor<float, 2> rows(s.run(shard).shape());
    for (std::int64_t i = 0; i < rows.size(); ++i)
      rows.flat()[i] = static_cast<float>(p * 100 + i);
    s.run(shard.assign(loom::constant(e.g, rows)));
  }
  const std::string path = saver.save(s, dir / "model.ckpt", 7);
  CHECK(path == dir / "model.ckpt-7");
  CHECK(fs::exists(path + ".index"));
  CHECK(fs::exists(path + ".data-00000-of-00001"));
  CHECK(loom::latest_checkpoint(dir.path) == path);
  const loom::tensor_bundle::reader r(path);
  const auto* emb = r.find("emb");
  REQUIRE(emb);
  CHECK((emb->shape == shape{10, 4}));
  REQUIRE(emb->slices.size() == 3);
  CHECK(emb->slices[0].to_string() == "0,4:0,4"); // TF's save_slice_info, as TF writes it
  CHECK(emb->slices[2].to_string() == "7,3:0,4");
  CHECK(r.find("emb/Adagrad"));
  CHECK_FALSE(r.find("emb/part_0")); // parts are slices of the whole, not names
  const auto whole = r.read_tensor("emb");
  CHECK(whole.data<float>()[4 * 4] == 100.0f); // row 4: shard 1's first
  // Into 2 shards: each its rows of the whole.
  embedding two(2, loom::partition_strategy::div);
  loom::session s2(two.g);
  loom::saver(two.g).restore(s2, *loom::latest_checkpoint(dir.path));
  CHECK(s2.run(two.emb.shards()[1]).flat()[0] == 100.0f + 4.0f); // id 5: shard 1's row 1
  // max_to_keep: TF's files of the oldest go.
  saver.save(s, dir / "model.ckpt", 8);
  saver.save(s, dir / "model.ckpt", 9);
  CHECK_FALSE(fs::exists(path + ".index"));
  CHECK_FALSE(fs::exists(path + ".data-00000-of-00001"));
  CHECK(loom::detail::checkpoint_files_in(dir.path) ==
        std::vector<std::string>{dir / "model.ckpt-8", dir / "model.ckpt-9"});
}

TEST_CASE("var_names saves variables under other names, and restores them from those") {
  scratch_dir dir;
  loom::graph g;
  loom::variable<float, 1> w(g, "w", shape{3}, loom::constant_initializer{2.5});
  auto emb = loom::get_variable<float, 2>(g, "emb", shape{5, 2}, loom::constant_initializer{1.0},
                                          loom::fixed_size_partitioner{2});
  const std::vector<std::pair<std::string, loom::node_id>> names{
      {"old/w", w.id()}, {"old/emb", emb.shards()[0].id()}, {"old/emb", emb.shards()[1].id()}};
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  for (const auto format : {loom::checkpoint_format::tensorflow, loom::checkpoint_format::loom}) {
    loom::saver saver(g, {.var_names = names, .format = format});
    const std::string path = saver.save(s, dir / "renamed");
    if (format == loom::checkpoint_format::tensorflow) {
      const loom::tensor_bundle::reader r(path);
      CHECK(r.find("old/w"));
      REQUIRE(r.find("old/emb"));
      CHECK(r.find("old/emb")->slices.size() == 2);
      CHECK_FALSE(r.find("w"));
    } else {
      const loom::checkpoint_reader r(path);
      CHECK(r.find("old/w"));
      CHECK(r.find("old/emb/part_1"));
    }
    s.run(w.assign(loom::constant(g, loom::tensor<float, 1>(shape{3}, 0.0f))));
    saver.restore(s, path);
    CHECK(s.run(w).flat()[2] == 2.5f);
    fs::remove(path);
    fs::remove(path + ".index");
  }
  CHECK_THROWS_WITH_AS(loom::saver(g, {.var_names = {{"x", w.id()}, {"x", emb.shards()[0].id()}}}),
                       doctest::Contains("are both saved as 'x'"), loom::invalid_argument_error);
}

TEST_CASE("an evaluation graph restores the moving averages into its variables (TF's way)") {
  scratch_dir dir;
  std::string path;
  {
    // Training: w moves to 10, its average to 4 + 0.5 (10 - 4) = 7.
    loom::graph g;
    auto step = loom::create_global_step(g);
    loom::variable<float, 1> w(g, "w", shape{2}, loom::constant_initializer{4.0});
    loom::exponential_moving_average ema(0.5);
    auto update = ema.apply(g, {w.id()});
    loom::session s(g);
    s.run(loom::global_variables_initializer(g));
    s.run(w.assign(loom::constant(g, loom::tensor<float, 1>(shape{2}, 10.0f))));
    s.run(update);
    s.run(step.assign(loom::constant(g, std::int64_t{42})));
    path = loom::saver(g).save(s, dir / "model.ckpt");
  }
  // Evaluation: no apply(); w reads its shadow, the step itself.
  loom::graph g;
  auto step = loom::create_global_step(g);
  loom::variable<float, 1> w(g, "w", shape{2}, loom::constant_initializer{0.0});
  loom::session s(g);
  loom::saver(g, {.var_names = loom::exponential_moving_average(0.5).variables_to_restore(g)})
      .restore(s, path);
  CHECK(s.run(w).flat()[1] == 7.0f);
  CHECK(s.run(step).flat()[0] == 42);
}

TEST_CASE("init_from_checkpoint warm-starts scopes and single variables under other names") {
  const std::string mlp = fixtures + "mlp_adam/model.ckpt-3";
  const auto expected = expected_values(mlp);
  loom::graph g;
  loom::variable<float, 2> hid_w(g, "model/hid_w", shape{20, 8}, loom::zeros_initializer{});
  loom::variable<float, 1> hid_b(g, "model/hid_b", shape{8}, loom::zeros_initializer{});
  loom::variable<float, 2> head(g, "head/w", shape{8, 3}, loom::zeros_initializer{});
  loom::variable<float, 1> fresh(g, "fresh", shape{2}, loom::constant_initializer{7.0});
  auto table = loom::get_variable<float, 2>(g, "table", shape{10, 4}, loom::zeros_initializer{},
                                            loom::fixed_size_partitioner{4});
  loom::init_from_checkpoint(g, mlp, {{"/", "model/"}, {"sm_w", "head/w"}});
  loom::init_from_checkpoint(g, fixtures + "partitioned/model.ckpt-2", {{"emb", "table"}});
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  CHECK(values_of(s.run(hid_w)) == expected.at("hid_w"));
  CHECK(values_of(s.run(hid_b)) == expected.at("hid_b"));
  CHECK(values_of(s.run(head)) == expected.at("sm_w"));
  CHECK(s.run(fresh).flat()[1] == 7.0f); // untouched: its own initializer
  // 4 shards of TF's 3 parts: each its slice, read from the parts it overlaps.
  const auto emb = expected_values(fixtures + "partitioned/model.ckpt-2").at("emb");
  std::int64_t begin = 0;
  for (const auto& shard : table.shards()) {
    const auto value = s.run(shard);
    CHECK(values_of(value) == rows_of(emb, 4, begin, value.shape()[0]));
    begin += value.shape()[0];
  }
}

TEST_CASE("init_from_checkpoint: a map entry matching nothing, a missing tensor, a shape "
          "mismatch: one clear error each, the graph unchanged") {
  const std::string mlp = fixtures + "mlp_adam/model.ckpt-3";
  loom::graph g;
  loom::variable<float, 2> hid_w(g, "model/hid_w", shape{20, 8}, loom::zeros_initializer{});
  const auto nodes = g.size();
  auto error = [&](std::vector<std::pair<std::string, std::string>> map) {
    try {
      loom::init_from_checkpoint(g, mlp, map);
    } catch (const loom::error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  CHECK(contains(error({{"/", "modle/"}}),
                 "assignment map entry {'/': 'modle/'}: no variable of the graph is in scope "
                 "'modle/' (nearest: 'model/hid_w')"));
  CHECK(contains(error({{"hid_w", "model/hid"}}), "names no variable of the graph (nearest: "
                                                  "'model/hid_w')"));
  CHECK(contains(error({{"hid_ww", "model/hid_w"}}),
                 "has no tensor 'hid_ww' for variable 'model/hid_w' (nearest: 'hid_w'"));
  CHECK(contains(error({{"sm_w", "model/hid_w"}}),
                 "tensor 'sm_w' of checkpoint " + mlp +
                     " is float32[8, 3], variable 'model/hid_w' is float32[20, 8]"));
  CHECK(contains(error({{"/", "model/"}, {"nope/", "none/"}}), "no variable of the graph"));
  CHECK(g.size() == nodes); // every entry checked before the graph changes
  CHECK(contains(error({{"x", "model/"}}), "a scope maps to a scope"));
}

TEST_CASE("restoring TF's format: a missing name lists the nearest, a shape or dtype mismatch "
          "names both, a corrupt byte the file and the tensor; a failed save leaves the "
          "checkpoint of its name as it was") {
  scratch_dir dir;
  seed_mlp m;
  loom::saver saver(m.g, {.format = loom::checkpoint_format::tensorflow});
  loom::session s(m.g);
  s.run(loom::global_variables_initializer(m.g));
  const std::string path = saver.save(s, dir / "model");
  {
    loom::graph g; // another model: hid_w renamed, sm_w reshaped
    loom::variable<float, 2> w(g, "hid_ww", shape{20, 8}, loom::zeros_initializer{});
    loom::session s2(g);
    CHECK_THROWS_WITH_AS(loom::saver(g).restore(s2, path),
                         doctest::Contains("no tensor 'hid_ww' for the variable 'hid_ww' "
                                           "(nearest: 'hid_w'"),
                         loom::not_found_error);
    loom::graph g2;
    loom::variable<float, 2> sm(g2, "sm_w", shape{3, 8}, loom::zeros_initializer{});
    loom::session s3(g2);
    CHECK_THROWS_WITH_AS(loom::saver(g2).restore(s3, path),
                         doctest::Contains("tensor 'sm_w' has shape [8, 3], the variable 'sm_w' "
                                           "has [3, 8]"),
                         loom::invalid_argument_error);
    loom::graph g3;
    loom::variable<double, 1> b(g3, "sm_b", shape{3}, loom::zeros_initializer{});
    loom::session s5(g3);
    CHECK_THROWS_WITH_AS(loom::saver(g3).restore(s5, path),
                         doctest::Contains("tensor 'sm_b' is float32, the variable 'sm_b' is "
                                           "float64"),
                         loom::invalid_argument_error);
  }
  {
    // A corrupt byte in a copy's data: the restore names the data file and the tensor.
    const std::string copy = dir / "copy";
    fs::copy_file(path + ".index", copy + ".index");
    fs::copy_file(path + ".data-00000-of-00001", copy + ".data-00000-of-00001");
    const loom::tensor_bundle::reader r(copy);
    const auto offset = static_cast<std::streamoff>(r.find("hid_b")->offset);
    {
      std::fstream f(copy + ".data-00000-of-00001",
                     std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(offset);
      const char c = static_cast<char>(f.get());
      f.seekp(offset);
      f.put(static_cast<char>(c ^ 0x20));
    }
    seed_mlp other;
    loom::session s6(other.g);
    const std::string what = loom::testing::message_of<loom::data_loss_error>(
        [&] { loom::saver(other.g).restore(s6, copy); });
    CHECK_MESSAGE(contains(what, copy + ".data-00000-of-00001: tensor 'hid_b' fails its checksum"),
                  what);
    fs::remove(copy + ".index");
    fs::remove(copy + ".data-00000-of-00001");
  }
  // A save that fails (a variable never initialized) writes nothing over it.
  const std::string index = [&] {
    std::ifstream in(path + ".index", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  seed_mlp fresh;
  loom::saver other(fresh.g, {.format = loom::checkpoint_format::tensorflow});
  loom::session s4(fresh.g);
  CHECK_THROWS(other.save(s4, dir / "model"));
  std::vector<std::string> files;
  for (const auto& f : fs::directory_iterator(dir.path))
    files.push_back(f.path().filename().string());
  std::sort(files.begin(), files.end());
  CHECK(files ==
        std::vector<std::string>{"checkpoint", "model.data-00000-of-00001", "model.index"});
  std::ifstream in(path + ".index", std::ios::binary);
  CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == index);
  saver.restore(s, path); // still whole
}

} // namespace tf_checkpoints

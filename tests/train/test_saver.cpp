// Checkpoints: a save/restore round trip of every dtype, max_to_keep and the
// state file, latest_checkpoint, corrupt and truncated files, mismatched and
// missing variables, failed saves that leave the previous checkpoint intact (in
// loom's format), a checkpoint saved on 2 ps tasks restored on 1, partitioned and
// sharded saves in both formats, and the loom-ckpt tool.
#include <loom/api.hpp>
#include <loom/core/tensor_bundle.hpp>
#include <loom/train/saver.hpp>

#include <doctest/doctest.h>
#include <support/cluster.hpp>
#include <support/messages.hpp>
#include <support/process.hpp>
#include <support/scratch_dir.hpp>
#include <support/stderr_capture.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using loom::shape;
using loom::tensor;
using loom::testing::contains;
using loom::testing::scratch_dir;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// The what() of the loom::error that f throws, checking its code; "" if none.
template <class F> std::string error_of(F&& f, loom::error_code code) {
  try {
    f();
  } catch (const loom::error& e) {
    CHECK_MESSAGE(e.code() == code, e.what());
    return e.what();
  }
  return "<no exception>";
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : fs::directory_iterator(dir))
    out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The tests that look into loom's own format ask for it (TF's is the default;
// test_tf_checkpoints.cpp and the cases below that name it test that one).
constexpr auto loom_format = loom::checkpoint_format::loom;

loom::session_options opts() {
  return {.intra_op_threads = 2};
}

// A model with a variable of every dtype and a global step.
struct model {
  loom::graph g;
  loom::variable<float, 2> w{g, "w", shape{2, 3}, loom::zeros_initializer{}};
  loom::variable<double, 1> b{g, "layer/b", shape{3}, loom::zeros_initializer{}};
  loom::variable<std::int32_t, 0> n{g, "n", shape{}, loom::zeros_initializer{}};
  loom::variable<bool, 1> flags{g, "flags", shape{4}, loom::zeros_initializer{}};
  loom::variable<std::string, 1> words{
      g, "words", loom::constant(g, tensor<std::string, 1>(shape{3}, {"", "a", "x"}))};
  loom::variable<std::int64_t, 0> step = loom::create_global_step(g);

  void set(loom::session& s, float base) {
    s.run(loom::group(
        g,
        w.assign(loom::constant(g, tensor<float, 2>(shape{2, 3}, {base, base + 1, base + 2,
                                                                  base + 3, base + 4, base + 5}))),
        b.assign(loom::constant(g, tensor<double, 1>(shape{3}, {base * 0.5, -1e300, 1e-300}))),
        n.assign(loom::constant(g, static_cast<std::int32_t>(base) - 7)),
        flags.assign(loom::constant(g, tensor<bool, 1>(shape{4}, {true, base > 1, false, true}))),
        words.assign(loom::constant(
            g, tensor<std::string, 1>(shape{3},
                                      {std::string("hello ") + std::to_string(base),
                                       std::string(1000, 'z'), std::string("nul\0byte", 8)}))),
        step.assign(loom::constant(g, static_cast<std::int64_t>(base * 1e12)))));
  }
  void check(loom::session& s, float base) {
    auto wv = s.run(w);
    for (std::size_t i = 0; i < 6; ++i)
      CHECK(wv.flat()[i] == base + static_cast<float>(i));
    auto bv = s.run(b);
    CHECK(bv.flat()[0] == base * 0.5);
    CHECK(bv.flat()[1] == -1e300);
    CHECK(bv.flat()[2] == 1e-300);
    CHECK(s.run(n).item() == static_cast<std::int32_t>(base) - 7);
    auto fv = s.run(flags);
    CHECK(fv.flat()[0] == true);
    CHECK(fv.flat()[1] == (base > 1));
    CHECK(fv.flat()[2] == false);
    auto sv = s.run(words);
    CHECK(sv.flat()[0] == "hello " + std::to_string(base));
    CHECK(sv.flat()[1] == std::string(1000, 'z'));
    CHECK(sv.flat()[2] == std::string("nul\0byte", 8));
    CHECK(s.run(step).item() == static_cast<std::int64_t>(base * 1e12));
  }
};

} // namespace

TEST_CASE("save and restore round-trip every dtype in a local session") {
  scratch_dir dir;
  model m;
  loom::saver saver(m.g, {.format = loom_format});
  CHECK(saver.variables().size() == 6);
  loom::session s(m.g, opts());
  s.run(loom::global_variables_initializer(m.g));
  m.set(s, 3);
  const std::string path = saver.save(s, dir / "model", s.run(m.step).item());
  CHECK(path == dir / "model-3000000000000");
  CHECK(fs::is_regular_file(path));
  m.set(s, 9); // changed after the save: the restore brings the saved values back
  m.check(s, 9);
  saver.restore(s, path);
  m.check(s, 3);

  // A fresh session (nothing initialised) restores too, and without a step
  // the file is the prefix itself.
  loom::session fresh(m.g, opts());
  saver.restore(fresh, path);
  m.check(fresh, 3);
  CHECK(saver.save(fresh, dir / "plain") == dir / "plain");
  m.set(fresh, 5);
  saver.restore(fresh, dir / "plain");
  m.check(fresh, 3);

  // The reader sees every tensor by name with its dtype, shape and checksum.
  loom::checkpoint_reader reader(path);
  CHECK(reader.version() == 1);
  REQUIRE(reader.entries().size() == 6);
  CHECK(reader.all_ok());
  const auto* e = reader.find("layer/b");
  REQUIRE(e != nullptr);
  CHECK(e->type == loom::dtype::f64);
  CHECK(e->shape == shape{3});
  CHECK(e->byte_length == 24);
  auto wv = reader.read_tensor("w");
  CHECK(wv.describe() == "float32[2, 3]");
  CHECK(wv.data<float>()[5] == 8.0f);
  CHECK(reader.read_tensor("global_step").data<std::int64_t>()[0] == 3000000000000LL);
  CHECK(contains(error_of([&] { (void)reader.read_tensor("nope"); }, loom::error_code::not_found),
                 "'nope'"));
}

TEST_CASE("saving an uninitialised variable fails and writes nothing") {
  scratch_dir dir;
  model m;
  loom::saver saver(m.g);
  loom::session s(m.g, opts());
  const auto what =
      error_of([&] { saver.save(s, dir / "model", 1); }, loom::error_code::failed_precondition);
  CHECK(contains(what, "uninitialized"));
  CHECK(files_in(dir.path).empty());
}

TEST_CASE("var_list saves only the given variables; a node that is not a variable is refused") {
  scratch_dir dir;
  model m;
  loom::saver some(m.g, {.var_list = {m.w.id(), m.step.id()}, .format = loom_format});
  CHECK(some.variables().size() == 2);
  loom::session s(m.g, opts());
  s.run(loom::global_variables_initializer(m.g));
  m.set(s, 2);
  const auto path = some.save(s, dir / "some");
  loom::checkpoint_reader reader(path);
  CHECK(reader.entries().size() == 2);
  CHECK(reader.has_tensor("w"));
  CHECK(!reader.has_tensor("layer/b"));
  auto c = loom::constant(m.g, 1.0f, "not_a_variable");
  const auto size_before = m.g.size();
  CHECK(contains(error_of(
                     [&] {
                       loom::saver(m.g, {.var_list = {m.w.id(), c.id()}});
                     },
                     loom::error_code::invalid_argument),
                 "not_a_variable"));
  CHECK(m.g.size() == size_before); // nothing added by a refused saver
  loom::graph empty;
  CHECK(contains(error_of([&] { loom::saver{empty}; }, loom::error_code::invalid_argument),
                 "no variables"));
}

TEST_CASE("max_to_keep deletes the oldest checkpoints and the state file lists the kept ones") {
  scratch_dir dir;
  model m;
  loom::saver saver(m.g, {.max_to_keep = 2, .format = loom_format});
  loom::session s(m.g, opts());
  s.run(loom::global_variables_initializer(m.g));
  for (int step = 1; step <= 4; ++step) {
    m.set(s, static_cast<float>(step));
    saver.save(s, dir / "model", step);
  }
  CHECK(files_in(dir.path) == std::vector<std::string>{"checkpoint", "model-3", "model-4"});
  CHECK(saver.last_checkpoints() == std::vector<std::string>{dir / "model-3", dir / "model-4"});
  CHECK(read_file(dir / "checkpoint") == "model_checkpoint_path: \"model-4\"\n"
                                         "all_model_checkpoint_paths: \"model-3\"\n"
                                         "all_model_checkpoint_paths: \"model-4\"\n");
  auto st = loom::get_checkpoint_state(dir.path);
  REQUIRE(st);
  CHECK(st->model_checkpoint_path == dir / "model-4");
  CHECK(st->all_model_checkpoint_paths ==
        std::vector<std::string>{dir / "model-3", dir / "model-4"});

  // Saving a step again moves it to the end instead of listing it twice.
  saver.save(s, dir / "model", 3);
  CHECK(saver.last_checkpoints() == std::vector<std::string>{dir / "model-4", dir / "model-3"});

  // A new saver (a restarted program) takes over what the state file keeps.
  loom::saver again(m.g, {.max_to_keep = 2, .format = loom_format});
  again.save(s, dir / "model", 5);
  CHECK(files_in(dir.path) == std::vector<std::string>{"checkpoint", "model-3", "model-5"});

  // max_to_keep 0 keeps every file and lists only the newest.
  scratch_dir all;
  loom::saver keep_all(m.g, {.max_to_keep = 0, .format = loom_format});
  for (int step = 1; step <= 3; ++step)
    keep_all.save(s, all / "m", step);
  CHECK(files_in(all.path) == std::vector<std::string>{"checkpoint", "m-1", "m-2", "m-3"});
  CHECK(loom::get_checkpoint_state(all.path)->all_model_checkpoint_paths ==
        std::vector<std::string>{all / "m-3"});
}

TEST_CASE("latest_checkpoint reads the state file and falls back to nothing") {
  scratch_dir dir;
  CHECK(!loom::latest_checkpoint(dir.path));
  CHECK(!loom::latest_checkpoint(dir / "no_such_dir"));
  model m;
  loom::saver saver(m.g, {.format = loom_format});
  loom::session s(m.g, opts());
  s.run(loom::global_variables_initializer(m.g));
  saver.save(s, dir / "model", 10);
  CHECK(loom::latest_checkpoint(dir.path) == dir / "model-10");
  saver.save(s, dir / "model", 20);
  CHECK(loom::latest_checkpoint(dir.path) == dir / "model-20");
  // The newest file gone: nothing, not a path that does not open.
  fs::remove(dir / "model-20");
  CHECK(!loom::latest_checkpoint(dir.path));
  // A state file that is not TF's text format: nothing.
  write_file(dir / "checkpoint", "garbage without a colon\n");
  CHECK(!loom::latest_checkpoint(dir.path));
  // An absolute path in the state file is taken as it is; quotes are unescaped.
  write_file(dir / "checkpoint", "model_checkpoint_path: \"" + dir / "model-10" + "\"\n");
  CHECK(loom::latest_checkpoint(dir.path) == dir / "model-10");
}

TEST_CASE("a corrupt byte fails the checksum of its tensor, naming the file and the tensor") {
  scratch_dir dir;
  model m;
  loom::saver saver(m.g, {.format = loom_format});
  loom::session s(m.g, opts());
  s.run(loom::global_variables_initializer(m.g));
  m.set(s, 1);
  const auto path = saver.save(s, dir / "model", 1);
  std::uint64_t offset = 0;
  {
    loom::checkpoint_reader reader(path);
    offset = reader.find("layer/b")->offset;
  }
  std::string bytes = read_file(path);
  bytes[static_cast<std::size_t>(offset) + 5] ^= 0x10;
  write_file(path, bytes);

  loom::checkpoint_reader reader(path); // opening lists it; reading it fails
  CHECK(!reader.all_ok());
  CHECK(!reader.find("layer/b")->crc_ok);
  CHECK(reader.find("w")->crc_ok);
  CHECK(
      contains(error_of([&] { (void)reader.read_tensor("layer/b"); }, loom::error_code::data_loss),
               "checksum"));
  m.set(s, 4);
  const auto what = error_of([&] { saver.restore(s, path); }, loom::error_code::data_loss);
  CHECK(contains(what, path));
  CHECK(contains(what, "'layer/b'"));
  CHECK(contains(what, "checksum"));
  m.check(s, 4); // nothing was restored
}

TEST_CASE("a truncated or malformed file is a clear error, never a crash or a huge allocation") {
  scratch_dir dir;
  model m;
  loom::saver saver(m.g, {.format = loom_format});
  loom::session s(m.g, opts());
  s.run(loom::global_variables_initializer(m.g));
  const auto path = saver.save(s, dir / "model", 1);
  const std::string bytes = read_file(path);
  const auto cut = dir / "cut";
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    write_file(cut, bytes.substr(0, n));
    const auto what = error_of([&] { saver.restore(s, cut); }, loom::error_code::data_loss);
    CHECK_MESSAGE(contains(what, cut), what);
  }
  write_file(cut, bytes.substr(0, bytes.size() - 3));
  CHECK(contains(error_of([&] { loom::checkpoint_reader{cut}; }, loom::error_code::data_loss),
                 "truncated"));
  write_file(cut, bytes + "x");
  CHECK(contains(error_of([&] { loom::checkpoint_reader{cut}; }, loom::error_code::data_loss),
                 "1 bytes follow the last tensor"));
  write_file(cut, "PK\x03\x04 not a checkpoint at all");
  CHECK(contains(error_of([&] { loom::checkpoint_reader{cut}; }, loom::error_code::data_loss),
                 "not a loom checkpoint"));

  // Headers claiming enormous sizes are refused before anything is allocated.
  auto header = [](std::uint32_t version, std::uint64_t count) {
    std::string h = "LOOMCKPT";
    for (int i = 0; i < 4; ++i)
      h += static_cast<char>((version >> (8 * i)) & 0xff);
    for (int i = 0; i < 8; ++i)
      h += static_cast<char>((count >> (8 * i)) & 0xff);
    return h;
  };
  auto le = [](std::uint64_t v, int bytes_count) {
    std::string out;
    for (int i = 0; i < bytes_count; ++i)
      out += static_cast<char>((v >> (8 * i)) & 0xff);
    return out;
  };
  write_file(cut, header(1, 1ull << 60));
  CHECK(contains(error_of([&] { loom::checkpoint_reader{cut}; }, loom::error_code::data_loss),
                 "tensors"));
  write_file(cut, header(2, 0));
  CHECK(contains(error_of([&] { loom::checkpoint_reader{cut}; }, loom::error_code::unimplemented),
                 "format version 2"));
  // One float tensor of shape [2^40, 2^40] with 8 bytes of data.
  write_file(cut, header(1, 1) + le(1, 4) + "w" + le(0, 1) + le(2, 4) + le(1ull << 40, 8) +
                      le(1ull << 40, 8) + le(8, 8) + le(0, 4) + std::string(8, '\0'));
  CHECK(contains(error_of([&] { loom::checkpoint_reader{cut}; }, loom::error_code::data_loss),
                 "bytes of data"));
  // A string tensor of 2^40 elements in 8 bytes.
  write_file(cut, header(1, 1) + le(1, 4) + "w" + le(5, 1) + le(1, 4) + le(1ull << 40, 8) +
                      le(8, 8) + le(0, 4) + std::string(8, '\0'));
  CHECK(contains(error_of([&] { loom::checkpoint_reader{cut}; }, loom::error_code::data_loss),
                 "bytes of data"));
  // Data longer than the file.
  write_file(cut, header(1, 1) + le(1, 4) + "w" + le(0, 1) + le(1, 4) + le(1ull << 58, 8) +
                      le(1ull << 60, 8) + le(0, 4));
  CHECK(contains(error_of([&] { loom::checkpoint_reader{cut}; }, loom::error_code::data_loss),
                 "truncated"));
  CHECK(contains(error_of([&] { saver.restore(s, dir / "missing"); }, loom::error_code::not_found),
                 dir / "missing"));
}

TEST_CASE("a checkpoint with another shape, dtype or without a variable is a clear error") {
  scratch_dir dir;
  model m;
  loom::saver saver(m.g, {.format = loom_format});
  loom::session s(m.g, opts());
  s.run(loom::global_variables_initializer(m.g));
  m.set(s, 1);
  const auto path = saver.save(s, dir / "model", 100);

  {
    loom::graph g;
    loom::variable<float, 2> w(g, "w", shape{2, 5}, loom::zeros_initializer{});
    loom::saver other(g);
    loom::session os(g, opts());
    const auto what =
        error_of([&] { other.restore(os, path); }, loom::error_code::invalid_argument);
    CHECK(contains(what, "checkpoint " + path +
                             ": tensor 'w' has shape [2, 3], the variable has "
                             "[2, 5]"));
  }
  {
    loom::graph g;
    loom::variable<double, 2> w(g, "w", shape{2, 3}, loom::zeros_initializer{});
    loom::saver other(g);
    loom::session os(g, opts());
    const auto what =
        error_of([&] { other.restore(os, path); }, loom::error_code::invalid_argument);
    CHECK(contains(what, "tensor 'w' is float32, the variable is float64"));
  }
  {
    loom::graph g;
    loom::variable<float, 2> w(g, "w", shape{2, 3}, loom::zeros_initializer{});
    loom::variable<float, 1> extra(g, "hid/extra", shape{3}, loom::ones_initializer{});
    loom::saver other(g);
    loom::session os(g, opts());
    os.run(loom::global_variables_initializer(g));
    const auto what = error_of([&] { other.restore(os, path); }, loom::error_code::not_found);
    CHECK(contains(what, path));
    CHECK(contains(what, "no tensor 'hid/extra'"));
    // Nothing was restored: w keeps its value.
    CHECK(os.run(w).flat()[0] == 0.0f);
  }
  {
    // Tensors of the file that the saver does not save are ignored.
    loom::graph g;
    loom::variable<float, 2> w(g, "w", shape{2, 3}, loom::zeros_initializer{});
    loom::saver other(g);
    loom::session os(g, opts());
    other.restore(os, path);
    CHECK(os.run(w).flat()[5] == 6.0f);
  }
}

TEST_CASE("a failed save never leaves a torn file; the previous checkpoint still restores") {
  scratch_dir dir;
  model m;
  loom::saver saver(m.g, {.format = loom_format});
  loom::session s(m.g, opts());
  s.run(loom::global_variables_initializer(m.g));
  m.set(s, 1);
  const auto good = saver.save(s, dir / "model");
  const std::string good_bytes = read_file(good);
  const std::string good_state = read_file(dir / "checkpoint");
  m.set(s, 2);

  auto unchanged = [&] {
    CHECK(read_file(good) == good_bytes);
    CHECK(read_file(dir / "checkpoint") == good_state);
    CHECK(files_in(dir.path) == std::vector<std::string>{"checkpoint", "model"});
    m.set(s, 7);
    saver.restore(s, good);
    m.check(s, 1);
    m.set(s, 2);
  };

  SUBCASE("the disk fills up mid-write (RLIMIT_FSIZE)") {
    rlimit old{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
    rlimit small = old;
    small.rlim_cur = 100; // the header and part of the first tensor
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    std::string what;
    try {
      saver.save(s, dir / "model"); // over the good one
    } catch (const loom::error& e) {
      what = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::signal(SIGXFSZ, old_handler);
    CHECK(contains(what, "cannot write"));
    unchanged();
  }
  SUBCASE("the temporary file cannot be created") {
    const auto tmp = dir / ("model.tmp-" + std::to_string(::getpid()));
    fs::create_directory(tmp);
    CHECK(contains(error_of([&] { saver.save(s, dir / "model"); }, loom::error_code::unknown),
                   "cannot create " + tmp));
    fs::remove(tmp);
    unchanged();
  }
  SUBCASE("the rename fails") {
    scratch_dir other;
    fs::create_directory(other / "model-5"); // a directory where the file would go
    fs::create_directory(other / "model-5/x");
    CHECK(contains(error_of([&] { saver.save(s, other / "model", 5); }, loom::error_code::unknown),
                   "cannot rename"));
    CHECK(files_in(other.path) == std::vector<std::string>{"model-5"}); // no temporary left
    unchanged();
  }
  SUBCASE("a read-only directory") {
    if (::geteuid() == 0) {
      MESSAGE("running as root: permissions do not stop writes, skipped");
    } else {
      REQUIRE(::chmod(dir.path.c_str(), 0555) == 0);
      CHECK(contains(
          error_of([&] { saver.save(s, dir / "model", 3); }, loom::error_code::permission_denied),
          "cannot create"));
      REQUIRE(::chmod(dir.path.c_str(), 0755) == 0);
      unchanged();
    }
  }
  SUBCASE("a directory that does not exist") {
    CHECK(contains(
        error_of([&] { saver.save(s, dir / "no/such/dir/model"); }, loom::error_code::not_found),
        "no/such/dir"));
    unchanged();
  }
}

namespace {

using loom::testing::local_cluster;
using loom::testing::quiet;

// Two variables placed round-robin over the cluster's ps tasks.
struct cluster_model {
  loom::graph g;
  std::optional<loom::variable<float, 2>> w;
  std::optional<loom::variable<float, 1>> b;
  std::optional<loom::variable<std::int64_t, 0>> step;
  explicit cluster_model(const loom::cluster_spec& spec) {
    auto _ = g.device(loom::make_replica_device_setter(spec));
    w.emplace(g, "w", shape{3, 2}, loom::zeros_initializer{});
    b.emplace(g, "b", shape{2}, loom::zeros_initializer{});
    step.emplace(loom::create_global_step(g));
  }
  // Initializes, then w = 1..6, b = (-1, -2), the step 42.
  void initialize_to_known_values(loom::session& s) {
    s.run(loom::global_variables_initializer(g));
    s.run(loom::group(
        g, w->assign(loom::constant(g, tensor<float, 2>(shape{3, 2}, {1, 2, 3, 4, 5, 6}))),
        b->assign(loom::constant(g, tensor<float, 1>(shape{2}, {-1, -2}))),
        step->assign(loom::constant(g, std::int64_t{42}))));
  }
};

} // namespace

TEST_CASE("a checkpoint saved on a cluster of 2 ps tasks restores into a cluster of 1") {
  scratch_dir dir;
  std::string path;
  {
    local_cluster cluster(2, 1);
    cluster_model m(cluster.spec);
    loom::saver saver(m.g);
    std::ostringstream placements;
    auto o = quiet();
    o.log_device_placement = true;
    o.placement_log = &placements;
    loom::session s(m.g, loom::session_target{cluster.target()}, o);
    m.initialize_to_known_values(s);
    // round_robin: w on ps 0, b on ps 1.
    CHECK(cluster.ps(0).resources().uninitialized("", {"w"}).empty());
    CHECK(cluster.ps(1).resources().uninitialized("", {"b"}).empty());
    CHECK(cluster.ps(1).resources().uninitialized("", {"w"}) == std::vector<std::string>{"w"});
    path = saver.save(s, dir / "model", s.run(*m.step).item());
    // Restoring on the same cluster: the assigns run on each variable's ps.
    s.run(m.w->assign(loom::constant(m.g, tensor<float, 2>(shape{3, 2}, 0.0f))));
    saver.restore(s, path);
    CHECK(s.run(*m.w).flat()[5] == 6.0f);
    // Each value is fed and assigned on its variable's task.
    CHECK_MESSAGE(
        contains(placements.str(), "save/b/value: (placeholder): /job:ps/replica:0/task:1"),
        placements.str());
    CHECK(contains(placements.str(), "save/b/assign: (assign): /job:ps/replica:0/task:1"));
    CHECK(contains(placements.str(), "save/w/value: (placeholder): /job:ps/replica:0/task:0"));
    CHECK(contains(placements.str(), "save/w/assign: (assign): /job:ps/replica:0/task:0"));
  }
  CHECK(path == dir / "model-42");
  {
    local_cluster cluster(1, 1);
    cluster_model m(cluster.spec);
    loom::saver saver(m.g);
    loom::session s(m.g, loom::session_target{cluster.target()}, quiet());
    CHECK(cluster.ps(0).resources().uninitialized("", {"w", "b", "global_step"}).size() == 3);
    saver.restore(s, *loom::latest_checkpoint(dir.path));
    // Every variable restored into the one ps task's container.
    CHECK(cluster.ps(0).resources().uninitialized("", {"w", "b", "global_step"}).empty());
    auto w = s.run(*m.w);
    for (std::size_t i = 0; i < 6; ++i)
      CHECK(w.flat()[i] == static_cast<float>(i + 1));
    CHECK(s.run(*m.b).flat()[1] == -2.0f);
    CHECK(s.run(*m.step).item() == 42);
  }
}

TEST_CASE("loom-ckpt lists a checkpoint, prints a tensor, and exits 1 on a bad file") {
  const std::string tool = LOOM_CKPT_BIN;
  if (tool.empty()) {
    MESSAGE("LOOM_BUILD_TOOLS is off: loom-ckpt not built, skipped");
    return;
  }
  scratch_dir dir;
  model m;
  loom::saver saver(m.g, {.format = loom_format});
  loom::session s(m.g, opts());
  s.run(loom::global_variables_initializer(m.g));
  m.set(s, 1);
  const auto path = saver.save(s, dir / "model", 7);

  struct result {
    loom::testing::exit_status status;
    std::string output;
  };
  auto run = [&](std::vector<std::string> args) {
    auto c = std::make_unique<loom::testing::child>(tool, std::move(args));
    auto st = c->wait(std::chrono::seconds(60));
    REQUIRE_MESSAGE(st, c->report());
    return result{*st, c->output()};
  };
  {
    const auto r = run({dir.path}); // a directory: its latest checkpoint
    CHECK_MESSAGE(r.status.success(), r.output);
    CHECK(contains(r.output, path));
    CHECK(contains(r.output, "layer/b"));
    CHECK(contains(r.output, "float64"));
    CHECK(contains(r.output, "[2, 3]"));
    CHECK(contains(r.output, "global_step"));
    CHECK(contains(r.output, " ok"));
    CHECK(!contains(r.output, "BAD"));
  }
  {
    const auto r = run({path, "--print", "w", "--limit", "4"});
    CHECK_MESSAGE(r.status.success(), r.output);
    CHECK(contains(r.output, "1, 2, 3, 4"));
    CHECK(contains(r.output, "2 more"));
    CHECK(!contains(r.output, "5, 6"));
  }
  {
    const auto r = run({path, "--print=words"});
    CHECK_MESSAGE(r.status.success(), r.output);
    CHECK(contains(r.output, "\"hello 1.000000\""));
  }
  {
    const auto r = run({path, "--print", "nope"});
    CHECK(r.status.exited);
    CHECK(r.status.code == 1);
    CHECK(contains(r.output, "'nope'"));
  }
  std::string bytes = read_file(path);
  loom::checkpoint_reader reader(path);
  bytes[static_cast<std::size_t>(reader.find("w")->offset)] ^= 1;
  write_file(path, bytes);
  {
    const auto r = run({path});
    CHECK(r.status.code == 1);
    CHECK(contains(r.output, "BAD"));
  }
  write_file(path, bytes.substr(0, 30));
  {
    const auto r = run({path});
    CHECK(r.status.code == 1);
    CHECK(contains(r.output, "truncated"));
  }
  {
    const auto r = run({dir / "empty_dir_none"});
    CHECK(r.status.code == 1);
  }
}

namespace {

// An embedding of `rows` x 2 whose row for id i is (i, -i), partitioned in
// `shards` shards spread by `strategy`, and the lookup of every id.
struct embedding_model {
  loom::graph g;
  std::optional<loom::partitioned_variable<float, 2>> parted;
  std::optional<loom::variable<float, 2>> whole;
  loom::placeholder<std::int64_t, 1> ids{g, shape{-1}, "ids"};
  std::optional<loom::output<float, 2>> rows_of;

  loom::adagrad_optimizer adagrad{0.1};
  std::optional<loom::operation> train;

  embedding_model(std::int64_t rows, std::int64_t shards, loom::partition_strategy strategy) {
    if (shards == 1) {
      whole.emplace(g, "emb", shape{rows, 2}, loom::zeros_initializer{});
      rows_of = loom::embedding_lookup(*whole, ids, strategy);
    } else {
      parted = loom::get_variable<float, 2>(g, "emb", shape{rows, 2}, loom::zeros_initializer{},
                                            loom::fixed_size_partitioner{shards});
      rows_of = loom::embedding_lookup(*parted, ids, strategy);
    }
    // Adagrad's accumulators: slots partitioned as their table.
    train = adagrad.minimize(loom::lower(loom::reduce_sum(*rows_of)));
  }
  // Each accumulator row (lookup order): what the training below left there.
  std::vector<float> accumulators(loom::session& s, std::int64_t rows, std::int64_t shards,
                                  bool div) {
    std::vector<float> by_id(static_cast<std::size_t>(rows));
    for (std::int64_t p = 0; p < shards; ++p) {
      const loom::node_id var =
          shards == 1 ? whole->id() : parted->shards()[static_cast<std::size_t>(p)].id();
      const auto slot = adagrad.get_slot(g, var, "accumulator");
      REQUIRE(slot);
      const auto value = s.run_nodes({*slot}, {})[0];
      for (std::int64_t r = 0; r < value.shape()[0]; ++r)
        by_id[static_cast<std::size_t>(loom::detail::id_at(p, r, shards, rows, div))] =
            value.data<float>()[r * 2];
    }
    return by_id;
  }
  // Trains once on ids 0..k-1 (each once): their accumulators grow by 1.
  void train_on_first(loom::session& s, std::int64_t k) {
    loom::tensor<std::int64_t, 1> first(shape{k});
    for (std::int64_t i = 0; i < k; ++i)
      first(i) = i;
    s.run(*train, {{ids, first}});
  }
  // Sets row i to (i, -i) through the lookup's own routing: scatter_update on
  // each shard at the rows the strategy gives each id.
  void fill(loom::session& s, std::int64_t rows, std::int64_t shards, bool div) {
    for (std::int64_t p = 0; p < shards; ++p) {
      const auto& var = shards == 1 ? *whole : parted->shards()[static_cast<std::size_t>(p)];
      const std::int64_t n = loom::detail::shard_rows(p, shards, rows, div);
      loom::tensor<float, 2> value(shape{n, 2});
      for (std::int64_t r = 0; r < n; ++r) {
        const auto id = static_cast<float>(loom::detail::id_at(p, r, shards, rows, div));
        value(r, 0) = id;
        value(r, 1) = -id;
      }
      s.run(var.assign(loom::constant(g, value)));
    }
  }
  // True when the lookup of every id gives (id, -id).
  bool ids_intact(loom::session& s, std::int64_t rows) {
    loom::tensor<std::int64_t, 1> all(shape{rows});
    for (std::int64_t i = 0; i < rows; ++i)
      all(i) = i;
    const auto got = s.run(*rows_of, {{ids, all}});
    for (std::int64_t i = 0; i < rows; ++i)
      if (got(i, 0) != static_cast<float>(i) || got(i, 1) != -static_cast<float>(i))
        return false;
    return true;
  }
};

} // namespace

TEST_CASE("a partitioned embedding saved in N shards restores into M shards, every id keeping "
          "its row, in either format") {
  const std::int64_t rows = 23;
  for (const auto format : {loom::checkpoint_format::loom, loom::checkpoint_format::tensorflow})
    for (const auto strategy : {loom::partition_strategy::mod, loom::partition_strategy::div}) {
      const bool div = strategy == loom::partition_strategy::div;
      for (const auto& counts : std::vector<std::pair<std::int64_t, std::int64_t>>{
               {2, 3}, {3, 2}, {4, 1}, {1, 3}, {2, 2}}) {
        // Plain variables, not a structured binding: clang 14 cannot capture one (INFO does).
        const std::int64_t from = counts.first, to = counts.second;
        INFO((format == loom::checkpoint_format::loom ? "loom's format, " : "TF's format, ")
             << (div ? "div" : "mod") << ": " << from << " -> " << to << " shards");
        scratch_dir dir;
        {
          embedding_model saved(rows, from, strategy);
          loom::session s(saved.g);
          s.run(loom::global_variables_initializer(saved.g));
          saved.fill(s, rows, from, div);
          REQUIRE(saved.ids_intact(s, rows));
          saved.train_on_first(s, 5);
          saved.fill(s, rows, from, div); // the rows again, the accumulators trained
          loom::saver(saved.g, {.format = format}).save(s, dir / "model");
        }
        embedding_model restored(rows, to, strategy);
        loom::session s(restored.g);
        s.run(loom::global_variables_initializer(restored.g));
        CHECK_FALSE(restored.ids_intact(s, rows)); // zeros before the restore
        loom::saver(restored.g).restore(s, dir / "model");
        CHECK(restored.ids_intact(s, rows));
        // The slots moved with their rows: ids 0-4 trained once (0.1 + 1).
        const auto acc = restored.accumulators(s, rows, to, div);
        for (std::int64_t i = 0; i < rows; ++i)
          CHECK(acc[static_cast<std::size_t>(i)] == doctest::Approx(i < 5 ? 1.1 : 0.1));
      }
    }
}

TEST_CASE("restoring a partitioned embedding with another strategy is one clear error") {
  for (const auto format : {loom::checkpoint_format::loom, loom::checkpoint_format::tensorflow}) {
    scratch_dir dir;
    {
      embedding_model saved(10, 2, loom::partition_strategy::mod);
      loom::session s(saved.g);
      s.run(loom::global_variables_initializer(saved.g));
      saved.fill(s, 10, 2, false);
      loom::saver(saved.g, {.format = format}).save(s, dir / "model");
    }
    for (const std::int64_t shards : {3, 2}) { // another count, or the same
      embedding_model restored(10, shards, loom::partition_strategy::div);
      loom::session s(restored.g);
      s.run(loom::global_variables_initializer(restored.g));
      const std::string what = loom::testing::message_of<loom::invalid_argument_error>(
          [&] { loom::saver(restored.g).restore(s, dir / "model"); });
      CHECK(contains(what, "variable 'emb' was saved in 2 shards spread by the \"mod\" "
                           "strategy, and is now looked up with \"div\" over " +
                               std::to_string(shards) + " shards"));
    }
  }
}

TEST_CASE("a partitioned variable no lookup reads restores a \"mod\" checkpoint of the same "
          "shard count as saved") {
  scratch_dir dir;
  tensor<float, 2> part0;
  {
    embedding_model saved(10, 2, loom::partition_strategy::mod);
    loom::session s(saved.g);
    s.run(loom::global_variables_initializer(saved.g));
    saved.fill(s, 10, 2, false);
    part0 = s.run(saved.parted->shards()[0]);
    loom::saver(saved.g).save(s, dir / "model");
  }
  loom::graph g; // an export graph: the table, no lookup
  auto emb = loom::get_variable<float, 2>(g, "emb", shape{10, 2}, loom::zeros_initializer{},
                                          loom::fixed_size_partitioner{2});
  loom::session s(g);
  loom::saver(g, {.var_list = {emb.shards()[0].id(), emb.shards()[1].id()}})
      .restore(s, dir / "model");
  const auto got = s.run(emb.shards()[0]);
  for (std::int64_t r = 0; r < 5; ++r)
    CHECK(got(r, 0) == part0(r, 0));
}

TEST_CASE("one partitioned variable looked up with two strategies is refused") {
  loom::graph g;
  auto emb = loom::get_variable<float, 2>(g, "emb", shape{10, 2}, loom::zeros_initializer{},
                                          loom::fixed_size_partitioner{2});
  loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
  loom::embedding_lookup(emb, ids, loom::partition_strategy::mod);
  const std::string what = loom::testing::message_of<loom::invalid_argument_error>(
      [&] { loom::embedding_lookup(emb, ids, loom::partition_strategy::div); });
  CHECK(contains(what, "partitioned variable 'emb' is looked up with the \"mod\" strategy "
                       "elsewhere and with \"div\" here"));
}

TEST_CASE("a sharded save: each ps writes its own variables, the manifest comes last, and it "
          "restores into another count of ps tasks") {
  scratch_dir dir;
  std::string path;
  {
    local_cluster cluster(2, 1);
    cluster_model m(cluster.spec);
    loom::saver saver(m.g, {.max_to_keep = 2, .sharded = true, .format = loom_format});
    std::ostringstream placements;
    auto o = quiet();
    o.log_device_placement = true;
    o.placement_log = &placements;
    loom::session s(m.g, loom::session_target{cluster.target()}, o);
    m.initialize_to_known_values(s);
    path = saver.save(s, dir / "model", 42);
    // One writer per ps task, on that task (round_robin: w and the step on ps 0, b on ps 1).
    CHECK_MESSAGE(
        contains(placements.str(), "save/shard_0: (save_shard): /job:ps/replica:0/task:0"),
        placements.str());
    CHECK(contains(placements.str(), "save/shard_1: (save_shard): /job:ps/replica:0/task:1"));
    const loom::checkpoint_reader shard0(path + ".data-0-of-2"), shard1(path + ".data-1-of-2");
    CHECK(shard0.has_tensor("w"));
    CHECK(shard0.has_tensor("global_step"));
    CHECK_FALSE(shard0.has_tensor("b"));
    CHECK(shard1.has_tensor("b"));
    const loom::checkpoint_reader manifest(path);
    CHECK(manifest.shard_paths() ==
          std::vector<std::string>{path + ".data-0-of-2", path + ".data-1-of-2"});
    CHECK(manifest.read_tensor("b").flat<float>()[1] == -2.0f); // read through the manifest
    // max_to_keep 2: the third save deletes the first checkpoint's manifest and shards.
    saver.save(s, dir / "model", 43);
    saver.save(s, dir / "model", 44);
    CHECK_FALSE(std::filesystem::exists(path));
    CHECK_FALSE(std::filesystem::exists(path + ".data-0-of-2"));
    CHECK_FALSE(std::filesystem::exists(path + ".data-1-of-2"));
    path = dir / "model-44";
    CHECK(std::filesystem::exists(path + ".data-1-of-2"));
  }
  {
    local_cluster cluster(1, 1);
    cluster_model m(cluster.spec);
    loom::saver saver(m.g);
    loom::session s(m.g, loom::session_target{cluster.target()}, quiet());
    saver.restore(s, *loom::latest_checkpoint(dir.path));
    auto w = s.run(*m.w);
    for (std::size_t i = 0; i < 6; ++i)
      CHECK(w.flat()[i] == static_cast<float>(i + 1));
    CHECK(s.run(*m.b).flat()[1] == -2.0f);
    CHECK(s.run(*m.step).item() == 42);
  }
  // A shard missing: the checkpoint is incomplete, one clear error naming the file.
  std::filesystem::remove(path + ".data-1-of-2");
  try {
    loom::checkpoint_reader r(path);
    FAIL("no error");
  } catch (const loom::data_loss_error& e) {
    CHECK_MESSAGE(contains(e.what(), "is incomplete"), e.what());
    CHECK(contains(e.what(), "model-44.data-1-of-2"));
  }
  // A manifest naming one shard twice: a tensor in two files, refused.
  const std::string twice = dir / "twice";
  loom::write_checkpoint_file(twice, {std::string(loom::detail::checkpoint_shards_key)},
                              {loom::any_tensor::from_vector<std::string>(
                                  shape{2}, {"model-44.data-0-of-2", "model-44.data-0-of-2"})});
  CHECK_THROWS_WITH_AS(loom::checkpoint_reader{twice}, doctest::Contains("is in two of its files"),
                       loom::data_loss_error);
}

TEST_CASE("a save or restore of progress_every_bytes or more says its progress in the log; a "
          "smaller one says nothing") {
  scratch_dir dir;
  loom::graph g;
  std::vector<loom::variable<float, 1>> vars;
  for (const char* name : {"a", "b", "c"}) // 4 kB each
    vars.emplace_back(g, name, shape{1000}, loom::zeros_initializer{});
  for (const auto format : {loom::checkpoint_format::tensorflow, loom::checkpoint_format::loom}) {
    CAPTURE(static_cast<int>(format));
    loom::saver saver(g, {.format = format, .progress_every_bytes = 5000});
    loom::saver quiet_saver(g, {.format = format});
    loom::session s(g, opts());
    s.run(loom::global_variables_initializer(g));
    std::string text, quiet_text, path;
    {
      loom::testing::stderr_capture err;
      path = saver.save(s, dir / "model");
      saver.restore(s, path);
      text = err.text();
    }
    {
      loom::testing::stderr_capture err;
      quiet_saver.restore(s, quiet_saver.save(s, dir / "quiet"));
      quiet_text = err.text();
    }
    MESSAGE(text);
    // A line when 8 of the 12 kB are done (past 5 000 bytes), then the total at the end.
    CHECK(contains(text, "saving checkpoint " + path + ": 8.0 kB of 12.0 kB (67 %)"));
    CHECK(contains(text, "saved checkpoint " + path + ": 12.0 kB in "));
    CHECK(contains(text, "restoring checkpoint " + path + ": 8.0 kB of 12.0 kB (67 %)"));
    CHECK(contains(text, "restored checkpoint " + path + ": 12.0 kB in "));
    CHECK_FALSE(contains(quiet_text, "checkpoint")); // 12 kB, under the default 1 GiB
  }
}

TEST_CASE("a sharded save says each shard's progress in the log of the task that writes it") {
  scratch_dir dir;
  local_cluster cluster(2, 1);
  cluster_model m(cluster.spec);
  loom::saver saver(
      m.g,
      {.sharded = true, .format = loom::checkpoint_format::tensorflow, .progress_every_bytes = 16});
  loom::session s(m.g, loom::session_target{cluster.target()}, quiet());
  m.initialize_to_known_values(s);
  loom::testing::stderr_capture err;
  const std::string path = saver.save(s, dir / "model", 42);
  const std::string text = err.text();
  MESSAGE(text);
  // ps 0 writes w (24 bytes) and the step (8): a line past 16 bytes, then its total.
  CHECK(contains(text, "saving shard 0 of checkpoint "));
  CHECK(contains(text, "saved shard 0 of checkpoint "));
  CHECK(contains(text, ": 32 B in "));
}

TEST_CASE("a sharded save in TF's format: each ps writes its own data file, the index comes "
          "last, and it restores into another count of ps tasks") {
  scratch_dir dir;
  std::string path;
  {
    local_cluster cluster(2, 1);
    cluster_model m(cluster.spec);
    loom::saver saver(m.g, {.sharded = true, .format = loom::checkpoint_format::tensorflow});
    loom::session s(m.g, loom::session_target{cluster.target()}, quiet());
    m.initialize_to_known_values(s);
    path = saver.save(s, dir / "model", 42);
    // round_robin: w and the step on ps 0, b on ps 1; one TF index names both files.
    const loom::tensor_bundle::reader r(path);
    CHECK(r.num_shards() == 2);
    CHECK(r.find("w")->shard_id == 0);
    CHECK(r.find("global_step")->shard_id == 0);
    CHECK(r.find("b")->shard_id == 1);
    CHECK(r.read_tensor("b").flat<float>()[1] == -2.0f);
    CHECK(files_in(dir.path) ==
          std::vector<std::string>{"checkpoint", "model-42.data-00000-of-00002",
                                   "model-42.data-00001-of-00002", "model-42.index"});
  }
  {
    local_cluster cluster(1, 1);
    cluster_model m(cluster.spec);
    loom::saver saver(m.g);
    loom::session s(m.g, loom::session_target{cluster.target()}, quiet());
    saver.restore(s, *loom::latest_checkpoint(dir.path));
    auto w = s.run(*m.w);
    for (std::size_t i = 0; i < 6; ++i)
      CHECK(w.flat()[i] == static_cast<float>(i + 1));
    CHECK(s.run(*m.b).flat()[1] == -2.0f);
    CHECK(s.run(*m.step).item() == 42);
  }
  // A data file missing: one clear error naming it.
  std::filesystem::remove(path + ".data-00001-of-00002");
  CHECK_THROWS_WITH_AS(loom::tensor_bundle::reader(path).read_tensor("b"),
                       doctest::Contains("model-42.data-00001-of-00002"), loom::error);
}

TEST_CASE("loom-ckpt inspects TensorFlow's checkpoints and converts loom's into them") {
  const std::string tool = LOOM_CKPT_BIN;
  if (tool.empty()) {
    MESSAGE("LOOM_BUILD_TOOLS is off: loom-ckpt not built, skipped");
    return;
  }
  auto run = [&](std::vector<std::string> args) {
    auto c = std::make_unique<loom::testing::child>(tool, std::move(args));
    auto st = c->wait(std::chrono::seconds(60));
    REQUIRE_MESSAGE(st, c->report());
    return std::pair(*st, c->output());
  };
  const std::string tf = std::string(LOOM_TEST_SOURCE_DIR) + "/tests/data/tf_checkpoints/";
  {
    const auto ran = run({"inspect", tf + "partitioned/model.ckpt-2"});
    CHECK_MESSAGE(ran.first.success(), ran.second);
    CHECK(contains(ran.second, "TensorFlow checkpoint"));
    CHECK(contains(ran.second, "emb/Adagrad"));
    CHECK(contains(ran.second, "[10, 4]"));
    CHECK(contains(ran.second, "0,4:0,4 4,3:0,4 7,3:0,4")); // the parts
  }
  {
    const auto ran = run({"inspect", tf + "sharded/model.ckpt", "--tensor", "b/i64"});
    CHECK_MESSAGE(ran.first.success(), ran.second);
    CHECK(
        contains(ran.second, "b/i64: int64[3] = [-9223372036854775808, -1, 9223372036854775807]"));
  }
  {
    const auto ran = run({"inspect", tf + "sharded/model.ckpt", "--tensor", "b/i6"});
    CHECK(ran.first.code == 1);
    CHECK(contains(ran.second, "has no tensor 'b/i6' (nearest: 'b/i64'"));
  }

  scratch_dir dir;
  model m;
  loom::saver saver(m.g, {.format = loom_format});
  loom::session s(m.g, opts());
  s.run(loom::global_variables_initializer(m.g));
  m.set(s, 3);
  const auto path = saver.save(s, dir / "model", 5);
  const std::string converted = dir / "tf.ckpt-5";
  {
    const auto ran = run({"convert", path, converted});
    CHECK_MESSAGE(ran.first.success(), ran.second);
  }
  {
    // A partitioned table becomes its slices of the whole, as the saver writes TF's
    // format, and its ids keep their rows through the conversion.
    embedding_model saved(10, 3, loom::partition_strategy::mod);
    loom::session s3(saved.g);
    s3.run(loom::global_variables_initializer(saved.g));
    saved.fill(s3, 10, 3, false);
    const std::string loom_path =
        loom::saver(saved.g, {.format = loom_format}).save(s3, dir / "table");
    const auto ran = run({"convert", loom_path, dir / "table_tf"});
    CHECK_MESSAGE(ran.first.success(), ran.second);
    const loom::tensor_bundle::reader table(dir / "table_tf");
    REQUIRE(table.find("emb"));
    CHECK(table.find("emb")->slices.size() == 3);
    CHECK_FALSE(table.find("emb/part_0"));
    embedding_model restored(10, 2, loom::partition_strategy::mod);
    loom::session s4(restored.g);
    loom::saver(restored.g).restore(s4, dir / "table_tf");
    CHECK(restored.ids_intact(s4, 10));
  }
  const loom::tensor_bundle::reader r(converted);
  const loom::checkpoint_reader original(path);
  CHECK(r.entries().size() == original.entries().size());
  for (const auto& e : original.entries()) {
    const loom::any_tensor a = original.read(e), b = r.read_tensor(e.name);
    CHECK(b.describe() == a.describe());
    loom::visit_dtype(a.type(), [&]<class T>() {
      CHECK_MESSAGE(std::equal(a.data<T>(), a.data<T>() + a.num_elements(), b.data<T>()), e.name);
    });
  }
}

TEST_CASE("loom-ckpt says how many rows of each hash-table shard hold ids, on disk too, and how "
          "many ids wait for admission, in either format") {
  const std::string tool = LOOM_CKPT_BIN;
  if (tool.empty()) {
    MESSAGE("LOOM_BUILD_TOOLS is off: loom-ckpt not built, skipped");
    return;
  }
  loom::graph g;
  loom::placeholder<std::int64_t, 1> ids(g, loom::shape{-1}, "ids");
  loom::hash_embedding<float> emb(g, "t", 2, {.capacity_per_shard = 8, .num_shards = 2});
  auto rows = emb.lookup(ids);
  scratch_dir dir;
  // Two rows in memory (row 0 is admission's), the rest on disk.
  loom::hash_embedding<float> tiered(g, "d", 2,
                                     {.capacity_per_shard = 3,
                                      .admit_after = 2,
                                      .admission_counters = 4096,
                                      .disk_tier_dir = dir / "tier"});
  auto tiered_rows = tiered.lookup(ids);
  loom::session s(g, opts());
  s.run(loom::global_variables_initializer(g));
  s.run(rows, {{ids, loom::tensor<std::int64_t, 1>(loom::shape{5}, {0, 1, 2, 3, 5})}});
  s.run(tiered_rows, {{ids, loom::tensor<std::int64_t, 1>(loom::shape{4}, {10, 11, 12, 13})}});
  for (std::int64_t id : {10, 11, 12}) // admitted one a step: 10 ends on disk, 13 waits
    s.run(tiered_rows, {{ids, loom::tensor<std::int64_t, 1>(loom::shape{1}, {id})}});
  for (const auto format : {loom_format, loom::checkpoint_format::tensorflow}) {
    const auto path =
        loom::saver(g, {.format = format}).save(s, dir / (format == loom_format ? "loom" : "tf"));
    auto c = std::make_unique<loom::testing::child>(tool, std::vector<std::string>{path});
    const auto st = c->wait(std::chrono::seconds(60));
    REQUIRE_MESSAGE(st, c->report());
    CHECK_MESSAGE(st->success(), c->output());
    CHECK_MESSAGE(contains(c->output(), "t/part_0_of_2: 2 of 8\n"), c->output()); // 0 and 2
    CHECK_MESSAGE(contains(c->output(), "t/part_1_of_2: 3 of 8\n"), c->output()); // 1, 3, 5
    CHECK_MESSAGE(
        contains(c->output(), "d/part_0_of_1: 2 of 3, 1 on disk, about 1 waiting for admission\n"),
        c->output());
    CHECK_MESSAGE(!contains(c->output(), ".disk_tier:"), c->output()); // not a shard
  }
}

// TensorFlow's V2 checkpoint format (core/tensor_bundle.hpp) and its parts: CRC-32C,
// LevelDB tables, tensor slices. The fixtures under tests/data/tf_checkpoints/ were
// written by TensorFlow (benchmarks/tf/write_checkpoint_fixtures.py): loom reads each
// and compares with the values TF read back, bit for bit, and writes the same tensors
// into files byte-identical to TF's.
#include <loom/core/crc32c.hpp>
#include <loom/core/leveldb_table.hpp>
#include <loom/core/tensor_bundle.hpp>
#include <loom/core/tensor_slice.hpp>
#include <loom/core/tfrecord.hpp>

#include <support/messages.hpp>
#include <support/scratch_dir.hpp>

#include <doctest/doctest.h>

#include <snappy.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace tensor_bundle_test {

namespace fs = std::filesystem;
namespace tb = loom::tensor_bundle;
using loom::testing::contains;
using loom::testing::message_of;
using loom::testing::scratch_dir;

std::string fixture(const std::string& relative) {
  return std::string(LOOM_TEST_SOURCE_DIR) + "/tests/data/tf_checkpoints/" + relative;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_bytes(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Copies checkpoint `prefix`'s files into `dir` under `name`; returns the new prefix.
std::string copy_checkpoint(const std::string& prefix, const scratch_dir& dir,
                            const std::string& name) {
  const fs::path from = prefix;
  for (const auto& f : fs::directory_iterator(from.parent_path())) {
    const std::string file = f.path().filename().string();
    const std::string stem = from.filename().string();
    if (file.rfind(stem + ".index", 0) == 0 || file.rfind(stem + ".data-", 0) == 0)
      fs::copy_file(f.path(), dir / (name + file.substr(stem.size())));
  }
  return dir / name;
}

// What TF read back from a fixture (PREFIX.expected.txt).
struct expected_tensor {
  std::string dtype;
  std::vector<std::int64_t> dims;
  std::vector<std::string> values;
};
struct expected_checkpoint {
  std::map<std::string, expected_tensor> tensors;
  std::map<std::string, std::vector<std::string>> specs; // name -> save_slice_info specs
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, sep))
    out.push_back(item);
  if (!s.empty() && s.back() == sep)
    out.emplace_back();
  return out;
}

expected_checkpoint read_expected(const std::string& prefix) {
  expected_checkpoint e;
  std::istringstream in(read_bytes(prefix + ".expected.txt"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#')
      continue;
    const auto fields = split(line, '\t');
    if (fields[0] == "slice") {
      e.specs[fields.at(1)].push_back(fields.at(2));
      continue;
    }
    REQUIRE(fields.size() == 5);
    expected_tensor t;
    t.dtype = fields[2];
    if (fields[3] != "-")
      for (const auto& d : split(fields[3], ','))
        t.dims.push_back(std::stoll(d));
    if (!fields[4].empty())
      t.values = split(fields[4], ' ');
    e.tensors[fields[1]] = std::move(t);
  }
  return e;
}

// A tensor's values as the expected files write them.
std::vector<std::string> value_strings(const loom::any_tensor& t) {
  std::vector<std::string> out;
  char buf[32];
  loom::visit_dtype(t.type(), [&]<class T>() {
    for (const T& v : t.flat<T>()) {
      if constexpr (std::is_same_v<T, float>) {
        std::snprintf(buf, sizeof buf, "%08x", std::bit_cast<std::uint32_t>(v));
        out.emplace_back(buf);
      } else if constexpr (std::is_same_v<T, double>) {
        std::snprintf(buf, sizeof buf, "%016llx",
                      static_cast<unsigned long long>(std::bit_cast<std::uint64_t>(v)));
        out.emplace_back(buf);
      } else if constexpr (std::is_same_v<T, bool>) {
        out.emplace_back(v ? "1" : "0");
      } else if constexpr (std::is_same_v<T, std::string>) {
        std::string hex = "x";
        for (unsigned char c : v) {
          std::snprintf(buf, sizeof buf, "%02x", c);
          hex += buf;
        }
        out.push_back(hex);
      } else {
        out.push_back(std::to_string(v));
      }
    }
  });
  return out;
}

void check_equals_expected(const loom::any_tensor& t, const expected_tensor& e,
                           const std::string& name) {
  INFO("tensor " << name);
  CHECK(std::string(loom::to_string(t.type())) == e.dtype);
  CHECK(t.shape().dims() == e.dims);
  CHECK(value_strings(t) == e.values);
}

// Checks every tensor and every partitioned tensor's parts of a TF-written fixture.
void check_fixture(const std::string& prefix) {
  const expected_checkpoint expected = read_expected(prefix);
  const tb::reader reader(prefix);
  std::vector<std::string> names;
  for (const tb::entry* e : reader.entries())
    names.push_back(e->key);
  std::vector<std::string> expected_names;
  for (const auto& [name, t] : expected.tensors)
    expected_names.push_back(name);
  CHECK(names == expected_names);
  for (const auto& [name, t] : expected.tensors) {
    const tb::entry* e = reader.find(name);
    REQUIRE(e);
    CHECK(e->dtype_name() == t.dtype);
    CHECK(e->shape.dims() == t.dims);
    if (!e->type())
      continue; // a dtype loom lacks: its own case below
    check_equals_expected(reader.read_tensor(name), t, name);
    std::vector<std::string> specs;
    for (const loom::tensor_slice& s : e->slices) {
      std::string spec;
      for (std::int64_t d : e->shape.dims())
        spec += std::to_string(d) + " ";
      specs.push_back(spec + s.to_string());
    }
    const auto it = expected.specs.find(name);
    CHECK(specs == (it == expected.specs.end() ? std::vector<std::string>{} : it->second));
  }
}

const std::string mlp = fixture("mlp_adam/model.ckpt-3");
const std::string partitioned = fixture("partitioned/model.ckpt-2");
const std::string sharded = fixture("sharded/model.ckpt");

// Writes the tensors of a TF-written checkpoint again with loom, each data file's in
// the order TF wrote them (by offset), parts as parts.
void rewrite(const std::string& from, const std::string& to) {
  const tb::reader reader(from);
  struct stored {
    std::int32_t shard;
    std::uint64_t offset;
    tb::tensor_to_save tensor;
  };
  std::vector<stored> all;
  for (const tb::entry* e : reader.entries()) {
    if (!e->partitioned()) {
      all.push_back({e->shard_id, e->offset, {e->key, reader.read_tensor(e->key), {}, {}}});
      continue;
    }
    for (const loom::tensor_slice& s : e->slices) {
      const tb::entry* part = reader.find_part(e->key, s); // where TF put the part
      REQUIRE(part);
      all.push_back(
          {part->shard_id, part->offset, {e->key, reader.read_slice(e->key, s), s, e->shape}});
    }
  }
  std::sort(all.begin(), all.end(), [](const stored& a, const stored& b) {
    return std::pair(a.shard, a.offset) < std::pair(b.shard, b.offset);
  });
  std::vector<tb::entry> entries;
  for (int shard = 0; shard < reader.num_shards(); ++shard) {
    std::vector<tb::tensor_to_save> mine;
    for (const stored& s : all)
      if (s.shard == shard)
        mine.push_back(s.tensor);
    auto written = tb::write_shard(to, shard, reader.num_shards(), mine.size(),
                                   [&](std::size_t i) { return mine[i]; });
    entries.insert(entries.end(), written.begin(), written.end());
  }
  tb::write_index(to, reader.num_shards(), entries);
}

TEST_CASE("crc32c: extended piece by piece, equal to the byte-wise table's CRC-32C") {
  std::mt19937 rng(7);
  std::string bytes(1000, '\0');
  for (char& c : bytes)
    c = static_cast<char>(rng());
  for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 63u, 1000u}) {
    const std::string_view part(bytes.data(), n);
    CHECK(loom::detail::crc32c::value(part) ==
          loom::detail::crc32c::extend_bytewise(0, part.data(), part.size()));
    for (std::size_t cut = 0; cut <= n; cut += 3)
      CHECK(loom::detail::crc32c::extend(loom::detail::crc32c::value(part.substr(0, cut)),
                                         part.substr(cut)) == loom::detail::crc32c::value(part));
  }
  CHECK(loom::detail::crc32c::value("123456789") == 0xe3069283u); // the CRC-32C check value
  CHECK(loom::detail::crc32c::extend_bytewise(0, "123456789", 9) == 0xe3069283u);
}

TEST_CASE("leveldb table: entries round-trip over many blocks, restarts and Snappy") {
  for (auto compression : {loom::detail::leveldb_table::compression::none,
                           loom::detail::leveldb_table::compression::snappy}) {
    loom::detail::leveldb_table::options o;
    o.block_size = 256; // many blocks
    o.restart_interval = 3;
    o.compression = compression;
    loom::detail::leveldb_table::table_builder builder(o);
    std::vector<std::pair<std::string, std::string>> rows;
    for (int i = 0; i < 300; ++i) {
      char key[32];
      std::snprintf(key, sizeof key, "layer%03d/weights%s", i, i % 2 ? "/Adam" : "");
      rows.emplace_back(key, std::string(static_cast<std::size_t>(i % 40), 'v'));
    }
    rows.emplace_back(std::string("\xff\xff", 2), std::string(2000, 'z')); // a block of its own
    for (const auto& [k, v] : rows)
      builder.add(k, v);
    const std::string file = builder.finish();
    const auto read = loom::detail::leveldb_table::read_table(file, "table");
    REQUIRE(read.size() == rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      CHECK(read[i].key == rows[i].first);
      CHECK(read[i].value == rows[i].second);
    }
    // Where Snappy was asked for, the (compressible) blocks are stored compressed.
    const bool smaller = file.size() < 300 * 30;
    CHECK(smaller == (compression == loom::detail::leveldb_table::compression::snappy));
  }
  loom::detail::leveldb_table::table_builder builder;
  builder.add("b", "1");
  CHECK(contains(message_of<loom::invalid_argument_error>([&] { builder.add("a", "2"); }),
                 "strictly increasing"));
}

TEST_CASE("leveldb table: a block TF's reader would take compressed with Snappy is read") {
  // A block built by hand and compressed with Snappy itself, with TF's trailer.
  loom::detail::leveldb_table::block_builder block(16);
  block.add("", "header");
  block.add("emb", std::string(500, 'e'));
  const std::string raw = block.finish();
  std::string compressed;
  snappy::Compress(raw.data(), raw.size(), &compressed);
  REQUIRE(compressed.size() < raw.size());
  std::string file = compressed + '\x01';
  const std::uint32_t crc = loom::tfrecord::mask(loom::detail::crc32c::value(file));
  for (int i = 0; i < 4; ++i)
    file.push_back(static_cast<char>(crc >> (8 * i) & 0xff));
  // The index block: "emb\x01"... any key >= "emb" pointing at the data block.
  loom::detail::leveldb_table::block_builder index(1);
  std::string handle;
  loom::detail::leveldb_table::block_handle{0, compressed.size()}.encode_to(handle);
  index.add("f", handle);
  const std::string index_raw = index.finish();
  const std::uint64_t index_offset = file.size();
  std::string index_stored = index_raw + '\0';
  const std::uint32_t index_crc = loom::tfrecord::mask(loom::detail::crc32c::value(index_stored));
  file += index_stored;
  for (int i = 0; i < 4; ++i)
    file.push_back(static_cast<char>(index_crc >> (8 * i) & 0xff));
  std::string footer;
  loom::detail::leveldb_table::block_handle{index_offset, 0}.encode_to(footer); // metaindex: unused
  loom::detail::leveldb_table::block_handle{index_offset, index_raw.size()}.encode_to(footer);
  footer.resize(40, '\0');
  for (int i = 0; i < 8; ++i)
    footer.push_back(static_cast<char>(loom::detail::leveldb_table::magic >> (8 * i) & 0xff));
  file += footer;
  const auto rows = loom::detail::leveldb_table::read_table(file, "snappy.index");
  REQUIRE(rows.size() == 2);
  CHECK(rows[1].key == "emb");
  CHECK(rows[1].value == std::string(500, 'e'));

  std::string corrupt = file;
  corrupt[3] ^= 0x10;
  CHECK(contains(message_of<loom::data_loss_error>(
                     [&] { loom::detail::leveldb_table::read_table(corrupt, "snappy.index"); }),
                 "snappy.index: data block 0 block at byte 0 fails its checksum"));
}

TEST_CASE("tensor_slice: TF's text, shapes, intersections and copies") {
  const auto s = loom::tensor_slice::parse("0,4:-");
  CHECK(s.rank() == 2);
  CHECK(s.to_string() == "0,4:-");
  CHECK(s.shape_in(loom::shape{10, 3}) == loom::shape{4, 3});
  const auto [full, part] = loom::tensor_slice::parse_spec("10 4 4,3:0,4");
  CHECK(full == loom::shape{10, 4});
  CHECK(part == loom::tensor_slice({4, 0}, {3, 4}));
  CHECK_FALSE(part.is_full());
  CHECK(loom::tensor_slice::full(2).covers(full));
  CHECK(loom::tensor_slice({0, 0}, {10, 4}).covers(full));
  CHECK_FALSE(part.intersect(s, full)); // rows 4..6 and 0..3
  CHECK(part.intersect(loom::tensor_slice::parse("2,3:1,2"), full) ==
        loom::tensor_slice({4, 1}, {1, 2}));
  CHECK(contains(message_of<loom::invalid_argument_error>(
                     [] { loom::tensor_slice::parse_spec("10 4 8,3:-"); }),
                 "slice 8,3:- runs past dimension 0 of shape [10, 4]"));
  CHECK(contains(message_of<loom::invalid_argument_error>([] { loom::tensor_slice::parse("1"); }),
                 "'1' is not 'start,length' or '-'"));

  // Rows 2..5 of a [6, 3] tensor from its part rows 1..4.
  loom::any_tensor from(loom::dtype::i32, loom::shape{3, 3});
  for (int i = 0; i < 9; ++i)
    from.data<std::int32_t>()[i] = 10 * (1 + i / 3) + i % 3;
  loom::any_tensor to(loom::dtype::i32, loom::shape{4, 2});
  std::fill_n(to.data<std::int32_t>(), 8, -1);
  const std::int64_t copied =
      loom::detail::copy_common_elements(from, loom::tensor_slice::parse("1,3:-"), to,
                                         loom::tensor_slice::parse("2,4:1,2"), loom::shape{6, 3});
  CHECK(copied == 4);
  CHECK(std::vector<std::int32_t>(to.data<std::int32_t>(), to.data<std::int32_t>() + 8) ==
        std::vector<std::int32_t>{21, 22, 31, 32, -1, -1, -1, -1});
}

TEST_CASE("slice keys: TF's OrderedCode") {
  // The signed numbers of OrderedCode's own examples, and its edges.
  auto signed_code = [](std::int64_t v) {
    std::string out;
    tb::detail::ordered_signed_number(out, v);
    return out;
  };
  CHECK(signed_code(0x424242) == std::string("\xf0\x42\x42\x42"));
  CHECK(signed_code(-0x800) == std::string("\x38\x00", 2));
  CHECK(signed_code(0) == std::string("\x80"));
  CHECK(signed_code(-1) == std::string("\x7f"));
  CHECK(signed_code(63) == std::string("\xbf"));
  CHECK(signed_code(64) == std::string("\xc0\x40"));
  CHECK(signed_code(-65) == std::string("\x3f\xbf"));
  CHECK(signed_code(std::numeric_limits<std::int64_t>::max()) ==
        std::string("\xff\xc0\x7f\xff\xff\xff\xff\xff\xff\xff"));
  CHECK(signed_code(std::numeric_limits<std::int64_t>::min()) ==
        std::string("\x00\x3f\x80\x00\x00\x00\x00\x00\x00\x00", 10));
  CHECK(tb::slice_key("a\xff", loom::tensor_slice::parse("0,4:-")) ==
        std::string("\x00\x61\xff\x00\x00\x01\x01\x02\x80\x84\x80\x7f", 12));
}

TEST_CASE("TF-written checkpoints: every tensor and slot equals TF's, bit for bit") {
  SUBCASE("an MLP after Adam steps") {
    check_fixture(mlp);
  }
  SUBCASE("a 3-way partitioned embedding with its Adagrad slot") {
    check_fixture(partitioned);
  }
  SUBCASE("a sharded saver's two data files, every dtype") {
    check_fixture(sharded);
  }

  const tb::reader r(mlp);
  CHECK(r.num_shards() == 1);
  for (const char* slot :
       {"hid_w/Adam", "hid_w/Adam_1", "beta1_power", "beta2_power", "global_step", "sm_b/Adam_1"})
    CHECK_MESSAGE(r.has_tensor(slot), slot);
  CHECK(loom::tensor<std::int64_t, 0>::from(r.read_tensor("global_step")).item() == 3);
  const tb::reader s(sharded);
  CHECK(s.num_shards() == 2);
  const tb::entry* table = s.find("table");
  REQUIRE(table);
  CHECK(table->slices.size() == 2); // one part in each data file
}

TEST_CASE("a partitioned table restores into 2 and into 5 parts, and whole") {
  const tb::reader r(partitioned);
  const expected_checkpoint expected = read_expected(partitioned);
  for (const std::string name : {"emb", "emb/Adagrad"}) {
    const std::vector<std::string> whole = expected.tensors.at(name).values;
    for (int parts : {1, 2, 5}) {
      std::vector<std::string> joined;
      for (int p = 0; p < parts; ++p) {
        const std::int64_t rows = 10 / parts;
        const loom::any_tensor t = r.read_slice(
            name, loom::tensor_slice({p * rows, 0}, {rows, loom::tensor_slice::whole}));
        CHECK(t.shape() == loom::shape{rows, 4});
        for (const std::string& v : value_strings(t))
          joined.push_back(v);
      }
      CHECK_MESSAGE(joined == whole, name << " in " << parts << " parts");
    }
    // Columns across every part.
    const loom::any_tensor column = r.read_slice(name, loom::tensor_slice::parse("-:2,1"));
    const auto values = value_strings(column);
    REQUIRE(values.size() == 10);
    for (std::size_t row = 0; row < 10; ++row)
      CHECK(values[row] == whole[row * 4 + 2]);
  }
}

TEST_CASE("loom writes a TF-written checkpoint's tensors into the same bytes") {
  scratch_dir dir;
  for (const auto& checkpoint : {std::pair{mlp, "mlp"}, std::pair{partitioned, "partitioned"}}) {
    const std::string from = checkpoint.first, name = checkpoint.second;
    INFO(name);
    const std::string to = dir / name;
    rewrite(from, to);
    CHECK(read_bytes(tb::index_path(to)) == read_bytes(tb::index_path(from)));
    CHECK(read_bytes(tb::data_path(to, 0, 1)) == read_bytes(tb::data_path(from, 0, 1)));
    check_fixture(from); // and the fixture's checks pass on loom's copy
    const expected_checkpoint expected = read_expected(from);
    const tb::reader copy(to);
    for (const auto& [tensor, t] : expected.tensors)
      check_equals_expected(copy.read_tensor(tensor), t, tensor);
  }
}

TEST_CASE("loom's checkpoints: every dtype, strings, parts over several data files") {
  scratch_dir dir;
  const std::string prefix = dir / "model.ckpt-7";
  std::vector<std::string> strings = {"", "loom", std::string("\0\xff\x01", 3),
                                      std::string(300, 's')};
  const loom::any_tensor table = loom::any_tensor::from_vector<float>(
      loom::shape{5, 2}, {0, 1, 10, 11, 20, 21, 30, 31, 40, 41});
  auto rows = [&](std::int64_t first, std::int64_t n) {
    loom::any_tensor part(loom::dtype::f32, loom::shape{n, 2});
    std::copy_n(table.data<float>() + first * 2, n * 2, part.data<float>());
    return part;
  };
  std::vector<std::vector<tb::tensor_to_save>> shards(2);
  shards[0] = {
      {"f64", loom::any_tensor::from_vector<double>(loom::shape{2}, {3.5, -1e300}), {}, {}},
      {"i32", loom::any_tensor::scalar<std::int32_t>(-7), {}, {}},
      {"table", rows(0, 2), loom::tensor_slice::parse("0,2:0,2"), loom::shape{5, 2}},
      {"empty", loom::any_tensor(loom::dtype::f32, loom::shape{0, 3}), {}, {}},
  };
  shards[1] = {
      {"str", loom::any_tensor::from_vector<std::string>(loom::shape{2, 2}, strings), {}, {}},
      {"table", rows(2, 3), loom::tensor_slice::parse("2,3:-"), loom::shape{5, 2}},
      {"no_strings", loom::any_tensor(loom::dtype::string, loom::shape{0}), {}, {}},
      {"flags", loom::any_tensor::from_vector<bool>(loom::shape{3}, {true, false, true}), {}, {}},
      {"i64", loom::any_tensor::from_vector<std::int64_t>(loom::shape{1}, {-(1ll << 62)}), {}, {}},
      // A part that is the whole tensor is saved as the tensor.
      {"whole", loom::any_tensor::scalar(2.5f), loom::tensor_slice::full(0), loom::shape{}},
  };
  std::vector<tb::entry> entries;
  for (int s = 0; s < 2; ++s) {
    auto written =
        tb::write_shard(prefix, s, 2, shards[static_cast<std::size_t>(s)].size(),
                        [&](std::size_t i) { return shards[static_cast<std::size_t>(s)][i]; });
    entries.insert(entries.end(), written.begin(), written.end());
  }
  CHECK_FALSE(fs::exists(tb::index_path(prefix))); // the index comes last
  tb::write_index(prefix, 2, entries);

  const tb::reader r(prefix);
  std::vector<std::string> names;
  for (const tb::entry* e : r.entries())
    names.push_back(e->key);
  CHECK(names == std::vector<std::string>{"empty", "f64", "flags", "i32", "i64", "no_strings",
                                          "str", "table", "whole"});
  CHECK(value_strings(r.read_tensor("table")) == value_strings(table));
  CHECK(r.find("table")->slices.size() == 2);
  CHECK(r.find("whole")->slices.empty());
  CHECK(r.read_tensor("str").flat<std::string>()[2] == strings[2]);
  CHECK(r.read_tensor("str").flat<std::string>()[3] == strings[3]);
  CHECK(r.read_tensor("str").shape() == loom::shape{2, 2});
  CHECK(r.read_tensor("no_strings").num_elements() == 0);
  CHECK(r.read_tensor("empty").shape() == loom::shape{0, 3});
  CHECK(r.read_tensor("f64").data<double>()[1] == -1e300);
  CHECK(r.read_tensor("flags").data<bool>()[2]);
  CHECK(r.read_tensor("i64").data<std::int64_t>()[0] == -(1ll << 62));
  CHECK(r.read_tensor("i32").data<std::int32_t>()[0] == -7);
  CHECK(r.read_tensor("whole").data<float>()[0] == 2.5f);
  CHECK(value_strings(r.read_slice("table", loom::tensor_slice::parse("1,3:1,1"))) ==
        std::vector<std::string>{"41300000", "41a80000", "41f80000"});
  CHECK(value_strings(r.read_slice("f64", loom::tensor_slice::parse("1,1"))) ==
        value_strings(loom::any_tensor::from_vector<double>(loom::shape{1}, {-1e300})));

  SUBCASE("writer errors") {
    const std::string bad = dir / "bad";
    auto write_one = [&](tb::tensor_to_save t) { tb::write(bad, {t, t}); };
    CHECK(contains(message_of<loom::invalid_argument_error>([&] {
                     write_one({"x", loom::any_tensor::scalar(1.f), {}, {}});
                   }),
                   "tensor 'x' is saved twice"));
    CHECK(contains(
        message_of<loom::invalid_argument_error>([&] {
          write_one({"t", rows(0, 2), loom::tensor_slice::parse("0,3:-"), loom::shape{5, 2}});
        }),
        "part 0,3:- of [5, 2] is [3, 2], its value float32[2, 2]"));
    CHECK(contains(
        message_of<loom::invalid_argument_error>([&] {
          write_one({"t", rows(0, 2), loom::tensor_slice::parse("0,2:-"), loom::shape{5, 2}});
        }),
        "tensor 't' has parts 0,2:- and 0,2:-, which overlap"));
    CHECK_FALSE(fs::exists(tb::index_path(bad)));
  }
}

TEST_CASE("bad checkpoints: one clear error each") {
  scratch_dir dir;
  SUBCASE("a truncated index names the file") {
    const std::string p = copy_checkpoint(mlp, dir, "cut");
    const std::string index = read_bytes(tb::index_path(p));
    write_bytes(tb::index_path(p), index.substr(0, index.size() - 10));
    CHECK(contains(message_of<loom::data_loss_error>([&] { tb::reader r(p); }),
                   tb::index_path(p) + " does not end in a LevelDB table's magic number"));
    write_bytes(tb::index_path(p), index.substr(0, 20));
    CHECK(contains(message_of<loom::data_loss_error>([&] { tb::reader r(p); }),
                   tb::index_path(p) + " has 20 bytes, fewer than a table's footer"));
  }
  SUBCASE("a corrupt index names the file") {
    const std::string p = copy_checkpoint(mlp, dir, "flip");
    std::string index = read_bytes(tb::index_path(p));
    index[40] ^= 0x01;
    write_bytes(tb::index_path(p), index);
    CHECK(contains(message_of<loom::data_loss_error>([&] { tb::reader r(p); }),
                   tb::index_path(p) + ": data block 0 block at byte 0 fails its checksum"));
  }
  SUBCASE("a truncated data file names the file and the tensor") {
    const std::string p = copy_checkpoint(mlp, dir, "short");
    const std::string data_file = tb::data_path(p, 0, 1);
    const tb::reader r(p);
    const tb::entry* last = nullptr;
    for (const tb::entry* e : r.entries())
      if (!last || e->offset > last->offset)
        last = e;
    fs::resize_file(data_file, last->offset + 2);
    CHECK(contains(message_of<loom::data_loss_error>([&] { r.read_tensor(last->key); }),
                   data_file + ": tensor '" + last->key + "' needs bytes"));
    CHECK(r.read_tensor("global_step").num_elements() == 1); // the others still read
  }
  SUBCASE("a flipped data byte fails the tensor's CRC") {
    const std::string p = copy_checkpoint(partitioned, dir, "crc");
    const std::string data_file = tb::data_path(p, 0, 1);
    std::string data = read_bytes(data_file);
    data[5] ^= 0x40; // in the first part written
    write_bytes(data_file, data);
    const tb::reader r(p);
    const std::string message = message_of<loom::data_loss_error>([&] { r.read_tensor("emb"); });
    CHECK(contains(message, data_file + ": tensor 'emb' (a part) fails its checksum (stored "
                                        "crc32c "));
  }
  SUBCASE("a missing data file") {
    const std::string p = copy_checkpoint(sharded, dir, "half");
    fs::remove(tb::data_path(p, 1, 2));
    const tb::reader r(p);
    CHECK(r.read_tensor("a/i32").num_elements() == 3);
    CHECK(contains(message_of<loom::not_found_error>([&] { r.read_tensor("b/i64"); }),
                   "data file " + tb::data_path(p, 1, 2) + ": No such file"));
  }
  SUBCASE("a dtype loom lacks") {
    const tb::reader r(sharded);
    CHECK(r.find("a/f16")->dtype_name() == "float16");
    CHECK(contains(message_of<loom::unimplemented_error>([&] { r.read_tensor("a/f16"); }),
                   "tensor 'a/f16' is float16 (TF DataType 19), which loom has no dtype for"));
  }
  SUBCASE("a name the checkpoint lacks lists the nearest") {
    const tb::reader r(mlp);
    CHECK(contains(message_of<loom::not_found_error>([&] { r.read_tensor("hid_w/adam"); }),
                   "has no tensor 'hid_w/adam' (nearest: 'hid_w/Adam', 'hid_b/Adam', "
                   "'hid_w/Adam_1')"));
  }
  SUBCASE("a shape or dtype mismatch names both") {
    const tb::reader r(mlp);
    CHECK(contains(message_of<loom::invalid_argument_error>([&] {
                     r.read_tensor("hid_w", loom::dtype::f32, loom::shape{784, 100});
                   }),
                   "tensor 'hid_w' is float32[20, 8], restored into float32[784, 100]"));
    CHECK(contains(message_of<loom::invalid_argument_error>(
                       [&] { r.read_tensor("global_step", loom::dtype::i32, loom::shape{}); }),
                   "tensor 'global_step' is int64[], restored into int32[]"));
    CHECK(r.read_tensor("hid_w", loom::dtype::f32, loom::shape{20, 8}).num_elements() == 160);
  }
  SUBCASE("no checkpoint at all") {
    CHECK(contains(message_of<loom::not_found_error>([&] { tb::reader r(dir / "none"); }),
                   "checkpoint index " + (dir / "none.index") + ": cannot open"));
  }
}

} // namespace tensor_bundle_test

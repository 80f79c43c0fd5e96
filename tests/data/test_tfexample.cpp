// Tests for tf.Example in loom::data: TFRecord files of Examples that
// TensorFlow wrote (tests/data/tf/, plain, GZIP, ZLIB, several files) parse to
// exactly what TF's parse_example gave; example_builder's bytes parse back;
// string_to_hash_bucket_fast gives TF's buckets; and each bad Example is one
// error naming the feature and the example.
#include <doctest/doctest.h>

#include <loom/core/fingerprint.hpp>
#include <loom/data/pipeline.hpp>

#include <support/data_files.hpp>
#include <support/messages.hpp>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

// A namespace of their own: test_data's unity unit has helpers of the same names.
namespace pipeline_tests {

using namespace loom;
using loom::testing::contains;
using loom::testing::message_of;
using loom::testing::tf_fixture;

namespace {

// The spec of benchmarks/tf/write_data_fixtures.py.
data::example_spec fixture_spec() {
  data::example_spec spec;
  spec.fixed_len("label", dtype::i64, shape{1})
      .fixed_len("ints", dtype::i64, shape{3})
      .fixed_len("score", dtype::f32, shape{2})
      .fixed_len("name", dtype::string, shape{})
      .fixed_len<std::int64_t>("opt", shape{1}, {-1})
      .var_len("tags", dtype::string)
      .var_len("ids", dtype::i64)
      .var_len("weights", dtype::f32);
  return spec;
}

std::string hex_decoded(const std::string& hex) {
  if (hex == "-")
    return "";
  std::string out;
  for (std::size_t i = 0; i < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// One tensor's values as the fixture text writes them.
std::vector<std::string> as_fixture_text(const any_tensor& t) {
  std::vector<std::string> out;
  visit_dtype(t.type(), [&]<class T>() {
    for (const T& v : t.flat<T>()) {
      if constexpr (std::is_same_v<T, std::string>) {
        out.push_back(v);
      } else if constexpr (std::is_same_v<T, float>) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(v));
        out.emplace_back(buf);
      } else {
        out.push_back(std::to_string(v));
      }
    }
  });
  return out;
}

std::string dims_text(const shape& s) {
  std::string out;
  for (const auto d : s.dims())
    out += (out.empty() ? "" : "x") + std::to_string(d);
  return out.empty() ? "scalar" : out;
}

// Checks parsed features against parsed_examples.txt, line by line.
void check_against_tf(const data::features& parsed) {
  std::ifstream in(tf_fixture("parsed_examples.txt"));
  REQUIRE(in);
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string kind, name, type, dims;
    words >> kind >> name >> type >> dims;
    CAPTURE(line);
    std::vector<std::string> rest;
    for (std::string w; words >> w;)
      rest.push_back(w);
    const bool strings = type == "string";
    if (kind == "dense") {
      const any_tensor& t = parsed.dense_value(name);
      CHECK(dims_text(t.shape()) == dims);
      std::vector<std::string> want;
      for (const auto& w : rest)
        want.push_back(strings ? hex_decoded(w) : w);
      CHECK(as_fixture_text(t) == want);
    } else {
      const data::any_sparse& s = parsed.sparse_any(name);
      CHECK(dims_text(shape{s.dense_shape(0), s.dense_shape(1)}) == dims);
      std::vector<std::string> want_indices, want_values;
      bool values = false;
      for (const auto& w : rest) {
        if (w == "|")
          values = true;
        else if (values)
          want_values.push_back(strings ? hex_decoded(w) : w);
        else
          want_indices.push_back(w);
      }
      std::vector<std::string> got_indices;
      for (std::int64_t k = 0; k < s.indices.dim(0); ++k)
        got_indices.push_back(std::to_string(s.indices(k, 0)) + "," +
                              std::to_string(s.indices(k, 1)));
      CHECK(got_indices == want_indices);
      CHECK(as_fixture_text(s.values) == want_values);
    }
    ++checked;
  }
  CHECK(checked == 8);
}

template <class D> std::vector<data::element_of<D>> read_all_of(const D& d) {
  std::vector<data::element_of<D>> out;
  for (auto& e : d)
    out.push_back(e);
  return out;
}

} // namespace

TEST_CASE("TF-written TFRecord files of tf.Example parse to TF's values") {
  for (const auto& file : {std::pair{"examples.tfrecord", data::compression::none},
                           {"examples.tfrecord.gz", data::compression::gzip},
                           {"examples.zlib.tfrecord", data::compression::zlib}}) {
    CAPTURE(file.first);
    auto parsed = read_all_of(data::tfrecord_dataset({tf_fixture(file.first)}, file.second) |
                              data::batch(4) | data::map(data::example_parser(fixture_spec())));
    REQUIRE(parsed.size() == 1);
    check_against_tf(parsed[0]);
  }

  // Parsed one at a time and batched, the sparse features batch to the same values.
  const auto spec = fixture_spec();
  auto singles =
      data::tfrecord_dataset({tf_fixture("examples.tfrecord")}) |
      data::map([spec](const std::string& r) { return data::parse_single_example(spec, r); }) |
      data::batch(4);
  check_against_tf(read_all_of(singles).at(0));

  // Typed reads, and one clear error for a wrong guess.
  const auto batch = read_all_of(data::tfrecord_dataset({tf_fixture("examples.tfrecord")}) |
                                 data::batch(4) | data::map(data::example_parser(spec)))[0];
  CHECK(batch.dense<std::int64_t, 2>("ints")(2, 2) == std::int64_t{1} << 62);
  CHECK(batch.sparse<float>("weights").values(0) == 0.1f);
  CHECK(contains(message_of<invalid_argument_error>([&] { batch.dense<float, 2>("ints"); }),
                 "feature \"ints\" is int64[4, 3], read as float32 of rank 2"));
  CHECK(contains(message_of<invalid_argument_error>([&] { batch.dense_value("tags"); }),
                 "\"tags\" is sparse"));
  CHECK(contains(message_of<invalid_argument_error>([&] { batch.sparse<std::int64_t>("weights"); }),
                 "holds float32 values, read as int64"));
}

TEST_CASE("TF-written shard files: several files, sharded per worker") {
  auto ids_of = [](auto d) {
    data::example_spec spec;
    spec.fixed_len("id", dtype::i64, shape{});
    std::vector<std::int64_t> ids;
    for (auto& f : d | data::batch(100) | data::map(data::example_parser(spec)))
      for (auto v : f.template dense<std::int64_t, 1>("id").flat())
        ids.push_back(v);
    return ids;
  };
  const auto files = data::glob_files(tf_fixture("shard-*-of-00003.tfrecord"));
  REQUIRE(files.size() == 3);
  CHECK(ids_of(data::tfrecord_dataset(files)) ==
        std::vector<std::int64_t>{0, 1, 2, 10, 11, 12, 20, 21, 22});
  // Worker 1 of 2 reads every other file.
  CHECK(ids_of(data::from_tensor_slices(files) | data::shard(2, 1) |
               data::interleave([](const std::string& f) { return data::tfrecord_dataset({f}); },
                                1)) == std::vector<std::int64_t>{10, 11, 12});
}

TEST_CASE("example_builder's bytes parse back, and through a TFRecord file") {
  loom::testing::scratch_dir dir;
  {
    data::tfrecord_writer w(dir.file("built.tfrecord.gz"), data::compression::gzip);
    for (std::int64_t i = 0; i < 3; ++i)
      w.write(data::example_builder()
                  .add_int64("label", {i})
                  .add_float("x", {0.5f * static_cast<float>(i), -1.f})
                  .add_bytes("cat", std::vector<std::string>(static_cast<std::size_t>(i), "c"))
                  .serialize());
    w.close();
  }
  data::example_spec spec;
  spec.fixed_len("label", dtype::i64, shape{})
      .fixed_len("x", dtype::f32, shape{2})
      .var_len("cat", dtype::string);
  const auto f =
      read_all_of(data::tfrecord_dataset({dir.file("built.tfrecord.gz")}, data::compression::gzip) |
                  data::batch(8) | data::map(data::example_parser(spec)))[0];
  CHECK(f.dense<std::int64_t, 1>("label")(2) == 2);
  CHECK(f.dense<float, 2>("x")(1, 0) == 0.5f);
  const auto cat = f.sparse<std::string>("cat");
  CHECK(cat.values.size() == 3);
  CHECK(cat.dense_shape(1) == 2);
  // Unpacked lists (older writers) parse too.
  loom::detail::protobuf::writer list, feature, entry, features, example;
  list.varint(1, 5).varint(1, 6);
  feature.message(3, list);
  entry.bytes(1, "v").message(2, feature);
  features.message(1, entry);
  example.message(1, features);
  data::example_spec two;
  two.fixed_len("v", dtype::i64, shape{2});
  const auto v = data::parse_single_example(two, example.bytes()).dense<std::int64_t, 1>("v");
  CHECK(v(0) == 5);
  CHECK(v(1) == 6);
}

TEST_CASE("a batch whose examples list their features in another order, lack some, give one "
          "twice or carry ones the spec lacks: every value lands in its feature's column") {
  // The parser follows the order the first example taught it (label, a, b, c, d) and skips
  // ahead over missing features; each example here breaks that order another way. Written
  // field by field (example_builder sorts its features by name).
  const auto example = [](std::int64_t label, const std::vector<std::string>& present) {
    loom::detail::protobuf::writer features;
    for (const std::string& name : present) {
      loom::detail::protobuf::writer list, feature, entry;
      list.varint(1, name == "label" ? label : label * 10 + (name[0] - 'a'));
      feature.message(3, list);
      entry.bytes(1, name).message(2, feature);
      features.message(1, entry);
    }
    loom::detail::protobuf::writer e;
    e.message(1, features);
    return e.bytes();
  };
  const std::vector<std::string> serialized{
      example(1, {"label", "a", "b", "c", "d"}),      // the order learned
      example(2, {"label", "a", "d"}),                // two missing after a
      example(3, {"label", "a", "b", "x", "c", "d"}), // one the spec lacks
      example(4, {"d", "c", "b", "a", "label"}),      // reversed
      example(5, {"label", "b", "c"}),                // the first and last missing
      example(6, {"label", "a", "b", "c", "d"}),      // the order again
      example(7, {"label", "a", "a", "b", "c"})};     // one twice (the last wins), one missing
  data::example_spec spec;
  spec.fixed_len("label", dtype::i64, shape{});
  for (const char* name : {"a", "b", "c", "d"})
    spec.fixed_len<std::int64_t>(name, shape{}, {-1});
  const data::features f = data::parse_example(spec, serialized);
  const std::map<std::string, std::vector<std::int64_t>> want{{"label", {1, 2, 3, 4, 5, 6, 7}},
                                                              {"a", {10, 20, 30, 40, -1, 60, 70}},
                                                              {"b", {11, -1, 31, 41, 51, 61, 71}},
                                                              {"c", {12, -1, 32, 42, 52, 62, 72}},
                                                              {"d", {13, 23, 33, 43, -1, 63, -1}}};
  for (const auto& [name, values] : want) {
    const auto column = f.dense<std::int64_t, 1>(name);
    CAPTURE(name);
    CHECK(std::vector<std::int64_t>(column.data(), column.data() + 7) == values);
  }
}

TEST_CASE("string_to_hash_bucket_fast gives TF's buckets") {
  // TF's documented example: tf.strings.to_hash_bucket_fast(["Hello", "TensorFlow",
  // "2.x"], 3) == [0, 2, 2].
  const any_tensor words =
      any_tensor::from_vector<std::string>(shape{3}, {"Hello", "TensorFlow", "2.x"});
  const any_tensor buckets = string_to_hash_bucket_fast(words, 3);
  CHECK(std::vector<std::int64_t>(buckets.flat<std::int64_t>().begin(),
                                  buckets.flat<std::int64_t>().end()) ==
        std::vector<std::int64_t>{0, 2, 2});
  CHECK(string_to_hash_bucket_fast(std::string_view("Hello"), 3) == 0);
}

TEST_CASE("a tf.Example parses to the same values however the wire format encodes it") {
  // example_builder writes as TF does: each field once, in order, lists packed, lengths in one
  // byte where they fit. The parser reads that encoding on a path of its own; each other
  // encoding below takes the general one and must give the same values.
  namespace pb = loom::detail::protobuf;
  const std::vector<std::int64_t> a{3, 300, -70000};
  const std::vector<float> b{0.5f, -2.0f};
  const std::vector<std::string> tags{"x", "yz"};
  std::vector<std::int64_t> many; // 100 two-byte varints: lists and entries of 2-byte lengths
  for (std::int64_t i = 0; i < 100; ++i)
    many.push_back(200 + i);
  const std::string canonical = data::example_builder()
                                    .add_int64("a", a)
                                    .add_float("b", b)
                                    .add_bytes("tags", tags)
                                    .add_int64("many", many)
                                    .serialize();

  // Lists not packed (one field a value), a Feature that sets another kind before its own
  // (the last wins), a map entry with its value before its key and a field it does not know.
  const auto unpacked_ints = [](const std::vector<std::int64_t>& v) {
    pb::writer list;
    for (const auto x : v)
      list.int64(1, x);
    return list;
  };
  pb::writer floats;
  for (const float x : b)
    floats.float32(1, x);
  pb::writer bytes_list;
  for (const auto& t : tags)
    bytes_list.bytes(1, t);
  const auto entry = [](std::string_view key, const pb::writer& feature) {
    return pb::writer().varint(3, 7).message(2, feature).bytes(1, key);
  };
  pb::writer features;
  features
      .message(1, entry("a", pb::writer().message(2, pb::writer()).message(3, unpacked_ints(a))))
      .message(1, entry("b", pb::writer().message(2, floats)))
      .message(1, entry("tags", pb::writer().message(1, bytes_list)))
      .message(1, entry("many", pb::writer().message(3, unpacked_ints(many))))
      .varint(2, 1); // a field Features does not have
  const std::string general = std::move(pb::writer().message(1, features)).bytes();
  REQUIRE(general != canonical);

  data::example_spec spec;
  spec.fixed_len("a", dtype::i64, shape{3})
      .var_len("b", dtype::f32)
      .var_len("tags", dtype::string)
      .var_len("many", dtype::i64);
  for (const auto& serialized : {canonical, general}) {
    CAPTURE(serialized == canonical);
    const data::features f = data::parse_example(spec, std::vector<std::string>{serialized});
    CHECK(std::vector<std::int64_t>(f.dense<std::int64_t, 2>("a").flat().begin(),
                                    f.dense<std::int64_t, 2>("a").flat().end()) == a);
    const auto values = [&]<class T>(const std::string& name) {
      const any_tensor& v = f.sparse_any(name).values;
      return std::vector<T>(v.data<T>(), v.data<T>() + v.num_elements());
    };
    CHECK(values.operator()<float>("b") == b);
    CHECK(values.operator()<std::string>("tags") == tags);
    CHECK(values.operator()<std::int64_t>("many") == many);
  }
}

TEST_CASE("a bad tf.Example: one error naming the feature and the example") {
  const auto make = [](std::int64_t n) {
    return data::example_builder().add_int64(
        "a", std::vector<std::int64_t>(static_cast<std::size_t>(n), 1));
  };
  const std::vector<std::string> batch{make(2).serialize(), make(3).serialize()};
  data::example_spec two;
  two.fixed_len("a", dtype::i64, shape{2});
  CHECK(contains(message_of<invalid_argument_error>([&] { data::parse_example(two, batch); }),
                 "example 1: feature \"a\": more values than the 2 of the spec's shape [2]"));
  const std::vector<std::string> short_one{make(1).serialize()};
  CHECK(contains(message_of<invalid_argument_error>([&] { data::parse_example(two, short_one); }),
                 "example 0: feature \"a\": 1 values, the spec's shape [2] needs 2"));

  data::example_spec missing;
  missing.fixed_len("b", dtype::f32, shape{});
  CHECK(contains(message_of<invalid_argument_error>([&] { data::parse_example(missing, batch); }),
                 "example 0: feature \"b\" (float32) is required but missing"));
  missing = {};
  missing.fixed_len<float>("b", shape{}, {2.5f});
  CHECK(data::parse_example(missing, batch).dense<float, 1>("b")(1) == 2.5f);

  data::example_spec wrong;
  wrong.var_len("a", dtype::string);
  CHECK(contains(message_of<invalid_argument_error>([&] { data::parse_example(wrong, batch); }),
                 "feature \"a\": the spec says string, the example holds int64"));

  const std::vector<std::string> garbage{std::string("\x0a\x50 too short", 12)};
  CHECK(contains(message_of<data_loss_error>([&] { data::parse_example(two, garbage); }),
                 "malformed tf.Example"));
  CHECK(contains(message_of<invalid_argument_error>([] {
                   data::example_spec s;
                   s.var_len("x", dtype::f64);
                 }),
                 "a tf.Example holds int64, float32 or string"));
}

} // namespace pipeline_tests

// Tests for loom::data's datasets: the sources (range, from_tensor_slices,
// TFRecord files plain/GZIP/ZLIB, text lines, list_files), every
// transformation's semantics against TF's, range-for, iterator state that
// resumes exactly, the bounds of the threaded buffers, and each bad input's
// one error.
#include <doctest/doctest.h>

#include <loom/data/pipeline.hpp>

#include <support/data_files.hpp>
#include <support/messages.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

// A namespace of their own: test_data's unity unit has helpers of the same names.
namespace pipeline_tests {

using namespace loom;
using loom::testing::contains;
using loom::testing::message_of;
using loom::testing::scratch_dir;

namespace {

template <class D> std::vector<data::element_of<D>> all_of(const D& d) {
  std::vector<data::element_of<D>> out;
  for (auto& e : d)
    out.push_back(e);
  return out;
}

std::vector<std::int64_t> ints(std::initializer_list<std::int64_t> v) {
  return v;
}

// Files of records "<file>:<k>" for k < per_file.
std::vector<std::string> write_record_files(const scratch_dir& dir, int files, int per_file,
                                            data::compression c = data::compression::none) {
  std::vector<std::string> names;
  for (int f = 0; f < files; ++f) {
    names.push_back(dir.file("f" + std::to_string(f) + ".tfrecord"));
    data::tfrecord_writer w(names.back(), c);
    for (int k = 0; k < per_file; ++k)
      w.write(std::to_string(f) + ":" + std::to_string(k));
    w.close();
  }
  return names;
}

} // namespace

TEST_CASE("range, take, skip, repeat, filter and map compose with TF's semantics") {
  CHECK(all_of(data::range(5)) == ints({0, 1, 2, 3, 4}));
  CHECK(all_of(data::range(10, 0, -3)) == ints({10, 7, 4, 1}));
  CHECK(all_of(data::range(10) | data::take(3)) == ints({0, 1, 2}));
  CHECK(all_of(data::range(10) | data::skip(8)) == ints({8, 9}));
  CHECK(all_of(data::range(3) | data::skip(-1)).empty());
  CHECK(all_of(data::range(3) | data::take(-1)).size() == 3);
  CHECK(all_of(data::range(2) | data::repeat(3)) == ints({0, 1, 0, 1, 0, 1}));
  CHECK(all_of(data::range(3) | data::repeat() | data::take(7)) == ints({0, 1, 2, 0, 1, 2, 0}));
  CHECK(all_of(data::range(0) | data::repeat()).empty()); // an empty pass ends a repeat
  CHECK(all_of(data::range(10) | data::filter([](std::int64_t x) { return x % 3 == 0; })) ==
        ints({0, 3, 6, 9}));
  CHECK(all_of(data::range(4) | data::map([](std::int64_t x) { return x * x; })) ==
        ints({0, 1, 4, 9}));
  // An iterator ends for good: next() keeps giving nullopt.
  auto it = (data::range(1) | data::repeat(2)).make_iterator();
  CHECK(it.next());
  CHECK(it.next());
  CHECK_FALSE(it.next());
  CHECK_FALSE(it.next());
}

TEST_CASE("shard takes every n-th element from index, as TF's shard") {
  CHECK(all_of(data::range(10) | data::shard(3, 1)) == ints({1, 4, 7}));
  CHECK(all_of(data::range(10) | data::shard(3, 0)) == ints({0, 3, 6, 9}));
  CHECK(
      contains(message_of<invalid_argument_error>([] { data::shard(2, 2).apply(data::range(1)); }),
               "index must be in [0, 2)"));
}

TEST_CASE("map with num_parallel_calls keeps the input's order") {
  auto slow_square = [](std::int64_t x) {
    std::this_thread::sleep_for(std::chrono::microseconds((x * 37) % 500));
    return x * x;
  };
  const auto got = all_of(data::range(200) | data::map(slow_square, 4));
  REQUIRE(got.size() == 200);
  for (std::int64_t i = 0; i < 200; ++i)
    CHECK(got[static_cast<std::size_t>(i)] == i * i);
  // An error in one element is thrown in its place; the others still come.
  auto it = (data::range(5) | data::map(
                                  [](std::int64_t x) {
                                    if (x == 2)
                                      throw invalid_argument_error("bad element 2");
                                    return x;
                                  },
                                  3))
                .make_iterator();
  CHECK(*it.next() == 0);
  CHECK(*it.next() == 1);
  CHECK_THROWS_WITH_AS(it.next(), doctest::Contains("bad element 2"), invalid_argument_error);
  CHECK(*it.next() == 3);
  CHECK(*it.next() == 4);
  CHECK_FALSE(it.next());
}

TEST_CASE("shuffle: a seeded permutation, reshuffled each pass, bounded by its buffer") {
  const auto once = all_of(data::range(100) | data::shuffle(100, 7));
  CHECK(once != all_of(data::range(100)));
  CHECK(std::set<std::int64_t>(once.begin(), once.end()).size() == 100);
  CHECK(all_of(data::range(100) | data::shuffle(100, 7)) == once); // same seed, same order

  const auto two_passes = all_of(data::range(20) | data::shuffle(20, 3) | data::repeat(2));
  const std::vector<std::int64_t> first(two_passes.begin(), two_passes.begin() + 20),
      second(two_passes.begin() + 20, two_passes.end());
  CHECK(first != second);
  const auto fixed = all_of(data::range(20) | data::shuffle(20, 3, false) | data::repeat(2));
  CHECK(std::vector<std::int64_t>(fixed.begin(), fixed.begin() + 20) ==
        std::vector<std::int64_t>(fixed.begin() + 20, fixed.end()));

  // A buffer of b: element i comes out no earlier than position i - b + 1.
  const auto local = all_of(data::range(1000) | data::shuffle(10, 1));
  for (std::size_t pos = 0; pos < local.size(); ++pos)
    CHECK(local[pos] <= static_cast<std::int64_t>(pos) + 9);
  CHECK(all_of(data::range(5) | data::shuffle(1, 1)) == ints({0, 1, 2, 3, 4}));
}

TEST_CASE("batch, padded_batch and drop_remainder") {
  const auto batches = all_of(data::range(7) | data::batch(3));
  REQUIRE(batches.size() == 3);
  CHECK(batches[0].shape() == shape{3});
  CHECK(std::vector<std::int64_t>(batches[2].flat().begin(), batches[2].flat().end()) == ints({6}));
  CHECK(all_of(data::range(7) | data::batch(3, true)).size() == 2);

  // Tuples of tensors stack component by component.
  tensor<float, 2> x(shape{4, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  tensor<std::int64_t, 1> y(shape{4}, {10, 11, 12, 13});
  const auto b = all_of(data::from_tensor_slices(x, y) | data::batch(2));
  REQUIRE(b.size() == 2);
  const tensor<float, 2>& bx = std::get<0>(b[1]);
  CHECK(bx.shape() == shape{2, 2});
  CHECK(bx(1, 1) == 7.f);
  CHECK(std::get<1>(b[1])(0) == 12);

  // Ragged rows: batch refuses them with both shapes, padded_batch pads with 0.
  auto ragged = data::range(1, 4) |
                data::map([](std::int64_t n) { return tensor<std::int64_t, 1>(shape{n}, n); });
  CHECK(contains(message_of<invalid_argument_error>([&] { all_of(ragged | data::batch(3)); }),
                 "int64[1] in the batch's element 0 and int64[2] in its element 1"));
  const auto padded = all_of(ragged | data::padded_batch(3));
  REQUIRE(padded.size() == 1);
  CHECK(padded[0].shape() == shape{3, 3});
  CHECK(std::vector<std::int64_t>(padded[0].flat().begin(), padded[0].flat().end()) ==
        ints({1, 0, 0, 2, 2, 0, 3, 3, 3}));
}

TEST_CASE("ragged sparse values batch to one sparse value") {
  // Three examples' VarLenFeature values, as parse_single_example gives them.
  auto rows =
      data::range(3) | data::map([](std::int64_t n) {
        data::features f;
        data::any_sparse s{tensor<std::int64_t, 2>(shape{n, 1}), any_tensor(dtype::i64, shape{n}),
                           tensor<std::int64_t, 1>(shape{1}, n)};
        for (std::int64_t k = 0; k < n; ++k) {
          s.indices(k, 0) = k;
          s.values.data<std::int64_t>()[k] = 10 * n + k;
        }
        f.set("ids", s);
        return f;
      });
  const auto b = all_of(rows | data::batch(3));
  REQUIRE(b.size() == 1);
  const auto ids = b[0].sparse<std::int64_t>("ids");
  CHECK(std::vector<std::int64_t>(ids.dense_shape.flat().begin(), ids.dense_shape.flat().end()) ==
        ints({3, 2}));
  CHECK(std::vector<std::int64_t>(ids.indices.flat().begin(), ids.indices.flat().end()) ==
        ints({1, 0, 2, 0, 2, 1}));
  CHECK(std::vector<std::int64_t>(ids.values.flat().begin(), ids.values.flat().end()) ==
        ints({10, 20, 21}));
}

TEST_CASE("interleave follows TF's cycle and block order, parallel or not") {
  // TF: range(1, 4).interleave(lambda x: repeat(x).take(4), cycle_length=2, block_length=2)
  // gives 1 1 2 2 1 1 2 2 3 3 3 3.
  auto make = [](bool parallel) {
    return data::range(1, 4) |
           data::interleave([](std::int64_t x) { return data::range(x, x + 1) | data::repeat(4); },
                            2, 2, parallel);
  };
  const auto expected = ints({1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3});
  CHECK(all_of(make(false)) == expected);
  CHECK(all_of(make(true)) == expected);
}

TEST_CASE("TFRecord files: written and read back plain, GZIP and ZLIB, several files") {
  scratch_dir dir;
  for (auto c : {data::compression::none, data::compression::gzip, data::compression::zlib}) {
    scratch_dir sub;
    const auto files = write_record_files(sub, 3, 4, c);
    const auto records = all_of(data::tfrecord_dataset(files, c));
    REQUIRE(records.size() == 12);
    CHECK(records.front() == "0:0");
    CHECK(records.back() == "2:3");
  }
  CHECK(data::compression_from_name("GZIP") == data::compression::gzip);
  CHECK(contains(message_of<invalid_argument_error>([] { data::compression_from_name("LZ4"); }),
                 "LZ4"));
  // An empty file has no records.
  data::tfrecord_writer(dir.file("empty.tfrecord")).close();
  CHECK(all_of(data::tfrecord_dataset({dir.file("empty.tfrecord")})).empty());
}

TEST_CASE("text lines and list_files") {
  scratch_dir dir;
  loom::testing::write_text_file(dir.file("a.txt"), "one\r\ntwo\n\nthree");
  loom::testing::write_text_file(dir.file("b.txt"), "four\n");
  const auto files = data::glob_files(dir.file("*.txt"));
  REQUIRE(files.size() == 2);
  CHECK(all_of(data::text_line_dataset(files)) ==
        std::vector<std::string>{"one", "two", "", "three", "four"});

  for (int i = 0; i < 6; ++i)
    loom::testing::write_text_file(dir.file("part-" + std::to_string(i)), "");
  const auto sorted = all_of(data::list_files(dir.file("part-*"), false));
  CHECK(sorted.size() == 6);
  CHECK(std::is_sorted(sorted.begin(), sorted.end()));
  const auto shuffled = all_of(data::list_files(dir.file("part-*"), true, 5));
  CHECK(shuffled != sorted);
  CHECK(std::set<std::string>(shuffled.begin(), shuffled.end()).size() == 6);
  CHECK(all_of(data::list_files(dir.file("part-*"), true, 5)) == shuffled);

  // Files through interleave: each file's records, cycled.
  const auto record_files = write_record_files(dir, 2, 2);
  auto records = data::list_files(dir.file("f*.tfrecord"), false) |
                 data::interleave([](const std::string& f) { return data::tfrecord_dataset({f}); },
                                  2, 1, true);
  CHECK(all_of(records) == std::vector<std::string>{"0:0", "1:0", "0:1", "1:1"});
}

TEST_CASE("bad files: one clear error each") {
  scratch_dir dir;
  const auto files = write_record_files(dir, 1, 3);
  const std::string good = loom::testing::read_text_file(files[0]);
  const std::size_t record_bytes = good.size() / 3; // each "0:k" record has the same size

  SUBCASE("a data CRC that does not match names the file and the byte offset") {
    std::string bad = good;
    bad[record_bytes + tfrecord::header_bytes] ^= 1; // record 1's data
    loom::testing::write_text_file(dir.file("crc.tfrecord"), bad);
    auto it = data::tfrecord_dataset({dir.file("crc.tfrecord")}).make_iterator();
    CHECK(*it.next() == "0:0");
    const std::string msg = message_of<data::corrupt_record_error>([&] { it.next(); });
    CHECK(contains(msg, dir.file("crc.tfrecord")));
    CHECK(contains(msg, "record 1 at byte " + std::to_string(record_bytes)));
    CHECK(contains(msg, "data's CRC does not match"));
    CHECK(*it.next() == "0:2"); // reading goes on past it

    // ignore_errors skips it and counts it (and logs the file once).
    auto skipping = (data::tfrecord_dataset({dir.file("crc.tfrecord"), dir.file("crc.tfrecord")}) |
                     data::ignore_errors())
                        .make_iterator();
    std::vector<std::string> kept;
    while (auto r = skipping.next())
      kept.push_back(*r);
    CHECK(kept == std::vector<std::string>{"0:0", "0:2", "0:0", "0:2"});
    CHECK(skipping.errors_ignored() == 2);
  }
  SUBCASE("a truncated last record") {
    loom::testing::write_text_file(dir.file("cut.tfrecord"), good.substr(0, good.size() - 2));
    auto it = data::tfrecord_dataset({dir.file("cut.tfrecord")}).make_iterator();
    CHECK(*it.next() == "0:0");
    CHECK(*it.next() == "0:1");
    CHECK(contains(message_of<data::corrupt_record_error>([&] { it.next(); }),
                   "record 2 at byte " + std::to_string(2 * record_bytes) +
                       ": the file ends inside the record"));
    CHECK_FALSE(it.next());
  }
  SUBCASE("a truncated GZIP stream") {
    const auto gz = write_record_files(dir, 1, 200, data::compression::gzip);
    const std::string bytes = loom::testing::read_text_file(gz[0]);
    loom::testing::write_text_file(dir.file("cut.gz"), bytes.substr(0, bytes.size() - 10));
    CHECK(contains(message_of<data_loss_error>([&] {
                     all_of(data::tfrecord_dataset({dir.file("cut.gz")}, data::compression::gzip));
                   }),
                   "compressed stream ends early"));
  }
  SUBCASE("a file that is not there, a directory, a glob that matches nothing") {
    CHECK(contains(message_of<not_found_error>(
                       [&] { all_of(data::tfrecord_dataset({dir.file("missing.tfrecord")})); }),
                   "missing.tfrecord"));
    CHECK(contains(message_of<failed_precondition_error>(
                       [&] { all_of(data::text_line_dataset({dir.path.string()})); }),
                   "is a directory"));
    CHECK(contains(message_of<invalid_argument_error>(
                       [&] { data::list_files(dir.file("nothing-*.tfrecord")); }),
                   "no files match the pattern " + dir.file("nothing-*.tfrecord")));
    // ignore_errors passes over an unreadable file to the next one.
    auto it =
        (data::tfrecord_dataset({dir.file("missing.tfrecord"), files[0]}) | data::ignore_errors())
            .make_iterator();
    CHECK(*it.next() == "0:0");
  }
}

TEST_CASE("the threaded buffers hold no more than their bound") {
  std::atomic<int> pulled{0};
  auto counted = data::range(1000) | data::map([&pulled](std::int64_t x) {
                   ++pulled;
                   return x;
                 });
  const auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); };

  SUBCASE("prefetch(n): n elements ahead") {
    auto it = (counted | data::prefetch(3)).make_iterator();
    CHECK(*it.next() == 0);
    settle();
    CHECK(pulled.load() <= 1 + 3);
    // It does read ahead (waited for, up to 5 s, on a loaded machine).
    for (int i = 0; i < 500 && pulled.load() < 4; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK(pulled.load() == 4);
  }
  SUBCASE("map(fn, k): k results ahead") {
    auto it = (counted | data::map([](std::int64_t x) { return x; }, 4)).make_iterator();
    for (int i = 0; i < 5; ++i)
      CHECK(*it.next() == i);
    settle();
    CHECK(pulled.load() <= 5 + 4);
  }
  SUBCASE("shuffle(b): b elements") {
    auto it = (counted | data::shuffle(16, 1)).make_iterator();
    it.next();
    CHECK(pulled.load() == 16);
  }
  SUBCASE("parallel interleave: cycle_length x block_length ahead") {
    auto it = (data::range(4) |
               data::interleave([&counted](std::int64_t) { return counted; }, 2, 3, true))
                  .make_iterator();
    it.next();
    settle();
    CHECK(pulled.load() <= 1 + 2 * 3);
  }
}

TEST_CASE("cache: the first full pass is recorded, later passes read the record") {
  std::atomic<int> pulled{0};
  auto counted = data::range(5) | data::map([&pulled](std::int64_t x) {
                   ++pulled;
                   return x;
                 });
  auto in_memory = counted | data::cache();
  CHECK(all_of(in_memory | data::take(2)) == ints({0, 1})); // a partial pass records nothing
  CHECK(all_of(in_memory) == ints({0, 1, 2, 3, 4}));
  const int after_fill = pulled.load();
  CHECK(all_of(in_memory | data::repeat(2)).size() == 10);
  CHECK(pulled.load() == after_fill);

  scratch_dir dir;
  pulled = 0;
  CHECK(all_of(counted | data::cache(dir.file("cache"))) == ints({0, 1, 2, 3, 4}));
  CHECK(std::filesystem::exists(dir.file("cache")));
  // Another recipe with the file (another program, later) reads the file, not the input.
  CHECK(all_of(counted | data::cache(dir.file("cache"))) == ints({0, 1, 2, 3, 4}));
  CHECK(pulled.load() == 5);
}

TEST_CASE("an iterator's saved state resumes exactly where it was") {
  scratch_dir dir;
  const auto files = write_record_files(dir, 3, 7, data::compression::gzip);
  auto pipeline =
      data::from_tensor_slices(files) |
      data::interleave(
          [](const std::string& f) { return data::tfrecord_dataset({f}, data::compression::gzip); },
          2, 2, true) |
      data::shuffle(5, 11) | data::map([](std::string s) { return s + "!"; }, 3) | data::batch(2) |
      data::prefetch(2) | data::repeat(2);

  for (int stop_after : {0, 1, 4, 12}) {
    CAPTURE(stop_after);
    auto it = pipeline.make_iterator();
    std::size_t consumed = 0;
    for (int i = 0; i < stop_after; ++i)
      consumed += static_cast<std::size_t>(it.next()->size());
    std::stringstream saved;
    it.save(saved);
    std::vector<std::string> rest;
    while (auto b = it.next())
      for (const auto& s : b->flat())
        rest.push_back(s);

    auto resumed = pipeline.make_iterator();
    resumed.restore(saved);
    std::vector<std::string> again;
    while (auto b = resumed.next())
      for (const auto& s : b->flat())
        again.push_back(s);
    CHECK(again == rest);
    CHECK(consumed + rest.size() == 2 * 21);
  }

  // A state restores only into the recipe that wrote it.
  auto it = data::range(3).make_iterator();
  std::stringstream saved;
  it.save(saved);
  auto other = (data::range(3) | data::take(2)).make_iterator();
  CHECK(contains(message_of<invalid_argument_error>([&] { other.restore(saved); }),
                 "the saved state is a 'range' stage's where this pipeline has 'take'"));
}

TEST_CASE("any_dataset hides a pipeline's type") {
  data::any_dataset<std::int64_t> d = data::range(4) | data::map([](std::int64_t x) { return -x; });
  CHECK(all_of(d) == ints({0, -1, -2, -3}));
  auto it = d.make_iterator();
  it.next();
  std::stringstream saved;
  it.save(saved);
  auto again = d.make_iterator();
  again.restore(saved);
  CHECK(*again.next() == -1);
}

} // namespace pipeline_tests

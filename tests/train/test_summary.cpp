// Summaries and TensorBoard event files, checked without TensorBoard: the
// records are decoded here by a reader written for the test (its own bitwise
// CRC-32C, TF's mask, its own varint decoding), not by loom's, so a wrong
// polynomial, mask, byte order or field number in loom fails here. The
// summary ops run in sessions; the summary_saver_hook in a monitored session
// on an in-process cluster. tests/train/tensorboard_check.py reads the same
// kind of files with TensorBoard's own reader.
#include <loom/loom.hpp>

#include <doctest/doctest.h>
#include <support/cluster.hpp>
#include <support/messages.hpp>

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using loom::testing::contains;
using loom::testing::message_of;
namespace fs = std::filesystem;

struct temp_dir {
  fs::path path = fs::temp_directory_path() / ("loom-summary-" + std::to_string(::getpid()) + "-" +
                                               std::to_string(std::rand()));
  temp_dir() { fs::create_directories(path); }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// -- the test's own decoder ---------------------------------------------------

// CRC-32C bit by bit (reflected Castagnoli polynomial 0x82F63B78).
std::uint32_t reference_crc32c(std::string_view s) {
  std::uint32_t crc = 0xffffffffu;
  for (unsigned char c : s) {
    crc ^= c;
    for (int k = 0; k < 8; ++k)
      crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}
std::uint32_t reference_masked(std::string_view s) {
  const std::uint32_t c = reference_crc32c(s);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}
template <class U> U le(std::string_view s) {
  U v = 0;
  for (std::size_t i = 0; i < sizeof(U); ++i)
    v |= static_cast<U>(static_cast<U>(static_cast<unsigned char>(s[i])) << (8 * i));
  return v;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Every record's data; each length and CRC checked with REQUIREs.
std::vector<std::string> records_of(std::string_view bytes) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < bytes.size()) {
    REQUIRE(bytes.size() - at >= 16);
    const auto length = le<std::uint64_t>(bytes.substr(at));
    REQUIRE(le<std::uint32_t>(bytes.substr(at + 8)) == reference_masked(bytes.substr(at, 8)));
    REQUIRE(length <= bytes.size() - at - 16);
    const std::string_view data = bytes.substr(at + 12, length);
    REQUIRE(le<std::uint32_t>(bytes.substr(at + 12 + length)) == reference_masked(data));
    out.emplace_back(data);
    at += 16 + length;
  }
  return out;
}

// A message's fields by number: varints and fixed numbers as raw bits,
// length-delimited ones as bytes (repeated fields: each occurrence).
struct fields {
  std::multimap<int, std::uint64_t> numbers;
  std::multimap<int, std::string> bytes;
  std::multimap<int, int> wire_types;

  double f64(int n) const { return std::bit_cast<double>(numbers.find(n)->second); }
  float f32(int n) const {
    return std::bit_cast<float>(static_cast<std::uint32_t>(numbers.find(n)->second));
  }
  std::int64_t i64(int n) const { return static_cast<std::int64_t>(numbers.find(n)->second); }
  const std::string& str(int n) const { return bytes.find(n)->second; }
  bool has(int n) const { return wire_types.count(n) > 0; }
};

std::uint64_t varint(std::string_view& s) {
  std::uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    REQUIRE(!s.empty());
    const auto b = static_cast<unsigned char>(s.front());
    s.remove_prefix(1);
    v |= std::uint64_t{b & 0x7fu} << shift;
    if (!(b & 0x80))
      return v;
  }
}

fields decode(std::string_view s) {
  fields f;
  while (!s.empty()) {
    const std::uint64_t key = varint(s);
    const int n = static_cast<int>(key >> 3), t = static_cast<int>(key & 7);
    f.wire_types.emplace(n, t);
    if (t == 0) {
      f.numbers.emplace(n, varint(s));
    } else if (t == 1 || t == 5) {
      const std::size_t w = t == 1 ? 8 : 4;
      REQUIRE(s.size() >= w);
      f.numbers.emplace(n, t == 1 ? le<std::uint64_t>(s) : le<std::uint32_t>(s));
      s.remove_prefix(w);
    } else {
      REQUIRE(t == 2);
      const std::uint64_t len = varint(s);
      REQUIRE(len <= s.size());
      f.bytes.emplace(n, std::string(s.substr(0, len)));
      s.remove_prefix(len);
    }
  }
  return f;
}

std::vector<double> packed_doubles(const std::string& s) {
  REQUIRE(s.size() % 8 == 0);
  std::vector<double> v;
  for (std::size_t i = 0; i < s.size(); i += 8)
    v.push_back(std::bit_cast<double>(le<std::uint64_t>(std::string_view(s).substr(i))));
  return v;
}

// The Values (field 1) of a serialized Summary.
std::vector<fields> values_of(const std::string& summary) {
  std::vector<fields> out;
  const fields s = decode(summary);
  CHECK(s.wire_types.size() == s.bytes.size()); // only Values
  for (auto [it, end] = s.bytes.equal_range(1); it != end; ++it)
    out.push_back(decode(it->second));
  return out;
}

fs::path only_event_file(const fs::path& dir) {
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(dir))
    found.push_back(e.path());
  REQUIRE(found.size() == 1);
  return found.front();
}

} // namespace

TEST_CASE("CRC-32C and TF's mask agree with the published check values") {
  // RFC 3720's (iSCSI) check values, and the catalogue's "123456789".
  CHECK(loom::detail::crc32c::value("123456789") == 0xE3069283u);
  CHECK(loom::detail::crc32c::value(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(loom::detail::crc32c::value(std::string(32, '\xff')) == 0x62A8AB43u);
  CHECK(reference_crc32c("123456789") == 0xE3069283u);
  for (std::uint32_t c : {0u, 1u, 0xE3069283u, 0xffffffffu})
    CHECK(loom::tfrecord::unmask(loom::tfrecord::mask(c)) == c);
  CHECK(loom::tfrecord::masked_crc32c("loom") == reference_masked("loom"));
}

TEST_CASE("a TFRecord is the length, its masked CRC, the data and the data's masked CRC") {
  const std::string data = "an event";
  const std::string r = loom::tfrecord::frame(data);
  REQUIRE(r.size() == 8 + 4 + data.size() + 4);
  CHECK(le<std::uint64_t>(r) == data.size());
  CHECK(le<std::uint32_t>(std::string_view(r).substr(8)) ==
        reference_masked(std::string_view(r).substr(0, 8)));
  CHECK(r.substr(12, data.size()) == data);
  CHECK(le<std::uint32_t>(std::string_view(r).substr(12 + data.size())) == reference_masked(data));

  // loom's reader refuses each kind of damage, naming the record.
  CHECK(loom::tfrecord::read_all(r + r, "f") == std::vector<std::string>{data, data});
  std::string flipped = r;
  flipped[14] ^= 1;
  CHECK(contains(message_of<loom::error>([&] { loom::tfrecord::read_all(flipped, "f"); }),
                 "f: record 0 at byte 0: the data's CRC does not match"));
  flipped = r;
  flipped[0] ^= 1;
  CHECK(contains(message_of<loom::error>([&] { loom::tfrecord::read_all(flipped, "f"); }),
                 "the length's CRC does not match"));
  CHECK(
      contains(message_of<loom::error>([&] { loom::tfrecord::read_all(r + r.substr(0, 20), "f"); }),
               "f: record 1 at byte " + std::to_string(r.size())));
}

TEST_CASE("summaries are encoded with summary.proto's field numbers") {
  // Summary{value{tag: "loss" (1), simple_value: 0.5f (2)}}, bytes written out by hand.
  const std::string expected = std::string("\x0a\x0b\x0a\x04loss\x15\x00\x00\x00\x3f", 13);
  CHECK(loom::detail::summary_format::scalar_summary("loss", 0.5f) == expected);

  loom::detail::summary_format::histogram h;
  for (double v : {-2.0, 0.0, 1.0, 1.0, 3.5})
    h.add(v);
  const auto values = values_of(loom::detail::summary_format::histogram_summary("w", h));
  REQUIRE(values.size() == 1);
  CHECK(values[0].str(1) == "w");
  REQUIRE(values[0].wire_types.find(5)->second == 2);
  const fields histo = decode(values[0].str(5));
  CHECK(histo.f64(1) == -2.0);  // min
  CHECK(histo.f64(2) == 3.5);   // max
  CHECK(histo.f64(3) == 5.0);   // num
  CHECK(histo.f64(4) == 3.5);   // sum
  CHECK(histo.f64(5) == 18.25); // sum_squares
  const auto limits = packed_doubles(histo.str(6)), counts = packed_doubles(histo.str(7));
  REQUIRE(limits.size() == counts.size());
  double total = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    total += counts[i];
    if (i)
      CHECK(limits[i] > limits[i - 1]);
  }
  CHECK(total == 5.0);
  // TF's buckets: a value counts under the first limit above it. 1.0 is not
  // a limit (1e-12 * 1.1^k), so both 1s fall in one bucket whose limit is the
  // first above 1 (about 1.0 * 1.1 at most), and 0 in the bucket whose limit
  // is the first above 0.
  for (std::size_t i = 0; i < counts.size(); ++i) {
    if (limits[i] > 1.0 && limits[i] < 1.1)
      CHECK(counts[i] == 2.0);
    if (limits[i] > 0.0 && limits[i] < 1e-11)
      CHECK(counts[i] == 1.0);
  }
  // Runs of empty buckets are collapsed (TF's EncodeToProto): few buckets.
  CHECK(counts.size() < 20);
  CHECK(counts.back() == 0.0);
  CHECK(limits.back() == std::numeric_limits<double>::max());
}

TEST_CASE("a histogram counts a value under the first limit above it, at and beside each limit") {
  // The bucket is found from a logarithm, then corrected: it must be what a
  // binary search over the limits finds, for values on a limit, one ulp to
  // either side of one, and between limits, negative and positive.
  const auto& l = loom::detail::summary_format::histogram::limits();
  std::vector<double> values{0.0, -0.0, 1e-300, -1e-300, 5e-13, 1.0, -1.0, 3e25, -3e25};
  for (double limit : l)
    for (double v :
         {limit, std::nextafter(limit, -DBL_MAX), std::nextafter(limit, DBL_MAX), limit * 1.05})
      if (std::isfinite(v))
        values.push_back(v);
  for (double v : values) {
    loom::detail::summary_format::histogram h;
    h.add(v);
    const fields histo = decode(h.encode().bytes());
    const auto limits = packed_doubles(histo.str(6)), counts = packed_doubles(histo.str(7));
    const auto at = std::find(counts.begin(), counts.end(), 1.0);
    REQUIRE(at != counts.end());
    const auto first_above = std::upper_bound(l.begin(), l.end(), v);
    const double want = first_above == l.end() ? l.back() : *first_above;
    INFO("value " << v);
    CHECK(limits[static_cast<std::size_t>(at - counts.begin())] == want);
  }
}

TEST_CASE("scalar and histogram summary ops make Summaries; merge_all_summaries joins them") {
  loom::graph g;
  loom::placeholder<float, 0> loss(g, loom::shape{}, "loss");
  loom::placeholder<std::int64_t, 0> count(g, loom::shape{}, "count");
  loom::placeholder<double, 2> w(g, loom::shape{2, 3}, "w");
  std::optional<loom::output<std::string, 0>> loss_summary;
  {
    auto _ = g.name_scope("train");
    // The tag is "loss" under the scope, although a node "loss" exists.
    loss_summary = loom::scalar_summary("loss", loss);
  }
  auto count_summary = loom::scalar_summary("count", count);
  auto w_summary = loom::histogram_summary("weights", w);
  CHECK(g.collection(loom::collection::summaries).size() == 3);
  auto merged = loom::merge_all_summaries(g);
  REQUIRE(merged.has_value());

  loom::session s(g);
  const loom::feed_dict feeds{
      {loss, loom::tensor<float, 0>::from(loom::any_tensor::from_vector<float>({}, {2.25f}))},
      {count,
       loom::tensor<std::int64_t, 0>::from(loom::any_tensor::from_vector<std::int64_t>({}, {7}))},
      {w, loom::tensor<double, 2>::from(
              loom::any_tensor::from_vector<double>({2, 3}, {1, 2, 2, -1, 0.5, 0}))}};
  const auto one = values_of(s.run(*loss_summary, feeds).item());
  REQUIRE(one.size() == 1);
  CHECK(one[0].str(1) == "train/loss");
  CHECK(one[0].f32(2) == 2.25f);

  const auto all = values_of(s.run(*merged, feeds).item());
  REQUIRE(all.size() == 3);
  CHECK(all[0].str(1) == "train/loss");
  CHECK(all[1].str(1) == "count");
  CHECK(all[1].f32(2) == 7.0f); // an int64 scalar is written as a float, as TF's
  CHECK(all[2].str(1) == "weights");
  const fields histo = decode(all[2].str(5));
  CHECK(histo.f64(3) == 6.0);
  CHECK(histo.f64(1) == -1.0);
  CHECK(histo.f64(2) == 2.0);
  CHECK(histo.f64(4) == 4.5);
  (void)count_summary;
  (void)w_summary;
}

TEST_CASE("each bad summary input gets one clear error") {
  loom::graph g;
  CHECK_FALSE(loom::merge_all_summaries(g).has_value()); // TF's merge_all: None

  loom::placeholder<float, 1> x(g, loom::shape{3}, "x");
  auto h = loom::histogram_summary("x_values", x);
  loom::session s(g);
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    const loom::feed_dict feeds{
        {x, loom::tensor<float, 1>::from(loom::any_tensor::from_vector<float>({3}, {1, bad, 2}))}};
    const std::string m = message_of<loom::error>([&] { s.run(h, feeds); });
    CHECK(contains(m, std::isnan(bad) ? "NaN in summary histogram for tag 'x_values' at element 1"
                                      : "infinity in summary histogram for tag 'x_values'"));
  }
  // A scalar NaN is written as it is (TensorBoard shows it; TF writes it too).
  loom::placeholder<float, 0> y(g, loom::shape{}, "y");
  auto ys = loom::scalar_summary("y", y);
  const auto nan =
      values_of(s.run(ys, {{y, loom::tensor<float, 0>::from(loom::any_tensor::from_vector<float>(
                                   {}, {std::numeric_limits<float>::quiet_NaN()}))}})
                    .item());
  CHECK(std::isnan(nan[0].f32(2)));

  // A tag used twice fails the merge, naming it (TF's MergeSummary).
  auto again = loom::scalar_summary("y", y);
  auto merged = loom::merge_summary({ys, again});
  CHECK(contains(message_of<loom::error>([&] {
                   s.run(merged, {{y, loom::tensor<float, 0>::from(
                                          loom::any_tensor::from_vector<float>({}, {1.0f}))}});
                 }),
                 "duplicate tag 'y'"));
  CHECK(
      contains(message_of<loom::error>([&] { loom::merge_summary({}); }), "no summaries to merge"));
  // An op added by its id with a non-scalar: the shape function says what to do.
  CHECK(contains(message_of<loom::error>([&] {
                   g.add_node("scalar_summary", {x.id()}, {{"tag", std::string("x")}});
                 }),
                 "scalar_summary logs a scalar"));
}

TEST_CASE("summary_writer writes TF's file name, the file version first, then the events") {
  temp_dir dir;
  const fs::path logdir = dir.path / "made" / "by_the_writer";
  std::string path;
  {
    loom::summary_writer w(logdir.string(), {.flush_secs = 0});
    path = w.path();
    w.add_scalar("examples_per_sec", 1234.5, 7);
    w.add_summary(loom::detail::summary_format::scalar_summary("loss", 0.25f), 8);
    w.close();
    CHECK(contains(message_of<loom::error>([&] { w.add_scalar("late", 1, 9); }), "is closed"));
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string name = fs::path(path).filename().string();
  CHECK(std::regex_match(name, std::regex("events\\.out\\.tfevents\\.[0-9]{10}\\.(.*)")));
  CHECK(name.substr(name.size() - std::strlen(host)) == host);
  CHECK(fs::path(path).parent_path() == logdir);

  const auto records = records_of(file_bytes(path));
  REQUIRE(records.size() == 3);
  const fields version = decode(records[0]);
  CHECK(version.str(3) == "brain.Event:2");
  const double now = static_cast<double>(std::time(nullptr));
  CHECK(std::abs(version.f64(1) - now) < 60); // wall_time, seconds
  const fields first = decode(records[1]);
  CHECK(first.i64(2) == 7);
  const auto v = values_of(first.str(5));
  REQUIRE(v.size() == 1);
  CHECK(v[0].str(1) == "examples_per_sec");
  CHECK(v[0].f32(2) == 1234.5f);
  CHECK(decode(records[2]).i64(2) == 8);
  CHECK(values_of(decode(records[2]).str(5))[0].str(1) == "loss");

  // Two writers in one second on one host get two files.
  loom::summary_writer a(dir.path.string()), b(dir.path.string());
  CHECK(a.path() != b.path());
}

TEST_CASE("summary_writer flushes every flush_secs, and only flush() or close() without it") {
  temp_dir dir;
  {
    loom::summary_writer w((dir.path / "periodic").string(), {.flush_secs = 0.1});
    const auto before = fs::file_size(w.path());
    w.add_scalar("x", 1, 1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (fs::file_size(w.path()) == before && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(fs::file_size(w.path()) > before);
  }
  loom::summary_writer w((dir.path / "manual").string(), {.flush_secs = 0});
  const auto before = fs::file_size(w.path());
  w.add_scalar("x", 1, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(fs::file_size(w.path()) == before); // buffered
  w.flush();
  CHECK(fs::file_size(w.path()) > before);
}

TEST_CASE("summary_writer names the log directory it cannot create") {
  temp_dir dir;
  std::ofstream(dir.path / "a_file") << "not a directory";
  const std::string bad = (dir.path / "a_file" / "logs").string();
  const std::string m = message_of<loom::error>([&] { loom::summary_writer w(bad); });
  CHECK(contains(m, "summary_writer: cannot create the log directory " + bad));
  CHECK(contains(message_of<loom::error>(
                     [] { loom::summary_saver_hook h({.logdir = "x", .every_n_steps = 0}); }),
                 "give every_n_steps or every_n_secs"));
}

namespace {

// y = x . w_true, learned by gradient descent; the loss and w summarized.
struct regression {
  loom::graph g;
  std::optional<loom::variable<std::int64_t, 0>> step;
  std::optional<loom::variable<float, 1>> w;
  loom::placeholder<float, 1> target{g, loom::shape{4}, "target"};
  std::optional<loom::output<float, 0>> loss;
  std::optional<loom::operation> train;

  regression() {
    auto _ = g.device(loom::replica_device_setter({.ps_tasks = 1}));
    step = loom::create_global_step(g);
    w.emplace(g, "w", loom::shape{4}, loom::zeros_initializer{});
    loss = loom::lower(loom::reduce_sum(loom::square(*w - target)));
    train = loom::gradient_descent_optimizer{0.05}.minimize(*loss, *step);
  }
  loom::feed_dict feeds() {
    return {{target, loom::tensor<float, 1>::from(
                         loom::any_tensor::from_vector<float>({4}, {1, -2, 3, 0.5}))}};
  }
};

} // namespace

TEST_CASE("monitored_training_session's chief saves summaries every N steps with the global "
          "step") {
  loom::testing::local_cluster c(1, 1);
  temp_dir dir;
  regression m;
  loom::scalar_summary("loss", *m.loss);
  loom::histogram_summary("w", *m.w);
  std::ostringstream sink;
  loom::monitored_session_options o;
  o.master = c.worker(0).target();
  o.config.placement_log = &sink;
  o.shutdown_cluster = false;
  o.summary_dir = (dir.path / "logs").string();
  o.save_summaries_steps = 3;
  o.hooks = {std::make_shared<loom::stop_at_step_hook>(8)};
  // One worker: the global step after the k-th run is k (s.global_step() is
  // the step read with the run, which may miss the run's own update).
  std::map<std::int64_t, float> loss_at;
  std::int64_t runs = 0;
  {
    loom::monitored_training_session s(m.g, o);
    while (!s.should_stop()) {
      auto [l, t] = s.run(loom::fetches(*m.loss, *m.train), m.feeds());
      (void)t;
      loss_at[++runs] = l.item();
    }
    s.close();
  }
  const auto records = records_of(file_bytes(only_event_file(dir.path / "logs")));
  REQUIRE(records.size() >= 2);
  CHECK(decode(records[0]).str(3) == "brain.Event:2");
  const fields start = decode(records[1]); // SessionLog START at the first step
  REQUIRE(start.has(7));
  CHECK(decode(start.str(7)).numbers.find(1)->second == 1);
  CHECK(start.i64(2) == 1);
  std::vector<std::int64_t> steps;
  for (std::size_t i = 2; i < records.size(); ++i) {
    const fields e = decode(records[i]);
    REQUIRE(e.has(5));
    steps.push_back(e.i64(2));
    const auto v = values_of(e.str(5));
    REQUIRE(v.size() == 2);
    CHECK(v[0].str(1) == "loss");
    CHECK(v[0].f32(2) == loss_at.at(e.i64(2))); // the loss of that step's run
    CHECK(v[1].str(1) == "w");
    CHECK(decode(v[1].str(5)).f64(3) == 4.0);
  }
  CHECK(steps == std::vector<std::int64_t>{1, 4, 7});
}

TEST_CASE("with examples_per_global_step the chief's summaries add examples/s from the second "
          "save on, the rate since the save before") {
  loom::testing::local_cluster c(1, 1);
  temp_dir dir;
  regression m;
  loom::scalar_summary("loss", *m.loss);
  std::ostringstream sink;
  loom::monitored_session_options o;
  o.master = c.worker(0).target();
  o.config.placement_log = &sink;
  o.shutdown_cluster = false;
  o.summary_dir = (dir.path / "logs").string();
  o.save_summaries_steps = 3;
  o.examples_per_global_step = 50;
  o.hooks = {std::make_shared<loom::stop_at_step_hook>(8)};
  constexpr auto pause = std::chrono::milliseconds(20);
  {
    loom::monitored_training_session s(m.g, o);
    while (!s.should_stop()) {
      s.run(*m.train, m.feeds());
      std::this_thread::sleep_for(pause); // 3 steps between saves: at least 60 ms
    }
    s.close();
  }
  const auto records = records_of(file_bytes(only_event_file(dir.path / "logs")));
  std::map<std::int64_t, float> rate_at;
  std::vector<std::int64_t> loss_steps;
  for (std::size_t i = 2; i < records.size(); ++i) {
    const fields e = decode(records[i]);
    REQUIRE(e.has(5));
    for (const fields& v : values_of(e.str(5))) {
      if (v.str(1) == "examples/s")
        rate_at[e.i64(2)] = v.f32(2);
      else
        loss_steps.push_back(e.i64(2));
    }
  }
  CHECK(loss_steps == std::vector<std::int64_t>{1, 4, 7});
  REQUIRE(rate_at.size() == 2); // none with the first save: no save before it
  for (std::int64_t step : {4, 7}) {
    REQUIRE(rate_at.count(step) == 1);
    // 3 global steps of 50 examples in at least 3 pauses.
    CHECK(rate_at[step] > 0);
    CHECK(rate_at[step] <= 3 * 50 / (3 * std::chrono::duration<double>(pause).count()));
  }
}

TEST_CASE("no event file where the graph has no summary") {
  loom::testing::local_cluster c(1, 1);
  temp_dir dir;
  regression m;
  std::ostringstream sink;
  loom::monitored_session_options o;
  o.master = c.worker(0).target();
  o.config.placement_log = &sink;
  o.shutdown_cluster = false;
  o.summary_dir = (dir.path / "logs").string();
  o.hooks = {std::make_shared<loom::stop_at_step_hook>(2)};
  {
    loom::monitored_training_session s(m.g, o);
    while (!s.should_stop())
      s.run(*m.train, m.feeds());
    s.close();
  }
  CHECK_FALSE(fs::exists(dir.path / "logs"));
}

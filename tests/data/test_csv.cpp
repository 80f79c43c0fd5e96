// Tests for csv_dataset and decode_csv: the TSV that TensorFlow's CsvDataset parsed
// (tests/data/tf/quoted.tsv: empty fields taking defaults, quoted text with the
// delimiter, a doubled quote and a line break, "\r\n") gives TF's values, read as
// files or decoded a batch of records at a time, and every malformed record is one
// error naming the file and the line (decode_csv: the record's index).
#include <doctest/doctest.h>

#include <loom/data/pipeline.hpp>

#include <support/data_files.hpp>
#include <support/messages.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

// A namespace of their own: test_data's unity unit has helpers of the same names.
namespace pipeline_tests {

using namespace loom;
using loom::testing::contains;
using loom::testing::message_of;
using loom::testing::tf_fixture;

namespace {

std::string csv_value_text(const any_tensor& t) {
  std::string out;
  visit_dtype(t.type(), [&]<class T>() {
    const T& v = t.flat<T>()[0];
    if constexpr (std::is_same_v<T, std::string>) {
      for (unsigned char c : v) {
        char buf[3];
        std::snprintf(buf, sizeof(buf), "%02x", c);
        out += buf;
      }
      if (out.empty())
        out = "-";
    } else if constexpr (std::is_same_v<T, float>) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(v));
      out = buf;
    } else {
      out = std::to_string(v);
    }
  });
  return out;
}

std::vector<data::csv_column> fixture_columns() {
  return {data::csv_default<std::int64_t>(-1), data::csv_default<std::int32_t>(0),
          data::csv_default<float>(9.5f), data::csv_default<std::string>("none")};
}

// The rows of parsed_tsv.txt's form ("row" and each value) from decoded columns.
std::vector<std::string> rows_text(const std::vector<any_tensor>& columns) {
  std::vector<std::string> rows;
  for (std::int64_t i = 0; i < columns.at(0).num_elements(); ++i) {
    std::string row = "row";
    for (const any_tensor& c : columns)
      visit_dtype(c.type(), [&]<class T>() {
        row += " " + csv_value_text(any_tensor::scalar(c.flat<T>()[i]));
      });
    rows.push_back(row);
  }
  return rows;
}

std::vector<std::vector<any_tensor>> rows_of(const data::csv_dataset& d) {
  std::vector<std::vector<any_tensor>> rows;
  for (auto& r : d)
    rows.push_back(r);
  return rows;
}

} // namespace

TEST_CASE("a TSV parses to what TF's CsvDataset parsed from it") {
  const auto rows = rows_of(data::csv_dataset({tf_fixture("quoted.tsv")}, fixture_columns(),
                                              {.header = true, .field_delim = '\t'}));
  std::ifstream expected(tf_fixture("parsed_tsv.txt"));
  REQUIRE(expected);
  std::size_t i = 0;
  for (std::string line; std::getline(expected, line); ++i) {
    CAPTURE(line);
    REQUIRE(i < rows.size());
    std::string got = "row";
    for (const auto& v : rows[i])
      got += " " + csv_value_text(v);
    CHECK(got == line);
  }
  CHECK(i == rows.size());
  CHECK(rows[0][0].type() == dtype::i64);
  CHECK(rows[0][1].type() == dtype::i32);

  // Batched, column by column.
  auto batched = data::csv_dataset({tf_fixture("quoted.tsv")}, fixture_columns(),
                                   {.header = true, .field_delim = '\t'}) |
                 data::batch(5);
  for (auto& b : batched) {
    REQUIRE(b.size() == 4);
    CHECK(b[2].shape() == shape{5});
    CHECK(b[3].flat<std::string>()[3] == "two\nlines");
  }
}

TEST_CASE("CSV options: select_cols, na_value, quotes off") {
  loom::testing::scratch_dir dir;
  loom::testing::write_text_file(dir.file("a.csv"), "1,x,NA,4\n5,\"y\",7,8\n");
  const auto rows = rows_of(
      data::csv_dataset({dir.file("a.csv")},
                        {data::csv_required<std::int64_t>(), data::csv_default<std::int64_t>(-1)},
                        {.na_value = "NA", .select_cols = {0, 2}}));
  REQUIRE(rows.size() == 2);
  CHECK(rows[0][1].flat<std::int64_t>()[0] == -1);
  CHECK(rows[1][1].flat<std::int64_t>()[0] == 7);

  loom::testing::write_text_file(dir.file("q.csv"), "\"a\"\"\n");
  const auto raw = rows_of(data::csv_dataset(
      {dir.file("q.csv")}, {data::csv_required<std::string>()}, {.use_quote_delim = false}));
  CHECK(raw.at(0)[0].flat<std::string>()[0] == "\"a\"\"");
}

TEST_CASE("a malformed CSV record: one error naming the file and the line") {
  loom::testing::scratch_dir dir;
  const auto error_of = [&](const std::string& text, std::vector<data::csv_column> columns) {
    loom::testing::write_text_file(dir.file("bad.tsv"), text);
    return message_of<data::corrupt_record_error>([&] {
      rows_of(data::csv_dataset({dir.file("bad.tsv")}, std::move(columns), {.field_delim = '\t'}));
    });
  };
  const auto two = [] {
    return std::vector{data::csv_default<std::int64_t>(0), data::csv_default<std::int64_t>(0)};
  };
  const std::string where = dir.file("bad.tsv") + ": line ";

  CHECK(contains(error_of("1\t2\n3\t4\t5\n", two()),
                 where + "2: expected 2 fields, the record has 3"));
  CHECK(contains(error_of("1\t\"multi\nline\"\n3\n",
                          {data::csv_default<std::int64_t>(0), data::csv_default<std::string>("")}),
                 where + "3: expected 2 fields, the record has 1"));
  CHECK(
      contains(error_of("1\t\n", {data::csv_default<std::int64_t>(0), data::csv_required<float>()}),
               where + "1: field 1 is empty and its column has no default"));
  CHECK(contains(error_of("1\tx\n", two()), where + "1: field 1 is \"x\", not a valid int64"));
  CHECK(contains(error_of("1\t\"open\n", two()), "the file ends inside a quoted field"));
  CHECK(contains(error_of("1\tun\"quoted\n", two()), "an unquoted field holds a quote"));
  CHECK(contains(error_of("1\t\"a\"b\n", two()), "a quoted field must end at a delimiter"));

  // A bad record is consumed: ignore_errors goes on to the next.
  loom::testing::write_text_file(dir.file("mixed.tsv"), "1\t2\nbad\n3\t4\n");
  auto it = (data::csv_dataset({dir.file("mixed.tsv")}, two(), {.field_delim = '\t'}) |
             data::ignore_errors())
                .make_iterator();
  CHECK((*it.next())[0].flat<std::int64_t>()[0] == 1);
  CHECK((*it.next())[0].flat<std::int64_t>()[0] == 3);
  CHECK_FALSE(it.next());
  CHECK(it.errors_ignored() == 1);
}

TEST_CASE("decode_csv: a batch of records decodes to TF's values, one tensor per column") {
  // quoted.tsv's records after its header: a record ends at a line break outside quotes.
  std::ifstream file(tf_fixture("quoted.tsv"), std::ios::binary);
  REQUIRE(file);
  const std::string text{std::istreambuf_iterator<char>(file), {}};
  std::vector<std::string> records;
  std::string record;
  bool quoted = false;
  for (char c : text.substr(text.find('\n') + 1)) {
    if (c == '\n' && !quoted) {
      records.push_back(std::exchange(record, {}));
      continue;
    }
    quoted ^= c == '"';
    record += c;
  }
  REQUIRE(records.size() == 5);
  const tensor<std::string, 1> batch(shape{5}, records);
  const auto columns = data::decode_csv(batch, fixture_columns(), {.field_delim = '\t'});
  REQUIRE(columns.size() == 4);
  CHECK(columns[0].type() == dtype::i64);
  CHECK(columns[1].type() == dtype::i32);
  CHECK(columns[2].shape() == shape{5});

  std::ifstream expected(tf_fixture("parsed_tsv.txt"));
  REQUIRE(expected);
  std::vector<std::string> want;
  for (std::string line; std::getline(expected, line);)
    want.push_back(line);
  CHECK(rows_text(columns) == want);

  // csv_dataset's rows batched: the same values.
  auto batched = data::csv_dataset({tf_fixture("quoted.tsv")}, fixture_columns(),
                                   {.header = true, .field_delim = '\t'}) |
                 data::batch(5);
  CHECK(rows_text(*batched.make_iterator().next()) == want);

  // An empty batch: empty columns.
  const auto none = data::decode_csv(tensor<std::string, 1>(shape{0}), fixture_columns());
  REQUIRE(none.size() == 4);
  CHECK(none[3].shape() == shape{0});
}

TEST_CASE("decode_csv: a malformed record is one error naming its index in the batch") {
  const auto two = [] {
    return std::vector{data::csv_default<std::int64_t>(0), data::csv_required<std::int64_t>()};
  };
  const auto error_of = [&](std::vector<std::string> records, data::csv_options options = {}) {
    const auto n = static_cast<std::int64_t>(records.size());
    return message_of<invalid_argument_error>(
        [&] { data::decode_csv(tensor<std::string, 1>(shape{n}, records), two(), options); });
  };
  CHECK(contains(error_of({"1,2", "1,2,3"}), "decode_csv: record 1: expected 2 fields, the "
                                             "record has 3"));
  CHECK(contains(error_of({"1,"}), "decode_csv: record 0: field 1 is empty and its column has "
                                   "no default"));
  CHECK(contains(error_of({"1,2", ",2", "x,2"}), "record 2: field 0 is \"x\", not a valid int64"));
  CHECK(contains(error_of({"1,\"2"}), "record 0: it ends inside a quoted field"));
  CHECK(contains(error_of({"1,2\""}), "record 0: an unquoted field holds a quote"));
  CHECK(contains(error_of({"1,2"}, {.header = true}),
                 "decode_csv: header and file_compression are options of the files"));
  CHECK(contains(error_of({"1,2"}, {.select_cols = {1}}), "decode_csv: 1 select_cols for 2 "
                                                          "columns"));
  // Quotes off: a quote is text; na_value: a field equal to it takes the default.
  const auto raw = data::decode_csv(
      tensor<std::string, 1>(shape{2}, std::vector<std::string>{"\"a\",NA", "b,7"}),
      {data::csv_required<std::string>(), data::csv_default<std::int64_t>(-1)},
      {.use_quote_delim = false, .na_value = "NA"});
  CHECK(raw[0].flat<std::string>()[0] == "\"a\"");
  CHECK(raw[1].flat<std::int64_t>()[0] == -1);
  CHECK(raw[1].flat<std::int64_t>()[1] == 7);
}

TEST_CASE("decode_csv: fields at every offset of the 8-byte words the splitter scans") {
  // Records without quotes are split a word at a time: fields of 0 to 19 bytes put
  // each delimiter at every offset of a word and across words, with bytes >= 0x80
  // beside it and a "\r" before the record's end.
  for (const char delim : {',', '\t', '\xfe'}) {
    for (const bool quotes : {false, true}) {
      std::vector<std::string> records, fields;
      for (int first = 0; first < 20; ++first) {
        std::string record;
        for (int f = 0; f < 6; ++f) {
          std::string field;
          for (int k = 0; k < (first + 7 * f) % 20; ++k)
            field += static_cast<char>(k % 3 == 2 ? '\x80' + k : 'a' + (k + f) % 26);
          fields.push_back(field);
          record += (f ? std::string(1, delim) : std::string()) + field;
        }
        records.push_back(record + (first % 2 ? "\r" : ""));
      }
      std::vector<data::csv_column> columns(6, data::csv_default<std::string>("-"));
      const auto n = static_cast<std::int64_t>(records.size());
      const auto out = data::decode_csv(tensor<std::string, 1>(shape{n}, records), columns,
                                        {.field_delim = delim, .use_quote_delim = quotes});
      for (std::int64_t r = 0; r < n; ++r)
        for (std::size_t f = 0; f < 6; ++f) {
          const std::string& want = fields[static_cast<std::size_t>(r) * 6 + f];
          CHECK(out[f].flat<std::string>()[r] == (want.empty() ? "-" : want));
        }
    }
  }
}

TEST_CASE("csv_hash_bucket: a string column hashed as string_to_hash_bucket_fast hashes it") {
  const std::vector<std::string> records{"00a1\t7", "\t8", "ffff0000\t9"};
  const tensor<std::string, 1> batch(shape{3}, records);
  const auto strings = data::decode_csv(
      batch, {data::csv_default<std::string>("none"), data::csv_required<std::int64_t>()},
      {.field_delim = '\t'});
  const auto hashed = data::decode_csv(
      batch, {data::csv_hash_bucket(1000, "none"), data::csv_required<std::int64_t>()},
      {.field_delim = '\t'});
  CHECK(hashed[0].type() == dtype::i64);
  CHECK(hashed[0].shape() == shape{3});
  const any_tensor want = string_to_hash_bucket_fast(strings[0], 1000);
  for (std::int64_t i = 0; i < 3; ++i)
    CHECK(hashed[0].flat<std::int64_t>()[i] == want.flat<std::int64_t>()[i]);
  CHECK(hashed[0].flat<std::int64_t>()[1] == string_to_hash_bucket_fast("none", 1000));
  // csv_dataset's rows decode the same.
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("loom_hashed_" + std::to_string(::getpid()) + ".tsv"))
                               .string();
  {
    std::ofstream out(path);
    for (const auto& r : records)
      out << r << "\n";
  }
  auto rows = data::csv_dataset(
                  {path}, {data::csv_hash_bucket(1000, "none"), data::csv_required<std::int64_t>()},
                  {.field_delim = '\t'}) |
              data::batch(3);
  const auto batched = *rows.make_iterator().next();
  std::filesystem::remove(path);
  for (std::int64_t i = 0; i < 3; ++i)
    CHECK(batched[0].flat<std::int64_t>()[i] == want.flat<std::int64_t>()[i]);
  // A missing field without a default, a bad bucket count, a default of another type.
  CHECK(contains(message_of<invalid_argument_error>([&] {
                   data::decode_csv(batch,
                                    {data::csv_hash_bucket(10, std::nullopt),
                                     data::csv_required<std::int64_t>()},
                                    {.field_delim = '\t'});
                 }),
                 "record 1: field 0 is empty and its column has no default"));
  CHECK(contains(message_of<invalid_argument_error>([&] {
                   data::decode_csv(batch,
                                    {data::csv_hash_bucket(-3), data::csv_required<std::int64_t>()},
                                    {.field_delim = '\t'});
                 }),
                 "a column hashed into -3 buckets of int64"));
  data::csv_column wrong = data::csv_hash_bucket(10);
  wrong.default_value = any_tensor::scalar<std::int64_t>(0);
  CHECK(contains(
      message_of<invalid_argument_error>([&] {
        data::decode_csv(batch, {wrong, data::csv_required<std::int64_t>()}, {.field_delim = '\t'});
      }),
      "a column of int64 hashed from strings has the default"));
}

} // namespace pipeline_tests

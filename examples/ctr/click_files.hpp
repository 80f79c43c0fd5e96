// examples/ctr's click logs as files a TensorFlow user has, and the input pipelines
// that train from them (loom::data, read in the step through an iterator):
//
//   TFRecord of tf.Example, Criteo's feature names: "label" (float), "I1".."I13" (the
//   dense features, float), "C1".."C22" (a single-hot field's id, int64), "C23".."C26"
//   (a multi-hot field's 1 to 5 ids, int64 lists: VarLenFeatures). The same ids as in
//   memory, so a run from these files trains on what a run from memory does.
//
//   TSV in Criteo's layout: the label (0/1), 13 integer columns (a dense feature times
//   1000, rounded; empty where that is 0, which the column's default 0 restores), 26
//   categorical columns of hex strings (a multi-hot field's ids joined by ','). As TF's
//   categorical_column_with_hash_bucket does, the reader hashes each string to one of
//   the field's vocabulary-size buckets (string_to_hash_bucket_fast), so ids collide as
//   they do in TF's models of Criteo.
//
// File k of a format holds train stream k + 1 (worker k's, click_data.hpp), so
// shard(num_workers, task_index) over the sorted files gives each worker its stream.
#pragma once

#include "click_data.hpp"
#include "wide_deep.hpp"

#include <loom/core/fingerprint.hpp>
#include <loom/data/pipeline.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace ctr {

namespace data = loom::data;

// What a file pipeline gives a step: single-hot ids [batch, num_single_hot], the
// multi-hot fields' ids, the dense features [batch, num_dense], the labels [batch, 1].
using file_batch =
    std::tuple<loom::tensor<std::int64_t, 2>, data::sparse_value<std::int64_t>,
               data::sparse_value<std::int64_t>, data::sparse_value<std::int64_t>,
               data::sparse_value<std::int64_t>, loom::tensor<float, 2>, loom::tensor<float, 2>>;
static_assert(num_multi_hot == 4, "file_batch has a sparse value per multi-hot field");

inline std::string feature_name(char kind, int i) { // Criteo's: I1..I13, C1..C26
  return std::string(1, kind) + std::to_string(i + 1);
}

inline std::vector<std::int64_t> multi_hot_ids(const example& e, int k) {
  std::vector<std::int64_t> ids;
  for (std::int32_t id : e.multi_ids[static_cast<std::size_t>(k)])
    if (id >= 0)
      ids.push_back(id);
  return ids;
}

inline void write_tfrecord(const std::string& path, generator& gen, std::int64_t n) {
  data::tfrecord_writer out(path);
  for (std::int64_t i = 0; i < n; ++i) {
    const example e = gen.next();
    data::example_builder b;
    b.add_float("label", {e.label});
    for (int d = 0; d < num_dense; ++d)
      b.add_float(feature_name('I', d), {e.dense[static_cast<std::size_t>(d)]});
    for (int f = 0; f < num_single_hot; ++f)
      b.add_int64(feature_name('C', f), {e.ids[static_cast<std::size_t>(f)]});
    for (int k = 0; k < num_multi_hot; ++k)
      b.add_int64(feature_name('C', num_single_hot + k), multi_hot_ids(e, k));
    out.write(b.serialize());
  }
  out.close();
}

inline void write_tsv(const std::string& path, generator& gen, std::int64_t n) {
  std::ofstream out(path);
  if (!out)
    throw std::runtime_error("cannot write " + path);
  std::string line;
  char hex[16];
  for (std::int64_t i = 0; i < n; ++i) {
    const example e = gen.next();
    line = e.label > 0.5f ? "1" : "0";
    for (float x : e.dense) {
      line += '\t';
      if (const long long v = std::llround(x * 1000.0f); v != 0)
        line += std::to_string(v);
    }
    for (int f = 0; f < num_fields; ++f) {
      line += '\t';
      if (f < num_single_hot) {
        std::snprintf(hex, sizeof hex, "%08x",
                      static_cast<unsigned>(e.ids[static_cast<std::size_t>(f)]));
        line += hex;
        continue;
      }
      const auto ids = multi_hot_ids(e, f - num_single_hot);
      for (std::size_t j = 0; j < ids.size(); ++j) {
        std::snprintf(hex, sizeof hex, "%s%08x", j ? "," : "", static_cast<unsigned>(ids[j]));
        line += hex;
      }
    }
    line += '\n';
    out << line;
  }
  if (!out)
    throw std::runtime_error("writing " + path + " failed");
}

namespace detail {

// A [batch, columns] tensor from `columns` tensors of `batch` values each.
template <class T, class Column>
loom::tensor<T, 2> columns_to_matrix(std::int64_t batch, int columns, Column column) {
  loom::tensor<T, 2> m(loom::shape{batch, columns});
  T* out = m.data();
  for (int c = 0; c < columns; ++c) {
    const auto values = column(c); // a callable: i -> the value of row i
    for (std::int64_t i = 0; i < batch; ++i)
      out[i * columns + c] = values(i);
  }
  return m;
}

// tf.Example records to a file_batch.
class parse_tfrecord_batch {
public:
  parse_tfrecord_batch() : parse_(spec()) {}
  file_batch operator()(const loom::tensor<std::string, 1>& records) const {
    const data::features f = parse_(records);
    const std::int64_t n = records.dim(0);
    // Each column is [n, 1]: value i is element i.
    auto ids = columns_to_matrix<std::int64_t>(n, num_single_hot, [&](int c) {
      return [t = f.dense<std::int64_t, 2>(feature_name('C', c))](std::int64_t i) {
        return t.data()[i];
      };
    });
    auto dense = columns_to_matrix<float>(n, num_dense, [&](int c) {
      return [t = f.dense<float, 2>(feature_name('I', c))](std::int64_t i) { return t.data()[i]; };
    });
    auto multi = [&](int k) {
      return f.sparse<std::int64_t>(feature_name('C', num_single_hot + k));
    };
    return {std::move(ids),
            multi(0),
            multi(1),
            multi(2),
            multi(3),
            std::move(dense),
            f.dense<float, 2>("label")};
  }

private:
  static data::example_spec spec() {
    data::example_spec s;
    s.fixed_len("label", loom::dtype::f32, loom::shape{1});
    for (int d = 0; d < num_dense; ++d)
      s.fixed_len<float>(feature_name('I', d), loom::shape{1}, {0.0f});
    for (int f = 0; f < num_single_hot; ++f)
      s.fixed_len(feature_name('C', f), loom::dtype::i64, loom::shape{1});
    for (int k = 0; k < num_multi_hot; ++k)
      s.var_len(feature_name('C', num_single_hot + k), loom::dtype::i64);
    return s;
  }
  data::example_parser parse_;
};

// Criteo TSV lines to a file_batch: decoded a batch at a time (decode_csv, TF's
// vectorized CSV parsing), the hex strings hashed (the single-hot ones as they are
// decoded, csv_hash_bucket).
class parse_tsv_batch {
public:
  explicit parse_tsv_batch(std::vector<std::int64_t> vocab)
      : vocab_(std::move(vocab)), columns_(tsv_columns(vocab_)) {}
  file_batch operator()(const loom::tensor<std::string, 1>& lines) const {
    const std::vector<loom::any_tensor> columns =
        data::decode_csv(lines, columns_, {.field_delim = '\t', .use_quote_delim = false});
    const std::int64_t n = columns[0].num_elements();
    loom::tensor<float, 2> label(loom::shape{n, 1});
    for (std::int64_t i = 0; i < n; ++i)
      label(i, 0) = static_cast<float>(columns[0].data<std::int64_t>()[i]);
    auto dense = columns_to_matrix<float>(n, num_dense, [&](int c) {
      return [v = columns[static_cast<std::size_t>(1 + c)].data<std::int64_t>()](std::int64_t i) {
        return static_cast<float>(v[i]) / 1000.0f;
      };
    });
    auto ids = columns_to_matrix<std::int64_t>(n, num_single_hot, [&](int f) {
      return [v = columns[static_cast<std::size_t>(1 + num_dense + f)].data<std::int64_t>()](
                 std::int64_t i) { return v[i]; };
    });
    auto multi = [&](int k) {
      const int f = num_single_hot + k;
      const std::string* v =
          columns[static_cast<std::size_t>(1 + num_dense + f)].data<std::string>();
      const std::int64_t buckets = vocab_[static_cast<std::size_t>(f)];
      std::vector<std::int64_t> at, values;
      at.reserve(static_cast<std::size_t>(2 * max_ids_per_field * n)); // the most written
      values.reserve(static_cast<std::size_t>(max_ids_per_field * n));
      std::int64_t longest = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const std::string_view list = v[i];
        std::int64_t j = 0;
        for (std::size_t begin = 0; begin < list.size(); ++j) {
          const std::size_t end = std::min(list.find(',', begin), list.size());
          at.push_back(i);
          at.push_back(j);
          values.push_back(
              loom::string_to_hash_bucket_fast(list.substr(begin, end - begin), buckets));
          begin = end + 1;
        }
        longest = std::max(longest, j);
      }
      const auto nnz = static_cast<std::int64_t>(values.size());
      return data::sparse_value<std::int64_t>{
          loom::tensor<std::int64_t, 2>(loom::shape{nnz, 2}, std::move(at)),
          loom::tensor<std::int64_t, 1>(loom::shape{nnz}, std::move(values)),
          loom::tensor<std::int64_t, 1>(loom::shape{2}, {n, longest})};
    };
    return {std::move(ids), multi(0),         multi(1),        multi(2),
            multi(3),       std::move(dense), std::move(label)};
  }

  // The label, the integer columns, the single-hot fields hashed as they are decoded
  // (the bucket of "" where empty) and the multi-hot fields' lists as strings.
  static std::vector<data::csv_column> tsv_columns(const std::vector<std::int64_t>& vocab) {
    std::vector<data::csv_column> c{data::csv_required<std::int64_t>()};
    for (int d = 0; d < num_dense; ++d)
      c.push_back(data::csv_default<std::int64_t>(0));
    for (int f = 0; f < num_fields; ++f)
      c.push_back(f < num_single_hot ? data::csv_hash_bucket(vocab[static_cast<std::size_t>(f)])
                                     : data::csv_default<std::string>(""));
    return c;
  }

private:
  std::vector<std::int64_t> vocab_;
  std::vector<data::csv_column> columns_;
};

} // namespace detail

// The batches of the files `pattern` matches ("tfrecord" or "tsv"), this worker's
// shard of them (TF's shard semantics over the sorted names), parsed on `threads`
// threads, two batches read ahead. One pass: the end of the files ends training.
// The files are read on the parsing threads (a sequential interleave: the batch is read
// by whichever parsing thread takes it), not by threads of their own: from local files
// a record is a copy out of a read buffer, and handing each record between threads cost
// more than reading it (examples/s from TFRecord files 8 % lower on 2 cores).
inline data::any_dataset<file_batch>
file_batches(const std::string& pattern, const std::string& format, std::int64_t num_workers,
             std::int64_t task, std::int64_t batch_size, int threads,
             const std::vector<std::int64_t>& vocab, bool drop_remainder = true) {
  auto files = data::list_files(pattern, /*shuffle=*/false) | data::shard(num_workers, task);
  if (format == "tfrecord")
    return files |
           data::interleave([](const std::string& f) { return data::tfrecord_dataset({f}); }, 2, 1,
                            /*parallel=*/false) |
           data::batch(batch_size, drop_remainder) |
           data::map(detail::parse_tfrecord_batch{}, threads) | data::prefetch(2);
  if (format == "tsv")
    return files |
           data::interleave([](const std::string& f) { return data::text_line_dataset({f}); }, 2, 1,
                            /*parallel=*/false) |
           data::batch(batch_size, drop_remainder) |
           data::map(detail::parse_tsv_batch{vocab}, threads) | data::prefetch(2);
  throw std::invalid_argument("--format=" + format + ": tfrecord or tsv");
}

// What get_next gives for a file_batch, and the model's inputs made of it: each
// single-hot field's column of the ids, the dense features and labels with their
// static widths.
using file_batch_handles = loom::dataset_iterator<file_batch>::handles;

inline model_inputs inputs_of(const file_batch_handles& in) {
  model_inputs m{{},
                 {std::get<1>(in), std::get<2>(in), std::get<3>(in), std::get<4>(in)},
                 loom::reshape(std::get<5>(in), {-1, num_dense}),
                 loom::reshape(std::get<6>(in), {-1, 1})};
  loom::graph g = std::get<0>(in).graph();
  for (std::int64_t f = 0; f < num_single_hot; ++f)
    m.ids.push_back(loom::gather(
        std::get<0>(in), loom::output<std::int64_t, 0>(g, loom::detail::scalar_node(g, f)), 1));
  return m;
}

} // namespace ctr

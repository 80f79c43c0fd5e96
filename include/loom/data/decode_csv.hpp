// decode_csv(records, columns, options) (TF's tf.io.decode_csv): a batch of CSV or
// TSV records (lines, as text_line_dataset reads them and batch() stacks them) to
// one tensor per column, of one value per record: csv_dataset's parser
// (csv_record.hpp, TF's semantics) without a tensor per field.
//
// TF's vectorized form of a CSV pipeline: text_line_dataset(files) | batch(n) |
// map(a function calling decode_csv), rather than csv_dataset(files) | batch(n),
// which makes each record's values one scalar tensor each and then stacks them.
// Errors name the record's index in the batch (the batch knows no file or line).
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/data/csv_record.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace loom::data {

// A tensor of records.dim(0) values per column, typed as the column says. options'
// header and file_compression are the files' and must be left unset.
LOOM_COMPILED_ONCE std::vector<any_tensor> decode_csv(const tensor<std::string, 1>& records,
                                                      std::vector<csv_column> columns,
                                                      const csv_options& options = {});

} // namespace loom::data

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::data {

LOOM_COMPILED_ONCE std::vector<any_tensor> decode_csv(const tensor<std::string, 1>& records,
                                                      std::vector<csv_column> columns,
                                                      const csv_options& options) {
  if (options.header || options.file_compression != compression::none)
    throw invalid_argument_error("decode_csv: header and file_compression are options of the "
                                 "files (csv_dataset), not of records already read");
  const detail::csv_decoder decoder(std::move(columns), options, "decode_csv");
  detail::csv_splitter splitter(options.field_delim, options.use_quote_delim);
  const std::int64_t n = records.dim(0);
  std::vector<any_tensor> out = decoder.make_columns(n);
  std::vector<void*> outputs;
  decoder.outputs(out, outputs);
  const std::string* record = records.data();
  for (std::int64_t r = 0; r < n; ++r) {
    std::string why;
    switch (splitter.split(record[r])) {
    case detail::csv_splitter::result::ok:
      why = decoder.decode(splitter.fields(), outputs, r);
      break;
    case detail::csv_splitter::result::open_quote: why = "it ends inside a quoted field"; break;
    case detail::csv_splitter::result::malformed: why = splitter.error(); break;
    }
    if (!why.empty())
      throw invalid_argument_error("decode_csv: record " + std::to_string(r) + ": " + why);
  }
  return out;
}

} // namespace loom::data

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// libFuzzer target for tf.Example parsing (include/loom/data/example.hpp): the bytes of a
// TFRecord file's record, untrusted as any file a user points a pipeline at, parsed as the
// pipeline parses them: parse_example over a batch (the input twice, so that the second
// example runs on what the first left: the learned feature order, the columns seen) and
// parse_single_example. Both the encoding TF writes, which the parser reads directly, and
// every other the wire format allows, which it reads with protobuf::reader, are reached.
//
// The spec is that of the TF-written fixtures (benchmarks/tf/write_data_fixtures.py): a
// feature of each kind, fixed and variable length, one with a default. Every input must
// parse or throw a loom::error; anything else (a crash, another exception, an allocation
// over -malloc_limit_mb, an ASan or UBSan report) is a bug. Corpus:
// fuzz/corpus/example_parse_fuzz, the records of tests/data/tf/*.tfrecord
// (fuzz/example_corpus.py).
#include <loom/core/error.hpp>
#include <loom/data/example.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace {

const loom::data::example_spec& spec() {
  static const loom::data::example_spec s = [] {
    using loom::dtype;
    using loom::shape;
    loom::data::example_spec spec;
    spec.fixed_len("label", dtype::i64, shape{1})
        .fixed_len("ints", dtype::i64, shape{3})
        .fixed_len("score", dtype::f32, shape{2})
        .fixed_len("name", dtype::string, shape{})
        .fixed_len<std::int64_t>("opt", shape{1}, {-1})
        .var_len("tags", dtype::string)
        .var_len("ids", dtype::i64)
        .var_len("weights", dtype::f32);
    return spec;
  }();
  return s;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string record(reinterpret_cast<const char*>(data), size);
  try {
    (void)loom::data::parse_example(spec(), std::vector<std::string>{record, record});
  } catch (const loom::error&) {
  }
  try {
    (void)loom::data::parse_single_example(spec(), record);
  } catch (const loom::error&) {
  }
  return 0;
}

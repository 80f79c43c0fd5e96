// tf.Example parse throughput on the ctr schema (issue #45): label, 13 int64 features
// and 26 bytes features (Criteo's hex categories, some missing) hashed to buckets, read
// from TFRecord files as
//
//   loom:        tfrecord_dataset(files) | batch(b) | map(parse + hash, threads)
//   TensorFlow:  TFRecordDataset(files).batch(b).map(parse_example + to_hash_bucket_fast)
//
// on 1 and 2 threads, over the same files in the same run; records/s is the median of
// three passes after a warm-up pass. TensorFlow runs from a virtual environment the
// benchmark makes (build/tf-venv, PyPI's tensorflow-cpu 2.15.1, as benchmarks/sparse_step
// does) or from --python; never in `make test`. The goal: loom >= 2x tf.data's records/s.
//
//   input_pipeline [--records N] [--batch B] [--python PATH] [--no_tf] [--smoke]
#include "../bench_util.hpp"

#include <loom/data/pipeline.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace data = loom::data;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t buckets = 1 << 20;

// Files of ctr-schema Examples; about 1 in 10 optional features is missing, as in Criteo.
std::vector<std::string> write_files(const fs::path& dir, std::int64_t records, int files) {
  std::mt19937_64 rng(42);
  std::vector<std::string> names;
  for (int f = 0; f < files; ++f) {
    names.push_back((dir / ("ctr-" + std::to_string(f) + ".tfrecord")).string());
    data::tfrecord_writer w(names.back());
    for (std::int64_t r = f; r < records; r += files) {
      data::example_builder e;
      e.add_int64("label", {static_cast<std::int64_t>(rng() % 4 == 0)});
      for (int i = 1; i <= 13; ++i)
        if (rng() % 10 != 0)
          e.add_int64("I" + std::to_string(i), {static_cast<std::int64_t>(rng() % 1000)});
      for (int i = 1; i <= 26; ++i)
        if (rng() % 10 != 0) {
          char hex[9];
          std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(rng() % 100000));
          e.add_bytes("C" + std::to_string(i), {hex});
        }
      w.write(e.serialize());
    }
    w.close();
  }
  return names;
}

data::example_spec ctr_spec() {
  data::example_spec spec;
  spec.fixed_len("label", loom::dtype::i64, loom::shape{1});
  for (int i = 1; i <= 13; ++i)
    spec.fixed_len<std::int64_t>("I" + std::to_string(i), loom::shape{1}, {0});
  for (int i = 1; i <= 26; ++i)
    spec.fixed_len<std::string>("C" + std::to_string(i), loom::shape{1}, {""});
  return spec;
}

// Parses a batch and hashes its 26 categorical features, as the TF side does.
struct parse_and_hash {
  data::example_parser parse;
  data::features operator()(const loom::tensor<std::string, 1>& records) const {
    data::features f = parse(records);
    for (int i = 1; i <= 26; ++i) {
      const std::string name = "C" + std::to_string(i);
      f.set(name, loom::string_to_hash_bucket_fast(f.dense_value(name), buckets));
    }
    return f;
  }
};

double loom_records_per_second(const std::vector<std::string>& files, std::int64_t batch,
                               int threads, int passes) {
  auto pipeline = data::tfrecord_dataset(files) | data::batch(batch) |
                  data::map(parse_and_hash{data::example_parser(ctr_spec())}, threads);
  std::vector<double> rates;
  for (int pass = 0; pass <= passes; ++pass) { // the first pass warms up
    std::int64_t n = 0;
    const auto start = std::chrono::steady_clock::now();
    for (auto& f : pipeline)
      n += f.dense_value("label").shape()[0];
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (pass > 0)
      rates.push_back(static_cast<double>(n) / s);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

std::string tensorflow_python(const std::string& given) {
  using loom::bench::shell_quote;
  if (!given.empty())
    return given;
  const fs::path venv = fs::path(LOOM_BUILD_DIR) / "tf-venv";
  const std::string python = (venv / "bin" / "python").string();
  if (loom::bench::run_command(shell_quote(python) + " -c 'import tensorflow'").status != 0) {
    std::printf("installing tensorflow-cpu 2.15.1 from PyPI into %s ...\n", venv.string().c_str());
    std::fflush(stdout);
    const auto r = loom::bench::run_command("python3 -m venv " + shell_quote(venv.string()) +
                                            " && " + shell_quote((venv / "bin" / "pip").string()) +
                                            " install -q tensorflow-cpu==2.15.1");
    if (r.status != 0) {
      std::fprintf(stderr, "input_pipeline: cannot install TensorFlow (is PyPI reachable?):\n%s",
                   r.output.c_str());
      return {};
    }
  }
  return python;
}

double tf_records_per_second(const std::string& python, const std::vector<std::string>& files,
                             std::int64_t batch, int threads, int passes) {
  using loom::bench::shell_quote;
  std::string cmd = shell_quote(python) + " " + shell_quote(LOOM_PARSE_EXAMPLE_TF) + " --batch " +
                    std::to_string(batch) + " --threads " + std::to_string(threads) + " --passes " +
                    std::to_string(passes) + " --buckets " + std::to_string(buckets);
  for (const auto& f : files)
    cmd += " " + shell_quote(f);
  const auto r = loom::bench::run_command(cmd);
  const auto at = r.output.rfind("records_per_second ");
  if (r.status != 0 || at == std::string::npos) {
    std::fprintf(stderr, "input_pipeline: TensorFlow's run failed:\n%s", r.output.c_str());
    return 0;
  }
  return std::atof(r.output.c_str() + at + 19);
}

} // namespace

int main(int argc, char** argv) {
  std::int64_t records = 200000, batch = 256;
  std::string python;
  bool tf = true, smoke = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--records" && i + 1 < argc)
      records = std::atoll(argv[++i]);
    else if (a == "--batch" && i + 1 < argc)
      batch = std::atoll(argv[++i]);
    else if (a == "--python" && i + 1 < argc)
      python = argv[++i];
    else if (a == "--no_tf")
      tf = false;
    else if (a == "--smoke")
      smoke = true;
    else {
      std::fprintf(stderr,
                   "usage: input_pipeline [--records N] [--batch B] [--python PATH] [--no_tf] "
                   "[--smoke]\n");
      return 2;
    }
  }
  if (smoke) {
    records = 2000;
    tf = false;
  }
  const int passes = smoke ? 1 : 3;
  const fs::path dir = fs::temp_directory_path() / ("input_pipeline-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto files = write_files(dir, records, 4);
  std::printf("tf.Example parse + hash, ctr schema (40 features), %lld records in 4 TFRecord "
              "files, batch %lld\n",
              static_cast<long long>(records), static_cast<long long>(batch));
  if (tf)
    python = tensorflow_python(python);
  std::printf("%-10s %16s %16s %8s\n", "threads", "loom records/s", "tf.data records/s", "ratio");
  int status = 0;
  for (const int threads : {1, 2}) {
    const double l = loom_records_per_second(files, batch, threads, passes);
    const double t =
        tf && !python.empty() ? tf_records_per_second(python, files, batch, threads, passes) : 0;
    if (tf && t == 0)
      status = 1;
    std::printf("%-10d %16.0f %16.0f %8s\n", threads, l, t,
                t > 0 ? (std::to_string(l / t).substr(0, 4) + "x").c_str() : "-");
    std::fflush(stdout);
  }
  fs::remove_all(dir);
  return status;
}

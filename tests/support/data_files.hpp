// Files for the input pipeline's tests: a scratch directory removed with
// everything in it when the test ends, and the TF-written fixtures' directory.
#pragma once

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace loom::testing {

struct scratch_dir {
  std::filesystem::path path;
  scratch_dir() {
    std::random_device rd;
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    path = std::filesystem::temp_directory_path() /
           ("loom_pipeline_test_" + std::to_string(stamp) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

inline void write_text_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// tests/data/tf/, written by benchmarks/tf/write_data_fixtures.py.
inline std::string tf_fixture(const std::string& name) {
  return std::string(LOOM_TEST_SOURCE_DIR) + "/tests/data/tf/" + name;
}

} // namespace loom::testing

// Files for the input pipeline's tests: a scratch directory (scratch_dir.hpp), and the
// TF-written fixtures' directory.
#pragma once

#include "scratch_dir.hpp"

#include <fstream>
#include <string>

namespace loom::testing {

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

// A test's own directory under the system's temporary directory, removed with all it
// holds when the test ends (its permissions given back first, for the tests that take
// them away to make a save fail).
#pragma once

#include <doctest/doctest.h>

#include <stdlib.h> // mkdtemp

#include <filesystem>
#include <string>
#include <system_error>

namespace loom::testing {

struct scratch_dir {
  std::filesystem::path path;
  scratch_dir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "loom_test_XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path, ec);
  }
  // The path of `name` in it.
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::string operator/(const std::string& name) const { return file(name); }
};

} // namespace loom::testing

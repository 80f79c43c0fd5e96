// Files by glob pattern. glob_files(pattern): the matching names, sorted;
// list_files(pattern, shuffle, seed) (TF's Dataset.list_files): the same as a
// dataset, in an order shuffled with the seed (a new order each pass, as TF
// reshuffles each iteration) unless shuffle is false. A pattern that matches
// no file is an error naming it, as in TF: a typo must not train on nothing.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/data/from_tensor_slices.hpp>
#include <loom/data/shuffle.hpp>

#include <glob.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom::data {

LOOM_COMPILED_ONCE std::vector<std::string> glob_files(const std::string& pattern);

// shuffle false is a shuffle over a buffer of one element: the sorted order.
LOOM_COMPILED_ONCE shuffle_dataset<vector_dataset<std::string>>
list_files(const std::string& pattern, bool shuffle = true, std::optional<std::uint64_t> seed = {});

} // namespace loom::data

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::data {

LOOM_COMPILED_ONCE std::vector<std::string> glob_files(const std::string& pattern) {
  glob_t found{};
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &found);
  std::vector<std::string> names;
  for (std::size_t i = 0; rc == 0 && i < found.gl_pathc; ++i)
    names.emplace_back(found.gl_pathv[i]);
  globfree(&found);
  if (rc == GLOB_NOMATCH || (rc == 0 && names.empty()))
    throw invalid_argument_error("list_files: no files match the pattern " + pattern);
  if (rc != 0)
    throw unavailable_error("list_files: reading the directories of " + pattern + " failed");
  std::sort(names.begin(), names.end());
  return names;
}

LOOM_COMPILED_ONCE shuffle_dataset<vector_dataset<std::string>>
list_files(const std::string& pattern, bool shuffle, std::optional<std::uint64_t> seed) {
  std::vector<std::string> names = glob_files(pattern);
  const auto n = static_cast<std::int64_t>(names.size());
  return {vector_dataset<std::string>(std::move(names)), shuffle ? n : 1, seed, true};
}

} // namespace loom::data

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// loom's version (TF's tf.__version__ and TF_MAJOR_VERSION ...): the macros
// for the preprocessor, loom::version() for a program's logs. This header is
// the one place the version is written; CMake's project() reads it from here.
#pragma once

#include <string_view>

#define LOOM_VERSION_MAJOR 0
#define LOOM_VERSION_MINOR 1
#define LOOM_VERSION_PATCH 0

#define LOOM_DETAIL_STRINGIZE(x) #x
#define LOOM_DETAIL_VERSION_STRING(major, minor, patch)                                            \
  LOOM_DETAIL_STRINGIZE(major) "." LOOM_DETAIL_STRINGIZE(minor) "." LOOM_DETAIL_STRINGIZE(patch)

// "0.1.0"
#define LOOM_VERSION_STRING                                                                        \
  LOOM_DETAIL_VERSION_STRING(LOOM_VERSION_MAJOR, LOOM_VERSION_MINOR, LOOM_VERSION_PATCH)
// One number that orders versions: major * 10000 + minor * 100 + patch
// (`#if LOOM_VERSION >= 200` means 0.2.0 or later).
#define LOOM_VERSION (LOOM_VERSION_MAJOR * 10000 + LOOM_VERSION_MINOR * 100 + LOOM_VERSION_PATCH)

namespace loom {

// "major.minor.patch" of the loom headers this program was compiled with.
constexpr std::string_view version() noexcept {
  return LOOM_VERSION_STRING;
}

} // namespace loom

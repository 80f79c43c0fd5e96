// loom::version() and the LOOM_VERSION_* macros (TF's tf.__version__) agree with
// each other and with the version CMake gave the project (read from the header).
#include <loom/loom.hpp>

#include <doctest/doctest.h>

#include <string>
#include <string_view>

static_assert(LOOM_VERSION ==
              LOOM_VERSION_MAJOR * 10000 + LOOM_VERSION_MINOR * 100 + LOOM_VERSION_PATCH);
static_assert(LOOM_VERSION_MINOR < 100 && LOOM_VERSION_PATCH < 100,
              "LOOM_VERSION orders versions only while minor and patch stay below 100");

TEST_CASE("loom::version() is major.minor.patch, the project's version") {
  const std::string expected = std::to_string(LOOM_VERSION_MAJOR) + "." +
                               std::to_string(LOOM_VERSION_MINOR) + "." +
                               std::to_string(LOOM_VERSION_PATCH);
  CHECK(loom::version() == expected);
  CHECK(std::string_view(LOOM_VERSION_STRING) == expected);
  CHECK(loom::version() == std::string_view(LOOM_TEST_PROJECT_VERSION));
}

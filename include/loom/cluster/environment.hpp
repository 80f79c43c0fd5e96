// How loom's configuration reads the process environment (TF_CONFIG, the launchers'
// variables, the TLS settings): through a function, so that tests pass their own.
#pragma once

#include <loom/core/compiled_once.hpp>

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

namespace loom {

// Reads an environment variable; nullopt when unset.
using environment = std::function<std::optional<std::string>(const std::string&)>;

LOOM_COMPILED_ONCE environment process_environment();

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE environment process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    if (const char* v = std::getenv(name.c_str()))
      return std::string(v);
    return std::nullopt;
  };
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

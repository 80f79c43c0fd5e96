// How loom's configuration reads the process environment (TF_CONFIG, the launchers'
// variables, the TLS settings): through a function, so that tests pass their own. And
// the CPUs the process may run on, which launchers set too.
#pragma once

#include <loom/core/compiled_once.hpp>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

namespace loom {

// Reads an environment variable; nullopt when unset.
using environment = std::function<std::optional<std::string>(const std::string&)>;

LOOM_COMPILED_ONCE environment process_environment();

} // namespace loom

namespace loom::detail {

// The CPUs this thread may run on: its affinity mask, which taskset, Slurm's and
// mpirun's binding and a container's cpuset set (TF's default thread counts read it
// too); the machine's hardware threads where there is none. At least 1. A pool sized to
// every hardware thread of a host whose tasks are each bound to a few oversubscribes
// them: examples/cnn's 3 tasks on 2 cores with 2 kernel threads each made 28 % fewer
// examples/s than with 1.
LOOM_COMPILED_ONCE int schedulable_cpus();

} // namespace loom::detail

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

namespace loom::detail {

LOOM_COMPILED_ONCE int schedulable_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    return CPU_COUNT(&set);
#endif
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

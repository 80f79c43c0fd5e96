// Example cluster binaries as test processes: where they are (LOOM_EXAMPLES_DIR,
// empty when the examples are not built), --ps_hosts/--worker_hosts flags on
// fresh loopback ports, and an exit check that reports the child's output.
#pragma once

#include <doctest/doctest.h>
#include <support/process.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::testing {

inline const bool no_examples = std::string_view(LOOM_EXAMPLES_DIR).empty();

inline std::string example(const char* name) {
  return std::string(LOOM_EXAMPLES_DIR) + "/" + name;
}

// Waits for `c` to exit and checks the exit code; the child's command and
// output are in the message when it fails.
inline void expect_exit(child& c, int code, std::chrono::milliseconds timeout = 120s) {
  const auto st = c.wait(timeout);
  INFO(c.report());
  REQUIRE_MESSAGE(st.has_value(), "did not exit in time");
  CHECK(st->exited);
  CHECK(st->code == code);
}

// --ps_hosts=... and --worker_hosts=... on fresh loopback ports.
struct cluster_flags {
  std::vector<std::uint16_t> ps, workers;
  cluster_flags(std::size_t n_ps, std::size_t n_workers) {
    auto ports = free_ports(n_ps + n_workers);
    ps.assign(ports.begin(), ports.begin() + static_cast<std::ptrdiff_t>(n_ps));
    workers.assign(ports.begin() + static_cast<std::ptrdiff_t>(n_ps), ports.end());
  }
  std::vector<std::string> task(const std::string& job, int index) const {
    return {"--ps_hosts=" + loopback_hosts(ps), "--worker_hosts=" + loopback_hosts(workers),
            "--job_name=" + job, "--task_index=" + std::to_string(index)};
  }
  std::string address(const std::string& job, std::size_t index) const {
    return "127.0.0.1:" + std::to_string(job == "ps" ? ps.at(index) : workers.at(index));
  }
};

template <class... S> std::vector<std::string> plus(std::vector<std::string> v, S... more) {
  (v.emplace_back(more), ...);
  return v;
}

} // namespace loom::testing

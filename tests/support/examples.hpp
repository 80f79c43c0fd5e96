// Example cluster binaries as test processes: where they are (LOOM_EXAMPLES_DIR,
// empty when the examples are not built), --ps_hosts/--worker_hosts flags on
// fresh loopback ports, and an exit check that reports the child's output.
//
// A test case that runs an example carries the decorator needs_examples. Built
// with the examples (the default), a missing binary fails it, naming the path;
// built without them on purpose (-DLOOM_BUILD_EXAMPLES=OFF) it is skipped and
// the binary ends its run with a line CTest reports as a skip (see
// examples_skip_listener and tests/runtime/CMakeLists.txt).
#pragma once

#include <doctest/doctest.h>
#include <support/process.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <ostream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace loom::testing {

inline const bool no_examples = std::string_view(LOOM_EXAMPLES_DIR).empty();

// The doctest suite of the cases that run examples: `--test-suite=examples` runs
// them alone, which is how a build without them gets a CTest test that is skipped.
inline constexpr const char* examples_suite = "examples";

// The line a run prints when it skipped cases for want of the examples and ran
// nothing else; tests/runtime/CMakeLists.txt matches it (SKIP_REGULAR_EXPRESSION).
inline constexpr std::string_view skipped_without_examples =
    "skipped: built without examples (LOOM_BUILD_EXAMPLES=OFF)";

// TEST_CASE("..." * needs_examples()): joins examples_suite, and is skipped when
// the suite is built without the examples.
struct needs_examples {
  template <class TestCaseOrSuite> void fill(TestCaseOrSuite& state) const {
    state.m_test_suite = examples_suite;
    state.m_skip = no_examples;
  }
};

// What keeps example `name` from running, or "" when nothing does.
inline std::string missing_example(const char* name) {
  const std::filesystem::path path = std::filesystem::path(LOOM_EXAMPLES_DIR) / name;
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec))
    return "";
  return "example binary '" + std::string(name) + "' is missing: looked for " + path.string() +
         ". The process tests run the example programs; build it with `cmake --build <build dir> "
         "--target " +
         name + "` (building this test builds it too).";
}

// The path of example `name`; fails the test case, saying why, when it is missing.
inline std::string example(const char* name) {
  if (const std::string why = missing_example(name); !why.empty())
    FAIL(why);
  return std::string(LOOM_EXAMPLES_DIR) + "/" + name;
}

// Counts the cases skipped for want of the examples and, at the end of the run,
// says so: skipped_without_examples when no other case ran (CTest reports the
// test as skipped), a note that does not match it when others ran (the test's
// result is theirs).
class examples_skip_listener : public doctest::IReporter {
public:
  explicit examples_skip_listener(const doctest::ContextOptions& options) : out_(*options.cout) {}

  void test_case_skipped(const doctest::TestCaseData& tc) override {
    if (tc.m_skip && std::string_view(tc.m_test_suite) == examples_suite)
      ++skipped_;
  }
  void test_case_start(const doctest::TestCaseData&) override { ++ran_; }
  void test_run_end(const doctest::TestRunStats&) override {
    if (skipped_ == 0)
      return;
    if (ran_ == 0)
      out_ << skipped_without_examples << ": " << skipped_
           << " test case(s) run the example programs\n";
    else
      out_ << "note: " << skipped_
           << " test case(s) that run the example programs did not run: the suite was built "
              "without examples (LOOM_BUILD_EXAMPLES=OFF)\n";
  }

  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}

private:
  std::ostream& out_;
  int skipped_ = 0;
  int ran_ = 0;
};

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

// doctest keys listeners by name: a second unit including this header adds no second listener.
REGISTER_LISTENER("loom_examples_skip", 1, loom::testing::examples_skip_listener);

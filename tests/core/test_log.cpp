// The library's logger (core/log.hpp, written by runtime/spdlog_sink.hpp, which this binary
// links through loom::kernels): a line's timestamp, level and task, the level filter, and
// LOOM_LOG_LEVEL's names.
#include <loom/core/log.hpp>

#include <support/process.hpp>
#include <support/stderr_capture.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <regex>
#include <string>

namespace lg = loom::logging;

namespace {

// Restores the process's level and task when a case ends, whatever it set.
struct log_settings_guard {
  lg::level level = lg::current_level();
  std::string task = lg::task();
  ~log_settings_guard() {
    lg::set_level(level);
    lg::set_task(task);
  }
};

} // namespace

TEST_CASE("a log line: a timestamp with milliseconds, the level, the task, then loom: and the "
          "message") {
  log_settings_guard restore;
  lg::set_level(lg::level::info);
  lg::set_task("/job:worker/task:1");
  loom::testing::stderr_capture capture;
  lg::warn("rejected a connection from 127.0.0.1:5: wrong cluster token");
  lg::info("shutting down");
  const std::string text = capture.text();
  CHECK_MESSAGE(std::regex_match(text, std::regex(R"([0-9]{4}-[0-9]{2}-[0-9]{2} )"
                                                  R"([0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3} )"
                                                  R"(warn /job:worker/task:1 loom: rejected a )"
                                                  R"(connection from 127\.0\.0\.1:5: wrong )"
                                                  R"(cluster token\n)"
                                                  R"([0-9-]{10} [0-9:.]{12} info )"
                                                  R"(/job:worker/task:1 loom: shutting down\n)")),
                text);
}

TEST_CASE("the level drops the lines below it; the first server's task stays") {
  log_settings_guard restore;
  lg::set_task("/job:ps/task:0");
  lg::set_task_if_unset("/job:worker/task:3"); // a second server of the process
  lg::set_level(lg::level::warn);
  loom::testing::stderr_capture capture;
  lg::info("an info line");
  lg::debug("a debug line");
  lg::error("an error line");
  const std::string text = capture.text();
  CHECK(text.find("an info line") == std::string::npos);
  CHECK(text.find("a debug line") == std::string::npos);
  CHECK_MESSAGE(text.find(" error /job:ps/task:0 loom: an error line\n") != std::string::npos,
                text);
  CHECK_FALSE(lg::enabled(lg::level::info));
  CHECK(lg::enabled(lg::level::warn));
  lg::set_level(lg::level::off);
  CHECK_FALSE(lg::enabled(lg::level::error));
}

TEST_CASE("LOOM_LOG_LEVEL: the six names; any other value is said once, naming the variable and "
          "the names, and changes nothing") {
  log_settings_guard restore;
  for (const char* name : {"trace", "debug", "info", "warn", "error", "off"}) {
    CAPTURE(name);
    lg::set_level_from_variable(name);
    CHECK(lg::to_string(lg::current_level()) == name);
  }
  lg::set_level(lg::level::info);
  loom::testing::stderr_capture capture;
  lg::set_level_from_variable("loud");
  lg::set_level_from_variable("WARN");
  const std::string text = capture.text();
  CHECK_MESSAGE(text.find(" warn ") != std::string::npos, text);
  CHECK_MESSAGE(text.find("LOOM_LOG_LEVEL is \"loud\", not one of trace, debug, info, warn, "
                          "error, off; logging at info\n") != std::string::npos,
                text);
  CHECK(text.find("LOOM_LOG_LEVEL is \"WARN\"") != std::string::npos);
  CHECK(lg::current_level() == lg::level::info);
}

TEST_CASE("a program reads LOOM_LOG_LEVEL before main() and says so when it names no level") {
  using namespace std::chrono_literals;
  // This very binary, listing its cases: the runtime's logger starts before doctest does.
  loom::testing::child self("/proc/self/exe", {"--list-test-cases"},
                            {{"LOOM_LOG_LEVEL", "verbose"}});
  const auto st = self.wait(60s);
  REQUIRE_MESSAGE(st, self.output());
  CHECK(st->exited);
  CHECK_MESSAGE(
      std::regex_search(self.output(),
                        std::regex(R"((^|\n)[0-9-]{10} [0-9:.]{12} warn - loom: )"
                                   R"(LOOM_LOG_LEVEL is "verbose", not one of trace, )"
                                   R"(debug, info, warn, error, off; logging at info\n)")),
      self.output());
}

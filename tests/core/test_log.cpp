// The library's logger: a line's timestamp, level and task, and the level filter.
#include <loom/core/log.hpp>

#include <support/stderr_capture.hpp>

#include <doctest/doctest.h>

#include <regex>
#include <string>

namespace lg = loom::logging;

TEST_CASE("a log line: timestamp, level, task, then loom: and the message") {
  lg::set_level(lg::level::info);
  lg::set_task("/job:worker/task:1");
  loom::testing::stderr_capture capture;
  lg::write(lg::level::warning, "rejected a connection from 127.0.0.1:5: wrong cluster token");
  lg::write(lg::level::info, "shutting down");
  const std::string text = capture.text();
  CHECK_MESSAGE(
      std::regex_match(text, std::regex(R"([0-9]{4}-[0-9]{2}-[0-9]{2} )"
                                        R"([0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3} )"
                                        R"(warning /job:worker/task:1 loom: rejected a )"
                                        R"(connection from 127\.0\.0\.1:5: wrong cluster )"
                                        R"(token\n)"
                                        R"([0-9-]{10} [0-9:.]{12} info )"
                                        R"(/job:worker/task:1 loom: shutting down\n)")),
      text);
}

TEST_CASE("the level filters lower lines; LOOM_LOG_LEVEL's names") {
  lg::set_task("/job:ps/task:0");
  lg::set_level(lg::level::warning);
  loom::testing::stderr_capture capture;
  lg::write(lg::level::info, "an info line");
  lg::write(lg::level::debug, "a debug line");
  lg::write(lg::level::error, "an error line");
  const std::string text = capture.text();
  CHECK(text.find("an info line") == std::string::npos);
  CHECK(text.find("a debug line") == std::string::npos);
  CHECK(text.find(" error /job:ps/task:0 loom: an error line\n") != std::string::npos);
  CHECK_FALSE(lg::enabled(lg::level::info));
  CHECK(lg::enabled(lg::level::warning));
  lg::set_level(lg::level::info);

  CHECK(lg::parse_level("trace") == lg::level::trace);
  CHECK(lg::parse_level("debug") == lg::level::debug);
  CHECK(lg::parse_level("info") == lg::level::info);
  CHECK(lg::parse_level("warning") == lg::level::warning);
  CHECK(lg::parse_level("warn") == lg::level::warning);
  CHECK(lg::parse_level("error") == lg::level::error);
  CHECK(lg::parse_level("off") == lg::level::off);
  CHECK_FALSE(lg::parse_level("loud"));
}

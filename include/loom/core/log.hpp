// The library's one logger: every line to stderr with a timestamp, its level and the
// task of this process, then the message:
//
//   2026-11-25 20:41:31.123 warning /job:worker/task:1 loom: rejected a connection from ...
//
// The level is LOOM_LOG_LEVEL (trace, debug, info, warning, error or off; default info),
// read at the first line. The task is "-" until a server of this process starts
// (loom::server sets it) or the program sets it. Progress lines (a trainer's steps and
// losses) are not logs: they go to stdout, as the examples print them.
//
// The lines are written by spdlog: Debian's libspdlog-dev as the compiled library
// (spdlog::spdlog, linked through loom::loom), so that a unit including this header
// compiles spdlog's and fmt's declarations (about 3 s on the loaded 2-core VM) and not
// their implementations (about 11 s in spdlog's header-only mode); docs/dependencies.md.
#pragma once

#include <spdlog/logger.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace loom::logging {

enum class level { trace, debug, info, warning, error, off };

inline std::string_view to_string(level l) {
  switch (l) {
  case level::trace: return "trace";
  case level::debug: return "debug";
  case level::info: return "info";
  case level::warning: return "warning";
  case level::error: return "error";
  case level::off: return "off";
  }
  return "?";
}

// "warning" (or "warn"), ...; nullopt for a name that is not a level.
inline std::optional<level> parse_level(std::string_view name) {
  for (level l :
       {level::trace, level::debug, level::info, level::warning, level::error, level::off})
    if (name == to_string(l))
      return l;
  if (name == "warn")
    return level::warning;
  return std::nullopt;
}

namespace detail {

inline spdlog::level::level_enum to_spdlog(level l) {
  switch (l) {
  case level::trace: return spdlog::level::trace;
  case level::debug: return spdlog::level::debug;
  case level::info: return spdlog::level::info;
  case level::warning: return spdlog::level::warn;
  case level::error: return spdlog::level::err;
  case level::off: break;
  }
  return spdlog::level::off;
}

struct state {
  std::mutex m;
  std::string task = "-";
  spdlog::logger logger{"loom", std::make_shared<spdlog::sinks::stderr_sink_mt>()};

  state() {
    // "%L" would abbreviate; the full name is what LOOM_LOG_LEVEL takes. spdlog says "warning"
    // as "warning" and "error" as "error" with these names.
    logger.set_pattern("%Y-%m-%d %H:%M:%S.%e %l %v");
    logger.flush_on(spdlog::level::trace); // a line is on stderr before a crash or a kill
    std::string bad;
    level l = level::info;
    if (const char* v = std::getenv("LOOM_LOG_LEVEL"); v && *v) {
      if (const auto parsed = parse_level(v))
        l = *parsed;
      else
        bad = v;
    }
    logger.set_level(to_spdlog(l));
    if (!bad.empty())
      logger.log(spdlog::level::warn,
                 "- loom: LOOM_LOG_LEVEL=\"" + bad +
                     "\" is not a level (trace, debug, info, warning, error, off); using info");
  }
};

inline state& the_state() {
  static state s;
  return s;
}

} // namespace detail

// Sets the level (LOOM_LOG_LEVEL sets it at the first line).
inline void set_level(level l) {
  detail::the_state().logger.set_level(detail::to_spdlog(l));
}

inline bool enabled(level l) {
  return l != level::off && detail::the_state().logger.should_log(detail::to_spdlog(l));
}

// This process's task, "/job:worker/task:1", on every line from now on.
inline void set_task(std::string task) {
  auto& s = detail::the_state();
  std::lock_guard lk(s.m);
  s.task = std::move(task);
}

// Sets the task unless one is set already (the first server of a process names it).
inline void set_task_if_unset(std::string task) {
  auto& s = detail::the_state();
  std::lock_guard lk(s.m);
  if (s.task == "-")
    s.task = std::move(task);
}

// One line: "<time> <level> <task> loom: <message>".
inline void write(level l, std::string_view message) {
  if (!enabled(l))
    return;
  auto& s = detail::the_state();
  std::string line;
  {
    std::lock_guard lk(s.m);
    line.reserve(s.task.size() + message.size() + 8);
    line += s.task;
  }
  line += " loom: ";
  line += message;
  s.logger.log(detail::to_spdlog(l), spdlog::string_view_t(line.data(), line.size()));
}

} // namespace loom::logging

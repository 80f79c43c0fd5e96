// The library's one logger. Every line goes to stderr with a timestamp (milliseconds),
// its level and the task of this process, then "loom:" and the message:
//
//   2026-11-26 01:50:12.345 warn /job:worker/task:1 loom: rejected a connection from ...
//
// The level is LOOM_LOG_LEVEL (trace, debug, info, warn, error or off; default info). The
// task is "-" until the process learns its role: its first loom::server sets it.
// Progress lines (a trainer's steps, losses, accuracy) are not log lines: programs print
// them on stdout themselves.
//
// This header declares the logger; it does not implement it. The lines are written by
// spdlog in the linked runtime, the one unit per program that compiles the kernels and the
// runtime (runtime/spdlog_sink.hpp, included by runtime/linked_runtime.hpp), which installs
// its sink and reads LOOM_LOG_LEVEL before main(). So a unit that logs parses no spdlog
// (it cost 3 s per unit, 11 s header-only: docs/benchmarks.md, "Build cost"), and a program
// needs no shared library for it. A program without the runtime (one built from
// <loom/api.hpp> alone) has no sink: its lines go to stderr bare, "loom: <level>: ...".
#pragma once

#include <loom/core/compiled_once.hpp>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace loom::logging {

enum class level : int { trace, debug, info, warn, error, off };

// The names LOOM_LOG_LEVEL takes, and the lines show.
constexpr std::string_view to_string(level l) noexcept {
  switch (l) {
  case level::trace: return "trace";
  case level::debug: return "debug";
  case level::info: return "info";
  case level::warn: return "warn";
  case level::error: return "error";
  case level::off: return "off";
  }
  return "?";
}

// The level of a name to_string gives; nullopt for any other name.
LOOM_COMPILED_ONCE std::optional<level> parse_level(std::string_view name) noexcept;

// What writes the lines: the linked runtime's (runtime/spdlog_sink.hpp). `task` and
// `message` are whole; the sink adds the timestamp and the level.
class sink {
public:
  virtual void write(level l, std::string_view task, std::string_view message) noexcept = 0;

protected:
  ~sink() = default;
};

namespace detail {

// Constant-initialized: a line logged by another unit's static initializer finds them set.
constinit inline std::atomic<int> log_threshold{static_cast<int>(level::info)};
constinit inline std::atomic<sink*> installed_sink{nullptr};

struct task_name {
  std::mutex mutex;
  std::string name = "-";
};

inline task_name& the_task_name() {
  static task_name t;
  return t;
}

} // namespace detail

// Whether a line at `l` would be written: one atomic load, for a caller to skip building
// a message nobody reads.
inline bool enabled(level l) noexcept {
  return l != level::off &&
         static_cast<int>(l) >= detail::log_threshold.load(std::memory_order_relaxed);
}

// Lines below `l` are dropped from now on (LOOM_LOG_LEVEL sets it before main()).
inline void set_level(level l) noexcept {
  detail::log_threshold.store(static_cast<int>(l), std::memory_order_relaxed);
}

inline level current_level() noexcept {
  return static_cast<level>(detail::log_threshold.load(std::memory_order_relaxed));
}

// This process's task ("/job:worker/task:1") on every line from now on.
inline void set_task(std::string task) {
  auto& t = detail::the_task_name();
  std::lock_guard lock(t.mutex);
  t.name = std::move(task);
}

// Sets the task unless one is set already: a process's first server names it (tests and
// single-process programs run several).
LOOM_COMPILED_ONCE void set_task_if_unset(std::string task);

inline std::string task() {
  auto& t = detail::the_task_name();
  std::lock_guard lock(t.mutex);
  return t.name;
}

// Writes one line at `l`, unless the level drops it.
LOOM_COMPILED_ONCE void write(level l, std::string_view message);

inline void trace(std::string_view message) {
  write(level::trace, message);
}
inline void debug(std::string_view message) {
  write(level::debug, message);
}
inline void info(std::string_view message) {
  write(level::info, message);
}
inline void warn(std::string_view message) {
  write(level::warn, message);
}
inline void error(std::string_view message) {
  write(level::error, message);
}

// Sets the level from LOOM_LOG_LEVEL's value (the runtime calls it before main()). A value
// that names no level leaves the level as it is and says so in one line.
LOOM_COMPILED_ONCE void set_level_from_variable(std::string_view value);

// Called by the linked runtime once, before main(). Returns the sink it replaces (nullptr:
// none), so that a sink put in front of it (a test's, tests/support/log_capture.hpp) can hand
// lines on to it. A sink once installed must outlive every line: install one that is never
// destroyed.
inline sink* install(sink& s) noexcept {
  return detail::installed_sink.exchange(&s, std::memory_order_acq_rel);
}

} // namespace loom::logging

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::logging {

LOOM_COMPILED_ONCE std::optional<level> parse_level(std::string_view name) noexcept {
  for (level l : {level::trace, level::debug, level::info, level::warn, level::error, level::off})
    if (name == to_string(l))
      return l;
  return std::nullopt;
}

LOOM_COMPILED_ONCE void set_task_if_unset(std::string task) {
  auto& t = detail::the_task_name();
  std::lock_guard lock(t.mutex);
  if (t.name == "-")
    t.name = std::move(task);
}

LOOM_COMPILED_ONCE void write(level l, std::string_view message) {
  if (!enabled(l))
    return;
  if (sink* out = detail::installed_sink.load(std::memory_order_acquire))
    out->write(l, task(), message);
  else // no runtime linked in (see above)
    std::fprintf(stderr, "loom: %.*s: %.*s\n", static_cast<int>(to_string(l).size()),
                 to_string(l).data(), static_cast<int>(message.size()), message.data());
}

LOOM_COMPILED_ONCE void set_level_from_variable(std::string_view value) {
  if (const auto l = parse_level(value))
    set_level(*l);
  else
    warn("LOOM_LOG_LEVEL is \"" + std::string(value) +
         "\", not one of trace, debug, info, warn, error, off; logging at " +
         std::string(to_string(current_level())));
}

} // namespace loom::logging

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

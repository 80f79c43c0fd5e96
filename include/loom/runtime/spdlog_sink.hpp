// The library logger's sink (core/log.hpp): spdlog writes each line to stderr, thread-safe
// and flushed, with a millisecond timestamp. Included only by runtime/linked_runtime.hpp,
// so that the one unit per program that compiles the runtime also compiles spdlog, and no
// other unit parses it.
//
// spdlog and fmt compile here in their header-only modes (FMT_HEADER_ONLY; spdlog is
// header-only unless SPDLOG_COMPILED_LIB): a loom program then needs neither libspdlog.so
// nor libfmt.so where it runs (the GPU machines' image has neither), and the by-hand g++
// command needs no -l for them. That costs this one unit the parse of their implementations
// (docs/benchmarks.md, "Build cost").
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/log.hpp>

#ifndef FMT_HEADER_ONLY
#define FMT_HEADER_ONLY
#endif
#include <spdlog/logger.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

namespace loom::detail {

class spdlog_sink final : public logging::sink {
public:
  spdlog_sink() {
    // The level and the task come in the message: loom's level names are those
    // LOOM_LOG_LEVEL takes ("warn", where spdlog says "warning").
    logger_.set_pattern("%Y-%m-%d %H:%M:%S.%e %v");
    logger_.set_level(spdlog::level::trace); // core/log.hpp's threshold filters
    logger_.flush_on(spdlog::level::trace);  // a line is out before a crash or a kill
  }

  void write(logging::level l, std::string_view task, std::string_view message) noexcept override;

  // Installs one sink for the process and sets the level from LOOM_LOG_LEVEL, saying once
  // when the variable names no level. Called before main() by runtime/linked_runtime.hpp.
  static bool install_from_environment();

private:
  static spdlog::level::level_enum to_spdlog(logging::level l) noexcept;

  spdlog::logger logger_{"loom", std::make_shared<spdlog::sinks::stderr_sink_mt>()};
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE void spdlog_sink::write(logging::level l, std::string_view task,
                                           std::string_view message) noexcept {
  try {
    std::string line;
    line.reserve(16 + task.size() + message.size());
    line.append(logging::to_string(l)).append(" ").append(task).append(" loom: ").append(message);
    logger_.log(to_spdlog(l), spdlog::string_view_t(line.data(), line.size()));
  } catch (...) { // out of memory: the line is lost, the caller goes on
  }
}

LOOM_COMPILED_ONCE bool spdlog_sink::install_from_environment() {
  // Never destroyed: a line logged by a static object's destructor still finds it.
  static spdlog_sink* const the_sink = new spdlog_sink;
  logging::install(*the_sink);
  if (const char* value = std::getenv("LOOM_LOG_LEVEL"); value && *value)
    logging::set_level_from_variable(value);
  return true;
}

LOOM_COMPILED_ONCE auto spdlog_sink::to_spdlog(logging::level l) noexcept
    -> spdlog::level::level_enum {
  switch (l) {
  case logging::level::trace: return spdlog::level::trace;
  case logging::level::debug: return spdlog::level::debug;
  case logging::level::info: return spdlog::level::info;
  case logging::level::warn: return spdlog::level::warn;
  case logging::level::error: return spdlog::level::err;
  case logging::level::off: break;
  }
  return spdlog::level::off;
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

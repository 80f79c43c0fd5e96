// The library logger's lines (core/log.hpp) while a capture lives, each with its level, for
// tests that check what a component logged (a monitored session's recoveries, a hook's
// checkpoints). Every thread's lines are caught, whoever logs them; they are kept from the
// program's sink meanwhile (stderr stays quiet). Lines below the logger's level are dropped
// before any sink sees them, as ever.
//
// It works through the logger's own sink mechanism: the first capture puts one sink in front
// of the program's (runtime/spdlog_sink.hpp), for the rest of the process, which hands lines
// on to it whenever no capture lives. That sink is never destroyed, so a line logged by a
// thread that outlives a capture (a local cluster's io threads) finds it still there.
#pragma once

#include <loom/core/log.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace loom::testing {

class log_capture {
public:
  struct line {
    logging::level level;
    std::string message;
  };

  log_capture() { front_sink::the().attach(this); }
  log_capture(const log_capture&) = delete;
  log_capture& operator=(const log_capture&) = delete;
  ~log_capture() { front_sink::the().detach(this); }

  std::vector<line> lines() const {
    std::lock_guard lock(mu_);
    return lines_;
  }
  // The messages, one a line.
  std::string text() const {
    std::lock_guard lock(mu_);
    std::string s;
    for (const auto& l : lines_)
      s.append(l.message).append("\n");
    return s;
  }
  // How many lines contain `needle`.
  std::size_t count(std::string_view needle) const {
    std::lock_guard lock(mu_);
    return static_cast<std::size_t>(std::count_if(lines_.begin(), lines_.end(), [&](const line& l) {
      return l.message.find(needle) != std::string::npos;
    }));
  }
  bool contains(std::string_view needle) const { return count(needle) > 0; }
  // The level of the first line that contains `needle`; off where none does.
  logging::level level_of(std::string_view needle) const {
    std::lock_guard lock(mu_);
    for (const auto& l : lines_)
      if (l.message.find(needle) != std::string::npos)
        return l.level;
    return logging::level::off;
  }

private:
  class front_sink final : public logging::sink {
  public:
    static front_sink& the() {
      static front_sink* const s = [] {
        auto* made = new front_sink; // never destroyed: see the top of this file
        made->next_ = logging::install(*made);
        return made;
      }();
      return *s;
    }
    void attach(log_capture* c) {
      std::lock_guard lock(mu_);
      captures_.push_back(c);
    }
    void detach(log_capture* c) {
      std::lock_guard lock(mu_);
      captures_.erase(std::remove(captures_.begin(), captures_.end(), c), captures_.end());
    }
    void write(logging::level l, std::string_view task,
               std::string_view message) noexcept override {
      std::unique_lock lock(mu_);
      if (captures_.empty()) {
        lock.unlock();
        if (next_)
          next_->write(l, task, message);
        else // the bare line core/log.hpp writes without a sink
          std::fprintf(stderr, "loom: %.*s: %.*s\n", static_cast<int>(logging::to_string(l).size()),
                       logging::to_string(l).data(), static_cast<int>(message.size()),
                       message.data());
        return;
      }
      try {
        for (log_capture* c : captures_) {
          std::lock_guard keep(c->mu_);
          c->lines_.push_back({l, std::string(message)});
        }
      } catch (...) { // out of memory: the line is lost
      }
    }

  private:
    std::mutex mu_;
    std::vector<log_capture*> captures_;
    logging::sink* next_ = nullptr;
  };

  mutable std::mutex mu_;
  std::vector<line> lines_;
};

} // namespace loom::testing

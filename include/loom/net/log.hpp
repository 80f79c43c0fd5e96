// Where the message layer's log lines go, and how a server keeps a flood of
// them (a peer that fails the same way a thousand times a second) to a few.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/log.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace loom::net {

// Receives the layer's log lines ("waiting for ps task 0 at ...", rejected
// clients, bad frames). Empty: the library's logger (core/log.hpp), at `level`.
using log_fn = std::function<void(std::string_view)>;

// Most of the layer's lines say something went wrong (a rejected peer, a failed handshake
// or accept, a bad frame): warnings unless the caller says otherwise.
inline void log_line(const log_fn& log, std::string_view msg,
                     logging::level level = logging::level::warn) {
  if (log)
    log(msg);
  else
    logging::write(level, msg);
}

// Logs a line at once, and a line like it (the same text but for its numbers: a peer's
// address, a request id, a size) at most once per interval, saying how many like it
// were held back meanwhile. A server under attack (accept failing on every try, a
// thousand sockets sending garbage) thus writes a few lines a minute, not millions.
// Thread-safe.
class log_limiter {
public:
  using clock = std::chrono::steady_clock;

  log_limiter(log_fn log, clock::duration interval) : log_(std::move(log)), interval_(interval) {}

  void line(std::string_view text);

  // Says how many lines were held back since each kind was last logged (at a server's stop).
  void flush();

  // A log_fn that logs through `limiter` (and keeps it alive).
  static log_fn through(std::shared_ptr<log_limiter> limiter) {
    return [l = std::move(limiter)](std::string_view s) { l->line(s); };
  }

private:
  struct kind {
    bool logged = false;
    clock::time_point last{};
    std::size_t held = 0;
  };

  // Lines that differ only in their digits are alike ("#" stands for each run of digits).
  static std::string kind_of(std::string_view text);

  static std::string seconds(clock::duration d);

  log_fn log_;
  clock::duration interval_;
  std::mutex m_;
  std::unordered_map<std::string, kind> kinds_;
};

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net {

LOOM_COMPILED_ONCE void log_limiter::line(std::string_view text) {
  std::string held_back;
  {
    std::lock_guard lk(m_);
    auto& k = kinds_[kind_of(text)];
    const auto now = clock::now();
    if (k.logged && now - k.last < interval_) {
      ++k.held;
      return;
    }
    if (k.held)
      held_back = " (and " + std::to_string(k.held) + " more like it in the last " +
                  seconds(now - k.last) + ")";
    k = {true, now, 0};
  }
  log_line(log_, std::string(text) + held_back);
}

LOOM_COMPILED_ONCE void log_limiter::flush() {
  std::unordered_map<std::string, kind> kinds;
  {
    std::lock_guard lk(m_);
    kinds.swap(kinds_);
  }
  for (const auto& [text, k] : kinds)
    if (k.held)
      log_line(log_, std::to_string(k.held) + " more line(s) like '" + text + "' were held back");
}

LOOM_COMPILED_ONCE std::string log_limiter::kind_of(std::string_view text) {
  std::string k;
  k.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const bool digit = text[i] >= '0' && text[i] <= '9';
    if (!digit)
      k.push_back(text[i]);
    else if (k.empty() || k.back() != '#')
      k.push_back('#');
  }
  return k;
}

LOOM_COMPILED_ONCE std::string log_limiter::seconds(clock::duration d) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  return std::to_string(ms / 1000) + "." + std::to_string(ms % 1000 / 100) + " s";
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

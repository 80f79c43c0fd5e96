// How soon a task notices that a peer is gone (docs/deploying.md, "Liveness"): a peer that
// stops answering (its process frozen, its host down, its link cut) fails the calls in
// flight to it with unavailable_error within heartbeat_timeout, not at the call's 5-minute
// deadline. Two mechanisms, one per kind of silence:
//
//   - the application heartbeat: while calls to a peer are in flight and nothing has come
//     from it for heartbeat_interval, the channel pings it; the peer's io thread answers
//     (never its handlers), and any byte received counts as life. Nothing for
//     heartbeat_timeout: the peer is declared dead ("ps task 0 at h:p stopped answering:
//     no heartbeat for 6 s"). It catches a frozen process, whose kernel still acknowledges.
//   - TCP keepalive (Linux: TCP_KEEPIDLE/KEEPINTVL/KEEPCNT): the kernel probes a connection
//     idle for keepalive_idle and drops it after keepalive_count unanswered probes
//     keepalive_interval apart; on both sides, so a server also lets go of a client whose
//     host vanished.
//
// A program takes the timeout from its environment, as it takes the cluster token:
//
//   LOOM_HEARTBEAT_TIMEOUT=6     seconds (a decimal: 0.5); 0 turns the heartbeat off
//
// which every cluster program's --heartbeat_timeout flag sets (cluster_resolver.hpp);
// servers and sessions take a liveness_settings in their options, nullopt meaning "the
// environment's". The heartbeat interval follows the timeout (a third of it) unless set.
#pragma once

#include <loom/cluster/environment.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

namespace loom {

struct liveness_settings {
  // No byte from a peer with calls in flight for this long: it is declared dead, and the
  // calls fail with unavailable_error naming it. 0: no heartbeat (calls wait for their
  // deadline, as before #21).
  std::chrono::milliseconds heartbeat_timeout{6000};
  // A ping after this long without a byte from the peer; 0: a third of heartbeat_timeout.
  std::chrono::milliseconds heartbeat_interval{0};
  // TCP keepalive; keepalive_idle 0: the system's settings (keepalive off). An idle
  // connection to a vanished host is let go after idle + count x interval, 10 s. Seven
  // probes, not three: on a link that loses 5 % of its packets each way, three probes in a
  // row go unanswered once in about a thousand idle spells, and the kernel then drops a
  // healthy connection (ETIMEDOUT) under the next call (docs/benchmarks.md, "Under delay,
  // loss and a bandwidth cap"); seven, once in ten million.
  std::chrono::milliseconds keepalive_idle{3000};
  std::chrono::milliseconds keepalive_interval{1000};
  int keepalive_count = 7;

  bool heartbeat() const noexcept { return heartbeat_timeout.count() > 0; }
  std::chrono::milliseconds ping_interval() const noexcept {
    if (heartbeat_interval.count() > 0)
      return heartbeat_interval;
    return std::max(std::chrono::milliseconds(1), heartbeat_timeout / 3);
  }
};

namespace detail {
// "6 s", "0.5 s": a duration as log lines and errors say it.
LOOM_COMPILED_ONCE std::string seconds_text(std::chrono::milliseconds d);
} // namespace detail

// The settings LOOM_HEARTBEAT_TIMEOUT gives (the defaults where it is unset). Throws
// invalid_argument_error naming the variable and its flag when it is not a number of
// seconds >= 0.
LOOM_COMPILED_ONCE liveness_settings
liveness_settings_from_environment(const environment& env = process_environment());

// The settings to use: the explicit ones when given, else the environment's.
inline liveness_settings
resolve_liveness(const std::optional<liveness_settings>& explicit_settings) {
  return explicit_settings ? *explicit_settings : liveness_settings_from_environment();
}

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE std::string seconds_text(std::chrono::milliseconds d) {
  const auto ms = d.count();
  std::string s = std::to_string(ms / 1000);
  if (ms % 1000) {
    std::string frac = std::to_string(1000 + ms % 1000).substr(1);
    while (frac.back() == '0')
      frac.pop_back();
    s += "." + frac;
  }
  return s + " s";
}
} // namespace loom::detail

namespace loom {

LOOM_COMPILED_ONCE liveness_settings liveness_settings_from_environment(const environment& env) {
  liveness_settings s;
  const auto v = env("LOOM_HEARTBEAT_TIMEOUT");
  if (!v || v->empty())
    return s;
  char* end = nullptr;
  const double secs = std::strtod(v->c_str(), &end);
  if (end != v->c_str() + v->size() || !std::isfinite(secs) || secs < 0 || secs > 86400)
    throw invalid_argument_error("LOOM_HEARTBEAT_TIMEOUT (--heartbeat_timeout) is \"" + *v +
                                 "\"; expected seconds from 0 (no heartbeat) to 86400, e.g. 6 "
                                 "or 0.5");
  s.heartbeat_timeout = std::chrono::milliseconds(std::llround(secs * 1000));
  if (secs > 0 && s.heartbeat_timeout.count() == 0)
    s.heartbeat_timeout = std::chrono::milliseconds(1);
  return s;
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

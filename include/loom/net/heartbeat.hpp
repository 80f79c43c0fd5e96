// A channel's heartbeat (channel_core.hpp; cluster/liveness_settings.hpp): while calls are
// in flight, a check every half ping interval, on a strand of its own. A peer silent for
// the ping interval is pinged on both connections (its io thread answers, whatever its
// handlers do); one silent for heartbeat_timeout is declared dead. Any byte received on
// either connection counts as life: a peer streaming a large reply, or answering pings
// while its handlers compute, is alive.
//
// The heartbeat decides when; its owner (the channel) says what there is to watch and what
// a death means (which calls fail, with what words).
#pragma once

#include <loom/cluster/liveness_settings.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/net/connection.hpp>
#include <loom/net/frame_header.hpp>
#include <loom/net/io_runtime.hpp>
#include <loom/net/out_frame.hpp>

#include <asio/bind_executor.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

namespace loom::net::detail {

class heartbeat {
public:
  using clock = std::chrono::steady_clock;

  // What a check looks at: the owner's connections, and when its calls in flight began
  // to be (the peer's silence counts from there at the latest).
  struct watch {
    std::shared_ptr<connection> control, bulk;
    clock::time_point busy_since;
  };

  // The heartbeat's owner. It arms the heartbeat (arm()) when a call is submitted and the
  // heartbeat is not armed; the heartbeat stays armed until watched() finds nothing to
  // watch or it calls declare_dead(). The owner keeps "armed" under the lock of its calls,
  // so a call submitted as the checks stop arms them again.
  class owner {
  public:
    virtual ~owner() = default;
    // The connections to watch; nullopt (no longer armed): stopped, no call in flight,
    // or no connection.
    virtual std::optional<watch> watched() = 0;
    // w's peer was silent for heartbeat_timeout (no longer armed): closes w's connections
    // unless they are no longer the owner's, failing the calls in flight with `why`.
    virtual void declare_dead(const watch& w, const std::string& why) = 0;
  };

  heartbeat(io_runtime& rt, const liveness_settings& live, std::shared_ptr<const std::string> peer)
      : rt_(rt), live_(live), peer_(std::move(peer)), strand_(asio::make_strand(rt.context())),
        timer_(strand_) {}

  // Starts the checks. `o` holds this heartbeat (its member) while one is scheduled.
  void arm(std::shared_ptr<owner> o) {
    rt_.run_on(strand_, [this, o = std::move(o)] { schedule(o); });
  }

  // Cancels a scheduled check: a timer still armed would hold the io thread until it fires.
  void cancel(std::shared_ptr<owner> o) {
    rt_.run_on(strand_, [this, keep = std::move(o)] { timer_.cancel(); });
  }

private:
  // (strand) The next check in half a ping interval (10 ms at the least).
  void schedule(const std::shared_ptr<owner>& o);

  // (strand) Pings a peer silent for the ping interval; declares one silent for
  // heartbeat_timeout dead.
  void check(const std::shared_ptr<owner>& o);

  io_runtime& rt_; // the owner's, which outlives it
  const liveness_settings live_;
  std::shared_ptr<const std::string> peer_;
  // strand only
  asio::strand<asio::io_context::executor_type> strand_;
  asio::steady_timer timer_;
  clock::time_point last_ping_{};
};

} // namespace loom::net::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net::detail {

LOOM_COMPILED_ONCE void heartbeat::schedule(const std::shared_ptr<owner>& o) {
  const auto tick = std::max(std::chrono::milliseconds(10), live_.ping_interval() / 2);
  timer_.expires_after(tick);
  timer_.async_wait(asio::bind_executor(strand_, [this, o](std::error_code ec) {
    if (!ec)
      check(o);
  }));
}

LOOM_COMPILED_ONCE void heartbeat::check(const std::shared_ptr<owner>& o) {
  const auto now = clock::now();
  const auto w = o->watched();
  if (!w)
    return;
  auto last = std::max(w->busy_since, w->control->last_received());
  if (w->bulk)
    last = std::max(last, w->bulk->last_received());
  const auto silence = now - last;
  if (silence >= live_.heartbeat_timeout) {
    o->declare_dead(*w, *peer_ + " stopped answering: no heartbeat for " +
                            loom::detail::seconds_text(live_.heartbeat_timeout));
    return;
  }
  if (silence >= live_.ping_interval() && now - last_ping_ >= live_.ping_interval()) {
    last_ping_ = now;
    w->control->send(out_frame(encode_heartbeat(frame_kind::ping)));
    if (w->bulk) // its io thread may be another, free where the control's is busy
      w->bulk->send(out_frame(encode_heartbeat(frame_kind::ping)));
  }
  schedule(o);
}

} // namespace loom::net::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

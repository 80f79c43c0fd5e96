// A connection's liveness (connection.hpp): when it last received a byte, whether it is in
// the middle of a frame, and TCP keepalive on its socket. The channel's heartbeat
// (heartbeat.hpp) asks how long a connection has been silent; the server's eviction of idle
// clients (server_registry.hpp) asks how long it has been idle. Pings themselves are
// answered by the connection's read loop (frame_reader.hpp), on the io thread, whatever
// the handlers are doing.
#pragma once

#include <loom/cluster/liveness_settings.hpp>
#include <loom/core/compiled_once.hpp>

#include <asio/ip/tcp.hpp>
#include <asio/socket_base.hpp>

#ifdef __linux__
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <system_error>

namespace loom::net {

// Written by the connection's read loop (its strand), read from any thread: atomics,
// relaxed (a reader wants a recent value, not an ordering).
class link_activity {
public:
  using clock = std::chrono::steady_clock;

  static clock::rep now() noexcept { return clock::now().time_since_epoch().count(); }

  // Bytes arrived at `at` (now()).
  void received(clock::rep at) noexcept { last_read_.store(at, std::memory_order_relaxed); }
  // Between a header's first byte and the frame's delivery: not idle, however long it takes.
  void in_frame(bool yes) noexcept { in_frame_.store(yes, std::memory_order_relaxed); }

  // How long ago the connection last received a byte; zero while it is in the middle of a
  // frame (it is not idle then).
  clock::duration idle_for(clock::time_point now) const {
    if (in_frame_.load(std::memory_order_relaxed))
      return {};
    return now.time_since_epoch() - clock::duration(last_read_.load(std::memory_order_relaxed));
  }

  // When the connection last received a byte (a frame's middle included).
  clock::time_point last_received() const noexcept {
    return clock::time_point(clock::duration(last_read_.load(std::memory_order_relaxed)));
  }

private:
  std::atomic<bool> in_frame_{false};
  std::atomic<clock::rep> last_read_{now()};
};

// TCP keepalive as `l` says (cluster/liveness_settings.hpp), after connect/accept: the
// kernel drops an idle connection whose peer's host stops answering probes (Linux;
// elsewhere SO_KEEPALIVE with the system's timing). No TCP_USER_TIMEOUT: it would also
// drop a connection whose peer keeps its window closed that long (Linux >= 5.10 counts
// acknowledged zero-window probes), i.e. a busy peer that has not read yet; a call in
// flight is watched by the channel's heartbeat instead.
LOOM_COMPILED_ONCE void enable_keepalive(asio::ip::tcp::socket& sock, const liveness_settings& l);

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net {

LOOM_COMPILED_ONCE void enable_keepalive(asio::ip::tcp::socket& sock, const liveness_settings& l) {
  if (l.keepalive_idle.count() <= 0)
    return;
  std::error_code ec;
  sock.set_option(asio::socket_base::keep_alive(true), ec);
#ifdef __linux__
  const int fd = sock.native_handle();
  const auto secs = [](std::chrono::milliseconds d) {
    return static_cast<int>(std::max<std::int64_t>(1, (d.count() + 999) / 1000));
  };
  const int idle = secs(l.keepalive_idle), interval = secs(l.keepalive_interval),
            count = std::max(1, l.keepalive_count);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
#endif
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// How a channel (channel_core.hpp) reaches its peer: open() makes one connection of a role
// (resolved, connected, keepalive on, through its handshake, TLS first where there is
// TLS), and retry() repeats a whole attempt with exponential backoff until a time limit,
// logging whom it waits for at the first failure and then once per log_interval, not once
// per attempt. stop() ends both for good: the connections being opened are handed back to
// be closed, and a wait between attempts ends with cancelled_error.
//
// The dialer knows who the channel is (its token, client id, process id) and where the
// peer is; what a connection is for once open (the calls) is the channel's.
#pragma once

#include <loom/cluster/liveness_settings.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/net/address.hpp>
#include <loom/net/auth.hpp>
#include <loom/net/channel_options.hpp>
#include <loom/net/connection.hpp>
#include <loom/net/frame.hpp>
#include <loom/net/handshake.hpp>
#include <loom/net/io_runtime.hpp>
#include <loom/net/log.hpp>
#include <loom/net/tls.hpp>

#include <asio/connect.hpp>
#include <asio/error.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <unordered_set>
#include <utility>
#include <vector>

namespace loom::net::detail {

// What a call or a connect meets once its channel was stopped.
inline cancelled_error channel_stopped_error(const std::string& peer) {
  return cancelled_error("the channel to " + peer + " was stopped");
}

class dialer {
public:
  using tcp = asio::ip::tcp;
  using clock = std::chrono::steady_clock;

  // Parses `address` and resolves the token and TLS (o.token, o.tls, else the
  // environment): a bad address or TLS setting fails here, before any connect.
  dialer(std::string address, std::shared_ptr<const std::string> peer, const channel_options& o,
         std::uint64_t client_id);

  std::uint64_t client_id() const noexcept { return who_.client_id; }

  // Runs attempt() until it returns, retrying its unavailable and deadline_exceeded errors
  // with exponential backoff (initial_backoff doubling to max_backoff) until `limit`; then
  // unavailable_error with the last error and the attempts made. Any other error of
  // attempt() ends it at once (unauthenticated: retrying cannot help).
  template <class Attempt> void retry(clock::time_point limit, Attempt&& attempt) {
    auto backoff = initial_backoff_;
    const auto start = clock::now();
    std::optional<clock::time_point> last_line;
    for (int n = 1;; ++n) {
      std::string why;
      try {
        attempt();
        if (n > 1)
          log_line(log_, "connected to " + *peer_ + " after " + std::to_string(n) + " attempts",
                   logging::level::info);
        return;
      } catch (const unavailable_error& e) {
        why = e.message();
      } catch (const deadline_exceeded_error& e) {
        why = e.message();
      }
      const auto now = clock::now();
      {
        std::unique_lock lk(mu_);
        if (stopped_)
          throw channel_stopped_error(*peer_);
        if (now >= limit) {
          const auto ms =
              std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count();
          throw unavailable_error(*peer_ + " is unavailable: " + why + " (gave up after " +
                                  std::to_string(n) + " attempt(s) in " + std::to_string(ms) +
                                  " ms)");
        }
        const auto wait = std::min<clock::duration>(backoff, limit - now);
        if (!last_line || now - *last_line >= log_interval_) {
          const auto ms = [](clock::duration d) {
            return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
          };
          log_line(log_,
                   (last_line ? "still waiting for " : "waiting for ") + *peer_ + " (attempt " +
                       std::to_string(n) + " in " + ms(now - start) + " ms: " + why +
                       "); retrying in " + ms(wait) + " ms",
                   logging::level::info);
          last_line = now;
        }
        wake_.wait_for(lk, wait, [&] { return stopped_; });
        if (stopped_)
          throw channel_stopped_error(*peer_);
      }
      backoff = std::min(backoff * 2, max_backoff_);
    }
  }

  // One connection of `role` on rt, handshake included, its frames not yet read (the
  // caller starts it). Throws unavailable_error (retryable), unauthenticated_error or
  // other errors (not retried), cancelled_error once stopped.
  std::shared_ptr<connection> open(const std::shared_ptr<io_runtime>& rt, connection_role role,
                                   clock::time_point limit, const liveness_settings& keepalive);

  // Whether a connection is being opened (the io thread must drive it).
  bool connecting() const {
    std::lock_guard lk(mu_);
    return !connecting_.empty();
  }

  // Stops for good; returns the connections being opened, for the caller to close.
  std::vector<std::shared_ptr<connection>> stop();

private:
  // The peer's endpoints: its address as given, else what its host name resolves to.
  std::vector<tcp::endpoint> resolve(io_runtime& rt) const;

  std::string address_;
  host_port hp_;
  std::shared_ptr<const std::string> peer_;
  client_identity who_;              // role set per connection
  std::shared_ptr<tls_context> tls_; // null: no TLS
  frame_limits limits_;
  log_fn log_;
  std::chrono::milliseconds initial_backoff_, max_backoff_, log_interval_;

  mutable std::mutex mu_;
  std::condition_variable wake_; // a wait between attempts; stop() ends it
  bool stopped_ = false;
  std::unordered_set<std::shared_ptr<connection>> connecting_;
};

} // namespace loom::net::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net::detail {

LOOM_COMPILED_ONCE dialer::dialer(std::string address, std::shared_ptr<const std::string> peer,
                                  const channel_options& o, std::uint64_t client_id)
    : address_(std::move(address)), hp_(parse_host_port(address_)), peer_(std::move(peer)),
      limits_(o.limits), log_(o.log), initial_backoff_(o.initial_backoff),
      max_backoff_(o.max_backoff), log_interval_(o.log_interval) {
  who_.token = resolve_token(o.token);
  who_.client_id = client_id;
  who_.process_id = o.process_id;
  tls_ = make_tls_context(resolve_tls(o.tls), who_.token, tls_role::client);
}

LOOM_COMPILED_ONCE auto dialer::open(const std::shared_ptr<io_runtime>& rt, connection_role role,
                                     clock::time_point limit, const liveness_settings& keepalive)
    -> std::shared_ptr<connection> {
  auto eps = resolve(*rt);
  auto c = std::make_shared<connection>(rt, limits_, log_);
  c->set_peer(address_);
  if (tls_)
    c->use_tls(tls_);
  {
    std::lock_guard lk(mu_);
    if (stopped_)
      throw channel_stopped_error(*peer_);
    connecting_.insert(c);
  }
  // Settled once, by whichever comes first: the handshake's end, or a failed connect
  // (the deadline closes the socket: operation_aborted).
  struct attempt {
    std::promise<void> p;
    std::atomic<bool> settled{false};
    void fail(std::exception_ptr e) {
      if (!settled.exchange(true))
        p.set_exception(std::move(e));
    }
    void ok() {
      if (!settled.exchange(true))
        p.set_value();
    }
  };
  auto at = std::make_shared<attempt>();
  auto fut = at->p.get_future();
  // The handlers hold what they use (they may outlive this call): the peer's name, who
  // we are, the keepalive settings.
  auto who = who_;
  who.role = role;
  c->run([c, at, eps = std::move(eps), limit, peer = peer_, who = std::move(who), keepalive] {
    if (c->closed()) {
      at->fail(std::make_exception_ptr(channel_stopped_error(*peer)));
      return;
    }
    c->arm_deadline(limit, "connecting to " + *peer);
    asio::async_connect(
        c->socket(), eps, [c, at, peer, who, keepalive](std::error_code ec, const tcp::endpoint&) {
          if (ec) {
            at->fail(make_error(error_code::unavailable, ec == asio::error::operation_aborted
                                                             ? "timed out connecting"
                                                             : ec.message()));
            c->close("connect failed");
            return;
          }
          c->configure_socket();
          c->enable_keepalive(keepalive);
          start_client_handshake(c, who, *peer, [at](std::exception_ptr e) {
            if (e)
              at->fail(std::move(e));
            else
              at->ok();
          });
        });
  });
  std::exception_ptr err;
  try {
    fut.get();
  } catch (...) {
    err = std::current_exception();
  }
  {
    std::lock_guard lk(mu_);
    connecting_.erase(c);
  }
  if (err) {
    c->close("connect failed");
    std::rethrow_exception(err);
  }
  return c;
}

LOOM_COMPILED_ONCE auto dialer::stop() -> std::vector<std::shared_ptr<connection>> {
  std::vector<std::shared_ptr<connection>> conns;
  {
    std::lock_guard lk(mu_);
    stopped_ = true;
    conns.assign(connecting_.begin(), connecting_.end());
  }
  wake_.notify_all();
  return conns;
}

LOOM_COMPILED_ONCE auto dialer::resolve(io_runtime& rt) const -> std::vector<tcp::endpoint> {
  std::vector<tcp::endpoint> eps;
  std::error_code ec;
  const auto addr = asio::ip::make_address(hp_.host, ec);
  if (!ec) {
    eps.emplace_back(addr, hp_.port);
    return eps;
  }
  tcp::resolver res(rt.context());
  auto r = res.resolve(hp_.host, std::to_string(hp_.port), ec);
  if (ec)
    throw unavailable_error("cannot resolve '" + hp_.host + "': " + ec.message());
  for (const auto& e : r)
    eps.push_back(e.endpoint());
  return eps;
}

} // namespace loom::net::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

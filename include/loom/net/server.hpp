// net::rpc_server: serves requests on host:port, dispatching each by its method
// name to a registered handler. See rpc.hpp for an example.
//
// - Binding beyond loopback requires a cluster token (auth.hpp) or TLS with
//   certificates (tls.hpp: its peers are then authenticated by their certificates),
//   unless insecure mode is requested (rpc_server_options::allow_insecure or
//   LOOM_ALLOW_INSECURE=1).
// - With TLS (rpc_server_options::tls, else LOOM_TLS...) every connection is encrypted,
//   and a client without TLS is refused with an error that says so (handshake.hpp).
//   A server without a token says so once when it starts listening (unless the program
//   chose none itself, token = ""): any local user can connect to it.
// - Handlers run on the io threads, on the strand of the connection the request
//   came from: keep them short, or hold the responder and reply later from any
//   thread (a barrier that answers when a step is applied).
// - A connection's first request moves it (its socket, reads and handlers) to the io
//   thread that serves its client's process (the hello names it), a process new to
//   the server to the thread serving the fewest processes: a ps serves each worker's
//   step on one thread and two workers' on two. The threads take sockets round-robin
//   as they are accepted, before a connection says whose it is. Idle connections (a
//   client's unused bulk one) count nowhere. TLS connections stay (settle()).
// - A payload may be received straight into a tensor the handler's allocator
//   returns (e.g. a variable's buffer).
// - Each (client id, request id) runs at most once: a duplicate within the
//   window gets already_exists_error.
// - Hostile or broken peers cannot exhaust the server (docs/wire-protocol.md, "Hostile
//   peers"): the memory held for frames not yet received is charged as bytes arrive and
//   bounded per connection and in total (receive_budget.hpp); connections still in their
//   handshake and connections past it are capped, the oldest handshake and the idlest
//   client giving way; a failed accept (out of file descriptors) backs off, with a
//   descriptor kept in reserve to take the waiting peer; repeated lines are logged once
//   per interval with a count.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/net/auth.hpp>
#include <loom/net/connection.hpp>
#include <loom/net/frame.hpp>
#include <loom/net/handshake.hpp>
#include <loom/net/log.hpp>
#include <loom/net/receive_budget.hpp>
#include <loom/net/request.hpp>
#include <loom/net/server_options.hpp>
#include <loom/net/server_registry.hpp>
#include <loom/net/tls.hpp>

#include <asio/bind_executor.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>

#if defined(__unix__) || defined(__APPLE__)
#include <cerrno>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>
#define LOOM_NET_RESERVE_FD 1
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace loom::net {

namespace detail {

struct request_key {
  std::uint64_t client, id;
  bool operator==(const request_key&) const = default;
};
struct request_key_hash {
  std::size_t operator()(const request_key& k) const noexcept {
    return std::hash<std::uint64_t>{}(k.client ^ (k.id * 0x9E3779B97F4A7C15ull));
  }
};

inline bool is_loopback_host(const asio::ip::address& a) {
  return a.is_loopback();
}

class server_core;

// The sink of one admitted connection: its frames go to the server, with what the server
// knows of its client (served_connection, server_registry.hpp).
class served_sink final : public served_connection {
public:
  served_sink(std::shared_ptr<server_core> core, const hello_msg& hello)
      : served_connection(hello), core_(std::move(core)) {}

  any_tensor destination(connection& c, const frame_header& h, const frame_meta& m,
                         std::string_view user, std::size_t i, const payload_info& p) override;
  void on_frame(const std::shared_ptr<connection>& c, incoming_frame&& f) override;
  void on_closed(const std::shared_ptr<connection>& c, const std::string& reason) override;

private:
  std::shared_ptr<server_core> core_;
};

class server_core final : public reply_router, public std::enable_shared_from_this<server_core> {
public:
  using tcp = asio::ip::tcp;

  explicit server_core(rpc_server_options o) : opts_(std::move(o)) {}

  void start();

  // rpc_server::stop().
  void stop(std::chrono::milliseconds grace);

  server_stats stats();

  void add_handler(std::string method, handler_fn h, allocator_fn a) {
    std::unique_lock lk(hmu_);
    handlers_[std::move(method)] = entry{std::move(h), std::move(a)};
  }

  std::uint16_t port() const noexcept { return port_; }
  const std::string& address() const noexcept { return address_; }
  const rpc_server_options& options() const noexcept { return opts_; }

  // A reply with at least bulk_threshold payload bytes to a request that came over a
  // client's control connection goes over its bulk connection, when it has one open.
  std::shared_ptr<connection> route(const reply_state& st, std::uint64_t payload_bytes) override;

  // ---- what an admitted connection's sink passes on (served_sink) ----
  any_tensor destination(served_connection& s, connection& c, const frame_header& h,
                         const frame_meta& m, std::string_view user, std::size_t i,
                         const payload_info& p);

  void on_frame(served_connection& s, const std::shared_ptr<connection>& c, incoming_frame&& f);

  void untrack(const std::shared_ptr<connection>& c) { registry_->untrack(c); }

private:
  struct entry {
    handler_fn handler;
    allocator_fn alloc;
  };

  // c's first request (on c's strand): the io context it is served on from now on. One
  // client process's connections share one context: a worker's step here arrives over its
  // master's control connection and its peer client's control and bulk ones, and served by
  // one thread it hands nothing between threads. (#23: a ps's two threads each serving one
  // worker's control and the other's bulk connections, as the order of accepts left them
  // in half of the runs, made every step of both hop between the threads, and the
  // cluster 15-20 % slower.) A process's first connection goes to the context serving the
  // fewest processes, its own where that is one of them (no move). Counted until the
  // process's last connection is forgotten. A TLS connection stays where it was accepted
  // and counts nowhere (asio's OpenSSL stream is bound to its socket object).
  void settle(const std::shared_ptr<connection>& c, std::uint64_t process_id);

  bool remember(const request_key& k);

  // Closes connections chosen to make room (outside the registry's lock), saying why once per
  // interval.
  void evict(const std::vector<std::shared_ptr<connection>>& victims, const std::string& why) {
    for (const auto& v : victims) {
      log_line(log_, "closed the connection from " + v->peer() + ": " + why);
      v->close(why);
    }
  }

  // ---- accepting (acceptor strand) ----

  void accept_next();

  void on_accepted(const std::shared_ptr<connection>& c, std::error_code ec);

  void retry_accept_after(std::chrono::milliseconds wait);

  // A socket was accepted: it starts its handshake. Past max_handshaking_connections the
  // oldest still in its handshake is closed: an honest client finishes in one round trip,
  // so the oldest is the likeliest to be a socket that never speaks, and closing it
  // (rather than refusing the newcomer) lets a client in while such sockets pile up.
  void serve(const std::shared_ptr<connection>& c);

  enum class room { none, made, served };

  // Out of file descriptors with a peer waiting. The descriptor kept in reserve takes the
  // peer, and a connection is given up for it (the oldest in its handshake, else the
  // idlest client): served. With none to give up, the peer is refused at once (closed)
  // rather than left waiting in the backlog: none. Without the reserve (not yet reopened),
  // a connection is given up so that the next try succeeds: made.
  room make_room_for_peer();

  // Gives up one connection (to free its descriptor): the oldest still in its handshake,
  // else the client idle the longest. False when there is none to give up.
  bool make_room() {
    std::string why;
    const auto victims = registry_->give_up_one(opts_.idle_eviction_grace, why);
    evict(victims, why);
    return !victims.empty();
  }

#ifdef LOOM_NET_RESERVE_FD
  void reopen_reserve() {
    if (reserve_fd_ < 0)
      reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  void close_reserve() {
    if (reserve_fd_ >= 0)
      ::close(reserve_fd_);
    reserve_fd_ = -1;
  }
#else
  void reopen_reserve() {}
  void close_reserve() {}
#endif

  // Admits a connection whose handshake succeeded; at max_connections the idlest client
  // gives way, or, when none may, the newcomer is refused (resource_exhausted).
  std::shared_ptr<frame_sink> admit(const std::shared_ptr<connection>& c, const hello_msg& hello);

  // Server side of the handshake (handshake.hpp), on c's strand.
  void handshake(const std::shared_ptr<connection>& c);

  rpc_server_options opts_;
  std::optional<std::string> token_;
  std::shared_ptr<tls_context> tls_; // null: no TLS
  liveness_settings live_;
  std::shared_ptr<io_runtime> rt_;
  std::shared_ptr<log_limiter> limiter_;
  log_fn log_; // through limiter_: the lines about peers, which a flood would repeat
  std::shared_ptr<receive_budget> budget_;
  std::optional<asio::strand<asio::io_context::executor_type>> acceptor_strand_;
  std::optional<tcp::acceptor> acceptor_;
  tcp protocol_ = tcp::v4();
  // acceptor strand only
  std::optional<asio::steady_timer> accept_timer_;
  std::chrono::milliseconds backoff_{0};
  int reserve_fd_ = -1;
  std::uint16_t port_ = 0;
  std::string address_;

  std::shared_mutex hmu_;
  std::unordered_map<std::string, entry> handlers_;

  std::optional<server_registry> registry_; // from start(): who it serves

  std::mutex dmu_;
  std::unordered_set<request_key, request_key_hash> seen_;
  std::deque<request_key> order_;
};

inline any_tensor served_sink::destination(connection& c, const frame_header& h,
                                           const frame_meta& m, std::string_view user,
                                           std::size_t i, const payload_info& p) {
  return core_->destination(*this, c, h, m, user, i, p);
}
inline void served_sink::on_frame(const std::shared_ptr<connection>& c, incoming_frame&& f) {
  core_->on_frame(*this, c, std::move(f));
}
inline void served_sink::on_closed(const std::shared_ptr<connection>& c, const std::string&) {
  core_->untrack(c);
}

} // namespace detail

class rpc_server {
public:
  // Binds and starts serving at once. Throws unavailable_error naming the
  // address (port in use, bad host) or failed_precondition_error (a
  // non-loopback address without a token and without insecure mode).
  explicit rpc_server(rpc_server_options opts = {})
      : core_(std::make_shared<detail::server_core>(std::move(opts))) {
    core_->start();
  }
  rpc_server(const rpc_server&) = delete;
  rpc_server& operator=(const rpc_server&) = delete;
  ~rpc_server() { stop(); }

  // Registers (or replaces) the handler of `method`; thread-safe.
  void handle(std::string method, handler_fn h, allocator_fn alloc = {}) {
    core_->add_handler(std::move(method), std::move(h), std::move(alloc));
  }

  std::uint16_t port() const noexcept { return core_->port(); }
  // "host:port" with the bound port.
  const std::string& address() const noexcept { return core_->address(); }

  // Connections and the memory held for frames not yet received in full, now.
  server_stats stats() const { return core_->stats(); }

  // Closes the listener and every connection, joins the io threads. Idempotent.
  // Without a grace period calls in flight fail on their clients with unavailable_error.
  // With one the server first answers what it accepted: it waits at most `grace` for
  // every request received to be answered (those that arrive meanwhile too), then
  // closes each connection once its replies are written and its client has them (the
  // client closed too, or acknowledged every byte: connection::finish), waiting at most
  // `grace` again (a second at least). Not from a handler: it waits for the io threads.
  void stop(std::chrono::milliseconds grace = {}) { core_->stop(grace); }

private:
  std::shared_ptr<detail::server_core> core_;
};

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net::detail {

LOOM_COMPILED_ONCE void server_core::start() {
  token_ = resolve_token(opts_.token);
  const tls_settings tls = resolve_tls(opts_.tls);
  tls_ = make_tls_context(tls, token_, tls_role::server); // before any socket: files, token
  live_ = resolve_liveness(opts_.liveness);
  // Peers with a certificate the CA signed are authenticated as much as with a token.
  const bool authenticated = token_ || tls.mode == tls_mode::certificates;
  const bool insecure = opts_.allow_insecure || insecure_from_environment();
  const std::string requested = join_address(opts_.host, opts_.port);

  // Resolve the host first: a non-loopback bind without a token is refused
  // before any socket exists.
  std::error_code ec;
  auto addr = asio::ip::make_address(opts_.host, ec);
  if (ec) {
    asio::io_context tmp;
    tcp::resolver res(tmp);
    auto r = res.resolve(opts_.host, std::to_string(opts_.port), ec);
    if (ec || r.empty())
      throw unavailable_error("cannot listen on " + requested + ": cannot resolve host '" +
                              opts_.host + "'" + (ec ? ": " + ec.message() : ""));
    addr = r.begin()->endpoint().address();
  }
  if (!authenticated && !is_loopback_host(addr) && !insecure)
    throw failed_precondition_error(
        "refusing to serve on " + requested + (addr.is_unspecified() ? " (every interface)" : "") +
        " without a cluster token: anyone who can reach that address could run requests. "
        "Set LOOM_CLUSTER_TOKEN (or LOOM_CLUSTER_TOKEN_FILE) for every task, use TLS with "
        "certificates (LOOM_TLS_CERT, LOOM_TLS_KEY, LOOM_TLS_CA), or opt into insecure mode "
        "(rpc_server_options::allow_insecure or LOOM_ALLOW_INSECURE=1)");

  rt_ = std::make_shared<io_runtime>(opts_.threads, opts_.log);
  registry_.emplace(rt_->size());
  limiter_ = std::make_shared<log_limiter>(opts_.log, opts_.log_interval);
  log_ = log_limiter::through(limiter_);
  budget_ = std::make_shared<receive_budget>(opts_.max_pending_bytes,
                                             opts_.max_pending_bytes_per_connection);
  acceptor_strand_.emplace(asio::make_strand(rt_->context()));
  acceptor_.emplace(*acceptor_strand_);
  accept_timer_.emplace(*acceptor_strand_);
  const tcp::endpoint ep(addr, opts_.port);
  protocol_ = ep.protocol();
  acceptor_->open(ep.protocol(), ec);
  if (!ec)
    acceptor_->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec)
    acceptor_->bind(ep, ec);
  if (!ec)
    acceptor_->listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) // accept_with_reserve() accepts without waiting
    acceptor_->native_non_blocking(true, ec);
  if (ec) {
    std::error_code ignored;
    acceptor_->close(ignored);
    throw unavailable_error("cannot listen on " + to_string(ep) + ": " + ec.message());
  }
  port_ = acceptor_->local_endpoint().port();
  address_ =
      join_address(opts_.advertised_host.empty() ? opts_.host : opts_.advertised_host, port_);
  // Said once, so that whoever runs a tokenless task learns that others can reach it;
  // not when the program chose no token itself (token = "": a test, a deliberate setup).
  if (!authenticated && !opts_.token)
    log_line(opts_.log,
             "serving " + address_ + " without a cluster token: " +
                 (is_loopback_host(addr) ? "any local user" : "anyone who can reach it") +
                 " can connect and run requests (set LOOM_CLUSTER_TOKEN or "
                 "LOOM_CLUSTER_TOKEN_FILE for every task, or start the cluster with "
                 "loom-launch, which generates one)");
  rt_->run_on(*acceptor_strand_, [self = shared_from_this()] { self->accept_next(); });
}

LOOM_COMPILED_ONCE void server_core::stop(std::chrono::milliseconds grace) {
  using clock = std::chrono::steady_clock;
  if (!registry_)
    return;
  auto conns = registry_->stop(); // from now on no connection is admitted
  if (!conns)
    return;
  rt_->run_on(*acceptor_strand_, [self = shared_from_this()] {
    std::error_code ec;
    self->acceptor_->close(ec);
    self->accept_timer_->cancel();
    self->close_reserve();
  });
  const auto wait_until = [](clock::time_point deadline, const auto& done) {
    while (!done() && clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  };
  if (grace.count() > 0) {
    wait_until(clock::now() + grace, [&] { return registry_->unanswered() == 0; });
    for (auto& c : *conns)
      c->finish("the server is stopping");
    const auto closing = std::max(grace, connection::linger_time + std::chrono::milliseconds(100));
    wait_until(clock::now() + closing, [&] {
      return std::all_of(conns->begin(), conns->end(), [](const auto& c) { return c->closed(); });
    });
  }
  for (auto& c : *conns)
    c->close("the server is stopping");
  rt_->shutdown();
  limiter_->flush();
  registry_->clear();
}

LOOM_COMPILED_ONCE auto server_core::stats() -> server_stats {
  server_stats st;
  if (registry_)
    std::tie(st.connections, st.handshaking) = registry_->counts();
  st.pending_bytes = budget_ ? budget_->held() : 0;
  return st;
}

LOOM_COMPILED_ONCE auto server_core::route(const reply_state& st, std::uint64_t payload_bytes)
    -> std::shared_ptr<connection> {
  if (payload_bytes < opts_.bulk_threshold || st.served->role != connection_role::control)
    return nullptr;
  auto b = registry_->bulk_for(st.client_id);
  return b && !b->closed() ? b : nullptr;
}

LOOM_COMPILED_ONCE auto server_core::destination(served_connection& s, connection& c,
                                                 const frame_header& h, const frame_meta& m,
                                                 std::string_view user, std::size_t i,
                                                 const payload_info& p) -> any_tensor {
  if (h.kind != frame_kind::request)
    return {};
  allocator_fn a;
  {
    std::shared_lock lk(hmu_);
    auto it = handlers_.find(m.env.method);
    if (it == handlers_.end() || !it->second.alloc)
      return {};
    a = it->second.alloc;
  }
  return a(request_preview{m.env.method, user, c.peer(), s.client_id, h.request_id}, i, p);
}

LOOM_COMPILED_ONCE void server_core::on_frame(served_connection& s,
                                              const std::shared_ptr<connection>& c,
                                              incoming_frame&& f) {
  if (!std::exchange(s.settled, true))
    settle(c, s.process_id);
  if (f.header.kind == frame_kind::cancel)
    return; // the client already gave up; nothing runs twice
  if (f.header.kind != frame_kind::request) {
    log_line(log_, "unexpected " + std::string(to_string(f.header.kind)) + " frame from " +
                       c->peer() + "; ignored");
    return;
  }
  auto st = std::make_shared<reply_state>();
  s.in_flight.fetch_add(1, std::memory_order_relaxed); // until it is answered (uncount())
  st->conn = c;
  st->served = s.shared_from_this();
  st->router = weak_from_this();
  st->id = f.header.request_id;
  st->client_id = s.client_id;
  st->method = f.meta.env.method;

  if (!remember(request_key{s.client_id, st->id})) {
    st->done = true;
    responder::send_error(*st, error_code::already_exists,
                          "request " + std::to_string(st->id) + " ('" + st->method +
                              "') from this client was already received (a duplicate after a "
                              "retry?); it is not run twice");
    return;
  }
  handler_fn h;
  {
    std::shared_lock lk(hmu_);
    auto it = handlers_.find(st->method);
    if (it != handlers_.end())
      h = it->second.handler;
  }
  if (!h) {
    st->done = true;
    responder::send_error(*st, error_code::unimplemented,
                          "no handler for method '" + st->method + "' on server " + address_);
    return;
  }
  if (!f.buffer_error.empty()) {
    st->done = true;
    responder::send_error(*st, error_code::invalid_argument,
                          "request '" + st->method + "': " + f.buffer_error);
    return;
  }
  request req;
  req.frame_ = std::move(f);
  req.peer_ = c->peer();
  req.client_id_ = s.client_id;
  try {
    h(std::move(req), responder(st));
  } catch (const loom::error& e) {
    if (!st->done.exchange(true))
      responder::send_error(*st, e.code(), e.message());
    else
      log_line(opts_.log, "handler of '" + st->method + "' threw after replying: " + e.what());
  } catch (const std::exception& e) {
    if (!st->done.exchange(true))
      responder::send_error(*st, error_code::internal,
                            "the handler of '" + st->method + "' threw: " + e.what());
    else
      log_line(opts_.log, "handler of '" + st->method + "' threw after replying: " + e.what());
  }
}

LOOM_COMPILED_ONCE void server_core::settle(const std::shared_ptr<connection>& c,
                                            std::uint64_t process_id) {
  if (c->secure())
    return;
  if (auto home = registry_->home(c, process_id, rt_->index_of(c->context())))
    c->move_to(rt_->context_at(*home));
}

LOOM_COMPILED_ONCE bool server_core::remember(const request_key& k) {
  std::lock_guard lk(dmu_);
  if (!seen_.insert(k).second)
    return false;
  order_.push_back(k);
  while (order_.size() > opts_.dedupe_window) {
    seen_.erase(order_.front());
    order_.pop_front();
  }
  return true;
}

LOOM_COMPILED_ONCE void server_core::accept_next() {
  reopen_reserve();
  auto c = std::make_shared<connection>(rt_, opts_.limits, log_);
  acceptor_->async_accept(
      c->socket(),
      asio::bind_executor(*acceptor_strand_, [self = shared_from_this(), c](std::error_code ec) {
        self->on_accepted(c, ec);
      }));
}

LOOM_COMPILED_ONCE void server_core::on_accepted(const std::shared_ptr<connection>& c,
                                                 std::error_code ec) {
  if (ec == asio::error::operation_aborted)
    return;
  if (registry_->stopping())
    return;
  if (!ec) {
    backoff_ = {};
    serve(c);
    return accept_next();
  }
  const bool out_of_descriptors =
      ec == asio::error::no_descriptors || ec == std::errc::too_many_files_open_in_system;
  const auto outcome = out_of_descriptors ? make_room_for_peer() : room::none;
  if (outcome == room::served)
    return accept_next(); // the waiting peer is served: a descriptor was given up for it
  if (outcome == room::made) {
    // A descriptor is being given up (its connection closes on its own strand): try
    // again shortly, without counting this as a failure.
    return retry_accept_after(opts_.accept_backoff);
  }
  // Never re-arm at once: the error would come straight back (a full descriptor table
  // makes every accept fail while the peer waits in the backlog), spinning a core and
  // writing a line per try. Back off, doubling, and log once per interval.
  backoff_ = backoff_.count() == 0 ? opts_.accept_backoff
                                   : std::min(backoff_ * 2, opts_.max_accept_backoff);
  log_line(log_, "accepting a connection on " + address_ + " failed: " + ec.message() +
                     (out_of_descriptors ? " (no connection could be given up for it)" : "") +
                     "; retrying in " + std::to_string(backoff_.count()) + " ms");
  retry_accept_after(backoff_);
}

LOOM_COMPILED_ONCE void server_core::retry_accept_after(std::chrono::milliseconds wait) {
  accept_timer_->expires_after(wait);
  accept_timer_->async_wait(
      asio::bind_executor(*acceptor_strand_, [self = shared_from_this()](std::error_code e) {
        if (!e)
          self->accept_next();
      }));
}

LOOM_COMPILED_ONCE void server_core::serve(const std::shared_ptr<connection>& c) {
  evict(registry_->track(c, opts_.max_handshaking_connections),
        "it had not finished its handshake, the oldest of more than "
        "max_handshaking_connections (" +
            std::to_string(opts_.max_handshaking_connections) + ")");
  c->attach_budget(budget_);
  c->configure_socket();
  c->enable_keepalive(live_);
  c->run([self = shared_from_this(), c] { self->handshake(c); });
}

LOOM_COMPILED_ONCE auto server_core::make_room_for_peer() -> room {
#ifdef LOOM_NET_RESERVE_FD
  if (reserve_fd_ < 0)
    return make_room() ? room::made : room::none;
  close_reserve();
  const int fd = ::accept(acceptor_->native_handle(), nullptr, nullptr);
  if (fd < 0) {
    const bool gone = errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED;
    reopen_reserve();
    return gone ? room::made : room::none; // gone: the peer left the backlog; try again
  }
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  if (!make_room()) {
    ::close(fd);
    reopen_reserve();
    return room::none;
  }
  auto c = std::make_shared<connection>(rt_, opts_.limits, log_);
  std::error_code ec;
  c->socket().assign(protocol_, fd, ec);
  if (ec) {
    ::close(fd);
    return room::made;
  }
  serve(c);
  return room::served; // the reserve is reopened once the descriptor given up is closed
#else
  return make_room() ? room::made : room::none;
#endif
}

LOOM_COMPILED_ONCE auto server_core::admit(const std::shared_ptr<connection>& c,
                                           const hello_msg& hello) -> std::shared_ptr<frame_sink> {
  auto sink = std::make_shared<served_sink>(shared_from_this(), hello);
  std::vector<std::shared_ptr<connection>> evicted;
  if (!registry_->admit(c, sink, opts_.max_connections, opts_.idle_eviction_grace, address_,
                        evicted))
    return nullptr; // stopping, or given up meanwhile (closing)
  evict(evicted, "the server was at max_connections (" + std::to_string(opts_.max_connections) +
                     ") and its client was the idlest");
  return sink;
}

LOOM_COMPILED_ONCE void server_core::handshake(const std::shared_ptr<connection>& c) {
  auto self = shared_from_this();
  start_server_handshake(
      c, token_, tls_, address_, log_, std::chrono::steady_clock::now() + opts_.handshake_timeout,
      [self](const std::shared_ptr<connection>& admitted, const hello_msg& hello) {
        return self->admit(admitted, hello);
      },
      [self](const std::shared_ptr<connection>& dropped) { self->untrack(dropped); });
}

} // namespace loom::net::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

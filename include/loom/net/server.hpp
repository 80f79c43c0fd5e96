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

#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/net/auth.hpp>
#include <loom/net/connection.hpp>
#include <loom/net/frame.hpp>
#include <loom/net/handshake.hpp>
#include <loom/net/log.hpp>
#include <loom/net/receive_budget.hpp>
#include <loom/net/tls.hpp>

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

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace loom::net {

struct rpc_server_options {
  std::string host = "127.0.0.1"; // where it listens: an address, a name, 0.0.0.0 or ::
  std::uint16_t port = 0;         // 0: the OS chooses; see rpc_server::port()
  // Where clients reach it (a cluster task's cluster-spec host), as address() and the
  // errors it sends say; empty: host.
  std::string advertised_host{};
  int threads = 2; // io threads (handlers run on them)
  // The cluster token. nullopt: LOOM_CLUSTER_TOKEN / LOOM_CLUSTER_TOKEN_FILE; "": none.
  std::optional<std::string> token{};
  // Serve beyond loopback without a token (also LOOM_ALLOW_INSECURE=1).
  bool allow_insecure = false;
  // TLS (cluster/tls_settings.hpp). nullopt: LOOM_TLS / LOOM_TLS_CERT, _KEY, _CA.
  std::optional<tls_settings> tls{};
  // TCP keepalive on the connections accepted (cluster/liveness_settings.hpp: a client
  // whose host vanished is let go of); nullopt: LOOM_HEARTBEAT_TIMEOUT's settings. Pings
  // are answered whatever this says.
  std::optional<liveness_settings> liveness{};
  frame_limits limits{};
  std::chrono::milliseconds handshake_timeout{10000};
  std::size_t dedupe_window = 1u << 16; // (client, request id) pairs remembered
  // Replies with at least this many payload bytes go over the client's bulk connection.
  std::size_t bulk_threshold = 256u << 10;
  log_fn log{}; // empty: stderr

  // Memory held for frames not yet received in full (their metadata buffers, the tensors
  // the layer allocates for them; not a handler's own buffers), charged as the bytes
  // arrive. A message that would hold more than the first on one connection is refused;
  // a read that would pass the second first evicts peers stalled in the middle of a
  // frame, else closes its own connection; each with resource_exhausted (receive_budget.hpp).
  std::uint64_t max_pending_bytes_per_connection = std::uint64_t{2} << 30; // 2 GiB
  std::uint64_t max_pending_bytes = std::uint64_t{4} << 30;                // 4 GiB
  // Connections accepted whose handshake has not finished; past this many, the oldest
  // is closed (an honest client finishes in a round trip: the oldest is the likeliest
  // to be a socket that never speaks).
  std::size_t max_handshaking_connections = 128;
  // Connections past the handshake. At the cap, and when accepting runs out of file
  // descriptors, the client idle the longest (nothing received for idle_eviction_grace,
  // no request of it unanswered) is closed to make room; failing that a newcomer is
  // refused (resource_exhausted).
  std::size_t max_connections = 4096;
  std::chrono::milliseconds idle_eviction_grace{5000};
  // After a failed accept the next waits this long, doubling up to max_accept_backoff.
  std::chrono::milliseconds accept_backoff{10};
  std::chrono::milliseconds max_accept_backoff{1000};
  // A line that repeats (accept errors, refused or evicted peers, bad frames) is logged
  // at most once per interval, with the count of those held back.
  std::chrono::milliseconds log_interval{5000};
};

// What a server holds now (rpc_server::stats()).
struct server_stats {
  std::size_t connections = 0;   // past the handshake
  std::size_t handshaking = 0;   // accepted, handshake not finished
  std::size_t pending_bytes = 0; // held for frames not yet received in full
};

namespace detail {
class server_core;

struct reply_state;
inline void send_error_reply(reply_state& st, error_code code, const std::string& message);

// Shared by the responder and the dispatcher. When the last reference goes and
// nobody answered (the handler dropped its responder), it answers with
// internal_error, so a caller never waits for a reply that cannot come.
struct reply_state {
  std::shared_ptr<connection> conn;
  std::weak_ptr<server_core> core;
  std::uint64_t id = 0;
  std::uint64_t client_id = 0;
  std::string method;
  std::atomic<bool> done{false};

  reply_state() = default;
  reply_state(const reply_state&) = delete;
  reply_state& operator=(const reply_state&) = delete;
  ~reply_state() {
    if (conn && !done.exchange(true)) {
      try {
        send_error_reply(*this, error_code::internal,
                         "the handler of '" + method + "' dropped the request without replying");
      } catch (...) {
      }
    }
    if (conn)
      conn->in_flight.fetch_sub(1, std::memory_order_relaxed);
  }
};

inline void send_reply(reply_state& st, out_frame&& f, std::uint64_t payload_bytes);

inline void send_error_reply(reply_state& st, error_code code, const std::string& message) {
  out_frame f;
  envelope env;
  env.status = status_of(code);
  env.message = message;
  encode_head(f.head, frame_kind::response, st.id, env, {}, empty{});
  send_reply(st, std::move(f), 0);
}
} // namespace detail

// A received request. Handlers may move the payloads out.
class request {
public:
  const std::string& method() const noexcept { return frame_.meta.env.method; }
  std::uint64_t id() const noexcept { return frame_.header.request_id; }
  std::uint64_t client_id() const noexcept { return client_id_; }
  const std::string& peer() const noexcept { return peer_; }
  // The client's deadline for this call, as a duration from when it was sent (0: none).
  std::chrono::microseconds timeout() const noexcept {
    return std::chrono::microseconds(frame_.meta.env.timeout_us);
  }
  std::string_view raw_metadata() const noexcept { return frame_.user_metadata(); }
  template <class T> T metadata() const {
    return decode_metadata<T>(raw_metadata(), "request '" + method() + "' from " + peer_);
  }
  std::vector<any_tensor>& payloads() noexcept { return frame_.payloads; }
  const std::vector<any_tensor>& payloads() const noexcept { return frame_.payloads; }

private:
  friend class detail::server_core;
  incoming_frame frame_;
  std::string peer_;
  std::uint64_t client_id_ = 0;
};

// What an allocator sees before the payloads are read.
struct request_preview {
  const std::string& method;
  std::string_view metadata; // the caller's metadata (decode with decode_metadata<T>)
  const std::string& peer;
  std::uint64_t client_id;
  std::uint64_t request_id;
};

// The right to answer one request, once, from any thread. Dropping every
// responder of a request without answering answers with internal_error (never
// a silent hang); a handler that throws answers with its exception instead.
class responder {
public:
  responder() = default;
  explicit responder(std::shared_ptr<detail::reply_state> st) : st_(std::move(st)) {}
  responder(responder&&) noexcept = default;
  responder& operator=(responder&&) noexcept = default;
  responder(const responder&) = delete;
  responder& operator=(const responder&) = delete;

  explicit operator bool() const noexcept { return st_ && !st_->done.load(); }
  const std::string& method() const { return st_->method; }
  // False once the connection the request came on has closed.
  bool peer_connected() const { return st_ && !st_->conn->closed(); }

  void reply() { reply(empty{}); }
  template <class Meta> void reply(const Meta& meta, std::vector<any_tensor> payloads = {}) {
    check();
    out_frame f;
    const auto bytes =
        encode_message(f, frame_kind::response, st_->id, envelope{}, std::move(payloads), meta,
                       st_->conn ? st_->conn->limits() : frame_limits{});
    if (st_->done.exchange(true))
      throw failed_precondition_error("request '" + st_->method + "' was already answered");
    detail::send_reply(*st_, std::move(f), bytes);
  }
  void fail(error_code code, const std::string& message) {
    check();
    if (st_->done.exchange(true))
      throw failed_precondition_error("request '" + st_->method + "' was already answered");
    send_error(*st_, code, message);
  }
  void fail(const loom::error& e) { fail(e.code(), e.message()); }

  static void send_error(detail::reply_state& st, error_code code, const std::string& message) {
    detail::send_error_reply(st, code, message);
  }

private:
  void check() const {
    if (!st_)
      throw failed_precondition_error("reply on an empty responder");
    if (st_->done.load())
      throw failed_precondition_error("request '" + st_->method + "' was already answered");
  }
  std::shared_ptr<detail::reply_state> st_;
};

using handler_fn = std::function<void(request, responder)>;
// Returns the tensor to receive payload `index` into (dtype and shape must
// match `info`), or an empty tensor to let the layer allocate one.
using allocator_fn =
    std::function<any_tensor(const request_preview&, std::size_t index, const payload_info& info)>;

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

class server_core : public frame_sink, public std::enable_shared_from_this<server_core> {
public:
  using tcp = asio::ip::tcp;

  explicit server_core(rpc_server_options o) : opts_(std::move(o)) {}

  void start() {
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
          "refusing to serve on " + requested +
          (addr.is_unspecified() ? " (every interface)" : "") +
          " without a cluster token: anyone who can reach that address could run requests. "
          "Set LOOM_CLUSTER_TOKEN (or LOOM_CLUSTER_TOKEN_FILE) for every task, use TLS with "
          "certificates (LOOM_TLS_CERT, LOOM_TLS_KEY, LOOM_TLS_CA), or opt into insecure mode "
          "(rpc_server_options::allow_insecure or LOOM_ALLOW_INSECURE=1)");

    rt_ = std::make_shared<io_runtime>(opts_.threads, opts_.log);
    processes_served_.assign(rt_->size(), 0);
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

  void stop() {
    std::vector<std::shared_ptr<connection>> conns;
    {
      std::lock_guard lk(cmu_);
      if (stopping_ || !rt_)
        return;
      stopping_ = true;
      conns.assign(conns_.begin(), conns_.end());
    }
    rt_->run_on(*acceptor_strand_, [self = shared_from_this()] {
      std::error_code ec;
      self->acceptor_->close(ec);
      self->accept_timer_->cancel();
      self->close_reserve();
    });
    for (auto& c : conns)
      c->close("the server is stopping");
    rt_->shutdown();
    limiter_->flush();
    std::lock_guard lk(cmu_);
    conns_.clear();
    handshaking_.clear();
    handshaking_at_.clear();
    bulk_.clear();
  }

  server_stats stats() {
    server_stats st;
    {
      std::lock_guard lk(cmu_);
      st.handshaking = handshaking_.size();
      st.connections = conns_.size() - handshaking_.size();
    }
    st.pending_bytes = budget_ ? budget_->held() : 0;
    return st;
  }

  void add_handler(std::string method, handler_fn h, allocator_fn a) {
    std::unique_lock lk(hmu_);
    handlers_[std::move(method)] = entry{std::move(h), std::move(a)};
  }

  std::uint16_t port() const noexcept { return port_; }
  const std::string& address() const noexcept { return address_; }
  const rpc_server_options& options() const noexcept { return opts_; }

  std::shared_ptr<connection> bulk_for(std::uint64_t client_id) {
    std::lock_guard lk(cmu_);
    auto it = bulk_.find(client_id);
    if (it == bulk_.end())
      return nullptr;
    return it->second.lock();
  }

  // ---- frame_sink ----
  any_tensor destination(connection& c, const frame_header& h, const frame_meta& m,
                         std::string_view user, std::size_t i, const payload_info& p) override {
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
    return a(request_preview{m.env.method, user, c.peer(), c.client_id, h.request_id}, i, p);
  }

  void on_frame(const std::shared_ptr<connection>& c, incoming_frame&& f) override {
    if (!std::exchange(c->settled, true))
      settle(c);
    if (f.header.kind == frame_kind::cancel)
      return; // the client already gave up; nothing runs twice
    if (f.header.kind != frame_kind::request) {
      log_line(log_, "unexpected " + std::string(to_string(f.header.kind)) + " frame from " +
                         c->peer() + "; ignored");
      return;
    }
    auto st = std::make_shared<reply_state>();
    c->in_flight.fetch_add(1, std::memory_order_relaxed); // until st goes (its destructor)
    st->conn = c;
    st->core = weak_from_this();
    st->id = f.header.request_id;
    st->client_id = c->client_id;
    st->method = f.meta.env.method;

    if (!remember(request_key{c->client_id, st->id})) {
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
    req.client_id_ = c->client_id;
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

  void on_closed(const std::shared_ptr<connection>& c, const std::string&) override { untrack(c); }

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
  void settle(const std::shared_ptr<connection>& c) {
    if (c->secure())
      return;
    asio::io_context& own = c->context();
    std::lock_guard lk(cmu_);
    if (!conns_.count(c)) // forgotten (closing): stays
      return;
    auto [home, added] = process_homes_.try_emplace(c->process_id);
    if (added) {
      std::size_t best = rt_->index_of(own);
      for (std::size_t i = 0; i < processes_served_.size(); ++i)
        if (processes_served_[i] < processes_served_[best])
          best = i;
      home->second.context = best;
      ++processes_served_[best];
    }
    ++home->second.connections;
    homed_.emplace(c.get(), c->process_id);
    c->move_to(rt_->context_at(home->second.context));
  }

  bool remember(const request_key& k) {
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

  void untrack(const std::shared_ptr<connection>& c) {
    std::lock_guard lk(cmu_);
    forget(c);
  }

  // Under cmu_: c is no longer served (closed, or about to be).
  void forget(const std::shared_ptr<connection>& c) {
    conns_.erase(c);
    leave_handshake(*c);
    if (auto h = homed_.find(c.get()); h != homed_.end()) {
      auto home = process_homes_.find(h->second);
      if (--home->second.connections == 0) {
        --processes_served_[home->second.context];
        process_homes_.erase(home);
      }
      homed_.erase(h);
    }
    if (c->role == connection_role::bulk) {
      auto it = bulk_.find(c->client_id);
      if (it != bulk_.end() && it->second.lock() == c)
        bulk_.erase(it);
    }
  }

  // Under cmu_.
  void leave_handshake(const connection& c) {
    if (auto it = handshaking_at_.find(&c); it != handshaking_at_.end()) {
      handshaking_.erase(it->second);
      handshaking_at_.erase(it);
    }
  }

  // Closes connections chosen to make room (outside cmu_), saying why once per interval.
  void evict(const std::vector<std::shared_ptr<connection>>& victims, const std::string& why) {
    for (const auto& v : victims) {
      log_line(log_, "closed the connection from " + v->peer() + ": " + why);
      v->close(why);
    }
  }

  // ---- accepting (acceptor strand) ----

  void accept_next() {
    reopen_reserve();
    auto c = std::make_shared<connection>(rt_, opts_.limits, log_);
    acceptor_->async_accept(
        c->socket(),
        asio::bind_executor(*acceptor_strand_, [self = shared_from_this(), c](std::error_code ec) {
          self->on_accepted(c, ec);
        }));
  }

  void on_accepted(const std::shared_ptr<connection>& c, std::error_code ec) {
    if (ec == asio::error::operation_aborted)
      return;
    {
      std::lock_guard lk(cmu_);
      if (stopping_)
        return;
    }
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

  void retry_accept_after(std::chrono::milliseconds wait) {
    accept_timer_->expires_after(wait);
    accept_timer_->async_wait(
        asio::bind_executor(*acceptor_strand_, [self = shared_from_this()](std::error_code e) {
          if (!e)
            self->accept_next();
        }));
  }

  // A socket was accepted: it starts its handshake. Past max_handshaking_connections the
  // oldest still in its handshake is closed: an honest client finishes in one round trip,
  // so the oldest is the likeliest to be a socket that never speaks, and closing it
  // (rather than refusing the newcomer) lets a client in while such sockets pile up.
  void serve(const std::shared_ptr<connection>& c) {
    std::vector<std::shared_ptr<connection>> oldest;
    {
      std::lock_guard lk(cmu_);
      conns_.insert(c);
      handshaking_at_[c.get()] = handshaking_.insert(handshaking_.end(), c);
      if (handshaking_.size() > opts_.max_handshaking_connections) {
        oldest.push_back(handshaking_.front());
        forget(oldest.back());
      }
    }
    evict(oldest, "it had not finished its handshake, the oldest of more than "
                  "max_handshaking_connections (" +
                      std::to_string(opts_.max_handshaking_connections) + ")");
    c->attach_budget(budget_);
    c->configure_socket();
    c->enable_keepalive(live_);
    c->run([self = shared_from_this(), c] { self->handshake(c); });
  }

  enum class room { none, made, served };

  // Out of file descriptors with a peer waiting. The descriptor kept in reserve takes the
  // peer, and a connection is given up for it (the oldest in its handshake, else the
  // idlest client): served. With none to give up, the peer is refused at once (closed)
  // rather than left waiting in the backlog: none. Without the reserve (not yet reopened),
  // a connection is given up so that the next try succeeds: made.
  room make_room_for_peer() {
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

  // Gives up one connection (to free its descriptor): the oldest still in its handshake,
  // else the client idle the longest. False when there is none to give up.
  bool make_room() {
    std::vector<std::shared_ptr<connection>> victims;
    std::string why;
    {
      std::lock_guard lk(cmu_);
      if (!handshaking_.empty()) {
        victims.push_back(handshaking_.front());
        why = "the server ran out of file descriptors and it was the oldest connection still in "
              "its handshake";
      } else {
        victims = idlest_client(std::chrono::steady_clock::now());
        why = "the server ran out of file descriptors and its client was the idlest";
      }
      for (const auto& v : victims)
        forget(v);
    }
    evict(victims, why);
    return !victims.empty();
  }

  // Under cmu_: the admitted connections of the client idle the longest, when it has
  // been idle for idle_eviction_grace and has no request unanswered (a client waiting
  // for a barrier's reply sends nothing, yet is not idle); none when there is no such.
  // A client's control and bulk connections go together (the channel needs both).
  std::vector<std::shared_ptr<connection>>
  idlest_client(std::chrono::steady_clock::time_point now) {
    struct client {
      std::chrono::steady_clock::duration idle = std::chrono::steady_clock::duration::max();
      bool busy = false;
      std::vector<std::shared_ptr<connection>> conns;
    };
    std::unordered_map<std::uint64_t, client> clients;
    for (const auto& c : conns_) {
      if (handshaking_at_.count(c.get()))
        continue;
      auto& k = clients[c->client_id];
      k.idle = std::min(k.idle, c->idle_for(now));
      k.busy = k.busy || c->in_flight.load(std::memory_order_relaxed) > 0;
      k.conns.push_back(c);
    }
    client* idlest = nullptr;
    for (auto& [id, k] : clients)
      if (!k.busy && k.idle >= opts_.idle_eviction_grace && (!idlest || k.idle > idlest->idle))
        idlest = &k;
    return idlest ? std::move(idlest->conns) : std::vector<std::shared_ptr<connection>>{};
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
  std::shared_ptr<frame_sink> admit(const std::shared_ptr<connection>& c) {
    std::vector<std::shared_ptr<connection>> evicted;
    {
      std::lock_guard lk(cmu_);
      if (stopping_ || !conns_.count(c)) // stopping, or given up meanwhile (closing)
        return nullptr;
      leave_handshake(*c);
      if (conns_.size() - handshaking_.size() > opts_.max_connections) {
        evicted = idlest_client(std::chrono::steady_clock::now());
        if (evicted.empty())
          throw resource_exhausted_error("the server at " + address_ + " serves max_connections (" +
                                         std::to_string(opts_.max_connections) +
                                         ") connections and none is idle");
        for (const auto& v : evicted)
          forget(v);
      }
      if (c->role == connection_role::bulk)
        bulk_[c->client_id] = c;
    }
    evict(evicted, "the server was at max_connections (" + std::to_string(opts_.max_connections) +
                       ") and its client was the idlest");
    return shared_from_this();
  }

  // Server side of the handshake (handshake.hpp), on c's strand.
  void handshake(const std::shared_ptr<connection>& c) {
    auto self = shared_from_this();
    start_server_handshake(
        c, token_, tls_, address_, log_, std::chrono::steady_clock::now() + opts_.handshake_timeout,
        [self](const std::shared_ptr<connection>& admitted) { return self->admit(admitted); },
        [self](const std::shared_ptr<connection>& dropped) { self->untrack(dropped); });
  }

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

  std::mutex cmu_;
  bool stopping_ = false;
  std::unordered_set<std::shared_ptr<connection>> conns_; // handshaking or admitted
  // The client processes whose connections have sent requests: the index of the io
  // context serving them and how many of their connections it serves; per context,
  // how many processes it serves; per connection, its process.
  struct process_home {
    std::size_t context = 0, connections = 0;
  };
  std::unordered_map<std::uint64_t, process_home> process_homes_;
  std::vector<std::size_t> processes_served_;
  std::unordered_map<const connection*, std::uint64_t> homed_;
  std::list<std::shared_ptr<connection>> handshaking_; // oldest first
  std::unordered_map<const connection*, std::list<std::shared_ptr<connection>>::iterator>
      handshaking_at_;
  std::unordered_map<std::uint64_t, std::weak_ptr<connection>> bulk_;

  std::mutex dmu_;
  std::unordered_set<request_key, request_key_hash> seen_;
  std::deque<request_key> order_;
};

inline void send_reply(reply_state& st, out_frame&& f, std::uint64_t payload_bytes) {
  auto c = st.conn;
  if (auto core = st.core.lock(); core && payload_bytes >= core->options().bulk_threshold &&
                                  c->role == connection_role::control)
    if (auto b = core->bulk_for(st.client_id); b && !b->closed())
      c = std::move(b);
  c->send(std::move(f)); // a closed connection drops it: the client has already failed the call
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

  // Closes the listener and every connection, joins the io threads. Calls in
  // flight fail on their clients with unavailable_error. Idempotent.
  void stop() { core_->stop(); }

private:
  std::shared_ptr<detail::server_core> core_;
};

} // namespace loom::net

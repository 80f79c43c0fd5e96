// net::channel: the client side of loom's RPC, one per peer. See rpc.hpp.
//
// - Calls are multiplexed by request id. A channel holds two connections to its
//   peer: control (small frames) and bulk (frames with at least bulk_threshold
//   payload bytes, in both directions), so a large transfer never stalls a
//   small call behind it.
// - With TLS (channel_options::tls, else LOOM_TLS...) both connections are encrypted
//   (tls.hpp); a server that does not use TLS the same way fails the connect with an
//   error that says so, naming the server.
// - connect() (or the first call) retries with exponential backoff up to
//   connect_timeout, logging whom it waits for. After a connection is lost,
//   calls in flight fail with unavailable_error and the next call reconnects
//   (retrying for at most reconnect_timeout).
// - Every call has a deadline (call_options::timeout or deadline, else the
//   channel's default_timeout) and can be cancelled through its call_handle.
// - Liveness (channel_options::liveness, else LOOM_HEARTBEAT_TIMEOUT;
//   cluster/liveness_settings.hpp): while calls are in flight and nothing has come from the
//   peer for the ping interval, the channel pings it on both connections (its io thread
//   answers, whatever its handlers do); nothing at all for heartbeat_timeout and the peer
//   is declared dead: the connections close and the calls in flight fail with
//   unavailable_error ("ps task 0 at h:p stopped answering: no heartbeat for 6 s ...").
//   Both connections use TCP keepalive.
#pragma once

#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/net/auth.hpp>
#include <loom/net/connection.hpp>
#include <loom/net/frame.hpp>
#include <loom/net/handshake.hpp>
#include <loom/net/tls.hpp>

#include <asio/bind_executor.hpp>
#include <asio/connect.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace loom::net {

struct channel_options {
  // How logs and errors name the peer, e.g. "ps task 0". Empty: "peer".
  std::string peer_name{};
  int threads = 1; // io threads
  // The cluster token. nullopt: LOOM_CLUSTER_TOKEN / LOOM_CLUSTER_TOKEN_FILE; "": none.
  std::optional<std::string> token{};
  // TLS (cluster/tls_settings.hpp). nullopt: LOOM_TLS / LOOM_TLS_CERT, _KEY, _CA.
  std::optional<tls_settings> tls{};
  std::chrono::milliseconds connect_timeout{30000};  // first connect, all retries included
  std::chrono::milliseconds reconnect_timeout{1000}; // after a loss, all retries included
  std::chrono::milliseconds initial_backoff{50};
  std::chrono::milliseconds max_backoff{2000};
  // While it retries, a line at the first failure, then one per interval with the
  // attempts so far (TF says "still waiting" every 10 s), not one per attempt.
  std::chrono::milliseconds log_interval{10000};
  std::chrono::milliseconds default_timeout{300000}; // per call, when the call sets none
  // call_handle::get() first waits this long yielding the CPU (no sleep), so a
  // fast reply reaches the caller without a futex wake-up; then it blocks.
  std::chrono::microseconds spin_wait{0};
  std::size_t bulk_threshold = 256u << 10; // payload bytes that go over bulk
  frame_limits limits{};
  log_fn log{}; // empty: stderr
  // The process this client belongs to, as servers see it: they serve all of one
  // process's connections on one io thread. 0: this process (this_process_id()); a
  // test gives two channels of one process two ids to stand for two processes.
  std::uint64_t process_id = 0;
  // How soon a silent peer is declared dead; nullopt: LOOM_HEARTBEAT_TIMEOUT, else 6 s.
  std::optional<liveness_settings> liveness{};
};

struct call_options {
  std::chrono::milliseconds timeout{0}; // 0: the channel's default_timeout
  std::optional<std::chrono::steady_clock::time_point> deadline{}; // overrides timeout
  // Receive response payload i straight into response_buffers[i] (same dtype
  // and shape; an empty tensor: allocate). Written until the call completes.
  std::vector<any_tensor> response_buffers{};
  // 0: the next id. Reuse the id of an earlier call to retry it safely: the
  // server runs each (client id, request id) at most once.
  std::uint64_t request_id = 0;
  // false: a channel that is not connected (never was, or lost its
  // connection) fails the call at once with unavailable_error instead of
  // connecting. For best-effort calls to a peer that may be gone, which must
  // neither wait for it nor log that they wait.
  bool dial = true;
};

class response {
public:
  std::string_view raw_metadata() const noexcept {
    return std::string_view(raw_).substr(offset_, size_);
  }
  template <class T> T metadata() const { return decode_metadata<T>(raw_metadata(), "a response"); }
  std::vector<any_tensor> payloads;

  // Used by the channel: adopts the received metadata bytes.
  void adopt_metadata(std::string raw, std::size_t offset, std::size_t size) {
    raw_ = std::move(raw);
    offset_ = offset;
    size_ = size;
  }

private:
  std::string raw_;
  std::size_t offset_ = 0, size_ = 0;
};

namespace detail {

class channel_core;

struct call_state {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::atomic<bool> done_flag{false}; // done, readable without the mutex (spin-wait)
  std::exception_ptr error;
  net::response result;

  std::string method;
  std::uint64_t id = 0;
  std::chrono::steady_clock::time_point deadline;
  std::chrono::milliseconds timeout{0};
  std::vector<any_tensor> dest;
  std::shared_ptr<const std::string> peer; // "ps task 0 at 127.0.0.1:1234"

  // Completes the call once; false if it was already complete.
  bool finish(std::exception_ptr e, net::response* r = nullptr) {
    {
      std::lock_guard lk(m);
      if (done)
        return false;
      done = true;
      error = std::move(e);
      if (r)
        result = std::move(*r);
      done_flag.store(true, std::memory_order_release);
    }
    cv.notify_all();
    return true;
  }
  std::string describe() const { return "call '" + method + "' to " + *peer; }
};

class channel_core : public frame_sink, public std::enable_shared_from_this<channel_core> {
public:
  using tcp = asio::ip::tcp;
  using clock = std::chrono::steady_clock;

  channel_core(std::string address, channel_options o)
      : address_(std::move(address)), opts_(std::move(o)) {
    hp_ = parse_host_port(address_);
    if (opts_.peer_name.empty())
      opts_.peer_name = "peer";
    peer_ = std::make_shared<const std::string>(opts_.peer_name + " at " + address_);
    token_ = resolve_token(opts_.token);
    tls_ = make_tls_context(resolve_tls(opts_.tls), token_, tls_role::client);
    live_ = resolve_liveness(opts_.liveness);
    client_id_ = random_u64();
    if (opts_.process_id == 0)
      opts_.process_id = this_process_id();
    // One io thread (the default): its context is driven on demand, by the
    // caller waiting for a reply when there is one (io_runtime, lead()).
    // (busy() is called only while this core is alive: stop() joins the io thread.)
    std::function<bool()> on_demand;
    if (opts_.threads <= 1)
      on_demand = [this] { return busy(); };
    rt_ = std::make_shared<io_runtime>(opts_.threads, opts_.log, std::move(on_demand));
    hb_strand_.emplace(asio::make_strand(rt_->context()));
    hb_timer_.emplace(*hb_strand_);
  }

  const std::string& address() const noexcept { return address_; }
  const std::shared_ptr<const std::string>& peer_shared() const noexcept { return peer_; }
  std::uint64_t client_id() const noexcept { return client_id_; }
  const channel_options& options() const noexcept { return opts_; }
  std::uint64_t next_id() noexcept { return next_id_.fetch_add(1, std::memory_order_relaxed); }
  bool connected() const noexcept { return connected_.load(std::memory_order_acquire); }
  bool ever_connected() const noexcept { return ever_connected_.load(std::memory_order_acquire); }

  void ensure_connected(clock::time_point call_deadline) {
    if (connected())
      return;
    std::lock_guard clk(connect_mu_);
    if (connected())
      return;
    {
      std::lock_guard lk(mu_);
      if (stopped_)
        throw cancelled_error("the channel to " + *peer_ + " was stopped");
    }
    const auto now = clock::now();
    auto limit = now + (ever_connected() ? opts_.reconnect_timeout : opts_.connect_timeout);
    limit = std::min(limit, call_deadline);
    connect_with_retries(limit);
  }

  // Drives the connections from the calling thread until st completes or its
  // deadline passes; false when another thread drives them (st's waiter then
  // waits for that thread to complete it).
  bool lead(call_state& st, clock::time_point until) {
    return rt_->lead([&st] { return st.done_flag.load(std::memory_order_acquire); }, until);
  }

  // Before a call: handles what arrived while nobody drove the connections (a
  // close: the call then reconnects instead of failing; late replies).
  void poll_idle() {
    if (connected())
      rt_->lead([] { return false; }, clock::time_point::min());
  }

  void stop() {
    std::vector<std::shared_ptr<call_state>> calls;
    std::vector<std::shared_ptr<connection>> conns;
    {
      std::lock_guard lk(mu_);
      if (stopped_)
        return;
      stopped_ = true;
      for (auto& [id, st] : pending_)
        calls.push_back(st);
      pending_.clear();
      if (control_)
        conns.push_back(control_);
      if (bulk_)
        conns.push_back(bulk_);
      conns.insert(conns.end(), connecting_.begin(), connecting_.end());
      control_.reset();
      bulk_.reset();
      connected_ = false;
    }
    wake_.notify_all();
    for (auto& st : calls)
      st->finish(make_error(error_code::cancelled, "the channel to " + *peer_ + " stopped while " +
                                                       st->describe() + " was in flight"));
    for (auto& c : conns)
      c->close("the channel is stopping");
    // A heartbeat timer still armed would hold the io thread until it fires.
    rt_->run_on(*hb_strand_, [self = shared_from_this()] { self->hb_timer_->cancel(); });
    std::lock_guard clk(connect_mu_); // a connect in progress has given up
    rt_->shutdown();
  }

  // Registers the call and sends its frame.
  void submit(const std::shared_ptr<call_state>& st, out_frame&& f, std::uint64_t payload_bytes) {
    std::shared_ptr<connection> c;
    std::vector<std::shared_ptr<call_state>> expired;
    bool arm = false;
    {
      std::lock_guard lk(mu_);
      if (stopped_)
        throw cancelled_error("the channel to " + *peer_ + " was stopped");
      if (!control_)
        throw unavailable_error(*peer_ + " is unavailable: the connection was lost");
      const auto now = clock::now();
      if (now >= min_deadline_)
        sweep(now, expired);
      if (pending_.empty())
        busy_since_ = now; // the peer's silence counts from here
      if (live_.heartbeat() && !hb_armed_)
        arm = hb_armed_ = true;
      if (!pending_.emplace(st->id, st).second)
        throw already_exists_error("request id " + std::to_string(st->id) +
                                   " is already in flight on the channel to " + *peer_);
      min_deadline_ = std::min(min_deadline_, st->deadline);
      c = (payload_bytes >= opts_.bulk_threshold && bulk_) ? bulk_ : control_;
    }
    for (auto& e : expired)
      expire(*e);
    if (arm)
      rt_->run_on(*hb_strand_, [self = shared_from_this()] { self->arm_heartbeat(); });
    if (!c->send(std::move(f))) {
      remove(*st);
      throw unavailable_error(*peer_ + " is unavailable: the connection was lost before " +
                              st->describe() + " was sent");
    }
  }

  void remove(const call_state& st) {
    std::lock_guard lk(mu_);
    auto it = pending_.find(st.id);
    if (it != pending_.end() && it->second.get() == &st)
      pending_.erase(it);
  }

  void expire(call_state& st) {
    remove(st);
    st.finish(
        make_error(error_code::deadline_exceeded, st.describe() + " did not complete within " +
                                                      std::to_string(st.timeout.count()) + " ms"));
  }

  void cancel(call_state& st) {
    remove(st);
    if (!st.finish(make_error(error_code::cancelled, st.describe() + " was cancelled")))
      return;
    rt_->wake_leader(); // its waiter may be driving the connections
    std::shared_ptr<connection> c;
    {
      std::lock_guard lk(mu_);
      c = control_;
    }
    if (c) { // tell the server; it runs nothing twice and its reply is dropped
      out_frame f;
      envelope env;
      env.method = st.method;
      encode_head(f.head, frame_kind::cancel, st.id, env, {}, empty{});
      c->send(std::move(f));
    }
  }

  // ---- frame_sink ----
  any_tensor destination(connection&, const frame_header& h, const frame_meta&, std::string_view,
                         std::size_t i, const payload_info&) override {
    if (h.kind != frame_kind::response)
      return {};
    std::lock_guard lk(mu_);
    auto it = pending_.find(h.request_id);
    if (it == pending_.end() || i >= it->second->dest.size())
      return {};
    return it->second->dest[i];
  }

  void on_frame(const std::shared_ptr<connection>& c, incoming_frame&& f) override {
    if (f.header.kind != frame_kind::response) {
      log_line(opts_.log, "unexpected " + std::string(to_string(f.header.kind)) + " frame from " +
                              *peer_ + "; ignored");
      return;
    }
    std::shared_ptr<call_state> st;
    {
      std::lock_guard lk(mu_);
      auto it = pending_.find(f.header.request_id);
      if (it != pending_.end()) {
        st = std::move(it->second);
        pending_.erase(it);
      }
    }
    // The server closes this connection after this reply: no later call may go
    // out on it, so it is retired before the caller hears of the reply.
    if (is_closing(f.header))
      retire(c, "the server closes it after refusing a request: " + f.meta.env.message);
    if (!st) {
      // A reply to a call that was cancelled or timed out, or an error about a
      // frame the server could not parse (it closes the connection next).
      if (!f.meta.env.ok() && f.header.request_id == 0)
        log_line(opts_.log, *peer_ + " reported: " + f.meta.env.message);
      return;
    }
    if (!f.meta.env.ok()) {
      st->finish(make_error(f.meta.env.code(),
                            *peer_ + " failed '" + st->method + "': " + f.meta.env.message));
    } else if (!f.buffer_error.empty()) {
      st->finish(make_error(error_code::invalid_argument, st->describe() + ": " + f.buffer_error));
    } else {
      net::response r;
      const auto off = f.meta.user_offset, n = f.meta.user_bytes;
      r.adopt_metadata(std::move(f.metadata), off, n);
      r.payloads = std::move(f.payloads);
      st->finish(nullptr, &r);
    }
  }

  void on_closed(const std::shared_ptr<connection>& c, const std::string& reason) override {
    retire(c, reason);
  }

private:
  // Forgets c (and its sibling) if they are the channel's connections: the
  // calls in flight on them fail, and the next call connects again.
  void retire(const std::shared_ptr<connection>& c, const std::string& reason) {
    std::vector<std::shared_ptr<call_state>> calls;
    std::shared_ptr<connection> other;
    std::string silent; // why the peer was declared dead, if it was
    {
      std::lock_guard lk(mu_);
      if (c != control_ && c != bulk_)
        return; // an old connection
      silent = std::exchange(declared_dead_, {});
      other = c == control_ ? bulk_ : control_;
      control_.reset();
      bulk_.reset();
      connected_ = false;
      for (auto& [id, st] : pending_)
        calls.push_back(st);
      pending_.clear();
      min_deadline_ = clock::time_point::max();
    }
    if (other)
      other->close("its sibling connection closed");
    c->close(reason);
    for (auto& st : calls)
      st->finish(make_error(error_code::unavailable,
                            silent.empty() ? "lost the connection to " + *peer_ + " while " +
                                                 st->describe() + " was in flight: " + reason
                                           : silent + "; " + st->describe() + " was in flight"));
  }

  // Work the io thread must drive the connections for when no caller does:
  // calls in flight (their waiters may not be waiting yet), connecting, writes
  // the socket did not take at once.
  bool busy() {
    std::lock_guard lk(mu_);
    return !pending_.empty() || !connecting_.empty() || (control_ && control_->writing()) ||
           (bulk_ && bulk_->writing());
  }

  // ---- liveness (heartbeat strand) ----

  // Checks the peer every half ping interval while calls are in flight.
  void arm_heartbeat() {
    const auto tick = std::max(std::chrono::milliseconds(10), live_.ping_interval() / 2);
    hb_timer_->expires_after(tick);
    hb_timer_->async_wait(
        asio::bind_executor(*hb_strand_, [self = shared_from_this()](std::error_code ec) {
          if (!ec)
            self->heartbeat_tick();
        }));
  }

  // Pings a peer silent for the ping interval; declares one silent for heartbeat_timeout
  // dead. Any byte received on either connection counts as life: a peer streaming a large
  // reply, or answering pings while its handlers compute, is alive.
  void heartbeat_tick() {
    const auto now = clock::now();
    std::shared_ptr<connection> ctrl, bulk;
    clock::time_point last;
    {
      std::lock_guard lk(mu_);
      if (stopped_ || pending_.empty() || !control_) {
        hb_armed_ = false;
        return;
      }
      ctrl = control_;
      bulk = bulk_;
      last = busy_since_;
    }
    last = std::max(last, ctrl->last_received());
    if (bulk)
      last = std::max(last, bulk->last_received());
    const auto silence = now - last;
    if (silence >= live_.heartbeat_timeout) {
      const std::string why =
          *peer_ + " stopped answering: no heartbeat for " + seconds_text(live_.heartbeat_timeout);
      std::size_t calls = 0;
      {
        std::lock_guard lk(mu_);
        hb_armed_ = false;
        if (ctrl != control_) // reconnected meanwhile
          return;
        declared_dead_ = why;
        calls = pending_.size();
      }
      log_line(opts_.log, why +
                              " (heartbeat_timeout, LOOM_HEARTBEAT_TIMEOUT); closing its "
                              "connections and failing the " +
                              std::to_string(calls) + " call(s) in flight with unavailable");
      ctrl->close(why);
      if (bulk)
        bulk->close(why);
      return;
    }
    if (silence >= live_.ping_interval() && now - last_ping_ >= live_.ping_interval()) {
      last_ping_ = now;
      ctrl->send(out_frame(encode_heartbeat(frame_kind::ping)));
      if (bulk) // its io thread may be another, free where the control's is busy
        bulk->send(out_frame(encode_heartbeat(frame_kind::ping)));
    }
    arm_heartbeat();
  }

  void sweep(clock::time_point now, std::vector<std::shared_ptr<call_state>>& expired) {
    auto next = clock::time_point::max();
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second->deadline <= now) {
        expired.push_back(std::move(it->second));
        it = pending_.erase(it);
      } else {
        next = std::min(next, it->second->deadline);
        ++it;
      }
    }
    min_deadline_ = next;
  }

  void connect_with_retries(clock::time_point limit) {
    auto backoff = opts_.initial_backoff;
    const auto start = clock::now();
    std::optional<clock::time_point> last_line;
    for (int attempt = 1;; ++attempt) {
      std::string why;
      try {
        attempt_connect(limit);
        if (attempt > 1)
          log_line(opts_.log,
                   "connected to " + *peer_ + " after " + std::to_string(attempt) + " attempts",
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
          throw cancelled_error("the channel to " + *peer_ + " was stopped");
        if (now >= limit) {
          const auto ms =
              std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count();
          throw unavailable_error(*peer_ + " is unavailable: " + why + " (gave up after " +
                                  std::to_string(attempt) + " attempt(s) in " + std::to_string(ms) +
                                  " ms)");
        }
        const auto wait = std::min<clock::duration>(backoff, limit - now);
        if (!last_line || now - *last_line >= opts_.log_interval) {
          const auto ms = [](clock::duration d) {
            return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
          };
          log_line(opts_.log,
                   (last_line ? "still waiting for " : "waiting for ") + *peer_ + " (attempt " +
                       std::to_string(attempt) + " in " + ms(now - start) + " ms: " + why +
                       "); retrying in " + ms(wait) + " ms",
                   logging::level::info);
          last_line = now;
        }
        wake_.wait_for(lk, wait, [&] { return stopped_; });
        if (stopped_)
          throw cancelled_error("the channel to " + *peer_ + " was stopped");
      }
      backoff = std::min(backoff * 2, opts_.max_backoff);
    }
  }

  // One connection of `role`, handshake included; throws unavailable (retryable),
  // unauthenticated or other errors (not retried).
  std::shared_ptr<connection> open_one(connection_role role, clock::time_point limit) {
    std::vector<tcp::endpoint> eps;
    {
      std::error_code ec;
      const auto addr = asio::ip::make_address(hp_.host, ec);
      if (!ec) {
        eps.emplace_back(addr, hp_.port);
      } else {
        tcp::resolver res(rt_->context());
        auto r = res.resolve(hp_.host, std::to_string(hp_.port), ec);
        if (ec)
          throw unavailable_error("cannot resolve '" + hp_.host + "': " + ec.message());
        for (const auto& e : r)
          eps.push_back(e.endpoint());
      }
    }
    auto c = std::make_shared<connection>(rt_, opts_.limits, opts_.log);
    c->set_peer(address_);
    if (tls_)
      c->use_tls(tls_);
    {
      std::lock_guard lk(mu_);
      if (stopped_)
        throw cancelled_error("the channel to " + *peer_ + " was stopped");
      connecting_.insert(c);
    }
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
    auto self = shared_from_this();

    c->run([self, c, at, eps, limit, role] {
      if (c->closed()) {
        at->fail(
            make_error(error_code::cancelled, "the channel to " + *self->peer_ + " was stopped"));
        return;
      }
      c->arm_deadline(limit, "connecting to " + *self->peer_);
      asio::async_connect(
          c->socket(), eps, [self, c, at, role](std::error_code ec, const tcp::endpoint&) {
            if (ec) {
              at->fail(make_error(error_code::unavailable, ec == asio::error::operation_aborted
                                                               ? "timed out connecting"
                                                               : ec.message()));
              c->close("connect failed");
              return;
            }
            c->configure_socket();
            c->enable_keepalive(self->live_);
            start_client_handshake(
                c, client_identity{role, self->token_, self->client_id_, self->opts_.process_id},
                *self->peer_, [at](std::exception_ptr e) {
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

  void attempt_connect(clock::time_point limit) {
    auto ctrl = open_one(connection_role::control, limit);
    std::shared_ptr<connection> bulk;
    try {
      bulk = open_one(connection_role::bulk, limit);
    } catch (...) {
      ctrl->close("the bulk connection failed");
      throw;
    }
    {
      std::lock_guard lk(mu_);
      if (stopped_) {
        ctrl->close("the channel is stopping");
        bulk->close("the channel is stopping");
        throw cancelled_error("the channel to " + *peer_ + " was stopped");
      }
      control_ = ctrl;
      bulk_ = bulk;
      connected_.store(true, std::memory_order_release);
      ever_connected_.store(true, std::memory_order_release);
    }
    ctrl->start(shared_from_this());
    bulk->start(shared_from_this());
  }

  std::string address_;
  host_port hp_;
  channel_options opts_;
  std::shared_ptr<const std::string> peer_;
  std::optional<std::string> token_;
  std::shared_ptr<tls_context> tls_; // null: no TLS
  liveness_settings live_;
  std::uint64_t client_id_ = 0;
  std::atomic<std::uint64_t> next_id_{1};
  std::shared_ptr<io_runtime> rt_;

  std::mutex connect_mu_;
  std::atomic<bool> ever_connected_{false};

  std::mutex mu_;
  std::condition_variable wake_;
  bool stopped_ = false;
  std::atomic<bool> connected_{false};
  std::shared_ptr<connection> control_, bulk_;
  std::unordered_set<std::shared_ptr<connection>> connecting_;
  std::unordered_map<std::uint64_t, std::shared_ptr<call_state>> pending_;
  clock::time_point min_deadline_ = clock::time_point::max();
  // liveness: under mu_ (hb_armed_: a heartbeat check is scheduled; busy_since_: when the
  // calls in flight began to be; declared_dead_: why the closing connections close)
  bool hb_armed_ = false;
  clock::time_point busy_since_{};
  std::string declared_dead_;
  // heartbeat strand only
  std::optional<asio::strand<asio::io_context::executor_type>> hb_strand_;
  std::optional<asio::steady_timer> hb_timer_;
  clock::time_point last_ping_{};
};

} // namespace detail

// A call in flight. get() waits for the response (at most until the call's
// deadline) and throws the call's error; cancel() gives up on it.
class call_handle {
public:
  call_handle() = default;
  call_handle(std::shared_ptr<detail::call_state> st, std::weak_ptr<detail::channel_core> ch,
              std::chrono::microseconds spin = {})
      : st_(std::move(st)), ch_(std::move(ch)), spin_(spin) {}

  bool valid() const noexcept { return static_cast<bool>(st_); }
  std::uint64_t id() const noexcept { return st_->id; }

  // Waits up to d (never past the call's deadline); true when the call completed.
  template <class Rep, class Period> bool wait_for(std::chrono::duration<Rep, Period> d) {
    const auto until =
        std::min(std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(d),
                 st_->deadline);
    if (auto ch = ch_.lock(); ch && ch->lead(*st_, until) && !st_->done_flag.load()) {
      if (std::chrono::steady_clock::now() >= st_->deadline) {
        expire();
        return true;
      }
      return false;
    }
    std::unique_lock lk(st_->m);
    if (st_->cv.wait_until(lk, until, [&] { return st_->done; }))
      return true;
    lk.unlock();
    if (std::chrono::steady_clock::now() >= st_->deadline) {
      expire();
      return true;
    }
    return false;
  }

  bool done() {
    if (auto ch = ch_.lock(); ch && !st_->done_flag.load())
      ch->lead(*st_, std::chrono::steady_clock::time_point::min()); // what has arrived
    {
      std::lock_guard lk(st_->m);
      if (st_->done)
        return true;
    }
    if (std::chrono::steady_clock::now() >= st_->deadline) {
      expire();
      return true;
    }
    return false;
  }

  // True once the call has completed with an error (reading what has arrived
  // first); never waits. For watching a call another thread will get().
  bool failed() {
    if (!done())
      return false;
    std::lock_guard lk(st_->m);
    return static_cast<bool>(st_->error);
  }

  // Waits for the response; throws deadline_exceeded_error (naming the method
  // and the peer), cancelled_error, unavailable_error, or the server's error.
  response get() {
    // The common synchronous call: no thread drives the connections, so this
    // one reads its own reply (and hands on any other it meets).
    if (auto ch = ch_.lock(); ch && !st_->done_flag.load(std::memory_order_acquire))
      ch->lead(*st_, st_->deadline);
    if (spin_.count() > 0 && !st_->done_flag.load(std::memory_order_acquire)) {
      const auto until = std::chrono::steady_clock::now() + spin_;
      do
        std::this_thread::yield();
      while (!st_->done_flag.load(std::memory_order_acquire) &&
             std::chrono::steady_clock::now() < until);
    }
    {
      std::unique_lock lk(st_->m);
      if (!st_->cv.wait_until(lk, st_->deadline, [&] { return st_->done; })) {
        lk.unlock();
        expire();
      }
    }
    std::lock_guard lk(st_->m);
    if (st_->error)
      std::rethrow_exception(st_->error);
    return std::move(st_->result);
  }

  void cancel() {
    if (auto ch = ch_.lock())
      ch->cancel(*st_);
    else
      st_->finish(make_error(error_code::cancelled, st_->describe() + " was cancelled"));
  }

private:
  void expire() {
    if (auto ch = ch_.lock())
      ch->expire(*st_);
    else
      st_->finish(make_error(error_code::deadline_exceeded,
                             st_->describe() + " did not complete within " +
                                 std::to_string(st_->timeout.count()) + " ms"));
  }

  std::shared_ptr<detail::call_state> st_;
  std::weak_ptr<detail::channel_core> ch_;
  std::chrono::microseconds spin_{0};
};

class channel {
public:
  using clock = std::chrono::steady_clock;

  // A channel to the server at `address` ("host:port"). Does not connect yet.
  explicit channel(std::string address, channel_options opts = {})
      : core_(std::make_shared<detail::channel_core>(std::move(address), std::move(opts))) {}
  channel(const channel&) = delete;
  channel& operator=(const channel&) = delete;
  channel(channel&&) noexcept = default;
  channel& operator=(channel&& o) noexcept {
    if (this != &o) {
      if (core_)
        core_->stop();
      core_ = std::move(o.core_);
    }
    return *this;
  }
  ~channel() {
    if (core_)
      core_->stop();
  }

  // Connects now (retrying with backoff up to connect_timeout, logging whom it
  // waits for). Throws unavailable_error naming the peer and its address, or
  // unauthenticated_error.
  void connect() { core_->ensure_connected(clock::time_point::max()); }
  bool connected() const noexcept { return core_->connected(); }
  // Whether it connected once (it may have lost that connection since).
  bool ever_connected() const noexcept { return core_->ever_connected(); }

  template <class Meta = empty>
  call_handle call_async(std::string_view method, const Meta& meta = {},
                         std::vector<any_tensor> payloads = {}, call_options opts = {}) {
    const auto& co = core_->options();
    auto st = std::make_shared<detail::call_state>();
    st->timeout = opts.timeout.count() > 0 ? opts.timeout : co.default_timeout;
    st->deadline = opts.deadline ? *opts.deadline : clock::now() + st->timeout;
    if (opts.deadline)
      st->timeout =
          std::chrono::duration_cast<std::chrono::milliseconds>(*opts.deadline - clock::now());
    st->method.assign(method);
    st->dest = std::move(opts.response_buffers);
    st->peer = core_->peer_shared();
    st->id = opts.request_id ? opts.request_id : core_->next_id();

    out_frame f;
    envelope env;
    env.method = st->method;
    env.timeout_us = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(st->timeout).count());
    const auto bytes =
        encode_message(f, frame_kind::request, st->id, env, std::move(payloads), meta, co.limits);
    core_->poll_idle();
    if (!opts.dial && !core_->connected())
      throw unavailable_error(st->describe() +
                              " was not sent: the channel is not connected and the call does "
                              "not dial");
    core_->ensure_connected(st->deadline);
    core_->submit(st, std::move(f), bytes);
    return call_handle(std::move(st), core_, co.spin_wait);
  }

  // A blocking call: the response, or the call's error.
  template <class Meta = empty>
  response call(std::string_view method, const Meta& meta = {},
                std::vector<any_tensor> payloads = {}, call_options opts = {}) {
    return call_async(method, meta, std::move(payloads), std::move(opts)).get();
  }

  const std::string& address() const noexcept { return core_->address(); }
  std::uint64_t client_id() const noexcept { return core_->client_id(); }

  // Fails the calls in flight with cancelled_error, closes the connections and
  // joins the io threads. Idempotent.
  void stop() { core_->stop(); }

private:
  std::shared_ptr<detail::channel_core> core_;
};

} // namespace loom::net

// The shared state of a net::channel (channel.hpp), which its handles (call_handle.hpp) and
// the io thread reach through a shared_ptr. It puts together:
// - the two connections to the peer, control and bulk (a frame of at least
//   bulk_threshold payload bytes goes over bulk, so a large transfer never stalls a small
//   call behind it), as their frame_sink (frame_sink.hpp): replies complete their calls;
// - the calls in flight (call_table.hpp), failed together when a connection is lost;
// - the dialer (dialer.hpp), which opens both connections, retrying with backoff;
// - the heartbeat (heartbeat.hpp), which watches the peer while calls are in flight;
// - the io runtime (io_runtime.hpp): with one io thread, driven by the caller waiting
//   for a reply (lead()).
// One mutex guards the connections and the call table together, so that a lost connection,
// the calls it fails and the next call's reconnect are seen in one order.
#pragma once

#include <loom/cluster/liveness_settings.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/net/auth.hpp>
#include <loom/net/call_table.hpp>
#include <loom/net/channel_options.hpp>
#include <loom/net/connection.hpp>
#include <loom/net/dialer.hpp>
#include <loom/net/frame.hpp>
#include <loom/net/frame_sink.hpp>
#include <loom/net/heartbeat.hpp>
#include <loom/net/io_runtime.hpp>
#include <loom/net/log.hpp>
#include <loom/net/response.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::net::detail {

class channel_core : public frame_sink,
                     public heartbeat::owner,
                     public std::enable_shared_from_this<channel_core> {
public:
  using clock = std::chrono::steady_clock;

  channel_core(std::string address, channel_options o)
      : address_(std::move(address)), opts_(with_defaults(std::move(o))),
        peer_(std::make_shared<const std::string>(opts_.peer_name + " at " + address_)),
        dialer_(address_, peer_, opts_, random_u64()), live_(resolve_liveness(opts_.liveness)),
        rt_(make_runtime()), heartbeat_(*rt_, live_, peer_) {}

  const std::string& address() const noexcept { return address_; }
  const std::shared_ptr<const std::string>& peer_shared() const noexcept { return peer_; }
  std::uint64_t client_id() const noexcept { return dialer_.client_id(); }
  const channel_options& options() const noexcept { return opts_; }
  std::uint64_t next_id() noexcept { return next_id_.fetch_add(1, std::memory_order_relaxed); }
  bool connected() const noexcept { return connected_.load(std::memory_order_acquire); }
  bool ever_connected() const noexcept { return ever_connected_.load(std::memory_order_acquire); }

  void ensure_connected(clock::time_point call_deadline);

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

  void stop();

  // Registers the call and sends its frame.
  void submit(const std::shared_ptr<call_state>& st, out_frame&& f, std::uint64_t payload_bytes);

  void expire(call_state& st) {
    remove(st);
    st.finish_expired();
  }

  void cancel(call_state& st);

  // ---- frame_sink ----
  any_tensor destination(connection&, const frame_header& h, const frame_meta&, std::string_view,
                         std::size_t i, const payload_info&) override;

  void on_frame(const std::shared_ptr<connection>& c, incoming_frame&& f) override;

  void on_closed(const std::shared_ptr<connection>& c, const std::string& reason) override {
    retire(c, reason);
  }

  // ---- heartbeat::owner ----
  std::optional<heartbeat::watch> watched() override;

  void declare_dead(const heartbeat::watch& w, const std::string& why) override;

private:
  static channel_options with_defaults(channel_options o) {
    if (o.peer_name.empty())
      o.peer_name = "peer";
    if (o.process_id == 0)
      o.process_id = this_process_id();
    return o;
  }

  // One io thread (the default): its context is driven on demand, by the caller waiting
  // for a reply when there is one (io_runtime, lead()). (busy() is called only while this
  // core is alive: stop() joins the io thread.)
  std::shared_ptr<io_runtime> make_runtime();

  void remove(const call_state& st) {
    std::lock_guard lk(mu_);
    calls_.remove(st);
  }

  // Opens both connections and makes them the channel's.
  void attempt_connect(clock::time_point limit);

  // Forgets c (and its sibling) if they are the channel's connections: the
  // calls in flight on them fail, and the next call connects again. Where the
  // peer ended c in order (a server stopping, rpc_server::stop(grace)), the
  // sibling may still hold replies it sent before its own end: the sibling is
  // read to its end (connection::read_to_end) before those calls fail.
  void retire(const std::shared_ptr<connection>& c, const std::string& reason);

  // Work the io thread must drive the connections for when no caller does:
  // calls in flight (their waiters may not be waiting yet), connecting, writes
  // the socket did not take at once.
  bool busy();

  std::string address_;
  channel_options opts_;
  std::shared_ptr<const std::string> peer_; // "ps task 0 at 127.0.0.1:1234"
  dialer dialer_;
  liveness_settings live_;
  std::atomic<std::uint64_t> next_id_{1};
  std::shared_ptr<io_runtime> rt_;
  heartbeat heartbeat_;

  std::mutex connect_mu_; // one connect at a time; stop() waits for it
  std::atomic<bool> ever_connected_{false};

  std::mutex mu_;
  bool stopped_ = false;
  std::atomic<bool> connected_{false};
  std::shared_ptr<connection> control_, bulk_;
  std::shared_ptr<connection> ending_; // read to its end after its sibling's (retire())
  // The calls in flight when ending_'s sibling ended: those still unanswered fail when
  // ending_ closes; calls made since (over a new pair of connections) do not.
  std::vector<std::uint64_t> ending_calls_;
  call_table calls_;
  // liveness: under mu_ (hb_armed_: a heartbeat check is scheduled; busy_since_: when the
  // calls in flight began to be; declared_dead_: why the closing connections close)
  bool hb_armed_ = false;
  clock::time_point busy_since_{};
  std::string declared_dead_;
};

} // namespace loom::net::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net::detail {

LOOM_COMPILED_ONCE void channel_core::ensure_connected(clock::time_point call_deadline) {
  if (connected())
    return;
  std::lock_guard clk(connect_mu_);
  if (connected())
    return;
  {
    std::lock_guard lk(mu_);
    if (stopped_)
      throw channel_stopped_error(*peer_);
  }
  const auto now = clock::now();
  auto limit = now + (ever_connected() ? opts_.reconnect_timeout : opts_.connect_timeout);
  limit = std::min(limit, call_deadline);
  dialer_.retry(limit, [&] { attempt_connect(limit); });
}

LOOM_COMPILED_ONCE void channel_core::stop() {
  std::vector<std::shared_ptr<call_state>> calls;
  std::vector<std::shared_ptr<connection>> conns;
  {
    std::lock_guard lk(mu_);
    if (stopped_)
      return;
    stopped_ = true;
    calls = calls_.take_all();
    if (control_)
      conns.push_back(control_);
    if (bulk_)
      conns.push_back(bulk_);
    if (ending_)
      conns.push_back(ending_);
    control_.reset();
    bulk_.reset();
    ending_.reset();
    ending_calls_.clear();
    connected_ = false;
  }
  const auto connecting = dialer_.stop(); // a wait between connect attempts ends
  conns.insert(conns.end(), connecting.begin(), connecting.end());
  for (auto& st : calls)
    st->finish(make_error(error_code::cancelled, "the channel to " + *peer_ + " stopped while " +
                                                     st->describe() + " was in flight"));
  for (auto& c : conns)
    c->close("the channel is stopping");
  heartbeat_.cancel(shared_from_this());
  std::lock_guard clk(connect_mu_); // a connect in progress has given up
  rt_->shutdown();
}

LOOM_COMPILED_ONCE void channel_core::submit(const std::shared_ptr<call_state>& st, out_frame&& f,
                                             std::uint64_t payload_bytes) {
  std::shared_ptr<connection> c;
  std::vector<std::shared_ptr<call_state>> expired;
  bool arm = false;
  {
    std::lock_guard lk(mu_);
    if (stopped_)
      throw channel_stopped_error(*peer_);
    if (!control_)
      throw unavailable_error(*peer_ + " is unavailable: the connection was lost");
    const auto now = clock::now();
    calls_.take_expired(now, expired);
    if (calls_.empty())
      busy_since_ = now; // the peer's silence counts from here
    if (live_.heartbeat() && !hb_armed_)
      arm = hb_armed_ = true;
    if (!calls_.add(st))
      throw already_exists_error("request id " + std::to_string(st->id) +
                                 " is already in flight on the channel to " + *peer_);
    c = (payload_bytes >= opts_.bulk_threshold && bulk_) ? bulk_ : control_;
  }
  for (auto& e : expired)
    e->finish_expired();
  if (arm)
    heartbeat_.arm(shared_from_this());
  if (!c->send(std::move(f))) {
    remove(*st);
    throw unavailable_error(*peer_ + " is unavailable: the connection was lost before " +
                            st->describe() + " was sent");
  }
}

LOOM_COMPILED_ONCE void channel_core::cancel(call_state& st) {
  remove(st);
  if (!st.finish_cancelled())
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

LOOM_COMPILED_ONCE auto channel_core::destination(connection&, const frame_header& h,
                                                  const frame_meta&, std::string_view,
                                                  std::size_t i, const payload_info&)
    -> any_tensor {
  if (h.kind != frame_kind::response)
    return {};
  std::lock_guard lk(mu_);
  const auto* st = calls_.find(h.request_id);
  if (!st || i >= st->dest.size())
    return {};
  return st->dest[i];
}

LOOM_COMPILED_ONCE void channel_core::on_frame(const std::shared_ptr<connection>& c,
                                               incoming_frame&& f) {
  if (f.header.kind != frame_kind::response) {
    log_line(opts_.log, "unexpected " + std::string(to_string(f.header.kind)) + " frame from " +
                            *peer_ + "; ignored");
    return;
  }
  std::shared_ptr<call_state> st;
  {
    std::lock_guard lk(mu_);
    st = calls_.take(f.header.request_id);
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

LOOM_COMPILED_ONCE auto channel_core::watched() -> std::optional<heartbeat::watch> {
  std::lock_guard lk(mu_);
  if (stopped_ || calls_.empty() || !control_) {
    hb_armed_ = false;
    return std::nullopt;
  }
  return heartbeat::watch{control_, bulk_, busy_since_};
}

LOOM_COMPILED_ONCE void channel_core::declare_dead(const heartbeat::watch& w,
                                                   const std::string& why) {
  std::size_t calls = 0;
  {
    std::lock_guard lk(mu_);
    hb_armed_ = false;
    if (w.control != control_) // reconnected meanwhile
      return;
    declared_dead_ = why;
    calls = calls_.size();
  }
  log_line(opts_.log, why +
                          " (heartbeat_timeout, LOOM_HEARTBEAT_TIMEOUT); closing its "
                          "connections and failing the " +
                          std::to_string(calls) + " call(s) in flight with unavailable");
  w.control->close(why);
  if (w.bulk)
    w.bulk->close(why);
}

LOOM_COMPILED_ONCE auto channel_core::make_runtime() -> std::shared_ptr<io_runtime> {
  std::function<bool()> on_demand;
  if (opts_.threads <= 1)
    on_demand = [this] { return busy(); };
  return std::make_shared<io_runtime>(opts_.threads, opts_.log, std::move(on_demand));
}

LOOM_COMPILED_ONCE void channel_core::attempt_connect(clock::time_point limit) {
  auto ctrl = dialer_.open(rt_, connection_role::control, limit, live_);
  std::shared_ptr<connection> bulk;
  try {
    bulk = dialer_.open(rt_, connection_role::bulk, limit, live_);
  } catch (...) {
    ctrl->close("the bulk connection failed");
    throw;
  }
  {
    std::lock_guard lk(mu_);
    if (stopped_) {
      ctrl->close("the channel is stopping");
      bulk->close("the channel is stopping");
      throw channel_stopped_error(*peer_);
    }
    control_ = ctrl;
    bulk_ = bulk;
    connected_.store(true, std::memory_order_release);
    ever_connected_.store(true, std::memory_order_release);
  }
  ctrl->start(shared_from_this());
  bulk->start(shared_from_this());
}

LOOM_COMPILED_ONCE void channel_core::retire(const std::shared_ptr<connection>& c,
                                             const std::string& reason) {
  std::vector<std::shared_ptr<call_state>> calls;
  std::shared_ptr<connection> other;
  bool read_other_to_its_end = false;
  std::string silent; // why the peer was declared dead, if it was
  {
    std::lock_guard lk(mu_);
    if (c == ending_) {
      ending_.reset();
      for (const std::uint64_t id : std::exchange(ending_calls_, {}))
        if (auto st = calls_.take(id))
          calls.push_back(std::move(st));
    } else {
      if (c != control_ && c != bulk_)
        return; // an old connection
      silent = std::exchange(declared_dead_, {});
      other = c == control_ ? bulk_ : control_;
      control_.reset();
      bulk_.reset();
      connected_ = false;
      read_other_to_its_end = c->ended_by_peer() && other && !other->closed() && silent.empty();
      if (read_other_to_its_end) {
        ending_ = other;
        ending_calls_ = calls_.ids();
      } else {
        calls = calls_.take_all();
      }
    }
  }
  if (other) {
    if (read_other_to_its_end)
      other->read_to_end("its sibling connection closed");
    else
      other->close("its sibling connection closed");
  }
  c->close(reason);
  for (auto& st : calls)
    st->finish(make_error(error_code::unavailable,
                          silent.empty() ? "lost the connection to " + *peer_ + " while " +
                                               st->describe() + " was in flight: " + reason
                                         : silent + "; " + st->describe() + " was in flight"));
}

LOOM_COMPILED_ONCE bool channel_core::busy() {
  {
    std::lock_guard lk(mu_);
    if (!calls_.empty() || (control_ && control_->writing()) || (bulk_ && bulk_->writing()))
      return true;
  }
  return dialer_.connecting();
}

} // namespace loom::net::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

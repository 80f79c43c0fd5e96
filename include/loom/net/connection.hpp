// One framed connection of loom's message layer, over TCP or TLS (its transport,
// transport.hpp). Used by net::rpc_server and net::channel (rpc.hpp); most users never
// touch it directly.
//
// A connection is a composition of pieces with one job each; this file wires them
// together and owns what they share (the strand, the socket, the object's lifetime):
// - frame_reader.hpp: the read loop, bytes to frames, handed to a frame_sink
//   (frame_sink.hpp);
// - frame_writer.hpp: the write queue, thread-safe, and whether the connection is closed;
// - receive_budget.hpp (receive_charge): what the unfinished message holds, charged to a
//   server's budget;
// - socket_placement.hpp: the strand and io thread it lives on, and the one move a server
//   makes of it;
// - liveness.hpp: when it last received a byte, and TCP keepalive.
// What stays here is the lifecycle: the handshake's helpers (deadline, TLS detection),
// and closing: at once, after a flush, lingering for a refused peer, or finishing for a
// server going away.
//
// Threading: every socket operation runs on the connection's strand; send(), close(),
// closed() and the liveness queries are thread-safe. Every asynchronous handler holds a
// shared_ptr to the connection, so the pieces, its members, outlive their operations.
//
// Who is at the other end, and what a server does with it, is not the connection's: a
// server keeps that in its own per-connection sink (server_registry.hpp).
#pragma once

#include <loom/cluster/liveness_settings.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/net/address.hpp>
#include <loom/net/auth.hpp>
#include <loom/net/frame.hpp>
#include <loom/net/frame_reader.hpp>
#include <loom/net/frame_sink.hpp>
#include <loom/net/frame_writer.hpp>
#include <loom/net/io_runtime.hpp>
#include <loom/net/liveness.hpp>
#include <loom/net/log.hpp>
#include <loom/net/receive_budget.hpp>
#include <loom/net/socket_placement.hpp>
#include <loom/net/tls.hpp>
#include <loom/net/transport.hpp>

#include <asio/buffer.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace loom::net {

class connection final : public std::enable_shared_from_this<connection>,
                         private frame_reader::owner {
public:
  using tcp = asio::ip::tcp;
  using strand_type = socket_placement::strand_type;
  using once_fn = frame_reader::once_fn;

  connection(std::shared_ptr<detail::io_runtime> rt, const frame_limits& limits, log_fn log)
      : rt_(std::move(rt)), placement_(rt_->next_context()), io_(placement_.strand()),
        timer_(placement_.strand()), limits_(limits), log_(std::move(log)), writer_(io_),
        reader_(*this, *this, io_, limits_, charge_, activity_) {}
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  tcp::socket& socket() noexcept { return io_.socket(); }
  // The strand its handlers run on, and its io context: fixed but for one move_to().
  strand_type strand() const { return placement_.strand(); }
  asio::io_context& context() const { return placement_.context(); }
  const std::string& peer() const noexcept { return peer_; }
  void set_peer(std::string p) { peer_ = std::move(p); }
  const frame_limits& limits() const noexcept { return limits_; }

  // Server side (strand only): from the next frame on, reads and handlers run on io
  // context `to` (rpc_server chooses it at the first request, by the client process).
  // The socket moves at a frame boundary, with no read or write under way; a TLS
  // connection stays where it is (socket_placement.hpp).
  void move_to(asio::io_context& to) { placement_.request(to, io_.secure()); }

  bool closed() const { return writer_.closed(); }
  // The peer ended the stream (an orderly close, not an error): every byte it sent before
  // was read. Thread-safe.
  bool ended_by_peer() const noexcept { return ended_by_peer_.load(std::memory_order_acquire); }
  // True while frames wait in the write queue (an async write is under way).
  bool writing() const { return writer_.writing(); }

  // Runs f on this connection's strand (the strand it has when f runs: a connection
  // that moved meanwhile runs it on its new one).
  template <class F> void run(F&& f) {
    rt_->run_on(strand(), [self = shared_from_this(), f = std::forward<F>(f)]() mutable {
      if (!self->strand().running_in_this_thread())
        return self->run(std::move(f));
      f();
    });
  }

  // After connect/accept (socket_placement.hpp); learns the peer's address unless set.
  void configure_socket();

  // Server side, before the first read: what this connection holds for incomplete frames
  // is charged to `budget`, which may evict it (it then closes with an error reply).
  void attach_budget(const std::shared_ptr<receive_budget>& budget);

  // Liveness (liveness.hpp), thread-safe: how long ago this connection last received a
  // byte, zero while it is in the middle of a frame; when it last received one.
  std::chrono::steady_clock::duration idle_for(std::chrono::steady_clock::time_point now) const {
    return activity_.idle_for(now);
  }
  std::chrono::steady_clock::time_point last_received() const noexcept {
    return activity_.last_received();
  }
  // TCP keepalive as `l` says, after connect/accept.
  void enable_keepalive(const liveness_settings& l) { net::enable_keepalive(io_.socket(), l); }

  // Handshake helpers (strand only): closes the connection at `deadline`.
  void arm_deadline(std::chrono::steady_clock::time_point deadline, std::string what);
  void disarm_deadline() { timer_.cancel(); }

  // Reads exactly one handshake frame and hands it to cb (strand only).
  void read_one(once_fn cb) { reader_.read_one(std::move(cb)); }

  // ---- TLS (handshake.hpp; strand only, before the connection's first frame) ----
  bool secure() const noexcept { return io_.secure(); }
  // From now on the connection speaks TLS with ctx.
  void use_tls(std::shared_ptr<tls_context> ctx) { io_.use_tls(std::move(ctx)); }
  // The TLS handshake; done gets its error (the meaning: explain_tls_failure).
  void tls_handshake(std::function<void(std::error_code)> done) {
    io_.async_handshake(
        [self = shared_from_this(), done = std::move(done)](std::error_code ec) { done(ec); });
  }
  tls_failure explain_tls(const std::error_code& ec) {
    return explain_tls_failure(ec, io_.tls_handle(),
                               io_.tls() ? io_.tls()->settings().mode : tls_mode::off);
  }
  // The first byte the peer sent, without consuming it (a server telling a TLS client from
  // a plain one): cb gets it, or the error (eof: the peer closed first).
  void peek_first_byte(std::function<void(std::error_code, unsigned char)> cb);

  // Starts the read loop: every frame goes to the sink until the connection closes.
  void start(std::shared_ptr<frame_sink> sink);

  // Thread-safe. False when the connection is closed or has sent its end of stream (the
  // frame is dropped).
  bool send(out_frame&& f);

  // Thread-safe: closes now (pending writes are dropped).
  void close(std::string reason);

  // Thread-safe: closes once everything queued has been written.
  // linger (strand only): see linger_then_close().
  void close_after_flush(std::string reason, bool linger = false);

  // Thread-safe: a server going away closes each connection so. Once everything queued is
  // written it sends its end of stream, goes on reading, and closes once the peer has it
  // all: the peer closed its end in turn, or acknowledged every byte, the end included,
  // with nothing of its own left unread (an idle client, whose reads wait for a call, may
  // not look at the end for a while); at most linger_time. Closed at once in the
  // handshake. A socket closed with bytes unread, or before the peer has everything, is
  // reset, and a reset destroys what the peer has not yet received (a lost segment still
  // to be resent), where an end of stream comes after it.
  void finish(std::string reason);

  // Thread-safe, client side: the peer ended the stream of this connection's sibling in
  // order, and may have sent replies on this one before ending it too. Reads on until that
  // end, and closes with `reason` if it has not come within linger_time. Sends no end of
  // its own: a server finishing (finish()) still writing would take it for its client's.
  void read_to_end(std::string reason);

  // How long a closing connection waits for its peer's end of stream: a refused peer's
  // bytes are drained (linger_then_close), a finishing one's read, for at most this long.
  static constexpr std::chrono::milliseconds linger_time{1000};

private:
  // ---- frame_reader::owner ----
  std::shared_ptr<connection> self() override { return shared_from_this(); }

  // A frame boundary: the move a server asked for (move_to) happens here, with no read
  // or write under way (a write holds the move back to a later boundary). The read loop
  // then goes on on the new strand.
  bool moved_at_boundary() override;

  void ping() override { send(out_frame(encode_heartbeat(frame_kind::pong))); }

  void read_failed(std::error_code ec) override;

  // A malformed (or refused) frame: reply with the error when the bytes were a loom
  // frame, then close; past the handshake, lingering (linger_then_close).
  void refuse(const loom::error& e) override { refuse_with(e, reader_.has_sink()); }

  // A client that opened with a TLS handshake, on a connection without TLS. Its TLS
  // engine will read this reply as a record that is not TLS and say so (the peer "answered
  // in plain text", explain_tls_failure), rather than wait; lingering, as the rest of its
  // ClientHello is unread.
  void refuse_tls_client() override;

  // ---- closing (strand only) ----
  void refuse_with(const loom::error& e, bool linger);

  // Past the handshake a refused peer may still be sending the rest of its message:
  // closing with those bytes unread would reset the connection, and the peer would see
  // "connection reset" instead of the reply that says why. So once the reply is out,
  // stop sending, read and discard what comes (into a small scratch buffer: nothing is
  // held) until the peer closes or linger_time passes, then close.
  void linger_then_close(std::string reason);
  void drain(std::string reason);
  // finish()'s last stage: closes once the peer has everything (transport::delivered), or
  // at `deadline`; looks every 2 ms.
  void close_when_delivered(std::string reason, std::chrono::steady_clock::time_point deadline);
  bool finishing_ = false; // finish(): lingering reads through the read loop, not drain()
  std::atomic<bool> ended_by_peer_{false};

  // ---- writing (strand only): the writer's next batch, or the close it waited for ----
  void write_next();

  // `code`: the error the pending handshake read (if any) fails with.
  void do_close(const std::string& reason, error_code code = error_code::unavailable);

  static constexpr std::size_t drain_bytes = 16u << 10;

  // Order matters: each piece is built from those above it, and destroyed before them.
  std::shared_ptr<detail::io_runtime> rt_; // first: destroyed last
  socket_placement placement_;
  transport io_;
  asio::steady_timer timer_; // the handshake's deadline, then lingering's
  frame_limits limits_;
  log_fn log_;
  std::string peer_;
  link_activity activity_;
  receive_charge charge_; // server side only: a client's connection charges nothing
  frame_writer writer_;
  frame_reader reader_;
  std::unique_ptr<char[]> drain_; // linger_then_close()'s scratch
};

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net {

LOOM_COMPILED_ONCE void connection::configure_socket() {
  net::configure_socket(io_.socket());
  if (peer_.empty()) {
    std::error_code ec;
    const auto ep = io_.socket().remote_endpoint(ec);
    if (!ec)
      peer_ = to_string(ep);
  }
}

LOOM_COMPILED_ONCE void connection::attach_budget(const std::shared_ptr<receive_budget>& budget) {
  charge_.attach(budget, [w = weak_from_this()](std::string why) {
    if (auto c = w.lock())
      c->run([c, why = std::move(why)] {
        if (!c->closed()) // its read is still outstanding: close, without lingering
          c->refuse_with(resource_exhausted_error(c->reader_.budget_message(why)), false);
      });
  });
}

LOOM_COMPILED_ONCE void connection::arm_deadline(std::chrono::steady_clock::time_point deadline,
                                                 std::string what) {
  timer_.expires_at(deadline);
  timer_.async_wait([self = shared_from_this(), what = std::move(what)](std::error_code ec) {
    if (!ec)
      self->do_close("timed out " + what);
  });
}

LOOM_COMPILED_ONCE void
connection::peek_first_byte(std::function<void(std::error_code, unsigned char)> cb) {
  io_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(),
                                                   cb = std::move(cb)](std::error_code ec) mutable {
    unsigned char b = 0;
    if (!ec) {
      const std::size_t n =
          self->io_.socket().receive(asio::buffer(&b, 1), tcp::socket::message_peek, ec);
      if (ec == asio::error::would_block || ec == asio::error::try_again)
        return self->peek_first_byte(std::move(cb)); // a spurious wake-up
      if (!ec && n == 0)
        ec = asio::error::eof;
    }
    cb(ec, b);
  });
}

LOOM_COMPILED_ONCE void connection::start(std::shared_ptr<frame_sink> sink) {
  run([self = shared_from_this(), sink = std::move(sink)]() mutable {
    if (self->closed()) {
      sink->on_closed(self, "closed before it started");
      return;
    }
    self->reader_.start(std::move(sink));
  });
}

LOOM_COMPILED_ONCE bool connection::send(out_frame&& f) {
  switch (writer_.push(std::move(f))) {
  case frame_writer::pushed::dropped: return false;
  case frame_writer::pushed::start: run([self = shared_from_this()] { self->write_next(); }); break;
  case frame_writer::pushed::sent:
  case frame_writer::pushed::queued: break;
  }
  return true;
}

LOOM_COMPILED_ONCE void connection::close(std::string reason) {
  if (writer_.closed())
    return;
  run([self = shared_from_this(), reason = std::move(reason)] { self->do_close(reason); });
}

LOOM_COMPILED_ONCE void connection::close_after_flush(std::string reason, bool linger) {
  if (writer_.close_after_flush(reason, linger) != frame_writer::flush_close::now)
    return;
  if (linger)
    return linger_then_close(std::move(reason));
  close(std::move(reason));
}

LOOM_COMPILED_ONCE void connection::finish(std::string reason) {
  run([self = shared_from_this(), reason = std::move(reason)]() mutable {
    if (!self->reader_.has_sink() || self->reader_.in_handshake())
      return self->do_close(reason);
    self->finishing_ = true;
    self->close_after_flush(std::move(reason), true);
  });
}

LOOM_COMPILED_ONCE void connection::read_to_end(std::string reason) {
  run([self = shared_from_this(), reason = std::move(reason)] {
    if (self->closed())
      return;
    self->timer_.expires_after(linger_time);
    self->timer_.async_wait([self, reason](std::error_code e) {
      if (!e)
        self->do_close(reason);
    });
  });
}

LOOM_COMPILED_ONCE bool connection::moved_at_boundary() {
  if (!placement_.requested())
    return false;
  std::error_code failed;
  const bool moved = writer_.when_idle([&](bool closed) {
    if (closed) {
      placement_.cancel();
      return false;
    }
    return placement_.move(io_, timer_, failed);
  });
  if (failed)
    do_close("moving the connection to another io thread failed: " + failed.message());
  if (moved)
    asio::post(strand(), [self = shared_from_this()] { self->reader_.resume(); });
  return moved;
}

LOOM_COMPILED_ONCE void connection::read_failed(std::error_code ec) {
  std::string why;
  // Under TLS a peer that closes without close_notify reads as stream_truncated: the
  // same close (transport.hpp).
  if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated) {
    why = "the peer closed the connection";
    ended_by_peer_.store(true, std::memory_order_release);
  } else if (io_.secure() && ec.category() == asio::error::get_ssl_category()) {
    // A TLS alert: under TLS 1.3 a client learns that the server refused its certificate
    // only when it reads after its own handshake completed, as here. Said as what it
    // means, with its code (unauthenticated is not retried as unavailable is).
    const auto f = explain_tls(ec);
    return do_close("the TLS session with " + peer_ + " failed: " + f.why, f.code);
  } else if (ec == asio::error::operation_aborted)
    why = "the connection was closed";
  else
    why = ec.message();
  do_close(why);
}

LOOM_COMPILED_ONCE void connection::refuse_tls_client() {
  const std::string msg = "a TLS handshake from " + peer_ + ", but this server does not use TLS";
  log_line(log_, msg + "; closing that connection");
  send(out_frame(
      encode(auth_result_msg{status_of(error_code::failed_precondition),
                             "this server does not use TLS, and the client connected with TLS"})));
  close_after_flush(msg, true);
}

LOOM_COMPILED_ONCE void connection::refuse_with(const loom::error& e, bool linger) {
  const std::string msg = "bad frame from " + peer_ + ": " + e.what();
  log_line(log_, msg + "; closing that connection");
  const auto hb = reader_.header_bytes();
  if (has_magic(hb)) {
    out_frame f;
    if (reader_.in_handshake()) {
      f.head = encode(auth_result_msg{status_of(e.code()), e.message()});
    } else {
      envelope env;
      env.status = status_of(e.code());
      env.message = e.message();
      encode_head(f.head, frame_kind::response, peek_request_id(hb), env, {}, empty{});
      detail::patch_u16(f.head, 6, frame_flag_closing);
    }
    send(std::move(f));
  }
  close_after_flush(msg, linger);
}

LOOM_COMPILED_ONCE void connection::linger_then_close(std::string reason) {
  writer_.end(); // a pong or a reply after the end is dropped, not written
  io_.shutdown_send();
  if (finishing_) // the read loop reads on, and closes at the peer's end of stream
    return close_when_delivered(std::move(reason), std::chrono::steady_clock::now() + linger_time);
  timer_.expires_after(linger_time);
  timer_.async_wait([self = shared_from_this(), reason](std::error_code e) {
    if (!e)
      self->do_close(reason);
  });
  drain_.reset(new char[drain_bytes]);
  drain(std::move(reason));
}

LOOM_COMPILED_ONCE void
connection::close_when_delivered(std::string reason,
                                 std::chrono::steady_clock::time_point deadline) {
  if (closed())
    return;
  if (io_.delivered() || std::chrono::steady_clock::now() >= deadline)
    return do_close(reason);
  timer_.expires_after(std::chrono::milliseconds(2));
  timer_.async_wait(
      [self = shared_from_this(), reason = std::move(reason), deadline](std::error_code e) mutable {
        if (!e)
          self->close_when_delivered(std::move(reason), deadline);
      });
}

LOOM_COMPILED_ONCE void connection::drain(std::string reason) {
  io_.async_discard(asio::buffer(drain_.get(), drain_bytes),
                    [self = shared_from_this(), reason](std::error_code ec, std::size_t) {
                      if (ec)
                        return self->do_close(reason);
                      self->drain(reason);
                    });
}

LOOM_COMPILED_ONCE void connection::write_next() {
  auto step = writer_.next();
  switch (step.what) {
  case frame_writer::step::stop: return;
  case frame_writer::step::close:
    if (step.linger)
      return linger_then_close(std::move(step.reason));
    return do_close(step.reason);
  case frame_writer::step::write:
    io_.async_write(writer_.buffers(),
                    [self = shared_from_this()](std::error_code ec, std::size_t) {
                      if (ec)
                        return self->do_close("writing failed: " + ec.message());
                      if (self->writer_.written())
                        self->write_next();
                    });
    return;
  }
}

LOOM_COMPILED_ONCE void connection::do_close(const std::string& reason, error_code code) {
  if (!writer_.close())
    return;
  io_.close(); // cancels the pending operations: nothing touches the buffers after this
  timer_.cancel();
  auto [sink, once] = reader_.stop();
  writer_.clear();
  auto self = shared_from_this();
  if (once)
    once(make_error(code, reason), incoming_frame{});
  if (sink)
    sink->on_closed(self, reason);
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// The two sides of the connection handshake (auth.hpp has the records and the
// proofs): the client's, run by net::channel after each TCP connect, and the
// server's, run by net::rpc_server on each accepted socket. Both run on the
// connection's strand, one frame at a time, and end exactly once: the client's
// with `done(nullptr)` or `done(error)`, the server's by admitting the
// connection (its frames then go to the sink `admit` returns) or by refusing it
// with an auth_result that says why.
//
// With TLS (tls.hpp) the TLS handshake comes first and the token handshake runs inside
// it. A TLS server looks at the first byte a client sends: a TLS record starts its TLS
// handshake; the first byte of a loom frame means a client without TLS, whose hello is
// read and answered, in plain text, with an auth_result saying that this server requires
// TLS. (A plain server answers a TLS ClientHello in plain text too: connection.hpp.) So a
// mismatch is one clear error on the client, naming the server, never a hang.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/net/auth.hpp>
#include <loom/net/connection.hpp>
#include <loom/net/frame.hpp>
#include <loom/net/log.hpp>
#include <loom/net/tls.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace loom::net {

// What a client says about itself: which of its two connections this is, its
// token (if any), the id that pairs its control and bulk connections, and the
// id of its process (a server serves one process's connections on one thread).
struct client_identity {
  connection_role role = connection_role::control;
  std::optional<std::string> token;
  std::uint64_t client_id = 0;
  std::uint64_t process_id = 0;
};

namespace detail {

class client_handshake : public std::enable_shared_from_this<client_handshake> {
public:
  using done_fn = std::function<void(std::exception_ptr)>;

  client_handshake(std::shared_ptr<connection> c, client_identity who, std::string peer,
                   done_fn done)
      : c_(std::move(c)), who_(std::move(who)), peer_(std::move(peer)), done_(std::move(done)) {}

  void start();

private:
  void send_hello();

  void on_challenge(std::exception_ptr err, incoming_frame&& f);

  void on_result(bool server_proven, incoming_frame&& f);

  void expect(const incoming_frame& f, frame_kind k, std::string_view what) const;

  void fail(std::exception_ptr e);

  std::shared_ptr<connection> c_;
  client_identity who_;
  std::string peer_;
  done_fn done_;
  nonce client_nonce_ = random_nonce();
};

class server_handshake : public std::enable_shared_from_this<server_handshake> {
public:
  // Gets the connection and the client's hello (who it is: what the server keeps of it).
  using admit_fn = std::function<std::shared_ptr<frame_sink>(const std::shared_ptr<connection>&,
                                                             const hello_msg&)>;
  using drop_fn = std::function<void(const std::shared_ptr<connection>&)>;

  server_handshake(std::shared_ptr<connection> c, std::optional<std::string> token,
                   std::shared_ptr<tls_context> tls, std::string address, log_fn log,
                   admit_fn admit, drop_fn drop)
      : c_(std::move(c)), token_(std::move(token)), tls_(std::move(tls)),
        address_(std::move(address)), log_(std::move(log)), admit_(std::move(admit)),
        drop_(std::move(drop)) {}

  void start(std::chrono::steady_clock::time_point deadline);

private:
  void read_hello();

  // Runs a step; a loom::error it throws refuses the connection with that error.
  template <class F> void guarded(F&& step) {
    try {
      step();
    } catch (const loom::error& e) {
      log_line(log_, "handshake with " + c_->peer() + " failed: " + e.what());
      refuse(e.code(), e.message());
    }
  }

  void on_hello(incoming_frame&& f);

  void on_auth(incoming_frame&& f);

  void refuse(error_code code, const std::string& why) {
    c_->send(out_frame(encode(auth_result_msg{status_of(code), why})));
    c_->close_after_flush(why);
    drop_(c_);
  }

  std::shared_ptr<connection> c_;
  std::optional<std::string> token_;
  std::shared_ptr<tls_context> tls_; // null: no TLS
  std::string address_;
  log_fn log_;
  admit_fn admit_;
  drop_fn drop_;
  hello_msg hello_{};
  challenge_msg challenge_{};
};

} // namespace detail

// Client side, on c's strand once its TCP connect succeeded (a connection given TLS,
// connection::use_tls, completes its TLS handshake first). `done` gets nullptr once the
// server has admitted this client (and, with a token, proven that it knows it), else the
// error, with c closed.
LOOM_COMPILED_ONCE void start_client_handshake(std::shared_ptr<connection> c, client_identity who,
                                               std::string peer,
                                               std::function<void(std::exception_ptr)> done);

// Server side, on c's strand once it was accepted; with `tls` (null: none) the client must
// complete a TLS handshake first. A client that proves itself (or needs not: no token on
// either side) is handed to `admit` with its hello, which returns the sink for its frames (null:
// the server is stopping and closes c itself); one that fails, times out at `deadline` or closes is
// handed to `drop`.
LOOM_COMPILED_ONCE void start_server_handshake(std::shared_ptr<connection> c,
                                               std::optional<std::string> token,
                                               std::shared_ptr<tls_context> tls,
                                               std::string address, log_fn log,
                                               std::chrono::steady_clock::time_point deadline,
                                               detail::server_handshake::admit_fn admit,
                                               detail::server_handshake::drop_fn drop);

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net::detail {

LOOM_COMPILED_ONCE void client_handshake::start() {
  if (!c_->secure())
    return send_hello();
  c_->tls_handshake([self = shared_from_this()](std::error_code ec) {
    if (!ec)
      return self->send_hello();
    const auto f = self->c_->explain_tls(ec);
    self->fail(make_error(f.code, "the TLS handshake with " + self->peer_ + " failed: " + f.why));
  });
}

LOOM_COMPILED_ONCE void client_handshake::send_hello() {
  try {
    c_->send(out_frame(encode(hello_msg{who_.role, who_.token.has_value(), who_.client_id,
                                        client_nonce_, who_.process_id})));
    c_->read_one([self = shared_from_this()](std::exception_ptr err, incoming_frame&& f) {
      self->on_challenge(err, std::move(f));
    });
  } catch (...) {
    fail(std::current_exception());
  }
}

LOOM_COMPILED_ONCE void client_handshake::on_challenge(std::exception_ptr err, incoming_frame&& f) {
  try {
    if (err)
      std::rethrow_exception(err);
    if (f.header.kind == frame_kind::auth_result) // the server refused the hello
      return on_result(true, std::move(f));
    expect(f, frame_kind::challenge, "a challenge");
    const challenge_msg ch = decode_challenge(f.metadata_bytes());
    if (!ch.token_required && who_.token)
      throw unauthenticated_error(
          peer_ + " has no cluster token but this process has one; refusing to talk to a "
                  "server that cannot prove it knows the token");
    bool server_proven = true;
    auth_msg a;
    if (who_.token) {
      server_proven = equal_digests(
          ch.proof, server_proof(*who_.token, client_nonce_, ch.server_nonce, who_.client_id));
      a.has_proof = true;
      a.proof = client_proof(*who_.token, client_nonce_, ch.server_nonce, who_.client_id);
    }
    c_->send(out_frame(encode(a)));
    c_->read_one(
        [self = shared_from_this(), server_proven](std::exception_ptr e2, incoming_frame&& f2) {
          try {
            if (e2)
              std::rethrow_exception(e2);
            self->on_result(server_proven, std::move(f2));
          } catch (...) {
            self->fail(std::current_exception());
          }
        });
  } catch (...) {
    fail(std::current_exception());
  }
}

LOOM_COMPILED_ONCE void client_handshake::on_result(bool server_proven, incoming_frame&& f) {
  expect(f, frame_kind::auth_result, "an auth_result");
  const auto r = decode_auth_result(f.metadata_bytes());
  if (r.status != 0) {
    c_->close("refused by the server");
    done_(make_error(static_cast<error_code>(r.status - 1),
                     peer_ + " refused the connection: " + r.message));
    return;
  }
  if (!server_proven)
    throw unauthenticated_error(peer_ + " could not prove it knows the cluster token (wrong "
                                        "token on one side?)");
  c_->disarm_deadline();
  done_(nullptr);
}

LOOM_COMPILED_ONCE void client_handshake::expect(const incoming_frame& f, frame_kind k,
                                                 std::string_view what) const {
  if (f.header.kind != k)
    throw data_loss_error("expected " + std::string(what) + " frame from " + peer_ + ", got " +
                          std::string(to_string(f.header.kind)));
}

LOOM_COMPILED_ONCE void client_handshake::fail(std::exception_ptr e) {
  c_->close("handshake failed");
  try {
    std::rethrow_exception(e);
  } catch (const unavailable_error& u) {
    done_(make_error(error_code::unavailable,
                     "the connection closed during the handshake: " + u.message()));
  } catch (...) {
    done_(std::current_exception());
  }
}

LOOM_COMPILED_ONCE void server_handshake::start(std::chrono::steady_clock::time_point deadline) {
  c_->arm_deadline(deadline, "waiting for the handshake of " + c_->peer());
  if (!tls_)
    return read_hello();
  c_->peek_first_byte([self = shared_from_this()](std::error_code ec, unsigned char first) {
    if (ec)
      return self->drop_(self->c_);
    if (first == static_cast<unsigned char>(frame_magic[0]))
      return self->read_hello(); // a client without TLS: refused on its hello
    self->c_->use_tls(self->tls_);
    self->c_->tls_handshake([self](std::error_code e) {
      if (!e)
        return self->read_hello();
      if (!self->c_->closed()) { // not the deadline's or the server's own close
        log_line(self->log_, "the TLS handshake with " + self->c_->peer() +
                                 " failed: " + self->c_->explain_tls(e).why);
        // Lingering: the client may have sent more behind its handshake, and closing
        // with it unread would reset the connection over the alert that says why.
        self->c_->close_after_flush("the TLS handshake failed", true);
      }
      self->drop_(self->c_);
    });
  });
}

LOOM_COMPILED_ONCE void server_handshake::read_hello() {
  c_->read_one([self = shared_from_this()](std::exception_ptr err, incoming_frame&& f) {
    if (err)
      return self->drop_(self->c_);
    self->guarded([&] { self->on_hello(std::move(f)); });
  });
}

LOOM_COMPILED_ONCE void server_handshake::on_hello(incoming_frame&& f) {
  if (f.header.kind != frame_kind::hello)
    throw data_loss_error("expected a hello frame, got " + std::string(to_string(f.header.kind)));
  hello_ = decode_hello(f.metadata_bytes());
  if (tls_ && !c_->secure()) {
    log_line(log_, "rejected a connection from " + c_->peer() + ": it does not use TLS");
    return refuse(error_code::failed_precondition,
                  "the server at " + address_ + " requires " + tls_->settings().describe() +
                      ", and this client connected without TLS; give every task and client "
                      "the same TLS settings (LOOM_TLS, or LOOM_TLS_CERT, LOOM_TLS_KEY and "
                      "LOOM_TLS_CA; the flags --tls, --tls_cert, --tls_key, --tls_ca)");
  }
  challenge_.token_required = token_.has_value();
  challenge_.server_nonce = random_nonce();
  if (token_ && hello_.has_token)
    challenge_.proof =
        server_proof(*token_, hello_.client_nonce, challenge_.server_nonce, hello_.client_id);
  c_->send(out_frame(encode(challenge_)));
  c_->read_one([self = shared_from_this()](std::exception_ptr err, incoming_frame&& f2) {
    if (err)
      return self->drop_(self->c_);
    self->guarded([&] { self->on_auth(std::move(f2)); });
  });
}

LOOM_COMPILED_ONCE void server_handshake::on_auth(incoming_frame&& f) {
  if (f.header.kind != frame_kind::auth)
    throw data_loss_error("expected an auth frame, got " + std::string(to_string(f.header.kind)));
  const auth_msg a = decode_auth(f.metadata_bytes());
  if (token_) {
    if (!a.has_proof) {
      log_line(log_,
               "rejected a connection from " + c_->peer() + ": it presented no cluster token");
      return refuse(error_code::unauthenticated,
                    "the server at " + address_ +
                        " requires a cluster token and this client has none (set "
                        "LOOM_CLUSTER_TOKEN or LOOM_CLUSTER_TOKEN_FILE)");
    }
    if (!equal_digests(a.proof, client_proof(*token_, hello_.client_nonce, challenge_.server_nonce,
                                             hello_.client_id))) {
      log_line(log_, "rejected a connection from " + c_->peer() + ": wrong cluster token");
      return refuse(error_code::unauthenticated,
                    "the server at " + address_ + " rejected this client's cluster token");
    }
  } else if (a.has_proof || hello_.has_token) {
    log_line(log_, "rejected a connection from " + c_->peer() +
                       ": it has a cluster token and this server has none");
    return refuse(error_code::unauthenticated,
                  "the server at " + address_ +
                      " has no cluster token, but this client has one; configure the same "
                      "token on both sides");
  }
  c_->disarm_deadline();
  auto sink = admit_(c_, hello_);
  if (!sink) // the server is stopping and closes the connection itself
    return;
  c_->send(out_frame(encode(auth_result_msg{0, {}})));
  c_->start(std::move(sink));
}
} // namespace loom::net::detail

namespace loom::net {

LOOM_COMPILED_ONCE void start_client_handshake(std::shared_ptr<connection> c, client_identity who,
                                               std::string peer,
                                               std::function<void(std::exception_ptr)> done) {
  std::make_shared<detail::client_handshake>(std::move(c), std::move(who), std::move(peer),
                                             std::move(done))
      ->start();
}

LOOM_COMPILED_ONCE void start_server_handshake(std::shared_ptr<connection> c,
                                               std::optional<std::string> token,
                                               std::shared_ptr<tls_context> tls,
                                               std::string address, log_fn log,
                                               std::chrono::steady_clock::time_point deadline,
                                               detail::server_handshake::admit_fn admit,
                                               detail::server_handshake::drop_fn drop) {
  std::make_shared<detail::server_handshake>(std::move(c), std::move(token), std::move(tls),
                                             std::move(address), std::move(log), std::move(admit),
                                             std::move(drop))
      ->start(deadline);
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

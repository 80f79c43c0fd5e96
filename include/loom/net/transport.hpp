// The byte stream under a connection (connection.hpp): plain TCP, or TLS over that TCP
// socket (tls.hpp). One type with one set of operations, so the frame code above reads and
// writes the same way over both; only this file knows which it is.
//
// What differs under TLS, and why:
// - Reading without waiting (read_ready) reads only what OpenSSL has already decrypted (the
//   rest of the current record, SSL_pending): such a read never touches the socket, so it
//   never has to write (a TLS read that reaches the socket may, for a key update, and that
//   must go through asio's asynchronous engine). The rest is read by async_read, a record at
//   a time. So a small message, one record, is read in one turn as over TCP (its header by
//   the asynchronous read, the rest at once), not one trip through the scheduler per part.
// - There is no native handle to sendmsg() on: the connection's direct send is plain TCP's.
// - Closing and lingering act on the TCP socket, without TLS's close_notify: every loom
//   message carries its length, so a peer that stops mid-message is seen as a truncated
//   message whether or not the TLS stream said goodbye. Bytes drained while lingering are
//   read raw (they are discarded, decrypted or not).
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/net/tls.hpp>

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/ssl/stream.hpp>
#include <asio/strand.hpp>
#include <asio/write.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <system_error>
#include <utility>

#ifdef __linux__
#include <linux/sockios.h> // SIOCOUTQ
#include <sys/ioctl.h>
#endif

namespace loom::net {

class transport {
public:
  using tcp = asio::ip::tcp;
  using strand_type = asio::strand<asio::io_context::executor_type>;

  explicit transport(const strand_type& strand) : sock_(strand) {}
  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;

  // The TCP socket: to connect, accept, set options on and close.
  tcp::socket& socket() noexcept { return sock_; }

  bool secure() const noexcept { return tls_ != nullptr; }
  // The OpenSSL connection (null without TLS): for what a failed handshake means.
  SSL* tls_handle() noexcept { return tls_ ? tls_->native_handle() : nullptr; }
  const tls_context* tls() const noexcept { return ctx_.get(); }

  // From now on the bytes go through TLS with `ctx` (called before any byte of the
  // connection is sent or received).
  void use_tls(std::shared_ptr<tls_context> ctx);

  // The TLS handshake, as the context's role.
  template <class Handler> void async_handshake(Handler&& h) {
    tls_->async_handshake(ctx_->role() == tls_role::server ? asio::ssl::stream_base::server
                                                           : asio::ssl::stream_base::client,
                          std::forward<Handler>(h));
  }

  // Reads what has already arrived, without waiting: would_block when nothing has (under
  // TLS, what is decrypted already; see the top of this file).
  template <class Buffers> std::size_t read_ready(const Buffers& b, std::error_code& ec) {
    if (!tls_)
      return sock_.read_some(b, ec);
    const int decrypted = SSL_pending(tls_->native_handle());
    const asio::mutable_buffer first = *asio::buffer_sequence_begin(b);
    if (decrypted <= 0 || first.size() == 0) {
      ec = asio::error::would_block;
      return 0;
    }
    return tls_->read_some(
        asio::buffer(first.data(), std::min(first.size(), static_cast<std::size_t>(decrypted))),
        ec);
  }

  // Bytes of the stream that can be read now without waiting (0 under TLS: what the
  // socket holds is ciphertext).
  std::size_t available(std::error_code& ec) {
    if (tls_)
      return 0;
    return sock_.available(ec);
  }

  template <class Buffers, class Condition, class Handler>
  void async_read(const Buffers& b, Condition&& until, Handler&& h) {
    if (tls_)
      asio::async_read(*tls_, b, std::forward<Condition>(until), std::forward<Handler>(h));
    else
      asio::async_read(sock_, b, std::forward<Condition>(until), std::forward<Handler>(h));
  }

  // Reads what arrives next, at least one byte (or fails).
  template <class Buffer, class Handler> void async_read_some(const Buffer& b, Handler&& h) {
    if (tls_)
      tls_->async_read_some(b, std::forward<Handler>(h));
    else
      sock_.async_read_some(b, std::forward<Handler>(h));
  }

  template <class Buffers, class Handler> void async_write(const Buffers& b, Handler&& h) {
    if (tls_)
      asio::async_write(*tls_, b, std::forward<Handler>(h));
    else
      asio::async_write(sock_, b, std::forward<Handler>(h));
  }

  // Reads and drops raw bytes (a refused peer's, while lingering).
  template <class Buffer, class Handler> void async_discard(const Buffer& b, Handler&& h) {
    sock_.async_read_some(b, std::forward<Handler>(h));
  }

  void shutdown_send() {
    std::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_send, ec);
  }

  // True once the peer has acknowledged every byte written, an end of stream included,
  // and nothing it sent waits unread: closing then resets nothing and loses nothing. False
  // where the system cannot tell (not Linux).
  bool delivered() {
#ifdef __linux__
    int unacknowledged = 0;
    if (::ioctl(sock_.native_handle(), SIOCOUTQ, &unacknowledged) != 0 || unacknowledged != 0)
      return false;
    std::error_code ec;
    return sock_.available(ec) == 0 && !ec;
#else
    return false;
#endif
  }

  // Cancels the pending operations: nothing touches their buffers afterwards.
  void close() {
    std::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
  }

private:
  using tls_stream = asio::ssl::stream<tcp::socket&>;

  tcp::socket sock_;
  std::shared_ptr<tls_context> ctx_;
  std::unique_ptr<tls_stream> tls_; // over sock_
};

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net {

LOOM_COMPILED_ONCE void transport::use_tls(std::shared_ptr<tls_context> ctx) {
  ctx_ = std::move(ctx);
  tls_ = std::make_unique<tls_stream>(sock_, ctx_->native());
  // asio asks OpenSSL to free a connection's buffers whenever they empty; a loom
  // connection reads and writes all its life, so keep them (2 x ~17 KiB).
  SSL_clear_mode(tls_->native_handle(), SSL_MODE_RELEASE_BUFFERS);
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

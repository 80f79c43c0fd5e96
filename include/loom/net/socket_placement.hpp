// Which io thread a connection lives on (connection.hpp): its strand, and the one move a
// server makes of it. rpc_server moves a connection at its first request to the io
// context serving its client's process (server.hpp, settle()); the move happens at a frame
// boundary, with no read or write under way, by handing the socket's descriptor to a new
// socket on the new context (asio binds a socket to its context for life). A TLS
// connection stays where it is: its OpenSSL stream is bound to the socket object.
//
// Also the options every connection's socket gets once connected or accepted.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/net/transport.hpp>

#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#define LOOM_NET_MOVABLE_SOCKETS 1 // socket::release() and ::close()
#endif

#include <mutex>
#include <string>
#include <system_error>
#include <utility>

namespace loom::net {

// After connect/accept: TCP_NODELAY (control messages are latency bound) and non-blocking
// (the read loop reads what has arrived without waiting).
inline void configure_socket(asio::ip::tcp::socket& sock) {
  std::error_code ec;
  sock.set_option(asio::ip::tcp::no_delay(true), ec);
  sock.non_blocking(true, ec);
}

class socket_placement {
public:
  using strand_type = asio::strand<asio::io_context::executor_type>;

  explicit socket_placement(asio::io_context& ctx) : strand_(asio::make_strand(ctx)) {}

  // Fixed but for one move(): read under a lock (other threads post to it).
  strand_type strand() const {
    std::lock_guard lk(mu_);
    return strand_;
  }
  asio::io_context& context() const { return strand().get_inner_executor().context(); }

  // From the next frame boundary on, the connection is to live on `to` (strand only).
  // Nothing to do where it is already there, or where it cannot move (TLS).
  void request([[maybe_unused]] asio::io_context& to, [[maybe_unused]] bool secure) {
#ifdef LOOM_NET_MOVABLE_SOCKETS
    if (&to != &context() && !secure)
      move_to_ = &to;
#endif
  }
  // A move was requested and has not happened (strand only).
  bool requested() const noexcept {
    return move_to_ != nullptr;
  }
  // The connection closed: no move.
  void cancel() noexcept {
    move_to_ = nullptr;
  }

  // The requested move (strand only; the caller makes sure nothing is read or written
  // meanwhile): io's socket and `timer` go to a new strand on the requested context. True
  // when they moved. False when they stayed; `failed` is set when the descriptor left the
  // old socket and could not be given to the new one (it is closed then, as the connection
  // must be). Either way the request is spent.
  bool move([[maybe_unused]] transport& io, [[maybe_unused]] asio::steady_timer& timer,
            [[maybe_unused]] std::error_code& failed);

private:
  mutable std::mutex mu_; // guards strand_, which move() changes once
  strand_type strand_;
  asio::io_context* move_to_ = nullptr; // request()'s context, until the move (strand only)
};

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net {

LOOM_COMPILED_ONCE bool socket_placement::move([[maybe_unused]] transport& io,
                                               [[maybe_unused]] asio::steady_timer& timer,
                                               [[maybe_unused]] std::error_code& failed) {
#ifndef LOOM_NET_MOVABLE_SOCKETS
  return false;
#else
  const strand_type to = asio::make_strand(*std::exchange(move_to_, nullptr));
  std::error_code ec;
  const auto protocol = io.socket().local_endpoint(ec).protocol();
  if (ec)
    return false; // closing: the read that follows says why
  const auto fd = io.socket().release(ec);
  if (ec)
    return false; // still the old socket's: it stays where it is
  asio::ip::tcp::socket moved_socket(to);
  moved_socket.assign(protocol, fd, ec);
  if (ec) {
    ::close(fd);
    failed = ec;
    return false;
  }
  moved_socket.non_blocking(true, ec); // as configure_socket() left it: reads never wait
  io.socket() = std::move(moved_socket);
  timer = asio::steady_timer(to);
  std::lock_guard lk(mu_);
  strand_ = to;
  return true;
#endif
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

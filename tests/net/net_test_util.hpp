// Helpers shared by the net tests: log capture and a raw (unframed) client socket.
#pragma once

#include <loom/core/tensor.hpp>
#include <loom/net/rpc.hpp>

#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace loom::net::testing {

// Whether two tensors hold the same dtype, shape and bytes (the tests' one copy of it:
// a test binary's files share a unit).
inline bool same_bytes(const any_tensor& a, const any_tensor& b) {
  return a.type() == b.type() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.byte_size()) == 0;
}

// Collects the layer's log lines (thread-safe).
struct log_capture {
  std::mutex m;
  std::condition_variable logged;
  std::vector<std::string> lines;

  log_fn fn() {
    return [this](std::string_view s) {
      {
        std::lock_guard lk(m);
        lines.emplace_back(s);
      }
      logged.notify_all();
    };
  }
  bool contains(std::string_view needle) {
    std::lock_guard lk(m);
    return has_locked(needle);
  }
  // Waits (up to `timeout`) for a line with `needle`: a peer's side of a failure is
  // logged on its own thread, maybe after this side has seen the failure.
  bool wait_for(std::string_view needle,
                std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock lk(m);
    return logged.wait_for(lk, timeout, [&] { return has_locked(needle); });
  }
  bool has_locked(std::string_view needle) const {
    return std::any_of(lines.begin(), lines.end(),
                       [&](const std::string& l) { return l.find(needle) != std::string::npos; });
  }
  std::string all() {
    std::lock_guard lk(m);
    std::string s;
    for (auto& l : lines)
      s += l + "\n";
    return s;
  }
};

// Options for a loopback server / channel with an explicit token ("" = none),
// so the tests never depend on the environment.
inline rpc_server_options local_server(std::string token = "", log_fn log = {}) {
  rpc_server_options o;
  o.token = std::move(token);
  o.log = std::move(log);
  return o;
}
inline channel_options local_channel(std::string token = "", log_fn log = {}) {
  channel_options o;
  o.peer_name = "ps task 0";
  o.token = std::move(token);
  o.log = std::move(log);
  o.connect_timeout = std::chrono::seconds(10);
  o.default_timeout = std::chrono::seconds(30);
  return o;
}

inline std::string local_address(const rpc_server& s) {
  return "127.0.0.1:" + std::to_string(s.port());
}

// A blocking TCP socket speaking raw bytes; every read gives up after 10 s.
class raw_client {
public:
  explicit raw_client(std::uint16_t port) : sock_(io_) {
    sock_.connect({asio::ip::make_address("127.0.0.1"), port});
    timeval tv{10, 0};
    ::setsockopt(sock_.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  void write(std::string_view bytes) {
    asio::write(sock_, asio::buffer(bytes.data(), bytes.size()));
  }
  // Each write() goes out at once as its own segment (no Nagle coalescing).
  void no_delay() { sock_.set_option(asio::ip::tcp::no_delay(true)); }

  // Reads one frame's header and metadata (payloads must be absent).
  decoded_frame read_frame() {
    std::string buf(header_size, '\0');
    asio::read(sock_, asio::buffer(buf));
    const auto h = parse_header(std::as_bytes(std::span<const char>(buf.data(), buf.size())), {});
    std::string meta(h.metadata_bytes, '\0');
    if (!meta.empty())
      asio::read(sock_, asio::buffer(meta));
    buf += meta;
    return decode_frame(std::as_bytes(std::span<const char>(buf.data(), buf.size())));
  }

  // True when the server closed the connection (EOF or reset) rather than the read timing out.
  bool closed_by_peer() {
    char c[4096];
    for (;;) {
      std::error_code ec;
      const auto n = sock_.read_some(asio::buffer(c), ec);
      if (ec == asio::error::eof || ec == asio::error::connection_reset)
        return true;
      if (ec)
        return false; // timeout or other
      (void)n;        // discard whatever the server sent first (an error reply)
    }
  }

  // The client side of the handshake without a token.
  void handshake() {
    write(encode(hello_msg{connection_role::control, false, 42, random_nonce()}));
    const auto ch = read_frame();
    if (ch.header.kind != frame_kind::challenge)
      throw std::runtime_error("expected a challenge");
    write(encode(auth_msg{}));
    const auto r = read_frame();
    const auto res = decode_auth_result(std::as_bytes(std::span<const char>(r.metadata)));
    if (r.header.kind != frame_kind::auth_result || res.status != 0)
      throw std::runtime_error("handshake refused: " + res.message);
  }

  void close() {
    std::error_code ec;
    sock_.close(ec);
  }

private:
  asio::io_context io_;
  asio::ip::tcp::socket sock_;
};

} // namespace loom::net::testing

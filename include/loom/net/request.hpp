// What an rpc_server's handler sees (server.hpp): the request, what its allocator sees
// before the payloads are read, and the responder, the right to answer once, from any
// thread. A dropped responder answers for the handler (internal_error), so a caller never
// waits for a reply that cannot come.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/net/connection.hpp>
#include <loom/net/frame.hpp>
#include <loom/net/frame_sink.hpp>
#include <loom/net/server_registry.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::net {

namespace detail {
class server_core; // fills in a request
struct reply_state;
LOOM_COMPILED_ONCE void send_error_reply(reply_state& st, error_code code,
                                         const std::string& message);

// The server's side of a reply (server.hpp): which of the client's connections carries it.
class reply_router {
public:
  virtual ~reply_router() = default;
  // The connection to send st's reply of payload_bytes on instead of the one its request
  // came on; null: that one.
  virtual std::shared_ptr<connection> route(const reply_state& st, std::uint64_t payload_bytes) = 0;
};

// Shared by the responder and the dispatcher. When the last reference goes and
// nobody answered (the handler dropped its responder), it answers with
// internal_error, so a caller never waits for a reply that cannot come.
struct reply_state {
  std::shared_ptr<connection> conn;
  std::shared_ptr<served_connection> served; // conn's client; counts this request in flight
  std::weak_ptr<reply_router> router;
  std::uint64_t id = 0;
  std::uint64_t client_id = 0;
  std::string method;
  std::atomic<bool> done{false};
  std::atomic<bool> counted{true}; // still counted in served->in_flight

  // The reply is on its way (handed to the connection): the request is no longer in
  // flight, though a responder may outlive it. Once.
  void uncount() noexcept {
    if (served && counted.exchange(false))
      served->in_flight.fetch_sub(1, std::memory_order_relaxed);
  }

  reply_state() = default;
  reply_state(const reply_state&) = delete;
  reply_state& operator=(const reply_state&) = delete;
  ~reply_state();
};

LOOM_COMPILED_ONCE void send_reply(reply_state& st, out_frame&& f, std::uint64_t payload_bytes);
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

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net::detail {

LOOM_COMPILED_ONCE reply_state::~reply_state() {
  if (conn && !done.exchange(true)) {
    try {
      send_error_reply(*this, error_code::internal,
                       "the handler of '" + method + "' dropped the request without replying");
    } catch (...) {
    }
  }
  uncount();
}

LOOM_COMPILED_ONCE void send_reply(reply_state& st, out_frame&& f, std::uint64_t payload_bytes) {
  auto c = st.conn;
  if (auto r = st.router.lock())
    if (auto other = r->route(st, payload_bytes))
      c = std::move(other);
  c->send(std::move(f)); // a closed connection drops it: the client has already failed the call
  st.uncount();
}

LOOM_COMPILED_ONCE void send_error_reply(reply_state& st, error_code code,
                                         const std::string& message) {
  out_frame f;
  envelope env;
  env.status = status_of(code);
  env.message = message;
  encode_head(f.head, frame_kind::response, st.id, env, {}, empty{});
  send_reply(st, std::move(f), 0);
}

} // namespace loom::net::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

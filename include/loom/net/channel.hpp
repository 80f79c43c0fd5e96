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
//
// The channel is a thin owner of its core (channel_core.hpp), which puts the pieces
// together: the options (channel_options.hpp), the calls in flight (call_table.hpp) and
// their handles (call_handle.hpp) with their response (response.hpp), the dialer
// (dialer.hpp: connects and retries) and the heartbeat (heartbeat.hpp). What is left here
// is a call's making: its deadline, its id and its frame.
#pragma once

#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/net/call_handle.hpp>
#include <loom/net/call_table.hpp>
#include <loom/net/channel_core.hpp>
#include <loom/net/channel_options.hpp>
#include <loom/net/frame.hpp>
#include <loom/net/response.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::net {

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

// What a net::channel (channel.hpp) is told: channel_options, once, when it is made, and
// call_options, per call. Their own header so that code which configures channels (the
// runtime's worker cache, sessions) needs none of the channel's machinery to name them.
#pragma once

#include <loom/cluster/liveness_settings.hpp>
#include <loom/cluster/tls_settings.hpp>
#include <loom/core/tensor.hpp>
#include <loom/net/frame_header.hpp>
#include <loom/net/log.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
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

} // namespace loom::net

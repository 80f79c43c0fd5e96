// What an rpc_server is told (rpc_server_options) and what it reports (server_stats): the
// options on their own, so that code that configures a server (the cluster's task
// servers, the tools) need not read the server's machinery to find them.
#pragma once

#include <loom/cluster/liveness_settings.hpp>
#include <loom/cluster/tls_settings.hpp>
#include <loom/net/frame.hpp>
#include <loom/net/log.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace loom::net {

struct rpc_server_options {
  std::string host = "127.0.0.1"; // where it listens: an address, a name, 0.0.0.0 or ::
  std::uint16_t port = 0;         // 0: the OS chooses; see rpc_server::port()
  // Where clients reach it (a cluster task's cluster-spec host), as address() and the
  // errors it sends say; empty: host.
  std::string advertised_host{};
  int threads = 2; // io threads (handlers run on them)
  // The cluster token. nullopt: LOOM_CLUSTER_TOKEN / LOOM_CLUSTER_TOKEN_FILE; "": none.
  std::optional<std::string> token{};
  // Serve beyond loopback without a token (also LOOM_ALLOW_INSECURE=1).
  bool allow_insecure = false;
  // TLS (cluster/tls_settings.hpp). nullopt: LOOM_TLS / LOOM_TLS_CERT, _KEY, _CA.
  std::optional<tls_settings> tls{};
  // TCP keepalive on the connections accepted (cluster/liveness_settings.hpp: a client
  // whose host vanished is let go of); nullopt: LOOM_HEARTBEAT_TIMEOUT's settings. Pings
  // are answered whatever this says.
  std::optional<liveness_settings> liveness{};
  frame_limits limits{};
  std::chrono::milliseconds handshake_timeout{10000};
  std::size_t dedupe_window = 1u << 16; // (client, request id) pairs remembered
  // Replies with at least this many payload bytes go over the client's bulk connection.
  std::size_t bulk_threshold = 256u << 10;
  log_fn log{}; // empty: stderr

  // Memory held for frames not yet received in full (their metadata buffers, the tensors
  // the layer allocates for them; not a handler's own buffers), charged as the bytes
  // arrive. A message that would hold more than the first on one connection is refused;
  // a read that would pass the second first evicts peers stalled in the middle of a
  // frame, else closes its own connection; each with resource_exhausted (receive_budget.hpp).
  std::uint64_t max_pending_bytes_per_connection = std::uint64_t{2} << 30; // 2 GiB
  std::uint64_t max_pending_bytes = std::uint64_t{4} << 30;                // 4 GiB
  // Connections accepted whose handshake has not finished; past this many, the oldest
  // is closed (an honest client finishes in a round trip: the oldest is the likeliest
  // to be a socket that never speaks).
  std::size_t max_handshaking_connections = 128;
  // Connections past the handshake. At the cap, and when accepting runs out of file
  // descriptors, the client idle the longest (nothing received for idle_eviction_grace,
  // no request of it unanswered) is closed to make room; failing that a newcomer is
  // refused (resource_exhausted).
  std::size_t max_connections = 4096;
  std::chrono::milliseconds idle_eviction_grace{5000};
  // After a failed accept the next waits this long, doubling up to max_accept_backoff.
  std::chrono::milliseconds accept_backoff{10};
  std::chrono::milliseconds max_accept_backoff{1000};
  // A line that repeats (accept errors, refused or evicted peers, bad frames) is logged
  // at most once per interval, with the count of those held back.
  std::chrono::milliseconds log_interval{5000};
};

// What a server holds now (rpc_server::stats()).
struct server_stats {
  std::size_t connections = 0;   // past the handshake
  std::size_t handshaking = 0;   // accepted, handshake not finished
  std::size_t pending_bytes = 0; // held for frames not yet received in full
};

} // namespace loom::net

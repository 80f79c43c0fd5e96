// Who an rpc_server serves (server.hpp): its connections, those still in their handshake
// (oldest first), the client and process behind each admitted one, which io thread serves
// each client process, and each client's bulk connection. What the server knows of a
// client is the server's, not the connection's: it lives in the connection's sink, one
// served_connection per admitted connection, and here.
//
// Bounded under hostile peers (docs/wire-protocol.md, "Hostile peers"): past
// max_handshaking_connections the oldest handshake gives way (an honest client finishes in
// a round trip: the oldest is the likeliest to be a socket that never speaks), and past
// max_connections, or out of descriptors, the client idle the longest does.
//
// Thread-safe: one mutex, never held while calling into a connection but for the
// thread-safe queries (idle_for).
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/net/auth.hpp>
#include <loom/net/connection.hpp>
#include <loom/net/frame_sink.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

namespace loom::net::detail {

// The sink of one admitted connection, and what the server learnt of its client in the
// handshake (server.hpp implements the sink: its frames go to the server).
class served_connection : public frame_sink,
                          public std::enable_shared_from_this<served_connection> {
public:
  explicit served_connection(const hello_msg& hello)
      : role(hello.role), client_id(hello.client_id), process_id(hello.process_id) {}

  const connection_role role;
  const std::uint64_t client_id;
  const std::uint64_t process_id;
  // Requests received on it whose answer has not yet been handed to a connection (a
  // client waiting for a barrier's reply sends nothing, yet is not idle).
  std::atomic<std::uint32_t> in_flight{0};
  bool settled = false; // strand only: its first request was seen (server.hpp, settle())
};

class server_registry {
public:
  using conn_ptr = std::shared_ptr<connection>;
  using clock = std::chrono::steady_clock;

  explicit server_registry(std::size_t io_contexts) : processes_served_(io_contexts, 0) {}

  // A socket was accepted: it starts its handshake. Past max_handshaking the oldest still in
  // its handshake is forgotten and returned, to be closed. Nothing when stopping.
  std::vector<conn_ptr> track(const conn_ptr& c, std::size_t max_handshaking);

  // c passed its handshake, as client s. False when the server is stopping or c was given
  // up meanwhile (it is closing). At max_connections the idlest client's connections are
  // forgotten and returned in `evicted`, to be closed; when no client may give way, throws
  // resource_exhausted_error (`address`: the server's, for the message).
  bool admit(const conn_ptr& c, const std::shared_ptr<served_connection>& s,
             std::size_t max_connections, clock::duration idle_grace, const std::string& address,
             std::vector<conn_ptr>& evicted);

  // c's first request (on c's strand): the index of the io context to serve it on from now
  // on. One client process's connections share one context, a process new to the server
  // going to the context serving the fewest processes (`own`, c's context now, where that
  // is one of them: no move). Counted until the process's last connection is forgotten.
  // Nothing when c was forgotten (closing: it stays).
  std::optional<std::size_t> home(const conn_ptr& c, std::uint64_t process_id, std::size_t own);

  // c is no longer served (closed).
  void untrack(const conn_ptr& c) {
    std::lock_guard lk(mu_);
    forget(c);
  }

  // Out of file descriptors: one connection to give up for a peer waiting to be accepted,
  // forgotten and returned with why (none: nothing may give way): the oldest still in its
  // handshake, else the idlest client's.
  std::vector<conn_ptr> give_up_one(clock::duration idle_grace, std::string& why);

  // The client's bulk connection, if it has one.
  conn_ptr bulk_for(std::uint64_t client_id) {
    std::lock_guard lk(mu_);
    auto it = bulk_.find(client_id);
    return it == bulk_.end() ? nullptr : it->second.lock();
  }

  bool stopping() {
    std::lock_guard lk(mu_);
    return stopping_;
  }
  // The server stops: every connection, to be closed (none when it already was stopping).
  std::optional<std::vector<conn_ptr>> stop();
  // Once they are closed and the io threads joined.
  void clear() {
    std::lock_guard lk(mu_);
    conns_.clear();
    handshaking_.clear();
    handshaking_at_.clear();
    bulk_.clear();
  }

  // Requests received on the admitted connections still open and not yet answered (a
  // server stopping gracefully waits for them).
  std::size_t unanswered() {
    std::lock_guard lk(mu_);
    std::size_t n = 0;
    for (const auto& [c, s] : conns_)
      if (s)
        n += s->in_flight.load(std::memory_order_relaxed);
    return n;
  }

  // Connections past the handshake, and in it.
  std::pair<std::size_t, std::size_t> counts() {
    std::lock_guard lk(mu_);
    return {conns_.size() - handshaking_.size(), handshaking_.size()};
  }

private:
  // Under mu_.
  void forget(const conn_ptr& c);

  // Under mu_.
  void leave_handshake(const connection& c);

  // Under mu_: the admitted connections of the client idle the longest, when it has been
  // idle for `grace` and has no request unanswered; none when there is no such. A client's
  // control and bulk connections go together (the channel needs both).
  std::vector<conn_ptr> idlest_client(clock::time_point now, clock::duration grace);

  std::mutex mu_;
  bool stopping_ = false;
  // Handshaking (no sink yet: null) or admitted (its sink).
  std::unordered_map<conn_ptr, std::shared_ptr<served_connection>> conns_;
  std::list<conn_ptr> handshaking_; // oldest first
  std::unordered_map<const connection*, std::list<conn_ptr>::iterator> handshaking_at_;
  // The client processes whose connections have sent requests: the index of the io context
  // serving them and how many of their connections it serves; per context, how many
  // processes it serves; per connection, its process.
  struct process_home {
    std::size_t context = 0, connections = 0;
  };
  std::unordered_map<std::uint64_t, process_home> process_homes_;
  std::vector<std::size_t> processes_served_;
  std::unordered_map<const connection*, std::uint64_t> homed_;
  std::unordered_map<std::uint64_t, std::weak_ptr<connection>> bulk_;
};

} // namespace loom::net::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net::detail {

LOOM_COMPILED_ONCE auto server_registry::track(const conn_ptr& c, std::size_t max_handshaking)
    -> std::vector<conn_ptr> {
  std::vector<conn_ptr> oldest;
  std::lock_guard lk(mu_);
  conns_.emplace(c, nullptr);
  handshaking_at_[c.get()] = handshaking_.insert(handshaking_.end(), c);
  if (handshaking_.size() > max_handshaking) {
    oldest.push_back(handshaking_.front());
    forget(oldest.back());
  }
  return oldest;
}

LOOM_COMPILED_ONCE bool
server_registry::admit(const conn_ptr& c, const std::shared_ptr<served_connection>& s,
                       std::size_t max_connections, clock::duration idle_grace,
                       const std::string& address, std::vector<conn_ptr>& evicted) {
  std::lock_guard lk(mu_);
  auto it = conns_.find(c);
  if (stopping_ || it == conns_.end())
    return false;
  leave_handshake(*c);
  it->second = s; // before choosing the idlest: c's client is not idle
  if (conns_.size() - handshaking_.size() > max_connections) {
    evicted = idlest_client(clock::now(), idle_grace);
    if (evicted.empty())
      throw resource_exhausted_error("the server at " + address + " serves max_connections (" +
                                     std::to_string(max_connections) +
                                     ") connections and none is idle");
    for (const auto& v : evicted)
      forget(v);
  }
  if (s->role == connection_role::bulk)
    bulk_[s->client_id] = c;
  return true;
}

LOOM_COMPILED_ONCE auto server_registry::home(const conn_ptr& c, std::uint64_t process_id,
                                              std::size_t own) -> std::optional<std::size_t> {
  std::lock_guard lk(mu_);
  if (!conns_.count(c))
    return std::nullopt;
  auto [home, added] = process_homes_.try_emplace(process_id);
  if (added) {
    std::size_t best = own;
    for (std::size_t i = 0; i < processes_served_.size(); ++i)
      if (processes_served_[i] < processes_served_[best])
        best = i;
    home->second.context = best;
    ++processes_served_[best];
  }
  ++home->second.connections;
  homed_.emplace(c.get(), process_id);
  return home->second.context;
}

LOOM_COMPILED_ONCE auto server_registry::give_up_one(clock::duration idle_grace, std::string& why)
    -> std::vector<conn_ptr> {
  std::lock_guard lk(mu_);
  std::vector<conn_ptr> victims;
  if (!handshaking_.empty()) {
    victims.push_back(handshaking_.front());
    why = "the server ran out of file descriptors and it was the oldest connection still in "
          "its handshake";
  } else {
    victims = idlest_client(clock::now(), idle_grace);
    why = "the server ran out of file descriptors and its client was the idlest";
  }
  for (const auto& v : victims)
    forget(v);
  return victims;
}

LOOM_COMPILED_ONCE auto server_registry::stop() -> std::optional<std::vector<conn_ptr>> {
  std::lock_guard lk(mu_);
  if (stopping_)
    return std::nullopt;
  stopping_ = true;
  std::vector<conn_ptr> all;
  for (const auto& [c, s] : conns_)
    all.push_back(c);
  return all;
}

LOOM_COMPILED_ONCE void server_registry::forget(const conn_ptr& c) {
  std::shared_ptr<served_connection> s;
  if (auto it = conns_.find(c); it != conns_.end()) {
    s = std::move(it->second);
    conns_.erase(it);
  }
  leave_handshake(*c);
  if (auto h = homed_.find(c.get()); h != homed_.end()) {
    auto home = process_homes_.find(h->second);
    if (--home->second.connections == 0) {
      --processes_served_[home->second.context];
      process_homes_.erase(home);
    }
    homed_.erase(h);
  }
  if (s && s->role == connection_role::bulk) {
    auto b = bulk_.find(s->client_id);
    if (b != bulk_.end() && b->second.lock() == c)
      bulk_.erase(b);
  }
}

LOOM_COMPILED_ONCE void server_registry::leave_handshake(const connection& c) {
  if (auto it = handshaking_at_.find(&c); it != handshaking_at_.end()) {
    handshaking_.erase(it->second);
    handshaking_at_.erase(it);
  }
}

LOOM_COMPILED_ONCE auto server_registry::idlest_client(clock::time_point now, clock::duration grace)
    -> std::vector<conn_ptr> {
  struct client {
    clock::duration idle = clock::duration::max();
    bool busy = false;
    std::vector<conn_ptr> conns;
  };
  std::unordered_map<std::uint64_t, client> clients;
  for (const auto& [c, s] : conns_) {
    if (!s) // still in its handshake
      continue;
    auto& k = clients[s->client_id];
    k.idle = std::min(k.idle, c->idle_for(now));
    k.busy = k.busy || s->in_flight.load(std::memory_order_relaxed) > 0;
    k.conns.push_back(c);
  }
  client* idlest = nullptr;
  for (auto& [id, k] : clients)
    if (!k.busy && k.idle >= grace && (!idlest || k.idle > idlest->idle))
      idlest = &k;
  return idlest ? std::move(idlest->conns) : std::vector<conn_ptr>{};
}

} // namespace loom::net::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

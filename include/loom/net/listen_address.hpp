// Where a cluster task listens (docs/deploying.md, "Addresses"). The others reach a task at
// its cluster-spec address (a name, or an IP address); the task itself listens on:
//
//   - the address --bind / LOOM_BIND gives (server_options::bind), when given;
//   - else its own loopback address where the whole cluster is on this host's loopback (its
//     host a loopback address or a name resolving to one, every other task's host the same
//     name or a loopback address): a single-host cluster serves loopback only, as before;
//   - else every interface (0.0.0.0, or :: for an IPv6 address), so that the task is reached
//     whatever its name resolves to on its own host. This is where a Debian host's own name,
//     mapped to 127.0.1.1 in /etc/hosts, no longer shuts the other hosts out: such a
//     self-resolution counts as beyond loopback once other tasks are on other hosts.
//
// A listener beyond loopback needs the cluster token (net/server.hpp). A task's own name
// that does not resolve yet (a Kubernetes pod whose service is not published at start) is
// retried with a logged wait, up to resolve_timeout, and then fails with one error naming
// the host.
#pragma once

#include <loom/cluster/cluster_spec.hpp>
#include <loom/cluster/environment.hpp>
#include <loom/cluster/liveness_settings.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/net/address.hpp>
#include <loom/net/log.hpp>

#include <asio/io_context.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <thread>

namespace loom::net {

// Whether `host` is a loopback address or "localhost" (no lookup).
LOOM_COMPILED_ONCE bool is_loopback_name(const std::string& host);

// The address `host` resolves to (the first); retried while the lookup fails, for at most
// `timeout`, logging the wait at the 1st, 2nd, 4th, 8th ... attempt. Throws
// unavailable_error naming the host once the time is up.
LOOM_COMPILED_ONCE asio::ip::address
resolve_own_host(const std::string& host, std::chrono::milliseconds timeout, const log_fn& log);

// The host task (job, task) of `cluster` listens on (the rules at the top). `bind`: the
// explicit address; nullopt: LOOM_BIND from `env`, else the rules.
LOOM_COMPILED_ONCE std::string choose_listen_host(const cluster_spec& cluster,
                                                  const std::string& job, int task,
                                                  const std::optional<std::string>& bind,
                                                  std::chrono::milliseconds resolve_timeout,
                                                  const log_fn& log,
                                                  const environment& env = process_environment());

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net {

LOOM_COMPILED_ONCE bool is_loopback_name(const std::string& host) {
  if (host == "localhost")
    return true;
  std::error_code ec;
  const auto a = asio::ip::make_address(host, ec);
  return !ec && a.is_loopback();
}

LOOM_COMPILED_ONCE asio::ip::address
resolve_own_host(const std::string& host, std::chrono::milliseconds timeout, const log_fn& log) {
  using clock = std::chrono::steady_clock;
  std::error_code ec;
  const auto literal = asio::ip::make_address(host, ec);
  if (!ec)
    return literal;
  const auto start = clock::now();
  auto wait = std::chrono::milliseconds(100);
  for (int attempt = 1;; ++attempt) {
    asio::io_context ctx;
    asio::ip::tcp::resolver res(ctx);
    const auto r = res.resolve(host, "", ec);
    if (!ec && !r.empty())
      return r.begin()->endpoint().address();
    const std::string why = ec ? ec.message() : "no address";
    const auto elapsed =
        std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start);
    if (elapsed >= timeout)
      throw unavailable_error("its host name '" + host + "' did not resolve within " +
                              loom::detail::seconds_text(timeout) + " (" + std::to_string(attempt) +
                              " attempt(s); the last: " + why +
                              "): check the name in the cluster spec, or give the address to "
                              "listen on with --bind (LOOM_BIND)");
    wait = std::min(wait, timeout - elapsed);
    if ((attempt & (attempt - 1)) == 0)
      log_line(log,
               "waiting for this task's host name '" + host + "' to resolve (attempt " +
                   std::to_string(attempt) + ": " + why + "); retrying in " +
                   std::to_string(wait.count()) + " ms, for at most " +
                   loom::detail::seconds_text(timeout) + " in all",
               logging::level::info);
    std::this_thread::sleep_for(wait);
    wait = std::min(wait * 2, std::chrono::milliseconds(2000));
  }
}

LOOM_COMPILED_ONCE std::string choose_listen_host(const cluster_spec& cluster,
                                                  const std::string& job, int task,
                                                  const std::optional<std::string>& bind,
                                                  std::chrono::milliseconds resolve_timeout,
                                                  const log_fn& log, const environment& env) {
  if (bind && !bind->empty())
    return *bind;
  if (!bind)
    if (const auto b = env("LOOM_BIND"); b && !b->empty())
      return *b;
  const std::string own = parse_host_port(cluster.task_address(job, task)).host;
  const auto every_interface = [](const asio::ip::address& a) {
    return a.is_v6() ? std::string("::") : std::string("0.0.0.0");
  };
  std::error_code ec;
  if (const auto literal = asio::ip::make_address(own, ec); !ec)
    return literal.is_loopback() ? own : every_interface(literal);
  const asio::ip::address a = resolve_own_host(own, resolve_timeout, log);
  if (!a.is_loopback())
    return every_interface(a);
  for (const auto& j : cluster.jobs())
    for (int t : cluster.task_indices(j)) {
      const std::string h = parse_host_port(cluster.task_address(j, t)).host;
      if (h != own && !is_loopback_name(h))
        return every_interface(a); // another host must reach this one
    }
  return a.to_string();
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

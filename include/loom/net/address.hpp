// Network addresses as loom's cluster specs and flags write them: "host:port",
// or "[v6 address]:port". Parsing is the cluster spec's (parse_host_port, with
// its messages); the message layer only joins them back and names endpoints.
#pragma once

#include <loom/cluster/cluster_spec.hpp>
#include <loom/core/compiled_once.hpp>

#include <asio/ip/tcp.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace loom::net {

LOOM_COMPILED_ONCE std::string join_address(std::string_view host, std::uint16_t port);

inline std::string to_string(const asio::ip::tcp::endpoint& ep) {
  return join_address(ep.address().to_string(), ep.port());
}

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net {

LOOM_COMPILED_ONCE std::string join_address(std::string_view host, std::uint16_t port) {
  if (host.find(':') != std::string_view::npos)
    return "[" + std::string(host) + "]:" + std::to_string(port);
  return std::string(host) + ":" + std::to_string(port);
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

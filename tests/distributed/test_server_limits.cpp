// What a task's peers may hold, set through the public API (loom::server_options::limits and
// loom-server's flags), reaches the task's rpc server: a tiny max_connections refuses the
// extra client, a small max_pending_bytes_per_connection refuses a large message (a session's
// feed, through loom-server); the
// defaults are the message layer's; a limit of 0 is refused, naming it. (What each limit
// does under hostile peers is tests/net/test_rpc_hostile.cpp's.)
#include <support/messages.hpp>
#include <support/process.hpp>

#include <loom/loom.hpp>
#include <loom/net/rpc.hpp>
#include <loom/runtime/protocol.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <regex>
#include <sstream>
#include <string>

namespace {

namespace lt = loom::testing;
using lt::contains;
using lt::message_of;
using namespace std::chrono_literals;

const std::string loom_server_bin = LOOM_SERVER_BIN;

loom::cluster_spec one_ps() {
  return loom::cluster_spec{{"ps", loom::cluster_spec::job_def({"127.0.0.1:0"})}};
}

loom::server_options tokenless(loom::server_limits limits) {
  loom::server_options o;
  o.token = "";
  o.limits = limits;
  o.log = [](std::string_view) {}; // the refusals' lines; the clients' errors are checked
  return o;
}

std::string address_of(const std::string& target) {
  return target.substr(std::string("loom://").size());
}

loom::net::channel_options client(const std::string& token = "") {
  loom::net::channel_options o;
  o.token = token;
  o.connect_timeout = 5000ms;
  o.log = [](std::string_view) {};
  return o;
}

// A client of `address`: its two connections (control and bulk) are up once a call returned.
std::unique_ptr<loom::net::channel> connected(const std::string& address,
                                              const std::string& token = "") {
  auto ch = std::make_unique<loom::net::channel>(address, client(token));
  ch->call(loom::protocol::cluster_info);
  return ch;
}

// The what() of connecting one more client to `address`, or "<connected>".
std::string one_more_client(const std::string& address, const std::string& token = "") {
  loom::net::channel extra(address, client(token));
  try {
    extra.connect();
    extra.call(loom::protocol::cluster_info);
  } catch (const loom::resource_exhausted_error& e) {
    return e.what();
  }
  return "<connected>";
}

} // namespace

TEST_CASE("server_limits' defaults are the message layer's") {
  const loom::server_limits l;
  const loom::net::rpc_server_options net;
  CHECK(l.max_pending_bytes_per_connection == net.max_pending_bytes_per_connection);
  CHECK(l.max_pending_bytes == net.max_pending_bytes);
  CHECK(l.max_handshaking_connections == net.max_handshaking_connections);
  CHECK(l.handshake_timeout == net.handshake_timeout);
  CHECK(l.max_connections == net.max_connections);
  CHECK(l.idle_eviction_grace == net.idle_eviction_grace);
  CHECK(l.accept_backoff == net.accept_backoff);
  CHECK(l.max_accept_backoff == net.max_accept_backoff);
}

TEST_CASE("max_connections set on a loom::server refuses the client past it") {
  loom::server_limits limits;
  limits.idle_eviction_grace = 60s; // the first client is never idle enough to give way
  SUBCASE("2: one client (control and bulk) fills it") {
    limits.max_connections = 2;
    loom::server ps(one_ps(), "ps", 0, tokenless(limits));
    const auto first = connected(address_of(ps.target()));
    const std::string refused = one_more_client(address_of(ps.target()));
    CHECK_MESSAGE(contains(refused, "max_connections (2)"), refused);
    // The first client is still served.
    CHECK_NOTHROW(first->call(loom::protocol::cluster_info));
  }
  SUBCASE("the default: the same second client is served") {
    loom::server ps(one_ps(), "ps", 0, tokenless(limits));
    const auto first = connected(address_of(ps.target()));
    CHECK(one_more_client(address_of(ps.target())) == "<connected>");
  }
}

TEST_CASE("max_pending_bytes_per_connection set on a loom::server refuses a larger message") {
  loom::server_limits limits;
  limits.max_pending_bytes_per_connection = 256u << 10; // 256 KiB
  loom::server ps(one_ps(), "ps", 0, tokenless(limits));
  loom::net::channel ch(address_of(ps.target()), client());
  const auto floats = [](std::int64_t n) {
    loom::any_tensor t(loom::dtype::f32, loom::shape{n});
    std::memset(t.raw_data(), 0, t.byte_size());
    return t;
  };
  // 32 KiB pass; 1 MiB is refused before its bytes are read, naming the limit.
  CHECK_NOTHROW(ch.call(loom::protocol::cluster_info, loom::net::empty{}, {floats(8 << 10)}));
  const std::string refused = message_of<loom::resource_exhausted_error>(
      [&] { ch.call(loom::protocol::cluster_info, loom::net::empty{}, {floats(256 << 10)}); });
  CHECK_MESSAGE(contains(refused, "max_pending_bytes_per_connection"), refused);
}

TEST_CASE("a limit of 0 is refused, naming the limit and the task") {
  loom::server_limits limits;
  limits.max_connections = 0;
  const std::string what = message_of<loom::invalid_argument_error>(
      [&] { loom::server ps(one_ps(), "ps", 0, tokenless(limits)); });
  CHECK_MESSAGE(contains(what, "server_options.limits.max_connections"), what);
  CHECK_MESSAGE(contains(what, "/job:ps/replica:0/task:0"), what);
  limits = {};
  limits.accept_backoff = 2000ms;
  const std::string backoff = message_of<loom::invalid_argument_error>(
      [&] { loom::server ps(one_ps(), "ps", 0, tokenless(limits)); });
  CHECK_MESSAGE(contains(backoff, "exceeds its max_accept_backoff (1000 ms)"), backoff);
}

TEST_CASE("loom-server's limit flags reach its server") {
  const std::string token = "server-limits-test-token";
  const lt::env_overrides env{{"LOOM_CLUSTER_TOKEN", token},
                              {"LOOM_CLUSTER_TOKEN_FILE", std::nullopt}};
  SUBCASE("--max_connections=2 refuses the second client") {
    lt::child ps(loom_server_bin,
                 {"--ps_hosts=127.0.0.1:0", "--job_name=ps", "--max_connections=2",
                  "--idle_eviction_grace_ms=60000"},
                 env);
    REQUIRE_MESSAGE(ps.wait_for_output("serving /job:ps/task:0 at ", 30s), ps.report());
    std::smatch m;
    const std::string out = ps.output();
    REQUIRE(std::regex_search(out, m, std::regex("at loom://(127\\.0\\.0\\.1:[0-9]+)")));
    const std::string address = m[1];
    const auto first = connected(address, token);
    const std::string refused = one_more_client(address, token);
    CHECK_MESSAGE(contains(refused, "max_connections (2)"), refused);
  }
  SUBCASE("--max_pending_bytes_per_connection=262144 refuses a session's 1 MiB feed") {
    lt::child ps(
        loom_server_bin,
        {"--ps_hosts=127.0.0.1:0", "--job_name=ps", "--max_pending_bytes_per_connection=262144"},
        env);
    REQUIRE_MESSAGE(ps.wait_for_output("serving /job:ps/task:0 at ", 30s), ps.report());
    std::smatch m;
    const std::string out = ps.output();
    REQUIRE(std::regex_search(out, m, std::regex("at (loom://127\\.0\\.0\\.1:[0-9]+)")));
    loom::graph g;
    auto on_ps = g.device("/job:ps/task:0");
    loom::placeholder<float, 1> in(g, loom::shape{-1}, "in");
    auto total = loom::reduce_sum(in);
    std::ostringstream sink;
    loom::cluster_session_options o;
    o.token = token;
    o.placement_log = &sink;
    loom::session sess(g, std::string(m[1]), o);
    const auto ones = [](std::int64_t n) { return loom::tensor<float, 1>(loom::shape{n}, 1.0f); };
    // The session runs in this process, the ps in its own: the feed crosses the connection.
    CHECK(sess.run(total, {{in, ones(8 << 10)}}) == doctest::Approx(8 << 10));
    const std::string refused = message_of<loom::resource_exhausted_error>([&] {
      sess.run(total, {{in, ones(256 << 10)}});
    });
    CHECK_MESSAGE(contains(refused, "max_pending_bytes_per_connection"), refused);
  }
  SUBCASE("a limit below 1 is a usage error naming the flag") {
    lt::child ps(loom_server_bin,
                 {"--ps_hosts=127.0.0.1:0", "--job_name=ps", "--max_connections=0"}, env);
    const auto st = ps.wait(30s);
    REQUIRE(st);
    CHECK(st->exited);
    CHECK(st->code == 2);
    CHECK_MESSAGE(contains(ps.output(), "--max_connections must be at least 1, not 0"),
                  ps.output());
  }
  SUBCASE("--accept_backoff_ms above --max_accept_backoff_ms is a usage error") {
    lt::child ps(loom_server_bin,
                 {"--ps_hosts=127.0.0.1:0", "--job_name=ps", "--accept_backoff_ms=50",
                  "--max_accept_backoff_ms=20"},
                 env);
    const auto st = ps.wait(30s);
    REQUIRE(st);
    CHECK(st->code == 2);
    CHECK_MESSAGE(contains(ps.output(), "--accept_backoff_ms (50) exceeds --max_accept_backoff_ms"),
                  ps.output());
  }
}

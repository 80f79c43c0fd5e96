// Liveness and listening (#21 items 2 and 3), over real sockets on loopback:
// - a server frozen with SIGSTOP (its sockets open, nothing answering) fails the call in
//   flight with unavailable naming it, by the heartbeat, not at the call's deadline; after
//   SIGCONT the next call goes through;
// - a busy server is not declared dead: a handler that answers later from another thread,
//   and one that holds its io thread (pings are answered by the other connection's);
// - where a task listens: --bind / LOOM_BIND, loopback for a cluster on this host's
//   loopback, every interface otherwise (the token then required), and its own name that
//   does not resolve, retried and then one error naming it.
#include <doctest/doctest.h>

#include "net_test_util.hpp"
#include <support/messages.hpp>

#include <loom/api.hpp>
#include <loom/net/listen_address.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <thread>

using namespace loom;
using namespace loom::net;
using namespace loom::net::testing;
using namespace std::chrono_literals;

namespace {

using loom::testing::contains;

liveness_settings short_heartbeat(std::chrono::milliseconds timeout) {
  liveness_settings l;
  l.heartbeat_timeout = timeout;
  return l;
}

// An rpc_server answering "echo" in a child process (forked before the test makes any
// thread of its own), so that the test can freeze it. SIGKILLed by the destructor.
class frozen_server_child {
public:
  frozen_server_child() {
    int up[2];
    REQUIRE(::pipe(up) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::close(up[0]);
      std::uint16_t port = 0;
      try {
        rpc_server srv(local_server("", [](std::string_view) {}));
        srv.handle("echo", [](request req, responder r) { r.reply(req.metadata<int>()); });
        port = srv.port();
        [[maybe_unused]] auto w = ::write(up[1], &port, sizeof port);
        for (;;)
          ::pause(); // until SIGKILL
      } catch (...) {
        [[maybe_unused]] auto w = ::write(up[1], &port, sizeof port);
      }
      ::_exit(1);
    }
    ::close(up[1]);
    REQUIRE(::read(up[0], &port_, sizeof port_) == static_cast<ssize_t>(sizeof port_));
    ::close(up[0]);
    REQUIRE(port_ != 0);
  }
  frozen_server_child(const frozen_server_child&) = delete;
  frozen_server_child& operator=(const frozen_server_child&) = delete;
  ~frozen_server_child() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  std::uint16_t port() const { return port_; }
  // SIGSTOP, and wait until every thread of the server has stopped: kill() only makes
  // the stop pending, and on a loaded machine a server thread once went on long enough
  // to answer the next call.
  void freeze() const {
    REQUIRE(::kill(pid_, SIGSTOP) == 0);
    int status = 0;
    REQUIRE(::waitpid(pid_, &status, WUNTRACED) == pid_);
    REQUIRE(WIFSTOPPED(status));
  }
  void thaw() const { REQUIRE(::kill(pid_, SIGCONT) == 0); }

private:
  pid_t pid_ = -1;
  std::uint16_t port_ = 0;
};

// A single-task cluster at `address` (port 0: the OS chooses).
cluster_spec one_ps(const std::string& address) {
  return cluster_spec{{"ps", {address}}};
}

// An environment with only these variables.
loom::environment env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end())
      return std::nullopt;
    return it->second;
  };
}

} // namespace

TEST_CASE("liveness: a frozen server (SIGSTOP) fails the call in flight with unavailable naming "
          "it, within the heartbeat timeout; after SIGCONT calls go through again") {
  frozen_server_child server; // forked first: no thread of this test exists yet
  log_capture logs;
  auto o = local_channel("", logs.fn());
  o.liveness = short_heartbeat(600ms);
  o.default_timeout = 60s; // a deadline would say deadline_exceeded, after a minute
  channel ch("127.0.0.1:" + std::to_string(server.port()), o);
  CHECK(ch.call("echo", 1).metadata<int>() == 1);

  server.freeze();
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    ch.call("echo", 2);
    FAIL("a call to a frozen server completed");
  } catch (const unavailable_error& e) {
    message = e.what();
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE("a frozen server was declared dead after "
          << secs << " s (heartbeat_timeout 0.6 s): " << message);
  CHECK_MESSAGE(contains(message, "ps task 0 at 127.0.0.1:" + std::to_string(server.port()) +
                                      " stopped answering: no heartbeat for 0.6 s"),
                message);
  CHECK_MESSAGE(contains(message, "call 'echo'"), message);
  CHECK(logs.contains("stopped answering"));

  server.thaw();
  CHECK(ch.call("echo", 3).metadata<int>() == 3); // reconnects
}

TEST_CASE("liveness: a busy server is not declared dead") {
  log_capture logs;
  auto so = local_server();
  so.threads = 2;
  rpc_server srv(so);
  // Answers after 4 heartbeat timeouts, from another thread (a step on a runner thread).
  srv.handle("later", [](request, responder r) {
    std::thread([r = std::move(r)]() mutable {
      std::this_thread::sleep_for(1200ms);
      r.reply(std::string("done"));
    }).detach();
  });
  // Holds its io thread that long (a ps applying a large update where the gradient came):
  // the pings on the client's other connection are answered by the other io thread.
  srv.handle("compute", [](request, responder r) {
    std::this_thread::sleep_for(1200ms);
    r.reply(std::string("done"));
  });
  auto o = local_channel("", logs.fn());
  o.liveness = short_heartbeat(300ms);
  channel ch(local_address(srv), o);
  CHECK(ch.call("later").metadata<std::string>() == "done");
  CHECK(ch.call("compute").metadata<std::string>() == "done");
  CHECK_MESSAGE(!logs.contains("stopped answering"), logs.all());
}

TEST_CASE("liveness: LOOM_HEARTBEAT_TIMEOUT and its errors") {
  CHECK(liveness_settings_from_environment(env_of({})).heartbeat_timeout == 6000ms);
  const auto half = liveness_settings_from_environment(env_of({{"LOOM_HEARTBEAT_TIMEOUT", "0.5"}}));
  CHECK(half.heartbeat_timeout == 500ms);
  CHECK(half.ping_interval() == 166ms);
  CHECK(!liveness_settings_from_environment(env_of({{"LOOM_HEARTBEAT_TIMEOUT", "0"}})).heartbeat());
  CHECK_THROWS_WITH_AS(
      liveness_settings_from_environment(env_of({{"LOOM_HEARTBEAT_TIMEOUT", "6s"}})),
      doctest::Contains("LOOM_HEARTBEAT_TIMEOUT (--heartbeat_timeout) is \"6s\""),
      invalid_argument_error);
  CHECK(loom::detail::seconds_text(6000ms) == "6 s");
  CHECK(loom::detail::seconds_text(600ms) == "0.6 s");
}

TEST_CASE("listening: --bind, loopback for a cluster on this host's loopback, every interface "
          "otherwise") {
  const log_fn quiet = [](std::string_view) {};
  const auto none = env_of({});
  const auto listen = [&](const cluster_spec& c, std::optional<std::string> bind,
                          const loom::environment& env) {
    return choose_listen_host(c, "ps", 0, bind, 1s, quiet, env);
  };
  // A cluster on loopback listens there (no token needed, as before).
  CHECK(listen(one_ps("127.0.0.1:2222"), std::nullopt, none) == "127.0.0.1");
  CHECK(listen(cluster_spec{{"ps", {"localhost:2222"}}, {"worker", {"localhost:2223"}}},
               std::nullopt, none) ==
        asio::ip::make_address(listen(one_ps("localhost:1"), std::nullopt, none)).to_string());
  // An address beyond loopback: every interface.
  CHECK(listen(one_ps("192.0.2.1:2222"), std::nullopt, none) == "0.0.0.0");
  CHECK(listen(one_ps("[2001:db8::1]:2222"), std::nullopt, none) == "::");
  // Its own name resolving to loopback (Debian's 127.0.1.1) while another task is on
  // another host: every interface, so that host can reach it.
  CHECK(listen(cluster_spec{{"ps", {"localhost:2222"}}, {"worker", {"192.0.2.2:2222"}}},
               std::nullopt, none) == "0.0.0.0");
  // --bind (the option), else LOOM_BIND, wins.
  CHECK(listen(one_ps("192.0.2.1:2222"), "127.0.0.1", none) == "127.0.0.1");
  CHECK(listen(one_ps("192.0.2.1:2222"), std::nullopt, env_of({{"LOOM_BIND", "127.0.0.2"}})) ==
        "127.0.0.2");
}

TEST_CASE("listening: a server beyond loopback needs the token; --bind 127.0.0.1 does not; the "
          "others reach it at its cluster-spec address") {
  // 192.0.2.1 (documentation range) is not this machine's: the task listens on every
  // interface, and a client reaches it on 127.0.0.1.
  server_options no_token;
  no_token.token = "";
  no_token.bind = std::nullopt;
  no_token.allow_insecure = false;
  try {
    server s(one_ps("192.0.2.1:0"), "ps", 0, no_token);
    FAIL("a task listening on every interface served without a token");
  } catch (const failed_precondition_error& e) {
    CHECK_MESSAGE(contains(e.what(), "cannot serve /job:ps/replica:0/task:0 at 192.0.2.1:0"),
                  e.what());
    CHECK_MESSAGE(contains(e.what(), "0.0.0.0:0 (every interface) without a cluster token"),
                  e.what());
  }

  server_options with_token;
  with_token.token = "liveness-test-token";
  server everywhere(one_ps("192.0.2.1:0"), "ps", 0, with_token);
  const std::string port = everywhere.target().substr(everywhere.target().rfind(':') + 1);
  CHECK(everywhere.target() == "loom://192.0.2.1:" + port); // advertised as in the spec
  auto co = local_channel("liveness-test-token");
  channel ch("127.0.0.1:" + port, co);
  CHECK_NOTHROW(ch.call("loom.cluster_info"));
  ch.stop();
  everywhere.stop();

  server_options bound = no_token;
  bound.bind = "127.0.0.1";
  server loopback(one_ps("192.0.2.1:0"), "ps", 0, bound);
  const std::string lport = loopback.target().substr(loopback.target().rfind(':') + 1);
  channel lch("127.0.0.1:" + lport, local_channel(""));
  CHECK_NOTHROW(lch.call("loom.cluster_info"));
}

TEST_CASE("listening: its own name that does not resolve is retried, then one error names it") {
  log_capture logs;
  server_options o;
  o.token = "liveness-test-token";
  o.resolve_timeout = 700ms;
  o.log = logs.fn();
  try {
    server s(one_ps("loom-nonexistent.invalid:0"), "ps", 0, o);
    FAIL("a task whose name does not resolve served");
  } catch (const unavailable_error& e) {
    CHECK_MESSAGE(contains(e.what(), "cannot serve /job:ps/replica:0/task:0 at "
                                     "loom-nonexistent.invalid:0: its host name "
                                     "'loom-nonexistent.invalid' did not resolve within 0.7 s"),
                  e.what());
  }
  CHECK_MESSAGE(logs.contains("waiting for this task's host name 'loom-nonexistent.invalid' to "
                              "resolve (attempt 2"),
                logs.all());
}

// TLS on the message layer (net/tls.hpp, net/transport.hpp), over real sockets on
// 127.0.0.1: keyed by the cluster token and with certificates the test makes (a CA, the
// certificates it signs, a stranger's CA); calls and split messages cross; a relay in the
// middle sees a tensor's bytes without TLS and never with it; every mismatch (a plain peer
// against a TLS one either way, another token, a certificate the CA did not sign, the two
// modes against each other) is one clear error naming the server, not a hang or a retry;
// the cluster-token handshake still runs inside TLS; the settings from the environment.
#include <doctest/doctest.h>

#include "net_test_util.hpp"
#include "tls_test_util.hpp"

#include <loom/net/tls.hpp>

#include <cereal/types/string.hpp>

#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

using namespace loom;
using namespace loom::net;
using namespace loom::net::testing;
using namespace std::chrono_literals;

namespace {

const std::string token = "tls-test-token";

void add_string_echo(rpc_server& srv) {
  srv.handle("echo", [](request req, responder r) {
    r.reply(req.metadata<std::string>() + "!", std::move(req.payloads()));
  });
}

rpc_server_options tls_server(tls_settings tls, std::string tok = token, log_fn log = {}) {
  auto o = local_server(std::move(tok), std::move(log));
  o.tls = std::move(tls);
  return o;
}
channel_options tls_channel(tls_settings tls, std::string tok = token) {
  auto o = local_channel(std::move(tok), [](std::string_view) {});
  o.tls = std::move(tls);
  return o;
}

// A tensor whose bytes spell "TLS!" over and over: easy to find on a wire.
any_tensor marked(std::int64_t n) {
  any_tensor t(dtype::i32, shape{n});
  std::int32_t word;
  std::memcpy(&word, "TLS!", 4);
  for (auto& v : t.flat<std::int32_t>())
    v = word;
  return t;
}
const std::string mark = "TLS!TLS!TLS!TLS!TLS!TLS!TLS!TLS!";

// The error a first call on `ch` fails with: its type's code and what().
struct failure {
  std::optional<error_code> code;
  std::string what;
};
failure first_call(channel& ch) {
  try {
    ch.call("echo", std::string("hi"));
  } catch (const loom::error& e) {
    return {e.code(), e.what()};
  }
  return {std::nullopt, "<the call succeeded>"};
}

} // namespace

TEST_CASE("TLS keyed by the cluster token: calls, bulk and split messages cross intact") {
  frame_limits small; // small frames, so a 1.2 MB tensor travels split into parts
  small.max_frame_bytes = 64 << 10;
  auto so = tls_server(tls_settings::keyed_by_token());
  so.limits = small;
  rpc_server srv(so);
  add_string_echo(srv);
  auto co = tls_channel(tls_settings::keyed_by_token());
  co.limits = small;
  channel ch(local_address(srv), co);
  std::vector<any_tensor> in{any_tensor::from_vector<float>(shape{2}, {1.5f, -2}),
                             marked(300 << 10)}; // over the bulk threshold, and split
  const auto res = ch.call("echo", std::string("hi"), in);
  CHECK(res.metadata<std::string>() == "hi!");
  REQUIRE(res.payloads.size() == 2);
  CHECK(same_bytes(res.payloads[0], in[0]));
  CHECK(same_bytes(res.payloads[1], in[1]));
  // Many small calls after the big one: the streams stay in step.
  for (int i = 0; i < 50; ++i)
    CHECK(ch.call("echo", std::to_string(i)).metadata<std::string>() == std::to_string(i) + "!");
}

TEST_CASE("the wire is encrypted: a relay sees a tensor's bytes without TLS, never with it") {
  const auto seen_through_relay = [](std::optional<tls_settings> tls) {
    rpc_server srv(tls ? tls_server(*tls) : local_server(token));
    add_string_echo(srv);
    tcp_relay relay(srv.port());
    auto co = tls ? tls_channel(*tls) : local_channel(token, [](std::string_view) {});
    channel ch("127.0.0.1:" + std::to_string(relay.port()), co);
    const auto data = marked(1024); // 4 KB: the control connection, both ways
    const auto res = ch.call("echo", std::string("hi"), {data});
    REQUIRE(res.payloads.size() == 1);
    CHECK(same_bytes(res.payloads[0], data));
    ch.stop();
    return relay.seen();
  };
  const std::string plain = seen_through_relay(std::nullopt);
  CHECK(plain.find(mark) != std::string::npos); // the check can fail: it sees plain bytes
  CHECK(plain.find("echo") != std::string::npos);
  const std::string tls = seen_through_relay(tls_settings::keyed_by_token());
  CHECK(tls.size() > 2 * 4096); // the tensor went through, both ways
  CHECK(tls.find(mark) == std::string::npos);
  CHECK(tls.find("echo") == std::string::npos); // nor the method's name
  CHECK(tls.find("LOOM") == std::string::npos); // nor a frame header
}

TEST_CASE("a client without TLS against a TLS server fails at once, naming the server") {
  log_capture server_log;
  rpc_server srv(tls_server(tls_settings::keyed_by_token(), token, server_log.fn()));
  add_string_echo(srv);
  channel plain(local_address(srv), local_channel(token, [](std::string_view) {}));
  const auto f = first_call(plain);
  CHECK(f.code == error_code::failed_precondition); // not unavailable: no retry, no wait
  CHECK_MESSAGE(f.what.find(local_address(srv)) != std::string::npos, f.what);
  CHECK_MESSAGE(f.what.find("requires TLS keyed by the cluster token") != std::string::npos,
                f.what);
  CHECK_MESSAGE(f.what.find("without TLS") != std::string::npos, f.what);
  CHECK(server_log.wait_for("it does not use TLS"));
  // The server goes on serving TLS clients.
  channel good(local_address(srv), tls_channel(tls_settings::keyed_by_token()));
  CHECK(good.call("echo", std::string("a")).metadata<std::string>() == "a!");
}

TEST_CASE("a TLS client against a server without TLS fails at once, naming the server") {
  log_capture server_log;
  rpc_server srv(local_server(token, server_log.fn()));
  add_string_echo(srv);
  channel ch(local_address(srv), tls_channel(tls_settings::keyed_by_token()));
  const auto f = first_call(ch);
  CHECK(f.code == error_code::failed_precondition);
  CHECK_MESSAGE(f.what.find("the TLS handshake with ps task 0 at " + local_address(srv)) !=
                    std::string::npos,
                f.what);
  CHECK_MESSAGE(f.what.find("it does not use TLS") != std::string::npos, f.what);
  CHECK(server_log.wait_for("a TLS handshake from"));
  channel plain(local_address(srv), local_channel(token, [](std::string_view) {}));
  CHECK(plain.call("echo", std::string("a")).metadata<std::string>() == "a!");
}

TEST_CASE("under TLS keyed by the token, a client with another token is refused") {
  log_capture server_log;
  rpc_server srv(tls_server(tls_settings::keyed_by_token(), token, server_log.fn()));
  add_string_echo(srv);
  channel ch(local_address(srv), tls_channel(tls_settings::keyed_by_token(), "another-token"));
  const auto f = first_call(ch);
  CHECK(f.code == error_code::unauthenticated);
  CHECK_MESSAGE(f.what.find(local_address(srv)) != std::string::npos, f.what);
  CHECK_MESSAGE(f.what.find("another cluster token") != std::string::npos, f.what);
  CHECK_MESSAGE(server_log.wait_for("the TLS handshake with"), server_log.all());
}

TEST_CASE("TLS with certificates: each side verified against the CA, both directions") {
  test_pki pki;
  const auto ca = pki.ca("cluster-ca");
  const auto server_cert = pki.leaf("ps0", ca);
  const auto client_cert = pki.leaf("worker0", ca);
  const auto stranger_ca = pki.ca("stranger-ca");
  const auto stranger = pki.leaf("intruder", stranger_ca);
  const auto certs = [&](const pem_pair& p, const pem_pair& trust) {
    return tls_settings::with_certificates(p.cert, p.key, trust.cert);
  };
  log_capture server_log;
  // Without a token: the certificates authenticate the peers.
  rpc_server srv(tls_server(certs(server_cert, ca), "", server_log.fn()));
  add_string_echo(srv);

  SUBCASE("a client whose certificate the CA signed is served") {
    channel ch(local_address(srv), tls_channel(certs(client_cert, ca), ""));
    const auto res = ch.call("echo", std::string("hi"), {marked(100 << 10)});
    CHECK(res.metadata<std::string>() == "hi!");
    CHECK(same_bytes(res.payloads.at(0), marked(100 << 10)));
  }
  SUBCASE("a client whose certificate another CA signed is refused") {
    channel ch(local_address(srv), tls_channel(certs(stranger, ca), ""));
    const auto f = first_call(ch);
    CHECK(f.code == error_code::unauthenticated);
    CHECK_MESSAGE(f.what.find(local_address(srv)) != std::string::npos, f.what);
    CHECK_MESSAGE(f.what.find("rejected this process's certificate") != std::string::npos, f.what);
    CHECK_MESSAGE(server_log.wait_for("certificate"), server_log.all());
  }
  SUBCASE("a server whose certificate another CA signed is refused by the client") {
    rpc_server rogue(tls_server(certs(stranger, stranger_ca), "", [](std::string_view) {}));
    add_string_echo(rogue);
    channel ch(local_address(rogue), tls_channel(certs(client_cert, ca), ""));
    const auto f = first_call(ch);
    CHECK(f.code == error_code::unauthenticated);
    CHECK_MESSAGE(f.what.find(local_address(rogue)) != std::string::npos, f.what);
    CHECK_MESSAGE(f.what.find("failed verification against the CA") != std::string::npos, f.what);
  }
  SUBCASE("a client keyed by the token against a server with certificates is refused") {
    channel ch(local_address(srv), tls_channel(tls_settings::keyed_by_token(), token));
    const auto f = first_call(ch);
    CHECK(f.code == error_code::unauthenticated);
    CHECK_MESSAGE(f.what.find(local_address(srv)) != std::string::npos, f.what);
    CHECK_MESSAGE(f.what.find("same TLS settings") != std::string::npos, f.what);
  }
}

TEST_CASE("the cluster-token handshake still runs inside TLS with certificates") {
  test_pki pki;
  const auto ca = pki.ca("cluster-ca");
  const auto server_cert = pki.leaf("ps0", ca);
  const auto client_cert = pki.leaf("worker0", ca);
  rpc_server srv(
      tls_server(tls_settings::with_certificates(server_cert.cert, server_cert.key, ca.cert), token,
                 [](std::string_view) {}));
  add_string_echo(srv);
  const auto client = tls_settings::with_certificates(client_cert.cert, client_cert.key, ca.cert);
  channel right(local_address(srv), tls_channel(client, token));
  CHECK(right.call("echo", std::string("a")).metadata<std::string>() == "a!");
  channel wrong(local_address(srv), tls_channel(client, "another-token"));
  const auto f = first_call(wrong);
  CHECK(f.code == error_code::unauthenticated);
  CHECK_MESSAGE(f.what.find("rejected this client's cluster token") != std::string::npos, f.what);
}

TEST_CASE("bad TLS settings are refused before serving, naming what is wrong") {
  test_pki pki;
  const auto ca = pki.ca("cluster-ca");
  const auto leaf = pki.leaf("ps0", ca);
  const auto other = pki.leaf("ps1", ca);
  const auto refused = [](tls_settings s, std::string tok) -> std::string {
    try {
      rpc_server srv(tls_server(std::move(s), std::move(tok), [](std::string_view) {}));
    } catch (const loom::error& e) {
      return e.what();
    }
    return "<served>";
  };
  CHECK(refused(tls_settings::keyed_by_token(), "")
            .find("TLS keyed by the cluster token (LOOM_TLS=1, --tls) needs a cluster token") !=
        std::string::npos);
  const std::string garbage = pki.file("garbage.pem", "not a certificate\n");
  CHECK(refused(tls_settings::with_certificates(garbage, leaf.key, ca.cert), "")
            .find("cannot load the TLS certificate " + garbage + " (LOOM_TLS_CERT, --tls_cert)") !=
        std::string::npos);
  CHECK(refused(tls_settings::with_certificates(leaf.cert, other.key, ca.cert), "")
            .find("does not belong to the certificate " + leaf.cert) != std::string::npos);
  CHECK(refused(tls_settings::with_certificates(leaf.cert, leaf.key, garbage), "")
            .find("cannot load the TLS CA " + garbage) != std::string::npos);
  // Certificates authenticate the peers: serving beyond loopback needs no token then (it
  // still does without them). Only peers with a certificate the CA signed get in.
  auto beyond = tls_server(tls_settings::with_certificates(leaf.cert, leaf.key, ca.cert), "",
                           [](std::string_view) {});
  beyond.host = "0.0.0.0";
  CHECK_NOTHROW(rpc_server{beyond});
  beyond.tls = tls_settings{};
  CHECK_THROWS_AS(rpc_server{beyond}, failed_precondition_error);
}

TEST_CASE("TLS settings from the environment, and their errors naming variable and flag") {
  test_pki pki;
  const auto ca = pki.ca("cluster-ca");
  const auto leaf = pki.leaf("ps0", ca);
  const auto from = [](std::map<std::string, std::string> vars) {
    return tls_settings_from_environment(
        [vars](const std::string& k) -> std::optional<std::string> {
          auto it = vars.find(k);
          return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
        });
  };
  const auto error_of = [&](std::map<std::string, std::string> vars) -> std::string {
    try {
      from(std::move(vars));
    } catch (const invalid_argument_error& e) {
      return e.what();
    }
    return "<no error>";
  };
  CHECK(from({}).mode == tls_mode::off);
  CHECK(from({{"LOOM_TLS", "0"}}).mode == tls_mode::off);
  CHECK(from({{"LOOM_TLS", "1"}}).mode == tls_mode::token);
  CHECK(from({{"LOOM_TLS", "true"}}).mode == tls_mode::token);
  const auto c =
      from({{"LOOM_TLS_CERT", leaf.cert}, {"LOOM_TLS_KEY", leaf.key}, {"LOOM_TLS_CA", ca.cert}});
  CHECK(c.mode == tls_mode::certificates);
  CHECK(c.cert_file == leaf.cert);
  CHECK(c.key_file == leaf.key);
  CHECK(c.ca_file == ca.cert);
  CHECK(from({{"LOOM_TLS", "1"},
              {"LOOM_TLS_CERT", leaf.cert},
              {"LOOM_TLS_KEY", leaf.key},
              {"LOOM_TLS_CA", ca.cert}})
            .mode == tls_mode::certificates);
  CHECK(error_of({{"LOOM_TLS", "maybe"}}).find("LOOM_TLS (--tls) is \"maybe\"") !=
        std::string::npos);
  CHECK(error_of({{"LOOM_TLS_CERT", leaf.cert}, {"LOOM_TLS_CA", ca.cert}})
            .find("LOOM_TLS_KEY (--tls_key) is not") != std::string::npos);
  CHECK(error_of({{"LOOM_TLS", "0"},
                  {"LOOM_TLS_CERT", leaf.cert},
                  {"LOOM_TLS_KEY", leaf.key},
                  {"LOOM_TLS_CA", ca.cert}})
            .find("LOOM_TLS (--tls) turns TLS off, but") != std::string::npos);
  CHECK(error_of({{"LOOM_TLS_CERT", leaf.cert},
                  {"LOOM_TLS_KEY", leaf.key},
                  {"LOOM_TLS_CA", "/nonexistent/ca.pem"}})
            .find("LOOM_TLS_CA (--tls_ca) names \"/nonexistent/ca.pem\", which cannot be read") !=
        std::string::npos);
}

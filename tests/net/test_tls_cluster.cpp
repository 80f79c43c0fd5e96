// A cluster whose traffic is encrypted, configured as its users configure it: loom-server
// processes (a ps and a worker) started with --tls and the cluster token in their
// environment (the cluster resolver's flags, cluster/cluster_resolver.hpp), and a session in
// this process with TLS in its options; the step's tensors cross three processes over TLS.
// A session without TLS gets one clear error naming the task it reached; a certificate
// flag without its key is a usage error naming both flags.
#include <support/process.hpp>

#include <loom/loom.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <sstream>
#include <string>

namespace {

namespace lt = loom::testing;
using namespace std::chrono_literals;

const std::string server_bin = LOOM_SERVER_BIN;
const std::string token = "tls-cluster-test-token";

// The environment of a task: the token, and no TLS setting but the flags'.
lt::env_overrides task_environment() {
  return {{"LOOM_CLUSTER_TOKEN", token},  {"LOOM_CLUSTER_TOKEN_FILE", std::nullopt},
          {"LOOM_TLS", std::nullopt},     {"LOOM_TLS_CERT", std::nullopt},
          {"LOOM_TLS_KEY", std::nullopt}, {"LOOM_TLS_CA", std::nullopt}};
}

loom::cluster_session_options session_options(loom::tls_settings tls) {
  static std::ostringstream placement;
  loom::cluster_session_options o;
  o.token = token;
  o.tls = tls;
  o.connect_timeout = 10s;
  o.placement_log = &placement;
  return o;
}

} // namespace

TEST_CASE("a ps and a worker started with --tls run steps for a TLS session") {
  const auto ports = lt::free_ports(2);
  const std::string ps_host = "127.0.0.1:" + std::to_string(ports[0]);
  const std::string worker_host = "127.0.0.1:" + std::to_string(ports[1]);
  const std::vector<std::string> hosts{"--ps_hosts=" + ps_host, "--worker_hosts=" + worker_host,
                                       "--tls"};
  auto with = [&](std::vector<std::string> args, const std::string& job) {
    args.push_back("--job_name=" + job);
    return args;
  };
  lt::child ps(server_bin, with(hosts, "ps"), task_environment());
  lt::child worker(server_bin, with(hosts, "worker"), task_environment());
  REQUIRE_MESSAGE(ps.wait_for_output("serving /job:ps/task:0 at loom://" + ps_host +
                                         " (TLS keyed by the cluster token)",
                                     30s),
                  ps.report());
  REQUIRE_MESSAGE(worker.wait_for_output("(TLS keyed by the cluster token)", 30s), worker.report());

  // Seed 000's counter: the variable on the ps, the add on the worker (the session's
  // target), so the value crosses ps -> worker and back each step.
  loom::graph g;
  auto c = [&] {
    auto _ = g.device("/job:ps/task:0");
    return loom::get_variable<float, 0>(g, "c", loom::shape{}, loom::constant_initializer{0});
  }();
  auto step = c.assign(c + 1.0f);
  const std::string target = "loom://" + worker_host;
  {
    loom::session sess(g, target, session_options(loom::tls_settings::keyed_by_token()));
    sess.run(c.initializer());
    for (int i = 1; i <= 3; ++i)
      CHECK(sess.run(step) == doctest::Approx(i));
  }
  // A session without TLS: refused by the worker, which it names.
  std::string refused;
  try {
    loom::session plain(g, target, session_options(loom::tls_settings{}));
    plain.run(step);
  } catch (const loom::failed_precondition_error& e) {
    refused = e.what();
  }
  CHECK_MESSAGE(refused.find(worker_host) != std::string::npos, refused);
  CHECK_MESSAGE(refused.find("requires TLS keyed by the cluster token") != std::string::npos,
                refused);

  const auto report = loom::session::shutdown_cluster(
      target, {}, session_options(loom::tls_settings::keyed_by_token()));
  CHECK(report.all_stopped());
  for (auto* task : {&ps, &worker}) {
    const auto st = task->wait(30s);
    REQUIRE_MESSAGE(st, task->report());
    CHECK(st->exited);
    CHECK_MESSAGE(st->code == 0, task->report());
  }
}

TEST_CASE("loom-server: --tls_cert without --tls_key is an error naming both") {
  lt::child ps(server_bin, {"--ps_hosts=127.0.0.1:0", "--job_name=ps", "--tls_cert=/dev/null"},
               task_environment());
  const auto st = ps.wait(30s);
  REQUIRE(st);
  CHECK(st->exited);
  CHECK(st->code != 0);
  CHECK_MESSAGE(ps.output().find("LOOM_TLS_CERT (--tls_cert) is set but LOOM_TLS_KEY "
                                 "(--tls_key) is not") != std::string::npos,
                ps.output());
}

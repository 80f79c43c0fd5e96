// Calls a client makes of a whole cluster never hang on a task that is gone:
// reset, shutdown_cluster and session creation end within their deadline,
// name what they could not reach, and print no retry lines where told to be
// quiet; a session whose cluster was shut down goes without dialling it.
// ping_cluster says which tasks serve; a session's target takes loom://,
// TF's grpc:// or a bare host:port, and any other form is refused at once. A
// task shut down answers the calls in flight before it goes.
#include <loom/api.hpp>

#include <doctest/doctest.h>
#include <support/cluster.hpp>
#include <support/messages.hpp>
#include <support/process.hpp>
#include <support/stderr_capture.hpp>

#include <chrono>
#include <future>
#include <string>
#include <thread>

using loom::testing::contains;
using loom::testing::local_cluster;
using loom::testing::quiet;
using loom::testing::stderr_capture;
using namespace std::chrono_literals;

namespace {

using clock_type = std::chrono::steady_clock;

// Options for a whole-cluster call that gives up after `deadline`.
loom::cluster_session_options within(std::chrono::milliseconds deadline, bool be_quiet) {
  loom::cluster_session_options o = quiet();
  o.connect_timeout = deadline;
  o.quiet = be_quiet;
  return o;
}

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1))
    ++n;
  return n;
}

} // namespace

TEST_CASE("shutdown_cluster with a task gone returns within its deadline, naming that task once") {
  local_cluster cluster(2, 1);
  cluster.ps(1).stop(); // gone before the shutdown
  std::thread ps0([&] { cluster.ps(0).join(); });

  stderr_capture err;
  const auto start = clock_type::now();
  const loom::shutdown_report report =
      loom::session::shutdown_cluster(cluster.target(), {}, within(1500ms, false));
  const auto took = clock_type::now() - start;
  const std::string printed = err.text();
  ps0.join(); // hangs (and the test times out) if ps 0 was not told

  CHECK(took < 10s); // its deadline is 1.5 s; a hang waited 30 s per task
  CHECK(report.stopped ==
        std::vector<std::string>{"/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"});
  REQUIRE(report.unreachable.size() == 1);
  CHECK(contains(report.unreachable[0], "/job:ps/replica:0/task:1: "));
  CHECK(contains(report.unreachable[0], cluster.spec.task_address("ps", 1)));
  CHECK_FALSE(report.all_stopped());
  // One line names it; no retry line is printed while it is waited for.
  CHECK(count(printed, "shutdown_cluster: 1 task(s) not reached") == 1);
  CHECK(count(printed, "/job:ps/replica:0/task:1") == 1);
  CHECK_MESSAGE(!contains(printed, "waiting for"), printed);
}

TEST_CASE("shutdown_cluster quiet prints nothing; a job filter tells only that job") {
  local_cluster cluster(2, 1);
  cluster.ps(1).stop();
  std::thread ps0([&] { cluster.ps(0).join(); });
  stderr_capture err;
  const auto report =
      loom::session::shutdown_cluster(cluster.target(), {"ps"}, within(1000ms, true));
  const std::string printed = err.text();
  ps0.join();
  CHECK(report.stopped == std::vector<std::string>{"/job:ps/replica:0/task:0"});
  CHECK(report.unreachable.size() == 1);
  // Only the ps's own server (in this process) says it shuts down.
  CHECK_MESSAGE(!contains(printed, "shutdown_cluster"), printed);
  CHECK_MESSAGE(!contains(printed, "waiting for"), printed);
  // The worker was not told: it still serves.
  loom::graph g;
  auto c = loom::constant(g, 3.0f);
  loom::session s(g, cluster.target(), quiet());
  CHECK(static_cast<float>(s.run(c)) == 3.0f);
}

TEST_CASE("reset with a task gone fails within its deadline naming it, the others reset") {
  local_cluster cluster(2, 1);
  loom::graph g;
  auto v = g.on("/job:ps/task:0", [&] {
    return loom::variable<float, 0>(g, "v", loom::shape{}, loom::zeros_initializer{});
  });
  loom::session s(g, cluster.target(), quiet());
  s.run(v.initializer());
  cluster.ps(1).stop();

  stderr_capture err;
  const auto start = clock_type::now();
  const std::string what = loom::testing::message_of<loom::unavailable_error>(
      [&] { loom::session::reset(cluster.target(), {}, within(1500ms, false)); });
  const auto took = clock_type::now() - start;
  const std::string printed = err.text();
  CHECK(took < 10s);
  CHECK(contains(what, "session::reset: 1 of 3 task(s) were not reset"));
  CHECK(contains(what, "/job:ps/replica:0/task:1: "));
  CHECK_MESSAGE(!contains(printed, "waiting for"), printed);
  CHECK_THROWS_WITH_AS(s.run(v), doctest::Contains("v"), loom::failed_precondition_error);
}

TEST_CASE("a session whose target is gone fails within connect_timeout, quietly when asked") {
  const auto port = loom::testing::free_ports(1).front(); // nothing listens there
  loom::graph g;
  auto c = loom::constant(g, 1.0f);
  stderr_capture err;
  const auto start = clock_type::now();
  CHECK_THROWS_AS(loom::session(g, "loom://127.0.0.1:" + std::to_string(port), within(700ms, true)),
                  loom::unavailable_error);
  CHECK(clock_type::now() - start < 10s);
  const std::string printed = err.text();
  CHECK_MESSAGE(printed.empty(), printed);
}

TEST_CASE("ping_cluster says which tasks serve, within its deadline, printing nothing") {
  local_cluster cluster(2, 1);
  cluster.ps(1).stop();
  stderr_capture err;
  const auto start = clock_type::now();
  const loom::ping_report all =
      loom::session::ping_cluster(cluster.target(), {}, within(1500ms, false));
  CHECK(clock_type::now() - start < 10s);
  CHECK(all.answered ==
        std::vector<std::string>{"/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"});
  REQUIRE(all.unreachable.size() == 1);
  CHECK(contains(all.unreachable[0], "/job:ps/replica:0/task:1: "));
  const loom::ping_report workers =
      loom::session::ping_cluster(cluster.target(), {"worker"}, within(1500ms, false));
  CHECK(workers.answered == std::vector<std::string>{"/job:worker/replica:0/task:0"});
  CHECK(workers.unreachable.empty());
  const std::string printed = err.text();
  CHECK_MESSAGE(printed.empty(), printed);
  // Nothing was stopped: the ps still serves.
  loom::graph g;
  auto k = g.on("/job:ps/task:0", [&] { return loom::constant(g, 2.0f); });
  loom::session s(g, cluster.target(), quiet());
  CHECK(static_cast<float>(s.run(k)) == 2.0f);
}

TEST_CASE("a session's target is loom://host:port, TF's grpc://host:port or host:port") {
  local_cluster cluster(1, 1);
  const std::string address = cluster.spec.task_address("worker", 0);
  loom::graph g;
  auto c = loom::constant(g, 5.0f);
  for (const std::string& target : {"loom://" + address, "grpc://" + address, address}) {
    CAPTURE(target);
    loom::session s(g, target, quiet());
    CHECK(static_cast<float>(s.run(c)) == 5.0f);
  }
  // Each wrong form is refused at once, naming the target and the forms that work.
  for (const std::string& target : {std::string("http://") + address, std::string("localhost"),
                                    std::string("loom://:2222"), std::string("loom://h:port"),
                                    std::string("h:0"), std::string("h:70000"), std::string("")}) {
    CAPTURE(target);
    const auto start = clock_type::now();
    const std::string what = loom::testing::message_of<loom::invalid_argument_error>(
        [&] { loom::session s(g, target, quiet()); });
    INFO(what);
    CHECK(clock_type::now() - start < 2s);
    CHECK(contains(what, "session target '" + target + "'"));
    CHECK(contains(what, "\"loom://host:port\" (or TF's \"grpc://host:port\""));
  }
}

TEST_CASE("after the cluster was shut down, a session goes without dialling its tasks") {
  local_cluster cluster(1, 1);
  loom::graph g;
  auto v = g.on("/job:ps/task:0", [&] {
    return loom::variable<float, 0>(g, "v", loom::shape{}, loom::zeros_initializer{});
  });
  stderr_capture err;
  {
    // The chief's path: a session whose graph is registered on the ps, which it shuts down.
    loom::session s(g, cluster.target(), quiet());
    s.run(v.initializer());
    std::thread ps0([&] { cluster.ps(0).join(); });
    const auto report =
        loom::session::shutdown_cluster(cluster.target(), {"ps"}, within(5000ms, false));
    ps0.join();
    CHECK(report.all_stopped());
  } // ~session drops its registrations: not from a ps that is gone
  const std::string printed = err.text();
  CHECK_MESSAGE(!contains(printed, "waiting for"), printed);
  CHECK_MESSAGE(!contains(printed, "Connection refused"), printed);
}

TEST_CASE("a task shut down answers the step in flight before it goes") {
  // A worker's last call (counting itself done) may still run on the ps when its chief
  // shuts the ps down: the worker must learn that the call ran, not lose the reply and
  // retry against a ps that is gone.
  local_cluster cluster(1, 1);
  loom::graph g;
  auto anchor = g.on("/job:ps/task:0", [&] {
    return loom::variable<std::int64_t, 0>(g, "anchor", loom::shape{}, loom::zeros_initializer{});
  });
  // Waits for a counter nobody raises, and answers deadline_exceeded after 600 ms.
  const auto wait =
      g.add_node("counter_wait", {anchor.id(), loom::detail::scalar_node(g, std::int64_t{1})},
                 {{"counter", std::string("never")}, {"timeout_ms", std::int64_t{600}}});
  loom::session s(g, cluster.target(), quiet());
  auto step = std::async(std::launch::async, [&] { // how the step ended
    try {
      s.run_nodes({wait}, {});
      return std::string("it ran");
    } catch (const loom::error& e) {
      return std::string(loom::to_string(e.code())) + ": " + e.what();
    }
  });
  std::this_thread::sleep_for(200ms); // the step waits on the ps
  std::thread ps0([&] { cluster.ps(0).join(); });
  const auto report =
      loom::session::shutdown_cluster(cluster.target(), {"ps"}, within(5000ms, false));
  ps0.join();
  CHECK(report.all_stopped());
  const std::string ended = step.get();
  CHECK_MESSAGE(ended.starts_with("deadline exceeded: "), ended); // its answer, not unavailable
}

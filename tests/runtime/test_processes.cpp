// The distributed runtime across real processes: the example cluster binaries
// (counter, pinning, shared_state, custom_placement) run as separate tasks on
// loopback ports the OS chose, and their output and exit codes are checked;
// then bad input, each case once: an unreachable task, a port in use, a
// malformed --ps_hosts, an unknown job or task in a device string, a wrong
// cluster token, and a worker killed in the middle of a run.
//
// No fixed ports, no sleeps: the tests wait for a child's output or exit.
// Every child is killed and reaped when its `child` object goes out of scope.
// The cases that run an example carry needs_examples (support/examples.hpp):
// a missing binary fails them; a suite built without examples skips them.
#include <loom/api.hpp>

#include "support/examples.hpp"
#include "support/process.hpp"

#include <asio/ip/tcp.hpp>
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace lt = loom::testing;
using lt::cluster_flags;
using lt::example;
using lt::expect_exit;
using lt::needs_examples;
using lt::plus;
using namespace std::chrono_literals;

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

// The lines of `text` that are whole numbers, in order.
std::vector<long> number_lines(const std::string& text) {
  std::vector<long> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line.find_first_not_of("0123456789") != std::string::npos)
      continue;
    out.push_back(std::stol(line));
  }
  return out;
}

// A placement log line: "name: (op): /job:J/replica:0/task:T/device:CPU:0".
std::string placed(const std::string& node, const std::string& op, const std::string& task) {
  return node + ": (" + op + "): " + task + "/device:CPU:0";
}

} // namespace

// --------------------------------------------------------------------------------------------
// The examples
// --------------------------------------------------------------------------------------------

TEST_CASE("counter (seed 000): the worker prints 1..N and both tasks exit 0" * needs_examples()) {
  cluster_flags cf(1, 1);
  lt::child ps(example("counter"), cf.task("ps", 0));
  lt::child worker(example("counter"), plus(cf.task("worker", 0), "--max_steps=5"));
  expect_exit(worker, 0);
  CHECK(number_lines(worker.output()) == std::vector<long>{1, 2, 3, 4, 5});
  CHECK(contains(worker.output(), "loom://" + cf.address("worker", 0)));
  expect_exit(ps, 0); // the worker shut the cluster down
}

namespace {
void check_pinning_output(const std::string& out) {
  INFO(out);
  // Cells 7-8: a on the ps, b on a worker (task 0 by default), c on worker 1.
  CHECK(contains(out, "c = 4.0"));
  CHECK(contains(out, placed("a", "variable", "/job:ps/replica:0/task:0")));
  CHECK(contains(out, placed("b", "identity", "/job:worker/replica:0/task:0")));
  CHECK(contains(out, placed("c", "identity", "/job:worker/replica:0/task:1")));
  // Cell 10: the seed's comments, line by line.
  CHECK(contains(out, placed("v1", "variable", "/job:ps/replica:0/task:0")));
  CHECK(contains(out, placed("v2", "variable", "/job:ps/replica:0/task:1")));
  CHECK(contains(out, placed("v3", "variable", "/job:ps/replica:0/task:0")));
  CHECK(contains(out, placed("s", "identity", "/job:worker/replica:0/task:0")));
  CHECK(contains(out, placed("p1", "identity", "/job:worker/replica:0/task:1")));
  CHECK(contains(out, placed("p2", "identity", "/job:worker/replica:0/task:1")));
  CHECK(contains(out, "v1 = 1.0, v2 = 2.0, v3 = 3.0, s = 3.0, p1 = 6.0, p2 = 9.0"));
}
} // namespace

TEST_CASE("pinning (seed 001): all five tasks in one process, like the notebook" *
          needs_examples()) {
  cluster_flags cf(2, 3);
  auto args = cf.task("", 0);
  args.resize(2); // only --ps_hosts and --worker_hosts: every task in this process
  lt::child all(example("pinning"), args);
  expect_exit(all, 0);
  const std::string out = all.output();
  CHECK(contains(out, "Hello distributed loom!"));
  check_pinning_output(out);
}

TEST_CASE("pinning (seed 001): 2 ps and 3 workers as five processes, and a client" *
          needs_examples()) {
  cluster_flags cf(2, 3);
  std::vector<std::unique_ptr<lt::child>> tasks;
  for (int t = 0; t < 2; ++t)
    tasks.push_back(std::make_unique<lt::child>(example("pinning"), cf.task("ps", t)));
  for (int t = 0; t < 3; ++t)
    tasks.push_back(std::make_unique<lt::child>(example("pinning"), cf.task("worker", t)));
  lt::child client(example("pinning"), cf.task("client", 0));
  expect_exit(client, 0);
  check_pinning_output(client.output());
  for (auto& t : tasks)
    expect_exit(*t, 0); // the client shut the cluster down
}

TEST_CASE("shared_state (seed 003): x lives on the ps, shared by clients of servers A and B" *
          needs_examples()) {
  cluster_flags cf(1, 2);
  lt::child ps(example("shared_state"), cf.task("ps", 0));
  lt::child a(example("shared_state"), cf.task("worker", 0));
  lt::child b(example("shared_state"), cf.task("worker", 1));
  const std::string at_a = "--target=loom://" + cf.address("worker", 0);
  const std::string at_b = "--target=loom://" + cf.address("worker", 1);

  auto client = [&](std::vector<std::string> args, int code, std::string_view expect) {
    lt::child c(example("shared_state"), std::move(args));
    expect_exit(c, code);
    INFO(c.report());
    CHECK(contains(c.output(), expect));
  };
  // The seed: init and increment through A, then increment through B.
  client({at_a, "--init"}, 0, "problem1/x = 1.0");
  client({at_b}, 0, "problem1/x = 2.0");
  // Another problem's x, kept apart by its variable scope (and in another container).
  client({at_b, "--problem=problem2", "--container=experiment", "--init"}, 0, "problem2/x = 1.0");
  client({at_a, "--problem=problem2", "--container=experiment"}, 0, "problem2/x = 2.0");
  // session::reset clears the container on every task: problem2/x is gone, problem1/x is not.
  client({at_a, "--reset", "--container=experiment"}, 0, "reset container 'experiment'");
  client({at_b, "--problem=problem2", "--container=experiment"}, 1,
         "attempting to use uninitialized value problem2/x");
  client({at_b}, 0, "problem1/x = 3.0");
  client({at_a, "--shutdown"}, 0, "cluster shut down");
  expect_exit(ps, 0);
  expect_exit(a, 0);
  expect_exit(b, 0);
}

TEST_CASE("custom_placement (seed 004): a lambda policy and a composed one place every node" *
          needs_examples()) {
  cluster_flags cf(2, 1);
  lt::child ps0(example("custom_placement"), cf.task("ps", 0));
  lt::child ps1(example("custom_placement"), cf.task("ps", 1));
  lt::child worker(example("custom_placement"), cf.task("worker", 0));
  expect_exit(worker, 0);
  const std::string out = worker.output();
  INFO(out);
  const std::string ps0_task = "/job:ps/replica:0/task:0", ps1_task = "/job:ps/replica:0/task:1",
                    worker0 = "/job:worker/replica:0/task:0";
  // simple_setter: variables on ps 0, every other op on the worker.
  CHECK(contains(out, placed("w", "variable", ps0_task)));
  CHECK(contains(out, placed("b", "variable", ps0_task)));
  CHECK(contains(out, placed("loss", "identity", worker0)));
  CHECK(contains(out, "simple_setter: loss 2.0000 -> 1.0000"));
  // Composed: big variables round-robin over the ps tasks, small ones on ps 0.
  CHECK(contains(out, placed("embedding", "variable", ps0_task)));
  CHECK(contains(out, placed("softmax_w", "variable", ps1_task)));
  CHECK(contains(out, placed("projection", "variable", ps0_task)));
  CHECK(contains(out, placed("softmax_b", "variable", ps0_task)));
  CHECK(contains(out, placed("global_step", "variable", ps0_task)));
  CHECK(contains(out, placed("loss", "identity", worker0)));
  CHECK(contains(out, "global_step 1"));
  expect_exit(ps0, 0);
  expect_exit(ps1, 0);
}

// --------------------------------------------------------------------------------------------
// Bad input
// --------------------------------------------------------------------------------------------

TEST_CASE("an unreachable task: a clear error after the connect deadline, naming the address") {
  const auto ports = lt::free_ports(2);
  const std::string nobody = "127.0.0.1:" + std::to_string(ports[0]);
  loom::cluster_session_options o;
  o.connect_timeout = 300ms;

  SUBCASE("the session's target") {
    loom::graph g;
    auto c = loom::constant(g, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    try {
      loom::session sess(g, "loom://" + nobody, o);
      sess.run(c);
      FAIL("a session to a target nobody serves ran");
    } catch (const loom::error& e) {
      INFO(e.what());
      CHECK(e.code() == loom::error_code::unavailable);
      CHECK(contains(e.message(), nobody));
    }
    // It gave up at the short connect deadline, not at the 30 s default.
    CHECK(std::chrono::steady_clock::now() - start < 20s);
  }
  SUBCASE("another task of the cluster") {
    // A ps nobody serves; the session's own task (worker 0) is up.
    loom::cluster_spec cluster{{"ps", {nobody}},
                               {"worker", {"127.0.0.1:" + std::to_string(ports[1])}}};
    loom::server worker(cluster, "worker", 0);
    loom::graph g;
    auto v = g.on("/job:ps/task:0",
                  [&] { return loom::variable<float, 0>(g, "v", loom::constant(g, 1.0f)); });
    loom::session sess(g, worker.target(), o);
    try {
      sess.run(v.initializer());
      FAIL("a step on a task nobody serves ran");
    } catch (const loom::error& e) {
      INFO(e.what());
      CHECK(e.code() == loom::error_code::unavailable);
      CHECK(contains(e.message(), nobody));
      CHECK(contains(e.message(), "ps task 0"));
    }
  }
}

TEST_CASE("a port in use: unavailable_error naming the task and the address") {
  const std::string address = "127.0.0.1:" + std::to_string(lt::free_ports(1)[0]);
  loom::cluster_spec cluster{{"ps", {address}}};

  auto expect_unavailable = [&] {
    try {
      loom::server second(cluster, "ps", 0);
      FAIL("a second server bound " << address);
    } catch (const loom::error& e) {
      INFO(e.what());
      CHECK(e.code() == loom::error_code::unavailable);
      CHECK(contains(e.message(), address));
      CHECK(contains(e.message(), "/job:ps/replica:0/task:0"));
    }
  };
  SUBCASE("by another loom server") {
    loom::server first(cluster, "ps", 0);
    expect_unavailable();
    // The first one still serves.
    loom::graph g;
    auto c = loom::constant(g, 2.0f) * 3.0f;
    loom::session sess(g, first.target());
    CHECK(static_cast<float>(sess.run(c)) == 6.0f);
  }
  SUBCASE("by a plain listening socket") {
    asio::io_context io;
    asio::ip::tcp::acceptor taken(io);
    const auto hp = cluster.task_address("ps", 0);
    taken.open(asio::ip::tcp::v4());
    taken.bind({asio::ip::make_address("127.0.0.1"),
                static_cast<std::uint16_t>(std::stoi(hp.substr(hp.rfind(':') + 1)))});
    taken.listen();
    expect_unavailable();
  }
}

TEST_CASE("a malformed --ps_hosts: the example exits non-zero naming the bad address" *
          needs_examples()) {
  const std::string worker = "--worker_hosts=127.0.0.1:" + std::to_string(lt::free_ports(1)[0]);
  for (const std::string bad : {"127.0.0.1:notaport", "127.0.0.1:99999", "127.0.0.1"}) {
    CAPTURE(bad);
    for (const char* job : {"--job_name=ps", "--job_name=worker"}) {
      lt::child c(example("counter"), {"--ps_hosts=127.0.0.1:1," + bad, worker, job});
      expect_exit(c, 1, 60s);
      INFO(c.report());
      CHECK(contains(c.output(), "--ps_hosts"));
      CHECK(contains(c.output(), bad));
    }
  }
}

TEST_CASE("an unknown job or task in a device string: an error naming the node and the device") {
  auto server = loom::server::create_local_server();
  for (const std::string device :
       {"/job:nope", "/job:localhost/task:3", "/job:nope/task:0/cpu:0"}) {
    CAPTURE(device);
    loom::graph g;
    auto x = g.on(device, [&] { return loom::constant(g, 1.0f, "x"); });
    loom::cluster_session_options o;
    std::ostringstream log;
    o.placement_log = &log;
    loom::session sess(g, server->target(), o);
    try {
      sess.run(x);
      FAIL("a node on " << device << " ran");
    } catch (const loom::error& e) {
      INFO(e.what());
      CHECK(e.code() == loom::error_code::invalid_argument);
      CHECK(contains(e.message(), "'x'"));
      CHECK(contains(e.message(), loom::device_spec::from_string(device).to_string()));
    }
  }
  // The server is fine afterwards.
  loom::graph g;
  auto y = loom::constant(g, 20.0f) + 1.0f;
  loom::session sess(g, server->target());
  CHECK(static_cast<float>(sess.run(y)) == 21.0f);
}

TEST_CASE("a wrong token: the worker fails with unauthenticated naming the ps address" *
          needs_examples()) {
  cluster_flags cf(1, 1);
  lt::child ps(example("counter"), cf.task("ps", 0), {{"LOOM_CLUSTER_TOKEN", "alpha-secret"}});
  lt::child worker(example("counter"), plus(cf.task("worker", 0), "--max_steps=3"),
                   {{"LOOM_CLUSTER_TOKEN", "beta-secret"}});
  expect_exit(worker, 1);
  INFO(worker.report());
  CHECK(contains(worker.output(), "unauthenticated"));
  CHECK(contains(worker.output(), cf.address("ps", 0)));
  CHECK(number_lines(worker.output()).empty()); // no step ran
  // The ps refused the connection and still serves.
  CHECK(ps.running());
}

TEST_CASE("a worker killed with SIGKILL mid-run does not crash the ps; a new worker runs" *
          needs_examples()) {
  cluster_flags cf(1, 1);
  lt::child ps(example("counter"), cf.task("ps", 0));
  {
    lt::child doomed(example("counter"), plus(cf.task("worker", 0), "--max_steps=0"));
    REQUIRE_MESSAGE(doomed.wait_for_output("\n3\n", 120s), doomed.report());
    doomed.kill();
    INFO(doomed.report());
    CHECK(doomed.wait(1s)->signal == SIGKILL);
  }
  CHECK_MESSAGE(ps.running(), ps.report());
  // A new worker at the same address re-initializes the counter and counts again.
  lt::child worker(example("counter"), plus(cf.task("worker", 0), "--max_steps=3"));
  expect_exit(worker, 0);
  CHECK(number_lines(worker.output()) == std::vector<long>{1, 2, 3});
  expect_exit(ps, 0);
}

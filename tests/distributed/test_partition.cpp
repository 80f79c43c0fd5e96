// Sessions on an in-process cluster: the master's placement, partitioning and
// send/recv transfers compute what a local session computes, state is shared
// through resource containers, and failures name their task and never hang.
#include <loom/api.hpp>

#include <doctest/doctest.h>
#include <support/cluster.hpp>
#include <support/messages.hpp>
#include <support/process.hpp>

#include "linear_model.hpp"

#include <utility>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using loom::testing::free_ports;
using loom::testing::local_cluster;

// The what() of the loom::error that f throws, checking its code; "" if none.
template <class F> std::string error_of(F&& f, loom::error_code code) {
  try {
    f();
  } catch (const loom::error& e) {
    CHECK(e.code() == code);
    return e.what();
  }
  return "";
}
using loom::testing::contains;

using loom::testing::quiet;

using loom::testing::batch_x;
using loom::testing::batch_y;
using model = loom::testing::linear_model;

} // namespace

TEST_CASE("a model trained on 2 ps tasks and a worker matches the same model trained locally") {
  auto how = loom::testing::trained_by::gradient_descent;
  SUBCASE("gradient descent") {}
  SUBCASE("Adam: slots, beta powers updated beside them, the global step's increment") {
    how = loom::testing::trained_by::adam_with_global_step;
  }
  local_cluster cluster(2, 1);
  model remote(2, how), local(0, how);
  loom::session rs(remote.g, cluster.worker(0).target(), quiet());
  loom::session ls(local.g);
  rs.run(loom::global_variables_initializer(remote.g));
  ls.run(loom::global_variables_initializer(local.g));
  for (int step = 0; step < 5; ++step) {
    auto [_, rl] = rs.run(loom::fetches(*remote.train, *remote.loss),
                          {{remote.x, batch_x()}, {remote.y, batch_y()}});
    auto [__, ll] = ls.run(loom::fetches(*local.train, *local.loss),
                           {{local.x, batch_x()}, {local.y, batch_y()}});
    CHECK(static_cast<float>(rl) == doctest::Approx(static_cast<float>(ll)).epsilon(1e-5));
  }
  auto rw = rs.run(*remote.w);
  auto lw = ls.run(*local.w);
  for (std::size_t i = 0; i < 6; ++i)
    CHECK(rw.flat()[i] == doctest::Approx(lw.flat()[i]).epsilon(1e-5));
  // The variables live where replica_device_setter put them: w on ps 0, b on ps 1.
  CHECK(cluster.servers[0]->resources().uninitialized("", {"w"}).empty());
  CHECK(cluster.servers[1]->resources().uninitialized("", {"b"}).empty());
  CHECK(cluster.servers[1]->resources().uninitialized("", {"w"}) == std::vector<std::string>{"w"});
  if (remote.global_step)
    CHECK(static_cast<std::int64_t>(rs.run(*remote.global_step)) == 5);
}

TEST_CASE("two sessions share the variables of the cluster; reset clears them") {
  local_cluster cluster(1, 2);
  auto make = [](loom::graph& g) {
    auto _ = g.device("/job:ps/task:0");
    return loom::variable<float, 0>(g, "counter", loom::shape{}, loom::zeros_initializer{});
  };
  loom::graph g1, g2;
  auto c1 = make(g1);
  auto c2 = make(g2);
  auto inc1 = c1.assign_add(1.0f);
  auto inc2 = c2.assign_add(1.0f);
  loom::session s1(g1, cluster.worker(0).target(), quiet());
  loom::session s2(g2, cluster.worker(1).target(), quiet());
  s1.run(c1.initializer());
  CHECK(static_cast<float>(s1.run(inc1)) == 1.0f);
  CHECK(static_cast<float>(s2.run(inc2)) == 2.0f); // through another worker, same variable
  CHECK(static_cast<float>(s1.run(c1)) == 2.0f);
  loom::session::reset(cluster.worker(0).target());
  CHECK_THROWS_WITH_AS(s2.run(c2), doctest::Contains("counter"), loom::failed_precondition_error);
}

TEST_CASE(
    "a session deregisters its graphs from the tasks when the graph changes and when it goes") {
  local_cluster cluster(1, 1);
  loom::graph g;
  auto v = g.on("/job:ps/task:0", [&] {
    return loom::variable<float, 0>(g, "v", loom::shape{}, loom::zeros_initializer{});
  });
  {
    loom::session s(g, cluster.worker(0).target(), quiet());
    s.run(v.initializer());
    CHECK(static_cast<float>(s.run(v)) == 0.0f);
    CHECK(cluster.ps(0).registered_graphs() == 2); // the initializer's request and the read's
    auto doubled = loom::lower(v * 2.0f);          // a new node: a new graph version
    CHECK(static_cast<float>(s.run(doubled)) == 0.0f);
    CHECK(cluster.ps(0).registered_graphs() == 1); // the older version's are gone
  }
  CHECK(cluster.ps(0).registered_graphs() == 0);
  CHECK(cluster.worker(0).registered_graphs() == 0);
}

TEST_CASE("a task started with another host list is refused before anything is placed on it") {
  // ps 0 and ps 1 list the ps hosts as p0,p1; the worker was given them as p1,p0, so by its
  // spec ps task 0 is at p1, where ps task 1 serves.
  const auto ports = free_ports(3);
  auto host = [&](std::size_t i) { return "127.0.0.1:" + std::to_string(ports[i]); };
  const auto right = loom::cluster_spec::from_flags(host(0) + "," + host(1), host(2));
  const auto swapped = loom::cluster_spec::from_flags(host(1) + "," + host(0), host(2));
  loom::server ps0(right, "ps", 0), ps1(right, "ps", 1), worker(swapped, "worker", 0);
  loom::graph g;
  auto v = g.on("/job:ps/task:0", [&] {
    return loom::variable<float, 0>(g, "v", loom::shape{}, loom::zeros_initializer{});
  });
  loom::session s(g, worker.target(), quiet());
  const std::string what =
      error_of([&] { s.run(v.initializer()); }, loom::error_code::invalid_argument);
  INFO(what);
  CHECK(contains(what, "ps task 0 is at " + host(1)));
  CHECK(contains(what, "the server there is ps task 1"));
  CHECK(contains(what, "host lists"));
  // Nothing was registered with the wrong task, nor created there.
  CHECK(ps1.registered_graphs() == 0);
  CHECK(ps1.resources().uninitialized("", {"v"}) == std::vector<std::string>{"v"});
}

TEST_CASE("one run fetches values computed on several tasks, with control edges across tasks") {
  local_cluster cluster(2, 1);
  loom::graph g;
  auto on = [&](const char* device, auto f) {
    auto _ = g.device(device);
    return f();
  };
  auto a = on("/job:ps/task:0", [&] { return loom::constant(g, 2.0f, "a"); });
  auto b = on("/job:ps/task:1", [&] { return loom::lower(a * 3.0f); });
  auto v = on("/job:ps/task:1", [&] {
    return loom::variable<float, 0>(g, "v", loom::shape{}, loom::zeros_initializer{});
  });
  auto set = on("/job:ps/task:0", [&] { return v.assign(b); }); // runs on ps 1, v's task
  auto c = on("/job:worker/task:0", [&] { return loom::lower(a + b); });
  loom::session s(g, cluster.worker(0).target(), quiet());
  s.run(v.initializer());
  auto [va, vb, vc, vset] = s.run(loom::fetches(a, b, c, set));
  CHECK(static_cast<float>(va) == 2.0f);
  CHECK(static_cast<float>(vb) == 6.0f);
  CHECK(static_cast<float>(vc) == 8.0f);
  CHECK(static_cast<float>(vset) == 6.0f);
  // A group across tasks: the no_op runs after both assignments.
  auto both = loom::group(g, v.assign_add(1.0f), v.assign_add(2.0f));
  s.run(both);
  CHECK(static_cast<float>(s.run(v)) == 9.0f);
}

TEST_CASE("a failing partition aborts the step everywhere and its error names the task") {
  local_cluster cluster(1, 1);
  loom::graph g;
  auto v = [&] {
    auto _ = g.device("/job:ps/task:0");
    return loom::variable<float, 1>(g, "never_initialized", loom::shape{3},
                                    loom::ones_initializer{});
  }();
  // The worker waits for v's value, which the ps cannot read: the step must fail, not hang.
  auto doubled = [&] {
    auto _ = g.device("/job:worker/task:0");
    return loom::lower(v * 2.0f);
  }();
  loom::session s(g, cluster.worker(0).target(), quiet());
  const auto what = error_of([&] { s.run(doubled); }, loom::error_code::failed_precondition);
  CHECK(contains(what, "/job:ps/replica:0/task:0"));
  CHECK(contains(what, "never_initialized"));
  // The session still works afterwards.
  s.run(v.initializer());
  CHECK(s.run(doubled).flat()[2] == 2.0f);
}

TEST_CASE(
    "a session to a target nobody serves fails after its connect deadline, naming the address") {
  // A port bound and not listening, held for the test: connections to it are refused, and
  // no other test's server can take it meanwhile (a port free_ports gave back could be).
  const int held = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(held >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  REQUIRE(::bind(held, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::getsockname(held, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  loom::cluster_session_options o = quiet();
  o.connect_timeout = std::chrono::milliseconds(300);
  loom::graph g;
  const auto address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  const auto what =
      error_of([&] { loom::session(g, "loom://" + address, o); }, loom::error_code::unavailable);
  ::close(held);
  CHECK_MESSAGE(contains(what, address), what);
}

TEST_CASE(
    "a device string naming a task the cluster lacks fails placement, naming node and device") {
  local_cluster cluster(1, 1);
  loom::graph g;
  auto c = [&] {
    auto _ = g.device("/job:ps/task:7");
    return loom::constant(g, 1.0f, "lost");
  }();
  loom::session s(g, cluster.worker(0).target(), quiet());
  const auto what = error_of([&] { s.run(c); }, loom::error_code::invalid_argument);
  CHECK(contains(what, "lost"));
  CHECK(contains(what, "/job:ps/task:7"));
}

TEST_CASE("a server's port already taken is a clear error naming the address") {
  local_cluster cluster(1, 1);
  const auto what =
      error_of([&] { loom::server(cluster.spec, "ps", 0); }, loom::error_code::unavailable);
  CHECK(contains(what, cluster.spec.task_address("ps", 0)));
}

TEST_CASE("create_local_server serves job localhost on a port of the OS's choosing") {
  auto server = loom::server::create_local_server();
  CHECK(server->target().rfind("loom://127.0.0.1:", 0) == 0);
  CHECK(server->target() != "loom://127.0.0.1:0");
  loom::graph g;
  auto hello = loom::constant(g, std::string("Hello distributed loom!"));
  loom::session s(g, server->target(), quiet());
  CHECK(s.run(hello).flat()[0] == "Hello distributed loom!");
}

TEST_CASE("join returns once a client shuts the cluster down") {
  local_cluster cluster(1, 1);
  std::thread ps([&] { cluster.servers[0]->join(); });
  loom::session::shutdown_cluster(cluster.worker(0).target());
  ps.join(); // hangs (and the test times out) if join never returns
  loom::cluster_session_options o = quiet();
  o.connect_timeout = std::chrono::milliseconds(300);
  loom::graph g;
  auto c = [&] {
    auto _ = g.device("/job:ps/task:0");
    return loom::constant(g, 1.0f);
  }();
  CHECK_THROWS_AS(loom::session(g, cluster.servers[0]->target(), o).run(c),
                  loom::unavailable_error);
}

TEST_CASE("loom-server serves a task for a graph it never saw, fused regions through their "
          "primitive ops" *
          doctest::skip(std::string(LOOM_SERVER_BIN).empty())) {
  loom::testing::ps_process_cluster cluster(LOOM_SERVER_BIN);
  loom::server& worker = *cluster.worker;
  loom::graph g;
  auto [v, update] = [&] {
    auto _ = g.device("/job:ps/task:0");
    loom::variable<float, 1> var(g, "v", loom::shape{3}, loom::ones_initializer{});
    // A fused region on the ps: this test binary has its instantiation, loom-server does not.
    auto up = var.assign(var * 2.0f + 1.0f);
    return std::make_pair(var, up);
  }();
  loom::session s(g, worker.target(), quiet());
  s.run(v.initializer());
  s.run(update);
  auto value = s.run(update);
  for (float x : value.flat())
    CHECK(x == 7.0f); // 1 -> 3 -> 7
  loom::session::shutdown_cluster(worker.target());
  auto status = cluster.ps.wait(std::chrono::seconds(30));
  REQUIRE(status.has_value());
  CHECK_MESSAGE(status->success(), cluster.ps.report());
}

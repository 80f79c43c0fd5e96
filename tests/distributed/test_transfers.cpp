// What crosses between the tasks of a step, and what does not: an optimizer's
// step sends the worker only the variables it reads and the ps only their
// gradients, a constant is built on every task that reads it, and a session
// whose target serves in its own process hands that task's feeds and fetches
// over in memory, on the session's thread.
#include <loom/api.hpp>
#include <loom/runtime/partition.hpp> // partition_graph, under test here

#include <doctest/doctest.h>
#include <support/cluster.hpp>
#include <support/messages.hpp>
#include <support/process.hpp>

#include "linear_model.hpp"

#include <algorithm>
#include <chrono>
#include <future>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using loom::testing::contains;
using loom::testing::local_cluster;
using loom::testing::quiet;
using namespace std::chrono_literals;

using loom::testing::linear_model;
using loom::testing::trained_by;

// The partitions a master would register for `req` on `cluster`, the session's
// default device on worker 0.
std::vector<loom::detail::graph_partition>
partitions(const loom::graph& g, loom::detail::run_request req, const local_cluster& cluster) {
  std::sort(req.fed.begin(), req.fed.end());
  std::set<loom::node_id> ref_only;
  std::vector<loom::node_def> nodes = loom::detail::nodes_to_place(g, req, ref_only);
  loom::placer_options po;
  po.default_device = "/job:worker/replica:0/task:0/device:CPU:0";
  std::ostringstream log;
  loom::place(nodes, cluster.spec.devices(), po, log);
  return loom::detail::partition_graph(g, req, nodes, ref_only);
}

// The keys of a partition's nodes of op `op` ("_send", "_recv"), sorted.
std::vector<std::string> keys(const loom::detail::graph_partition& p, const std::string& op) {
  std::vector<std::string> out;
  for (const loom::node_def& n : p.image.nodes)
    if (n.op == op)
      out.push_back(n.attr<std::string>("key"));
  std::sort(out.begin(), out.end());
  return out;
}

const loom::detail::graph_partition&
on_task(const std::vector<loom::detail::graph_partition>& parts, const std::string& job) {
  auto it = std::find_if(parts.begin(), parts.end(),
                         [&](const auto& p) { return contains(p.task, "/job:" + job + "/"); });
  REQUIRE(it != parts.end());
  return *it;
}

} // namespace

TEST_CASE("an Adam step sends the worker only its variables and the ps only their gradients") {
  local_cluster cluster(1, 1);
  linear_model m(1, trained_by::adam_with_global_step);
  const auto parts =
      partitions(m.g, {{m.loss->id()}, {m.train->id()}, {m.x.id(), m.y.id()}}, cluster);
  REQUIRE(parts.size() == 2);
  const auto& ps = on_task(parts, "ps");
  const auto& worker = on_task(parts, "worker");
  const std::string to_worker = "->/job:worker/replica:0/task:0";
  // The weights, once each; no beta power, no completion of an update.
  CHECK(keys(ps, "_send") == std::vector<std::string>{"b" + to_worker, "w" + to_worker});
  // Two gradients: no hyperparameter, no increment, no control edge.
  const auto sent = keys(worker, "_send");
  CHECK(sent.size() == 2);
  for (const std::string& k : sent) {
    CAPTURE(k);
    CHECK(!contains(k, "^"));
    CHECK(!contains(k, "Adam/"));
    CHECK(!contains(k, "constant"));
  }
  CHECK(keys(ps, "_recv").size() == 2);
  CHECK(keys(worker, "_recv").size() == 2);
}

TEST_CASE("a step's tensors for one task travel as one message") {
  local_cluster cluster(1, 1);
  linear_model m(1, trained_by::adam_with_global_step);
  loom::session s(m.g, cluster.target(), quiet());
  s.run(loom::global_variables_initializer(m.g));
  auto step = [&] {
    s.run(loom::fetches(*m.train, *m.loss),
          {{m.x, loom::testing::batch_x()}, {m.y, loom::testing::batch_y()}});
  };
  step(); // registers the partitions
  const auto ps_before = cluster.ps(0).received();
  const auto worker_before = cluster.worker(0).received();
  constexpr int steps = 5;
  for (int i = 0; i < steps; ++i)
    step();
  // Each step: w and b to the worker in one message, their gradients back in one.
  CHECK(cluster.worker(0).received().messages - worker_before.messages == steps);
  CHECK(cluster.worker(0).received().tensors - worker_before.tensors == 2 * steps);
  CHECK(cluster.ps(0).received().messages - ps_before.messages == steps);
  CHECK(cluster.ps(0).received().tensors - ps_before.tensors == 2 * steps);
}

TEST_CASE("a constant read on another task is built there, not sent every step") {
  local_cluster cluster(1, 1);
  loom::graph g;
  auto scale = [&] {
    auto _ = g.device("/job:ps/task:0");
    return loom::constant(g, 3.0f, "scale");
  }();
  loom::placeholder<float, 1> x(g, loom::shape{2}, "x");
  auto scaled = [&] {
    auto _ = g.device("/job:worker/task:0");
    return loom::lower(x * scale);
  }();
  const auto parts = partitions(g, {{scaled.id(), scale.id()}, {}, {x.id()}}, cluster);
  const auto& worker = on_task(parts, "worker");
  CHECK(keys(worker, "_recv").empty());
  CHECK(keys(on_task(parts, "ps"), "_send").empty());
  CHECK(std::count_if(worker.image.nodes.begin(), worker.image.nodes.end(),
                      [](const auto& n) { return n.name == "scale"; }) == 1);
  // Fetched on its own task and used on the other, it computes the same.
  loom::session s(g, cluster.target(), quiet());
  auto [v, c] =
      s.run(loom::fetches(scaled, scale), {{x, loom::tensor<float, 1>(loom::shape{2}, {1, -2})}});
  CHECK(v.flat()[0] == 3.0f);
  CHECK(v.flat()[1] == -6.0f);
  CHECK(static_cast<float>(c) == 3.0f);
}

TEST_CASE("a session whose target serves in its process runs that task's part in memory") {
  local_cluster cluster(1, 1);
  loom::graph g;
  loom::placeholder<std::string, 1> words(g, loom::shape{2}, "words");
  auto counter = [&] {
    auto _ = g.device("/job:ps/task:0");
    return loom::variable<float, 0>(g, "counter", loom::shape{}, loom::zeros_initializer{});
  }();
  auto on_worker = [&] {
    auto _ = g.device("/job:worker/task:0");
    return loom::lower(counter + 1.0f);
  }();
  auto count = counter.assign_add(1.0f);
  const loom::node_id echo = [&] {
    auto _ = g.device("/job:worker/task:0");
    return g.add_node("identity", {words.id()});
  }();
  loom::session s(g, cluster.target(), quiet());
  s.run(counter.initializer());
  // Fed strings and fetched values come back as the session's own tensors.
  auto out = s.run_nodes(
      {echo, on_worker.id(), count.id()}, {},
      {{words.id(), loom::any_tensor::from_vector<std::string>(loom::shape{2}, {"a", "bc"})}});
  REQUIRE(out.size() == 3);
  CHECK(out[0].data<std::string>()[1] == "bc");
  CHECK(*out[1].data<float>() == 1.0f);
  CHECK(*out[2].data<float>() == 1.0f);
  // The target stopped: its part fails at once, saying so, instead of reaching
  // for a socket nobody serves.
  CHECK(static_cast<float>(s.run(on_worker)) == 2.0f);
  cluster.worker(0).stop();
  CHECK_THROWS_WITH_AS(s.run(on_worker), doctest::Contains("in this process) stopped"),
                       loom::unavailable_error);
}

TEST_CASE("a step of the in-process target past its deadline fails as deadline exceeded") {
  local_cluster cluster(1, 1);
  loom::graph g;
  std::optional<loom::variable<std::int64_t, 0>> anchor;
  {
    auto _ = g.device("/job:worker/task:0"); // the wait runs on the session's own task
    anchor.emplace(g, "anchor", loom::shape{}, loom::zeros_initializer{});
  }
  loom::placeholder<std::int64_t, 0> v(g, loom::shape{}, "v");
  auto wait = g.add_node("counter_wait", {anchor->id(), v.id()}, {{"counter", std::string("t")}});
  auto o = quiet();
  o.step_timeout = 300ms;
  loom::session s(g, cluster.target(), o);
  const auto begin = std::chrono::steady_clock::now();
  try {
    s.run_nodes({wait}, {}, {{v.id(), loom::any_tensor::scalar<std::int64_t>(1)}});
    FAIL("the wait returned");
  } catch (const loom::deadline_exceeded_error& e) {
    CHECK(contains(e.what(), "/job:worker/replica:0/task:0"));
    CHECK(contains(e.what(), "300 ms"));
  }
  CHECK(std::chrono::steady_clock::now() - begin < 5s);
  // The session goes on.
  s.run(anchor->initializer());
  CHECK(static_cast<std::int64_t>(s.run(*anchor)) == 0);
}

TEST_CASE("the in-process target's part ends when another task of the step dies" *
          doctest::skip(std::string(LOOM_SERVER_BIN).empty())) {
  loom::testing::ps_process_cluster cluster(LOOM_SERVER_BIN);
  loom::graph g;
  loom::placeholder<std::int64_t, 0> threshold(g, loom::shape{}, "threshold");
  // The ps waits for a counter nobody raises; the worker waits for what the ps sends.
  const loom::node_id waited = [&] {
    auto _ = g.device("/job:ps/task:0");
    loom::variable<std::int64_t, 0> anchor(g, "anchor", loom::shape{}, loom::zeros_initializer{});
    return g.add_node("counter_wait", {anchor.id(), threshold.id()},
                      {{"counter", std::string("never")}});
  }();
  const loom::node_id doubled = [&] {
    auto _ = g.device("/job:worker/task:0");
    return g.add_node("add", {waited, waited});
  }();
  loom::session s(g, cluster.worker->target(), quiet());
  auto step = std::async(std::launch::async, [&] {
    s.run_nodes({doubled}, {}, {{threshold.id(), loom::any_tensor::scalar<std::int64_t>(1)}});
  });
  REQUIRE(step.wait_for(500ms) == std::future_status::timeout); // both parts wait
  // No abort comes from the ps: it is gone.
  cluster.ps.kill();
  // Without a watch on the ps's call, the worker's part would wait for its value forever.
  REQUIRE(step.wait_for(10s) == std::future_status::ready);
  CHECK_THROWS_WITH_AS(step.get(), doctest::Contains("ps task 0"), loom::unavailable_error);
}

TEST_CASE("a plain session whose step a restarted ps aborted registers its graph again" *
          doctest::skip(std::string(LOOM_SERVER_BIN).empty())) {
  loom::testing::ps_process_cluster cluster(LOOM_SERVER_BIN);
  loom::graph g;
  auto v = g.on("/job:ps/task:0", [&] {
    return loom::variable<float, 0>(g, "v", loom::shape{}, loom::constant_initializer{3});
  });
  loom::session s(g, cluster.worker->target(), quiet());
  s.run(v.initializer());
  CHECK(static_cast<float>(s.run(v)) == 3.0f);
  cluster.ps.kill();
  loom::testing::child restarted(LOOM_SERVER_BIN, {"--ps_hosts=" + cluster.ps_host,
                                                   "--worker_hosts=" + cluster.worker_host,
                                                   "--job_name=ps", "--task_index=0"});
  REQUIRE(restarted.wait_for_output("serving /job:ps/task:0"));
  // The restarted ps does not know the session's graph: the step is aborted,
  // as TF's worker answers ...
  CHECK_THROWS_WITH_AS(s.run(v.initializer()), doctest::Contains("has no registered graph"),
                       loom::aborted_error);
  // ... and the next runs register their requests again, the one registered
  // before the restart too (TF's session would fail until made again).
  s.run(v.initializer());
  CHECK(static_cast<float>(s.run(v)) == 3.0f);
}

TEST_CASE("a step fetches more tensors from a ps than one frame may carry") {
  local_cluster cluster(1, 1);
  loom::graph g;
  std::vector<loom::variable<float, 1>> vars;
  {
    auto _ = g.device(loom::replica_device_setter({.ps_tasks = 1}));
    for (int i = 0; i < 1500; ++i) // past the 1024 tensors of one frame
      vars.emplace_back(g, "v" + std::to_string(i), loom::shape{2},
                        loom::constant_initializer{static_cast<double>(i)});
  }
  loom::session s(g, cluster.target(), quiet());
  s.run(loom::global_variables_initializer(g));
  std::vector<loom::node_id> ids;
  for (const auto& v : vars)
    ids.push_back(v.id());
  const auto values = s.run_nodes(ids, {}); // the ps's reply: one split message
  REQUIRE(values.size() == vars.size());
  for (std::size_t i = 0; i < values.size(); ++i)
    CHECK(values[i].flat<float>()[1] == static_cast<float>(i));
}

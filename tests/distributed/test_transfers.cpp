// What crosses between the tasks of a step, and what does not: an optimizer's
// step sends the worker only the variables it reads and the ps only their
// gradients, a constant is built on every task that reads it, and a session
// whose target serves in its own process hands that task's feeds and fetches
// over in memory, on the session's thread.
#include <loom/api.hpp>

#include <doctest/doctest.h>
#include <support/cluster.hpp>
#include <support/messages.hpp>

#include <algorithm>
#include <chrono>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using loom::testing::contains;
using loom::testing::local_cluster;
using loom::testing::quiet;
using namespace std::chrono_literals;

// y = relu(x w1 + b1) w2 + b2, squared error, Adam with a global step; the
// variables on ps tasks by replica_device_setter when ps_tasks > 0.
struct adam_model {
  loom::graph g;
  loom::placeholder<float, 2> x{g, loom::shape{-1, 3}, "x"};
  loom::placeholder<float, 2> y{g, loom::shape{-1, 2}, "y"};
  std::optional<loom::variable<std::int64_t, 0>> global_step;
  std::optional<loom::output<float, 0>> loss;
  std::optional<loom::operation> train;

  explicit adam_model(int ps_tasks) {
    g.set_random_seed(5);
    auto build = [&] {
      global_step.emplace(loom::create_global_step(g));
      loom::variable<float, 2> w1(g, "w1", loom::shape{3, 4},
                                  loom::random_normal_initializer{.stddev = 0.5});
      loom::variable<float, 1> b1(g, "b1", loom::shape{4}, loom::zeros_initializer{});
      loom::variable<float, 2> w2(g, "w2", loom::shape{4, 2},
                                  loom::random_normal_initializer{.stddev = 0.5});
      loom::variable<float, 1> b2(g, "b2", loom::shape{2}, loom::zeros_initializer{});
      auto h = loom::relu(loom::xw_plus_b(x, w1, b1));
      loss = loom::lower(loom::reduce_mean(loom::square(loom::xw_plus_b(h, w2, b2) - y)));
      train = loom::adam_optimizer{0.05}.minimize(*loss, *global_step);
    };
    if (ps_tasks > 0) {
      auto _ = g.device(loom::replica_device_setter({.ps_tasks = ps_tasks}));
      build();
    } else {
      build();
    }
  }
};

loom::tensor<float, 2> batch_x() {
  return loom::tensor<float, 2>(loom::shape{4, 3}, {1, 2, 3, 0, 1, 0, -1, 2, 1, 3, 0, 1});
}
loom::tensor<float, 2> batch_y() {
  return loom::tensor<float, 2>(loom::shape{4, 2}, {1, 0, 0, 1, 1, 1, 0.5f, -1});
}

// The partitions a master would register for `req` on `cluster`, the session's
// default device on worker 0.
std::vector<loom::graph_partition> partitions(const loom::graph& g, loom::run_request req,
                                              const local_cluster& cluster) {
  std::sort(req.fed.begin(), req.fed.end());
  std::set<loom::node_id> ref_only;
  std::vector<loom::node_def> nodes = loom::nodes_to_place(g, req, ref_only);
  loom::placer_options po;
  po.default_device = "/job:worker/replica:0/task:0/device:CPU:0";
  std::ostringstream log;
  loom::place(nodes, cluster.spec.devices(), po, log);
  return loom::partition_graph(g, req, nodes, ref_only);
}

// The keys of a partition's nodes of op `op` ("_send", "_recv"), sorted.
std::vector<std::string> keys(const loom::graph_partition& p, const std::string& op) {
  std::vector<std::string> out;
  for (const loom::node_def& n : p.image.nodes)
    if (n.op == op)
      out.push_back(n.attr<std::string>("key"));
  std::sort(out.begin(), out.end());
  return out;
}

const loom::graph_partition& on_task(const std::vector<loom::graph_partition>& parts,
                                     const std::string& job) {
  auto it = std::find_if(parts.begin(), parts.end(),
                         [&](const auto& p) { return contains(p.task, "/job:" + job + "/"); });
  REQUIRE(it != parts.end());
  return *it;
}

} // namespace

TEST_CASE("an Adam step sends the worker only its variables and the ps only their gradients") {
  local_cluster cluster(1, 1);
  adam_model m(1);
  const auto parts =
      partitions(m.g, {{m.loss->id()}, {m.train->id()}, {m.x.id(), m.y.id()}}, cluster);
  REQUIRE(parts.size() == 2);
  const auto& ps = on_task(parts, "ps");
  const auto& worker = on_task(parts, "worker");
  const std::string to_worker = "->/job:worker/replica:0/task:0";
  // The weights, once each; no beta power, no completion of an update.
  CHECK(keys(ps, "_send") == std::vector<std::string>{"b1" + to_worker, "b2" + to_worker,
                                                      "w1" + to_worker, "w2" + to_worker});
  // Four gradients: no hyperparameter, no increment, no control edge.
  const auto sent = keys(worker, "_send");
  CHECK(sent.size() == 4);
  for (const std::string& k : sent) {
    CAPTURE(k);
    CHECK(!contains(k, "^"));
    CHECK(!contains(k, "Adam/"));
    CHECK(!contains(k, "constant"));
  }
  CHECK(keys(ps, "_recv").size() == 4);
  CHECK(keys(worker, "_recv").size() == 4);
}

TEST_CASE("Adam with a global step on a cluster trains as it does in one process") {
  local_cluster cluster(2, 1);
  adam_model remote(2), local(0);
  loom::session rs(remote.g, cluster.target(), quiet());
  loom::session ls(local.g);
  rs.run(loom::global_variables_initializer(remote.g));
  ls.run(loom::global_variables_initializer(local.g));
  for (int step = 0; step < 6; ++step) {
    auto [_, rl] = rs.run(loom::fetches(*remote.train, *remote.loss),
                          {{remote.x, batch_x()}, {remote.y, batch_y()}});
    auto [__, ll] = ls.run(loom::fetches(*local.train, *local.loss),
                           {{local.x, batch_x()}, {local.y, batch_y()}});
    CHECK(static_cast<float>(rl) == doctest::Approx(static_cast<float>(ll)).epsilon(1e-5));
  }
  CHECK(static_cast<std::int64_t>(rs.run(*remote.global_step)) == 6);
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

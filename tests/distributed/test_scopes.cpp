// Where a TensorFlow user trips, item 1: scopes apply where an expression is
// written. loom's typed expressions are lazy, yet `auto b = a + 2.f;` inside
// g.device("/job:worker") runs on the worker, named and ordered by the scopes
// around that line, wherever it is lowered later.
#include <loom/api.hpp>

#include <doctest/doctest.h>
#include <support/cluster.hpp>
#include <support/messages.hpp>

#include <sstream>
#include <string>
#include <utility>

using loom::testing::contains;
using loom::testing::local_cluster;
using loom::testing::quiet;

namespace {

// Seed 001's pinning cell, written as a TF user writes it: one `with` block per
// line, no lambdas; each scope ends when the function returns, before any
// expression reaches the graph.
//
//   with tf.device("/job:ps"):             a = tf.Variable(1.0, name="a")
//   with tf.device("/job:worker"):         b = a + 2
//   with tf.device("/job:worker/task:1"):  c = a + b
auto seed_001_pinning(loom::graph& g) {
  auto on_ps = g.device("/job:ps");
  loom::variable<float, 0> a(g, "a", 1.0);
  auto on_worker = g.device("/job:worker");
  auto b = a + 2.f;
  auto on_worker_1 = g.device("/job:worker/task:1");
  auto c = a + b;
  return std::make_pair(a, c);
}

} // namespace

TEST_CASE("seed 001 written the Python way: b on the worker, c on worker 1, as TF places them") {
  local_cluster cluster(2, 3);
  loom::graph g;
  auto [a, c] = seed_001_pinning(g);
  std::ostringstream log;
  loom::cluster_session_options o = quiet();
  o.log_device_placement = true;
  o.placement_log = &log;
  // with tf.Session("grpc://127.0.0.1:2221") as sess: the session is on ps 0.
  loom::session sess(g, cluster.ps(0).target(), o);
  sess.run(a.initializer());
  CHECK(static_cast<float>(sess.run(c)) == 4.0f); // print(c.eval()) -> 4.0
  const std::string placed = log.str();
  INFO(placed);
  // TF's log: a on ps 0; b (add) on worker 0; c (add_1) on worker 1.
  CHECK(contains(placed, "a: (variable): /job:ps/replica:0/task:0/device:CPU:0"));
  // Printed once, though placed for both runs (TF places and logs the graph once).
  CHECK(placed.find("a: (variable)") == placed.rfind("a: (variable)"));
  CHECK(contains(placed, "add: (add): /job:worker/replica:0/task:0/device:CPU:0"));
  CHECK(contains(placed, "add_1: (add): /job:worker/replica:0/task:1/device:CPU:0"));
  // The constant 2 of `a + 2` is b's operand, created with b.
  CHECK(contains(placed, "constant_1: (constant): /job:worker/replica:0/task:0/device:CPU:0"));
}

TEST_CASE("an expression keeps the name scope and control dependencies it was written under") {
  loom::graph g;
  loom::placeholder<float, 1> x(g, loom::shape{2}, "x");
  loom::variable<float, 0> v(g, "v", 0.0);
  auto bump = v.assign_add(1.0f);
  auto written = [&] {
    auto names = g.name_scope("layer");
    auto after_bump = g.control_dependencies({bump.id()});
    return loom::exp(x) * 3.f; // not lowered here
  }();
  auto elsewhere = g.name_scope("elsewhere");
  auto y = loom::lower(written);
  CHECK(y.name() == "layer/mul");
  const auto& mul = y.node();
  const auto& exp = g.node(mul.inputs[0]);
  CHECK(exp.name == "layer/exp");
  CHECK(exp.control_inputs == std::vector<loom::node_id>{bump.id()});
  CHECK(mul.control_inputs == std::vector<loom::node_id>{bump.id()});
}

TEST_CASE("a tree built under two scopes lowers each subtree under its own; the consumer where "
          "it is called") {
  loom::graph g;
  loom::placeholder<float, 2> x(g, loom::shape{2, 2}, "x");
  auto on_gpu = [&] {
    auto s = g.device("/job:worker/task:0/device:GPU:0");
    return loom::relu(x * 2.f);
  }();
  auto mixed = [&] {
    auto s = g.device("/job:ps/task:1");
    return on_gpu + 1.f; // its add on ps 1, its relu and mul on the GPU
  }();
  auto consumer = [&] {
    auto s = g.device("/job:worker/task:2");
    return loom::matmul(mixed, x); // the matmul where it is called
  }();
  const auto& mm = consumer.node();
  CHECK(mm.requested_device == "/job:worker/task:2");
  const auto& add = g.node(mm.inputs[0]);
  CHECK(add.op == "add");
  CHECK(add.requested_device == "/job:ps/task:1");
  const auto& relu = g.node(add.inputs[0]);
  CHECK(relu.op == "relu");
  CHECK(relu.requested_device == "/job:worker/task:0/device:GPU:0");
  CHECK(g.node(relu.inputs[0]).requested_device == "/job:worker/task:0/device:GPU:0");
  // on<gpu>: the GPU inside the scopes the tree was written under.
  auto written_on_ps = [&] {
    auto s = g.device("/job:ps/task:0");
    return x * 5.f;
  }();
  CHECK(loom::on<loom::gpu>(written_on_ps).node().requested_device ==
        "/job:ps/task:0/device:GPU:0");
}

TEST_CASE("a variable from a bare number (tf.Variable(1.0)) must be exactly of its dtype") {
  loom::graph g;
  loom::variable<std::int32_t, 0> n(g, "n", 3);
  loom::variable<double, 0> d(g, "d", 0.5f);
  CHECK(n.node().op == "variable");
  const std::string what = loom::testing::message_of<loom::invalid_argument_error>(
      [&] { loom::variable<std::int32_t, 0>(g, "bad", 1.5); });
  CHECK(contains(what, "variable 'bad': the initial value 1.500000 is not a int32"));
  CHECK_FALSE(g.try_find("bad").has_value()); // refused before its node was made
  loom::session s(g);
  s.run(loom::group(g, n.initializer(), d.initializer()));
  CHECK(static_cast<std::int32_t>(s.run(n)) == 3);
  CHECK(static_cast<double>(s.run(d)) == 0.5);
}

TEST_CASE("a placement policy may return device strings, each parsed once") {
  loom::graph g;
  int calls = 0;
  auto policy = [&calls](const loom::node_def& n, const loom::device_spec&) -> std::string {
    ++calls;
    return n.op == "variable" ? "/job:ps/task:1" : "/job:worker";
  };
  {
    auto s = g.device(policy);
    loom::variable<float, 0> v(g, "v", 2.0);
    auto y = loom::lower(v * 3.f);
    CHECK(v.node().requested_device == "/job:ps/task:1");
    CHECK(y.node().requested_device == "/job:worker");
  }
  CHECK(calls >= 3);
  auto bad = g.device([](const loom::node_def&, const loom::device_spec&) {
    return std::string("/job:ps/tusk:0");
  });
  const std::string what = loom::testing::message_of<loom::invalid_argument_error>(
      [&] { (void)loom::constant(g, 1.0f); });
  CHECK(contains(what, "the placement policy of a device scope returned \"/job:ps/tusk:0\" for "
                       "node 'constant"));
}

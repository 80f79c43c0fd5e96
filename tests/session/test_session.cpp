// The local session: typed fetches (tensors, scalars, tuples, nothing),
// feeds checked at run time, feeding nodes that are not placeholders, missing
// feeds, uninitialized variables, graphs that grow after the session was
// created, snapshots, and separate sessions.
#include <doctest/doctest.h>
#include <support/messages.hpp>

#include <loom/loom.hpp>

#include <cstdint>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

using loom::graph;
using loom::node_id;
using loom::shape;
using loom::tensor;

namespace {

using loom::testing::contains;
using loom::testing::message_of;

loom::session_options opts() {
  return {.intra_op_threads = 2};
}

} // namespace

TEST_CASE("typed fetches: tensors, scalars, tuples and nothing") {
  graph g;
  loom::placeholder<float, 2> x(g, shape{-1, 2}, "x");
  auto doubled = loom::lower(x * 2.0f);
  auto total = loom::reduce_sum(x);
  auto count = loom::lower(loom::cast<std::int64_t>(loom::reduce_max(x)));
  loom::variable<float, 0> v(g, "v", shape{}, loom::constant_initializer{1.5});
  auto init = loom::global_variables_initializer(g);
  loom::session s(g, opts());
  const loom::feed_dict feeds{{x, tensor<float, 2>(shape{2, 2}, {1, 2, 3, 4})}};

  static_assert(std::is_same_v<decltype(s.run(doubled, feeds)), tensor<float, 2>>);
  static_assert(std::is_same_v<decltype(s.run(total, feeds)), tensor<float, 0>>);
  static_assert(std::is_same_v<decltype(s.run(count, feeds)), tensor<std::int64_t, 0>>);
  static_assert(std::is_same_v<decltype(s.run(init)), loom::nothing>);
  static_assert(std::is_same_v<decltype(s.run(x + 1.0f, feeds)), tensor<float, 2>>);
  static_assert(std::is_same_v<decltype(s.run(loom::fetches(init, doubled, total), feeds)),
                               std::tuple<loom::nothing, tensor<float, 2>, tensor<float, 0>>>);

  s.run(init);
  const tensor<float, 2> d = s.run(doubled, feeds);
  CHECK(d.shape() == shape{2, 2});
  CHECK(d(0, 0) == 2.0f);
  CHECK(d(1, 1) == 8.0f);
  const float sum = s.run(total, feeds); // rank 0 converts to its scalar
  CHECK(sum == 10.0f);
  CHECK(s.run(count, feeds).item() == 4);
  CHECK(static_cast<float>(s.run(v)) == 1.5f);
  CHECK(s.run(x + 1.0f, feeds)(1, 0) == 4.0f); // an expression never lowered before

  auto [none, d2, t2] = s.run(loom::fetches(init, doubled, total), feeds);
  (void)none;
  CHECK(d2(0, 1) == 4.0f);
  CHECK(static_cast<float>(t2) == 10.0f);
  auto [first, second] = s.run(loom::fetches(doubled, doubled), feeds);
  CHECK(first(1, 0) == second(1, 0));

  // Untyped: one value per fetch, in order.
  auto values = s.run_nodes({total.id(), doubled.id()}, {}, {{x.id(), feeds[0].value()}});
  REQUIRE(values.size() == 2);
  CHECK(values[0].flat<float>()[0] == 10.0f);
  CHECK(values[1].shape() == shape{2, 2});
}

TEST_CASE("feeds are checked at run time and name the placeholder and both shapes") {
  graph g;
  loom::placeholder<float, 2> x(g, shape{-1, 2}, "x");
  loom::placeholder<float, 0> k(g, shape{}, "k");
  auto y = loom::lower(x * k);
  loom::session s(g, opts());

  auto msg = message_of<loom::invalid_argument_error>([&] {
    s.run(y, {{x, tensor<float, 2>(shape{2, 3}, 1.0f)}, {k, 2.0f}});
  });
  CHECK(contains(msg, "'x'"));
  CHECK(contains(msg, "[2, 3]"));
  CHECK(contains(msg, "[?, 2]"));

  // Any batch size fits the unknown dimension; a number feeds a scalar.
  CHECK(s.run(y, {{x, tensor<float, 2>(shape{5, 2}, 1.0f)}, {k, 3}})(4, 1) == 3.0f);

  // A dtype mismatch through the untyped API names the node and both dtypes.
  msg = message_of<loom::invalid_argument_error>([&] {
    s.run_nodes({y.id()}, {},
                {{x.id(), tensor<double, 2>(shape{1, 2}, 1.0).value()},
                 {k.id(), loom::any_tensor::scalar(1.0f)}});
  });
  CHECK(contains(msg, "'x'"));
  CHECK(contains(msg, "float64"));
  CHECK(contains(msg, "float32"));
}

TEST_CASE("a missing feed names the placeholder") {
  graph g;
  loom::placeholder<float, 1> x(g, shape{3}, "images");
  loom::placeholder<float, 1> unused(g, shape{3}, "unused");
  auto y = loom::lower(x + 1.0f);
  loom::session s(g, opts());
  auto msg = message_of<loom::invalid_argument_error>([&] { s.run(y); });
  CHECK(contains(msg, "'images'"));
  CHECK(contains(msg, "feed"));
  CHECK(contains(msg, "[3]"));
  // A placeholder that the fetch does not need need not be fed.
  CHECK(s.run(y, {{x, tensor<float, 1>(shape{3}, 1.0f)}})(2) == 2.0f);
}

TEST_CASE("a fetch, target or feed of another graph is an error naming it") {
  graph g;
  graph other;
  loom::placeholder<float, 1> x(g, shape{3}, "x");
  loom::placeholder<float, 1> z(other, shape{3}, "z");
  auto w = loom::lower(z * 2.0f);
  loom::session s(g, opts());
  CHECK(contains(message_of<loom::invalid_argument_error>([&] { s.run(w); }),
                 "fetch " + w.node().describe() + " belongs to another graph than the session's"));
  CHECK(contains(message_of<loom::invalid_argument_error>([&] { s.run(loom::as_operation(w)); }),
                 "target " + w.node().describe() + " belongs to another graph"));
  CHECK(contains(message_of<loom::invalid_argument_error>([&] {
                   s.run(x, {{z, tensor<float, 1>(shape{3}, 1.0f)}});
                 }),
                 "feed 'z' (placeholder) belongs to another graph"));
}

TEST_CASE("feeding a node that is not a placeholder replaces its value, as in TF") {
  graph g;
  loom::placeholder<float, 1> x(g, shape{2}, "x");
  auto hidden = loom::lower(loom::exp(x));
  auto out = loom::lower(hidden * 10.0f);
  auto c = loom::constant(g, 5.0f, "c");
  auto plus_c = loom::lower(out + c);
  loom::session s(g, opts());
  // x is not needed when hidden is fed.
  auto got = s.run(out, {{hidden, tensor<float, 1>(shape{2}, {1, 2})}});
  CHECK(got(0) == 10.0f);
  CHECK(got(1) == 20.0f);
  auto got2 = s.run(plus_c, {{hidden, tensor<float, 1>(shape{2}, {1, 2})}, {c, 0.5f}});
  CHECK(got2(1) == 20.5f);
  // Fetching a fed node returns the fed value.
  CHECK(s.run(hidden, {{hidden, tensor<float, 1>(shape{2}, {7, 8})}})(1) == 8.0f);
  // The shape check applies to any fed node.
  auto msg = message_of<loom::invalid_argument_error>([&] {
    s.run(out, {{hidden, tensor<float, 1>(shape{3}, 1.0f)}});
  });
  CHECK(contains(msg, "'" + hidden.name() + "'"));
  CHECK(contains(msg, "[3]"));
  CHECK(contains(msg, "[2]"));
}

TEST_CASE("reading an uninitialized variable names it") {
  graph g;
  loom::variable<float, 1> w(g, "weights", shape{3}, loom::zeros_initializer{});
  loom::variable<float, 1> other(g, "other", shape{3}, loom::ones_initializer{});
  loom::session s(g, opts());
  auto msg = message_of<loom::failed_precondition_error>([&] { s.run(w); });
  CHECK(contains(msg, "weights"));
  msg = message_of<loom::failed_precondition_error>([&] { s.run(w * 2.0f + other); });
  CHECK((contains(msg, "weights") || contains(msg, "other")));
  s.run(w.initializer());
  CHECK(s.run(w)(0) == 0.0f);
  msg = message_of<loom::failed_precondition_error>([&] { s.run(w * 2.0f + other); });
  CHECK(contains(msg, "other"));

  // Each local session has its own variables.
  loom::session fresh(g, opts());
  CHECK_THROWS_AS(fresh.run(w), loom::failed_precondition_error);
}

TEST_CASE("a session runs a graph that grew after the session was created") {
  graph g;
  loom::placeholder<float, 1> x(g, shape{2}, "x");
  auto y = loom::lower(x * 2.0f);
  loom::session s(g, opts());
  const loom::feed_dict feeds{{x, tensor<float, 1>(shape{2}, {1, 2})}};
  CHECK(s.run(y, feeds)(1) == 4.0f);

  auto z = loom::lower(y * y + 1.0f); // new nodes
  loom::variable<float, 1> v(g, "v", shape{2}, loom::constant_initializer{3});
  auto vz = loom::lower(v * z);
  CHECK(s.run(z, feeds)(1) == 17.0f);
  s.run(v.initializer());
  CHECK(s.run(vz, feeds)(0) == 15.0f);
  CHECK(s.run(y, feeds)(0) == 2.0f); // old fetches still run
}

TEST_CASE("fetches and feeds from another graph are rejected") {
  graph g, h;
  loom::placeholder<float, 1> x(g, shape{2}, "x");
  loom::placeholder<float, 1> hx(h, shape{2}, "x");
  auto y = loom::lower(x + 1.0f);
  auto hy = loom::lower(hx + 1.0f);
  loom::session s(g, opts());
  auto msg = message_of<loom::invalid_argument_error>([&] {
    s.run(hy, {{hx, tensor<float, 1>(shape{2}, 1.0f)}});
  });
  CHECK(contains(msg, "another graph"));
  msg = message_of<loom::invalid_argument_error>([&] {
    s.run(y, {{hx, tensor<float, 1>(shape{2}, 1.0f)}});
  });
  CHECK(contains(msg, "another graph"));
}

TEST_CASE("a fetched value is a snapshot") {
  graph g;
  loom::variable<float, 1> v(g, "v", shape{2}, loom::ones_initializer{});
  auto grow = v.assign_add(loom::constant(g, tensor<float, 1>(shape{2}, {1, 1})));
  loom::session s(g, opts());
  s.run(v.initializer());
  auto before = s.run(v);
  auto during = s.run(grow);
  s.run(grow);
  CHECK(before(0) == 1.0f);
  CHECK(during(0) == 2.0f);
  CHECK(s.run(v)(0) == 3.0f);
}

TEST_CASE("log_device_placement prints each node once per graph, not once per distinct run") {
  graph g;
  loom::placeholder<float, 1> x(g, shape{2}, "x");
  auto doubled = loom::lower(x * 2.0f);
  auto squared = loom::lower(loom::square(doubled));
  std::ostringstream log;
  auto o = opts();
  o.log_device_placement = true;
  o.placement_log = &log;
  loom::session s(g, o);
  const auto in = tensor<float, 1>(shape{2}, {1, 2});
  s.run(doubled, {{x, in}});
  s.run(squared, {{x, in}}); // a second plan: x and doubled are placed again
  s.run(loom::fetches(doubled, squared), {{x, in}});
  const std::string printed = log.str();
  INFO(printed);
  const std::string line = doubled.name() + ": (mul): /job:localhost/replica:0/task:0/device:CPU:0";
  const auto first = printed.find(line);
  REQUIRE(first != std::string::npos);
  CHECK(printed.find(line, first + 1) == std::string::npos);
  CHECK(contains(printed, squared.name() + ": (square): "));
  // Another session over the graph prints its own placement.
  std::ostringstream other_log;
  o.placement_log = &other_log;
  loom::session other(g, o);
  other.run(doubled, {{x, in}});
  CHECK(contains(other_log.str(), line));
}

TEST_CASE("a local session places on its CPU: a GPU or a task it lacks is an error, or soft "
          "placement moves the node and says so") {
  graph g;
  loom::placeholder<float, 1> x(g, shape{2}, "x");
  auto on_gpu = [&] {
    auto _ = g.device("/gpu:0");
    return loom::lower(loom::square(x));
  }();
  auto on_ps = [&] {
    auto _ = g.device("/job:ps/task:0");
    return loom::lower(x + 1.0f);
  }();
  const auto in = tensor<float, 1>(shape{2}, {2, -3});

  SUBCASE("without soft placement: TF's message, naming the node, the request and the devices") {
    loom::session s(g, opts());
    const auto msg = message_of<loom::invalid_argument_error>([&] { s.run(on_gpu, {{x, in}}); });
    CHECK(contains(msg, on_gpu.name()));
    CHECK(contains(msg, "explicitly assigned to /device:GPU:0"));
    CHECK(contains(msg, "[ /job:localhost/replica:0/task:0/device:CPU:0 ]"));
    CHECK(contains(msg, "allow_soft_placement"));
    const auto ps_msg = message_of<loom::invalid_argument_error>([&] { s.run(on_ps, {{x, in}}); });
    CHECK(contains(ps_msg, "/job:ps/task:0"));
  }
  SUBCASE("with soft placement: it runs on the CPU, and the log says why") {
    std::ostringstream log;
    auto o = opts();
    o.allow_soft_placement = true;
    o.log_device_placement = true;
    o.placement_log = &log;
    loom::session s(g, o);
    auto [squared, plus_one] = s.run(loom::fetches(on_gpu, on_ps), {{x, in}});
    CHECK(squared(1) == 9.0f);
    CHECK(plus_one(1) == -2.0f);
    CHECK(contains(log.str(), "soft placement of operation '" + on_gpu.name() + "'"));
    CHECK(contains(log.str(), "placed on /job:localhost/replica:0/task:0/device:CPU:0"));
    // log_device_placement: a line per node in TF's format.
    CHECK(contains(log.str(),
                   on_ps.name() + ": (add): /job:localhost/replica:0/task:0/device:CPU:0"));
  }
  SUBCASE("requests the process can satisfy need no option") {
    graph h;
    loom::placeholder<float, 1> hx(h, shape{2}, "x");
    auto cpu = [&] {
      auto _ = h.device("/job:localhost/cpu:0");
      return loom::lower(hx * 2.0f);
    }();
    loom::session s(h, opts());
    CHECK(s.run(cpu, {{hx, in}})(1) == -6.0f);
  }
}

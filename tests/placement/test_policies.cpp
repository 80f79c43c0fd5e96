// Device scopes and placement policies: TF's tf.device() stack,
// replica_device_setter with TF's exact merge rules and round-robin order,
// greedy load balancing, and the combinators.
#include <loom/graph/graph.hpp>
#include <loom/graph/ops/elementwise.hpp>
#include <loom/graph/variables.hpp>
#include <loom/placement/placement.hpp>

#include <doctest/doctest.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

using loom::device_spec;
using loom::node_def;
using loom::shape;

namespace {

// The device a node created by `make` requests.
std::string requested(const loom::graph& g, loom::node_id id) {
  return g.node(id).requested_device;
}

// A variable of any rank with a zeros initializer.
loom::node_id make_var(loom::graph& g, const std::string& name, shape s,
                       loom::dtype t = loom::dtype::f32) {
  return loom::visit_dtype(t, [&]<class T>() -> loom::node_id {
    if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, bool>)
      return loom::no_node;
    else {
      switch (s.rank()) {
      case 0: return loom::variable<T, 0>(g, name, s, loom::zeros_initializer{}).id();
      case 1: return loom::variable<T, 1>(g, name, s, loom::zeros_initializer{}).id();
      default: return loom::variable<T, 2>(g, name, s, loom::zeros_initializer{}).id();
      }
    }
  });
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const loom::error& e) {
    return e.message();
  }
  return "<no error>";
}

} // namespace

static_assert(loom::placement_policy<loom::pin>);
static_assert(loom::placement_policy<loom::replica_device_setter<>>);
static_assert(loom::placement_policy<loom::replica_device_setter<loom::greedy_load_balancing<>>>);
static_assert(loom::placement_policy<loom::when<loom::is_variable, loom::pin>>);
static_assert(loom::placement_policy<loom::first_match<loom::pin, loom::pin>>);
static_assert(loom::placement_policy<device_spec (*)(const node_def&, const device_spec&)>);
static_assert(!loom::placement_policy<int>);
static_assert(!loom::placement_policy<std::string>);
static_assert(!loom::placement_policy<std::string (*)(const node_def&)>);
static_assert(loom::partial_placement_policy<loom::when<loom::is_variable, loom::pin>>);
static_assert(!loom::partial_placement_policy<loom::pin>);
static_assert(loom::ps_strategy<loom::round_robin>);
static_assert(loom::ps_strategy<loom::greedy_load_balancing<>>);

TEST_CASE("seed 001: replica_device_setter(ps_tasks=2) pins v1, v2, v3 round robin and ops to "
          "the worker") {
  // with tf.device(tf.train.replica_device_setter(
  //         ps_tasks=2, ps_device="/job:ps", worker_device="/job:worker")):
  loom::graph g;
  std::optional<loom::variable<float, 0>> v1, v2, v3;
  std::optional<loom::output<float, 0>> s, p1, p2;
  {
    auto scope = g.device(loom::replica_device_setter(
        {.ps_tasks = 2, .ps_device = "/job:ps", .worker_device = "/job:worker"}));
    v1.emplace(g, "v1", loom::constant(g, 1.f)); // pinned to /job:ps/task:0 (defaults to /cpu:0)
    v2.emplace(g, "v2", loom::constant(g, 2.f)); // pinned to /job:ps/task:1 (defaults to /cpu:0)
    v3.emplace(g, "v3", loom::constant(g, 3.f)); // pinned to /job:ps/task:0 (defaults to /cpu:0)
    s = loom::lower(*v1 + *v2);                  // pinned to /job:worker (defaults to task:0/cpu:0)
    {
      auto task1 = g.device("/task:1");
      p1 = loom::lower(2.f * *s); // pinned to /job:worker/task:1 (defaults to /cpu:0)
      {
        auto cpu0 = g.device("/cpu:0");
        p2 = loom::lower(3.f * *s); // pinned to /job:worker/task:1/cpu:0
      }
    }
  }
  CHECK(requested(g, v1->id()) == "/job:ps/task:0");
  CHECK(requested(g, v2->id()) == "/job:ps/task:1");
  CHECK(requested(g, v3->id()) == "/job:ps/task:0");
  CHECK(requested(g, s->id()) == "/job:worker");
  CHECK(requested(g, p1->id()) == "/job:worker/task:1");
  CHECK(requested(g, p2->id()) == "/job:worker/task:1/device:CPU:0");
  // The variables' initial values and initializers are not ps ops.
  const auto init = static_cast<loom::node_id>(v1->node().attr<std::int64_t>("initializer"));
  CHECK(g.node(init).op == "assign");
  CHECK(requested(g, init) == "/job:worker");
  // Outside the scope nothing is requested.
  CHECK(requested(g, loom::constant(g, 7.f).id()).empty());
}

TEST_CASE("seed 004 (Hands-On ML): five variables over two ps tasks alternate 0, 1, 0, 1, 0") {
  loom::graph g;
  auto scope = g.device(loom::replica_device_setter({.ps_tasks = 2}));
  std::vector<std::string> got;
  for (int i = 1; i <= 5; ++i)
    got.push_back(requested(g, make_var(g, "v" + std::to_string(i), shape{})));
  CHECK(got == std::vector<std::string>{"/job:ps/task:0", "/job:ps/task:1", "/job:ps/task:0",
                                        "/job:ps/task:1", "/job:ps/task:0"});
}

TEST_CASE("replica_device_setter follows TF's merge rules") {
  loom::graph g;
  SUBCASE("an inner /job:worker/task:1 scope keeps a variable there and consumes no ps task") {
    auto scope = g.device(loom::replica_device_setter({.ps_tasks = 2}));
    const auto a = make_var(g, "a", shape{});
    loom::node_id b, op;
    {
      auto inner = g.device("/job:worker/task:1");
      b = make_var(g, "b", shape{});
      op = loom::lower(loom::output<float, 0>(g, b) * 2.f).id();
    }
    const auto c = make_var(g, "c", shape{});
    CHECK(requested(g, a) == "/job:ps/task:0");
    CHECK(requested(g, b) == "/job:worker/task:1");
    CHECK(requested(g, op) == "/job:worker/task:1");
    CHECK(requested(g, c) == "/job:ps/task:1"); // task 1: b took no turn
  }
  SUBCASE("an inner scope of the ps job takes a turn, and its task wins") {
    auto scope = g.device(loom::replica_device_setter({.ps_tasks = 3}));
    loom::node_id a;
    {
      auto inner = g.device("/job:ps/task:2");
      a = make_var(g, "a", shape{});
    }
    const auto b = make_var(g, "b", shape{});
    CHECK(requested(g, a) == "/job:ps/task:2");
    CHECK(requested(g, b) == "/job:ps/task:1"); // a consumed task 0's turn
  }
  SUBCASE("an inner device type is kept; the ps task is still chosen") {
    auto scope = g.device(loom::replica_device_setter({.ps_tasks = 2}));
    auto gpu = g.device("/gpu:0");
    CHECK(requested(g, make_var(g, "a", shape{})) == "/job:ps/task:0/device:GPU:0");
  }
  SUBCASE("an outer scope only fills what the setter left unset (scopes apply inside out)") {
    auto outer = g.device("/job:worker/replica:3/task:1/cpu:0");
    auto scope = g.device(loom::replica_device_setter({.ps_tasks = 2}));
    CHECK(requested(g, make_var(g, "a", shape{})) == "/job:ps/replica:3/task:0/device:CPU:0");
    CHECK(requested(g, loom::constant(g, 1.f).id()) == "/job:worker/replica:3/task:1/device:CPU:0");
  }
  SUBCASE("seed 002: worker_device with task and gpu, ps_device with cpu") {
    auto scope =
        g.device(loom::replica_device_setter({.ps_tasks = 1,
                                              .ps_device = "/job:ps/cpu:0",
                                              .worker_device = "/job:worker/task:1/gpu:0"}));
    CHECK(requested(g, make_var(g, "global_step", shape{}, loom::dtype::i64)) ==
          "/job:ps/task:0/device:CPU:0");
    CHECK(requested(g, loom::constant(g, 1.f).id()) == "/job:worker/task:1/device:GPU:0");
  }
  SUBCASE("merge_devices=false keeps a set device as it is") {
    auto scope = g.device(loom::replica_device_setter({.ps_tasks = 2, .merge_devices = false}));
    loom::node_id a;
    {
      auto inner = g.device("/task:1");
      a = make_var(g, "a", shape{});
    }
    CHECK(requested(g, a) == "/task:1");
    CHECK(requested(g, make_var(g, "b", shape{})) == "/job:ps/task:0");
  }
  SUBCASE("ps_tasks = 0 or an empty ps_device sends variables to the worker") {
    {
      auto scope = g.device(loom::replica_device_setter({.ps_tasks = 0}));
      CHECK(requested(g, make_var(g, "a", shape{})) == "/job:worker");
    }
    auto scope = g.device(loom::replica_device_setter({.ps_tasks = 2, .ps_device = ""}));
    CHECK(requested(g, make_var(g, "b", shape{})) == "/job:worker");
  }
  SUBCASE("ps_device without a job: no task is chosen") {
    auto scope = g.device(loom::replica_device_setter({.ps_tasks = 2, .ps_device = "/cpu:0"}));
    CHECK(requested(g, make_var(g, "a", shape{})) == "/device:CPU:0");
  }
  SUBCASE("custom ps_ops") {
    auto scope = g.device(loom::replica_device_setter({.ps_tasks = 2, .ps_ops = {"placeholder"}}));
    loom::placeholder<float, 1> x(g, shape{-1}, "x");
    CHECK(requested(g, x.id()) == "/job:ps/task:0");
    CHECK(requested(g, make_var(g, "a", shape{})) == "/job:worker");
  }
  SUBCASE("copies share the round robin, like one TF device function used twice") {
    loom::replica_device_setter setter({.ps_tasks = 2});
    loom::node_id a, b;
    {
      auto scope = g.device(setter);
      a = make_var(g, "a", shape{});
    }
    {
      auto scope = g.device(setter);
      b = make_var(g, "b", shape{});
    }
    CHECK(requested(g, a) == "/job:ps/task:0");
    CHECK(requested(g, b) == "/job:ps/task:1");
  }
  SUBCASE("bad parameters") {
    CHECK(error_of([] {
            loom::replica_device_setter({.ps_tasks = -1});
          }).find("ps_tasks must not be negative") != std::string::npos);
    CHECK(error_of([] {
            loom::replica_device_setter({.ps_tasks = 1, .ps_device = "/jb:ps"});
          }).find("ps_device") != std::string::npos);
    auto bad = [](const node_def&) { return 7; };
    auto scope = g.device(loom::replica_device_setter({.ps_tasks = 2}, bad));
    const std::string e = error_of([&] { make_var(g, "a", shape{}); });
    CHECK(e.find("chose task 7") != std::string::npos);
    CHECK(e.find("'a' (variable)") != std::string::npos);
  }
}

TEST_CASE("greedy_load_balancing puts each variable on the least loaded ps task by bytes") {
  loom::graph g;
  loom::replica_device_setter<loom::greedy_load_balancing<>> setter({.ps_tasks = 2});
  auto scope = g.device(setter);
  std::vector<std::string> got;
  got.push_back(requested(g, make_var(g, "big", shape{1000})));                // 4000 B -> 0
  got.push_back(requested(g, make_var(g, "small", shape{10})));                //   40 B -> 1
  got.push_back(requested(g, make_var(g, "d", shape{10}, loom::dtype::f64)));  //   80 B -> 1
  got.push_back(requested(g, make_var(g, "mid", shape{20, 40})));              // 3200 B -> 1
  got.push_back(requested(g, make_var(g, "more", shape{250})));                // 1000 B -> 1
  got.push_back(requested(g, make_var(g, "last", shape{}, loom::dtype::i64))); //    8 B -> 0
  CHECK(got == std::vector<std::string>{"/job:ps/task:0", "/job:ps/task:1", "/job:ps/task:1",
                                        "/job:ps/task:1", "/job:ps/task:1", "/job:ps/task:0"});
  CHECK(setter.strategy().loads() == std::vector<double>{4008, 4320});
  // Round robin would have alternated.
  loom::graph g2;
  auto rr = g2.device(loom::replica_device_setter({.ps_tasks = 2}));
  make_var(g2, "big", shape{1000});
  CHECK(requested(g2, make_var(g2, "small", shape{10})) == "/job:ps/task:1");
  CHECK(requested(g2, make_var(g2, "d", shape{10})) == "/job:ps/task:0");
}

TEST_CASE("greedy_load_balancing with a custom load and byte_size_load's errors") {
  struct one_each {
    int operator()(const node_def&) const { return 1; }
  };
  loom::greedy_load_balancing<one_each> s(3);
  node_def n;
  CHECK(s(n) == 0);
  CHECK(s(n) == 1);
  CHECK(s(n) == 2);
  CHECK(s(n) == 0);
  node_def partial;
  partial.name = "w";
  partial.op = "variable";
  partial.shape = shape{-1, 3};
  const std::string e = error_of([&] { (void)loom::byte_size_load{}(partial); });
  CHECK(e.find("'w' (variable)") != std::string::npos);
  CHECK(e.find("[?, 3]") != std::string::npos);
  // TF's fallback to the "shape" attribute.
  partial.attrs["shape"] = shape{2, 3};
  partial.type = loom::dtype::f64;
  CHECK(loom::byte_size_load{}(partial) == 48);
  CHECK(error_of([] { loom::round_robin(0)(node_def{}); }).find("must be positive") !=
        std::string::npos);
}

TEST_CASE("device scopes: strings and specs merge field by field, innermost winning") {
  loom::graph g;
  auto c = [&](float v) { return loom::constant(g, v).id(); };
  {
    auto a = g.device("/job:ps");
    CHECK(requested(g, c(1)) == "/job:ps");
    {
      auto b = g.device(device_spec{}.with_task(1));
      CHECK(requested(g, c(2)) == "/job:ps/task:1");
      {
        auto d = g.device("/job:worker/device:GPU:1");
        CHECK(requested(g, c(3)) == "/job:worker/task:1/device:GPU:1");
        auto e = g.device("/cpu");
        CHECK(requested(g, c(4)) == "/job:worker/task:1/device:CPU:1");
      }
      SUBCASE("an empty string is a no-op, as in TF") {
        auto e = g.device("");
        CHECK(requested(g, c(5)) == "/job:ps/task:1");
      }
      SUBCASE("nullptr clears every enclosing scope (tf.device(None))") {
        auto e = g.device(nullptr);
        CHECK(requested(g, c(6)).empty());
        auto f = g.device("/gpu:0");
        CHECK(requested(g, c(7)) == "/device:GPU:0");
      }
    }
    CHECK(requested(g, c(8)) == "/job:ps");
  }
  CHECK(requested(g, c(9)).empty());
  CHECK(g.current_device().empty());
  CHECK(error_of([&] { auto s = g.device("/job:ps/tusk:0"); }).find("tusk") != std::string::npos);
}

TEST_CASE("g.on runs a body in a scope and returns its result") {
  loom::graph g;
  auto x = g.on("/job:worker/task:2", [&] { return loom::constant(g, 1.f); });
  CHECK(requested(g, x.id()) == "/job:worker/task:2");
  int calls = 0;
  g.on(loom::pin{"/job:ps"}, [&] { ++calls; });
  CHECK(calls == 1);
  const loom::node_id y = g.on(nullptr, [&] { return loom::constant(g, 2.f).id(); });
  CHECK(requested(g, y).empty());
  CHECK(requested(g, loom::constant(g, 3.f).id()).empty());
}

TEST_CASE("a policy sees the named, typed node and the device from the scopes inside it") {
  loom::graph g;
  std::vector<std::string> seen;
  auto spy = [&seen](const node_def& n, const device_spec& current) {
    seen.push_back(n.op + " " + n.name + " " + n.shape.to_string() + " " + current.to_string());
    return device_spec::merged(device_spec::from_string("/job:spy"), current);
  };
  auto outer = g.device(std::ref(spy));
  auto inner = g.device("/task:4");
  const auto v = make_var(g, "w", shape{2, 3});
  CHECK(requested(g, v) == "/job:spy/task:4");
  REQUIRE(seen.size() == 3); // the variable, the zeros constant, the initializer
  CHECK(seen[0] == "variable w [2, 3] /task:4");
  CHECK(seen[2] == "assign assign [2, 3] /task:4");
}

TEST_CASE("structural CSE keeps nodes of different policy scopes apart") {
  loom::graph g;
  const auto x = loom::constant(g, 1.f);
  auto twice = [&] { return loom::lower(x * 2.f).id(); };
  const auto a = g.on(loom::pin{"/job:a"}, twice);
  const auto b = g.on(loom::pin{"/job:a"}, twice);
  const auto c = g.on("/job:a", twice);
  const auto d = g.on("/job:a", twice);
  CHECK(a != b); // two policy scopes: they might place differently
  CHECK(c == d); // the same string scope: the same node
  CHECK(requested(g, a) == "/job:a");
}

TEST_CASE("combinators: pin, when, first_match and predicates") {
  node_def v;
  v.op = "variable";
  v.name = "layer1/w";
  node_def m;
  m.op = "matmul";
  m.name = "layer2/matmul";
  const device_spec none;
  const device_spec task1 = device_spec::from_string("/task:1");

  CHECK(loom::pin{"/job:ps/task:0"}(m, none).to_string() == "/job:ps/task:0");
  CHECK(loom::pin{"/job:ps/task:0"}(m, task1).to_string() == "/job:ps/task:1");
  CHECK(loom::pin{device_spec::from_string("/gpu:0")}(m, none).to_string() == "/device:GPU:0");
  CHECK(error_of([] { loom::pin{"/jbo:ps"}; }).find("jbo") != std::string::npos);

  CHECK(loom::is_variable{}(v));
  CHECK_FALSE(loom::is_variable{}(m));
  CHECK(loom::op_is{"matmul", "add"}(m));
  CHECK_FALSE(loom::op_is{"add"}(m));
  CHECK(loom::name_matches("layer1/.*")(v));
  CHECK_FALSE(loom::name_matches("layer1")(v)); // the whole name must match
  // A pattern that is no regex: one error that names it (not std::regex_error).
  CHECK(error_of([] { loom::name_matches("layer1/(.*"); })
            .find("'layer1/(.*' is not a valid "
                  "regular expression") != std::string::npos);
  CHECK(loom::name_matches::prefix("layer2/")(m));
  CHECK_FALSE(loom::name_matches::prefix("layer2/")(v));

  loom::when on_ps{loom::is_variable{}, loom::pin{"/job:ps"}};
  CHECK(on_ps.try_place(v, none) == device_spec::from_string("/job:ps"));
  CHECK(on_ps.try_place(m, none) == std::nullopt);
  CHECK(on_ps(m, task1) == task1); // declined: keeps current

  loom::first_match policy{loom::when{loom::name_matches::prefix("layer1/"), loom::pin{"/job:a"}},
                           loom::when{loom::op_is{"matmul"}, loom::pin{"/job:b"}},
                           loom::pin{"/job:c"}};
  CHECK(policy(v, none).to_string() == "/job:a");
  CHECK(policy(m, none).to_string() == "/job:b");
  node_def other;
  other.op = "add";
  CHECK(policy(other, task1).to_string() == "/job:c/task:1");

  loom::first_match partial{loom::when{loom::is_variable{}, loom::pin{"/job:ps"}}};
  CHECK(partial.try_place(m, none) == std::nullopt);
  CHECK(partial(m, task1) == task1);
  // Nested first_match declines through.
  loom::first_match nested{partial, loom::pin{"/job:worker"}};
  CHECK(nested(m, none).to_string() == "/job:worker");
  CHECK(nested(v, none).to_string() == "/job:ps");
}

// Seed 004's simple_setter, in loom:
//   def simple_setter(ps_device="/job:ps/task:0"):
//     def _assign(op):
//       node_def = op if isinstance(op, tf.NodeDef) else op.node_def
//       if node_def.op == "Variable": return ps_device
//       else: return "/job:worker/task:%d" % (FLAGS.task)
//     return _assign
auto simple_setter(int task, std::string ps_device = "/job:ps/task:0") {
  return [=](const node_def& n, const device_spec&) {
    return device_spec::from_string(
        n.op == "variable" ? ps_device : "/job:worker/task:" + std::to_string(task));
  };
}

TEST_CASE("seed 004: a user's simple_setter is a policy in a few lines") {
  loom::graph g;
  auto scope = g.device(simple_setter(3));
  const auto v = make_var(g, "v", shape{});
  const auto x = loom::constant(g, 1.f).id();
  CHECK(requested(g, v) == "/job:ps/task:0");
  CHECK(requested(g, x) == "/job:worker/task:3");
  // The same with the library's combinators.
  loom::graph g2;
  auto scope2 =
      g2.device(loom::first_match{loom::when{loom::is_variable{}, loom::pin{"/job:ps/task:0"}},
                                  loom::pin{"/job:worker/task:3"}});
  CHECK(requested(g2, make_var(g2, "v", shape{})) == "/job:ps/task:0");
  CHECK(requested(g2, loom::constant(g2, 1.f).id()) == "/job:worker/task:3");
}

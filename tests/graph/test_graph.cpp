// The runtime graph: structural CSE, name scopes and unique names, collections,
// get_variable with TF's variable-scope reuse rules, control dependencies and
// group, graph serialization (round trip and every kind of bad input), and the
// shape errors of graph construction and of run time.
#include <doctest/doctest.h>
#include <support/messages.hpp>

#include <loom/api.hpp>
#include <loom/graph/serialize.hpp>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#ifdef __linux__
#include <sys/resource.h>
#include <unistd.h>
#endif

using loom::graph;
using loom::node_id;
using loom::shape;
using loom::tensor;

namespace {

using loom::testing::contains;
using loom::testing::message_of;

loom::session_options small_pool() {
  return {.intra_op_threads = 2};
}

// Caps this process's address space at its current size plus `extra` while it
// lives (Linux; elsewhere it does nothing).
struct address_space_limit {
#ifdef __linux__
  rlimit saved{};
  explicit address_space_limit(std::size_t extra) {
    getrlimit(RLIMIT_AS, &saved);
    std::size_t pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    rlimit r = saved;
    r.rlim_cur =
        static_cast<rlim_t>(pages * static_cast<std::size_t>(sysconf(_SC_PAGESIZE)) + extra);
    if (saved.rlim_max != RLIM_INFINITY && r.rlim_cur > saved.rlim_max)
      r.rlim_cur = saved.rlim_max;
    setrlimit(RLIMIT_AS, &r);
  }
  ~address_space_limit() {
    setrlimit(RLIMIT_AS, &saved);
  }
#else
  explicit address_space_limit(std::size_t) {}
#endif
  address_space_limit(const address_space_limit&) = delete;
  address_space_limit& operator=(const address_space_limit&) = delete;
};

} // namespace

// -- structural CSE --------------------------------------------------------------

TEST_CASE("CSE: the same subexpression used twice is one node") {
  graph g;
  loom::placeholder<float, 2> x(g, shape{2, 3}, "x");
  loom::placeholder<float, 2> y(g, shape{2, 3}, "y");
  const std::size_t before = g.size();

  auto s = x + y;
  auto sq = loom::lower(s * s);
  CHECK(g.size() == before + 2); // one add, one mul
  CHECK(sq.node().op == "mul");
  CHECK(sq.node().inputs[0] == sq.node().inputs[1]);

  auto again = loom::lower(x + y);
  CHECK(again.id() == sq.node().inputs[0]);
  CHECK(loom::lower(s * s).id() == sq.id());
  CHECK(g.size() == before + 2);

  // Number operands become constants compared by value.
  auto twice = loom::lower(x * 2.0f);
  CHECK(loom::lower(x * 2.0f).id() == twice.id());
  CHECK(loom::lower(x * 3.0f).id() != twice.id());
  CHECK(loom::lower(2.0f * x).id() != twice.id()); // operand order matters
}

TEST_CASE("CSE: different attributes make different nodes") {
  graph g;
  loom::placeholder<float, 2> a(g, shape{3, 3}, "a");
  loom::placeholder<float, 2> b(g, shape{3, 3}, "b");

  auto m = loom::matmul(a, b);
  CHECK(loom::matmul(a, b).id() == m.id());
  CHECK(loom::matmul(a, b, true, false).id() != m.id());
  CHECK(loom::matmul(a, b, false, true).id() != m.id());
  CHECK(loom::matmul(a, b, true, false).id() != loom::matmul(a, b, false, true).id());

  auto r0 = loom::reduce_sum(a, 0);
  CHECK(loom::reduce_sum(a, 0).id() == r0.id());
  CHECK(loom::reduce_sum(a, 1).id() != r0.id());
  CHECK(loom::reduce_mean(a, 0).id() != r0.id());
  CHECK(loom::reduce_sum(a, 0, loom::keepdims).id() != r0.id());
  CHECK(loom::lower(loom::cast<double>(a)).id() != loom::lower(loom::cast<std::int32_t>(a)).id());

  // Explicit names and stateful ops are never merged.
  auto n1 = loom::named(a + b, "sum");
  auto n2 = loom::named(a + b, "sum");
  CHECK(n1.id() != n2.id());
  CHECK(n1.name() == "sum");
  CHECK(n2.name() == "sum_1");
  auto u1 = loom::random_uniform<float, 1>(g, shape{4}, 0, 1, 7);
  auto u2 = loom::random_uniform<float, 1>(g, shape{4}, 0, 1, 7);
  CHECK(u1.id() != u2.id());

  // The same expression under a control dependency is another node.
  auto plain = loom::lower(a - b);
  {
    auto deps = g.control_dependencies({u1.id()});
    CHECK(loom::lower(a - b).id() != plain.id());
  }
  // ... and on another device.
  {
    auto dev = g.device("/job:ps/task:0");
    CHECK(loom::lower(a - b).id() != plain.id());
  }
}

// -- names -------------------------------------------------------------------------

TEST_CASE("CSE: small constants merge by value, large ones never") {
  graph g;
  const tensor<float, 1> small(shape{4}, 2.0f);
  CHECK(loom::constant(g, small).id() == loom::constant(g, small).id());
  CHECK(loom::constant(g, small).id() != loom::constant(g, tensor<float, 1>(shape{4}, 3.0f)).id());
  // Past 64 elements each constant is its own node, even with equal values, in this graph
  // and in another one built beside it.
  const tensor<float, 1> large(shape{100}, 2.0f);
  const node_id l1 = loom::constant(g, large).id();
  const node_id l2 = loom::constant(g, large).id();
  CHECK(l1 != l2);
  graph other;
  CHECK(loom::constant(other, large).id() != loom::constant(other, large).id());
  CHECK(loom::constant(g, large).id() != l2);
}

TEST_CASE("name scopes and unique names") {
  graph g;
  auto a = loom::constant(g, 1.0f, "a");
  auto a1 = loom::constant(g, 2.0f, "a");
  auto a2 = loom::constant(g, 3.0f, "a");
  CHECK(a.name() == "a");
  CHECK(a1.name() == "a_1");
  CHECK(a2.name() == "a_2");
  CHECK(loom::constant(g, 4.0f, "a_1").name() == "a_1_1");

  node_id inner_add = loom::no_node;
  {
    auto outer = g.name_scope("outer");
    CHECK(g.current_name_scope() == "outer");
    {
      auto inner = g.name_scope("inner");
      CHECK(g.current_name_scope() == "outer/inner");
      auto s = loom::lower(a + a1);
      inner_add = s.id();
      CHECK(s.name() == "outer/inner/add");
      CHECK(loom::lower(a * a1).name() == "outer/inner/mul");
      CHECK(loom::lower(a + a2).name() == "outer/inner/add_1");
    }
    CHECK(g.current_name_scope() == "outer");
    CHECK(loom::lower(a1 + a2).name() == "outer/add");
  }
  CHECK(g.current_name_scope().empty());
  {
    auto again = g.name_scope("outer"); // a second scope of the same name is uniquified
    CHECK(g.current_name_scope() == "outer_1");
    CHECK(loom::lower(a2 - a1).name() == "outer_1/sub");
  }
  {
    auto reenter = g.name_scope("outer/"); // a trailing '/' re-enters the scope
    CHECK(loom::lower(a2 + a2).name() == "outer/add_1");
  }
  {
    auto outer = g.name_scope("outer");
    auto cleared = g.name_scope(""); // "" clears the scope
    CHECK(loom::lower(a * a2).name() == "mul");
  }

  CHECK(g.find("outer/inner/add") == inner_add);
  CHECK_FALSE(g.try_find("outer/inner/nope").has_value());
  auto msg = message_of<loom::not_found_error>([&] { (void)g.find("outer/inner/nope"); });
  CHECK(contains(msg, "outer/inner/nope"));

  // Variables are uniquified like every node (TF's tf.Variable).
  loom::variable<float, 1> v(g, "v", shape{2}, loom::zeros_initializer{});
  loom::variable<float, 1> v1(g, "v", shape{2}, loom::zeros_initializer{});
  CHECK(v.name() == "v");
  CHECK(v1.name() == "v_1");
}

// -- collections -----------------------------------------------------------------

TEST_CASE("collections: global, trainable and local variables") {
  namespace coll = loom::collection;
  graph g;
  loom::variable<float, 1> w(g, "w", shape{3}, loom::ones_initializer{});
  loom::variable<float, 1> frozen(g, "frozen", shape{3}, loom::zeros_initializer{},
                                  loom::variable_options{.trainable = false});
  loom::variable<float, 1> local(g, "local", shape{2}, loom::constant_initializer{5.0},
                                 loom::variable_options{.local = true});

  CHECK(g.collection(coll::global_variables) == std::vector<node_id>{w.id(), frozen.id()});
  CHECK(g.collection(coll::trainable_variables) == std::vector<node_id>{w.id()});
  CHECK(g.collection(coll::local_variables) == std::vector<node_id>{local.id()});
  CHECK(g.collection("no such collection").empty());

  g.add_to_collection("mine", w.id());
  g.add_to_collection("mine", w.id()); // once only
  g.add_to_collection("mine", local.id());
  CHECK(g.collection("mine") == std::vector<node_id>{w.id(), local.id()});
  CHECK_THROWS_AS(g.add_to_collection("mine", 12345), loom::invalid_argument_error);

  // The global initializer initializes the global variables only.
  loom::session s(g, small_pool());
  s.run(loom::global_variables_initializer(g));
  CHECK(s.run(w)(2) == 1.0f);
  CHECK(s.run(frozen)(0) == 0.0f);
  auto msg = message_of<loom::failed_precondition_error>([&] { s.run(local); });
  CHECK(contains(msg, "local"));
  s.run(loom::local_variables_initializer(g));
  CHECK(s.run(local)(1) == 5.0f);
}

// -- get_variable ------------------------------------------------------------------

TEST_CASE("get_variable follows TF's variable_scope reuse rules") {
  graph g;
  auto w = [&] {
    auto scope = loom::variable_scope(g, "layer");
    return loom::get_variable<float, 2>(g, "w", shape{2, 3});
  }();
  CHECK(w.name() == "layer/w");
  CHECK(w.shape() == shape{2, 3});
  const auto& trainable = g.collection(loom::collection::trainable_variables);
  CHECK(std::count(trainable.begin(), trainable.end(), w.id()) == 1);

  SUBCASE("reuse=true returns the same node and fails for a missing one") {
    auto scope = loom::variable_scope(g, "layer", true);
    const std::size_t before = g.size();
    auto again = loom::get_variable<float, 2>(g, "w", shape{2, 3});
    CHECK(again.id() == w.id());
    CHECK(g.size() == before);

    auto msg = message_of<loom::not_found_error>([&] {
      loom::get_variable<float, 2>(g, "missing", shape{2, 3});
    });
    CHECK(contains(msg, "layer/missing"));

    // Nested scopes inherit reuse.
    auto inner = loom::variable_scope(g, "inner");
    msg =
        message_of<loom::not_found_error>([&] { loom::get_variable<float, 1>(g, "b", shape{3}); });
    CHECK(contains(msg, "layer/inner/b"));
  }

  SUBCASE("reuse with another shape or dtype fails naming both") {
    auto scope = loom::variable_scope(g, "layer", true);
    auto msg = message_of<loom::invalid_argument_error>([&] {
      loom::get_variable<float, 2>(g, "w", shape{3, 3});
    });
    CHECK(contains(msg, "layer/w"));
    CHECK(contains(msg, "[2, 3]"));
    CHECK(contains(msg, "[3, 3]"));
    msg = message_of<loom::invalid_argument_error>([&] {
      loom::get_variable<double, 2>(g, "w", shape{2, 3});
    });
    CHECK(contains(msg, "float32"));
    CHECK(contains(msg, "float64"));
  }

  SUBCASE("reuse=false fails for an existing variable") {
    auto scope = loom::variable_scope(g, "layer");
    auto msg = message_of<loom::already_exists_error>([&] {
      loom::get_variable<float, 2>(g, "w", shape{2, 3});
    });
    CHECK(contains(msg, "layer/w"));
    // New variables are fine, and ops in the scope take its name.
    auto b = loom::get_variable<float, 1>(g, "b", shape{3}, loom::zeros_initializer{});
    CHECK(b.name() == "layer/b");
    CHECK(loom::lower(b * 2.0f).name() == "layer/mul");
  }

  SUBCASE("without a scope") {
    auto v = loom::get_variable<double, 1>(g, "v", shape{4}, loom::ones_initializer{});
    CHECK(v.name() == "v");
    auto again = [&] { loom::get_variable<double, 1>(g, "v", shape{4}); };
    CHECK_THROWS_AS(again(), loom::already_exists_error);
    loom::session s(g, small_pool());
    s.run(loom::global_variables_initializer(g));
    auto value = s.run(v);
    CHECK(value.shape() == shape{4});
    CHECK(value(3) == 1.0);
  }
}

// -- control dependencies and group -------------------------------------------------

TEST_CASE("control dependencies order effects before their dependents") {
  graph g;
  loom::variable<float, 0> v(g, "v", shape{}, loom::zeros_initializer{});
  auto inc = v.assign_add(1.0f);
  node_id read_id;
  {
    auto deps = g.control_dependencies({inc.id()});
    auto read = loom::named(v, "read");
    read_id = read.id();
    CHECK(read.node().control_inputs == std::vector<node_id>{inc.id()});
  }
  auto unrelated = loom::lower(v * 1.0f);
  CHECK(unrelated.node().control_inputs.empty());

  loom::session s(g, small_pool());
  s.run(loom::global_variables_initializer(g));
  loom::output<float, 0> read(g, read_id);
  // As in TF, the read runs after the increment it depends on and sees it.
  CHECK(static_cast<float>(s.run(read)) == 1.0f);
  CHECK(static_cast<float>(s.run(read)) == 2.0f);
  CHECK(static_cast<float>(s.run(v)) == 2.0f);
  CHECK(static_cast<float>(s.run(unrelated)) == 2.0f); // no dependency: no increment
}

TEST_CASE("group runs all its inputs and outputs nothing") {
  graph g;
  loom::variable<float, 0> a(g, "a", shape{}, loom::zeros_initializer{});
  loom::variable<std::int64_t, 1> b(g, "b", shape{2}, loom::zeros_initializer{});
  auto set_a = a.assign(1.5f);
  auto set_b = b.assign(loom::constant(g, tensor<std::int64_t, 1>(shape{2}, {7, 8})));
  auto both = loom::group(g, set_a, set_b);
  CHECK(both.node().op == "no_op");
  CHECK(both.node().inputs.empty());
  CHECK(both.node().control_inputs == std::vector<node_id>{set_a.id(), set_b.id()});
  CHECK(both.name() == "group");

  loom::session s(g, small_pool());
  s.run(loom::global_variables_initializer(g));
  static_assert(std::is_same_v<decltype(s.run(both)), loom::nothing>);
  s.run(both);
  CHECK(static_cast<float>(s.run(a)) == 1.5f);
  auto bv = s.run(b);
  CHECK(bv(0) == 7);
  CHECK(bv(1) == 8);

  auto named_group = loom::group(g, std::vector<node_id>{set_a.id()}, "only_a");
  CHECK(named_group.name() == "only_a");
}

// -- serialization ----------------------------------------------------------------------

namespace {

bool same_tensor(const loom::any_tensor& a, const loom::any_tensor& b) {
  if (a.empty() || b.empty())
    return a.empty() == b.empty();
  if (a.type() != b.type() || a.shape() != b.shape())
    return false;
  return loom::visit_dtype(a.type(), [&]<class T>() {
    auto x = a.flat<T>();
    auto y = b.flat<T>();
    return std::equal(x.begin(), x.end(), y.begin(), y.end());
  });
}

bool same_attr(const loom::attr_value& a, const loom::attr_value& b) {
  if (a.index() != b.index())
    return false;
  return std::visit(
      [&](const auto& x) {
        using X = std::decay_t<decltype(x)>;
        const X& y = std::get<X>(b);
        if constexpr (std::is_same_v<X, loom::any_tensor>)
          return same_tensor(x, y);
        else
          return x == y;
      },
      a);
}

void check_same_node(const loom::node_def& a, const loom::node_def& b) {
  INFO("node " << a.name);
  CHECK(a.id == b.id);
  CHECK(a.op == b.op);
  CHECK(a.name == b.name);
  CHECK(a.type == b.type);
  CHECK(a.shape == b.shape);
  CHECK(a.inputs == b.inputs);
  CHECK(a.control_inputs == b.control_inputs);
  CHECK(a.requested_device == b.requested_device);
  CHECK(a.assigned_device == b.assigned_device);
  CHECK(a.colocation_group == b.colocation_group);
  REQUIRE(a.attrs.size() == b.attrs.size());
  for (const auto& entry : a.attrs) { // no structured binding: INFO captures it (clang 14)
    const std::string& key = entry.first;
    INFO("attr " << key);
    auto it = b.attrs.find(key);
    REQUIRE(it != b.attrs.end());
    CHECK(same_attr(entry.second, it->second));
  }
}

struct sample_graph {
  graph g;
  node_id x, y, fused, init, text;
};

// A graph with every node field and every attribute type set somewhere.
sample_graph make_sample_graph() {
  sample_graph s;
  graph& g = s.g;
  g.set_random_seed(42);
  loom::placeholder<float, 2> x(g, shape{-1, 3}, "x");
  loom::variable<float, 2> w(g, "w", shape{3, 2},
                             loom::random_uniform_initializer{-1.0, 1.0}); // double, int64
  loom::variable<float, 1> b(g, "b", shape{2}, loom::zeros_initializer{},
                             loom::variable_options{.container = "c1"}); // string
  auto y = loom::xw_plus_b(x, w, b);
  auto mm = loom::matmul(x, w, false, false);                 // bool
  auto sums = loom::reduce_sum(y + mm, {0}, loom::keepdims);  // int64 vector
  auto am = loom::argmax(y, 1);                               // int64
  auto as_double = loom::lower(loom::cast<double>(y));        // dtype
  auto fused = loom::named(loom::exp(y) * 2.0f + y, "fused"); // a fusion region
  auto text = loom::constant(g, "hello, graph");              // string tensor
  auto flags = loom::constant(g, tensor<bool, 1>(shape{3}, std::vector<bool>{true, false, true}));
  {
    auto scope = loom::variable_scope(g, "scoped");
    (void)loom::get_variable<double, 1>(g, "v", shape{2}, loom::ones_initializer{});
  }
  {
    auto dev = g.device("/job:ps/task:0");
    (void)loom::lower(y * 3.0f); // requested_device
  }
  node_id placed = loom::lower(y - 1.0f).id();
  g.mutable_node(placed).assigned_device = "/job:worker/replica:0/task:1/device:CPU:0";
  auto init = loom::global_variables_initializer(g); // control inputs
  g.add_to_collection("extras", sums.id());
  g.add_to_collection("extras", am.id());
  g.add_to_collection("extras", as_double.id());
  g.add_to_collection("extras", flags.id());
  s.x = x.id();
  s.y = y.id();
  s.fused = fused.id();
  s.init = init.id();
  s.text = text.id();
  return s;
}

} // namespace

TEST_CASE("serialization: a round trip keeps every node field and attribute") {
  sample_graph src = make_sample_graph();
  const graph& g = src.g;
  const std::string bytes = loom::serialize_graph(g);
  graph h = loom::deserialize_graph(bytes);

  REQUIRE(h.size() == g.size());
  for (node_id i = 0; i < static_cast<node_id>(g.size()); ++i)
    check_same_node(g.node(i), h.node(i));

  // Every attribute type occurs in the sample, so all of them were compared.
  std::vector<bool> seen(std::variant_size_v<loom::attr_value>, false);
  for (node_id i = 0; i < static_cast<node_id>(g.size()); ++i)
    for (const auto& [key, value] : g.node(i).attrs)
      seen[value.index()] = true;
  CHECK(std::all_of(seen.begin(), seen.end(), [](bool b) { return b; }));

  const auto& gs = g.state();
  const auto& hs = h.state();
  CHECK(hs.collections == gs.collections);
  CHECK(hs.seed == gs.seed);
  CHECK(hs.variable_store == gs.variable_store);
  REQUIRE(hs.fusions.size() == gs.fusions.size());
  REQUIRE_FALSE(gs.fusions.empty());
  for (std::size_t i = 0; i < gs.fusions.size(); ++i) {
    CHECK(hs.fusions[i].root == gs.fusions[i].root);
    CHECK(hs.fusions[i].key == gs.fusions[i].key);
    CHECK(hs.fusions[i].leaves == gs.fusions[i].leaves);
  }
  CHECK(h.find("fused") == src.fused);
  CHECK(h.find("scoped/v") == g.find("scoped/v"));

  // The same bytes again: serialization is deterministic.
  CHECK(loom::serialize_graph(h) == bytes);
  CHECK(contains(loom::graph_to_json(h), "\"format_version\": 1"));

  // The rebuilt graph runs, and computes what the original computes.
  const auto feed_x = tensor<float, 2>(shape{2, 3}, {1, 2, 3, -1, 0, 0.5f}).value();
  auto run = [&](graph& which) {
    loom::session s(which, small_pool());
    s.run_nodes({}, {src.init});
    return s.run_nodes({src.y, src.fused, src.text}, {}, {{src.x, feed_x}});
  };
  graph g_copy = src.g;
  auto expected = run(g_copy);
  auto actual = run(h);
  REQUIRE(actual.size() == 3);
  for (std::size_t i = 0; i < 3; ++i)
    CHECK(same_tensor(actual[i], expected[i]));
  CHECK(actual[2].flat<std::string>()[0] == "hello, graph");

  // New nodes get names unique among the loaded ones.
  node_id added = h.add_node("add", {src.y, src.y}, {}, "fused");
  CHECK(h.node(added).name == "fused_1");
  node_id again = loom::lower(loom::output<float, 2>(h, src.y) * 5.0f).id();
  CHECK(h.find(h.node(again).name) == again);
}

TEST_CASE("serialization: bad bytes give one clear error") {
  sample_graph src = make_sample_graph();
  const std::string bytes = loom::serialize_graph(src.g);
  REQUIRE(bytes.size() > 16);

  SUBCASE("truncated") {
    for (std::size_t cut : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{5},
                            bytes.size() / 3, bytes.size() / 2, bytes.size() - 1}) {
      INFO("cut at " << cut);
      auto msg =
          message_of<loom::data_loss_error>([&] { loom::deserialize_graph(bytes.substr(0, cut)); });
      CHECK(contains(msg, "serialized graph"));
    }
  }

  SUBCASE("wrong format version") {
    // Portable binary: one byte of byte order, then the uint32 format version.
    REQUIRE(bytes[1] == 1);
    std::string other = bytes;
    other[1] = 2;
    auto msg = message_of<loom::data_loss_error>([&] { loom::deserialize_graph(other); });
    CHECK(contains(msg, "format version 2"));
    CHECK(contains(msg, "version 1"));
  }

  SUBCASE("graph images that decode but are inconsistent") {
    auto reencode = [](const loom::detail::graph_image& img) {
      std::ostringstream os;
      {
        cereal::PortableBinaryOutputArchive ar(os);
        ar(img);
      }
      return os.str();
    };
    const auto good = loom::detail::image_of(src.g);
    const node_id y = src.y;

    auto img = good;
    img.nodes[static_cast<std::size_t>(y)].inputs[0] = static_cast<node_id>(good.nodes.size() + 3);
    auto msg = message_of<loom::data_loss_error>([&] { loom::deserialize_graph(reencode(img)); });
    CHECK(contains(msg, img.nodes[static_cast<std::size_t>(y)].name));

    img = good;
    img.nodes[static_cast<std::size_t>(y)].op = "no_such_op";
    msg = message_of<loom::not_found_error>([&] { loom::deserialize_graph(reencode(img)); });
    CHECK(contains(msg, "no_such_op"));

    img = good;
    img.nodes[1].name = img.nodes[0].name;
    msg = message_of<loom::data_loss_error>([&] { loom::deserialize_graph(reencode(img)); });
    CHECK(contains(msg, img.nodes[0].name));

    img = good;
    img.nodes[static_cast<std::size_t>(y)].type = static_cast<loom::dtype>(77);
    msg = message_of<loom::data_loss_error>([&] { loom::deserialize_graph(reencode(img)); });
    CHECK(contains(msg, img.nodes[static_cast<std::size_t>(y)].name));

    img = good;
    img.nodes[static_cast<std::size_t>(src.x)].attrs["dtype"] =
        loom::attr_value{static_cast<loom::dtype>(99)};
    msg = message_of<loom::data_loss_error>([&] { loom::deserialize_graph(reencode(img)); });
    CHECK(contains(msg, "'x'"));

    img = good;
    img.collections["extras"].push_back(-4);
    msg = message_of<loom::data_loss_error>([&] { loom::deserialize_graph(reencode(img)); });
    CHECK(contains(msg, "extras"));
  }

  SUBCASE("any single corrupted byte: a loom error or a valid graph, never a crash") {
    // cereal trusts the size tags it reads: a corrupted one makes it allocate
    // (and zero) up to gigabytes before the read fails. Bound that here so the
    // sweep stays fast; the outcome (a loom error) is the same either way.
    address_space_limit limit(std::size_t{64} << 20);
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      for (unsigned char mask : {0xFFu, 0x80u, 0x01u}) {
        std::string bad = bytes;
        bad[i] = static_cast<char>(static_cast<unsigned char>(bad[i]) ^ mask);
        try {
          graph h = loom::deserialize_graph(bad);
          CHECK(h.size() <= src.g.size());
        } catch (const loom::error&) {
          // the expected outcome for most bytes
        } catch (const std::exception& e) {
          FAIL_CHECK("byte " << i << " ^ " << unsigned(mask) << ": not a loom error: " << e.what());
        }
      }
    }
  }
}

// -- shape errors -------------------------------------------------------------------------

TEST_CASE("shape errors at graph construction name the node and both shapes") {
  graph g;
  loom::placeholder<float, 2> a(g, shape{2, 3}, "a");
  loom::placeholder<float, 2> b(g, shape{4, 5}, "b");
  auto msg = message_of<loom::invalid_argument_error>([&] { loom::matmul(a, b); });
  CHECK(contains(msg, "matmul"));
  CHECK(contains(msg, "[2, 3]"));
  CHECK(contains(msg, "[4, 5]"));

  loom::placeholder<float, 2> m34(g, shape{3, 4}, "m34");
  loom::placeholder<float, 1> v5(g, shape{5}, "v5");
  msg = message_of<loom::invalid_argument_error>([&] { loom::lower(m34 + v5); });
  CHECK(contains(msg, "'add'"));
  CHECK(contains(msg, "[3, 4]"));
  CHECK(contains(msg, "[5]"));

  msg = message_of<loom::invalid_argument_error>([&] { loom::reshape(m34, {5, -1}); });
  CHECK(contains(msg, "reshape"));
  CHECK(contains(msg, "[3, 4]"));
  CHECK(contains(msg, "[5, -1]"));

  msg = message_of<loom::invalid_argument_error>([&] { loom::reduce_sum(m34, 2); });
  CHECK(contains(msg, "axis 2"));
  CHECK(contains(msg, "[3, 4]"));
}

TEST_CASE("shape errors at run time name the node and both shapes") {
  graph g;
  loom::placeholder<float, 2> a(g, shape{-1, -1}, "a");
  loom::placeholder<float, 2> b(g, shape{-1, -1}, "b");
  auto product = loom::matmul(a, b);
  loom::placeholder<float, 1> v(g, shape{-1}, "v");
  auto sum = loom::lower(a + v);
  auto fused = loom::lower((a + v) * 2.0f - 1.0f);
  loom::session s(g, small_pool());

  auto msg = message_of<loom::invalid_argument_error>([&] {
    s.run(product,
          {{a, tensor<float, 2>(shape{2, 3}, 1.0f)}, {b, tensor<float, 2>(shape{4, 5}, 1.0f)}});
  });
  CHECK(contains(msg, product.name()));
  CHECK(contains(msg, "[2, 3]"));
  CHECK(contains(msg, "[4, 5]"));

  for (node_id id : {sum.id(), fused.id()}) {
    loom::output<float, 2> out(g, id);
    msg = message_of<loom::invalid_argument_error>([&] {
      s.run(out, {{a, tensor<float, 2>(shape{3, 4}, 1.0f)}, {v, tensor<float, 1>(shape{5}, 1.0f)}});
    });
    // The add, or the fused region's root that contains it.
    CHECK((contains(msg, sum.name()) || contains(msg, out.name())));
    CHECK(contains(msg, "[3, 4]"));
    CHECK(contains(msg, "[5]"));
  }
}

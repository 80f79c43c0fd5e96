// The placer: filling unset fields, colocation groups, soft placement,
// device_filters, kernels, errors and TF's log_device_placement format.
#include <loom/graph/builder.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/ops/elementwise.hpp>
#include <loom/graph/ops/training.hpp>
#include <loom/graph/variables.hpp>
#include <loom/placement/placement.hpp>
#include <support/messages.hpp>

#include <doctest/doctest.h>

#include <functional>
#include <sstream>
#include <string>
#include <vector>

using loom::device_spec;
using loom::node_def;
using loom::shape;

namespace {

std::vector<device_spec> devices(std::initializer_list<const char*> names) {
  std::vector<device_spec> out;
  for (const char* n : names)
    out.push_back(device_spec::from_string(n));
  return out;
}

// Two ps tasks and two worker tasks with a CPU each; worker 1 also has a GPU.
std::vector<device_spec> small_cluster() {
  return devices({"/job:ps/replica:0/task:0/device:CPU:0", "/job:ps/replica:0/task:1/device:CPU:0",
                  "/job:worker/replica:0/task:0/device:CPU:0",
                  "/job:worker/replica:0/task:1/device:CPU:0",
                  "/job:worker/replica:0/task:1/device:GPU:0"});
}

node_def make_node(loom::node_id id, std::string name, std::string op, std::string device = {},
                   std::string group = {}) {
  node_def n;
  n.id = id;
  n.name = std::move(name);
  n.op = std::move(op);
  n.requested_device = std::move(device);
  n.colocation_group = std::move(group);
  return n;
}

std::string invalid_argument_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const loom::invalid_argument_error& e) {
    return e.message();
  }
  return "<no invalid_argument_error>";
}

using loom::testing::contains;

} // namespace

TEST_CASE("unset fields come from the session's task, then CPU, then index 0") {
  std::vector<node_def> nodes{
      make_node(0, "none", "constant"),
      make_node(1, "job_only", "constant", "/job:worker"),
      make_node(2, "ps", "constant", "/job:ps"),
      make_node(3, "task1", "constant", "/task:1"),
      make_node(4, "gpu", "constant", "/device:GPU:*"),
      make_node(5, "full", "constant", "/job:ps/replica:0/task:1/device:CPU:0"),
  };
  std::ostringstream log;
  SUBCASE("session on worker 1") {
    loom::place(nodes, small_cluster(), {.default_device = "/job:worker/replica:0/task:1"}, log);
    CHECK(nodes[0].assigned_device == "/job:worker/replica:0/task:1/device:CPU:0");
    CHECK(nodes[1].assigned_device == "/job:worker/replica:0/task:1/device:CPU:0");
    CHECK(nodes[2].assigned_device == "/job:ps/replica:0/task:0/device:CPU:0");
    CHECK(nodes[3].assigned_device == "/job:worker/replica:0/task:1/device:CPU:0");
    CHECK(nodes[4].assigned_device == "/job:worker/replica:0/task:1/device:GPU:0");
    CHECK(nodes[5].assigned_device == "/job:ps/replica:0/task:1/device:CPU:0");
  }
  SUBCASE("session on ps 1: a task index means nothing in another job") {
    loom::place(nodes, small_cluster(), {.default_device = "/job:ps/task:1"}, log);
    CHECK(nodes[0].assigned_device == "/job:ps/replica:0/task:1/device:CPU:0");
    CHECK(nodes[1].assigned_device == "/job:worker/replica:0/task:0/device:CPU:0");
    CHECK(nodes[2].assigned_device == "/job:ps/replica:0/task:1/device:CPU:0");
  }
  SUBCASE("no default device: the lowest device name") {
    loom::place(nodes, small_cluster(), {}, log);
    CHECK(nodes[0].assigned_device == "/job:ps/replica:0/task:0/device:CPU:0");
    CHECK(nodes[1].assigned_device == "/job:worker/replica:0/task:0/device:CPU:0");
    CHECK(nodes[3].assigned_device == "/job:ps/replica:0/task:1/device:CPU:0");
  }
  CHECK(log.str().empty()); // nothing logged unless asked
}

TEST_CASE("colocation: a variable's initializer, updates and optimizer apply ops share its "
          "device") {
  loom::graph g;
  loom::node_id v, init, up, apply, other;
  {
    auto scope = g.device(loom::replica_device_setter({.ps_tasks = 2}));
    g.on("/job:ps",
         [&] { (void)loom::variable<float, 1>(g, "first", shape{3}, loom::zeros_initializer{}); });
    loom::variable<float, 1> w(g, "w", shape{3}, loom::zeros_initializer{});
    v = w.id();
    init = static_cast<loom::node_id>(w.node().attr<std::int64_t>("initializer"));
    up = w.assign_add(w * 2.f).id();
    const auto lr = loom::constant(g, 0.1f).id();
    const auto grad = loom::lower(loom::output<float, 1>(g, v) * 2.f).id();
    apply = loom::detail::build::op(g, "apply_gradient_descent", {v, lr, grad});
    other = grad;
  }
  REQUIRE(g.node(v).requested_device == "/job:ps/task:1");
  REQUIRE(g.node(up).requested_device == "/job:worker"); // conflicts: the variable wins
  std::ostringstream log;
  loom::place(g, small_cluster(),
              {.log_device_placement = true, .default_device = "/job:worker/replica:0/task:0"},
              log);
  const std::string ps1 = "/job:ps/replica:0/task:1/device:CPU:0";
  CHECK(g.node(v).assigned_device == ps1);
  CHECK(g.node(init).assigned_device == ps1);
  CHECK(g.node(up).assigned_device == ps1);
  CHECK(g.node(apply).assigned_device == ps1);
  CHECK(g.node(other).assigned_device == "/job:worker/replica:0/task:0/device:CPU:0");
  CHECK(contains(log.str(), "Ignoring device specification /job:worker for node '" +
                                g.node(up).name +
                                "' because it is colocated with 'w', which "
                                "requests /job:ps/task:1\n"));
}

TEST_CASE("colocation: compatible requests complete each other; ref inputs join a group") {
  std::vector<node_def> nodes{
      make_node(0, "v", "variable", "/job:ps", "v"),
      make_node(1, "v/assign", "assign", "/job:ps/task:1", "v"),
      make_node(2, "u", "variable", "/job:ps/task:0", "u"),
      make_node(3, "u_update", "assign_add", "/job:worker"), // no group: joins u's by its ref input
      make_node(4, "x", "constant"),
  };
  nodes[3].inputs = {2, 4};
  std::ostringstream log;
  loom::place(nodes, small_cluster(), {.default_device = "/job:worker/task:0"}, log);
  CHECK(nodes[0].assigned_device == "/job:ps/replica:0/task:1/device:CPU:0");
  CHECK(nodes[1].assigned_device == "/job:ps/replica:0/task:1/device:CPU:0");
  CHECK(nodes[3].colocation_group == "u");
  CHECK(nodes[3].assigned_device == "/job:ps/replica:0/task:0/device:CPU:0");
  CHECK(nodes[4].assigned_device == "/job:worker/replica:0/task:0/device:CPU:0");
}

TEST_CASE("a device that does not exist: an error without soft placement, a logged fallback "
          "with it") {
  std::vector<node_def> nodes{make_node(0, "hid/matmul", "matmul", "/job:worker/task:0/gpu:0"),
                              make_node(1, "v9", "variable", "/job:ps/task:5", "v9")};
  SUBCASE("without soft placement") {
    const std::string e = invalid_argument_message([&] { loom::place(nodes, small_cluster()); });
    CHECK(contains(e, "Cannot assign a device for operation 'hid/matmul' (matmul)"));
    CHECK(contains(e, "explicitly assigned to /job:worker/task:0/device:GPU:0"));
    CHECK(contains(e, "available devices are [ /job:ps/replica:0/task:0/device:CPU:0, "
                      "/job:ps/replica:0/task:1/device:CPU:0, "
                      "/job:worker/replica:0/task:0/device:CPU:0, "
                      "/job:worker/replica:0/task:1/device:CPU:0, "
                      "/job:worker/replica:0/task:1/device:GPU:0 ]"));
    CHECK(contains(e, "allow_soft_placement"));
    std::vector<node_def> only_v{nodes[1]};
    CHECK(contains(invalid_argument_message([&] { loom::place(only_v, small_cluster()); }),
                   "'v9' (variable): it was explicitly assigned to /job:ps/task:5"));
  }
  SUBCASE("with soft placement") {
    std::ostringstream log;
    loom::place(nodes, small_cluster(),
                {.allow_soft_placement = true, .default_device = "/job:worker/task:1"}, log);
    // Same task, CPU.
    CHECK(nodes[0].assigned_device == "/job:worker/replica:0/task:0/device:CPU:0");
    // No such task: anywhere, preferring the session's task.
    CHECK(nodes[1].assigned_device == "/job:worker/replica:0/task:1/device:CPU:0");
    CHECK(contains(log.str(),
                   "loom placer: soft placement of operation 'hid/matmul' (matmul): it was "
                   "explicitly assigned to /job:worker/task:0/device:GPU:0 but available devices "
                   "are ["));
    CHECK(contains(log.str(), "; placed on /job:worker/replica:0/task:0/device:CPU:0\n"));
    CHECK(contains(log.str(), "'v9' (variable)"));
  }
}

TEST_CASE("kernels: a GPU request without a GPU kernel") {
  auto has_kernel = [](std::string_view op, loom::dtype t, std::string_view type) {
    return type == "CPU" || (op == "matmul" && t == loom::dtype::f32);
  };
  std::vector<node_def> nodes{make_node(0, "mm", "matmul", "/job:worker/task:1/gpu:0"),
                              make_node(1, "str", "string_join", "/job:worker/task:1/gpu:0")};
  nodes[1].type = loom::dtype::string;
  const std::string e = invalid_argument_message(
      [&] { loom::place(nodes, small_cluster(), {.has_kernel = has_kernel}); });
  CHECK(contains(e, "Cannot assign a device for operation 'str' (string_join)"));
  CHECK(contains(e, "no kernel for 'str' (string_join) as string on the devices matching "
                    "/job:worker/task:1/device:GPU:0"));
  std::ostringstream log;
  loom::place(nodes, small_cluster(), {.allow_soft_placement = true, .has_kernel = has_kernel},
              log);
  CHECK(nodes[0].assigned_device == "/job:worker/replica:0/task:1/device:GPU:0");
  CHECK(nodes[1].assigned_device == "/job:worker/replica:0/task:1/device:CPU:0");
  CHECK(contains(log.str(), "soft placement of operation 'str' (string_join)"));
  // An unconstrained node avoids a device without its kernel.
  std::vector<node_def> any{make_node(0, "s", "string_join", "/device:GPU:*")};
  any[0].type = loom::dtype::string;
  CHECK(contains(invalid_argument_message(
                     [&] { loom::place(any, small_cluster(), {.has_kernel = has_kernel}); }),
                 "no kernel"));
}

TEST_CASE("device_filters hide devices (seed 002's session config)") {
  // device_filters=["/job:ps", "/job:worker/task:%d" % FLAGS.task_index] on worker 1
  const loom::placer_options opts{.allow_soft_placement = false,
                                  .device_filters = {"/job:ps", "/job:worker/task:1"},
                                  .default_device = "/job:worker/task:1"};
  loom::placer p(small_cluster(), opts);
  CHECK(p.visible_devices() ==
        devices({"/job:ps/replica:0/task:0/device:CPU:0", "/job:ps/replica:0/task:1/device:CPU:0",
                 "/job:worker/replica:0/task:1/device:CPU:0",
                 "/job:worker/replica:0/task:1/device:GPU:0"}));
  std::vector<node_def> nodes{make_node(0, "a", "add", "/job:worker"),
                              make_node(1, "b", "add", "/job:ps")};
  p.place(nodes);
  CHECK(nodes[0].assigned_device == "/job:worker/replica:0/task:1/device:CPU:0");
  CHECK(nodes[1].assigned_device == "/job:ps/replica:0/task:0/device:CPU:0");

  std::vector<node_def> hidden{make_node(0, "c", "add", "/job:worker/task:0")};
  const std::string e = invalid_argument_message([&] { p.place(hidden); });
  CHECK(contains(e, "'c' (add): it was explicitly assigned to /job:worker/task:0"));
  CHECK_FALSE(contains(e, "/job:worker/replica:0/task:0/device:CPU:0")); // not listed: hidden
  CHECK(contains(e, "device_filters [\"/job:ps\", \"/job:worker/task:1\"] hide the devices that "
                    "match it"));

  CHECK(contains(invalid_argument_message(
                     [] { loom::placer(small_cluster(), {.device_filters = {"/job:chief"}}); }),
                 "device_filters [\"/job:chief\"] match none of the available devices"));
  CHECK(contains(invalid_argument_message(
                     [] { loom::placer(small_cluster(), {.device_filters = {"/jb:ps"}}); }),
                 "device filter \"/jb:ps\""));
}

TEST_CASE("log_device_placement prints TF's line per node") {
  std::vector<node_def> nodes{make_node(0, "v1", "variable", "/job:ps/task:0", "v1"),
                              make_node(1, "add", "add", "/job:worker")};
  std::ostringstream log;
  loom::place(nodes, small_cluster(), {.log_device_placement = true}, log);
  CHECK(log.str() == "v1: (variable): /job:ps/replica:0/task:0/device:CPU:0\n"
                     "add: (add): /job:worker/replica:0/task:0/device:CPU:0\n");
}

TEST_CASE("placer input errors") {
  CHECK(contains(invalid_argument_message([] { loom::placer(devices({"/job:ps/task:0/cpu:0"})); }),
                 "available device '/job:ps/task:0/device:CPU:0' is not fully specified"));
  CHECK(contains(invalid_argument_message([] { loom::placer(std::vector<device_spec>{}); }),
                 "no devices"));
  CHECK(contains(
      invalid_argument_message([] { loom::placer(small_cluster(), {.default_device = "/job"}); }),
      "default_device"));
  std::vector<node_def> bad{make_node(0, "n", "add", "/job:ps/tsk:1")};
  CHECK(contains(invalid_argument_message([&] { loom::place(bad, small_cluster()); }),
                 "node 'n' (add)"));
}

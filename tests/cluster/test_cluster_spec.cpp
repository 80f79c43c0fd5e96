// cluster_spec: TF's ClusterSpec semantics, address checks, the seeds' flags,
// the device list and replica_device_setter from a cluster.
#include <loom/cluster/cluster.hpp>
#include <loom/graph/ops/elementwise.hpp>
#include <loom/graph/variables.hpp>
#include <loom/placement/placer.hpp>
#include <support/messages.hpp>

#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

using loom::cluster_spec;

namespace {

template <class E = loom::error> std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.message();
  }
  return "<no error of the expected type>";
}

using loom::testing::contains;

// Seed 001's cluster.
cluster_spec seed_cluster() {
  return cluster_spec{{"ps",
                       {
                           "127.0.0.1:2221", // /job:ps/task:0
                           "127.0.0.1:2222", // /job:ps/task:1
                       }},
                      {"worker",
                       {
                           "127.0.0.1:2223", // /job:worker/task:0
                           "127.0.0.1:2224", // /job:worker/task:1
                           "127.0.0.1:2225", // /job:worker/task:2
                       }}};
}

} // namespace

TEST_CASE("seed 001's cluster: jobs, tasks and addresses as TF's ClusterSpec gives them") {
  const cluster_spec c = seed_cluster();
  CHECK(c.jobs() == std::vector<std::string>{"ps", "worker"});
  CHECK(c.num_tasks("ps") == 2);
  CHECK(c.num_tasks("worker") == 3);
  CHECK(c.task_indices("worker") == std::vector<int>{0, 1, 2});
  CHECK(c.task_address("ps", 1) == "127.0.0.1:2222");
  CHECK(c.task_address("worker", 2) == "127.0.0.1:2225");
  CHECK(c.job_tasks("ps") == std::vector<std::string>{"127.0.0.1:2221", "127.0.0.1:2222"});
  CHECK(c.has_job("ps"));
  CHECK_FALSE(c.has_job("chief"));
  CHECK(c.has_task("worker", 2));
  CHECK_FALSE(c.has_task("worker", 3));
  CHECK(c.to_string() == R"({"ps": ["127.0.0.1:2221", "127.0.0.1:2222"], )"
                         R"("worker": ["127.0.0.1:2223", "127.0.0.1:2224", "127.0.0.1:2225"]})");
  std::ostringstream os;
  os << c;
  CHECK(os.str() == c.to_string());
  const auto dict = c.as_dict();
  REQUIRE(dict.size() == 2);
  CHECK(std::get<std::vector<std::string>>(dict.at("worker")).size() == 3);
  CHECK(c.task_device("worker", 1).to_string() == "/job:worker/replica:0/task:1");
}

TEST_CASE("jobs are sorted whatever the order given; equality") {
  const cluster_spec a{{"worker", {"w:1"}}, {"chief", {"c:1"}}, {"ps", {"p:1"}}};
  CHECK(a.jobs() == std::vector<std::string>{"chief", "ps", "worker"});
  const cluster_spec b{{"ps", {"p:1"}}, {"worker", {"w:1"}}, {"chief", {"c:1"}}};
  CHECK(a == b);
  CHECK_FALSE(a == cluster_spec{{"ps", {"p:1"}}});
  CHECK(cluster_spec(std::map<std::string, std::vector<std::string>>{{"ps", {"p:1"}}}) ==
        cluster_spec{{"ps", {"p:1"}}});
  CHECK(cluster_spec{}.empty());
  CHECK(cluster_spec{}.jobs().empty());
}

TEST_CASE("sparse jobs: {task index: address}") {
  const cluster_spec c{{"worker", {{1, "b:2222"}, {3, "d:2222"}}}, {"ps", {"p:1"}}};
  CHECK(c.num_tasks("worker") == 2);
  CHECK(c.task_indices("worker") == std::vector<int>{1, 3});
  CHECK(c.job_tasks("worker") == std::vector<std::string>{"", "b:2222", "", "d:2222"});
  CHECK(c.task_address("worker", 3) == "d:2222");
  const auto dict = c.as_dict();
  CHECK(std::get<std::map<int, std::string>>(dict.at("worker")) ==
        std::map<int, std::string>{{1, "b:2222"}, {3, "d:2222"}});
  CHECK(std::holds_alternative<std::vector<std::string>>(dict.at("ps")));
  CHECK(c.to_string() == R"({"ps": ["p:1"], "worker": {"1": "b:2222", "3": "d:2222"}})");
  // Indices 0..n-1 given sparsely are dense.
  CHECK(cluster_spec{{"w", {{1, "b:1"}, {0, "a:1"}}}} == cluster_spec{{"w", {"a:1", "b:1"}}});
  CHECK(cluster_spec{{"w", {{1, "b:1"}, {0, "a:1"}}}}.to_string() == R"({"w": ["a:1", "b:1"]})");
  const auto devs = c.devices();
  REQUIRE(devs.size() == 3);
  CHECK(devs[2].to_string() == "/job:worker/replica:0/task:3/device:CPU:0");
}

TEST_CASE("unknown jobs and tasks are not_found errors naming what exists") {
  const cluster_spec c = seed_cluster();
  const std::string job = error_of<loom::not_found_error>([&] { (void)c.num_tasks("chief"); });
  CHECK(job == "cluster_spec: no job 'chief'; the jobs are ps, worker");
  CHECK(error_of<loom::not_found_error>([&] { (void)c.task_address("worker", 3); }) ==
        "cluster_spec: no task 3 in job 'worker'; its tasks are 0, 1, 2");
  CHECK(contains(error_of<loom::not_found_error>([&] { (void)c.job_tasks("evaluator"); }),
                 "no job 'evaluator'"));
  CHECK(contains(error_of<loom::not_found_error>([&] { (void)c.task_indices("x"); }), "'x'"));
  CHECK(contains(error_of<loom::not_found_error>([&] { (void)c.task_device("ps", 2); }),
                 "no task 2 in job 'ps'"));
  CHECK(contains(error_of<loom::not_found_error>([] { (void)cluster_spec{}.num_tasks("ps"); }),
                 "none (the cluster is empty)"));
}

TEST_CASE("malformed addresses are rejected with the job, task and string named") {
  struct bad_case {
    const char* address;
    const char* why;
  };
  const bad_case cases[] = {
      {"", "it is empty"},
      {"localhost", "it has no port"},
      {"localhost:", "the port is empty"},
      {":2222", "the host is empty"},
      {"host:abc", "the port \"abc\" is not a number in 0..65535"},
      {"host:65536", "the port \"65536\" is not a number in 0..65535"},
      {"host:123456", "is not a number in 0..65535"},
      {"host:-1", "the port \"-1\" is not a number"},
      {"::1:2222", "an IPv6 host must be written in brackets, as in [::1]:2222"},
      {"[::1]", "it has no port; expected [host]:port"},
      {"[::1:2222", "the '[' of an IPv6 host is not closed"},
      {"[]:1", "the host is empty"},
      {"[zz::1]:1", "is not an IPv6 address"},
      {"grpc://host:2222", "drop the scheme \"grpc://\""},
      {"my host:1", "contains the character code 32"},
      {"a/b:1", "contains the character \"/\""},
  };
  for (const auto& c : cases) {
    const char* address = c.address;
    const char* why = c.why;
    CAPTURE(c.address);
    const std::string e = error_of<loom::invalid_argument_error>([&] {
      cluster_spec{{"worker", {"ok:1", address}}};
    });
    CHECK(contains(e, std::string("cluster_spec: job 'worker' task 1: address \"") + address +
                          "\" is not host:port: "));
    CHECK(contains(e, why));
    CHECK(contains(
        error_of<loom::invalid_argument_error>([&] { (void)loom::parse_host_port(address); }),
        why));
  }
  for (const char* good : {"localhost:0", "127.0.0.1:65535", "[::1]:2222", "[fe80::1%2]:1",
                           "my-host.example.com:2222", "worker_0:2222"}) {
    CAPTURE(good);
    CHECK_NOTHROW(cluster_spec{{"worker", {good}}});
  }
  CHECK(loom::parse_host_port("[::1]:2222") == loom::host_port{"::1", 2222});
  CHECK(loom::parse_host_port("ps0.example.com:0") == loom::host_port{"ps0.example.com", 0});
}

TEST_CASE("bad job names, repeated jobs and tasks, negative indices") {
  for (const char* name : {"", "1ps", "p s", "job/x", "job:x", "-ps"}) {
    CAPTURE(name);
    CHECK(contains(error_of<loom::invalid_argument_error>([&] {
                     cluster_spec{{name, {"a:1"}}};
                   }),
                   "is not valid"));
  }
  CHECK(error_of<loom::invalid_argument_error>([] {
          cluster_spec{{"ps", {"a:1"}}, {"ps", {"b:1"}}};
        }) == "cluster_spec: job 'ps' is given twice");
  CHECK(contains(error_of<loom::invalid_argument_error>([] {
                   cluster_spec{{"ps", {{1, "a:1"}, {1, "b:1"}}}};
                 }),
                 "task 1 is given twice"));
  CHECK(contains(error_of<loom::invalid_argument_error>([] {
                   cluster_spec{{"ps", {{-1, "a:1"}}}};
                 }),
                 "job 'ps' task -1: a task index must be >= 0"));
}

TEST_CASE("tasks sharing an address are refused at once, naming both") {
  // Pasted host lists: the same entry twice in one flag, or a ps and a worker on one port.
  CHECK(error_of<loom::invalid_argument_error>([] {
          cluster_spec::from_flags("h:2222,h:2222", "w:1");
        }) == "cluster_spec: job 'ps' task 0 and job 'ps' task 1 share the address \"h:2222\"; "
              "every task needs an address of its own (a pasted host list?)");
  CHECK(contains(error_of<loom::invalid_argument_error>(
                     [] { cluster_spec::from_flags("h:2222", "w:1,H:2222"); }),
                 "job 'ps' task 0 and job 'worker' task 1 share the address \"H:2222\""));
  CHECK(contains(error_of<loom::invalid_argument_error>([] {
                   cluster_spec{{"ps", {{3, "[::1]:5"}, {7, "[::1]:5"}}}};
                 }),
                 "job 'ps' task 3 and job 'ps' task 7"));
  // One host, other ports; or port 0, where each server's port is the OS's choice.
  CHECK(cluster_spec::from_flags("h:2222,h:2223", "h:2224").num_tasks("ps") == 2);
  CHECK(cluster_spec{{"localhost", {"127.0.0.1:0", "127.0.0.1:0"}}}.num_tasks("localhost") == 2);
}

TEST_CASE("from_flags: the seeds' --ps_hosts / --worker_hosts") {
  // Seed 002's defaults.
  const auto c =
      cluster_spec::from_flags("192.168.233.201:2222", "192.168.233.202:2223,192.168.233.203:2224");
  CHECK(c == cluster_spec{{"ps", {"192.168.233.201:2222"}},
                          {"worker", {"192.168.233.202:2223", "192.168.233.203:2224"}}});
  CHECK(cluster_spec::from_flags(" a:1 , b:2 ", "c:3") ==
        cluster_spec{{"ps", {"a:1", "b:2"}}, {"worker", {"c:3"}}});
  CHECK(cluster_spec::from_flags("", "c:3").jobs() == std::vector<std::string>{"worker"});
  CHECK(
      error_of<loom::invalid_argument_error>([] { cluster_spec::from_flags("a:1,,b:2", "c:3"); }) ==
      "--ps_hosts=a:1,,b:2: entry 1 is empty; expected comma-separated host:port addresses");
  CHECK(contains(
      error_of<loom::invalid_argument_error>([] { cluster_spec::from_flags("a:1", "c:3,"); }),
      "--worker_hosts=c:3,: entry 1 is empty"));
  CHECK(error_of<loom::invalid_argument_error>([] { cluster_spec::from_flags("a:1", "c:3,d"); }) ==
        "--worker_hosts: entry 1 \"d\" is not host:port: it has no port; expected host:port");
}

TEST_CASE("the cluster's devices for the placer") {
  const auto c = seed_cluster();
  std::vector<std::string> names;
  for (const auto& d : c.devices())
    names.push_back(d.to_string());
  CHECK(names == std::vector<std::string>{"/job:ps/replica:0/task:0/device:CPU:0",
                                          "/job:ps/replica:0/task:1/device:CPU:0",
                                          "/job:worker/replica:0/task:0/device:CPU:0",
                                          "/job:worker/replica:0/task:1/device:CPU:0",
                                          "/job:worker/replica:0/task:2/device:CPU:0"});
  const auto gpus = cluster_spec{{"worker", {"w:1"}}}.devices(2);
  REQUIRE(gpus.size() == 3);
  CHECK(gpus[1].to_string() == "/job:worker/replica:0/task:0/device:GPU:0");
  CHECK(gpus[2].to_string() == "/job:worker/replica:0/task:0/device:GPU:1");
  CHECK(contains(error_of([&] { (void)c.devices(-1); }), "gpus_per_task must be >= 0"));
}

TEST_CASE("make_replica_device_setter counts the ps job's tasks (seed 002)") {
  const auto cluster = cluster_spec::from_flags("p0:2222,p1:2222,p2:2222", "w0:2222,w1:2222");
  const int task_index = 1;
  loom::graph g;
  std::vector<loom::node_id> vars;
  loom::node_id op;
  {
    // worker_device = "/job:worker/task:%d/gpu:0" % FLAGS.task_index
    auto scope = g.device(loom::make_replica_device_setter(
        cluster, {.ps_device = "/job:ps/cpu:0",
                  .worker_device = "/job:worker/task:" + std::to_string(task_index) + "/gpu:0"}));
    for (const char* name : {"global_step", "hid_w", "hid_b", "sm_w"})
      vars.push_back(
          loom::variable<float, 1>(g, name, loom::shape{4}, loom::zeros_initializer{}).id());
    op = loom::lower(loom::output<float, 1>(g, vars[1]) * 2.f).id();
  }
  CHECK(g.node(vars[0]).requested_device == "/job:ps/task:0/device:CPU:0");
  CHECK(g.node(vars[1]).requested_device == "/job:ps/task:1/device:CPU:0");
  CHECK(g.node(vars[2]).requested_device == "/job:ps/task:2/device:CPU:0");
  CHECK(g.node(vars[3]).requested_device == "/job:ps/task:0/device:CPU:0");
  CHECK(g.node(op).requested_device == "/job:worker/task:1/device:GPU:0");

  // Placed with seed 002's session config on a cluster with one GPU per worker.
  std::ostringstream log;
  loom::place(g, cluster.devices(1),
              {.allow_soft_placement = true,
               .device_filters = {"/job:ps", "/job:worker/task:" + std::to_string(task_index)},
               .default_device = cluster.task_device("worker", task_index).to_string()},
              log);
  CHECK(g.node(vars[1]).assigned_device == "/job:ps/replica:0/task:1/device:CPU:0");
  CHECK(g.node(op).assigned_device == "/job:worker/replica:0/task:1/device:GPU:0");

  CHECK(contains(error_of<loom::invalid_argument_error>([&] {
                   loom::make_replica_device_setter(cluster, {.ps_device = "/job:params"});
                 }),
                 "has no job 'params' for ps_device \"/job:params\""));
  CHECK(contains(error_of<loom::invalid_argument_error>(
                     [&] { loom::make_replica_device_setter(cluster, {.ps_device = "/cpu:0"}); }),
                 "names no job"));
  auto greedy = loom::make_replica_device_setter<loom::greedy_load_balancing<>>(cluster);
  CHECK(greedy.options().ps_tasks == 3);
  CHECK(greedy.strategy().num_tasks() == 3);
}

TEST_CASE("seed 001 end to end: replica_device_setter, the placer and log_device_placement") {
  const auto cluster = seed_cluster();
  loom::graph g;
  std::optional<loom::variable<float, 0>> v1, v2;
  std::optional<loom::output<float, 0>> s, p1;
  {
    auto scope = g.device(loom::make_replica_device_setter(cluster, {}));
    v1.emplace(g, "v1", loom::constant(g, 1.f));
    v2.emplace(g, "v2", loom::constant(g, 2.f));
    s = loom::named(*v1 + *v2, "s");
    auto task1 = g.device("/task:1");
    p1 = loom::named(2.f * *s, "p1");
  }
  std::ostringstream log;
  // tf.Session("grpc://127.0.0.1:2221", config=config): the session is on ps 0.
  loom::place(g, cluster.devices(),
              {.log_device_placement = true, .default_device = "/job:ps/replica:0/task:0"}, log);
  CHECK(v1->node().assigned_device == "/job:ps/replica:0/task:0/device:CPU:0");
  CHECK(v2->node().assigned_device == "/job:ps/replica:0/task:1/device:CPU:0");
  CHECK(s->node().assigned_device == "/job:worker/replica:0/task:0/device:CPU:0");
  CHECK(p1->node().assigned_device == "/job:worker/replica:0/task:1/device:CPU:0");
  CHECK(contains(log.str(), "\nv1: (variable): /job:ps/replica:0/task:0/device:CPU:0\n"));
  CHECK(contains(log.str(), "\nv2: (variable): /job:ps/replica:0/task:1/device:CPU:0\n"));
  CHECK(contains(log.str(), "\ns: (identity): /job:worker/replica:0/task:0/device:CPU:0\n"));
  CHECK(contains(log.str(), "\np1: (identity): /job:worker/replica:0/task:1/device:CPU:0\n"));
}

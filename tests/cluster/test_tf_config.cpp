// TF_CONFIG: parsing, TF's is_chief rule and every error path.
#include <loom/cluster/tf_config.hpp>
#include <support/messages.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <string_view>

namespace {

std::string error_of(std::string_view json) {
  try {
    (void)loom::parse_tf_config(json);
  } catch (const loom::invalid_argument_error& e) {
    return e.message();
  }
  return "<no invalid_argument_error>";
}

using loom::testing::contains;

constexpr const char* full_cluster =
    R"({"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222"],)"
    R"( "evaluator": ["e0:2222"]})";

std::string with_task(const std::string& cluster, const std::string& task) {
  return R"({"cluster": )" + cluster + R"(, "task": )" + task + "}";
}

// Sets an environment variable for the scope of a test.
struct env_var {
  const char* name;
  env_var(const char* n, const char* value) : name(n) {
    if (value)
      ::setenv(n, value, 1);
    else
      ::unsetenv(n);
  }
  ~env_var() { ::unsetenv(name); }
};

} // namespace

TEST_CASE("TF_CONFIG with chief, workers, ps and evaluator") {
  const auto c =
      loom::parse_tf_config(with_task(full_cluster, R"({"type": "worker", "index": 1})"));
  CHECK(c.cluster.jobs() == std::vector<std::string>{"chief", "evaluator", "ps", "worker"});
  CHECK(c.cluster.task_address("worker", 1) == "w1:2222");
  CHECK(c.task_type == "worker");
  CHECK(c.task_index == 1);
  CHECK_FALSE(c.is_chief);
  CHECK(c.task_device().to_string() == "/job:worker/replica:0/task:1");

  CHECK(
      loom::parse_tf_config(with_task(full_cluster, R"({"type": "chief", "index": 0})")).is_chief);
  // With a chief job, worker 0 is not the chief.
  CHECK_FALSE(
      loom::parse_tf_config(with_task(full_cluster, R"({"type": "worker", "index": 0})")).is_chief);
  CHECK_FALSE(loom::parse_tf_config(with_task(full_cluster, R"({"type": "evaluator", "index": 0})"))
                  .is_chief);
}

TEST_CASE("is_chief without a chief job: worker 0 (or a legacy master 0)") {
  const std::string cluster = R"({"worker": ["w0:1", "w1:1"], "ps": ["p0:1"]})";
  CHECK(loom::parse_tf_config(with_task(cluster, R"({"type": "worker", "index": 0})")).is_chief);
  CHECK_FALSE(
      loom::parse_tf_config(with_task(cluster, R"({"type": "worker", "index": 1})")).is_chief);
  CHECK_FALSE(loom::parse_tf_config(with_task(cluster, R"({"type": "ps", "index": 0})")).is_chief);
  const std::string master = R"({"master": ["m0:1"], "worker": ["w0:1"]})";
  CHECK(loom::parse_tf_config(with_task(master, R"({"type": "master", "index": 0})")).is_chief);
  CHECK_FALSE(
      loom::parse_tf_config(with_task(master, R"({"type": "worker", "index": 0})")).is_chief);
}

TEST_CASE("an evaluator need not be in the cluster (as in TF)") {
  const auto c = loom::parse_tf_config(with_task(R"({"chief": ["c:1"], "worker": ["w:1"]})",
                                                 R"({"type": "evaluator", "index": 0})"));
  CHECK(c.task_type == "evaluator");
  CHECK_FALSE(c.is_chief);
}

TEST_CASE("sparse jobs, rpc_layer, unknown keys and the local case") {
  const auto c = loom::parse_tf_config(
      R"({"cluster": {"worker": {"1": "w1:1", "3": "w3:1"}}, "task": {"type": "worker", "index": 3},)"
      R"( "rpc_layer": "grpc", "environment": "cloud"})");
  CHECK(c.cluster.task_indices("worker") == std::vector<int>{1, 3});
  CHECK(c.task_index == 3);
  CHECK(c.rpc_layer == "grpc");
  CHECK_FALSE(c.is_chief);

  const auto local = loom::parse_tf_config("{}");
  CHECK(local.cluster.empty());
  CHECK(local.task_type.empty());
  CHECK(local.is_chief);
  CHECK(local.task_device().empty());
  CHECK(loom::parse_tf_config(R"({"cluster": {}, "task": null})").cluster.empty());
}

TEST_CASE("cluster JSON round trip") {
  const loom::cluster_spec c{{"ps", {"p:1", "[::1]:2"}}, {"worker", {{2, "w:3"}}}};
  CHECK(loom::cluster_spec_from_json(c.to_string()) == c);
  CHECK(contains(
      [] {
        try {
          (void)loom::cluster_spec_from_json("[1]", "--cluster");
        } catch (const loom::invalid_argument_error& e) {
          return e.message();
        }
        return std::string();
      }(),
      "--cluster: \"cluster\" must be an object of jobs, got an array"));
}

TEST_CASE("TF_CONFIG errors name TF_CONFIG and what is wrong") {
  const std::string ok_cluster = R"({"worker": ["w0:1", "w1:1"]})";
  struct error_case {
    std::string json;
    const char* message;
  };
  const error_case cases[] = {
      {"{", "TF_CONFIG: is not valid JSON: Missing a name for object member. (at offset 1)"},
      {R"({"cluster": {"ps": ["a:1"]},})", "is not valid JSON"},
      {R"({"cluster": {"ps": ["a:1"] "task": 1})", "(at offset 27)"},
      {"", "TF_CONFIG: is not valid JSON: The document is empty. (at offset 0)"},
      {"[]", "TF_CONFIG: must be a JSON object, got an array"},
      {"3", "TF_CONFIG: must be a JSON object, got the integer 3"},
      {R"({"cluster": [1]})", "TF_CONFIG: \"cluster\" must be an object of jobs, got an array"},
      {R"({"cluster": {"ps": "a:1"}})", "job \"ps\" must be a list of \"host:port\" strings or an "
                                        "object {\"index\": \"host:port\"}, "
                                        "got the string \"a:1\""},
      {R"({"cluster": {"ps": [1]}})", "job \"ps\" task 0 must be a \"host:port\" string, got the "
                                      "integer 1"},
      {R"({"cluster": {"ps": {"x": "a:1"}}})", "job \"ps\": task key \"x\" is not a task index"},
      {R"({"cluster": {"ps": {"1": 2}}})", "job \"ps\" task 1 must be a \"host:port\" string"},
      {R"({"cluster": {"ps": ["a:1", "b"]}})",
       "TF_CONFIG: cluster_spec: job 'ps' task 1: address \"b\" is not host:port: it has no port"},
      {R"({"cluster": {"p s": ["a:1"]}})", "job name \"p s\" is not valid"},
      {R"({"cluster": {"ps": ["a:1"], "ps": ["b:1"]}})", "\"cluster\" has the key \"ps\" twice"},
      {R"({"cluster": {"ps": {"0": "a:1", "0": "b:1"}}})", "job \"ps\" has the key \"0\" twice"},
      {R"({"cluster": {"worker": ["w:1"]}})", "\"cluster\" is set but \"task\" is missing"},
      {with_task(ok_cluster, "[0]"), "\"task\" must be an object"},
      {with_task(ok_cluster, R"({"index": 0})"), "\"task\" has no \"type\""},
      {with_task(ok_cluster, R"({"type": 1, "index": 0})"),
       "\"task.type\" must be a string, got the integer 1"},
      {with_task(ok_cluster, R"({"type": "", "index": 0})"), "\"task.type\" is empty"},
      {with_task(ok_cluster, R"({"type": "worker"})"), "\"task\" has no \"index\""},
      {with_task(ok_cluster, R"({"type": "worker", "index": "1"})"),
       "\"task.index\" must be a non-negative integer, got the string \"1\""},
      {with_task(ok_cluster, R"({"type": "worker", "index": -1})"),
       "\"task.index\" must be a non-negative integer, got the integer -1"},
      {with_task(ok_cluster, R"({"type": "worker", "index": 1.5})"),
       "\"task.index\" must be a non-negative integer, got the number 1.5"},
      {with_task(ok_cluster, R"({"type": "worker", "index": 99999999999})"),
       "\"task.index\" the integer 99999999999 is too large"},
      {with_task(ok_cluster, R"({"type": "worker", "index": 18446744073709551615})"),
       "\"task.index\" the integer 18446744073709551615 is too large"},
      {with_task(ok_cluster, R"({"type": "worker", "index": 0, "type": "ps"})"),
       "\"task\" has the key \"type\" twice"},
      {R"({"task": {"type": "worker", "index": 0}})",
       "\"task\" is worker 0, but \"cluster\" is missing or empty"},
      {with_task(ok_cluster, R"({"type": "ps", "index": 0})"),
       "TF_CONFIG: task type \"ps\" is not a job of the cluster {\"worker\": [\"w0:1\", "
       "\"w1:1\"]} (jobs: worker)"},
      {with_task(ok_cluster, R"({"type": "worker", "index": 2})"),
       "TF_CONFIG: task index 2 is not a task of job \"worker\" (its tasks: 0, 1)"},
      {with_task(R"({"chief": ["a:1", "b:1"]})", R"({"type": "chief", "index": 0})"),
       "the cluster must have exactly one \"chief\" task, it has 2"},
      {R"({"cluster": {}, "rpc_layer": 1})", "\"rpc_layer\" must be a string"},
  };
  for (const auto& c : cases) {
    const std::string& json = c.json;
    const char* message = c.message;
    CAPTURE(c.json);
    const std::string e = error_of(json);
    CHECK(contains(e, message));
    CHECK(e.rfind("TF_CONFIG: ", 0) == 0);
  }
}

TEST_CASE("TF_CONFIG giving a ps and a worker one address is refused, naming both") {
  const std::string what = error_of(with_task(R"({"ps": ["h:2222"], "worker": ["h:2222"]})",
                                              R"({"type": "worker", "index": 0})"));
  CHECK(contains(what, "TF_CONFIG"));
  CHECK(contains(what, "job 'ps' task 0 and job 'worker' task 0 share the address \"h:2222\""));
}

TEST_CASE("TF_CONFIG from the environment") {
  {
    env_var unset("TF_CONFIG", nullptr);
    CHECK_FALSE(loom::tf_config_from_env().has_value());
  }
  {
    env_var empty("TF_CONFIG", "  ");
    CHECK_FALSE(loom::tf_config_from_env().has_value());
  }
  {
    env_var set(
        "TF_CONFIG",
        R"({"cluster": {"worker": ["w0:1", "w1:1"]}, "task": {"type": "worker", "index": 1}})");
    const auto c = loom::tf_config_from_env();
    REQUIRE(c.has_value());
    CHECK(c->task_index == 1);
    CHECK_FALSE(c->is_chief);
  }
  {
    env_var bad("LOOM_TEST_TF_CONFIG", R"({"cluster": )");
    try {
      (void)loom::tf_config_from_env("LOOM_TEST_TF_CONFIG");
      FAIL("no error");
    } catch (const loom::invalid_argument_error& e) {
      CHECK(contains(e.message(), "LOOM_TEST_TF_CONFIG: is not valid JSON"));
      CHECK(contains(e.message(), "(at offset 12)"));
    }
  }
}

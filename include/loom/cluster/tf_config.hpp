// TF_CONFIG: the environment variable through which launchers (Kubernetes
// operators, cloud trainers, tf.estimator scripts) tell each process the
// cluster and its own task:
//
//   TF_CONFIG='{"cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"],
//                           "ps": ["p0:2222"]},
//               "task": {"type": "worker", "index": 1}}'
//
// Jobs are lists of "host:port" or (beyond TF) sparse objects {"3": "host:port"}.
// is_chief follows TF: the "chief" task when the cluster has a chief job; else
// task 0 of a legacy "master" job; else worker 0 (TF's Estimator and
// multi-worker strategies). An "evaluator" task need not be in the cluster
// (it is not part of training, as in TF). Every malformed input is an
// invalid_argument_error that names TF_CONFIG and the offending field.
#pragma once

#include <loom/cluster/cluster_spec.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/device_spec.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace loom {

struct tf_config {
  cluster_spec cluster;
  std::string task_type; // "" when TF_CONFIG names no task (a local, single-process run)
  int task_index = 0;
  bool is_chief = true;
  std::string rpc_layer{}; // TF_CONFIG's optional "rpc_layer" ("grpc")

  // "/job:worker/replica:0/task:1", the placer's default device; empty for a local run.
  device_spec task_device() const {
    if (task_type.empty())
      return {};
    return device_spec{}.with_job(task_type).with_replica(0).with_task(task_index);
  }
};

// The "cluster" part alone: {"ps": [...], "worker": [...]} (for a --cluster flag).
LOOM_COMPILED_ONCE cluster_spec cluster_spec_from_json(std::string_view json,
                                                       std::string_view source = "cluster JSON");

// Parses TF_CONFIG's value. `source` names it in errors.
LOOM_COMPILED_ONCE tf_config parse_tf_config(std::string_view json,
                                             std::string_view source = "TF_CONFIG");

// TF_CONFIG from the environment; nullopt when the variable is unset or empty.
LOOM_COMPILED_ONCE std::optional<tf_config> tf_config_from_env(const char* variable = "TF_CONFIG");

} // namespace loom

// The definitions: RapidJSON's templates, compiled once per program where it links
// loom::kernels (core/compiled_once.hpp).
#if LOOM_COMPILED_ONCE_DEFINITIONS

#include <loom/core/error.hpp>

// cereal's JSON archive configures RapidJSON (assertions throw) and includes
// the RapidJSON it is built with: bundled under cereal/external/ in upstream
// cereal, the system's in distributions that unbundle it.
#include <cereal/archives/json.hpp>
#if __has_include(<cereal/external/rapidjson/error/en.h>)
#include <cereal/external/rapidjson/error/en.h>
#else
#include <rapidjson/error/en.h>
#endif

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <set>
#include <vector>

namespace loom {

namespace detail::tf_config_impl {

#if defined(CEREAL_RAPIDJSON_NAMESPACE)
namespace rj = ::CEREAL_RAPIDJSON_NAMESPACE;
#else
namespace rj = ::RAPIDJSON_NAMESPACE;
#endif

[[noreturn]] inline void fail(std::string_view source, const std::string& what) {
  throw invalid_argument_error(std::string(source) + ": " + what);
}

inline std::string kind(const rj::Value& v) {
  if (v.IsNull())
    return "null";
  if (v.IsBool())
    return "a boolean";
  if (v.IsInt64() || v.IsUint64())
    return "the integer " +
           (v.IsInt64() ? std::to_string(v.GetInt64()) : std::to_string(v.GetUint64()));
  if (v.IsNumber())
    return "the number " + std::to_string(v.GetDouble());
  if (v.IsString())
    return "the string \"" + std::string(v.GetString(), v.GetStringLength()) + "\"";
  if (v.IsArray())
    return "an array";
  return "an object";
}

inline std::string str(const rj::Value& v) {
  return std::string(v.GetString(), v.GetStringLength());
}

inline rj::Document parse(std::string_view source, std::string_view json) {
  rj::Document doc;
  doc.Parse(json.data(), json.size());
  if (doc.HasParseError())
    fail(source, std::string("is not valid JSON: ") + rj::GetParseError_En(doc.GetParseError()) +
                     " (at offset " + std::to_string(doc.GetErrorOffset()) + ")");
  return doc;
}

inline void check_unique_keys(std::string_view source, const rj::Value& object,
                              const std::string& where) {
  std::set<std::string> seen;
  for (auto m = object.MemberBegin(); m != object.MemberEnd(); ++m)
    if (!seen.insert(str(m->name)).second)
      fail(source, where + " has the key \"" + str(m->name) + "\" twice");
}

inline cluster_spec parse_cluster(std::string_view source, const rj::Value& v) {
  if (!v.IsObject())
    fail(source, "\"cluster\" must be an object of jobs, got " + kind(v));
  check_unique_keys(source, v, "\"cluster\"");
  cluster_spec c;
  for (auto m = v.MemberBegin(); m != v.MemberEnd(); ++m) {
    const std::string job = str(m->name);
    const rj::Value& tasks = m->value;
    const std::string where = "job \"" + job + "\"";
    std::map<int, std::string> sparse;
    std::vector<std::string> dense;
    if (tasks.IsArray()) {
      for (rj::SizeType i = 0; i < tasks.Size(); ++i) {
        if (!tasks[i].IsString())
          fail(source, where + " task " + std::to_string(i) +
                           " must be a \"host:port\" string, got " + kind(tasks[i]));
        dense.push_back(str(tasks[i]));
      }
    } else if (tasks.IsObject()) {
      check_unique_keys(source, tasks, where);
      for (auto t = tasks.MemberBegin(); t != tasks.MemberEnd(); ++t) {
        const std::string key = str(t->name);
        int index = 0;
        bool ok = !key.empty() && key.size() <= 9;
        for (char ch : key) {
          ok = ok && ch >= '0' && ch <= '9';
          if (ok)
            index = index * 10 + (ch - '0');
        }
        if (!ok)
          fail(source, where + ": task key \"" + key + "\" is not a task index (digits)");
        if (!t->value.IsString())
          fail(source,
               where + " task " + key + " must be a \"host:port\" string, got " + kind(t->value));
        sparse.emplace(index, str(t->value));
      }
    } else {
      fail(source, where +
                       " must be a list of \"host:port\" strings or an object "
                       "{\"index\": \"host:port\"}, got " +
                       kind(tasks));
    }
    try {
      if (tasks.IsArray())
        c.add_job(job, dense);
      else
        c.add_job(job, sparse);
    } catch (const error& e) {
      fail(source, e.message());
    }
  }
  return c;
}

} // namespace detail::tf_config_impl

LOOM_COMPILED_ONCE cluster_spec cluster_spec_from_json(std::string_view json,
                                                       std::string_view source) {
  namespace impl = detail::tf_config_impl;
  const auto doc = impl::parse(source, json);
  return impl::parse_cluster(source, doc);
}

LOOM_COMPILED_ONCE tf_config parse_tf_config(std::string_view json, std::string_view source) {
  namespace impl = detail::tf_config_impl;
  const auto doc = impl::parse(source, json);
  if (!doc.IsObject())
    impl::fail(source, "must be a JSON object, got " + impl::kind(doc));
  impl::check_unique_keys(source, doc, "the top level");

  tf_config out;
  if (auto c = doc.FindMember("cluster"); c != doc.MemberEnd() && !c->value.IsNull())
    out.cluster = impl::parse_cluster(source, c->value);
  if (auto r = doc.FindMember("rpc_layer"); r != doc.MemberEnd() && !r->value.IsNull()) {
    if (!r->value.IsString())
      impl::fail(source, "\"rpc_layer\" must be a string, got " + impl::kind(r->value));
    out.rpc_layer = impl::str(r->value);
  }

  const auto t = doc.FindMember("task");
  const bool has_task = t != doc.MemberEnd() && !t->value.IsNull();
  if (!has_task) {
    if (!out.cluster.empty())
      impl::fail(source, "\"cluster\" is set but \"task\" is missing; expected \"task\": "
                         "{\"type\": \"worker\", \"index\": 0}");
    return out; // local: the only process is the chief
  }
  const impl::rj::Value& task = t->value;
  if (!task.IsObject())
    impl::fail(source, "\"task\" must be an object {\"type\": ..., \"index\": ...}, got " +
                           impl::kind(task));
  impl::check_unique_keys(source, task, "\"task\"");

  const auto type = task.FindMember("type");
  if (type == task.MemberEnd() || type->value.IsNull())
    impl::fail(source, "\"task\" has no \"type\" (the job name, such as \"worker\")");
  if (!type->value.IsString())
    impl::fail(source, "\"task.type\" must be a string, got " + impl::kind(type->value));
  out.task_type = impl::str(type->value);
  if (out.task_type.empty())
    impl::fail(source, "\"task.type\" is empty");

  const auto index = task.FindMember("index");
  if (index == task.MemberEnd() || index->value.IsNull())
    impl::fail(source, "\"task\" has no \"index\"");
  const impl::rj::Value& iv = index->value;
  if (!iv.IsInt64() && !iv.IsUint64())
    impl::fail(source, "\"task.index\" must be a non-negative integer, got " + impl::kind(iv));
  if (iv.IsInt64() && iv.GetInt64() < 0)
    impl::fail(source, "\"task.index\" must be a non-negative integer, got " + impl::kind(iv));
  if (!iv.IsInt64() || iv.GetInt64() > INT_MAX)
    impl::fail(source, "\"task.index\" " + impl::kind(iv) + " is too large");
  out.task_index = static_cast<int>(iv.GetInt64());

  if (out.cluster.empty())
    impl::fail(source, "\"task\" is " + out.task_type + " " + std::to_string(out.task_index) +
                           ", but \"cluster\" is missing or empty");
  const bool evaluator = out.task_type == "evaluator" && !out.cluster.has_job("evaluator");
  if (!evaluator) {
    if (!out.cluster.has_job(out.task_type)) {
      std::string jobs;
      for (const auto& j : out.cluster.jobs())
        jobs += (jobs.empty() ? "" : ", ") + j;
      impl::fail(source, "task type \"" + out.task_type + "\" is not a job of the cluster " +
                             out.cluster.to_string() + " (jobs: " + jobs + ")");
    }
    if (!out.cluster.has_task(out.task_type, out.task_index)) {
      std::string tasks;
      for (int i : out.cluster.task_indices(out.task_type))
        tasks += (tasks.empty() ? "" : ", ") + std::to_string(i);
      impl::fail(source, "task index " + std::to_string(out.task_index) +
                             " is not a task of job \"" + out.task_type +
                             "\" (its tasks: " + tasks + ")");
    }
  }
  if (out.cluster.has_job("chief") && out.cluster.num_tasks("chief") != 1)
    impl::fail(source, "the cluster must have exactly one \"chief\" task, it has " +
                           std::to_string(out.cluster.num_tasks("chief")));

  if (out.cluster.has_job("chief"))
    out.is_chief = out.task_type == "chief";
  else if (out.cluster.has_job("master"))
    out.is_chief = out.task_type == "master" && out.task_index == 0;
  else
    out.is_chief = out.task_type == "worker" && out.task_index == 0;
  return out;
}

LOOM_COMPILED_ONCE std::optional<tf_config> tf_config_from_env(const char* variable) {
  const char* value = std::getenv(variable);
  if (!value)
    return std::nullopt;
  std::string_view v(value);
  if (v.find_first_not_of(" \t\r\n") == std::string_view::npos)
    return std::nullopt;
  return parse_tf_config(v, variable);
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

#include <loom/core/device_spec.hpp>

#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <vector>

using loom::device_spec;

namespace {

device_spec parse(std::string_view s) {
  return device_spec::from_string(s);
}

std::string canonical(std::string_view s) {
  return parse(s).to_string();
}

// The message (without the "invalid argument: " prefix) of the error that
// parsing `s` throws, or a marker that makes the comparison fail if none.
std::string parse_error(std::string_view s) {
  try {
    (void)device_spec::from_string(s);
  } catch (const loom::invalid_argument_error& e) {
    CHECK(e.code() == loom::error_code::invalid_argument);
    CHECK(std::string(e.what()) == "invalid argument: " + e.message());
    return e.message();
  }
  return "<no error thrown for \"" + std::string(s) + "\">";
}

} // namespace

TEST_CASE("device_spec: a default spec has every field unset") {
  const device_spec d;
  CHECK(d.empty());
  CHECK_FALSE(d.job().has_value());
  CHECK_FALSE(d.replica().has_value());
  CHECK_FALSE(d.task().has_value());
  CHECK_FALSE(d.device_type().has_value());
  CHECK_FALSE(d.device_index().has_value());
  CHECK(d.to_string().empty());
  CHECK_FALSE(d.is_cpu());
  CHECK_FALSE(d.is_gpu());
}

TEST_CASE("device_spec: the empty string and bare slashes parse to an empty spec") {
  CHECK(parse("") == device_spec{});
  CHECK(parse("/") == device_spec{});
  CHECK(parse("///") == device_spec{});
  CHECK(parse("").empty());
}

TEST_CASE("device_spec: a full canonical string parses into every field") {
  const auto d = parse("/job:ps/replica:0/task:1/device:CPU:0");
  CHECK(d.job() == "ps");
  CHECK(d.replica() == 0);
  CHECK(d.task() == 1);
  CHECK(d.device_type() == "CPU");
  CHECK(d.device_index() == 0);
  CHECK_FALSE(d.empty());
  CHECK(d.is_cpu());
  CHECK_FALSE(d.is_gpu());
}

TEST_CASE("device_spec: canonical strings round-trip unchanged") {
  const std::vector<std::string> canonical_forms = {
      "",
      "/job:ps",
      "/replica:3",
      "/task:7",
      "/device:CPU:0",
      "/device:GPU:*",
      "/device:TPU:4",
      "/job:ps/replica:0/task:1/device:CPU:0",
      "/job:worker/task:12/device:GPU:3",
      "/job:worker/replica:1",
      "/replica:0/task:0",
      "/job:my-job_2/device:MyFunnyDevice:2",
      "/task:2147483647/device:GPU:2147483647",
  };
  for (const auto& s : canonical_forms) {
    CAPTURE(s);
    const auto d = parse(s);
    CHECK(d.to_string() == s);
    CHECK(parse(d.to_string()) == d);
  }
}

TEST_CASE("device_spec: parts may come in any order and print in canonical order") {
  CHECK(canonical("/task:1/device:GPU:2/job:worker/replica:3") ==
        "/job:worker/replica:3/task:1/device:GPU:2");
  CHECK(canonical("/device:CPU:0/job:ps") == "/job:ps/device:CPU:0");
  CHECK(canonical("/cpu:1/task:4") == "/task:4/device:CPU:1");
  CHECK(parse("/task:1/job:ps") == parse("/job:ps/task:1"));
}

TEST_CASE("device_spec: the leading slash is optional and empty parts are skipped") {
  CHECK(canonical("job:ps/task:0") == "/job:ps/task:0");
  CHECK(canonical("cpu:0") == "/device:CPU:0");
  CHECK(canonical("device:GPU:1") == "/device:GPU:1");
  CHECK(canonical("//job:ps//task:0/") == "/job:ps/task:0");
  CHECK(parse("job:ps") == parse("/job:ps"));
}

TEST_CASE("device_spec: legacy /cpu:N and /gpu:N forms") {
  SUBCASE("lower case") {
    const auto c = parse("/cpu:0");
    CHECK(c.device_type() == "CPU");
    CHECK(c.device_index() == 0);
    CHECK(c.to_string() == "/device:CPU:0");
    CHECK(c.is_cpu());

    const auto g = parse("/gpu:1");
    CHECK(g.device_type() == "GPU");
    CHECK(g.device_index() == 1);
    CHECK(g.to_string() == "/device:GPU:1");
    CHECK(g.is_gpu());
  }
  SUBCASE("any case of the key is upper-cased, as TF does") {
    CHECK(parse("/CPU:0") == parse("/cpu:0"));
    CHECK(parse("/GPU:2").to_string() == "/device:GPU:2");
    CHECK(parse("/Gpu:3").device_type() == "GPU");
    CHECK(parse("/cPu:0").is_cpu());
  }
  SUBCASE("without an index, or with *, the index is unset") {
    const auto c = parse("/cpu");
    CHECK(c.device_type() == "CPU");
    CHECK_FALSE(c.device_index().has_value());
    CHECK(c.to_string() == "/device:CPU:*");

    const auto g = parse("/gpu:*");
    CHECK(g.device_type() == "GPU");
    CHECK_FALSE(g.device_index().has_value());
    CHECK(g.to_string() == "/device:GPU:*");
  }
  SUBCASE("legacy and canonical forms of one device are equal") {
    CHECK(parse("/job:worker/task:1/cpu:0") == parse("/job:worker/task:1/device:CPU:0"));
    CHECK(parse("/gpu") == parse("/device:GPU:*"));
  }
}

TEST_CASE("device_spec: wildcard device index means any index") {
  const auto d = parse("/device:GPU:*");
  CHECK(d.device_type() == "GPU");
  CHECK_FALSE(d.device_index().has_value());
  CHECK(d.to_string() == "/device:GPU:*");
  CHECK(d == device_spec{}.with_device_type("GPU"));
  CHECK(parse("/job:ps/device:CPU:*").to_string() == "/job:ps/device:CPU:*");
}

TEST_CASE("device_spec: device types normalize cpu/gpu and keep other names as given") {
  CHECK(parse("/device:cpu:0").device_type() == "CPU");
  CHECK(parse("/device:gpu:*").device_type() == "GPU");
  CHECK(parse("/device:cpu:0").to_string() == "/device:CPU:0");
  CHECK(parse("/device:CPU:0") == parse("/device:cpu:0"));
  CHECK(parse("/device:TPU:0").device_type() == "TPU");
  CHECK(parse("/device:MyFunnyDevice:1").device_type() == "MyFunnyDevice");
  // Only the exact lower-case spellings are TF's backwards-compatible aliases.
  CHECK(parse("/device:Cpu:0").device_type() == "Cpu");
  CHECK_FALSE(parse("/device:Cpu:0").is_cpu());
  CHECK_FALSE(parse("/device:TPU:0").is_cpu());
  CHECK_FALSE(parse("/device:TPU:0").is_gpu());
}

TEST_CASE("device_spec: indices are plain decimal numbers") {
  CHECK(parse("/task:007").task() == 7); // Python's int() accepts leading zeros too
  CHECK(canonical("/replica:00/task:010") == "/replica:0/task:10");
  CHECK(parse("/task:2147483647").task() == 2147483647);
}

TEST_CASE("device_spec: a repeated field that agrees is accepted") {
  CHECK(canonical("/job:ps/job:ps") == "/job:ps");
  CHECK(canonical("/task:1/task:01") == "/task:1");
  CHECK(canonical("/cpu:0/device:CPU:0") == "/device:CPU:0");
  CHECK(canonical("/gpu/device:GPU:*") == "/device:GPU:*");
}

TEST_CASE("device_spec: setters build a spec and chain") {
  SUBCASE("on a temporary") {
    const device_spec d = device_spec{}
                              .with_job("ps")
                              .with_replica(0)
                              .with_task(1)
                              .with_device_type("CPU")
                              .with_device_index(0);
    CHECK(d.to_string() == "/job:ps/replica:0/task:1/device:CPU:0");
    CHECK(d == parse("/job:ps/replica:0/task:1/device:CPU:0"));
  }
  SUBCASE("on an lvalue, returning the same object") {
    device_spec d;
    device_spec& r = d.with_job("worker").with_task(3);
    CHECK(&r == &d);
    CHECK(d.to_string() == "/job:worker/task:3");
  }
  SUBCASE("accepting std::string and std::string_view") {
    const std::string job = "ps";
    const std::string_view type = "GPU";
    const auto d = device_spec{}.with_job(job).with_device_type(type);
    CHECK(d.to_string() == "/job:ps/device:GPU:*");
  }
  SUBCASE("normalizing cpu and gpu") {
    CHECK(device_spec{}.with_device_type("cpu").device_type() == "CPU");
    CHECK(device_spec{}.with_device_type("gpu").device_type() == "GPU");
    CHECK(device_spec{}.with_device_type("TPU").device_type() == "TPU");
  }
  SUBCASE("std::nullopt unsets a field") {
    auto d = parse("/job:ps/replica:0/task:1/device:CPU:0");
    d.with_job(std::nullopt).with_device_index(std::nullopt);
    CHECK(d.to_string() == "/replica:0/task:1/device:CPU:*");
    d.with_replica(std::nullopt).with_task(std::nullopt).with_device_type(std::nullopt);
    CHECK(d.empty());
  }
  SUBCASE("copying fields from another spec") {
    const auto src = parse("/job:ps/task:2");
    const auto d =
        device_spec{}.with_job(src.job()).with_task(src.task()).with_replica(src.replica());
    CHECK(d == src);
  }
}

TEST_CASE("device_spec: setters reject values that could not round-trip") {
  using loom::invalid_argument_error;
  device_spec d;
  CHECK_THROWS_WITH_AS(d.with_task(-1), doctest::Contains("task index -1 is negative"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS(d.with_replica(-2), doctest::Contains("replica index -2 is negative"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS(d.with_device_index(-3), doctest::Contains("device index -3 is negative"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS(d.with_job(""), doctest::Contains("job name is empty"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS(d.with_job("a/b"), doctest::Contains("job name \"a/b\" must not contain"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS(d.with_job("ps:1"), doctest::Contains("job name \"ps:1\""),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS(d.with_device_type("GPU:0"),
                       doctest::Contains("device type \"GPU:0\" must not contain"),
                       invalid_argument_error);
  CHECK_THROWS_WITH_AS(d.with_device_type(""), doctest::Contains("device type is empty"),
                       invalid_argument_error);
  // A rejected value leaves the spec as it was.
  CHECK(d.empty());
}

TEST_CASE("device_spec: a device index without a type is kept but not printed, as in TF") {
  const auto d = device_spec{}.with_device_index(2);
  CHECK_FALSE(d.empty());
  CHECK(d.device_index() == 2);
  CHECK(d.to_string().empty());
  CHECK(d != device_spec{});
  // It matters once merged under a type.
  CHECK(device_spec::merged(parse("/device:GPU:*"), d).to_string() == "/device:GPU:2");
}

TEST_CASE("device_spec: equality compares every field") {
  CHECK(parse("/job:ps/task:0") == parse("/job:ps/task:0"));
  CHECK(parse("/job:ps/task:0") != parse("/job:ps/task:1"));
  CHECK(parse("/job:ps") != parse("/job:worker"));
  CHECK(parse("/replica:0") != parse("/task:0"));
  CHECK(parse("/device:GPU:0") != parse("/device:GPU:*"));
  CHECK(parse("/device:GPU:0") != parse("/device:CPU:0"));
  CHECK(parse("/job:ps") != device_spec{});
}

TEST_CASE("device_spec: merge_from overwrites exactly the fields set in the other spec") {
  SUBCASE("a job over a fuller spec replaces only the job") {
    auto d = parse("/job:worker/task:1/cpu:0");
    d.merge_from(parse("/job:ps"));
    CHECK(d.to_string() == "/job:ps/task:1/device:CPU:0");
    CHECK(d.task() == 1);
    CHECK(d.device_index() == 0);
  }
  SUBCASE("a sequence of merges, as in TF's own tests") {
    auto d = parse("/job:foo/replica:0");
    d.merge_from(parse("/task:1/device:GPU:2"));
    CHECK(d.to_string() == "/job:foo/replica:0/task:1/device:GPU:2");

    device_spec e;
    e.merge_from(parse("/task:1/cpu:0"));
    CHECK(e.to_string() == "/task:1/device:CPU:0");
    e.merge_from(parse("/job:boo/device:GPU:0"));
    CHECK(e.to_string() == "/job:boo/task:1/device:GPU:0");
    e.merge_from(parse("/job:muu/cpu:2"));
    CHECK(e.to_string() == "/job:muu/task:1/device:CPU:2");
    e.merge_from(parse("/job:muu/device:MyFunnyDevice:2"));
    CHECK(e.to_string() == "/job:muu/task:1/device:MyFunnyDevice:2");
  }
  SUBCASE("type and index merge independently") {
    // A type without index keeps the old index; TF does the same.
    CHECK(device_spec::merged(parse("/device:GPU:1"), parse("/cpu")).to_string() ==
          "/device:CPU:1");
    // A wildcard index is unset, so it does not clear a concrete one.
    CHECK(device_spec::merged(parse("/device:GPU:1"), parse("/device:GPU:*")).to_string() ==
          "/device:GPU:1");
    CHECK(device_spec::merged(parse("/device:GPU:*"), parse("/device:GPU:3")).to_string() ==
          "/device:GPU:3");
  }
  SUBCASE("merging an empty spec changes nothing; merging into one copies") {
    const auto full = parse("/job:ps/replica:1/task:2/device:GPU:3");
    auto a = full;
    a.merge_from(device_spec{});
    CHECK(a == full);
    device_spec b;
    b.merge_from(full);
    CHECK(b == full);
  }
  SUBCASE("every field of a full spec wins") {
    auto d = parse("/job:a/replica:1/task:2/device:CPU:3");
    d.merge_from(parse("/job:b/replica:4/task:5/device:GPU:6"));
    CHECK(d.to_string() == "/job:b/replica:4/task:5/device:GPU:6");
  }
  SUBCASE("merge_from returns *this for chaining") {
    device_spec d;
    device_spec& r = d.merge_from(parse("/job:ps")).merge_from(parse("/task:0"));
    CHECK(&r == &d);
    CHECK(d.to_string() == "/job:ps/task:0");
  }
  SUBCASE("merged leaves its arguments alone") {
    const auto outer = parse("/job:worker/task:1");
    const auto inner = parse("/job:ps/gpu:0");
    const auto m = device_spec::merged(outer, inner);
    CHECK(m.to_string() == "/job:ps/task:1/device:GPU:0");
    CHECK(outer.to_string() == "/job:worker/task:1");
    CHECK(inner.to_string() == "/job:ps/device:GPU:0");
  }
}

TEST_CASE("device_spec: nested device scopes merge with the inner scope winning") {
  // Mirrors nested `with tf.device(...)` blocks: each scope merges its spec over
  // the enclosing scope's result.
  const auto train = parse("/job:train");
  const auto inner_ps = device_spec::merged(train, parse("/job:ps/device:GPU:0"));
  CHECK(inner_ps.to_string() == "/job:ps/device:GPU:0");
  const auto inner_gpu = device_spec::merged(train, parse("/device:GPU:1"));
  CHECK(inner_gpu.to_string() == "/job:train/device:GPU:1");

  std::vector<device_spec> scopes = {parse("/job:worker/replica:0"), parse("/task:3"),
                                     parse("/cpu:0"), parse("/device:GPU:*")};
  std::vector<std::string> expected = {"/job:worker/replica:0", "/job:worker/replica:0/task:3",
                                       "/job:worker/replica:0/task:3/device:CPU:0",
                                       "/job:worker/replica:0/task:3/device:GPU:0"};
  device_spec current;
  for (std::size_t i = 0; i < scopes.size(); ++i) {
    CAPTURE(i);
    current = device_spec::merged(current, scopes[i]);
    CHECK(current.to_string() == expected[i]);
  }
}

TEST_CASE("device_spec: matches() applies a device filter") {
  const auto ps0 = parse("/job:ps/replica:0/task:0/device:CPU:0");
  const auto worker1_gpu = parse("/job:worker/replica:0/task:1/device:GPU:0");

  CHECK(ps0.matches(parse("/job:ps")));
  CHECK_FALSE(worker1_gpu.matches(parse("/job:ps")));
  CHECK(worker1_gpu.matches(parse("/job:worker/task:1")));
  CHECK_FALSE(worker1_gpu.matches(parse("/job:worker/task:2")));
  CHECK_FALSE(ps0.matches(parse("/job:worker/task:0")));
  CHECK(worker1_gpu.matches(parse("/replica:0/device:GPU:*")));
  CHECK(worker1_gpu.matches(parse("/gpu:0")));
  CHECK_FALSE(worker1_gpu.matches(parse("/gpu:1")));
  CHECK_FALSE(ps0.matches(parse("/device:GPU:*")));
  CHECK(ps0.matches(ps0));

  // An empty filter matches everything, including an empty spec.
  CHECK(ps0.matches(device_spec{}));
  CHECK(device_spec{}.matches(device_spec{}));
  // A field the filter sets but the spec leaves open does not match.
  CHECK_FALSE(parse("/job:ps").matches(parse("/job:ps/task:0")));
  CHECK_FALSE(device_spec{}.matches(parse("/job:ps")));
  // Matching is not symmetric.
  CHECK(parse("/job:ps/task:0").matches(parse("/job:ps")));
}

TEST_CASE("device_spec: malformed strings are rejected with the offending part named") {
  struct bad {
    std::string_view spec;
    std::string_view message;
  };
  const std::vector<bad> cases = {
      // Unknown or malformed keys.
      {"/foo:1",
       R"(device string "/foo:1": unknown key "foo" in part "foo:1"; expected job, replica, task, device, cpu or gpu)"},
      {"/job:ps/task:0/device:CPU:0/extra",
       R"(device string "/job:ps/task:0/device:CPU:0/extra": unknown key "extra" in part "extra"; expected job, replica, task, device, cpu or gpu)"},
      {"/Job:ps",
       R"(device string "/Job:ps": unknown key "Job" in part "Job:ps"; expected job, replica, task, device, cpu or gpu)"},
      {"/tpu:0",
       R"(device string "/tpu:0": unknown key "tpu" in part "tpu:0"; expected job, replica, task, device, cpu or gpu)"},
      {"/:0", R"(device string "/:0": part ":0" has no key)"},
      {"/job", R"(device string "/job": part "job" has no value; expected "job:VALUE")"},
      {"/task", R"(device string "/task": part "task" has no value; expected "task:VALUE")"},
      {"/device",
       R"(device string "/device": part "device" is incomplete; expected "device:TYPE:INDEX" or "device:TYPE:*")"},
      {"/device:GPU",
       R"(device string "/device:GPU": part "device:GPU" is incomplete; expected "device:TYPE:INDEX" or "device:TYPE:*")"},
      // Non-integer, negative or out-of-range indices.
      {"/job:ps/task:x",
       R"(device string "/job:ps/task:x": task index "x" is not a non-negative integer)"},
      {"/replica:one",
       R"(device string "/replica:one": replica index "one" is not a non-negative integer)"},
      {"/task:-1", R"(device string "/task:-1": task index "-1" is not a non-negative integer)"},
      {"/replica:+1",
       R"(device string "/replica:+1": replica index "+1" is not a non-negative integer)"},
      {"/task:", R"(device string "/task:": task index "" is not a non-negative integer)"},
      {"/task:*", R"(device string "/task:*": task index "*" is not a non-negative integer)"},
      {"/task:1abc",
       R"(device string "/task:1abc": task index "1abc" is not a non-negative integer)"},
      {"/task:0 ", R"(device string "/task:0 ": task index "0 " is not a non-negative integer)"},
      {"/task:99999999999",
       R"(device string "/task:99999999999": task index "99999999999" is out of range)"},
      {"/device:GPU:x",
       R"(device string "/device:GPU:x": device index "x" is not a non-negative integer or "*")"},
      {"/device:GPU:-1",
       R"(device string "/device:GPU:-1": device index "-1" is not a non-negative integer or "*")"},
      {"/cpu:x",
       R"(device string "/cpu:x": device index "x" is not a non-negative integer or "*")"},
      {"/gpu:-1",
       R"(device string "/gpu:-1": device index "-1" is not a non-negative integer or "*")"},
      {"/gpu:", R"(device string "/gpu:": device index "" is not a non-negative integer or "*")"},
      // Empty names.
      {"/job:", R"(device string "/job:": job name is empty in part "job:")"},
      {"/job:/task:0", R"(device string "/job:/task:0": job name is empty in part "job:")"},
      {"/device::0", R"(device string "/device::0": device type is empty in part "device::0")"},
      // Trailing garbage inside a part.
      {"/job:ps:1", R"(device string "/job:ps:1": part "job:ps:1" has unexpected trailing ":1")"},
      {"/task:1:2:3",
       R"(device string "/task:1:2:3": part "task:1:2:3" has unexpected trailing ":2:3")"},
      {"/cpu:0:1", R"(device string "/cpu:0:1": part "cpu:0:1" has unexpected trailing ":1")"},
      {"/device:GPU:0:junk",
       R"(device string "/device:GPU:0:junk": part "device:GPU:0:junk" has unexpected trailing ":junk")"},
      {"/device:GPU:0:",
       R"(device string "/device:GPU:0:": part "device:GPU:0:" has unexpected trailing ":")"},
      // Conflicting repeated fields.
      {"/job:a/job:b", R"(device string "/job:a/job:b": job "b" conflicts with earlier job "a")"},
      {"/replica:0/replica:1",
       R"(device string "/replica:0/replica:1": replica 1 conflicts with earlier replica 0)"},
      {"/task:1/job:ps/task:2",
       R"(device string "/task:1/job:ps/task:2": task 2 conflicts with earlier task 1)"},
      {"/cpu:0/gpu:0",
       R"(device string "/cpu:0/gpu:0": device "GPU:0" conflicts with earlier device "CPU:0")"},
      {"/device:GPU:0/device:GPU:1",
       R"(device string "/device:GPU:0/device:GPU:1": device "GPU:1" conflicts with earlier device "GPU:0")"},
      {"/gpu:*/gpu:0",
       R"(device string "/gpu:*/gpu:0": device "GPU:0" conflicts with earlier device "GPU:*")"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.spec);
    CHECK(parse_error(c.spec) == c.message);
  }
}

TEST_CASE(
    "device_spec: parse errors are loom::invalid_argument_error and catchable as loom::error") {
  CHECK_THROWS_WITH_AS(parse("/job:ps/task:x"),
                       doctest::Contains(R"(task index "x" is not a non-negative integer)"),
                       loom::invalid_argument_error);
  CHECK_THROWS_AS(parse("/foo:1"), loom::error);
  CHECK_THROWS_WITH_AS(parse("/foo:1"),
                       doctest::Contains("invalid argument: device string \"/foo:1\""),
                       std::exception);
}

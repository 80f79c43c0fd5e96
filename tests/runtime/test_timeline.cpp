// A step's timeline (#22 item 3): run_options{.trace_level = trace_level::full}
// traces a step on every task it runs on, and loom::timeline writes it in
// Chrome's trace format. Checked against the run itself, on an in-process
// cluster of 1 ps + 2 workers (three servers on their own loopback ports, the
// tensors between them over TCP): every node of every partition's plan once,
// on its task, inside the step; every transfer's _recv ends after its _send
// did, with one arrow from one to the other. And the clock alignment of
// runtime/trace_alignment.hpp on clocks that differ, which one process cannot
// give a real run.
#include <loom/api.hpp>
#include <loom/runtime/partition.hpp>
#include <loom/runtime/plan.hpp>
#include <loom/runtime/trace_alignment.hpp>

#include <doctest/doctest.h>
#include <rapidjson/document.h>
#include <support/cluster.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using loom::testing::local_cluster;
using loom::testing::quiet;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// y = x w + b with the variables on the ps, the product on worker 1 and the
// loss and gradients on worker 0 (the session's task); the update on the ps.
struct three_task_model {
  loom::graph g;
  loom::placeholder<float, 2> x{g, loom::shape{-1, 3}, "x"};
  loom::placeholder<float, 2> y{g, loom::shape{-1, 2}, "y"};
  std::optional<loom::variable<float, 2>> w;
  std::optional<loom::variable<float, 1>> b;
  std::optional<loom::output<float, 0>> loss;
  std::optional<loom::operation> train;

  three_task_model() {
    g.set_random_seed(3);
    g.on("/job:ps/task:0", [&] {
      w.emplace(g, "w", loom::shape{3, 2}, loom::random_normal_initializer{.stddev = 0.5});
      b.emplace(g, "b", loom::shape{2}, loom::ones_initializer{});
      return 0;
    });
    auto pred = g.on("/job:worker/task:1", [&] { return loom::lower(loom::xw_plus_b(x, *w, *b)); });
    loss = loom::lower(loom::reduce_mean(loom::square(pred - y)));
    train = loom::gradient_descent_optimizer{0.1}.minimize(*loss);
  }
  loom::feed_dict feeds() const {
    return {{x, loom::tensor<float, 2>(loom::shape{4, 3}, {1, 2, 3, 0, 1, 0, -1, 2, 1, 3, 0, 1})},
            {y, loom::tensor<float, 2>(loom::shape{4, 2}, {1, 0, 0, 1, 1, 1, 0.5f, -1})}};
  }
};

// What each task's plan runs for `req` (the partitions the master registers,
// planned as each task plans them): node names by task, fused regions' nodes
// counted as theirs.
std::map<std::string, std::multiset<std::string>>
planned_nodes(const loom::graph& g, loom::detail::run_request req, const local_cluster& cluster) {
  std::sort(req.fed.begin(), req.fed.end());
  std::set<loom::node_id> ref_only;
  std::vector<loom::node_def> nodes = loom::detail::nodes_to_place(g, req, ref_only);
  const loom::placer_options po = loom::detail::session_placement(
      false, false, {}, "/job:worker/replica:0/task:0/device:CPU:0"); // the master's, for worker 0
  std::ostringstream log;
  loom::place(nodes, cluster.spec.devices(), po, log);
  std::map<std::string, std::multiset<std::string>> out;
  for (auto& p : loom::detail::partition_graph(g, req, nodes, ref_only)) {
    const loom::graph part = loom::detail::graph_from_image(std::move(p.image));
    const loom::detail::plan planned(part, {p.fetches, p.targets, p.fed});
    auto& names = out[p.task];
    for (const auto& s : planned.items()) {
      names.insert(part.node(s.id).name);
      for (const auto& f : s.fallback)
        if (f.id != s.id)
          names.insert(part.node(f.id).name);
    }
  }
  return out;
}

// The names a task's stats show as run: each node's, and its fused nodes'.
std::multiset<std::string> traced_nodes(const loom::task_step_stats& t) {
  std::multiset<std::string> names;
  for (const auto& n : t.node_stats) {
    names.insert(n.node_name);
    names.insert(n.fused_nodes.begin(), n.fused_nodes.end());
  }
  return names;
}

double number(const rapidjson::Value& v, const char* key) {
  REQUIRE(v.HasMember(key));
  return v[key].GetDouble();
}

} // namespace

TEST_CASE("a traced step on 1 ps + 2 workers: every planned node once, inside the step, and "
          "each tensor's receive after its send, in the stats and in the Chrome trace") {
  local_cluster cluster(1, 2);
  three_task_model m;
  loom::session s(m.g, cluster.target(), quiet());
  s.run(loom::global_variables_initializer(m.g));
  (void)s.run(*m.loss, m.feeds()); // registered once untraced, so the traced step is a usual one

  loom::run_metadata md;
  const std::int64_t before = now_ns();
  s.run(loom::fetches(*m.loss, *m.train), m.feeds(), {.trace_level = loom::trace_level::full}, &md);
  const std::int64_t after = now_ns();
  const loom::step_stats& st = md.step_stats;

  // The session's clock is the tasks' (one process): the step lies within the
  // client's run, and each task was taken on its own clock.
  CHECK(before <= st.start_ns);
  CHECK(st.start_ns < st.end_ns);
  CHECK(st.end_ns <= after);

  const auto planned =
      planned_nodes(m.g, {{m.loss->id()}, {m.train->id()}, {m.x.id(), m.y.id()}}, cluster);
  REQUIRE(planned.size() == 3);
  REQUIRE(st.tasks.size() == 3);
  std::map<std::string, const loom::node_exec_stats*> sends, recvs;
  for (const auto& t : st.tasks) {
    CAPTURE(t.task);
    CHECK(t.same_clock);
    CHECK(t.clock_offset_ns == 0);
    REQUIRE(planned.count(t.task) == 1);
    CHECK(traced_nodes(t) == planned.at(t.task));
    for (const auto& n : t.node_stats) {
      CAPTURE(n.node_name);
      CHECK(st.start_ns <= n.start_ns);
      CHECK(n.start_ns <= n.end_ns);
      CHECK(n.end_ns <= st.end_ns);
      CHECK(n.thread_id > 0);
      // Named by what ran it: a task's io or runner threads, or the session's own.
      REQUIRE(t.thread_roles.count(n.thread_id) == 1);
      const std::string& role = t.thread_roles.at(n.thread_id);
      CHECK((role == "io" || role == "runner" || role == "client"));
      if (n.is_send())
        CHECK(sends.emplace(n.transfer_key, &n).second);
      if (n.is_recv()) {
        CHECK(recvs.emplace(n.transfer_key, &n).second);
        CHECK(n.requested_ns <= n.arrived_ns);
        CHECK(n.arrived_ns <= n.start_ns);
      }
    }
  }
  // Tensors crossed between every pair that exchanges them: the weights to
  // worker 1, its product to worker 0, the gradients to the ps.
  CHECK(sends.size() >= 5);
  REQUIRE(sends.size() == recvs.size());
  // (Named copies, not structured bindings: clang 14 cannot capture those in CAPTURE's lambda.)
  for (const auto& sent : sends) {
    const std::string& key = sent.first;
    CAPTURE(key);
    REQUIRE(recvs.count(key) == 1);
    CHECK(sent.second->end_ns <= recvs.at(key)->arrived_ns);
  }

  // The Chrome trace says the same.
  const std::string json = loom::timeline(md).chrome_trace_json();
  rapidjson::Document doc;
  doc.Parse(json.c_str());
  REQUIRE_FALSE(doc.HasParseError());
  REQUIRE(doc.HasMember("traceEvents"));
  const double step_us = number(doc["otherData"], "step_duration_us");
  CHECK(step_us == doctest::Approx((st.end_ns - st.start_ns) / 1000.0).epsilon(1e-6));
  std::map<int, std::string> process;                    // pid -> task
  std::map<std::string, std::multiset<std::string>> ran; // task -> node names
  struct slice {
    int pid;
    std::int64_t tid;
    double ts, end;
  };
  std::map<std::string, slice> send_slices, recv_slices;
  std::map<std::int64_t, std::vector<std::pair<std::string, slice>>> arrows; // id -> s, f
  for (const auto& e : doc["traceEvents"].GetArray()) {
    const std::string ph = e["ph"].GetString();
    const int pid = e["pid"].GetInt();
    if (ph == "M" && std::string(e["name"].GetString()) == "process_name")
      process[pid] = e["args"]["name"].GetString();
    if (ph == "M" && std::string(e["name"].GetString()) == "thread_name") {
      const std::string name = e["args"]["name"].GetString();
      CHECK(name.ends_with(" thread " + std::to_string(e["tid"].GetInt64())));
    }
  }
  for (const auto& e : doc["traceEvents"].GetArray()) {
    const std::string ph = e["ph"].GetString();
    const int pid = e["pid"].GetInt();
    if (ph == "X") {
      const std::string task = process.at(pid);
      const auto& args = e["args"];
      const std::string name = args["name"].GetString();
      const std::string op = args["op"].GetString();
      CHECK(std::string(e["name"].GetString()) == op);
      ran[task].insert(name);
      if (args.HasMember("fused_nodes"))
        for (const auto& f : args["fused_nodes"].GetArray())
          ran[task].insert(f.GetString());
      const slice sl{pid, e["tid"].GetInt64(), number(e, "ts"), number(e, "ts") + number(e, "dur")};
      CAPTURE(name);
      CHECK(sl.ts >= 0);
      CHECK(sl.end <= step_us + 0.002); // three decimals each
      if (op == "_send")
        send_slices[args["key"].GetString()] = sl;
      if (op == "_recv")
        recv_slices[args["key"].GetString()] = sl;
    } else if (ph == "s" || ph == "f") {
      CHECK(std::string(e["cat"].GetString()) == "transfer");
      arrows[e["id"].GetInt64()].emplace_back(
          ph, slice{pid, e["tid"].GetInt64(), number(e, "ts"), number(e, "ts")});
      if (ph == "f")
        CHECK(std::string(e["bp"].GetString()) == "e");
    }
  }
  CHECK(process.size() == 3);
  for (const auto& [task, names] : planned)
    CHECK(ran[task] == names);
  REQUIRE(send_slices.size() == sends.size());
  REQUIRE(recv_slices.size() == recvs.size());
  for (const auto& sent : send_slices) {
    const std::string& key = sent.first;
    const slice& send = sent.second;
    CAPTURE(key);
    REQUIRE(recv_slices.count(key) == 1);
    const slice& recv = recv_slices.at(key);
    CHECK(recv.pid != send.pid);
    CHECK(recv.end >= send.end);
  }
  // One arrow per transfer, from inside its _send's slice to inside its _recv's.
  CHECK(arrows.size() == sends.size());
  std::set<std::string> arrowed;
  for (const auto& [id, ends] : arrows) {
    REQUIRE(ends.size() == 2);
    const slice& from = ends[0].second;
    const slice& to = ends[1].second;
    CHECK(ends[0].first == "s");
    CHECK(ends[1].first == "f");
    auto it = std::find_if(send_slices.begin(), send_slices.end(), [&](const auto& kv) {
      return kv.second.pid == from.pid && kv.second.tid == from.tid && kv.second.ts <= from.ts &&
             from.ts <= kv.second.end;
    });
    REQUIRE(it != send_slices.end());
    const slice& recv = recv_slices.at(it->first);
    CHECK(recv.pid == to.pid);
    CHECK(recv.tid == to.tid);
    CHECK(recv.ts <= to.ts);
    CHECK(to.ts <= recv.end);
    arrowed.insert(it->first);
  }
  CHECK(arrowed.size() == sends.size());
}

TEST_CASE("an untraced run leaves no stats, and a trace without a run_metadata is refused") {
  loom::graph g;
  loom::placeholder<float, 1> x{g, loom::shape{2}, "x"};
  auto y = loom::lower(x * 2.0f);
  loom::session s(g);
  loom::run_metadata md;
  md.step_stats.step_id = 7;
  s.run(y, {{x, loom::tensor<float, 1>(loom::shape{2}, {1, 2})}}, {}, &md);
  CHECK(md.step_stats.tasks.empty());
  CHECK(md.step_stats.step_id == 0);
  try {
    s.run(y, {{x, loom::tensor<float, 1>(loom::shape{2}, {1, 2})}},
          {.trace_level = loom::trace_level::full}, nullptr);
    FAIL("a trace without a run_metadata ran");
  } catch (const loom::invalid_argument_error& e) {
    CHECK(std::string(e.what()).find("no run_metadata was given") != std::string::npos);
  }
  // A local session traces its one task.
  s.run(y, {{x, loom::tensor<float, 1>(loom::shape{2}, {1, 2})}},
        {.trace_level = loom::trace_level::full}, &md);
  REQUIRE(md.step_stats.tasks.size() == 1);
  CHECK(md.step_stats.tasks[0].task == "/job:localhost/replica:0/task:0");
  CHECK_FALSE(md.step_stats.tasks[0].node_stats.empty());
}

TEST_CASE("clock alignment: a task on another clock is moved onto the client's, within its round "
          "trip, so that no tensor arrives before it was sent") {
  using loom::detail::timed_task_trace;
  const std::int64_t skew = 3'600'000'000'000; // the remote task's clock: an hour ahead
  auto node = [](std::string name, std::string op, std::int64_t start, std::int64_t end) {
    loom::node_exec_stats n;
    n.node_name = std::move(name);
    n.op = std::move(op);
    n.start_ns = start;
    n.end_ns = end;
    n.thread_id = 1;
    return n;
  };
  // The client's own task (its clock) and a remote one, asked at 1000 and
  // answered at 9000 on the client's clock; the remote one received it at
  // 1000 + out and answered at 9000 - back, on its clock.
  auto step = [&](std::int64_t out, std::int64_t back, std::int64_t arrived_after_send) {
    timed_task_trace local{"/job:worker/replica:0/task:0", {}, 900, 9500};
    local.trace.received_ns = 1000;
    local.trace.answered_ns = 9400;
    timed_task_trace remote{"/job:ps/replica:0/task:0", {}, 1000, 9000};
    remote.trace.received_ns = 1000 + out + skew;
    remote.trace.answered_ns = 9000 - back + skew;
    // The remote task sends at 3000 (true time); it reaches the client's task
    // arrived_after_send later.
    auto send = node("_send/w", "_send", 2900 + skew, 3000 + skew);
    send.transfer_key = "w->/job:worker/replica:0/task:0";
    auto recv = node("_recv/w", "_recv", 3000 + arrived_after_send, 3001 + arrived_after_send);
    recv.transfer_key = send.transfer_key;
    recv.requested_ns = 1100;
    recv.arrived_ns = 3000 + arrived_after_send;
    remote.trace.nodes = {send};
    local.trace.nodes = {recv};
    return loom::detail::align_step_trace(1, 800, 9600, {local, remote});
  };
  SUBCASE("equal latencies each way: the offset is exact") {
    const auto st = step(100, 100, 50);
    CHECK(st.tasks[0].same_clock);
    CHECK(st.tasks[0].clock_offset_ns == 0);
    CHECK_FALSE(st.tasks[1].same_clock);
    CHECK(st.tasks[1].clock_offset_ns == -skew);
    CHECK(st.tasks[1].node_stats[0].end_ns == 3000);
  }
  SUBCASE("a fast request, a slow answer: the round trip's middle would put the send after the "
          "arrival; the transfer moves the offset, within the round trip") {
    // Received 10 after it was sent, answered 400 before the answer came:
    // the middle is 195 late, and the tensor took 50.
    const auto st = step(10, 400, 50);
    const auto& remote = st.tasks[1];
    CHECK(remote.offset_min_ns <= remote.clock_offset_ns);
    CHECK(remote.clock_offset_ns <= remote.offset_max_ns);
    CHECK(remote.offset_max_ns - remote.offset_min_ns == 410);
    const auto& send = remote.node_stats[0];
    const auto& recv = st.tasks[0].node_stats[0];
    CHECK(send.end_ns <= recv.arrived_ns);
    // Every node of the remote task within the client's step.
    CHECK(st.start_ns <= send.start_ns);
    CHECK(send.end_ns <= st.end_ns);
    // Moved just enough: the send now ends as the tensor arrives, 50 late
    // (the middle was 195 late).
    CHECK(remote.clock_offset_ns == 50 - skew);
    CHECK(send.end_ns == recv.arrived_ns);
  }
}

TEST_CASE("a task's GPU memory is a counter in the timeline, at the end of its last node") {
  loom::step_stats st;
  st.start_ns = 1'000'000;
  st.end_ns = 9'000'000;
  loom::task_step_stats t;
  t.task = "/job:worker/replica:0/task:0";
  loom::node_exec_stats n;
  n.node_name = "a";
  n.op = "square";
  n.start_ns = 2'000'000;
  n.end_ns = 5'000'000;
  n.thread_id = 7;
  t.node_stats.push_back(n);
  t.gpu_memory.push_back({.device = 1, .allocated = 4096, .cached = 512, .peak = 8192});
  st.tasks.push_back(t);
  rapidjson::Document doc;
  doc.Parse(loom::timeline(st).chrome_trace_json().c_str());
  REQUIRE_FALSE(doc.HasParseError());
  int counters = 0;
  for (const auto& e : doc["traceEvents"].GetArray()) {
    if (std::string(e["ph"].GetString()) != "C")
      continue;
    ++counters;
    CHECK(std::string(e["name"].GetString()) == "GPU:1 memory");
    CHECK(e["ts"].GetDouble() == 4000.0); // microseconds from the step's start
    CHECK(e["args"]["allocated"].GetInt64() == 4096);
    CHECK(e["args"]["cached"].GetInt64() == 512);
    CHECK(e["args"]["peak"].GetInt64() == 8192);
  }
  CHECK(counters == 1);
}

TEST_CASE("loom::gpu_memory of a GPU this process lacks says so") {
  CHECK_THROWS_WITH_AS(loom::gpu_memory(0),
                       "invalid argument: loom::gpu_memory: GPU:0 does not exist: this process "
                       "has 0 GPU(s)",
                       loom::invalid_argument_error);
  CHECK_THROWS_WITH_AS(loom::reset_gpu_memory_peak(-1),
                       "invalid argument: loom::reset_gpu_memory_peak: GPU:-1 does not exist: "
                       "this process has 0 "
                       "GPU(s)",
                       loom::invalid_argument_error);
}

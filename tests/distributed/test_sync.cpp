// Synchronous replicas on an in-process cluster: the accumulator averages
// fresh gradients and drops stale ones, the barrier releases a worker only
// when its step's update is applied, a waiting kernel ends when its step is
// aborted or times out, and sync_replicas_optimizer's global-step arithmetic
// (one increment per aggregated update) holds.
#include <loom/api.hpp>

#include <doctest/doctest.h>
#include <support/cluster.hpp>
#include <support/messages.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

namespace {

using loom::testing::contains;
using loom::testing::local_cluster;
using namespace std::chrono_literals;

using loom::testing::quiet;

float first(const loom::any_tensor& t) {
  return *t.data<float>();
}
std::int64_t as_int(const loom::any_tensor& t) {
  return *t.data<std::int64_t>();
}

// A variable v on ps 0 with an accumulator, plus fed gradient and step.
struct accumulator_graph {
  loom::graph g;
  std::optional<loom::variable<float, 1>> v;
  loom::placeholder<float, 1> grad{g, loom::shape{2}, "grad"};
  loom::placeholder<std::int64_t, 0> step{g, loom::shape{}, "step"};
  loom::node_id accumulate, take;

  explicit accumulator_graph(std::int64_t num_required, std::int64_t timeout_ms = 0) {
    {
      auto _ = g.device("/job:ps/task:0");
      v.emplace(g, "v", loom::shape{2}, loom::zeros_initializer{});
    }
    accumulate = g.add_node("accumulate_gradient", {v->id(), grad.id(), step.id()});
    take = g.add_node("take_gradient", {v->id(), step.id()},
                      {{"num_required", num_required}, {"timeout_ms", timeout_ms}});
  }
  void add(loom::session& s, float value, std::int64_t local_step) {
    s.run_nodes({}, {accumulate},
                {{grad.id(), loom::any_tensor::from_vector<float>(loom::shape{2}, {value, value})},
                 {step.id(), loom::any_tensor::scalar<std::int64_t>(local_step)}});
  }
  float take_mean(loom::session& s, std::int64_t global_step) {
    return first(
        s.run_nodes({take}, {}, {{step.id(), loom::any_tensor::scalar<std::int64_t>(global_step)}})
            .front());
  }
};

} // namespace

TEST_CASE("the accumulator averages fresh gradients and drops stale ones") {
  local_cluster c(1, 1);
  accumulator_graph a(2);
  loom::session s(a.g, c.worker(0).target(), quiet());
  a.add(s, 1.0f, 0);
  a.add(s, 3.0f, 0);
  CHECK(a.take_mean(s, 0) == doctest::Approx(2.0));
  // The accumulator is now at step 1: a gradient of step 0 is stale.
  a.add(s, 100.0f, 0);
  a.add(s, 5.0f, 1);
  a.add(s, 7.0f, 1);
  CHECK(a.take_mean(s, 1) == doctest::Approx(6.0));
}

TEST_CASE("take_gradient waits for the gradients it needs, not polling: it answers when they "
          "arrive") {
  local_cluster c(1, 1);
  accumulator_graph a(2);
  loom::session taker(a.g, c.worker(0).target(), quiet());
  loom::session adder(a.g, c.worker(0).target(), quiet());
  auto mean = std::async(std::launch::async, [&] { return a.take_mean(taker, 0); });
  a.add(adder, 2.0f, 0);
  CHECK(mean.wait_for(300ms) == std::future_status::timeout); // one of two
  a.add(adder, 4.0f, 0);
  REQUIRE(mean.wait_for(10s) == std::future_status::ready);
  CHECK(mean.get() == doctest::Approx(3.0));
}

TEST_CASE("a waiting take_gradient fails at its timeout, naming what it waited for") {
  local_cluster c(1, 1);
  accumulator_graph a(2, 200);
  loom::session s(a.g, c.worker(0).target(), quiet());
  a.add(s, 1.0f, 0);
  const auto begin = std::chrono::steady_clock::now();
  const std::string what =
      loom::testing::message_of<loom::deadline_exceeded_error>([&] { a.take_mean(s, 0); });
  CHECK(std::chrono::steady_clock::now() - begin < 10s);
  CHECK(contains(what, "waited 200 ms for 2 gradients of step 0 for variable 'v'"));
}

TEST_CASE("a waiting kernel ends when its task stops") {
  local_cluster c(1, 1);
  accumulator_graph a(2);
  loom::session s(a.g, c.worker(0).target(), quiet());
  auto mean = std::async(std::launch::async, [&] {
    try {
      a.take_mean(s, 0);
      return std::string("returned");
    } catch (const loom::error& e) {
      return std::string(e.what());
    }
  });
  CHECK(mean.wait_for(300ms) == std::future_status::timeout);
  c.servers[0]->stop(); // the ps
  REQUIRE(mean.wait_for(20s) == std::future_status::ready);
  CHECK(contains(mean.get(), "ps task 0"));
}

TEST_CASE("a closed accumulator fails every take until a reset, so one close stops a chief's "
          "loop wherever it is") {
  local_cluster c(1, 1);
  accumulator_graph a(1);
  const auto close = a.g.add_node("close_accumulator", {a.v->id()});
  const auto reset = a.g.add_node("reset_accumulator", {a.v->id(), a.step.id()});
  loom::session s(a.g, c.worker(0).target(), quiet());
  s.run_nodes({}, {close}); // before any take waits
  a.add(s, 1.0f, 0);        // enough for a take, but closed
  CHECK(contains(loom::testing::message_of<loom::cancelled_error>([&] { a.take_mean(s, 0); }),
                 "the accumulator was closed"));
  s.run_nodes({}, {reset}, {{a.step.id(), loom::any_tensor::scalar<std::int64_t>(0)}});
  a.add(s, 3.0f, 0);
  CHECK(a.take_mean(s, 0) == doctest::Approx(3.0));
}

TEST_CASE("counter_wait returns when the counter passes its threshold") {
  local_cluster c(1, 1);
  loom::graph g;
  std::optional<loom::variable<std::int64_t, 0>> anchor;
  {
    auto _ = g.device("/job:ps/task:0");
    anchor.emplace(g, "anchor", loom::shape{}, loom::zeros_initializer{});
  }
  loom::placeholder<std::int64_t, 0> v(g, loom::shape{}, "v");
  auto wait = g.add_node("counter_wait", {anchor->id(), v.id()}, {{"counter", std::string("t")}});
  auto raise = g.add_node("counter_raise", {anchor->id(), v.id()}, {{"counter", std::string("t")}});
  loom::session waiter(g, c.worker(0).target(), quiet());
  loom::session raiser(g, c.worker(0).target(), quiet());
  auto at = [](std::int64_t x) { return loom::any_tensor::scalar<std::int64_t>(x); };
  auto released = std::async(std::launch::async, [&] {
    return as_int(waiter.run_nodes({wait}, {}, {{v.id(), at(4)}})[0]);
  });
  raiser.run_nodes({raise}, {}, {{v.id(), at(4)}}); // not past 4 yet
  CHECK(released.wait_for(300ms) == std::future_status::timeout);
  raiser.run_nodes({raise}, {}, {{v.id(), at(5)}});
  REQUIRE(released.wait_for(10s) == std::future_status::ready);
  CHECK(released.get() == 5);
  // Raising never lowers it.
  CHECK(as_int(raiser.run_nodes({raise}, {}, {{v.id(), at(2)}})[0]) == 5);
}

TEST_CASE("sync_replicas_optimizer under update ops: only the worker's step waits for them") {
  // TF's UPDATE_OPS idiom around minimize: an update that reads the step's feed. The ops run
  // outside a step (at session start, in the chief's loop) must not need that feed.
  loom::graph g;
  auto step = loom::create_global_step(g);
  loom::placeholder<float, 1> x(g, loom::shape{2}, "x");
  loom::variable<float, 1> w(g, "w", loom::shape{2}, loom::zeros_initializer{});
  loom::variable<float, 1> average(g, "average", loom::shape{2}, loom::zeros_initializer{},
                                   loom::variable_options{.trainable = false});
  const auto update = average.assign(x);
  loom::gradient_descent_optimizer sgd{0.5};
  loom::sync_replicas_optimizer sync(sgd, {.replicas_to_aggregate = 1, .total_num_replicas = 1});
  {
    auto after = g.control_dependencies({update.id()});
    sync.minimize(loom::reduce_sum(loom::square(w - x)), step);
  }
  // Whether `from` needs `target` through its inputs and control inputs.
  auto needs = [&](loom::node_id from, loom::node_id target) {
    std::vector<loom::node_id> todo{from};
    std::set<loom::node_id> seen;
    while (!todo.empty()) {
      const loom::node_id n = todo.back();
      todo.pop_back();
      if (n == target)
        return true;
      if (!seen.insert(n).second)
        continue;
      for (const auto* list : {&g.node(n).inputs, &g.node(n).control_inputs})
        todo.insert(todo.end(), list->begin(), list->end());
    }
    return false;
  };
  CHECK(needs(sync.train_op().id(), update.id()));
  for (const loom::operation& op : {sync.local_step_init_op(), sync.chief_update_op(),
                                    sync.reset_op(), sync.close_op(), sync.release_all_op()}) {
    INFO(g.node(op.id()).name);
    CHECK_FALSE(needs(op.id(), x.id()));
  }
}

TEST_CASE("sync_replicas_optimizer: workers wait for each update; one global step per update") {
  local_cluster c(2, 2);
  loom::graph g;
  loom::placeholder<float, 1> target(g, loom::shape{2}, "target");
  loom::gradient_descent_optimizer sgd{0.5};
  loom::sync_replicas_optimizer sync(sgd, {.replicas_to_aggregate = 2, .total_num_replicas = 2});
  // Each worker builds the graph under its own worker device; one graph per
  // worker, as between-graph replication does.
  auto build = [&](loom::graph& gr, int task, loom::sync_replicas_optimizer& opt,
                   loom::placeholder<float, 1>& t) {
    auto _ = gr.device(loom::replica_device_setter(
        {.ps_tasks = 2, .worker_device = "/job:worker/task:" + std::to_string(task)}));
    auto step = loom::create_global_step(gr);
    loom::variable<float, 1> wv(gr, "w", loom::shape{2}, loom::zeros_initializer{});
    auto loss = loom::reduce_sum(loom::square(wv - t));
    auto op = opt.minimize(loss, step);
    return std::make_tuple(step, wv, op);
  };
  loom::graph g1;
  loom::placeholder<float, 1> t1(g1, loom::shape{2}, "target");
  loom::gradient_descent_optimizer sgd1{0.5};
  loom::sync_replicas_optimizer sync1(sgd1, {.replicas_to_aggregate = 2, .total_num_replicas = 2});
  // Named references, not structured bindings: clang 14 cannot capture those.
  auto built0 = build(g, 0, sync, target);
  auto built1 = build(g1, 1, sync1, t1);
  auto& gs0 = std::get<0>(built0);
  auto& w0 = std::get<1>(built0);
  auto& op0 = std::get<2>(built0);
  auto& op1 = std::get<2>(built1);

  loom::session s0(g, c.worker(0).target(), quiet());
  loom::session s1(g1, c.worker(1).target(), quiet());
  s0.run(loom::global_variables_initializer(g));
  s0.run(loom::local_variables_initializer(g));
  s1.run(loom::local_variables_initializer(g1));
  s0.run(sync.local_step_init_op());
  s1.run(sync1.local_step_init_op());
  loom::sync_replicas_chief chief(sync, g, c.worker(0).target(), quiet());

  // Worker 0 alone cannot finish a step: the update needs two gradients.
  auto target0 = loom::any_tensor::from_vector<float>(loom::shape{2}, {2.0f, 2.0f});
  auto target1 = loom::any_tensor::from_vector<float>(loom::shape{2}, {4.0f, 4.0f});
  auto step0 = std::async(std::launch::async, [&] {
    s0.run_nodes({}, {op0.id()}, {{target.id(), target0}});
  });
  CHECK(step0.wait_for(300ms) == std::future_status::timeout);
  s1.run_nodes({}, {op1.id()}, {{t1.id(), target1}});
  REQUIRE(step0.wait_for(10s) == std::future_status::ready);
  step0.get();
  // One update from the mean gradient: w = 0 - 0.5 * mean(2(0-2), 2(0-4)) = 3.
  CHECK(first(s0.run_nodes({w0.id()}, {})[0]) == doctest::Approx(3.0));
  CHECK(as_int(s0.run_nodes({gs0.id()}, {})[0]) == 1);
  for (int k = 0; k < 3; ++k) {
    auto a = std::async(std::launch::async, [&] {
      s0.run_nodes({}, {op0.id()}, {{target.id(), target0}});
    });
    s1.run_nodes({}, {op1.id()}, {{t1.id(), target1}});
    a.get();
  }
  CHECK(as_int(s0.run_nodes({gs0.id()}, {})[0]) == 4);
  chief.stop(&s0);
  CHECK(chief.updates() == 4);
}

namespace {

// A 6 x 2 table v on ps 0 with a sparse accumulator; rows and ids are fed.
struct sparse_accumulator_graph {
  loom::graph g;
  std::optional<loom::variable<float, 2>> v;
  loom::placeholder<float, 2> rows{g, loom::shape{-1, 2}, "rows"};
  loom::placeholder<std::int64_t, 1> ids{g, loom::shape{-1}, "ids"};
  loom::placeholder<std::int64_t, 0> step{g, loom::shape{}, "step"};
  loom::node_id accumulate, take, taken_ids;

  explicit sparse_accumulator_graph(std::int64_t num_required) {
    {
      auto _ = g.device("/job:ps/task:0");
      v.emplace(g, "v", loom::shape{6, 2}, loom::zeros_initializer{});
    }
    accumulate =
        g.add_node("accumulate_sparse_gradient", {v->id(), rows.id(), ids.id(), step.id()});
    take =
        g.add_node("take_sparse_gradient", {v->id(), step.id()}, {{"num_required", num_required}});
    taken_ids = g.add_node("sparse_gradient_indices", {v->id(), take});
  }
  void add(loom::session& s, std::vector<std::int64_t> at, std::vector<float> values,
           std::int64_t local_step) {
    const auto n = static_cast<std::int64_t>(at.size());
    s.run_nodes({}, {accumulate},
                {{rows.id(), loom::any_tensor::from_vector<float>(loom::shape{n, 2}, values)},
                 {ids.id(), loom::any_tensor::from_vector<std::int64_t>(loom::shape{n}, at)},
                 {step.id(), loom::any_tensor::scalar<std::int64_t>(local_step)}});
  }
  // (ids, rows) of the mean.
  std::pair<std::vector<std::int64_t>, std::vector<float>> take_mean(loom::session& s,
                                                                     std::int64_t global_step) {
    auto out = s.run_nodes({take, taken_ids}, {},
                           {{step.id(), loom::any_tensor::scalar<std::int64_t>(global_step)}});
    const auto& r = out[0];
    const auto& i = out[1];
    return {std::vector<std::int64_t>(i.data<std::int64_t>(),
                                      i.data<std::int64_t>() + i.num_elements()),
            std::vector<float>(r.data<float>(), r.data<float>() + r.num_elements())};
  }
};

} // namespace

TEST_CASE("the sparse accumulator averages each row over the gradients that touched it, ids "
          "ascending, and drops stale gradients") {
  local_cluster c(1, 1);
  sparse_accumulator_graph a(2);
  loom::session s(a.g, c.worker(0).target(), quiet());
  s.run(loom::global_variables_initializer(a.g));
  // Worker A touches rows 5 and 1 (row 1 twice: one gradient, rows summed);
  // worker B touches row 1 and row 3.
  a.add(s, {5, 1, 1}, {1, 1, 2, 2, 4, 4}, 0);
  a.add(s, {1, 3}, {6, 6, 8, 8}, 0);
  auto [ids, rows] = a.take_mean(s, 0);
  CHECK(ids == std::vector<std::int64_t>{1, 3, 5});
  // Row 1: (2 + 4 + 6) / 2 gradients; rows 3 and 5: touched by one each
  // (TF's SparseConditionalAccumulator averages element-wise).
  CHECK(rows == std::vector<float>{6, 6, 8, 8, 1, 1});
  // Now at step 1: a gradient of step 0 is stale.
  a.add(s, {0}, {100, 100}, 0);
  a.add(s, {2}, {1, 3}, 1);
  a.add(s, {2}, {3, 5}, 1);
  auto [ids1, rows1] = a.take_mean(s, 1);
  CHECK(ids1 == std::vector<std::int64_t>{2});
  CHECK(rows1 == std::vector<float>{2, 4});
}

TEST_CASE("a gradient of no rows (no id in this shard) counts, and later rows still add up") {
  local_cluster c(1, 1);
  sparse_accumulator_graph a(2);
  loom::session s(a.g, c.worker(0).target(), quiet());
  s.run(loom::global_variables_initializer(a.g));
  a.add(s, {}, {}, 0);
  a.add(s, {4}, {2, 6}, 0);
  auto [ids, rows] = a.take_mean(s, 0);
  CHECK(ids == std::vector<std::int64_t>{4});
  CHECK(rows == std::vector<float>{2, 6});
}

TEST_CASE("the sparse accumulator refuses an id outside its variable, naming it and the range") {
  local_cluster c(1, 1);
  sparse_accumulator_graph a(1);
  loom::session s(a.g, c.worker(0).target(), quiet());
  s.run(loom::global_variables_initializer(a.g));
  for (std::int64_t bad : {6, -1}) {
    const std::string what = loom::testing::message_of<loom::invalid_argument_error>([&] {
      a.add(s, {0, bad}, {1, 1, 2, 2}, 0);
    });
    CHECK(contains(what, "id " + std::to_string(bad) + " is outside variable 'v' (rows 0 to 5)"));
  }
}

TEST_CASE("sync_replicas_optimizer with an embedding: gradients of rows accumulate sparsely and "
          "only the touched rows change") {
  local_cluster c(1, 2);
  constexpr std::int64_t rows = 1000, dim = 2;
  struct replica {
    loom::graph g;
    loom::placeholder<std::int64_t, 1> ids{g, loom::shape{-1}, "ids"};
    loom::gradient_descent_optimizer sgd{1.0};
    loom::sync_replicas_optimizer sync{sgd, {.replicas_to_aggregate = 2}};
    std::optional<loom::variable<std::int64_t, 0>> step;
    std::optional<loom::variable<float, 2>> table;
    std::optional<loom::operation> train;
    explicit replica(int task) {
      auto _ = g.device(loom::replica_device_setter(
          {.ps_tasks = 1, .worker_device = "/job:worker/task:" + std::to_string(task)}));
      step.emplace(loom::create_global_step(g));
      table.emplace(g, "table", loom::shape{rows, dim}, loom::zeros_initializer{});
      // loss = -sum(rows looked up): each looked-up row's gradient is -1 per time.
      auto loss = loom::lower(-loom::reduce_sum(loom::embedding_lookup(*table, ids)));
      train = sync.minimize(loss, *step);
    }
  };
  replica r0(0), r1(1);
  // No dense accumulator for the table: its gradient travels as rows.
  int sparse_accumulators = 0;
  for (std::size_t i = 0; i < r0.g.size(); ++i) {
    const auto& n = r0.g.node(static_cast<loom::node_id>(i));
    CHECK(n.op != "accumulate_gradient");
    sparse_accumulators += n.op == "accumulate_sparse_gradient";
  }
  CHECK(sparse_accumulators == 1);

  loom::session s0(r0.g, c.worker(0).target(), quiet());
  loom::session s1(r1.g, c.worker(1).target(), quiet());
  s0.run(loom::global_variables_initializer(r0.g));
  s0.run(loom::local_variables_initializer(r0.g));
  s1.run(loom::local_variables_initializer(r1.g));
  s0.run(r0.sync.local_step_init_op());
  s1.run(r1.sync.local_step_init_op());
  loom::sync_replicas_chief chief(r0.sync, r0.g, c.worker(0).target(), quiet());
  auto ids = [](std::vector<std::int64_t> v) {
    const auto n = static_cast<std::int64_t>(v.size());
    return loom::tensor<std::int64_t, 1>(loom::shape{n}, std::move(v));
  };
  auto a = std::async(std::launch::async, [&] { s0.run(*r0.train, {{r0.ids, ids({7, 7, 500})}}); });
  s1.run(*r1.train, {{r1.ids, ids({7, 999})}});
  a.get();
  const auto table = s0.run(*r0.table);
  // Row 7: gradients -2 (worker 0, twice) and -1 (worker 1), mean -1.5;
  // rows 500 and 999: one gradient of -1 each.
  CHECK(table(7, 0) == doctest::Approx(1.5));
  CHECK(table(500, 1) == doctest::Approx(1.0));
  CHECK(table(999, 0) == doctest::Approx(1.0));
  int changed = 0;
  for (std::int64_t r = 0; r < rows; ++r)
    changed += table(r, 0) != 0.0f;
  CHECK(changed == 3);
  CHECK(s0.run(*r0.step) == 1);
  chief.stop(&s0);
}

namespace {

// Two replicas of one sync model (w on ps 0), each a graph of its own as between-graph
// replication builds them, worker k's ops on /job:worker/task:k.
struct sync_replica {
  loom::graph g;
  loom::placeholder<float, 1> target{g, loom::shape{2}, "target"};
  loom::gradient_descent_optimizer sgd{0.5};
  loom::sync_replicas_optimizer sync;
  std::optional<loom::variable<std::int64_t, 0>> step;
  std::optional<loom::operation> train;
  sync_replica(int task, std::chrono::milliseconds barrier_timeout)
      : sync(sgd, {.replicas_to_aggregate = 2, .barrier_timeout = barrier_timeout}) {
    auto _ = g.device(loom::replica_device_setter(
        {.ps_tasks = 1, .worker_device = "/job:worker/task:" + std::to_string(task)}));
    step.emplace(loom::create_global_step(g));
    loom::variable<float, 1> w(g, "w", loom::shape{2}, loom::zeros_initializer{});
    train = sync.minimize(loom::reduce_sum(loom::square(w - target)), *step);
  }
  void run_step(loom::session& s) {
    s.run_nodes({}, {train->id()},
                {{target.id(), loom::any_tensor::from_vector<float>(loom::shape{2}, {1, 1})}});
  }
  std::string failed_step(loom::session& s) {
    return loom::testing::message_of<loom::error>([&] { run_step(s); });
  }
};

// Sessions of both replicas on worker 0's and 1's servers, initialized, each
// worker's local step set.
struct two_replicas {
  local_cluster c{1, 2};
  sync_replica r0, r1;
  loom::session s0, s1;
  explicit two_replicas(std::chrono::milliseconds barrier_timeout)
      : r0(0, barrier_timeout), r1(1, barrier_timeout), s0(r0.g, c.worker(0).target(), quiet()),
        s1(r1.g, c.worker(1).target(), quiet()) {
    s0.run(loom::global_variables_initializer(r0.g));
    s0.run(loom::local_variables_initializer(r0.g));
    s1.run(loom::local_variables_initializer(r1.g));
    s0.run(r0.sync.reset_op());
    s0.run(r0.sync.local_step_init_op());
    s1.run(r1.sync.local_step_init_op());
  }
  // Both replicas run one step together.
  void step_together() {
    auto other = std::async(std::launch::async, [&] { r1.run_step(s1); });
    r0.run_step(s0);
    other.get();
  }
};

} // namespace

TEST_CASE("a barrier's timeout names what the update waits for: how many gradients arrived, and "
          "which workers have not sent") {
  // Long enough that the step both take first is applied under a loaded CTest (400 ms was
  // not: the chief's update came late and that step timed out); each failure waits it once.
  two_replicas t(1500ms);
  {
    loom::sync_replicas_chief chief(t.r0.sync, t.r0.g, t.c.worker(0).target(), quiet());
    t.step_together(); // both workers reached the barrier once: their names are known
    // Worker 1 died: worker 0's gradient is alone, and the chief's update loop waits for the other.
    const std::string what = t.r0.failed_step(t.s0);
    CHECK_MESSAGE(contains(what,
                           "waited 1500 ms for the update of step 1: the gradients of 1 of "
                           "the 2 replica(s) it aggregates arrived (from /job:worker/task:0); "
                           "not sent: /job:worker/task:1 (is it running?)"),
                  what);
    CHECK_FALSE(contains(what, "is the chief running?"));
    chief.stop(&t.s0);
  }
  // No update loop (the chief is gone): every gradient arrived, and the message blames the chief.
  t.s0.run(t.r0.sync.reset_op()); // stop() released the barrier for good
  t.s0.run(t.r0.sync.local_step_init_op());
  t.s1.run(t.r1.sync.local_step_init_op());
  auto other = std::async(std::launch::async, [&] { return t.r1.failed_step(t.s1); });
  const std::string what = t.r0.failed_step(t.s0);
  CHECK_MESSAGE(contains(what, "the gradients of 2 of the 2 replica(s) it aggregates arrived (from "
                               "/job:worker/task:0, /job:worker/task:1), and the chief's update "
                               "loop has not applied them (is the chief running?)"),
                what);
  CHECK(contains(other.get(), "is the chief running?"));
}

TEST_CASE(
    "reset_op: a worker waiting at the barrier fails with aborted, the accumulators drop what "
    "they held, and the workers go on from the chief's step") {
  two_replicas t(20s);
  loom::sync_replicas_chief chief(t.r0.sync, t.r0.g, t.c.worker(0).target(), quiet());
  t.step_together();
  // Worker 1 sends its gradient of step 1 and waits; a restarted chief resets. Its reset
  // also ends the take the old update loop still waits in (as one of a chief that died).
  auto waiting = std::async(std::launch::async, [&] { return t.r1.failed_step(t.s1); });
  CHECK(waiting.wait_for(300ms) == std::future_status::timeout);
  t.s0.run(t.r0.sync.reset_op());
  REQUIRE(waiting.wait_for(10s) == std::future_status::ready);
  const std::string what = waiting.get();
  CHECK_MESSAGE(contains(what, "the chief reset the update barrier to step 1"), what);
  // The old loop's take ended (stop without a session would wait for it for ever).
  auto stopped = std::async(std::launch::async, [&] {
    try {
      chief.stop(nullptr);
    } catch (const loom::cancelled_error&) { // the take's, when the loop saw it before stop
    }
  });
  REQUIRE(stopped.wait_for(10s) == std::future_status::ready);
  stopped.get();
  // A session that began before the reset fails at the barrier too, at once.
  CHECK(contains(t.r1.failed_step(t.s1), "the chief reset the update barrier"));
  // The stale gradient was dropped: with the local steps set again, the next update averages the
  // two fresh gradients of step 1, and the global step counts it.
  t.s0.run(t.r0.sync.local_step_init_op());
  t.s1.run(t.r1.sync.local_step_init_op());
  loom::sync_replicas_chief restarted(t.r0.sync, t.r0.g, t.c.worker(0).target(), quiet());
  t.step_together();
  CHECK(as_int(t.s0.run_nodes({t.r0.step->id()}, {})[0]) == 2);
  restarted.stop(&t.s0);
}

TEST_CASE("a chief dropped without stop (an error unwound past it) ends its update loop instead of "
          "waiting for gradients; a new chief goes on") {
  two_replicas t(20s);
  auto dropped = std::async(std::launch::async, [&] {
    loom::sync_replicas_chief chief(t.r0.sync, t.r0.g, t.c.worker(0).target(), quiet());
    std::this_thread::sleep_for(300ms); // its loop waits in the take
  });
  if (dropped.wait_for(10s) != std::future_status::ready) {
    t.s0.run(t.r0.sync.close_op()); // lets the future end, so that the case can fail
    FAIL("the dropped chief still waits for gradients after 10 s");
  }
  dropped.get();
  // As a restarted chief does: a new epoch, then its update loop.
  t.s0.run(t.r0.sync.reset_op());
  t.s0.run(t.r0.sync.local_step_init_op());
  t.s1.run(t.r1.sync.local_step_init_op());
  loom::sync_replicas_chief restarted(t.r0.sync, t.r0.g, t.c.worker(0).target(), quiet());
  t.step_together();
  CHECK(as_int(t.s0.run_nodes({t.r0.step->id()}, {})[0]) == 1);
  restarted.stop(&t.s0);
}

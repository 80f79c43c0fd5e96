// Learning-rate schedules against TF's formulas at steps before, at and past their
// boundaries; a schedule driving an optimizer through the global step; clip_by_norm,
// global_norm and clip_by_global_norm over dense and sparse gradients; bad arguments,
// one error each.
#include <doctest/doctest.h>
#include <support/messages.hpp>

#include <loom/loom.hpp>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <regex>
#include <span>
#include <string>
#include <thread>
#include <vector>

using loom::graph;
using loom::shape;
using loom::tensor;
using loom::testing::contains;
using loom::testing::message_of;

namespace {

// The schedule's value at each step, fed as the global step.
template <class F> std::vector<double> schedule_at(const std::vector<std::int64_t>& steps, F make) {
  graph g;
  loom::placeholder<std::int64_t, 0> step(g, shape{}, "step");
  auto rate = make(step);
  loom::session s(g);
  std::vector<double> out;
  for (std::int64_t k : steps)
    out.push_back(static_cast<double>(s.run(rate, {{step, k}}).flat()[0]));
  return out;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("value " << i << ": " << got[i] << " against " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= 1e-6 * std::max(1.0, std::abs(want[i])));
  }
}

} // namespace

TEST_CASE("logging_hook: where the last step is known, how far, how fast and the time left") {
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  loom::graph g;
  loom::placeholder<float, 0> loss(g, loom::shape{}, "loss");
  const auto value = loom::any_tensor::scalar<float>(0.5f);
  loom::logging_hook hook(loss.id(), {.label = "Worker 0",
                                      .every_n_steps = 2,
                                      .batch_size = 10,
                                      .examples_per_global_step = 10,
                                      .last_step = 100,
                                      .out = out});
  loom::run_context c;
  for (std::int64_t step = 1; step <= 2; ++step) {
    c.global_step = 25 * step;
    if (step == 2)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    hook.after_run(c, std::span<const loom::any_tensor>(&value, 1));
  }
  std::rewind(out);
  char line[256] = {};
  REQUIRE(std::fgets(line, sizeof line, out) != nullptr);
  std::fclose(out);
  const std::string text = line;
  MESSAGE(text);
  CHECK(text.find("Worker 0: step 2  global step 50  loss 0.5000") == 0);
  // 25 global steps in about 50 ms: about 500 a second, 50 steps (about 0.1 s) left.
  const std::regex progress(R"(  50\.0 % done  ([0-9.]+) steps/s  0:00:00 left\n$)");
  std::smatch m;
  REQUIRE(std::regex_search(text, m, progress));
  CHECK(std::stod(m[1]) > 50);
  CHECK(std::stod(m[1]) < 600);
}

TEST_CASE("exponential, piecewise constant, polynomial and cosine decay, and a warmup") {
  const std::vector<std::int64_t> steps{0, 1, 99, 100, 101, 250, 1000, 5000};
  std::vector<double> want;
  for (std::int64_t k : steps)
    want.push_back(0.1 * std::pow(0.5, static_cast<double>(k) / 100));
  check_close(schedule_at(steps, [](auto& s) { return loom::exponential_decay(0.1, s, 100, 0.5); }),
              want);
  want.clear();
  for (std::int64_t k : steps)
    want.push_back(0.1 * std::pow(0.5, static_cast<double>(k / 100)));
  check_close(
      schedule_at(steps, [](auto& s) { return loom::exponential_decay(0.1, s, 100, 0.5, true); }),
      want);
  // TF: values[0] while step <= 100, values[1] while step <= 250, values[2] after.
  check_close(schedule_at(steps,
                          [](auto& s) {
                            return loom::piecewise_constant(s, {100, 250}, {1.0, 0.5, 0.1});
                          }),
              {1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.1, 0.1});
  want.clear();
  for (std::int64_t k : steps) {
    const double p = std::min<double>(static_cast<double>(k), 1000);
    want.push_back((0.1 - 0.001) * std::pow(1 - p / 1000, 2.0) + 0.001);
  }
  check_close(
      schedule_at(steps, [](auto& s) { return loom::polynomial_decay(0.1, s, 1000, 0.001, 2.0); }),
      want);
  want.clear();
  for (std::int64_t k : steps) {
    const double d = 1000 * std::max(1.0, std::ceil(static_cast<double>(k) / 1000));
    want.push_back((0.1 - 0.001) * (1 - static_cast<double>(k) / d) + 0.001);
  }
  check_close(
      schedule_at(steps,
                  [](auto& s) { return loom::polynomial_decay(0.1, s, 1000, 0.001, 1.0, true); }),
      want);
  want.clear();
  for (std::int64_t k : steps) {
    const double p = std::min<double>(static_cast<double>(k), 1000);
    want.push_back(0.1 * (0.9 * 0.5 * (1 + std::cos(std::numbers::pi * p / 1000)) + 0.1));
  }
  check_close(schedule_at(steps, [](auto& s) { return loom::cosine_decay(0.1, s, 1000, 0.1); }),
              want);
  want.clear();
  for (std::int64_t k : steps)
    want.push_back(k < 100 ? 0.01 + (0.2 - 0.01) * static_cast<double>(k) / 100 : 0.2);
  check_close(schedule_at(steps,
                          [](auto& s) {
                            graph g = s.graph();
                            return loom::linear_warmup(loom::constant(g, 0.2f), s, 100, 0.01);
                          }),
              want);
}

TEST_CASE("a schedule on the global step drives gradient descent") {
  graph g;
  auto step = loom::create_global_step(g);
  loom::variable<float, 0> w(g, "w", 0.f);
  auto rate = loom::piecewise_constant(step, {1}, {1.0, 0.25});
  auto train = loom::gradient_descent_optimizer{rate}.minimize(-w, step);
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  std::vector<float> seen;
  for (int k = 0; k < 4; ++k) {
    s.run(train);
    seen.push_back(s.run(w).flat()[0]);
  }
  // Steps 0 and 1 take 1, later ones 0.25 (the step is read before its increment).
  CHECK(seen == std::vector<float>{1.f, 2.f, 2.25f, 2.5f});
}

TEST_CASE("clip_by_norm, global_norm and clip_by_global_norm, dense and sparse") {
  graph g;
  loom::placeholder<double, 1> v(g, shape{2}, "v");
  auto clipped = loom::clip_by_norm(v, 1.0);
  loom::session s(g);
  auto run = [&](const tensor<double, 1>& x) {
    const auto t = s.run(clipped, {{v, x}});
    return std::vector<double>(t.flat().begin(), t.flat().end());
  };
  check_close(run(tensor<double, 1>(shape{2}, {3, 4})), {0.6, 0.8});
  check_close(run(tensor<double, 1>(shape{2}, {0.3, 0.4})), {0.3, 0.4});
  check_close(run(tensor<double, 1>(shape{2}, {0, 0})), {0, 0});
  // At zero its gradient is finite (TF's safe norm).
  auto [dv] = loom::gradients(loom::reduce_sum(clipped), v);
  const auto d = s.run(dv, {{v, tensor<double, 1>(shape{2}, {0.0, 0.0})}});
  CHECK(std::isfinite(d.flat()[0]));

  // A dense and a sparse gradient (a gather's rows), clipped together to norm 1.
  loom::variable<double, 2> table(g, "table", shape{4, 2}, loom::ones_initializer{});
  loom::variable<double, 1> bias(g, "bias", shape{2}, loom::ones_initializer{});
  loom::placeholder<std::int64_t, 1> ids(g, shape{2}, "ids");
  auto loss = loom::reduce_sum(loom::gather(table, ids) * 3.0) + loom::reduce_sum(bias * 4.0);
  loom::gradient_descent_optimizer sgd{1.0};
  const auto gvs = sgd.compute_gradients(loss);
  const auto clipped_gvs = loom::clip_by_global_norm(g, gvs, 1.0);
  REQUIRE(clipped_gvs.grads_and_vars.size() == 2);
  CHECK(g.node(clipped_gvs.grads_and_vars[0].grad).op == "indexed_slices");
  auto train = sgd.apply_gradients(g, clipped_gvs.grads_and_vars);
  s.run(loom::global_variables_initializer(g));
  const loom::feed_dict feeds{{ids, tensor<std::int64_t, 1>(shape{2}, {1, 3})}};
  // Rows 1 and 3 get 3 each (4 elements), bias 4 each (2): norm sqrt(36 + 32) = sqrt(68).
  const double norm = std::sqrt(68.0);
  const loom::output<double, 0> global(g, clipped_gvs.global_norm);
  CHECK(std::abs(s.run(global, feeds).flat()[0] - norm) < 1e-12);
  s.run(train, feeds);
  const auto t = s.run(table);
  check_close(std::vector<double>(t.flat().begin(), t.flat().end()),
              {1, 1, 1 - 3 / norm, 1 - 3 / norm, 1, 1, 1 - 3 / norm, 1 - 3 / norm});
  const auto b = s.run(bias);
  check_close(std::vector<double>(b.flat().begin(), b.flat().end()), {1 - 4 / norm, 1 - 4 / norm});
}

TEST_CASE("schedules and clipping refuse what TF refuses") {
  graph g;
  loom::placeholder<std::int64_t, 0> step(g, shape{}, "step");
  loom::placeholder<float, 1> v(g, shape{2}, "v");
  auto error = [](auto&& f) { return message_of<loom::invalid_argument_error>(f); };
  CHECK(contains(error([&] {
                   loom::piecewise_constant(step, {100, 100}, {1.0, 0.5, 0.1});
                 }),
                 "boundaries [100, 100] do not increase"));
  CHECK(contains(error([&] { loom::piecewise_constant(step, {100}, {1.0}); }),
                 "1 values for 1 boundaries"));
  CHECK(contains(error([&] { loom::exponential_decay(0.1, step, 0, 0.5); }),
                 "decay_steps 0 must be positive"));
  CHECK(
      contains(error([&] { loom::clip_by_norm(v, 0.0); }), "clip_norm 0.000000 must be positive"));
}

TEST_CASE("exponential_moving_average: shadows start at the variable, move with apply") {
  graph g;
  auto step = loom::create_global_step(g);
  loom::variable<double, 1> w(g, "w", shape{2}, loom::constant_initializer{4.0});
  loom::exponential_moving_average ema(0.9);
  auto update = ema.apply(g, {w.id()});
  const loom::node_id shadow = ema.average(w.id());
  CHECK(g.node(shadow).name == "w/ExponentialMovingAverage");
  CHECK(g.node(shadow).colocation() == w.node().colocation());
  // The name map restores w from its shadow, the step from itself, and not the shadow.
  using name_map = std::vector<std::pair<std::string, loom::node_id>>;
  CHECK(ema.variables_to_restore(g) ==
        name_map{{"global_step", step.id()}, {"w/ExponentialMovingAverage", w.id()}});
  CHECK(g.collection(loom::collection::moving_average_variables) ==
        std::vector<loom::node_id>{w.id()});
  loom::session s(g);
  s.run(loom::global_variables_initializer(g));
  const loom::output<double, 1> average(g, shadow);
  CHECK(s.run(average).flat()[0] == 4.0);
  s.run(w.assign(loom::constant(g, tensor<double, 1>(shape{2}, {14, 24}))));
  s.run(update);
  check_close({s.run(average).flat()[0], s.run(average).flat()[1]}, {4 + 0.1 * 10, 4 + 0.1 * 20});
  // With a step count the decay warms up: min(0.9, (1 + 0) / (10 + 0)) = 0.1 at step 0.
  loom::variable<double, 0> v(g, "v", 0.0);
  loom::exponential_moving_average warm(0.9, step, "warm");
  auto warm_update = warm.apply(g, {v.id()});
  s.run(loom::global_variables_initializer(g));
  s.run(v.assign(loom::constant(g, 10.0)));
  s.run(warm_update);
  CHECK(s.run(loom::output<double, 0>(g, warm.average(v.id()))).flat()[0] ==
        doctest::Approx(0.9 * 10));
  CHECK(contains(
      message_of<loom::invalid_argument_error>([&] { loom::exponential_moving_average bad(1.5); }),
      "decay 1.500000 must be in [0, 1]"));
}

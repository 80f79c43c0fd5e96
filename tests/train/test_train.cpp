// The optimizers: each does TF's exact update for one and two steps (expected
// values computed by hand in double) and never changes a value its step read
// (copy-on-write, checked in the session and on the kernels), minimize
// increments the global step,
// compute_gradients + apply_gradients equals minimize, slots exist with the
// right names and shapes, and a tiny linear regression converges.
#include <doctest/doctest.h>

#include <loom/loom.hpp>
#include <loom/runtime/resource_manager.hpp> // the kernels' resource containers, used directly
#include <support/messages.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

using loom::graph;
using loom::node_id;
using loom::shape;
using loom::tensor;

namespace {

using loom::testing::contains;

loom::session_options opts() {
  return {.intra_op_threads = 2};
}

const std::vector<double> w0{1.0, -2.0, 3.0};
const std::vector<double> c0{0.5, 1.0, 2.0};

// loss = 0.5 * sum(c * w^2), so the gradient is c * w.
struct quadratic {
  graph g;
  loom::variable<double, 1> w;
  loom::output<double, 0> loss;
  quadratic()
      : w(g, "w", loom::constant(g, tensor<double, 1>(shape{3}, w0))),
        loss(loom::lower(0.5 * loom::reduce_sum(loom::constant(g, tensor<double, 1>(shape{3}, c0)) *
                                                loom::square(w)))) {}
};

// TF's update rules, in double, one element at a time.
struct reference {
  std::vector<double> w = w0, a = std::vector<double>(3, 0.0), b = std::vector<double>(3, 0.0);
  int t = 0;
  double grad(std::size_t i) const { return c0[i] * w[i]; }
};

void check_w(loom::session& s, const loom::variable<double, 1>& w,
             const std::vector<double>& want) {
  auto got = s.run(w);
  REQUIRE(got.shape() == shape{3});
  for (int i = 0; i < 3; ++i)
    CHECK(got(i) == doctest::Approx(want[static_cast<std::size_t>(i)]).epsilon(1e-13));
}

// Runs `steps` updates of `opt` and compares w after each with `step(ref)`.
// Each update's run fetches w too: the value the step read and computed its
// gradient from, which the update in the same step must leave as it was.
void check_optimizer(loom::optimizer& opt, const std::function<void(reference&)>& step,
                     int steps = 2) {
  quadratic m;
  auto train = opt.minimize(m.loss);
  loom::session s(m.g, opts());
  s.run(loom::global_variables_initializer(m.g));
  reference ref;
  check_w(s, m.w, ref.w);
  for (int k = 0; k < steps; ++k) {
    INFO("step " << k + 1);
    auto [_, read] = s.run(loom::fetches(train, m.w));
    for (int i = 0; i < 3; ++i)
      CHECK(read(i) == doctest::Approx(ref.w[static_cast<std::size_t>(i)]).epsilon(1e-13));
    ++ref.t;
    step(ref);
    check_w(s, m.w, ref.w);
  }
}

} // namespace

TEST_CASE("gradient descent: w -= lr * g") {
  loom::gradient_descent_optimizer opt(0.1);
  check_optimizer(opt, [](reference& r) {
    for (std::size_t i = 0; i < 3; ++i)
      r.w[i] -= 0.1 * r.grad(i);
  });
}

TEST_CASE("momentum, without and with Nesterov") {
  for (bool nesterov : {false, true}) {
    INFO("nesterov " << nesterov);
    loom::momentum_optimizer opt(0.1, 0.9, nesterov);
    check_optimizer(
        opt,
        [nesterov](reference& r) {
          for (std::size_t i = 0; i < 3; ++i) {
            const double g = r.grad(i);
            r.a[i] = 0.9 * r.a[i] + g;
            r.w[i] -= nesterov ? 0.1 * g + 0.1 * 0.9 * r.a[i] : 0.1 * r.a[i];
          }
        },
        3);
  }
}

TEST_CASE("adagrad: accum += g^2; w -= lr g / sqrt(accum)") {
  loom::adagrad_optimizer opt(0.5, 0.1);
  check_optimizer(opt, [](reference& r) {
    if (r.t == 1)
      r.a.assign(3, 0.1);
    for (std::size_t i = 0; i < 3; ++i) {
      const double g = r.grad(i);
      r.a[i] += g * g;
      r.w[i] -= 0.5 * g / std::sqrt(r.a[i]);
    }
  });
}

TEST_CASE("adam: TF's bias-corrected step") {
  const double lr = 0.01, b1 = 0.8, b2 = 0.95, eps = 1e-7;
  loom::adam_optimizer opt(lr, b1, b2, eps);
  check_optimizer(
      opt,
      [&](reference& r) {
        const double lr_t = lr * std::sqrt(1 - std::pow(b2, r.t)) / (1 - std::pow(b1, r.t));
        for (std::size_t i = 0; i < 3; ++i) {
          const double g = r.grad(i);
          r.a[i] += (g - r.a[i]) * (1 - b1);
          r.b[i] += (g * g - r.b[i]) * (1 - b2);
          r.w[i] -= lr_t * r.a[i] / (std::sqrt(r.b[i]) + eps);
        }
      },
      3);
}

TEST_CASE("rmsprop: ms starts at one; with and without momentum") {
  for (double momentum : {0.0, 0.7}) {
    INFO("momentum " << momentum);
    loom::rmsprop_optimizer opt(0.05, 0.9, momentum, 1e-6);
    check_optimizer(
        opt,
        [momentum](reference& r) {
          if (r.t == 1)
            r.a.assign(3, 1.0);
          for (std::size_t i = 0; i < 3; ++i) {
            const double g = r.grad(i);
            r.a[i] += (g * g - r.a[i]) * (1 - 0.9);
            r.b[i] = momentum * r.b[i] + 0.05 * g / std::sqrt(r.a[i] + 1e-6);
            r.w[i] -= r.b[i];
          }
        },
        3);
  }
}

// The update kernel itself: of the variable and its two slots, only the one
// whose buffer something else holds (here a reader of the slot m, as a value
// read earlier in the step or a send still on the wire would) is copied
// before the update writes it; the others are updated in place.
TEST_CASE("an update copies the buffers something else holds, and only those") {
  loom::detail::resource_manager resources;
  Eigen::ThreadPool pool(2);
  loom::kernels::cpu_device device(&pool, 2);
  auto vec = [](std::vector<double> v) { return loom::any_tensor::from_vector(shape{3}, v); };
  auto scalar = [](double v) { return loom::any_tensor::scalar(v); };
  loom::kernels::variable_resource w, slot_m, slot_v;
  w.value = vec(w0);
  slot_m.value = vec({0.5, 0.5, 0.5});
  slot_v.value = vec({0.25, 0.25, 0.25});
  w.initialized = slot_m.initialized = slot_v.initialized = true;

  loom::node_def n;
  n.op = "apply_adam";
  n.name = "w/Adam/update";
  n.type = loom::dtype::f64;
  const double b1p = 0.9, b2p = 0.999, lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  const loom::any_tensor hyper[] = {scalar(b1p), scalar(b2p), scalar(lr),
                                    scalar(b1),  scalar(b2),  scalar(eps)};
  const loom::any_tensor grad = vec(c0);
  const loom::any_tensor* inputs[] = {nullptr,   nullptr,   nullptr,   &hyper[0], &hyper[1],
                                      &hyper[2], &hyper[3], &hyper[4], &hyper[5], &grad};
  loom::kernels::variable_resource* refs[] = {&w, &slot_m, &slot_v};
  loom::kernels::kernel_context c{n, inputs, refs, device, resources, {}, 0, nullptr, nullptr};

  const loom::any_tensor m_read = slot_m.value;
  const void* w_buffer = w.value.raw_data();
  const void* v_buffer = slot_v.value.raw_data();
  const loom::kernels::kernel_fn kernel = loom::kernels::kernel_registry::instance().find(
      "apply_adam", loom::dtype::f64, loom::kernels::device_cpu);
  REQUIRE(static_cast<bool>(kernel));
  kernel(c);

  CHECK(w.value.raw_data() == w_buffer);
  CHECK(slot_v.value.raw_data() == v_buffer);
  CHECK_FALSE(slot_m.value.shares_buffer_with(m_read));
  const double alpha = lr * std::sqrt(1 - b2p) / (1 - b1p);
  for (std::size_t i = 0; i < 3; ++i) {
    INFO("element " << i);
    CHECK(m_read.data<double>()[i] == 0.5);
    const double m = 0.5 + (c0[i] - 0.5) * (1 - b1);
    const double v = 0.25 + (c0[i] * c0[i] - 0.25) * (1 - b2);
    CHECK(slot_m.value.data<double>()[i] == doctest::Approx(m).epsilon(1e-13));
    CHECK(slot_v.value.data<double>()[i] == doctest::Approx(v).epsilon(1e-13));
    CHECK(w.value.data<double>()[i] ==
          doctest::Approx(w0[i] - alpha * m / (std::sqrt(v) + eps)).epsilon(1e-13));
  }
  CHECK(c.output.shares_buffer_with(w.value));
}

// A dense update runs its rule over blocks of the pool's chunks (kernels/cpu/training.hpp's
// dense_rule_block): 5 003 elements over 2 threads are chunks of several blocks, the last
// of each partial; every element must be updated once, from its own gradient.
TEST_CASE("a dense update of many rule blocks updates every element once, from its gradient") {
  constexpr std::int64_t n = 5003;
  loom::detail::resource_manager resources;
  Eigen::ThreadPool pool(2);
  loom::kernels::cpu_device device(&pool, 2);
  auto filled = [](auto element) {
    loom::any_tensor t(loom::dtype::f64, shape{n});
    for (std::int64_t i = 0; i < n; ++i)
      t.data<double>()[i] = element(static_cast<double>(i));
    return t;
  };
  loom::kernels::variable_resource w, slot_m, slot_v;
  w.value = filled([](double i) { return std::sin(i); });
  slot_m.value = filled([](double) { return 0.5; });
  slot_v.value = filled([](double) { return 0.25; });
  w.initialized = slot_m.initialized = slot_v.initialized = true;
  const loom::any_tensor grad = filled([](double i) { return std::cos(3 * i); });

  loom::node_def node;
  node.op = "apply_adam";
  node.name = "w/Adam/update";
  node.type = loom::dtype::f64;
  const double b1p = 0.9, b2p = 0.999, lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  const loom::any_tensor hyper[] = {loom::any_tensor::scalar(b1p), loom::any_tensor::scalar(b2p),
                                    loom::any_tensor::scalar(lr),  loom::any_tensor::scalar(b1),
                                    loom::any_tensor::scalar(b2),  loom::any_tensor::scalar(eps)};
  const loom::any_tensor* inputs[] = {nullptr,   nullptr,   nullptr,   &hyper[0], &hyper[1],
                                      &hyper[2], &hyper[3], &hyper[4], &hyper[5], &grad};
  loom::kernels::variable_resource* refs[] = {&w, &slot_m, &slot_v};
  loom::kernels::kernel_context c{node, inputs, refs, device, resources, {}, 0, nullptr, nullptr};
  const loom::kernels::kernel_fn kernel = loom::kernels::kernel_registry::instance().find(
      "apply_adam", loom::dtype::f64, loom::kernels::device_cpu);
  REQUIRE(static_cast<bool>(kernel));
  kernel(c);

  const double alpha = lr * std::sqrt(1 - b2p) / (1 - b1p);
  std::int64_t wrong = 0, first_wrong = -1;
  for (std::int64_t i = 0; i < n; ++i) {
    const double g = std::cos(3 * static_cast<double>(i));
    const double m = 0.5 + (g - 0.5) * (1 - b1), v = 0.25 + (g * g - 0.25) * (1 - b2);
    const double want = std::sin(static_cast<double>(i)) - alpha * m / (std::sqrt(v) + eps);
    if (std::abs(w.value.data<double>()[i] - want) > 1e-12 ||
        std::abs(slot_m.value.data<double>()[i] - m) > 1e-12 ||
        std::abs(slot_v.value.data<double>()[i] - v) > 1e-12) {
      first_wrong = first_wrong < 0 ? i : first_wrong;
      ++wrong;
    }
  }
  CAPTURE(first_wrong);
  CHECK(wrong == 0);
}

TEST_CASE("a learning rate fed through a placeholder") {
  quadratic m;
  loom::placeholder<double, 0> lr(m.g, shape{}, "lr");
  loom::gradient_descent_optimizer opt(lr);
  auto train = opt.minimize(m.loss);
  loom::session s(m.g, opts());
  s.run(loom::global_variables_initializer(m.g));
  s.run(train, {{lr, 0.25}});
  reference r;
  for (std::size_t i = 0; i < 3; ++i)
    r.w[i] -= 0.25 * r.grad(i);
  check_w(s, m.w, r.w);
  // A float learning rate for a double variable is cast, as TF does.
  quadratic m2;
  loom::placeholder<float, 0> lr_f(m2.g, shape{}, "lr");
  loom::gradient_descent_optimizer opt_f(lr_f);
  auto train_f = opt_f.minimize(m2.loss);
  loom::session s2(m2.g, opts());
  s2.run(loom::global_variables_initializer(m2.g));
  s2.run(train_f, {{lr_f, 0.25f}});
  check_w(s2, m2.w, r.w);
}

TEST_CASE("minimize increments the global step once per run") {
  quadratic m;
  auto step = loom::create_global_step(m.g);
  CHECK(step.name() == "global_step");
  CHECK(loom::get_global_step(m.g)->id() == step.id());
  loom::adam_optimizer opt(0.01);
  auto train = opt.minimize(m.loss, step);
  CHECK(train.name() == "Adam");
  const auto& ops = m.g.collection(loom::collection::train_op);
  CHECK(std::find(ops.begin(), ops.end(), train.id()) != ops.end());
  const auto& trainable = m.g.collection(loom::collection::trainable_variables);
  CHECK(std::find(trainable.begin(), trainable.end(), step.id()) == trainable.end());

  loom::session s(m.g, opts());
  s.run(loom::global_variables_initializer(m.g));
  CHECK(static_cast<std::int64_t>(s.run(step)) == 0);
  for (std::int64_t k = 1; k <= 3; ++k) {
    s.run(train);
    CHECK(static_cast<std::int64_t>(s.run(step)) == k);
  }
  // Fetched together with the train op, the step is read before or after the
  // increment (TF leaves the order open too); either way the run increments once.
  auto [none, value] = s.run(loom::fetches(train, step));
  (void)none;
  CHECK((static_cast<std::int64_t>(value) == 3 || static_cast<std::int64_t>(value) == 4));
  CHECK(static_cast<std::int64_t>(s.run(step)) == 4);
}

TEST_CASE("compute_gradients + apply_gradients equals minimize") {
  quadratic a, b;
  loom::adam_optimizer opt_a(0.05), opt_b(0.05);
  auto train_a = opt_a.minimize(a.loss);
  auto gvs = opt_b.compute_gradients(b.loss);
  REQUIRE(gvs.size() == 1);
  CHECK(gvs[0].var == b.w.id());
  CHECK(gvs[0].grad != loom::no_node);
  auto train_b = opt_b.apply_gradients(gvs);
  loom::session sa(a.g, opts()), sb(b.g, opts());
  sa.run(loom::global_variables_initializer(a.g));
  sb.run(loom::global_variables_initializer(b.g));
  for (int k = 0; k < 3; ++k) {
    sa.run(train_a);
    sb.run(train_b);
  }
  auto wa = sa.run(a.w), wb = sb.run(b.w);
  for (int i = 0; i < 3; ++i)
    CHECK(wa(i) == wb(i));
  CHECK(wa(0) != w0[0]);
}

TEST_CASE("slots: names, shapes, values") {
  SUBCASE("adam") {
    quadratic m;
    loom::adam_optimizer opt(0.01, 0.9, 0.999);
    auto train = opt.minimize(m.loss);
    CHECK(opt.get_slot_names() == std::vector<std::string>{"m", "v"});
    auto slot_m = opt.get_slot(m.w, "m");
    auto slot_v = opt.get_slot(m.w, "v");
    CHECK(slot_m.name() == "w/Adam");
    CHECK(slot_v.name() == "w/Adam_1");
    CHECK(slot_m.shape() == shape{3});
    CHECK(slot_v.shape() == shape{3});
    const auto& trainable = m.g.collection(loom::collection::trainable_variables);
    const auto& global = m.g.collection(loom::collection::global_variables);
    CHECK(std::find(trainable.begin(), trainable.end(), slot_m.id()) == trainable.end());
    CHECK(std::find(global.begin(), global.end(), slot_m.id()) != global.end());
    auto msg = std::string();
    try {
      (void)opt.get_slot(m.w, "momentum");
    } catch (const loom::not_found_error& e) {
      msg = e.what();
    }
    CHECK(contains(msg, "'momentum'"));
    CHECK(contains(msg, "'w'"));

    loom::session s(m.g, opts());
    s.run(loom::global_variables_initializer(m.g));
    s.run(train);
    auto mv = s.run(slot_m), vv = s.run(slot_v);
    for (int i = 0; i < 3; ++i) {
      const double g = c0[static_cast<std::size_t>(i)] * w0[static_cast<std::size_t>(i)];
      CHECK(mv(i) == doctest::Approx(0.1 * g).epsilon(1e-13));
      CHECK(vv(i) == doctest::Approx(0.001 * g * g).epsilon(1e-13));
    }
    s.run(train);
    const auto b1 = opt.get_non_slot_variable(m.g, "beta1_power");
    const auto b2 = opt.get_non_slot_variable(m.g, "beta2_power");
    REQUIRE(b1.has_value());
    REQUIRE(b2.has_value());
    auto p1 = s.run_nodes({*b1, *b2}, {});
    CHECK(p1[0].flat<double>()[0] == doctest::Approx(0.9 * 0.9 * 0.9).epsilon(1e-13));
    CHECK(p1[1].flat<double>()[0] == doctest::Approx(0.999 * 0.999 * 0.999).epsilon(1e-13));
  }
  SUBCASE("momentum, adagrad, rmsprop, gradient descent") {
    quadratic m;
    loom::momentum_optimizer mom(0.1, 0.9);
    loom::adagrad_optimizer ada(0.1);
    loom::rmsprop_optimizer rms(0.1);
    loom::gradient_descent_optimizer sgd(0.1);
    (void)mom.minimize(m.loss);
    (void)ada.minimize(m.loss);
    (void)rms.minimize(m.loss);
    (void)sgd.minimize(m.loss);
    CHECK(mom.get_slot_names() == std::vector<std::string>{"momentum"});
    CHECK(ada.get_slot_names() == std::vector<std::string>{"accumulator"});
    CHECK(rms.get_slot_names() == std::vector<std::string>{"momentum", "rms"});
    CHECK(sgd.get_slot_names().empty());
    CHECK(mom.get_slot(m.w, "momentum").name() == "w/Momentum");
    CHECK(ada.get_slot(m.w, "accumulator").name() == "w/Adagrad");
    CHECK(rms.get_slot(m.w, "rms").name() == "w/RMSProp");
    CHECK(rms.get_slot(m.w, "momentum").name() == "w/RMSProp_1");
    CHECK(ada.get_slot(m.w, "accumulator").shape() == shape{3});
    loom::session s(m.g, opts());
    s.run(loom::global_variables_initializer(m.g));
    CHECK(s.run(ada.get_slot(m.w, "accumulator"))(0) == doctest::Approx(0.1));
    CHECK(s.run(rms.get_slot(m.w, "rms"))(2) == 1.0);
    CHECK(s.run(rms.get_slot(m.w, "momentum"))(2) == 0.0);
  }
}

TEST_CASE("a tiny linear regression converges") {
  graph g;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> d(-1, 1);
  std::normal_distribution<double> noise(0, 0.01);
  std::vector<float> xs, ys;
  for (int i = 0; i < 64; ++i) {
    const double x = d(rng);
    xs.push_back(static_cast<float>(x));
    ys.push_back(static_cast<float>(3 * x + 2 + noise(rng)));
  }
  loom::placeholder<float, 2> x(g, shape{-1, 1}, "x");
  loom::placeholder<float, 2> y(g, shape{-1, 1}, "y");
  loom::variable<float, 2> w(g, "w", shape{1, 1}, loom::zeros_initializer{});
  loom::variable<float, 1> b(g, "b", shape{1}, loom::zeros_initializer{});
  auto loss = loom::reduce_mean(loom::square(loom::matmul(x, w) + b - y));
  loom::gradient_descent_optimizer opt(0.5);
  auto train = opt.minimize(loss);
  loom::session s(g, opts());
  s.run(loom::global_variables_initializer(g));
  const loom::feed_dict feeds{{x, tensor<float, 2>(shape{64, 1}, xs)},
                              {y, tensor<float, 2>(shape{64, 1}, ys)}};
  const float first = s.run(loss, feeds);
  for (int k = 0; k < 200; ++k)
    s.run(train, feeds);
  const float last = s.run(loss, feeds);
  CHECK(last < first / 1000);
  CHECK(last < 1e-3f);
  CHECK(s.run(w)(0, 0) == doctest::Approx(3.0).epsilon(0.02));
  CHECK(s.run(b)(0) == doctest::Approx(2.0).epsilon(0.02));
}

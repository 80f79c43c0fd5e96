// The host half of test_gpu_kernels: a g++ unit (the CPU kernels, which the
// .cu unit compares the GPU kernels with in one process, come from
// loom::kernels' objects, linked beside it) that runs the end-to-end checks that need the whole
// library: the MLP of examples/common/seed_mlp.hpp with an Adam step, built once with every node on
// /gpu:0 and once on the CPU, trained for five steps through loom::session on the same batches from
// the same initial weights.
//
// The weights' truncated_normal initializers run where their variables live (they are
// colocated, as in TF), and the GPU's random numbers follow the same distribution but are
// other numbers: so the GPU run starts from the CPU run's initial weights, assigned from
// placeholders after the initializer.
#include <doctest/doctest.h>

#include <loom/api.hpp>
#include <support/log_capture.hpp>
// The GPU backend (host-only) here too: it registers before this unit's test
// suites are (its registration comes first in this unit), so gpu_count() in
// the skip decorator below sees it whatever order the two units start in.
#include <loom/kernels/cuda/backend.hpp>
// Eigen::ThreadPool and the device over it (the CUDA headers declare cpu_device only).
#include <loom/kernels/cpu/cpu_pool.hpp>

#include "../../examples/common/seed_mlp.hpp"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

// The thread pool the .cu unit runs the CPU kernels on.
loom::kernels::cpu_device& host_device() {
  static Eigen::ThreadPool pool(2);
  static Eigen::ThreadPoolDevice device(&pool, 2);
  return device;
}

namespace {

// Every node on /gpu:0, or every node on the CPU.
struct mlp_placement {
  bool gpu;
  loom::device_spec operator()(const loom::node_def&, const loom::device_spec&) const {
    return loom::device_spec::from_string(gpu ? "/gpu:0" : "/cpu:0");
  }
};

loom::graph seeded_graph() {
  loom::graph g;
  g.set_random_seed(7);
  return g;
}

// make() with mlp_placement{gpu} as the device scope.
template <class F> auto placed(loom::graph& g, bool gpu, F&& make) {
  return g.on(mlp_placement{gpu}, std::forward<F>(make));
}

struct mlp_graph {
  loom::graph g;
  loom::variable<std::int64_t, 0> global_step;
  loom::examples::seed_mlp model;
  loom::adam_optimizer opt{0.001};
  loom::operation train;
  // Sets the random weights to given values (the other run's), after the initializer.
  loom::placeholder<float, 2> hid_w0{g, loom::shape{784, 64}, "hid_w0"};
  loom::placeholder<float, 2> sm_w0{g, loom::shape{64, 10}, "sm_w0"};
  loom::operation load_weights{
      loom::group(g, model.hid_w.assign(hid_w0), model.sm_w.assign(sm_w0))};

  explicit mlp_graph(bool gpu)
      : g(seeded_graph()), global_step(placed(g, gpu, [&] { return loom::create_global_step(g); })),
        model(placed(g, gpu, [&] { return loom::examples::seed_mlp(g, 64); })),
        train(placed(g, gpu, [&] { return opt.minimize(model.cross_entropy, global_step); })) {}
};

loom::tensor<float, 2> batch(std::mt19937& rng, std::int64_t rows, std::int64_t cols,
                             bool one_hot) {
  loom::tensor<float, 2> t(loom::shape{rows, cols}, 0.f);
  std::uniform_real_distribution<float> pixel(0.f, 1.f);
  std::uniform_int_distribution<std::int64_t> label(0, cols - 1);
  for (std::int64_t r = 0; r < rows; ++r) {
    if (one_hot)
      t(r, label(rng)) = 1.f;
    else
      for (std::int64_t c = 0; c < cols; ++c)
        t(r, c) = pixel(rng);
  }
  return t;
}

// What the checks compare, step by step, so that a difference says where it began: the
// initial weights, the first batch's loss before any update, then each step's loss and
// weights after it.
struct training_run {
  loom::tensor<float, 2> initial_hid_w, initial_sm_w;
  float forward_loss = 0;
  loom::tensor<float, 2> forward_y; // the softmax of the first batch, before any update
  std::vector<float> losses;
  std::vector<loom::tensor<float, 2>> hid_w, sm_w; // after each step
};

// One training step on (x, y), its loss and the weights after it recorded in `out`.
void train_step(loom::session& sess, mlp_graph& m, const loom::tensor<float, 2>& x,
                const loom::tensor<float, 2>& y, training_run& out) {
  auto [_, loss] =
      sess.run(loom::fetches(m.train, m.model.cross_entropy), {{m.model.x, x}, {m.model.y_, y}});
  out.losses.push_back(loss);
  out.hid_w.push_back(sess.run(m.model.hid_w));
  out.sm_w.push_back(sess.run(m.model.sm_w));
}

// Trains from the initializer's weights, or from `start`'s initial weights where given.
training_run train_mlp(bool gpu, std::uint32_t data_seed, const training_run* start = nullptr) {
  mlp_graph m(gpu);
  loom::session sess(m.g);
  sess.run(loom::global_variables_initializer(m.g));
  if (start)
    sess.run(m.load_weights, {{m.hid_w0, start->initial_hid_w}, {m.sm_w0, start->initial_sm_w}});
  std::mt19937 rng(data_seed);
  training_run out;
  out.initial_hid_w = sess.run(m.model.hid_w);
  out.initial_sm_w = sess.run(m.model.sm_w);
  for (int step = 0; step < 5; ++step) {
    const auto x = batch(rng, 32, 784, false);
    const auto y = batch(rng, 32, 10, true);
    if (step == 0) {
      out.forward_y = sess.run(m.model.y, {{m.model.x, x}});
      out.forward_loss = sess.run(m.model.cross_entropy, {{m.model.x, x}, {m.model.y_, y}});
    }
    train_step(sess, m, x, y, out);
  }
  return out;
}

// Ten steps on /gpu:0 from `start`'s initial weights, with CUDA graphs or without: step 5
// assigns the weights again first (the graph's variables may get new buffers), step 7 is
// fed half a batch (another shape, which runs without the graph).
training_run train_on_gpu(bool gpu_graphs, std::uint32_t data_seed, const training_run& start) {
  mlp_graph m(true);
  loom::session sess(m.g, loom::session_options{.gpu_graphs = gpu_graphs});
  sess.run(loom::global_variables_initializer(m.g));
  const loom::feed_dict weights{{m.hid_w0, start.initial_hid_w}, {m.sm_w0, start.initial_sm_w}};
  sess.run(m.load_weights, weights);
  std::mt19937 rng(data_seed);
  training_run out;
  for (int step = 0; step < 10; ++step) {
    if (step == 5)
      sess.run(m.load_weights, weights);
    const std::int64_t rows = step == 7 ? 16 : 32;
    const auto x = batch(rng, rows, 784, false);
    const auto y = batch(rng, rows, 10, true);
    train_step(sess, m, x, y, out);
  }
  return out;
}

double relative_l2(const loom::tensor<float, 2>& a, const loom::tensor<float, 2>& b) {
  double diff = 0, norm = 0;
  for (std::int64_t i = 0; i < a.size(); ++i) {
    const double x = a.flat()[static_cast<std::size_t>(i)];
    const double y = b.flat()[static_cast<std::size_t>(i)];
    diff += (x - y) * (x - y);
    norm += x * x;
  }
  return std::sqrt(diff / norm);
}

} // namespace

TEST_SUITE("cuda_host") {

  // Placement fails for a node without a GPU kernel: every op of a model and its
  // training step must have one, or the model cannot run on a GPU at all.
  TEST_CASE("every node of the MLP's training graph has a GPU kernel") {
    mlp_graph m(true);
    const auto& kernels = loom::kernels::kernel_registry::instance();
    int gpu_nodes = 0;
    for (std::size_t id = 0; id < m.g.size(); ++id) {
      const loom::node_def& n = m.g.node(static_cast<loom::node_id>(id));
      if (n.op == "placeholder" || n.requested_device.find("GPU") == std::string::npos)
        continue;
      const loom::detail::op_def& def = loom::detail::op_registry::instance().find(n.op);
      const loom::dtype t = def.type_input < 0 || n.inputs.empty()
                                ? n.type
                                : m.g.node(n.inputs[static_cast<std::size_t>(def.type_input)]).type;
      INFO(n.describe() << " with dtype " << loom::to_string(t));
      const bool has_gpu_kernel = kernels.find(n.op, t, loom::kernels::device_gpu) != nullptr;
      CHECK(has_gpu_kernel);
      ++gpu_nodes;
    }
    CHECK(gpu_nodes > 50);
  }

  // What the device case below relies on: a run starts from the weights it is given, not
  // from its initializer's (negated here, so that the two differ).
  TEST_CASE("an MLP run starts from given initial weights") {
    training_run given = train_mlp(false, 1);
    for (float& w : given.initial_hid_w.flat())
      w = -w;
    const training_run run = train_mlp(false, 1, &given);
    CHECK(relative_l2(given.initial_hid_w, run.initial_hid_w) == 0);
    CHECK(relative_l2(given.initial_sm_w, run.initial_sm_w) == 0);
  }

} // TEST_SUITE

TEST_SUITE("cuda_device" * doctest::skip(loom::gpu_count() == 0)) {

  TEST_CASE("an MLP trained on /gpu:0 through a session follows the CPU's losses") {
    const auto seed = std::random_device{}();
    INFO("data seed " << seed);
    const training_run cpu = train_mlp(false, seed);
    const training_run gpu = train_mlp(true, seed, &cpu);
    REQUIRE(relative_l2(cpu.initial_hid_w, gpu.initial_hid_w) == 0);
    REQUIRE(relative_l2(cpu.initial_sm_w, gpu.initial_sm_w) == 0);
    INFO("forward loss: cpu " << cpu.forward_loss << ", gpu " << gpu.forward_loss
                              << "; softmax off by " << relative_l2(cpu.forward_y, gpu.forward_y));
    CHECK(relative_l2(cpu.forward_y, gpu.forward_y) <= 1e-5);
    CHECK(std::abs(gpu.forward_loss - cpu.forward_loss) <= 1e-4 * std::abs(cpu.forward_loss));
    REQUIRE(cpu.losses.size() == gpu.losses.size());
    for (std::size_t i = 0; i < cpu.losses.size(); ++i) {
      INFO("step " << i << ": cpu loss " << cpu.losses[i] << ", gpu " << gpu.losses[i]
                   << "; hid_w after it off by " << relative_l2(cpu.hid_w[i], gpu.hid_w[i])
                   << ", sm_w by " << relative_l2(cpu.sm_w[i], gpu.sm_w[i]));
      CHECK(std::isfinite(gpu.losses[i]));
      CHECK(std::abs(gpu.losses[i] - cpu.losses[i]) <= 1e-3 * std::abs(cpu.losses[i]));
      CHECK(relative_l2(cpu.hid_w[i], gpu.hid_w[i]) <= 1e-3);
      CHECK(relative_l2(cpu.sm_w[i], gpu.sm_w[i]) <= 1e-3);
    }
  }

  TEST_CASE("an MLP step replayed from a CUDA graph computes what its kernels launched one by "
            "one compute") {
    const auto seed = std::random_device{}();
    INFO("data seed " << seed);
    const training_run start = train_mlp(false, seed);
    const auto level = loom::logging::current_level();
    loom::logging::set_level(loom::logging::level::debug);
    loom::testing::log_capture log;
    const training_run graphs = train_on_gpu(true, seed, start);
    loom::logging::set_level(level);
    const training_run launches = train_on_gpu(false, seed, start);
    INFO(log.text());
    CHECK(log.contains("runs as one CUDA graph"));
    CHECK(log.count("runs without it") == 1); // step 7's half batch
    CHECK_FALSE(log.contains("runs without a CUDA graph: a"));
    REQUIRE(graphs.losses.size() == launches.losses.size());
    for (std::size_t i = 0; i < graphs.losses.size(); ++i) {
      INFO("step " << i << ": loss with graphs " << graphs.losses[i] << ", without "
                   << launches.losses[i] << "; hid_w off by "
                   << relative_l2(launches.hid_w[i], graphs.hid_w[i]));
      CHECK(std::abs(graphs.losses[i] - launches.losses[i]) <= 1e-5 * std::abs(launches.losses[i]));
      CHECK(relative_l2(launches.hid_w[i], graphs.hid_w[i]) <= 1e-5);
      CHECK(relative_l2(launches.sm_w[i], graphs.sm_w[i]) <= 1e-5);
    }
  }

  TEST_CASE("loom::gpu_memory counts a step's tensors; a traced step's timeline shows them") {
    loom::graph g;
    loom::placeholder<float, 1> x(g, loom::shape{1 << 20}, "x");
    auto y = [&] {
      auto on_gpu = g.device("/gpu:0");
      return loom::lower(loom::square(x) * 2.0f);
    }();
    loom::session s(g);
    const loom::tensor<float, 1> in(loom::shape{1 << 20}, 1.0f);
    s.run(y, {{x, in}}); // GPU constants, cuBLAS: made once
    loom::reset_gpu_memory_peak(0);
    const loom::gpu_memory_info before = loom::gpu_memory(0);
    CHECK(before.peak == before.allocated);
    loom::run_metadata md;
    CHECK(s.run(y, {{x, in}}, {.trace_level = loom::trace_level::full}, &md)(5) == 2.0f);
    const loom::gpu_memory_info after = loom::gpu_memory(0);
    // x's copy on the GPU and y, 4 MiB each, held at once.
    CHECK(after.peak >= before.allocated + 2 * (std::int64_t{4} << 20));
    CHECK(after.allocated + after.cached >= 2 * (std::int64_t{4} << 20));
    REQUIRE(md.step_stats.tasks.size() == 1);
    const auto& memory = md.step_stats.tasks[0].gpu_memory;
    REQUIRE(memory.size() == 1);
    CHECK(memory[0].device == 0);
    CHECK(memory[0].peak >= 2 * (std::int64_t{4} << 20));
    const std::string json = loom::timeline(md).chrome_trace_json();
    CHECK(json.find(R"("name":"GPU:0 memory","ph":"C")") != std::string::npos);
    CHECK_THROWS_WITH_AS(loom::gpu_memory(loom::gpu_count()),
                         doctest::Contains("does not exist: this process has"),
                         loom::invalid_argument_error);
  }

} // TEST_SUITE

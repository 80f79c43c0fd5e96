// The host half of test_gpu_kernels: a g++ unit (the CPU kernels, which the
// .cu unit compares the GPU kernels with in one process, come from
// loom::kernels' objects, linked beside it) that runs the end-to-end checks that need the whole
// library: the MLP of examples/common/seed_mlp.hpp with an Adam step, built once with every node on
// /gpu:0 and once on the CPU, trained for five steps through loom::session on the same batches from
// the same initial weights.
//
// The weights' truncated_normal initializers stay on the CPU in both graphs:
// the GPU's random numbers follow the same distribution but are other
// numbers, and the two runs must start from the same weights to be compared.
#include <doctest/doctest.h>

#include <loom/api.hpp>
// The GPU backend (host-only) here too: it registers before this unit's test
// suites are (its registration comes first in this unit), so gpu_count() in
// the skip decorator below sees it whatever order the two units start in.
#include <loom/kernels/cuda/backend.hpp>

#include "../../examples/common/seed_mlp.hpp"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

// The thread pool the .cu unit runs the CPU kernels on.
loom::cpu_device& host_device() {
  static Eigen::ThreadPool pool(2);
  static Eigen::ThreadPoolDevice device(&pool, 2);
  return device;
}

namespace {

// Every node on /gpu:0 (or every node on the CPU), the random initializers on the CPU.
struct mlp_placement {
  bool gpu;
  loom::device_spec operator()(const loom::node_def& n, const loom::device_spec&) const {
    const bool random =
        n.op == "truncated_normal" || n.op == "random_normal" || n.op == "random_uniform";
    return loom::device_spec::from_string(gpu && !random ? "/gpu:0" : "/cpu:0");
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

struct training_run {
  std::vector<float> losses;
  loom::tensor<float, 2> hid_w, sm_w;
};

training_run train_mlp(bool gpu, std::uint32_t data_seed) {
  mlp_graph m(gpu);
  loom::session sess(m.g);
  sess.run(loom::global_variables_initializer(m.g));
  std::mt19937 rng(data_seed);
  training_run out;
  for (int step = 0; step < 5; ++step) {
    const auto x = batch(rng, 32, 784, false);
    const auto y = batch(rng, 32, 10, true);
    auto [_, loss] =
        sess.run(loom::fetches(m.train, m.model.cross_entropy), {{m.model.x, x}, {m.model.y_, y}});
    out.losses.push_back(loss);
  }
  out.hid_w = sess.run(m.model.hid_w);
  out.sm_w = sess.run(m.model.sm_w);
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
    const auto& kernels = loom::detail::kernel_registry::instance();
    int gpu_nodes = 0;
    for (std::size_t id = 0; id < m.g.size(); ++id) {
      const loom::node_def& n = m.g.node(static_cast<loom::node_id>(id));
      if (n.op == "placeholder" || n.requested_device.find("GPU") == std::string::npos)
        continue;
      const loom::op_def& def = loom::op_registry::instance().find(n.op);
      const loom::dtype t = def.type_input < 0 || n.inputs.empty()
                                ? n.type
                                : m.g.node(n.inputs[static_cast<std::size_t>(def.type_input)]).type;
      INFO(n.describe() << " with dtype " << loom::to_string(t));
      const bool has_gpu_kernel = kernels.find(n.op, t, loom::detail::device_gpu) != nullptr;
      CHECK(has_gpu_kernel);
      ++gpu_nodes;
    }
    CHECK(gpu_nodes > 50);
  }

} // TEST_SUITE

TEST_SUITE("cuda_device" * doctest::skip(loom::gpu_count() == 0)) {

  TEST_CASE("an MLP trained on /gpu:0 through a session follows the CPU's losses") {
    const auto seed = std::random_device{}();
    INFO("data seed " << seed);
    const training_run cpu = train_mlp(false, seed);
    const training_run gpu = train_mlp(true, seed);
    REQUIRE(cpu.losses.size() == gpu.losses.size());
    for (std::size_t i = 0; i < cpu.losses.size(); ++i) {
      INFO("step " << i << ": cpu " << cpu.losses[i] << ", gpu " << gpu.losses[i]);
      CHECK(std::isfinite(gpu.losses[i]));
      CHECK(std::abs(gpu.losses[i] - cpu.losses[i]) <= 1e-3 * std::abs(cpu.losses[i]));
    }
    CHECK(relative_l2(cpu.hid_w, gpu.hid_w) <= 1e-3);
    CHECK(relative_l2(cpu.sm_w, gpu.sm_w) <= 1e-3);
  }

} // TEST_SUITE

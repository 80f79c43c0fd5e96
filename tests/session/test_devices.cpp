// Nodes on a GPU in a local session, without CUDA: a stand-in GPU backend keeps
// "device" memory in host RAM under the location GPU:0 and runs stand-in GPU
// kernels (and fused regions' GPU kernels) that refuse inputs from anywhere
// else. What is tested is the executor's and the placer's part: where nodes
// go, which regions fuse, which copies are made (once per value and
// location), and that host code never reads device memory.
#include <doctest/doctest.h>
#include <support/cluster.hpp>
#include <support/log_capture.hpp>
#include <support/messages.hpp>

#include <loom/loom.hpp>

#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>

// What a GPU kernel launches on: cuda/backend.hpp defines it in a program with
// CUDA. This binary has none, and the stand-in backend gives its fused kernels
// an empty one.
namespace loom::kernels {
struct gpu_context {};
} // namespace loom::kernels

using loom::graph;
using loom::memory_location;
using loom::shape;
using loom::tensor;
using loom::testing::contains;
using loom::testing::message_of;

namespace {

// A copy of `t`'s bytes under the label `where`.
loom::any_tensor relabelled(const loom::any_tensor& t, memory_location where) {
  auto* p = new unsigned char[t.byte_size() + 1];
  std::memcpy(p, t.device_data(), t.byte_size());
  return loom::any_tensor::adopt(t.type(), t.shape(), where, p,
                                 [](void* q) { delete[] static_cast<unsigned char*>(q); });
}

class stand_in_gpu final : public loom::kernels::gpu_backend {
public:
  int to_device = 0, to_host = 0, kernels = 0, fused = 0, batches = 0;
  // Recording into a graph (runtime/captured_step.hpp), when `records`: the stand-in runs
  // what it records (it has nothing to defer it to), and a launch runs nothing: so a
  // replay's fetches are the recorded step's values, and its kernels count no runs.
  bool records = false;
  int recordings = 0, launches = 0, copies_into = 0, synchronizations = 0, peak_resets = 0;
  loom::gpu_memory_info memory_now{};

  int device_count() const noexcept override { return 1; }
  void run(int device, loom::kernels::kernel_fn kernel, loom::kernels::kernel_context& c) override {
    REQUIRE(device == 0);
    for (const loom::any_tensor* in : c.inputs)
      if (in)
        REQUIRE(in->location() == memory_location::gpu(0));
    ++kernels;
    kernel(c);
  }
  void run_batch(int device, loom::kernels::batch_kernel_fn kernel,
                 std::span<loom::kernels::kernel_context* const> contexts) override {
    REQUIRE(device == 0);
    for (const loom::kernels::kernel_context* c : contexts)
      for (const loom::any_tensor* in : c->inputs)
        if (in)
          REQUIRE(in->location() == memory_location::gpu(0));
    ++batches;
    kernel(contexts);
  }
  bool run_fused(int device, loom::kernels::gpu_fused_kernel_fn kernel,
                 std::span<const loom::any_tensor* const> leaves, loom::any_tensor& out,
                 const std::string& node_name) override {
    REQUIRE(device == 0);
    for (const loom::any_tensor* in : leaves)
      REQUIRE(in->location() == memory_location::gpu(0));
    ++fused;
    return kernel(context_, leaves, out, node_name);
  }
  loom::any_tensor copy(const loom::any_tensor& t, memory_location where) override {
    ++(where.on_host() ? to_host : to_device);
    if (where.on_host()) {
      loom::any_tensor out(t.type(), t.shape());
      std::memcpy(out.raw_data(), t.device_data(), t.byte_size());
      return out;
    }
    return relabelled(t, where);
  }

  bool can_capture() const noexcept override { return records; }
  std::unique_ptr<capture> begin_capture(int device) override {
    REQUIRE(device == 0);
    ++recordings;
    return std::make_unique<stand_in_capture>(*this);
  }
  loom::gpu_memory_info memory(int device) const override {
    REQUIRE(device == 0);
    return memory_now;
  }
  void reset_memory_peak(int device) override {
    REQUIRE(device == 0);
    ++peak_resets;
  }
  void copy_into(loom::any_tensor& to, const loom::any_tensor& from) override {
    REQUIRE(to.shape() == from.shape());
    ++copies_into;
    if (to.on_host()) { // a fetch, into the host's (here ordinary) staging memory
      REQUIRE(from.location() == memory_location::gpu(0));
      std::memcpy(to.raw_data(), from.device_data(), from.byte_size());
      return;
    }
    REQUIRE(to.location() == memory_location::gpu(0));
    std::memcpy(to.device_data(), from.on_host() ? from.raw_data() : from.device_data(),
                from.byte_size());
  }
  void synchronize(int device) override {
    REQUIRE(device == 0);
    ++synchronizations;
  }

private:
  struct stand_in_graph final : graph {
    explicit stand_in_graph(stand_in_gpu& g) : gpu(g) {}
    void launch() override { ++gpu.launches; }
    stand_in_gpu& gpu;
  };
  struct stand_in_capture final : capture {
    explicit stand_in_capture(stand_in_gpu& g) : gpu(g) {}
    std::unique_ptr<graph> finish(std::string&) override {
      return std::make_unique<stand_in_graph>(gpu);
    }
    stand_in_gpu& gpu;
  };

  loom::kernels::gpu_context context_;
};

// Registered for one test case: other tests of this binary see no GPU.
struct registered_gpu {
  stand_in_gpu gpu;
  registered_gpu() { loom::kernels::gpu_backend::register_backend(&gpu); }
  ~registered_gpu() { loom::kernels::gpu_backend::register_backend(nullptr); }
};

// Stand-in GPU kernels: square and add of float32 (add without broadcasting).
void gpu_square(loom::kernels::kernel_context& c) {
  const loom::any_tensor& x = c.input(0);
  loom::any_tensor out(x.type(), x.shape());
  const float* in = x.device_data<float>();
  for (std::int64_t i = 0; i < x.num_elements(); ++i)
    out.data<float>()[i] = in[i] * in[i];
  c.output = relabelled(out, memory_location::gpu(0));
}
void gpu_add(loom::kernels::kernel_context& c) {
  const loom::any_tensor& a = c.input(0);
  const loom::any_tensor& b = c.input(1);
  REQUIRE(a.shape() == b.shape());
  loom::any_tensor out(a.type(), a.shape());
  for (std::int64_t i = 0; i < a.num_elements(); ++i)
    out.data<float>()[i] = a.device_data<float>()[i] + b.device_data<float>()[i];
  c.output = relabelled(out, memory_location::gpu(0));
}
const loom::kernels::kernel_registration square_on_gpu("square", loom::dtype::f32, &gpu_square,
                                                       loom::kernels::device_gpu);
const loom::kernels::kernel_registration add_on_gpu("add", loom::dtype::f32, &gpu_add,
                                                    loom::kernels::device_gpu);
int gpu_constants_made = 0;
void gpu_constant(loom::kernels::kernel_context& c) {
  ++gpu_constants_made;
  c.output = relabelled(c.node.attr<loom::any_tensor>("value"), memory_location::gpu(0));
}
const loom::kernels::kernel_registration constant_on_gpu("constant", loom::dtype::f32,
                                                         &gpu_constant, loom::kernels::device_gpu);

// Stand-in GPU kernels of fused regions (a unit compiled by nvcc registers
// real ones: kernels/cuda/fused.cuh): square(a) + b in one pass, and one that
// declines every shape, as a real one declines general broadcasting.
bool gpu_square_plus(const loom::kernels::gpu_context&,
                     std::span<const loom::any_tensor* const> leaves, loom::any_tensor& out,
                     const std::string&) {
  REQUIRE(leaves.size() == 2);
  const loom::any_tensor& a = *leaves[0];
  const loom::any_tensor& b = *leaves[1];
  loom::any_tensor r(a.type(), a.shape());
  for (std::int64_t i = 0; i < a.num_elements(); ++i)
    r.data<float>()[i] =
        a.device_data<float>()[i] * a.device_data<float>()[i] + b.device_data<float>()[i];
  out = relabelled(r, memory_location::gpu(0));
  return true;
}
bool gpu_declines(const loom::kernels::gpu_context&, std::span<const loom::any_tensor* const>,
                  loom::any_tensor&, const std::string&) {
  return false;
}

loom::session_options two_intra_op_threads() {
  return {.intra_op_threads = 2};
}

} // namespace

TEST_CASE("a tensor in device memory: host reads fail with a message, copies need a backend") {
  loom::any_tensor host = loom::any_tensor::from_vector<float>(shape{2}, {1, 2});
  loom::any_tensor dev = relabelled(host, memory_location::gpu(0));
  CHECK(dev.location() == memory_location::gpu(0));
  CHECK(dev.describe() == "float32[2] on GPU:0");
  const auto msg = message_of<loom::internal_error>([&] { (void)dev.data<float>(); });
  CHECK(contains(msg, "float32[2] on GPU:0 was read as host memory"));
  CHECK(message_of<loom::internal_error>([&] { (void)dev.clone(); }) == msg);
  CHECK(contains(message_of<loom::internal_error>(
                     [&] { (void)loom::kernels::at_location(host, memory_location::gpu(0)); }),
                 "no GPU backend"));
  CHECK(loom::kernels::at_location(host, memory_location::host()).shares_buffer_with(host));
}

TEST_CASE("loom::pinned_tensor is a host tensor, in ordinary memory where no backend pins it") {
  const auto check_usable = [](loom::tensor<float, 2> t) {
    CHECK(t.value().location() == memory_location::host());
    CHECK(t.shape() == shape{3, 5});
    for (float& v : t.flat())
      v = 2.5f;
    CHECK(t(2, 4) == 2.5f);
  };
  check_usable(loom::pinned_tensor<float, 2>(shape{3, 5})); // no backend
  {
    registered_gpu r; // the stand-in keeps gpu_backend's default: ordinary memory
    check_usable(loom::pinned_tensor<float, 2>(shape{3, 5}));
  }
  CHECK(message_of<loom::invalid_argument_error>([] {
          (void)loom::pinned_tensor<float, 2>(shape{15});
        }) == "invalid argument: loom::pinned_tensor: shape [15] for a tensor of rank 2");
}

TEST_CASE("nodes on /gpu:0 run their GPU kernels; each value is copied once per place it is read") {
  registered_gpu r;
  graph g;
  loom::placeholder<float, 1> x(g, shape{3}, "x");
  auto [squared, twice] = [&] {
    auto _ = g.device("/gpu:0");
    auto sq = loom::lower(loom::square(x));
    return std::pair{sq, loom::lower(sq + sq)};
  }();
  auto on_cpu = loom::lower(squared * 3.0f); // no request: the CPU
  loom::session s(g, two_intra_op_threads());
  const auto in = tensor<float, 1>(shape{3}, {1, -2, 3});
  auto [sq, tw, cpu] = s.run(loom::fetches(squared, twice, on_cpu), {{x, in}});
  CHECK(sq(1) == 4.0f);
  CHECK(tw(2) == 18.0f);
  CHECK(cpu(1) == 12.0f);
  CHECK(r.gpu.kernels == 2);
  CHECK(r.gpu.to_device == 1); // x, once
  CHECK(r.gpu.to_host == 2);   // squared (read by the CPU node and fetched), twice (fetched)
}

TEST_CASE("on<gpu>(expression) lowers it on the GPU of the scopes' task; on<cpu> on the CPU") {
  registered_gpu r;
  graph g;
  loom::placeholder<float, 1> x(g, shape{2}, "x");
  auto sq = loom::on<loom::gpu>(loom::square(x));
  auto back = loom::on<loom::cpu>(loom::square(sq));
  CHECK(g.node(sq.id()).requested_device == "/device:GPU:0");
  CHECK(g.node(back.id()).requested_device == "/device:CPU:0");
  loom::session s(g, two_intra_op_threads());
  CHECK(s.run(back, {{x, tensor<float, 1>(shape{2}, {2, -3})}})(1) == 81.0f);
  CHECK(r.gpu.kernels == 1);
}

TEST_CASE(
    "a GPU request for an op without a GPU kernel: an error, or the CPU with soft placement") {
  registered_gpu r;
  graph g;
  loom::placeholder<float, 1> x(g, shape{2}, "x");
  auto e = [&] {
    auto _ = g.device("/gpu:0");
    return loom::lower(loom::exp(x));
  }();
  const auto in = tensor<float, 1>(shape{2}, {0, 0});
  SUBCASE("without soft placement") {
    loom::session s(g, two_intra_op_threads());
    const auto msg = message_of<loom::invalid_argument_error>([&] { s.run(e, {{x, in}}); });
    CHECK(contains(msg, e.name()));
    CHECK(contains(msg, "GPU"));
  }
  SUBCASE("with soft placement") {
    std::ostringstream log;
    auto o = two_intra_op_threads();
    o.allow_soft_placement = true;
    o.placement_log = &log;
    loom::session s(g, o);
    CHECK(s.run(e, {{x, in}})(1) == 1.0f);
    CHECK(r.gpu.kernels == 0);
    CHECK(contains(log.str(), "soft placement of operation '" + e.name() + "'"));
  }
  SUBCASE("a GPU the process lacks") {
    graph h;
    loom::placeholder<float, 1> hx(h, shape{2}, "x");
    auto far = [&] {
      auto _ = h.device("/gpu:1");
      return loom::lower(loom::square(hx));
    }();
    loom::session s(h, two_intra_op_threads());
    const auto msg = message_of<loom::invalid_argument_error>([&] { s.run(far, {{hx, in}}); });
    CHECK(contains(msg, "/job:localhost/replica:0/task:0/device:GPU:0"));
  }
}

TEST_CASE("a fused CPU region reads GPU values on the host") {
  registered_gpu r;
  graph g;
  loom::placeholder<float, 1> x(g, shape{4}, "x");
  auto sq = [&] {
    auto _ = g.device("/gpu:0");
    return loom::lower(loom::square(x));
  }();
  auto fused = loom::lower(loom::relu(sq * 2.0f - 5.0f) + sq); // one elementwise region
  loom::session s(g, two_intra_op_threads());
  const auto out = s.run(fused, {{x, tensor<float, 1>(shape{4}, {1, 2, 3, -4})}});
  CHECK(out(0) == 1.0f);  // relu(2 - 5) + 1
  CHECK(out(2) == 22.0f); // relu(18 - 5) + 9
  CHECK(r.gpu.to_host == 1);
}

TEST_CASE("a region on /gpu:0 runs as one GPU kernel where the process has the region's") {
  registered_gpu r;
  graph g;
  loom::placeholder<float, 1> x(g, shape{3}, "x");
  auto tree = loom::square(x) + x;
  loom::kernels::fused_kernel_registry::instance().add(loom::detail::region_key<decltype(tree)>(),
                                                       &gpu_square_plus);
  // Written outside any scope: on<gpu> puts the tree's nodes on GPU 0.
  auto y = loom::on<loom::gpu>(tree);
  loom::session s(g, two_intra_op_threads());
  const auto out = s.run(y, {{x, tensor<float, 1>(shape{3}, {1, -2, 3})}});
  CHECK(out(0) == 2.0f);
  CHECK(out(1) == 2.0f);
  CHECK(out(2) == 12.0f);
  CHECK(r.gpu.fused == 1);
  CHECK(r.gpu.kernels == 0);   // not square and add
  CHECK(r.gpu.to_device == 1); // x, once, though the region reads it twice
  CHECK(r.gpu.to_host == 1);   // the fetch
}

TEST_CASE("a region on /gpu:0 runs as its primitive GPU kernels where the fused kernel declines "
          "or the process has none") {
  registered_gpu r;
  graph g;
  loom::placeholder<float, 1> x(g, shape{3}, "x");
  auto declined = loom::square(loom::square(x)) + x;
  loom::kernels::fused_kernel_registry::instance().add(
      loom::detail::region_key<decltype(declined)>(), &gpu_declines);
  auto y = loom::on<loom::gpu>(declined);
  // The CPU's fused kernel of x + square(x) is registered; a GPU one is not.
  auto z = [&] {
    auto _ = g.device("/gpu:0");
    return loom::lower(x + loom::square(x)); // written inside the scope
  }();
  loom::session s(g, two_intra_op_threads());
  const auto feed = tensor<float, 1>(shape{3}, {1, -2, 3});
  const auto out = s.run(y, {{x, feed}});
  CHECK(out(0) == 2.0f);
  CHECK(out(1) == 14.0f);
  CHECK(out(2) == 84.0f);
  CHECK(r.gpu.fused == 1);
  CHECK(r.gpu.kernels == 3); // square, square, add
  r.gpu.fused = r.gpu.kernels = 0;
  const auto out2 = s.run(z, {{x, feed}});
  CHECK(out2(1) == 2.0f);
  CHECK(r.gpu.fused == 0);
  CHECK(r.gpu.kernels == 2); // square, add
}

TEST_CASE("a constant on /gpu:0 is made once per plan, not once per step") {
  registered_gpu r;
  graph g;
  loom::placeholder<float, 1> x(g, shape{3}, "x");
  auto y = [&] {
    auto _ = g.device("/gpu:0");
    auto c = loom::constant(g, tensor<float, 1>(shape{3}, {10, 20, 30}), "c");
    return loom::lower(c + loom::square(x)); // a region without a GPU fused kernel
  }();
  loom::session s(g, two_intra_op_threads());
  gpu_constants_made = 0;
  for (float step = 1; step <= 3; ++step) {
    const auto out = s.run(y, {{x, tensor<float, 1>(shape{3}, {step, 0, -1})}});
    CHECK(out(0) == step * step + 10);
    CHECK(out(2) == 31.0f);
  }
  CHECK(gpu_constants_made == 1);
  CHECK(r.gpu.kernels == 1 + 3 * 2); // the constant once; square and add every step
}

// A stand-in batch kernel of square: each context's square, and how many it ran.
std::vector<std::size_t> square_batches;
void gpu_square_batch(std::span<loom::kernels::kernel_context* const> contexts) {
  square_batches.push_back(contexts.size());
  for (loom::kernels::kernel_context* c : contexts)
    gpu_square(*c);
}

TEST_CASE("GPU nodes ready together that share a batch kernel run as one call") {
  registered_gpu r;
  loom::kernels::kernel_registry::instance().add_batch(
      "square", loom::dtype::f32, loom::kernels::device_gpu, &gpu_square_batch);
  square_batches.clear();
  graph g;
  loom::placeholder<float, 1> x(g, shape{3}, "x");
  loom::placeholder<float, 1> y(g, shape{3}, "y");
  const auto on_gpu = g.device("/gpu:0");
  auto a = loom::lower(loom::square(x));
  auto b = loom::lower(loom::square(y));
  auto c = loom::lower(loom::square(a)); // waits for a: not ready beside it
  loom::session s(g, {.intra_op_threads = 2, .disable_fusion = true, .gpu_graphs = false});
  const auto [ta, tb, tc] =
      s.run(loom::fetches(a, b, c), {{x, tensor<float, 1>(shape{3}, {1, 2, 3})},
                                     {y, tensor<float, 1>(shape{3}, {4, 5, 6})}});
  loom::kernels::kernel_registry::instance().add_batch("square", loom::dtype::f32,
                                                       loom::kernels::device_gpu, nullptr);
  CHECK(ta(2) == 9.0f);
  CHECK(tb(0) == 16.0f);
  CHECK(tb(2) == 36.0f);
  CHECK(tc(1) == 16.0f);
  CHECK(tc(2) == 81.0f);
  // a and b in one call; c alone, as its kernel.
  CHECK(square_batches == std::vector<std::size_t>{2});
  CHECK(r.gpu.batches == 1);
  CHECK(r.gpu.kernels == 1);
}

TEST_CASE("a traced step records the GPU's memory at its end; its peak is the step's") {
  registered_gpu r;
  graph g;
  loom::placeholder<float, 1> x(g, shape{3}, "x");
  auto y = [&] {
    auto _ = g.device("/gpu:0");
    return loom::lower(loom::square(x));
  }();
  loom::session s(g, two_intra_op_threads());
  const auto in = tensor<float, 1>(shape{3}, {1, 2, 3});
  s.run(y, {{x, in}});
  CHECK(r.gpu.peak_resets == 0); // untraced: nothing asked, nothing reset
  r.gpu.memory_now = {.allocated = 100, .cached = 20, .peak = 300};
  loom::run_metadata md;
  s.run(y, {{x, in}}, {.trace_level = loom::trace_level::full}, &md);
  CHECK(r.gpu.peak_resets == 1);
  REQUIRE(md.step_stats.tasks.size() == 1);
  const auto& memory = md.step_stats.tasks[0].gpu_memory;
  REQUIRE(memory.size() == 1);
  CHECK(memory[0].device == 0);
  CHECK(memory[0].allocated == 100);
  CHECK(memory[0].cached == 20);
  CHECK(memory[0].peak == 300);
  r.gpu.memory_now = {}; // a GPU that holds nothing is left out
  s.run(y, {{x, in}}, {.trace_level = loom::trace_level::full}, &md);
  CHECK(md.step_stats.tasks[0].gpu_memory.empty());
}

TEST_CASE("a step on one GPU is recorded at its third run and replayed from then on") {
  registered_gpu r;
  r.gpu.records = true;
  graph g;
  loom::placeholder<float, 1> x(g, shape{-1}, "x");
  auto y = [&] {
    auto _ = g.device("/gpu:0");
    return loom::lower(loom::square(x) + x);
  }();
  const auto fed = [](float v, std::int64_t n = 3) {
    return tensor<float, 1>(shape{n}, std::vector<float>(static_cast<std::size_t>(n), v));
  };
  SUBCASE("recorded once, replayed with the feeds copied into the graph's buffers") {
    loom::session s(g, {.intra_op_threads = 2, .disable_fusion = true});
    for (float v = 1; v <= 3; ++v) // as always, watched, recorded (and run once)
      CHECK(s.run(y, {{x, fed(v)}})(0) == v * v + v);
    CHECK(r.gpu.kernels == 3 * 2); // square and add, each run
    CHECK(r.gpu.recordings == 1);
    CHECK(r.gpu.launches == 1);
    for (float v = 4; v <= 5; ++v) // replayed: the stand-in's graph computes nothing, so the
      CHECK(s.run(y, {{x, fed(v)}})(0) == 12.0f); // fetch is the recorded run's value
    CHECK(r.gpu.kernels == 6);
    CHECK(r.gpu.launches == 3);
    // Per replay: the feed into the graph's buffer, the fetch into its staging buffer, and
    // one wait for both.
    CHECK(r.gpu.copies_into == 2 * 2);
    CHECK(r.gpu.synchronizations == 2);
    // Another shape runs as always, said once.
    loom::testing::log_capture log;
    CHECK(s.run(y, {{x, fed(6, 4)}})(3) == 42.0f);
    CHECK(s.run(y, {{x, fed(7, 4)}})(3) == 56.0f);
    CHECK(r.gpu.kernels == 10);
    CHECK(r.gpu.launches == 3);
    CHECK(log.count("runs without it") == 1);
  }
  SUBCASE("not with gpu_graphs off") {
    loom::session s(g, {.intra_op_threads = 2, .disable_fusion = true, .gpu_graphs = false});
    for (float v = 1; v <= 5; ++v)
      CHECK(s.run(y, {{x, fed(v)}})(0) == v * v + v);
    CHECK(r.gpu.recordings == 0);
    CHECK(r.gpu.kernels == 10);
  }
  SUBCASE("not when a node of the step runs on the host, said at debug level") {
    auto z = loom::lower(y * 2.0f); // placed on the CPU: no device scope
    const auto level = loom::logging::current_level();
    loom::logging::set_level(loom::logging::level::debug);
    loom::testing::log_capture log;
    loom::session s(g, {.intra_op_threads = 2, .disable_fusion = true});
    for (float v = 1; v <= 5; ++v)
      CHECK(s.run(z, {{x, fed(v)}})(0) == 2 * (v * v + v));
    loom::logging::set_level(level);
    CHECK(r.gpu.recordings == 0);
    CHECK(log.contains("runs without a CUDA graph: node"));
    CHECK(log.contains("runs on the host"));
  }
}

TEST_CASE("on a cluster, a worker's /gpu:0 nodes run on its GPU; the ps's variable reaches them "
          "through the host") {
  registered_gpu r;
  loom::testing::local_cluster cluster(1, 1);
  graph g;
  std::optional<loom::variable<float, 1>> v;
  {
    auto _ = g.device("/job:ps/task:0");
    v.emplace(g, "v", shape{3}, loom::constant_initializer{-2});
  }
  auto doubled_square = [&] {
    auto _ = g.device("/job:worker/task:0/gpu:0");
    return loom::lower(loom::square(*v) + loom::square(*v));
  }();
  std::ostringstream log;
  auto o = loom::testing::quiet();
  o.log_device_placement = true;
  o.placement_log = &log;
  loom::session s(g, loom::session_target(cluster.target()), o);
  s.run(loom::global_variables_initializer(g));
  CHECK(s.run(doubled_square)(2) == 8.0f);
  CHECK(r.gpu.kernels == 2);   // square (one node: lowering shares it) and add
  CHECK(r.gpu.to_device == 1); // v, received from the ps on the host
  CHECK(r.gpu.to_host == 1);   // the fetch
  CHECK(contains(log.str(),
                 doubled_square.name() + ": (add): /job:worker/replica:0/task:0/device:GPU:0"));
}

TEST_CASE("on a cluster, a node asked on another task's GPU runs there: the master asks that task "
          "for its GPUs") {
  registered_gpu r;
  loom::testing::local_cluster cluster(1, 2);
  graph g;
  loom::placeholder<float, 1> x(g, shape{3}, "x");
  auto on_task1 = g.on("/job:worker/task:1/gpu:0", [&] { return loom::lower(loom::square(x)); });
  // No task: any ps task's GPU.
  auto on_job = g.on("/job:ps/gpu:0", [&] { return loom::lower(on_task1 + on_task1); });
  std::ostringstream log;
  auto o = loom::testing::quiet();
  o.log_device_placement = true;
  o.placement_log = &log;
  loom::session s(g, loom::session_target(cluster.target()), o); // worker 0 is the target
  const auto out = s.run(on_job, {{x, tensor<float, 1>(shape{3}, {1, -2, 3})}});
  CHECK(out(1) == 8.0f);
  CHECK(r.gpu.kernels == 2);
  INFO(log.str());
  CHECK(contains(log.str(),
                 on_task1.name() + ": (square): /job:worker/replica:0/task:1/device:GPU:0"));
  CHECK(contains(log.str(), on_job.name() + ": (add): /job:ps/replica:0/task:0/device:GPU:0"));
}

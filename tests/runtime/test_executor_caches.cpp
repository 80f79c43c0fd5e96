// What the executor keeps between steps: a plan looks each of its variables
// up by name once (resource_access::variable: two attribute reads and two map
// finds) and keeps it while the resources' generation() is unchanged; after a
// reset() it asks again, and never touches a variable the reset destroyed; a
// plan item decodes its kernel's attributes once.
#include <loom/api.hpp>
#include <loom/kernels/cpu/cpu_pool.hpp> // Eigen::ThreadPool and the device over it
#include <loom/runtime/executor.hpp>
#include <loom/runtime/resource_manager.hpp>

#include <doctest/doctest.h>
#include <support/messages.hpp>

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <latch>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using loom::testing::contains;

// A resource_manager that counts the lookups of variables by name.
class counting_resources final : public loom::kernels::resource_access {
public:
  loom::kernels::variable_resource& variable(const loom::node_def& n) override {
    ++lookups;
    return inner.variable(n);
  }
  std::mt19937_64& random_engine(const loom::node_def& n, std::uint64_t seed) override {
    return inner.random_engine(n, seed);
  }
  std::shared_ptr<loom::kernels::resource_base>
  resource(const std::string& container, const std::string& name,
           const std::function<std::shared_ptr<loom::kernels::resource_base>()>& make) override {
    return inner.resource(container, name, make);
  }
  using resource_access::resource;
  std::uint64_t generation() const noexcept override { return inner.generation(); }

  loom::detail::resource_manager inner;
  int lookups = 0;
};

} // namespace

TEST_CASE("a plan looks its variables up once per generation of the resources") {
  loom::graph g;
  loom::variable<float, 1> v(g, "v", loom::shape{2}, loom::ones_initializer{});
  const auto doubled = loom::lower(v * 2.0f); // a step that reads v (reread_variables)
  const loom::detail::plan init(g, {{}, {v.initializer().id()}, {}});
  const loom::detail::plan read(g, {{doubled.id()}, {}, {}});
  loom::detail::plan_caches init_caches(init), read_caches(read);
  Eigen::ThreadPool pool(2);
  const loom::kernels::cpu_device device(&pool, 2);
  counting_resources resources;
  auto run = [&](const loom::detail::plan& p) {
    return loom::detail::run_plan(p, &p == &init ? init_caches : read_caches, g, {}, device,
                                  resources);
  };

  run(init);
  CHECK(resources.lookups == 1); // the assign's ref
  for (int step = 0; step < 3; ++step) {
    const auto values = run(read);
    CHECK(values.at(0).data<float>()[1] == 2.0f);
  }
  CHECK(resources.lookups == 2); // v's own step, once; its reader and later steps kept it

  // reset() destroys v's variable and changes the generation: the plan asks
  // again and finds the new, uninitialised one (a kept pointer would read freed memory).
  const std::uint64_t before = resources.generation();
  resources.inner.reset();
  CHECK(resources.generation() != before);
  CHECK(resources.generation() != loom::detail::resource_manager().generation());
  std::string error;
  try {
    run(read);
  } catch (const loom::error& e) {
    error = e.what();
  }
  CHECK(contains(error, "uninitialized"));
  CHECK(resources.lookups == 3);
  run(init);
  CHECK(run(read).at(0).data<float>()[0] == 2.0f);
  CHECK(resources.lookups == 4); // the init plan's cache was of the old generation too
}

// The tensors' block cache (core/block_cache.hpp): a released block serves the
// next tensor of its size class, and never a block a live tensor holds.
TEST_CASE("the block cache reuses a released tensor's memory and never a live one's") {
  using loom::detail::block_cache;
  if (!block_cache::keeps_blocks) {
    MESSAGE("skipped: built with AddressSanitizer, the block cache keeps nothing");
    return;
  }
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{300}, std::int64_t{50'000},
                               std::int64_t{100'003}}) { // 4 B to 400 KB (exact-size blocks)
    CAPTURE(n);
    const void* released = nullptr;
    {
      const loom::any_tensor a(loom::dtype::f32, loom::shape{n});
      released = a.raw_data();
    }
    const loom::any_tensor b(loom::dtype::f32, loom::shape{n}); // takes the released block
    CHECK(b.raw_data() == released);
    const loom::any_tensor c(loom::dtype::f32, loom::shape{n}); // b still holds it
    CHECK(c.raw_data() != b.raw_data());
    const loom::any_tensor shared = b; // a copy shares b's buffer: b's block stays b's
    CHECK(shared.raw_data() == b.raw_data());
  }
  // Sizes of one class share blocks; a block is at least what was asked for.
  CHECK(block_cache::block_bytes(1000) == block_cache::block_bytes(1010));
  for (std::size_t bytes = 1; bytes < block_cache::large_bytes; bytes += bytes / 7 + 1) {
    CAPTURE(bytes);
    CHECK(block_cache::block_bytes(bytes) >= bytes);
    CHECK(block_cache::block_bytes(bytes) <= std::max<std::size_t>(64, bytes + bytes / 4));
  }
  const void* released = nullptr;
  {
    const loom::any_tensor a(loom::dtype::f32, loom::shape{250}); // 1000 bytes
    released = a.raw_data();
  }
  const loom::any_tensor b(loom::dtype::f32, loom::shape{252}); // 1008 bytes, same class
  CHECK(b.raw_data() == released);
}

namespace {

// A step's rendezvous that holds the recvs' callbacks until the test delivers
// their values and records how many sends each flush carried (a flush with
// sends is one message to their task, step_transfers.hpp).
class held_rendezvous final : public loom::detail::step_rendezvous {
public:
  void send(const loom::detail::transfer_def&, const loom::any_tensor&) override { ++held; }
  void recv(const loom::detail::transfer_def& t, recv_done done) override {
    waiting.emplace(t.key, std::move(done));
  }
  void flush() override {
    if (held > 0)
      messages.push_back(held);
    held = 0;
  }
  void deliver(const std::string& key) {
    auto done = std::move(waiting.at(key));
    waiting.erase(key);
    done(loom::any_tensor(loom::dtype::f32, loom::shape{2}), nullptr);
  }

  std::map<std::string, recv_done> waiting;
  int held = 0;
  std::vector<int> messages;
};

} // namespace

// #23: a ps's step is suspended waiting for a worker's ids, which arrive in one
// rendezvous_put of ~100 tensors. Resumed by each in turn, it ran one gather,
// flushed and sent that table's rows as a message of its own: ~107 messages a step.
TEST_CASE("the values of one message resume a suspended step once: one message for the sends "
          "they make ready") {
  loom::graph g;
  std::vector<loom::node_id> sends;
  for (const char* key : {"a", "b", "c"}) {
    const auto r = g.add_node("_recv", {},
                              {{"key", std::string(key)},
                               {"src_task", std::string("/job:ps/task:0")},
                               {"dtype", loom::dtype::f32},
                               {"shape", loom::shape{2}}});
    sends.push_back(g.add_node(
        "_send", {r},
        {{"key", std::string(key) + "'"}, {"dst_task", std::string("/job:worker/task:0")}}));
  }
  const loom::detail::plan p(g, {{}, sends, {}});
  loom::detail::plan_caches caches(p);
  Eigen::ThreadPool pool(2);
  const loom::kernels::cpu_device device(&pool, 2);
  loom::detail::resource_manager resources;

  auto start = [&](held_rendezvous& rz, bool& ended) {
    loom::detail::start_plan(p, caches, g, {}, device, resources, rz,
                             [&ended](std::vector<loom::any_tensor>&, std::exception_ptr e) {
                               CHECK_FALSE(e);
                               ended = true;
                             });
    REQUIRE(rz.waiting.size() == 3); // suspended, waiting for all three
  };

  SUBCASE("delivered in one batch (the task server's rendezvous_put)") {
    held_rendezvous rz;
    bool ended = false;
    start(rz, ended);
    {
      loom::detail::arrival_batch batch;
      rz.deliver("a");
      rz.deliver("b");
      rz.deliver("c");
      CHECK(rz.messages.empty()); // resumed once, at the end of the batch
      batch.run();
    }
    CHECK(ended);
    CHECK(rz.messages == std::vector<int>{3});
  }
  SUBCASE("delivered one by one, without a batch") {
    held_rendezvous rz;
    bool ended = false;
    start(rz, ended);
    rz.deliver("a");
    rz.deliver("b");
    rz.deliver("c");
    CHECK(ended);
    CHECK(rz.messages == std::vector<int>{1, 1, 1});
  }
}

TEST_CASE("an intra-op pool's threads: the option, else LOOM_INTRA_OP_THREADS, else one per "
          "CPU the process may run on; a bad LOOM_INTRA_OP_THREADS is one clear error") {
  const auto with = [](std::optional<std::string> value) -> loom::environment {
    return [value](const std::string& name) {
      return name == "LOOM_INTRA_OP_THREADS" ? value : std::nullopt;
    };
  };
  const int cores = loom::detail::schedulable_cpus();
  CHECK(cores >= 1);
  CHECK(loom::detail::intra_op_threads(0, with(std::nullopt)) == cores);
  CHECK(loom::detail::intra_op_threads(0, with("")) == cores);
  CHECK(loom::detail::intra_op_threads(0, with("3")) == 3);
  CHECK(loom::detail::intra_op_threads(2, with("3")) == 2); // the option wins
  for (const char* bad : {"0", "-2", "two", "3x", "99999"}) {
    CAPTURE(bad);
    const auto what = loom::testing::message_of<loom::invalid_argument_error>(
        [&] { loom::detail::intra_op_threads(0, with(bad)); });
    CHECK(contains(what, "LOOM_INTRA_OP_THREADS is \"" + std::string(bad) + "\""));
  }
}

namespace {
cpu_set_t process_cpus() {
  cpu_set_t all;
  CPU_ZERO(&all);
  ::sched_getaffinity(0, sizeof all, &all);
  return all;
}
} // namespace

// A thread bound to one CPU (as mpirun --bind-to core or Slurm's binding binds a task) sizes
// its pool to that CPU, not to the machine's hardware threads. Skipped where the process
// may run on one CPU only: a one-CPU mask would then show nothing.
TEST_CASE("an intra-op pool's default follows the CPU affinity mask" * doctest::skip([] {
            const cpu_set_t all = process_cpus();
            return CPU_COUNT(&all) < 2;
          }())) {
  const loom::environment unset = [](const std::string&) { return std::optional<std::string>{}; };
  const cpu_set_t all = process_cpus();
  int first = 0;
  while (!CPU_ISSET(first, &all))
    ++first;
  int pinned_cpus = 0, pinned_threads = 0;
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    if (::pthread_setaffinity_np(pthread_self(), sizeof one, &one) != 0)
      return;
    pinned_cpus = loom::detail::schedulable_cpus();
    pinned_threads = loom::detail::intra_op_threads(0, unset);
  }).join();
  CHECK(pinned_cpus == 1);
  CHECK(pinned_threads == 1);
  CHECK(loom::detail::intra_op_threads(0, unset) == CPU_COUNT(&all));
}

// #23: kernel_context::decoded. A kernel's attributes are decoded by its
// plan item's first run and kept for later runs (a ctr worker ran ~500
// attribute lookups by name a step); outside a plan, at each run.
namespace {

struct counted_attrs {
  static inline std::atomic<int> decodings = 0;
  std::int64_t factor;
  explicit counted_attrs(const loom::node_def& n) : factor(n.attr<std::int64_t>("factor")) {
    ++decodings;
    if (n.has_attr("slow")) // a decoding that takes a while: racing runs overlap in it
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
};

struct scale_by_attr_cpu {
  static void run(loom::kernels::kernel_context& c) {
    const auto factor = static_cast<float>(c.decoded<counted_attrs>().factor);
    c.output = loom::any_tensor(loom::dtype::f32, c.input(0).shape());
    for (std::int64_t k = 0; k < c.output.num_elements(); ++k)
      c.output.data<float>()[k] = c.input(0).data<float>()[k] * factor;
  }
};

// A second kernel of the same op that decodes its attributes as another type.
struct other_attrs {
  explicit other_attrs(const loom::node_def&) {}
};

const bool scale_by_attr_registered = [] {
  loom::detail::op_registry::instance().add(
      {.name = "test_scale_by_attr",
       .num_inputs = 1,
       .infer = [](loom::node_def& n, const std::vector<const loom::node_def*>& in) {
         n.type = in[0]->type;
         n.shape = in[0]->shape;
       }});
  loom::kernels::kernel_registry::instance().add(
      "test_scale_by_attr", loom::dtype::f32, loom::kernels::device_cpu, &scale_by_attr_cpu::run);
  return true;
}();

} // namespace

TEST_CASE("a plan item decodes its kernel's attributes once; a kernel run outside a plan, each "
          "run") {
  REQUIRE(scale_by_attr_registered);
  loom::graph g;
  loom::placeholder<float, 1> x(g, loom::shape{2}, "x");
  const loom::node_id times3 = g.add_node("test_scale_by_attr", {x.id()}, {{"factor", 3l}});
  const loom::node_id times5 = g.add_node("test_scale_by_attr", {x.id()}, {{"factor", 5l}});
  const loom::detail::plan p(g, {{times3, times5}, {}, {x.id()}});
  loom::detail::plan_caches caches(p);
  Eigen::ThreadPool pool(2);
  const loom::kernels::cpu_device device(&pool, 2);
  loom::detail::resource_manager resources;
  const auto fed = loom::any_tensor::from_vector<float>(loom::shape{2}, {1.f, 2.f});

  counted_attrs::decodings = 0;
  for (int step = 0; step < 4; ++step) {
    const auto fetched = loom::detail::run_plan(p, caches, g, {fed}, device, resources);
    // Each node its own attributes: the two items do not share a decoding.
    CHECK(fetched.at(0).data<float>()[1] == 6.f);
    CHECK(fetched.at(1).data<float>()[1] == 10.f);
  }
  CHECK(counted_attrs::decodings == 2); // once per item of the plan, not per run

  // Without a plan (kernel_context::attrs null), each run decodes them.
  counted_attrs::decodings = 0;
  const loom::any_tensor* inputs[] = {&fed};
  for (int run = 0; run < 2; ++run) {
    loom::kernels::kernel_context c{g.node(times3), inputs, {}, device, resources, {}};
    scale_by_attr_cpu::run(c);
    CHECK(c.output.data<float>()[0] == 3.f);
  }
  CHECK(counted_attrs::decodings == 2);

  // One item decoded as two types is a bug in its kernel, reported as one.
  loom::kernels::decoded_attrs kept;
  CHECK(kept.get<counted_attrs>(g.node(times3)).factor == 3);
  std::string what;
  try {
    (void)kept.get<other_attrs>(g.node(times3));
  } catch (const loom::internal_error& e) {
    what = e.what();
  }
  CHECK(contains(what, "its kernel asked for its attributes decoded as two types"));
}

TEST_CASE("a fresh plan run by several threads at once decodes each item's attributes once") {
  REQUIRE(scale_by_attr_registered);
  loom::graph g;
  loom::placeholder<float, 1> x(g, loom::shape{2}, "x");
  constexpr int nodes = 32, threads = 4;
  std::vector<loom::node_id> scaled;
  for (int k = 0; k < nodes; ++k)
    scaled.push_back(g.add_node("test_scale_by_attr", {x.id()},
                                {{"factor", static_cast<std::int64_t>(k + 1)}, {"slow", true}}));
  const loom::detail::plan p(g, {scaled, {}, {x.id()}});
  loom::detail::plan_caches caches(p);
  Eigen::ThreadPool pool(2);
  const loom::kernels::cpu_device device(&pool, 2);
  loom::detail::resource_manager resources;
  const auto fed = loom::any_tensor::from_vector<float>(loom::shape{2}, {1.f, 2.f});

  counted_attrs::decodings = 0;
  std::latch start(threads);
  std::atomic<int> wrong = 0;
  std::vector<std::thread> runs;
  for (int t = 0; t < threads; ++t)
    runs.emplace_back([&] {
      start.arrive_and_wait(); // every thread reaches the plan's first run together
      const auto fetched = loom::detail::run_plan(p, caches, g, {fed}, device, resources);
      for (int k = 0; k < nodes; ++k)
        if (fetched.at(static_cast<std::size_t>(k)).data<float>()[1] !=
            2.f * static_cast<float>(k + 1))
          ++wrong;
    });
  for (auto& r : runs)
    r.join();
  CHECK(wrong == 0);
  // Each item decoded by whichever run got there first; the others waited and read it.
  CHECK(counted_attrs::decodings == nodes);
}

// #50: feeds go in and fetches come out as lists in the request's order, and a run
// allocates for the nodes its plan reads or writes (its slots), not for the whole graph.
TEST_CASE("a plan's values are its nodes', not the graph's; feeds and fetches are lists in the "
          "request's order") {
  loom::graph g;
  loom::placeholder<float, 1> x(g, loom::shape{2}, "x");
  for (int k = 0; k < 200; ++k) // nodes the request never touches
    (void)loom::lower(loom::constant(g, static_cast<float>(k)) * 2.0f);
  const loom::node_id doubled = loom::lower(x * 2.0f).id();
  const loom::node_id plus_one = loom::lower(x + 1.0f).id();
  const loom::detail::plan p(g, {{plus_one, doubled, plus_one}, {}, {x.id()}});
  CHECK(g.size() > 400);
  CHECK(p.slots() <= 5); // x, its two results and the two scalars they read
  loom::detail::plan_caches caches(p);
  Eigen::ThreadPool pool(2);
  const loom::kernels::cpu_device device(&pool, 2);
  loom::detail::resource_manager resources;
  const auto fed = loom::any_tensor::from_vector<float>(loom::shape{2}, {1.f, 2.f});

  const auto fetched = loom::detail::run_plan(p, caches, g, {fed}, device, resources);
  REQUIRE(fetched.size() == 3);
  CHECK(fetched[0].data<float>()[1] == 3.f); // plus_one
  CHECK(fetched[1].data<float>()[1] == 4.f); // doubled
  CHECK(fetched[2].data<float>()[0] == 2.f); // plus_one again
  CHECK(fetched[1].sole_owner());            // handed over, not copied

  const auto what = loom::testing::message_of<loom::internal_error>([&] {
    loom::detail::run_plan(p, caches, g, {fed, fed}, device, resources);
  });
  CHECK(contains(what, "2 feeds for 1 fed nodes"));
}

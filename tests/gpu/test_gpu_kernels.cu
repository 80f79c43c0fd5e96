// The GPU kernels of kernels/cuda/ against the CPU kernels of kernels/cpu/.
//
// Two suites, as tests/gpu/test_gpu.cu:
//   "cuda_host"   needs no GPU: every (op, dtype) the CPU registers has a GPU
//                 kernel (but for the CPU-only list below), and the table of
//                 device cases covers every GPU kernel; a graph lowered here
//                 (nvcc) has its regions' GPU kernels, whose device trees read
//                 the leaves as the CPU's fused kernel does (emulated);
//   "cuda_device" needs a GPU (skipped without one; main prints "no CUDA device"):
//                 every GPU kernel run on fresh random inputs and compared with
//                 the CPU kernel of the same (op, dtype) from the registry; the
//                 optimizer updates over several steps (copying the refs a
//                 reader holds); the sparse updates and scatters over several
//                 steps with repeated int32 and int64 ids (rows no id names
//                 untouched); resource_gather; a bad id's error, the CPU's,
//                 with nothing written; the random sources'
//                 distributions; variables and assignments; fused regions
//                 placed on the GPU, through the executor.
// Outputs are poisoned first: before each GPU kernel an output-sized block of
// the caching allocator is filled with 0xFF bytes (NaN for float and double)
// and freed, so the kernel's own allocation reuses it and an element it never
// writes fails the comparison. The CPU kernels register from
// tests/gpu/cpu_kernels.cpp (a g++ unit), which also holds the end-to-end
// session test of an MLP placed on /gpu:0; the GPU kernels and the backend from
// loom::cuda_kernels' objects (cmake/loom_cuda_kernels.cu), as in a program.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <loom/graph/lower.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/variables.hpp>
#include <loom/kernels/checks/array.hpp> // with_ids
#include <loom/kernels/cuda/backend.hpp>
#include <loom/kernels/cuda/random.cuh> // uniform_in, checked on the host
#include <loom/kernels/fused.hpp>       // what lowering a tree instantiates (graph/lower.hpp)
#include <loom/runtime/executor.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

// The CPU kernels' thread pool, made in cpu_kernels.cpp: Eigen's thread pool
// does not compile under nvcc (host-only members of __host__ __device__ code).
loom::kernels::cpu_device& host_device();

// The helpers in a named namespace, whose using-directives reach only it and
// the suites that name it: one in an unnamed namespace would reach the global
// scope, where nvcc's generated stubs for CUB's kernels (kernels/cuda/ids.cuh)
// name libcu++'s ::cuda unqualified, and loom::cuda would make that ambiguous.
namespace gpu_kernels_test {

using namespace loom;
using namespace loom::kernels; // the kernels, their context and registry are internals
using namespace loom::detail;

bool have_gpu() {
  static const bool has = gpu_count() > 0;
  return has;
}

std::uint64_t fresh_seed() {
  static std::random_device rd;
  return (std::uint64_t{rd()} << 32) ^ rd();
}

// Ops that the CPU has and the GPU deliberately has not, and why.
const std::set<std::string>& cpu_only_ops() {
  static const std::set<std::string> ops{
      // Blocking synchronous-replica state (kernels/cpu/sync.hpp): they wait on
      // host condition variables and keep host resources, like TF's accumulators.
      "accumulate_gradient",
      "take_gradient",
      "close_accumulator",
      "accumulate_sparse_gradient",
      "take_sparse_gradient",
      "sparse_gradient_indices",
      "counter_raise",
      "counter_add",
      "counter_wait",
      "reset_accumulator",
      // The barrier of synchronous replicas: host state a worker waits on.
      "barrier_wait",
      "barrier_reset",
      "barrier_epoch",
      // Summaries: their output is a serialized Summary in a string, which
      // lives on the host, as TF's summary ops run on the CPU.
      "scalar_summary",
      "histogram_summary",
      "merge_summary",
      // Strings live on the host (a GPU tensor holds numbers): the features are
      // hashed to ids on the CPU, as TF's StringToHashBucketFast is.
      "string_to_hash_bucket_fast",
      // A hash table's index (and its admission's counts) lives on the host beside its
      // keys variable, as the ps tasks that hold such tables do.
      "hash_embedding_rows",
      "hash_embedding_read",
      "hash_embedding_size",
      "hash_embedding_count",
      "hash_embedding_changes",
      "hash_embedding_changed_values",
      "hash_embedding_patch",
      "hash_embedding_tier_begin",
      "hash_embedding_tier_export",
      "hash_embedding_tier_import",
      "hash_embedding_admission_save",
      "hash_embedding_admission_restore",
      // An input pipeline's iterator: a host resource of the task that made the dataset;
      // its elements are host tensors (TF's IteratorGetNext runs on the CPU too), and a
      // step on a GPU receives them there like a feed.
      "iterator_get_next",
      "iterator_component",
      "iterator_wait_ms",
      "iterator_init", // makes a new pass of that host resource
      // The exact AUC's pairs: a host resource beside its metric's variable, like the
      // accumulators, sorted on the host when evaluated.
      "exact_auc_update",
      "exact_auc",
      "exact_auc_reset",
      // init_from_checkpoint's read of a checkpoint's slice: files on the variable's task's
      // host, as the saver's own ops read them.
      "restore_slice",
  };
  return ops;
}

const std::vector<dtype>& every_dtype() {
  static const std::vector<dtype> all{dtype::f32, dtype::f64,     dtype::i32,
                                      dtype::i64, dtype::boolean, dtype::string};
  return all;
}

// -- a process's resources, for kernels run outside a session ------------------------------------
class test_resources final : public resource_access {
public:
  variable_resource& variable(const node_def& n) override {
    auto& v = vars_[n.name];
    if (!v)
      v = std::make_unique<variable_resource>();
    return *v;
  }
  std::mt19937_64& random_engine(const node_def& n, std::uint64_t seed) override {
    auto it = engines_.find(n.name);
    if (it == engines_.end())
      it = engines_.emplace(n.name, std::mt19937_64(seed ? seed : fresh_seed())).first;
    return it->second;
  }
  std::shared_ptr<resource_base>
  resource(const std::string& container, const std::string& name,
           const std::function<std::shared_ptr<resource_base>()>& make) override {
    auto& r = others_[container + "/" + name];
    if (!r)
      r = make();
    return r;
  }

private:
  std::map<std::string, std::unique_ptr<variable_resource>> vars_;
  std::map<std::string, std::mt19937_64> engines_;
  std::map<std::string, std::shared_ptr<resource_base>> others_;
};

// -- running one kernel
// ----------------------------------------------------------------------------
any_tensor run_cpu(const node_def& n, dtype t, const std::vector<const any_tensor*>& in,
                   const std::vector<variable_resource*>& refs, resource_access& res) {
  kernel_fn fn = kernel_registry::instance().find_for(n, t, device_cpu);
  kernel_context ctx{n, in, refs, host_device(), res, {}, 0, nullptr};
  fn(ctx);
  return ctx.output;
}

thread_local kernel_fn t_kernel = nullptr;
thread_local std::size_t t_poison_bytes = 0;

// Empties the allocator's cache, then poisons the `count` blocks that its next
// allocations of `bytes` on g's stream will get. The cache is emptied first
// because the allocator hands out the oldest cached block of a class: with
// older blocks cached, an output would skip the poisoned one (and might hold
// an earlier correct result). The poison is 0x7F bytes, finite in floating
// point (3.4e38, 1.4e306), so an unwritten element differs from a NaN the CPU
// computed as well as from a number.
void poison_blocks(const gpu_context& g, std::size_t bytes, std::size_t count) {
  LOOM_CUDA_CHECK(cudaStreamSynchronize(g.stream));
  g.allocator->empty_cache();
  std::vector<void*> blocks(count);
  for (void*& p : blocks) {
    p = g.allocator->allocate(bytes, g.stream);
    LOOM_CUDA_CHECK(cudaMemsetAsync(p, 0x7F, bytes, g.stream));
  }
  for (void* p : blocks)
    g.allocator->deallocate(p);
}

// Runs t_kernel with the blocks of its output's size poisoned first: the
// output and up to 3 temporaries before it.
void poisoned_kernel(kernel_context& c) {
  if (t_poison_bytes)
    poison_blocks(*c.gpu, t_poison_bytes, 4);
  t_kernel(c);
}

gpu_backend& backend() {
  gpu_backend* b = gpu_backend::registered();
  REQUIRE(b != nullptr);
  return *b;
}

any_tensor to_gpu(const any_tensor& t) {
  return backend().copy(t, memory_location::gpu(0));
}
any_tensor to_host(const any_tensor& t) {
  if (t.empty() || t.on_host())
    return t;
  return backend().copy(t, memory_location::host());
}

// Runs the GPU kernel of (n.op, t) on GPU 0; `out_bytes` sizes the poisoned block.
any_tensor run_gpu(const node_def& n, dtype t, const std::vector<const any_tensor*>& in,
                   const std::vector<variable_resource*>& refs, resource_access& res,
                   std::size_t out_bytes, std::uint32_t forwardable = 0) {
  t_kernel = kernel_registry::instance().find_for(n, t, device_gpu);
  t_poison_bytes = out_bytes;
  kernel_context ctx{n, in, refs, host_device(), res, {}, forwardable, nullptr};
  backend().run(0, &poisoned_kernel, ctx);
  if (!ctx.output.empty() && ctx.output.num_elements() > 0)
    CHECK(ctx.output.location() == memory_location::gpu(0));
  return ctx.output;
}

// -- random inputs
// -----------------------------------------------------------------------------------
enum class gen {
  any,            // floats in [-3, 3], ints in [-9, 9]
  positive,       // floats in [0.1, 4], ints in [1, 9]
  nonzero,        // away from zero: |x| in [0.5, 3], ints in +-[1, 9]
  low,            // [-3, -0.5] (clip's lower bound)
  high,           // [0.5, 3]
  prob,           // [0, 1]
  labels,         // ints in [0, classes)
  some_negative,  // ints in [-3, classes): ids, some of them dropped (negative)
  count,          // every element `classes` (a number of segments, a dense shape)
  sparse_indices, // [N, rank] int64: N distinct indices into a dense shape of `classes`
                  // in every dimension, in row-major order (a sparse tensor's)
};

struct in_spec {
  loom::shape s;
  std::optional<dtype> fixed{}; // the input's dtype when not the kernel's
  gen g = gen::any;
  std::int64_t classes = 0;
};

any_tensor random_tensor(dtype t, const loom::shape& s, gen g, std::int64_t classes,
                         std::mt19937_64& rng) {
  any_tensor out(t, s);
  const std::int64_t n = out.num_elements();
  visit_dtype(t, [&]<class T>() {
    if constexpr (std::is_same_v<T, std::string>) {
      FAIL("no string inputs on a GPU");
    } else if constexpr (std::is_same_v<T, bool>) {
      std::bernoulli_distribution d(0.5);
      for (std::int64_t i = 0; i < n; ++i)
        out.data<bool>()[i] = d(rng);
    } else if constexpr (std::is_floating_point_v<T>) {
      double lo = -3, hi = 3;
      if (g == gen::positive)
        lo = 0.1, hi = 4;
      else if (g == gen::low)
        lo = -3, hi = -0.5;
      else if (g == gen::high || g == gen::nonzero)
        lo = 0.5, hi = 3;
      else if (g == gen::prob)
        lo = 0, hi = 1;
      std::uniform_real_distribution<double> d(lo, hi);
      std::bernoulli_distribution sign(0.5);
      for (std::int64_t i = 0; i < n; ++i) {
        double v = d(rng);
        if (g == gen::nonzero && sign(rng))
          v = -v;
        out.data<T>()[i] = static_cast<T>(v);
      }
    } else if (g == gen::count) {
      std::fill_n(out.data<T>(), n, static_cast<T>(classes));
    } else if (g == gen::sparse_indices) {
      REQUIRE(s.rank() == 2);
      const std::int64_t rank = s[1];
      std::int64_t positions = 1;
      for (std::int64_t a = 0; a < rank; ++a)
        positions *= classes;
      REQUIRE(s[0] <= positions);
      std::uniform_int_distribution<std::int64_t> d(0, positions - 1);
      std::set<std::int64_t> flat;
      while (static_cast<std::int64_t>(flat.size()) < s[0])
        flat.insert(d(rng));
      T* at = out.data<T>();
      for (std::int64_t f : flat) { // ascending: row-major order
        for (std::int64_t a = rank - 1; a >= 0; --a, f /= classes)
          at[a] = static_cast<T>(f % classes);
        at += rank;
      }
    } else {
      std::int64_t lo = -9, hi = 9;
      if (g == gen::positive || g == gen::nonzero || g == gen::high)
        lo = 1;
      if (g == gen::low)
        lo = -9, hi = -1;
      if (g == gen::labels)
        lo = 0, hi = classes - 1;
      if (g == gen::some_negative)
        lo = -3, hi = classes - 1;
      std::uniform_int_distribution<std::int64_t> d(lo, hi);
      std::bernoulli_distribution sign(0.5);
      for (std::int64_t i = 0; i < n; ++i) {
        std::int64_t v = d(rng);
        if (g == gen::nonzero && sign(rng))
          v = -v;
        out.data<T>()[i] = static_cast<T>(v);
      }
    }
  });
  return out;
}

// -- comparisons
// -------------------------------------------------------------------------------------
enum class check {
  elementwise, // each element: |gpu - cpu| <= tol * max(|cpu|, floor); tol 1e-5 float, 1e-12
               // double; floor 1e-3, or the operands' magnitude where a result may cancel
  l2,          // ||gpu - cpu|| <= tol ||cpu||; tol 1e-4 float, 1e-10 double
  sums,        // each element: |gpu - cpu| <= tol * (the same reduction of |x|); tol 1e-6 float,
               // 1e-14 double: a sum that cancels is held to its operands' size, as rounding is
               // (a few float epsilons of it); an element lost from the longest sum here (70 001
               // elements, each ~1.4e-5 of the total) fails unless under a tenth of the mean
};

template <class T> double as_double(T v) {
  return static_cast<double>(v);
}

void compare(const any_tensor& cpu, const any_tensor& gpu_value, check how, const std::string& what,
             double floor = 1e-3, const any_tensor* magnitude = nullptr) {
  INFO(what);
  REQUIRE(cpu.empty() == gpu_value.empty());
  if (cpu.empty())
    return;
  const any_tensor gpu = to_host(gpu_value);
  REQUIRE(std::string(to_string(gpu.type())) == std::string(to_string(cpu.type())));
  REQUIRE(gpu.shape().to_string() == cpu.shape().to_string());
  const std::int64_t n = cpu.num_elements();
  visit_dtype(cpu.type(), [&]<class T>() {
    if constexpr (std::is_same_v<T, std::string>) {
      FAIL("string output");
    } else if constexpr (!std::is_floating_point_v<T>) {
      std::int64_t bad = 0, first = -1;
      for (std::int64_t i = 0; i < n; ++i)
        if (cpu.data<T>()[i] != gpu.data<T>()[i] && bad++ == 0)
          first = i;
      INFO("first difference at " << first);
      CHECK_MESSAGE(bad == 0, bad << " of " << n << " elements differ (exact dtype)");
    } else {
      const double f32 = std::is_same_v<T, float>;
      const T* c = cpu.data<T>();
      const T* g = gpu.data<T>();
      if (how == check::sums) {
        REQUIRE(magnitude != nullptr);
        const T* m = magnitude->data<T>();
        const double tol = f32 ? 1e-6 : 1e-14;
        std::int64_t bad = 0, first = -1;
        for (std::int64_t i = 0; i < n; ++i) {
          const double a = as_double(c[i]), b = as_double(g[i]);
          // The mean over no elements is NaN on both.
          const bool same = (std::isnan(a) && std::isnan(b)) ||
                            std::abs(a - b) <= tol * std::max(as_double(m[i]), 1e-30);
          if (!same && bad++ == 0)
            first = i;
        }
        INFO("first difference at " << first << ": cpu " << (first >= 0 ? as_double(c[first]) : 0.)
                                    << ", gpu " << (first >= 0 ? as_double(g[first]) : 0.)
                                    << ", operands' size "
                                    << (first >= 0 ? as_double(m[first]) : 0.));
        CHECK_MESSAGE(bad == 0, bad << " of " << n << " elements beyond the summation bound");
      } else if (how == check::elementwise) {
        const double tol = f32 ? 1e-5 : 1e-12;
        std::int64_t bad = 0, first = -1;
        for (std::int64_t i = 0; i < n; ++i) {
          const double a = as_double(c[i]), b = as_double(g[i]);
          const bool same = (std::isnan(a) && std::isnan(b)) || a == b ||
                            std::abs(a - b) <= tol * std::max(std::abs(a), floor);
          if (!same && bad++ == 0)
            first = i;
        }
        INFO("first difference at " << first << ": cpu " << (first >= 0 ? as_double(c[first]) : 0.)
                                    << ", gpu " << (first >= 0 ? as_double(g[first]) : 0.));
        CHECK_MESSAGE(bad == 0, bad << " of " << n << " elements beyond the relative bound");
      } else {
        const double tol = f32 ? 1e-4 : 1e-10;
        double diff = 0, norm = 0;
        std::int64_t nan_mismatch = 0, inf_mismatch = 0;
        for (std::int64_t i = 0; i < n; ++i) {
          const double a = as_double(c[i]), b = as_double(g[i]);
          if (std::isnan(a) || std::isnan(b)) {
            nan_mismatch += std::isnan(a) != std::isnan(b);
            continue;
          }
          if (std::isinf(a) || std::isinf(b)) { // the max of nothing is -inf, say
            inf_mismatch += a != b;
            continue;
          }
          diff += (a - b) * (a - b);
          norm += a * a;
        }
        CHECK_MESSAGE(nan_mismatch == 0, nan_mismatch << " NaNs where the other has a number");
        CHECK_MESSAGE(inf_mismatch == 0, inf_mismatch << " infinities the other does not have");
        CHECK_MESSAGE(std::sqrt(diff) <= tol * std::max(std::sqrt(norm), 1e-30),
                      "relative L2 error " << std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30));
      }
    }
  });
}

// -- the table of cases
// ------------------------------------------------------------------------------
struct op_case {
  std::string op;
  std::vector<dtype> types; // the kernel dtypes to run (the op's type_input dtype)
  std::vector<in_spec> in;
  attr_map attrs{};
  check how = check::elementwise;
  std::optional<loom::shape> value{}; // constant: a random "value" attr of this shape
};

const std::vector<dtype> floats{dtype::f32, dtype::f64};
const std::vector<dtype> numeric{dtype::f32, dtype::f64, dtype::i32, dtype::i64};
const std::vector<dtype> no_strings{dtype::f32, dtype::f64, dtype::i32, dtype::i64, dtype::boolean};

std::vector<op_case> make_cases() {
  std::vector<op_case> cs;
  using S = loom::shape;
  // Elementwise: odd sizes, one element, zero elements and every broadcasting form.
  const std::vector<std::pair<std::string, std::vector<dtype>>> unary{
      {"neg", numeric},    {"exp", floats},      {"log", floats},        {"sqrt", floats},
      {"square", numeric}, {"abs", numeric},     {"sign", numeric},      {"relu", numeric},
      {"sigmoid", floats}, {"tanh", floats},     {"reciprocal", floats}, {"rsqrt", floats},
      {"elu", floats},     {"softplus", floats}, {"cos", floats},        {"sin", floats}};
  for (const auto& [op, types] : unary) {
    const gen g = op == "log" || op == "sqrt" || op == "rsqrt" ? gen::positive
                  : op == "reciprocal"                         ? gen::nonzero
                                                               : gen::any;
    // 2100003 elements: past one pass of the grid-stride loop (8192 blocks x 256 threads).
    for (const S& s : {S{1003}, S{1}, S{}, S{0}, S{7, 5, 3}, S{2100003}})
      cs.push_back({op, types, {{s, {}, g}}});
  }
  const std::vector<std::pair<std::string, std::vector<dtype>>> binary{
      {"add", numeric},         {"sub", numeric},           {"mul", numeric},
      {"div", numeric},         {"maximum", numeric},       {"minimum", numeric},
      {"relu_grad", floats},    {"less", numeric},          {"less_equal", numeric},
      {"greater", numeric},     {"greater_equal", numeric}, {"equal", no_strings},
      {"not_equal", no_strings}};
  const std::vector<std::pair<S, S>> pairs{
      {S{1003}, S{1003}}, {S{7, 5}, S{5}}, {S{5}, S{7, 5}},    {S{7, 1, 5}, S{1, 3, 1}},
      {S{}, S{4, 3}},     {S{1003}, S{1}}, {S{0, 3}, S{1, 3}}, {S{2, 1, 3, 1, 2, 3}, S{4, 1, 3}}};
  for (const auto& [op, types] : binary)
    for (const auto& [a, b] : pairs)
      cs.push_back({op, types, {{a}, {b, {}, op == "div" ? gen::nonzero : gen::any}}});
  for (const auto& [a, b] : pairs) // pow of a positive base (a negative one is NaN on both)
    cs.push_back({"pow", floats, {{a, {}, gen::positive}, {b}}, {}, check::l2});
  cs.push_back(
      {"clip_by_value", numeric, {{S{37, 11}}, {S{}, {}, gen::low}, {S{}, {}, gen::high}}});
  cs.push_back(
      {"clip_by_value", numeric, {{S{37, 11}}, {S{11}, {}, gen::low}, {S{37, 1}, {}, gen::high}}});
  cs.push_back({"select", numeric, {{S{7, 1}, dtype::boolean}, {S{7, 9}}, {S{9}}}});
  cs.push_back({"select", numeric, {{S{1003}, dtype::boolean}, {S{1003}}, {S{}}}});
  for (dtype to : no_strings)
    for (dtype from : no_strings)
      cs.push_back({"cast", {from}, {{S{1003}}}, {{"dst", to}}});

  // matmul / xw_plus_b (L2: the summation orders differ).
  auto mm = [&](S a, S b, bool ta, bool tb) {
    cs.push_back(
        {"matmul", floats, {{a}, {b}}, {{"transpose_a", ta}, {"transpose_b", tb}}, check::l2});
  };
  mm(S{37, 64}, S{64, 29}, false, false);
  mm(S{64, 37}, S{64, 29}, true, false);
  mm(S{37, 64}, S{29, 64}, false, true);
  mm(S{64, 37}, S{29, 64}, true, true);
  mm(S{1, 1}, S{1, 1}, false, false);
  mm(S{3, 1003}, S{1003, 7}, false, false);
  mm(S{3, 0}, S{0, 4}, false, false);
  mm(S{0, 5}, S{5, 4}, false, false);
  cs.push_back({"xw_plus_b", floats, {{S{33, 17}}, {S{17, 10}}, {S{10}}}, {}, check::l2});
  // batch_matmul: each adjoint combination, broadcast batches (a strided batched GEMM where
  // an operand is whole or broadcast whole, one GEMM per batch otherwise), no batches.
  for (const auto& [a, b, ax, ay] :
       std::vector<std::tuple<S, S, bool, bool>>{{S{7, 5, 9}, S{7, 9, 4}, false, false},
                                                 {S{7, 9, 5}, S{7, 9, 4}, true, false},
                                                 {S{7, 5, 9}, S{7, 4, 9}, false, true},
                                                 {S{7, 9, 5}, S{7, 4, 9}, true, true},
                                                 {S{7, 5, 9}, S{9, 4}, false, false},
                                                 {S{3, 1, 5, 9}, S{4, 9, 2}, false, false},
                                                 {S{0, 5, 9}, S{0, 9, 4}, false, false}})
    cs.push_back({"batch_matmul", floats, {{a}, {b}}, {{"adj_x", ax}, {"adj_y", ay}}, check::l2});
  cs.push_back({"xw_plus_b", floats, {{S{1, 1003}}, {S{1003, 1}}, {S{1}}}, {}, check::l2});
  // add_n: a few inputs, more inputs than one launch takes (64), no elements.
  cs.push_back({"add_n", numeric, {{S{3, 4}}, {S{3, 4}}, {S{3, 4}}}});
  cs.push_back({"add_n", numeric, std::vector<in_spec>(70, in_spec{S{1003}})});
  cs.push_back({"add_n", numeric, {{S{0, 3}}, {S{0, 3}}}});

  // Reductions over every form of axes; long rows take the split path.
  using axes = std::vector<std::int64_t>;
  const std::vector<std::pair<S, axes>> reductions{{S{5, 7, 9}, axes{}},
                                                   {S{5, 7, 9}, axes{0}},
                                                   {S{5, 7, 9}, axes{1}},
                                                   {S{5, 7, 9}, axes{2}},
                                                   {S{5, 7, 9}, axes{0, 2}},
                                                   {S{5, 7, 9}, axes{-1, 0}},
                                                   {S{1003}, axes{}},
                                                   {S{2, 70001}, axes{1}},
                                                   {S{70001, 3}, axes{0}},
                                                   {S{9000, 40}, axes{1}}, // > 8192 outputs
                                                   {S{300, 129}, axes{1}},
                                                   {S{1, 1}, axes{0}},
                                                   {S{0, 3}, axes{0}},
                                                   {S{4, 1, 3, 1, 5}, axes{1, 2}},
                                                   {S{}, axes{}}};
  for (const char* op : {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min"})
    for (const auto& [s, ax] : reductions)
      for (bool keep : {false, true})
        cs.push_back({op,
                      numeric,
                      {{s}},
                      {{"axes", ax}, {"keepdims", keep}},
                      std::string_view(op) == "reduce_max" || std::string_view(op) == "reduce_min"
                          ? check::l2
                          : check::sums});
  for (const char* op : {"reduce_any", "reduce_all"})
    for (const auto& [s, ax] : reductions)
      cs.push_back({op, {dtype::boolean}, {{s}}, {{"axes", ax}, {"keepdims", false}}});
  // Products of few elements each (a long product of [-3, 3] overflows, in an order-dependent
  // step): L2, as the orders differ.
  for (const auto& [s, ax] : std::vector<std::pair<S, axes>>{{S{7, 13}, axes{1}},
                                                             {S{7, 13}, axes{0}},
                                                             {S{300, 29}, axes{1}},
                                                             {S{4, 1, 3, 1, 5}, axes{1, 2}},
                                                             {S{0, 3}, axes{0}},
                                                             {S{}, axes{}}})
    cs.push_back({"reduce_prod", numeric, {{s}}, {{"axes", ax}, {"keepdims", false}}, check::l2});
  // reduce_prod_grad (dy, x): dy has the kept shape.
  cs.push_back(
      {"reduce_prod_grad", floats, {{S{5, 9}}, {S{5, 7, 9}}}, {{"axes", axes{1}}}, check::l2});
  cs.push_back({"reduce_prod_grad", floats, {{S{}}, {S{5, 7}}}, {{"axes", axes{}}}, check::l2});
  cs.push_back({"reduce_prod_grad",
                floats,
                {{S{7, 1}}, {S{5, 7, 9}}},
                {{"axes", axes{0, 2}}, {"keepdims", true}},
                check::l2});
  // reduce_grad (dy, x): dy has the kept shape.
  for (const char* mode : {"sum", "mean"}) {
    cs.push_back({"reduce_grad",
                  floats,
                  {{S{5, 9}}, {S{5, 7, 9}}},
                  {{"axes", axes{1}}, {"mode", std::string(mode)}}});
    cs.push_back({"reduce_grad",
                  floats,
                  {{S{}}, {S{5, 7, 9}}},
                  {{"axes", axes{}}, {"mode", std::string(mode)}}});
    cs.push_back({"reduce_grad",
                  floats,
                  {{S{7, 1}}, {S{5, 7, 9}}},
                  {{"axes", axes{0, 2}}, {"mode", std::string(mode)}}});
    cs.push_back({"reduce_grad",
                  floats,
                  {{S{3}}, {S{3, 1}}},
                  {{"axes", axes{1}}, {"mode", std::string(mode)}}});
    cs.push_back({"reduce_grad",
                  floats,
                  {{S{1, 3}}, {S{1003, 3}}},
                  {{"axes", axes{0}}, {"mode", std::string(mode)}}});
  }
  for (const char* op : {"argmax", "argmin"})
    for (const auto& [s, axis] : std::vector<std::pair<S, std::int64_t>>{
             {S{7, 13}, 1}, {S{7, 13}, 0}, {S{5, 1, 300}, -1}, {S{1003}, 0}, {S{0, 4}, 1}})
      cs.push_back({op, numeric, {{s}}, {{"axis", axis}}});
  cs.push_back({"reshape", no_strings, {{S{6, 4}}}, {{"dims", axes{3, -1}}}});
  cs.push_back({"reshape_like", no_strings, {{S{6, 4}}, {S{2, 12}}}});
  cs.push_back({"expand_dims", no_strings, {{S{6, 4}}}, {{"axis", -2L}}});
  cs.push_back({"squeeze", no_strings, {{S{6, 1, 4}}}, {{"axes", axes{1}}}});

  // The strided ops: permutations, slices forward and back with every mask, pads and
  // tiles, empty tensors, and one copy past a pass of the grid.
  for (const auto& [s, perm] : std::vector<std::pair<S, axes>>{{S{7, 5, 3}, axes{2, 0, 1}},
                                                               {S{64, 33}, axes{1, 0}},
                                                               {S{4, 1, 3, 2}, axes{3, 2, 1, 0}},
                                                               {S{0, 3}, axes{1, 0}},
                                                               {S{2100003}, axes{0}}})
    cs.push_back({"transpose", no_strings, {{s}}, {{"perm", perm}}});
  const attr_map stepped{{"begin", axes{1, -1}}, {"end", axes{8, 0}}, {"strides", axes{2, -2}}};
  const attr_map masked{{"begin", axes{0, 2, -1}},   {"end", axes{0, 0, 0}},
                        {"strides", axes{1, 1, -1}}, {"ellipsis_mask", 1L},
                        {"new_axis_mask", 2L},       {"shrink_axis_mask", 0L},
                        {"begin_mask", 4L},          {"end_mask", 4L}};
  const attr_map shrunk{{"begin", axes{3, 0}},
                        {"end", axes{4, 0}},
                        {"strides", axes{1, 1}},
                        {"end_mask", 2L},
                        {"shrink_axis_mask", 1L}};
  cs.push_back({"strided_slice", no_strings, {{S{9, 7}}}, stepped});
  cs.push_back({"strided_slice", no_strings, {{S{4, 5, 6}}}, masked});
  cs.push_back({"strided_slice", no_strings, {{S{9, 7}}}, shrunk});
  cs.push_back({"strided_slice_grad", no_strings, {{S{4, 3}}, {S{9, 7}}}, stepped});
  cs.push_back({"strided_slice_grad", no_strings, {{S{4, 5, 1, 6}}, {S{4, 5, 6}}}, masked});
  attr_map shrunk_static = shrunk;
  shrunk_static["shape"] = axes{9, 7};
  cs.push_back({"strided_slice_grad", no_strings, {{S{7}}}, shrunk_static});
  cs.push_back({"pad", no_strings, {{S{5, 3}}, {S{}}}, {{"paddings", axes{1, 2, 0, 3}}}});
  cs.push_back({"pad", no_strings, {{S{0, 3}}, {S{}}}, {{"paddings", axes{1, 1, 1, 1}}}});
  cs.push_back({"tile", no_strings, {{S{5, 3}}}, {{"multiples", axes{2, 3}}}});
  cs.push_back({"tile", no_strings, {{S{1003}}}, {{"multiples", axes{3}}}});
  cs.push_back({"tile", no_strings, {{S{2, 3}}}, {{"multiples", axes{0, 2}}}});
  // Convolutions and poolings (L2: cuBLAS and Eigen sum the patches in other orders):
  // SAME and VALID, strides, a dilation, a 1x1 filter, and a batch past the patch budget.
  const auto window = [](axes strides, const char* padding, axes dilations = axes{1, 1, 1, 1}) {
    return attr_map{
        {"strides", strides}, {"padding", std::string(padding)}, {"dilations", dilations}};
  };
  // (x, filter, attributes, y's shape)
  const std::vector<std::tuple<S, S, attr_map, S>> convs{
      {S{2, 7, 6, 3}, S{3, 3, 3, 4}, window(axes{1, 1, 1, 1}, "SAME"), S{2, 7, 6, 4}},
      {S{2, 7, 6, 3}, S{3, 2, 3, 4}, window(axes{1, 2, 3, 1}, "VALID"), S{2, 3, 2, 4}},
      {S{1, 9, 9, 2}, S{3, 3, 2, 2}, window(axes{1, 1, 1, 1}, "SAME", axes{1, 2, 2, 1}),
       S{1, 9, 9, 2}},
      {S{3, 4, 5, 6}, S{1, 1, 6, 5}, window(axes{1, 1, 1, 1}, "SAME"), S{3, 4, 5, 5}},
      {S{64, 28, 28, 4}, S{5, 5, 4, 2}, window(axes{1, 1, 1, 1}, "SAME"), S{64, 28, 28, 2}}};
  for (const auto& [x, f, a, y] : convs) {
    cs.push_back({"conv2d", floats, {{x}, {f}}, a, check::l2});
    cs.push_back({"conv2d_backprop_input", floats, {{f}, {y}, {x}}, a, check::l2});
    cs.push_back({"conv2d_backprop_filter", floats, {{x}, {y}, {f}}, a, check::l2});
  }
  for (const char* padding : {"VALID", "SAME"}) {
    attr_map a{{"ksize", axes{1, 3, 2, 1}},
               {"strides", axes{1, 2, 1, 1}},
               {"padding", std::string(padding)}};
    cs.push_back({"max_pool", numeric, {{S{2, 5, 7, 3}}}, a});
    cs.push_back({"avg_pool", floats, {{S{2, 5, 7, 3}}}, a, check::l2});
    const S y = padding == std::string("SAME") ? S{2, 3, 7, 3} : S{2, 2, 6, 3};
    cs.push_back({"max_pool_grad", floats, {{S{2, 5, 7, 3}}, {y}, {y}}, a, check::l2});
    // Integers tie: both devices give a window's dy to its first largest element.
    cs.push_back({"max_pool_grad", {dtype::i32, dtype::i64}, {{S{2, 5, 7, 3}}, {y}, {y}}, a});
    cs.push_back({"avg_pool_grad", floats, {{y}, {S{2, 5, 7, 3}}}, a, check::l2});
  }
  for (dtype id : {dtype::i32, dtype::i64}) {
    cs.push_back({"one_hot",
                  no_strings,
                  {{S{33}, id, gen::some_negative, 10}, {S{}}, {S{}}},
                  {{"depth", 10L}, {"axis", -1L}}});
    cs.push_back({"one_hot",
                  no_strings,
                  {{S{4, 5}, id, gen::labels, 3}, {S{}}, {S{}}},
                  {{"depth", 3L}, {"axis", 1L}}});
  }

  // range: start below limit, a positive step (ints: [-9, -1], [1, 9], [1, 9]).
  cs.push_back({"range",
                numeric,
                {{S{}, {}, gen::low}, {S{}, {}, gen::high}, {S{}, {}, gen::positive}},
                {},
                check::l2});
  // gather_nd: tuples of 2 into [5, 5, 3], of 1 into [6, 4] (a batch of them), of 0; and its
  // gradient, repeated tuples summed in the CPU's order.
  for (dtype id : {dtype::i32, dtype::i64}) {
    cs.push_back({"gather_nd", no_strings, {{S{5, 5, 3}}, {S{7, 2}, id, gen::labels, 5}}});
    cs.push_back({"gather_nd", no_strings, {{S{6, 4}}, {S{3, 2, 1}, id, gen::labels, 6}}});
    cs.push_back({"gather_nd", no_strings, {{S{6, 4}}, {S{3, 0}, id, gen::labels, 6}}});
    cs.push_back({"gather_nd_grad",
                  floats,
                  {{S{40, 3}}, {S{40, 2}, id, gen::labels, 5}},
                  {{"shape", axes{5, 5, 3}}}});
    cs.push_back(
        {"gather_nd_grad", floats, {{S{3, 2, 4}}, {S{3, 2, 1}, id, gen::labels, 6}, {S{6, 4}}}});
  }
  // top_k: ties among the ints (by position on both), k from 0 to the row.
  for (const auto& [s, k] : std::vector<std::pair<S, std::int64_t>>{
           {S{7, 13}, 5}, {S{1003}, 1}, {S{3, 40}, 40}, {S{4, 0}, 0}, {S{2, 3, 9}, 4}})
    cs.push_back({"top_k_indices", numeric, {{s}}, {{"k", k}, {"sorted", true}}});
  cs.push_back({"top_k_values", numeric, {{S{7, 13}}, {S{7, 5}, dtype::i32, gen::labels, 13}}});
  cs.push_back(
      {"top_k_grad", floats, {{S{7, 5}}, {S{7, 5}, dtype::i32, gen::labels, 13}, {S{7, 13}}}});
  // depthwise_conv2d and its backprops (x, filter, attributes, y's shape).
  const std::vector<std::tuple<S, S, attr_map, S>> depthwise{
      {S{2, 7, 6, 3}, S{3, 3, 3, 2}, window(axes{1, 1, 1, 1}, "SAME"), S{2, 7, 6, 6}},
      {S{2, 7, 6, 3}, S{3, 2, 3, 1}, window(axes{1, 2, 3, 1}, "VALID"), S{2, 3, 2, 3}},
      {S{1, 9, 9, 2}, S{3, 3, 2, 2}, window(axes{1, 1, 1, 1}, "SAME", axes{1, 2, 2, 1}),
       S{1, 9, 9, 4}}};
  for (const auto& [x, f, a, y] : depthwise) {
    cs.push_back({"depthwise_conv2d", floats, {{x}, {f}}, a, check::l2});
    cs.push_back({"depthwise_conv2d_native_backprop_input", floats, {{f}, {y}, {x}}, a, check::l2});
    cs.push_back(
        {"depthwise_conv2d_native_backprop_filter", floats, {{x}, {y}, {f}}, a, check::l2});
  }

  // Fused batch normalization: channels fewer than a warp, more than a block's 32 (a second
  // tile, a partial one), rows more than one chunk, and no rows.
  for (const S& x : {S{2, 7, 6, 3}, S{5, 4, 4, 45}, S{20000, 2}, S{0, 3}}) {
    const std::int64_t c = x[x.rank() - 1];
    const attr_map eps{{"epsilon", 1e-3}};
    cs.push_back({"batch_norm_moments", floats, {{x}}, {}, check::l2});
    cs.push_back({"fused_batch_norm",
                  floats,
                  {{x}, {S{c}}, {S{c}}, {S{c}}, {S{c}, {}, gen::positive}},
                  eps,
                  check::l2});
    cs.push_back({"fused_batch_norm_grad_sums",
                  floats,
                  {{x}, {x}, {S{c}}, {S{c}, {}, gen::positive}},
                  eps,
                  check::l2});
    cs.push_back({"batch_norm_moments_grad", floats, {{S{3, c}}, {x}, {S{3, c}}}, {}, check::l2});
  }

  // Softmax and cross-entropies (L2: exp and row sums differ in order).
  // 8200 rows: more rows than blocks (8192), so the row loop takes a second pass.
  for (const S& s : {S{33, 10}, S{5, 1003}, S{7}, S{4, 0}, S{2, 3, 5}, S{8200, 3}})
    for (const char* op : {"softmax", "log_softmax"})
      cs.push_back({op, floats, {{s}}, {}, check::l2});
  for (const char* op : {"softmax_grad", "log_softmax_grad"}) {
    cs.push_back({op, floats, {{S{33, 10}, {}, gen::prob}, {S{33, 10}}}, {}, check::l2});
    cs.push_back({op, floats, {{S{3, 1003}, {}, gen::prob}, {S{3, 1003}}}, {}, check::l2});
  }
  for (const S& s : {S{33, 10}, S{3, 1003}, S{4, 0}})
    cs.push_back(
        {"softmax_cross_entropy_with_logits", floats, {{s, {}, gen::prob}, {s}}, {}, check::l2});
  for (const char* wrt : {"logits", "labels"}) {
    cs.push_back({"xent_grad",
                  floats,
                  {{S{33}}, {S{33, 10}, {}, gen::prob}, {S{33, 10}}},
                  {{"wrt", std::string(wrt)}},
                  check::l2});
    cs.push_back({"xent_grad",
                  floats,
                  {{S{2}}, {S{2, 1003}, {}, gen::prob}, {S{2, 1003}}},
                  {{"wrt", std::string(wrt)}},
                  check::l2});
  }
  for (dtype label : {dtype::i32, dtype::i64}) {
    cs.push_back({"sparse_softmax_cross_entropy_with_logits",
                  floats,
                  {{S{33}, label, gen::labels, 10}, {S{33, 10}}},
                  {},
                  check::l2});
    cs.push_back({"sparse_softmax_cross_entropy_with_logits",
                  floats,
                  {{S{3}, label, gen::labels, 1003}, {S{3, 1003}}},
                  {},
                  check::l2});
    cs.push_back({"sparse_xent_grad",
                  floats,
                  {{S{33}}, {S{33}, label, gen::labels, 10}, {S{33, 10}}},
                  {},
                  check::l2});
    cs.push_back({"sparse_xent_grad",
                  floats,
                  {{S{3}}, {S{3}, label, gen::labels, 1003}, {S{3, 1003}}},
                  {},
                  check::l2});
  }

  // State and plumbing.
  for (const S& s : {S{1003}, S{}, S{2, 3}, S{0}})
    cs.push_back({"constant", no_strings, {}, {}, check::elementwise, s});
  cs.push_back({"identity", no_strings, {{S{7, 3}}}});
  cs.push_back({"no_op", no_strings, {}});
  for (const char* op : {"zeros_like", "ones_like"})
    for (const S& s : {S{1003}, S{}, S{0}})
      cs.push_back({op, numeric, {{s}}});
  for (const S& s : {S{1003}, S{}, S{0}, S{2100003}})
    cs.push_back({"fill", no_strings, {}, {{"shape", s}, {"value", 2.5}}});
  for (const auto& [from, to] : std::vector<std::pair<S, S>>{{S{7, 5, 3}, S{5, 1}},
                                                             {S{4, 3}, S{4, 3}},
                                                             {S{2, 3}, S{}},
                                                             {S{1003, 3}, S{3}},
                                                             {S{2, 70001}, S{2, 1}},
                                                             {S{0, 3}, S{1, 3}}})
    cs.push_back({"sum_to_shape", numeric, {{from}, {to}}, {}, check::l2});

  // The index ops of sparse models, with int32 and int64 ids: ids drawn from
  // fewer values than there are ids repeat, and sums of repeated ids take the
  // CPU's order, so float results are compared element by element.
  for (dtype id : {dtype::i32, dtype::i64}) {
    // gather: rows, repeated rows, a middle axis, past one pass of the grid, no ids.
    cs.push_back(
        {"gather", no_strings, {{S{50, 7}}, {S{30}, id, gen::labels, 50}}, {{"axis", 0L}}});
    cs.push_back(
        {"gather", no_strings, {{S{10, 3}}, {S{200}, id, gen::labels, 10}}, {{"axis", 0L}}});
    cs.push_back(
        {"gather", no_strings, {{S{4, 50, 3}}, {S{6, 5}, id, gen::labels, 50}}, {{"axis", 1L}}});
    cs.push_back(
        {"gather", no_strings, {{S{1000, 64}}, {S{40000}, id, gen::labels, 1000}}, {{"axis", 0L}}});
    cs.push_back({"gather", no_strings, {{S{50}}, {S{17}, id, gen::labels, 50}}, {{"axis", 0L}}});
    cs.push_back({"gather", no_strings, {{S{50, 7}}, {S{0}, id, gen::labels, 50}}, {{"axis", 0L}}});
    cs.push_back({"gather", no_strings, {{S{50, 7}}, {S{}, id, gen::labels, 50}}, {{"axis", 0L}}});
    // The gradient of a segment sum: negative ids give rows of zeros.
    cs.push_back({"gather",
                  no_strings,
                  {{S{20, 3}}, {S{40}, id, gen::some_negative, 20}},
                  {{"axis", 0L}, {"drop_negative", true}}});
    // indexed_slices: dense shape from the attr or from a third input; negative
    // indices dropped; along a middle axis.
    cs.push_back({"indexed_slices",
                  numeric,
                  {{S{40, 6}}, {S{40}, id, gen::labels, 13}},
                  {{"axis", 0L}, {"dense_shape", std::vector<std::int64_t>{13, 6}}}});
    cs.push_back({"indexed_slices",
                  numeric,
                  {{S{300, 2}}, {S{300}, id, gen::some_negative, 7}},
                  {{"axis", 0L}, {"dense_shape", std::vector<std::int64_t>{7, 2}}}});
    cs.push_back({"indexed_slices",
                  numeric,
                  {{S{3, 40, 2}}, {S{40}, id, gen::labels, 9}},
                  {{"axis", 1L}, {"dense_shape", std::vector<std::int64_t>{3, 9, 2}}}});
    cs.push_back({"indexed_slices",
                  numeric,
                  {{S{40, 6}}, {S{40}, id, gen::labels, 13}, {S{13, 6}}},
                  {{"axis", 0L}}});
    cs.push_back({"indexed_slices",
                  numeric,
                  {{S{0, 6}}, {S{0}, id, gen::labels, 13}},
                  {{"axis", 0L}, {"dense_shape", std::vector<std::int64_t>{13, 6}}}});
    // unsorted_segment_sum: ids of rank 1 and 2, negative ids dropped, many ids per segment.
    cs.push_back({"unsorted_segment_sum",
                  numeric,
                  {{S{40, 5}}, {S{40}, id, gen::labels, 11}, {S{}, id, gen::count, 11}}});
    cs.push_back(
        {"unsorted_segment_sum",
         numeric,
         {{S{4, 10, 3}}, {S{4, 10}, id, gen::some_negative, 6}, {S{}, id, gen::count, 8}}});
    cs.push_back({"unsorted_segment_sum",
                  numeric,
                  {{S{30000, 2}}, {S{30000}, id, gen::labels, 5}, {S{}, id, gen::count, 5}}});
    cs.push_back({"unsorted_segment_sum",
                  numeric,
                  {{S{0, 5}}, {S{0}, id, gen::labels, 11}, {S{}, id, gen::count, 11}}});
    // The routing of embedding_lookup.
    for (const S& s : {S{200}, S{1}, S{0}}) {
      cs.push_back({"unique", {id}, {{s, {}, gen::labels, 37}}});
      cs.push_back({"unique_index", {id}, {{s, {}, gen::labels, 37}}});
    }
    for (const char* strategy : {"mod", "div"})
      for (const std::int64_t shards : {2L, 3L}) {
        for (std::int64_t shard = 0; shard < shards; ++shard)
          cs.push_back({"shard_unique",
                        {id},
                        {{S{100}, {}, gen::labels, 50}, {S{100}, dtype::i64, gen::labels, 60}},
                        {{"num_shards", shards},
                         {"shard", shard},
                         {"rows", 50L},
                         {"strategy", std::string(strategy)}}});
        cs.push_back(
            {"shard_slots",
             {id},
             {{S{100}, {}, gen::labels, 50}},
             {{"num_shards", shards}, {"rows", 50L}, {"strategy", std::string(strategy)}}});
      }
    // gather_shards: slots k * N + p name row k of shard p (slots < 12 name rows < 4 of each
    // of 3 shards), rows named repeatedly; its gradient sums them, per shard.
    cs.push_back({"gather_shards",
                  no_strings,
                  {{S{40}, id, gen::labels, 12}, {S{4, 3}}, {S{4, 3}}, {S{4, 3}}},
                  {{"N", 3L}}});
    cs.push_back({"gather_shards",
                  no_strings,
                  {{S{0}, id, gen::labels, 4}, {S{2, 16}}, {S{2, 16}}},
                  {{"N", 2L}}});
    for (std::int64_t shard = 0; shard < 3; ++shard)
      cs.push_back({"gather_shards_grad",
                    numeric,
                    {{S{300, 3}}, {S{300}, id, gen::labels, 12}},
                    {{"N", 3L}, {"shard", shard}}});
    // dynamic_stitch: indices repeated within and across parts (the last wins),
    // rows no index names (zeros), one part.
    cs.push_back({"dynamic_stitch",
                  no_strings,
                  {{S{5, 3}}, {S{4, 3}}, {S{5}, id, gen::labels, 9}, {S{4}, id, gen::labels, 9}},
                  {{"N", 2L}}});
    cs.push_back({"dynamic_stitch",
                  no_strings,
                  {{S{6, 2, 2}},
                   {S{0, 2, 2}},
                   {S{3, 2, 2}},
                   {S{6}, id, gen::labels, 12},
                   {S{0}, id, gen::labels, 12},
                   {S{3}, id, gen::labels, 12}},
                  {{"N", 3L}}});
    cs.push_back({"dynamic_stitch", no_strings, {{S{7}}, {S{7}, id, gen::labels, 7}}, {{"N", 1L}}});
  }
  cs.push_back({"sparse_segment_ids",
                {dtype::i64},
                {{S{20, 2}, {}, gen::sparse_indices, 10}, {S{2}, {}, gen::count, 10}}});
  cs.push_back({"sparse_segment_ids",
                {dtype::i64},
                {{S{30, 3}, {}, gen::sparse_indices, 5}, {S{3}, {}, gen::count, 5}}});
  cs.push_back({"sparse_segment_ids",
                {dtype::i64},
                {{S{0, 2}, {}, gen::sparse_indices, 10}, {S{2}, {}, gen::count, 10}}});
  // concat along the first and a later axis, an empty part; concat_grad of each part.
  cs.push_back({"concat", no_strings, {{S{3, 4}}, {S{3, 5}}, {S{3, 1}}}, {{"axis", 1L}}});
  cs.push_back({"concat", no_strings, {{S{2, 3}}, {S{0, 3}}, {S{4, 3}}}, {{"axis", 0L}}});
  cs.push_back({"concat", no_strings, {{S{2, 3, 2}}, {S{2, 1, 2}}}, {{"axis", 1L}}});
  cs.push_back({"concat", no_strings, {{S{1003}}}, {{"axis", 0L}}});
  for (std::int64_t index = 0; index < 3; ++index) {
    cs.push_back({"concat_grad",
                  no_strings,
                  {{S{3, 10}}, {S{3, 4}}, {S{3, 5}}, {S{3, 1}}},
                  {{"axis", 1L}, {"index", index}}});
    cs.push_back({"concat_grad",
                  no_strings,
                  {{S{6, 3}}, {S{2, 3}}, {S{0, 3}}, {S{4, 3}}},
                  {{"axis", 0L}, {"index", index}}});
  }
  return cs;
}

// Ops tested by their own cases below (refs, randomness), not by the table.
const std::set<std::string>& separately_tested() {
  static const std::set<std::string> ops{"variable",
                                         "assign",
                                         "assign_add",
                                         "assign_sub",
                                         "is_variable_initialized",
                                         "random_uniform",
                                         "random_normal",
                                         "truncated_normal",
                                         "apply_gradient_descent",
                                         "apply_momentum",
                                         "apply_adagrad",
                                         "apply_adam",
                                         "apply_rms_prop",
                                         "apply_ftrl",
                                         "sparse_apply_gradient_descent",
                                         "sparse_apply_momentum",
                                         "sparse_apply_adagrad",
                                         "sparse_apply_adam",
                                         "sparse_apply_rms_prop",
                                         "sparse_apply_ftrl",
                                         "resource_gather",
                                         "scatter_add",
                                         "scatter_sub",
                                         "scatter_update"};
  return ops;
}

// |x| of a floating-point tensor (the operands' size of check::sums).
any_tensor absolute(const any_tensor& x) {
  any_tensor out(x.type(), x.shape());
  visit_dtype(x.type(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<T>)
      for (std::int64_t i = 0; i < x.num_elements(); ++i)
        out.data<T>()[i] = std::abs(x.data<T>()[i]);
    else
      FAIL("absolute() of a " << to_string(x.type()) << " tensor");
  });
  return out;
}

// The slots shard_slots gives the ids, with a shard_unique node's routing attrs.
any_tensor slots_of(const node_def& shard_unique, const any_tensor& ids) {
  node_def n;
  n.op = "shard_slots";
  n.name = "slots";
  n.type = ids.type();
  n.attrs = shard_unique.attrs;
  n.attrs.erase("shard");
  test_resources res;
  return run_cpu(n, ids.type(), {&ids}, {}, res);
}

std::string describe_case(const op_case& c, dtype t) {
  std::string s = c.op + "<" + std::string(to_string(t)) + ">(";
  for (std::size_t i = 0; i < c.in.size(); ++i)
    s += (i ? ", " : "") + c.in[i].s.to_string();
  s += ")";
  for (const auto& [k, v] : c.attrs) {
    s += " " + k + "=";
    if (const auto* d = std::get_if<dtype>(&v))
      s += std::string(to_string(*d));
    else if (const auto* b = std::get_if<bool>(&v))
      s += *b ? "true" : "false";
    else if (const auto* str = std::get_if<std::string>(&v))
      s += *str;
    else if (const auto* i = std::get_if<std::int64_t>(&v))
      s += std::to_string(*i);
    else if (const auto* ax = std::get_if<std::vector<std::int64_t>>(&v)) {
      s += "{";
      for (std::size_t i = 0; i < ax->size(); ++i)
        s += (i ? "," : "") + std::to_string((*ax)[i]);
      s += "}";
    }
  }
  return s;
}

// -- fused regions: trees lowered in this unit, which nvcc compiles ------------------------------

// relu(a * b + c) * 2 - a: two tensor leaves (a twice), a scalar node and a number.
auto arith_tree(const placeholder<float, 2>& a, const placeholder<float, 2>& b,
                const placeholder<float, 0>& c) {
  return relu(a * b + c) * 2.0f - a;
}
// where(a < b, b - a, cast<float>(k)): a bool intermediate and a cast of int32. Its nodes
// are its own: a node shared with arith (a * b, say) has a consumer outside each region,
// so the plan would fuse neither.
auto mixed_tree(const placeholder<float, 2>& a, const placeholder<float, 2>& b,
                const placeholder<std::int32_t, 2>& k) {
  return where(a < b, b - a, cast<float>(k));
}

struct fused_graph {
  graph g;
  placeholder<float, 2> a{g, loom::shape{-1, -1}, "a"};
  placeholder<float, 2> b{g, loom::shape{-1, -1}, "b"};
  placeholder<float, 0> c{g, loom::shape{}, "c"};
  placeholder<std::int32_t, 2> k{g, loom::shape{-1, -1}, "k"};
  using arith_t = decltype(arith_tree(a, b, c));
  using mixed_t = decltype(mixed_tree(a, b, k));
  node_id arith = no_node, mixed = no_node;

  fused_graph() {
    auto on_gpu = g.device("/gpu:0");
    arith = lower(arith_tree(a, b, c)).id();
    mixed = lower(mixed_tree(a, b, k)).id();
  }

  const fusion_candidate& region(node_id root) const {
    for (const fusion_candidate& f : g.fusions())
      if (f.root == root)
        return f;
    FAIL("no fusion candidate at node " << root);
    throw;
  }

  // Random inputs: a, b and k of shape `s` (b of shape `b_shape` if given).
  // The values of `in` that feed `req`, in the order of its fed nodes.
  static std::vector<any_tensor> feeds(const detail::run_request& req,
                                       const std::map<node_id, any_tensor>& in) {
    std::vector<any_tensor> out;
    for (node_id id : req.fed)
      out.push_back(in.at(id));
    return out;
  }

  std::map<node_id, any_tensor> inputs(const loom::shape& s, std::mt19937_64& rng,
                                       std::optional<loom::shape> b_shape = {}) const {
    return {{a.id(), random_tensor(dtype::f32, s, gen::any, 0, rng)},
            {b.id(), random_tensor(dtype::f32, b_shape.value_or(s), gen::any, 0, rng)},
            {c.id(), random_tensor(dtype::f32, loom::shape{}, gen::any, 0, rng)},
            {k.id(), random_tensor(dtype::i32, s, gen::any, 0, rng)}};
  }

  // The region's leaves in its kernel's order: a fed value, or a constant's.
  std::vector<const any_tensor*> leaves(node_id root,
                                        const std::map<node_id, any_tensor>& in) const {
    std::vector<const any_tensor*> out;
    for (node_id l : region(root).leaves) {
      if (auto it = in.find(l); it != in.end())
        out.push_back(&it->second);
      else
        out.push_back(&std::get<any_tensor>(g.node(l).attrs.at("value")));
    }
    return out;
  }
};

// Poisons the next 8 blocks of `bytes` on GPU 0 (as poisoned_kernel does
// for one kernel), for a whole step's leaf copies and outputs.
void poison_next_blocks(std::size_t bytes) {
  auto* gpus = dynamic_cast<loom::cuda::backend*>(&backend());
  REQUIRE(gpus != nullptr);
  gpus->on_device(0, [bytes](const gpu_context& g) { poison_blocks(g, bytes, 8); });
}

// Copies of `leaves` on GPU 0, and pointers to them in the same order (what
// a region's GPU kernel takes).
struct gpu_leaves {
  std::vector<any_tensor> copies;
  std::vector<const any_tensor*> pointers;

  explicit gpu_leaves(const std::vector<const any_tensor*>& leaves) {
    copies.reserve(leaves.size());
    for (const any_tensor* l : leaves)
      pointers.push_back(&copies.emplace_back(to_gpu(*l)));
  }
};

// An optimizer update as the update tests run it: its slots, its scalar
// inputs before the gradient (after the refs) and after it.
struct update_op {
  std::string op;
  int slots;
  std::vector<std::pair<std::string, double>> scalars;
  bool nesterov;
  std::vector<std::pair<std::string, double>> after{};
};

// FTRL's scalars, which come after its gradient.
std::vector<std::pair<std::string, double>> ftrl_scalars(double lr_power, double shrinkage) {
  return {
      {"lr", 0.1}, {"l1", 0.01}, {"l2", 0.02}, {"l2_shrinkage", shrinkage}, {"lr_power", lr_power}};
}

// Every dense update, with and without Nesterov where it has it, FTRL with lr_power -0.5
// (a square root) and another (pow).
std::vector<update_op> dense_updates() {
  return {
      {"apply_gradient_descent", 0, {{"alpha", 0.1}}, false},
      {"apply_momentum", 1, {{"lr", 0.05}}, false, {{"momentum", 0.9}}},
      {"apply_momentum", 1, {{"lr", 0.05}}, true, {{"momentum", 0.9}}},
      {"apply_adagrad", 1, {{"lr", 0.1}}, false},
      {"apply_adam",
       2,
       {{"beta1_power", 0.9},
        {"beta2_power", 0.999},
        {"lr", 0.01},
        {"beta1", 0.9},
        {"beta2", 0.999},
        {"epsilon", 1e-7}},
       false},
      {"apply_adam",
       2,
       {{"beta1_power", 0.81},
        {"beta2_power", 0.998},
        {"lr", 0.01},
        {"beta1", 0.9},
        {"beta2", 0.999},
        {"epsilon", 1e-7}},
       true},
      {"apply_rms_prop",
       2,
       {{"lr", 0.01}, {"rho", 0.9}, {"momentum", 0.5}, {"epsilon", 1e-7}},
       false},
      {"apply_ftrl", 2, {}, false, ftrl_scalars(-0.5, 0.0)},
      {"apply_ftrl", 2, {}, false, ftrl_scalars(-0.6, 0.1)},
  };
}

// Scalar tensors of dtype t (float32 or float64) and their copies on GPU 0.
std::pair<std::vector<any_tensor>, std::vector<any_tensor>>
scalar_inputs(const std::vector<std::pair<std::string, double>>& values, dtype t) {
  std::vector<any_tensor> host, dev;
  for (const auto& [name, value] : values) {
    host.push_back(t == dtype::f32 ? any_tensor::scalar(static_cast<float>(value))
                                   : any_tensor::scalar(value));
    dev.push_back(to_gpu(host.back()));
  }
  return {host, dev};
}

// The error a kernel throws, "" when it throws none.
template <class F> std::string error_of(F&& run) {
  try {
    run();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Keeps the GPU busy for about `ns` nanoseconds: what is queued behind it runs later.
__global__ void spin_kernel(unsigned long long ns) {
  const unsigned long long start = clock64();
  // clock64 counts one multiprocessor's cycles: at most ~2 GHz, so ns cycles last >= ns / 2.
  while (clock64() - start < 2 * ns) {
  }
}

} // namespace gpu_kernels_test

// -- no GPU needed
// ---------------------------------------------------------------------------------------

TEST_SUITE("cuda_host") {
  using namespace gpu_kernels_test;

  TEST_CASE("every CPU kernel has a GPU kernel for the same dtypes, but the listed CPU-only ops") {
    const auto& kernels = kernel_registry::instance();
    const auto names = op_registry::instance().names();
    REQUIRE(names.size() > 40); // the CPU kernels' unit registered its ops
    int cpu_kernels = 0;
    for (const std::string& op : names)
      for (dtype t : every_dtype()) {
        if (!kernels.find(op, t, device_cpu))
          continue;
        ++cpu_kernels;
        // Strings never live on a GPU.
        if (t == dtype::string || cpu_only_ops().count(op))
          continue;
        INFO(op << " with dtype " << to_string(t));
        const bool has_gpu_kernel = kernels.find(op, t, device_gpu) != nullptr;
        CHECK_MESSAGE(has_gpu_kernel,
                      "the CPU has a kernel the GPU lacks: add it to kernels/cuda/ or, if it must "
                      "stay on the CPU, to cpu_only_ops() with the reason");
      }
    CHECK(cpu_kernels > 100);
    // The CPU-only list names only ops that exist and have no GPU kernel.
    for (const std::string& op : cpu_only_ops()) {
      INFO(op);
      CHECK(kernels.has(op, device_cpu));
      CHECK_FALSE(kernels.has(op, device_gpu));
    }
  }

  TEST_CASE("a graph lowered by nvcc has its regions' GPU kernels beside the CPU's") {
    fused_graph fg;
    for (node_id root : {fg.arith, fg.mixed}) {
      const std::string& key = fg.region(root).key;
      INFO(key);
      const bool has_cpu = kernels::fused_kernel_registry::instance().find(key) != nullptr;
      const bool has_gpu = kernels::fused_kernel_registry::instance().find_gpu(key) != nullptr;
      CHECK(has_cpu);
      CHECK(has_gpu);
    }
    CHECK(fg.region(fg.arith).key == detail::region_key<fused_graph::arith_t>());
    CHECK(fg.region(fg.mixed).key == detail::region_key<fused_graph::mixed_t>());
  }

  TEST_CASE("a plan with every node on /gpu:0 runs each region as one GPU kernel") {
    fused_graph fg;
    const detail::run_request req{
        {fg.arith, fg.mixed}, {}, {fg.a.id(), fg.b.id(), fg.c.id(), fg.k.id()}};
    const detail::plan gpu_plan(fg.g, req, true,
                                std::vector<memory_location>(fg.g.size(), memory_location::gpu(0)));
    std::set<node_id> fused_roots;
    for (const detail::plan::item& st : gpu_plan.items()) {
      if (st.k == detail::plan::item::kind::fused) {
        fused_roots.insert(st.id);
        CHECK(st.where == memory_location::gpu(0));
        const bool has_gpu_kernel = st.gpu_fused != nullptr;
        CHECK(has_gpu_kernel);
      }
    }
    CHECK(fused_roots == std::set<node_id>{fg.arith, fg.mixed});
  }

  TEST_CASE("a region's device tree reads its leaves as the CPU's fused kernel does (emulated)") {
    fused_graph fg;
    std::mt19937_64 rng(fresh_seed());
    for (const loom::shape& s : {loom::shape{1, 1}, loom::shape{1, 3}, loom::shape{2, 2},
                                 loom::shape{3, 7}, loom::shape{17, 61}}) {
      const auto in = fg.inputs(s, rng);
      const auto n = static_cast<std::size_t>(s.num_elements());
      auto check_region = [&]<class E>(std::type_identity<E>, node_id root) {
        const auto leaves = fg.leaves(root, in);
        any_tensor cpu;
        REQUIRE(fused_kernel<E>(host_device(), leaves, cpu, "cpu"));
        for (const std::size_t threads : {1, 3, 64})
          for (const bool vectorized : {false, true}) {
            INFO("shape " << s.to_string() << ", " << threads << " threads, "
                          << (vectorized ? "4-wide" : "scalar"));
            any_tensor emulated(dtype::f32, s);
            std::fill_n(emulated.data<float>(), n, std::numeric_limits<float>::quiet_NaN());
            const auto tree = loom::cuda::detail::region_tree<E>(leaves);
            if (vectorized &&
                !loom::cuda::detail::vectorizable_tree(tree, emulated.data<float>(), n))
              continue;
            loom::cuda::detail::emulate_tree_on_host(tree, emulated.data<float>(), n, threads,
                                                     vectorized);
            compare(cpu, emulated, check::elementwise, fg.region(root).key);
          }
      };
      check_region(std::type_identity<fused_graph::arith_t>{}, fg.arith);
      check_region(std::type_identity<fused_graph::mixed_t>{}, fg.mixed);
    }
  }

  TEST_CASE("a GPU uniform draw stays below its upper bound after rounding") {
    const double just_below_one = 1.0 - 0x1.0p-53; // the largest uniform01 draw
    CHECK(cuda_kernels::uniform_in<float>(0.0, 1.0, just_below_one) < 1.0f);
    CHECK(cuda_kernels::uniform_in<double>(0.0, 1.0, just_below_one) < 1.0);
    CHECK(cuda_kernels::uniform_in<float>(5.0, 6.0, just_below_one) < 6.0f);
    CHECK(cuda_kernels::uniform_in<float>(-2.0, 3.0, 0.5) == 0.5f);
  }

  TEST_CASE("the device cases cover every GPU kernel") {
    std::set<std::pair<std::string, dtype>> covered;
    for (const op_case& c : make_cases())
      for (dtype t : c.types) {
        INFO(describe_case(c, t));
        const bool exists = kernel_registry::instance().find(c.op, t, device_gpu) != nullptr;
        CHECK_MESSAGE(exists, "a case for a kernel that does not exist");
        covered.insert({c.op, t});
      }
    for (const std::string& op : op_registry::instance().names())
      for (dtype t : every_dtype()) {
        if (!kernel_registry::instance().find(op, t, device_gpu) || separately_tested().count(op))
          continue;
        INFO(op << " with dtype " << to_string(t));
        CHECK_MESSAGE(covered.count({op, t}), "no device case runs this GPU kernel");
      }
  }

} // TEST_SUITE

// -- on a GPU (skipped without one)
// ----------------------------------------------------------------------

TEST_SUITE("cuda_device" * doctest::skip(!gpu_kernels_test::have_gpu())) {
  using namespace gpu_kernels_test;

  TEST_CASE("every GPU kernel computes what the CPU kernel computes") {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    int runs = 0;
    for (const op_case& c : make_cases())
      for (dtype t : c.types) {
        const std::string what = describe_case(c, t);
        INFO(what);
        // One case that throws fails as itself; the cases after it still run (on a
        // lent GPU, one run has to show every kernel).
        try {
          node_def n;
          n.op = c.op;
          n.name = "case";
          n.type = t;
          n.attrs = c.attrs;
          std::vector<any_tensor> host, dev;
          if (c.value) {
            n.attrs["value"] = random_tensor(t, *c.value, gen::any, 0, rng);
            n.shape = *c.value;
          }
          for (const in_spec& s : c.in)
            host.push_back(random_tensor(s.fixed.value_or(t), s.s, s.g, s.classes, rng));
          // shard_unique's slots are shard_slots of its ids, as in a graph: slots drawn
          // apart from the ids would name rows that no id writes.
          if (c.op == "shard_unique")
            host[1] = slots_of(n, host[0]);
          for (const any_tensor& h : host)
            dev.push_back(to_gpu(h));
          std::vector<const any_tensor*> host_in, dev_in;
          for (std::size_t i = 0; i < host.size(); ++i) {
            host_in.push_back(&host[i]);
            dev_in.push_back(&dev[i]);
          }
          test_resources cpu_res, gpu_res;
          const any_tensor expected = run_cpu(n, t, host_in, {}, cpu_res);
          const any_tensor got = run_gpu(n, t, dev_in, {}, gpu_res, expected.byte_size());
          const bool integral = expected.empty() || expected.type() == dtype::boolean ||
                                expected.type() == dtype::i32 || expected.type() == dtype::i64;
          any_tensor magnitude;
          if (c.how == check::sums && !integral) {
            const any_tensor abs_x = absolute(host[0]);
            test_resources abs_res;
            magnitude = run_cpu(n, t, {&abs_x}, {}, abs_res);
          }
          compare(expected, got, integral ? check::elementwise : c.how, what, 1e-3, &magnitude);
          ++runs;
          // reshape and identity share the input's device memory, as on the CPU.
          if (c.op == "reshape" || c.op == "reshape_like" || c.op == "identity" ||
              c.op == "expand_dims" || c.op == "squeeze")
            CHECK(got.shares_buffer_with(dev[0]));
        } catch (const std::exception& e) {
          FAIL_CHECK("threw: " << e.what());
        }
      }
    MESSAGE(runs << " kernel runs compared");
  }

  TEST_CASE("the GPU kernels refuse what the CPU kernels refuse, with the same message") {
    struct bad {
      std::string op;
      std::vector<loom::shape> in;
      attr_map attrs;
    };
    using S = loom::shape;
    const std::vector<bad> cases{
        {"add", {S{3, 4}, S{5}}, {}},
        {"matmul", {S{3, 4}, S{5, 6}}, {}},
        {"matmul", {S{3}, S{3, 6}}, {}},
        {"xw_plus_b", {S{3, 4}, S{4, 5}, S{6}}, {}},
        {"reduce_sum", {S{3, 4}}, {{"axes", std::vector<std::int64_t>{2}}}},
        {"reduce_grad",
         {S{5}, S{3, 4}},
         {{"axes", std::vector<std::int64_t>{1}}, {"mode", std::string("sum")}}},
        {"argmax", {S{3, 0}}, {{"axis", std::int64_t{1}}}},
        {"reshape", {S{6, 4}}, {{"dims", std::vector<std::int64_t>{5, -1}}}},
        {"reshape_like", {S{6, 4}, S{5}}, {}},
        {"softmax", {S{}}, {}},
        {"softmax_grad", {S{3, 4}, S{3, 5}}, {}},
        {"softmax_cross_entropy_with_logits", {S{3, 4}, S{3, 5}}, {}},
        {"xent_grad", {S{2}, S{3, 4}, S{3, 4}}, {}},
        {"sum_to_shape", {S{3, 4}, S{5}}, {}},
        {"add_n", {S{3, 4}, S{3, 4}, S{4, 3}}, {}},
    };
    std::mt19937_64 rng(fresh_seed());
    for (const bad& b : cases) {
      INFO(b.op);
      node_def n;
      n.op = b.op;
      n.name = "bad";
      n.attrs = b.attrs;
      std::vector<any_tensor> host, dev;
      for (const S& s : b.in) {
        host.push_back(random_tensor(dtype::f32, s, gen::any, 0, rng));
        dev.push_back(to_gpu(host.back()));
      }
      std::vector<const any_tensor*> host_in, dev_in;
      for (std::size_t i = 0; i < host.size(); ++i) {
        host_in.push_back(&host[i]);
        dev_in.push_back(&dev[i]);
      }
      test_resources res;
      std::string cpu_error, gpu_error;
      try {
        run_cpu(n, dtype::f32, host_in, {}, res);
      } catch (const std::exception& e) {
        cpu_error = e.what();
      }
      try {
        run_gpu(n, dtype::f32, dev_in, {}, res, 0);
      } catch (const std::exception& e) {
        gpu_error = e.what();
      }
      CHECK_FALSE(cpu_error.empty());
      CHECK(gpu_error == cpu_error);
    }
    // Sparse labels: the shape is checked on the host, values out of range give NaN.
    node_def n;
    n.op = "sparse_softmax_cross_entropy_with_logits";
    n.name = "sparse";
    const any_tensor labels = any_tensor::from_vector<std::int32_t>(S{2}, {1, 7});
    const any_tensor logits = random_tensor(dtype::f32, S{2, 4}, gen::any, 0, rng);
    const any_tensor dl = to_gpu(labels), dx = to_gpu(logits);
    test_resources res;
    const any_tensor out = to_host(run_gpu(n, dtype::f32, {&dl, &dx}, {}, res, 8));
    CHECK(std::isfinite(out.data<float>()[0]));
    CHECK(std::isnan(out.data<float>()[1]));
  }

  TEST_CASE("variables, assign, assign_add, assign_sub and is_variable_initialized") {
    std::mt19937_64 rng(fresh_seed());
    for (dtype t : no_strings) {
      INFO(to_string(t));
      const loom::shape s{1003};
      node_def var;
      var.op = "variable";
      var.name = "v";
      var.type = t;
      var.shape = s;
      test_resources cpu_res, gpu_res;
      variable_resource& cv = cpu_res.variable(var);
      variable_resource& gv = gpu_res.variable(var);
      auto apply = [&](const std::string& op, const any_tensor& value) {
        node_def n;
        n.op = op;
        n.name = op;
        n.type = t;
        n.attrs["_ref_name_0"] = std::string("v");
        const any_tensor dvalue = to_gpu(value);
        const any_tensor c = run_cpu(n, t, {nullptr, &value}, {&cv}, cpu_res);
        const any_tensor g = run_gpu(n, t, {nullptr, &dvalue}, {&gv}, gpu_res, value.byte_size());
        compare(c, g, check::elementwise, op);
        CHECK(g.shares_buffer_with(gv.value));
        CHECK(gv.value.location() == memory_location::gpu(0));
      };
      node_def init;
      init.op = "is_variable_initialized";
      init.name = "init";
      init.type = dtype::boolean;
      auto initialized = [&] {
        const any_tensor g = run_gpu(init, dtype::boolean, {nullptr}, {&gv}, gpu_res, 1);
        return to_host(g).data<bool>()[0];
      };
      CHECK_FALSE(initialized());
      apply("assign", random_tensor(t, s, gen::any, 0, rng));
      CHECK(initialized());
      // An initialized variable nothing else holds is assigned in its own buffer (a step
      // replayed from a CUDA graph reads it there).
      const void* buffer = gv.value.device_data();
      apply("assign", random_tensor(t, s, gen::any, 0, rng));
      CHECK(gv.value.device_data() == buffer);
      if (t != dtype::boolean) {
        apply("assign_add", random_tensor(t, s, gen::any, 0, rng));
        apply("assign_sub", random_tensor(t, s, gen::any, 0, rng));
      }
      const any_tensor read = run_gpu(var, t, {}, {}, gpu_res, 0);
      CHECK(read.shares_buffer_with(gv.value));
      compare(run_cpu(var, t, {}, {}, cpu_res), read, check::elementwise, "variable");
      // A variable whose value is on the host is read as a device copy.
      gv.value = cv.value.clone();
      compare(cv.value, run_gpu(var, t, {}, {}, gpu_res, cv.value.byte_size()), check::elementwise,
              "variable on the host");
      CHECK(gv.value.on_host());
    }
  }

  TEST_CASE("the optimizer updates match the CPU's over several steps") {
    const std::vector<update_op> updates = dense_updates();
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (const update_op& u : updates)
      for (dtype t : floats) {
        INFO(u.op << "<" << to_string(t) << "> nesterov " << u.nesterov);
        const loom::shape s{1003};
        node_def n;
        n.op = u.op;
        n.name = u.op;
        n.type = t;
        n.attrs["use_nesterov"] = u.nesterov;
        test_resources cpu_res, gpu_res;
        std::vector<variable_resource*> cpu_refs, gpu_refs;
        for (int k = 0; k <= u.slots; ++k) {
          node_def v;
          v.name = "ref" + std::to_string(k);
          n.attrs["_ref_name_" + std::to_string(k)] = v.name;
          variable_resource& c = cpu_res.variable(v);
          variable_resource& g = gpu_res.variable(v);
          // Slots hold accumulated squares in some updates: positive.
          c.value = random_tensor(t, s, k == 0 ? gen::any : gen::positive, 0, rng);
          c.initialized = g.initialized = true;
          g.value = to_gpu(c.value);
          cpu_refs.push_back(&c);
          gpu_refs.push_back(&g);
        }
        const auto [scalars, dscalars] = scalar_inputs(u.scalars, t);
        const auto [after, dafter] = scalar_inputs(u.after, t);
        for (int step = 0; step < 5; ++step) {
          const any_tensor grad = random_tensor(t, s, gen::any, 0, rng);
          const any_tensor dgrad = to_gpu(grad);
          std::vector<const any_tensor*> host_in(static_cast<std::size_t>(u.slots + 1), nullptr);
          std::vector<const any_tensor*> dev_in = host_in;
          for (std::size_t k = 0; k < scalars.size(); ++k) {
            host_in.push_back(&scalars[k]);
            dev_in.push_back(&dscalars[k]);
          }
          host_in.push_back(&grad);
          dev_in.push_back(&dgrad);
          for (std::size_t k = 0; k < after.size(); ++k) {
            host_in.push_back(&after[k]);
            dev_in.push_back(&dafter[k]);
          }
          // On odd steps a reader holds every ref on both sides (a value read
          // earlier in the step): the update copies them before it writes, and
          // the reader keeps what it read.
          std::vector<any_tensor> cpu_held, gpu_held, gpu_held_values;
          if (step % 2 == 1)
            for (int k = 0; k <= u.slots; ++k) {
              cpu_held.push_back(cpu_refs[static_cast<std::size_t>(k)]->value);
              gpu_held.push_back(gpu_refs[static_cast<std::size_t>(k)]->value);
              gpu_held_values.push_back(to_host(gpu_held.back()));
            }
          const any_tensor c = run_cpu(n, t, host_in, cpu_refs, cpu_res);
          const any_tensor g = run_gpu(n, t, dev_in, gpu_refs, gpu_res, 0);
          CHECK(g.shares_buffer_with(gpu_refs[0]->value));
          CHECK(c.shares_buffer_with(cpu_refs[0]->value));
          for (std::size_t k = 0; k < gpu_held.size(); ++k) {
            CHECK_FALSE(cpu_refs[k]->value.shares_buffer_with(cpu_held[k]));
            CHECK_FALSE(gpu_refs[k]->value.shares_buffer_with(gpu_held[k]));
            compare(gpu_held_values[k], gpu_held[k], check::elementwise,
                    "what a reader of ref " + std::to_string(k) + " holds");
          }
        }
        for (int k = 0; k <= u.slots; ++k)
          compare(cpu_refs[static_cast<std::size_t>(k)]->value,
                  gpu_refs[static_cast<std::size_t>(k)]->value, check::l2,
                  "ref " + std::to_string(k) + " after 5 steps");
      }
  }

  TEST_CASE("a batch of updates computes what each update alone computes, to the bit") {
    // The batch kernel (kernels/cuda/training.cuh, run_dense_updates) over 30 variables, more
    // than one launch holds, of 0 to 1 100 elements; and a batch naming one variable twice,
    // which runs its updates in turn.
    const std::vector<update_op> updates = dense_updates();
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    constexpr int vars = 30;
    for (const update_op& u : updates)
      for (dtype t : floats) {
        INFO(u.op << "<" << to_string(t) << "> nesterov " << u.nesterov);
        const batch_kernel_fn batch = kernel_registry::instance().find_batch(u.op, t, device_gpu);
        REQUIRE(static_cast<bool>(batch));
        test_resources alone_res, batch_res;
        std::vector<node_def> nodes(vars);
        std::vector<std::vector<variable_resource*>> alone(vars), batched(vars);
        for (int v = 0; v < vars; ++v) {
          node_def& n = nodes[static_cast<std::size_t>(v)];
          n.op = u.op;
          n.name = u.op + std::to_string(v);
          n.type = t;
          n.attrs["use_nesterov"] = u.nesterov;
          const loom::shape s{v * 37 % 1100};
          for (int k = 0; k <= u.slots; ++k) {
            node_def r;
            r.name = "var" + std::to_string(v) + "_ref" + std::to_string(k);
            n.attrs["_ref_name_" + std::to_string(k)] = r.name;
            variable_resource& a = alone_res.variable(r);
            variable_resource& b = batch_res.variable(r);
            a.value = to_gpu(random_tensor(t, s, k == 0 ? gen::any : gen::positive, 0, rng));
            b.value = to_gpu(to_host(a.value));
            a.initialized = b.initialized = true;
            alone[static_cast<std::size_t>(v)].push_back(&a);
            batched[static_cast<std::size_t>(v)].push_back(&b);
          }
        }
        const auto [scalars, dscalars] = scalar_inputs(u.scalars, t);
        const auto [after, dafter] = scalar_inputs(u.after, t);
        const auto inputs_of = [&](const any_tensor& grad) {
          std::vector<const any_tensor*> in(static_cast<std::size_t>(u.slots + 1), nullptr);
          for (const any_tensor& x : dscalars)
            in.push_back(&x);
          in.push_back(&grad);
          for (const any_tensor& x : dafter)
            in.push_back(&x);
          return in;
        };
        const auto run_batch = [&](const std::vector<int>& which,
                                   const std::vector<any_tensor>& grads) {
          std::vector<std::vector<const any_tensor*>> in;
          std::vector<kernel_context> contexts;
          std::vector<kernel_context*> pointers;
          in.reserve(which.size());
          contexts.reserve(which.size());
          for (std::size_t i = 0; i < which.size(); ++i) {
            const auto v = static_cast<std::size_t>(which[i]);
            in.push_back(inputs_of(grads[i]));
            contexts.push_back(kernel_context{
                nodes[v], in.back(), batched[v], host_device(), batch_res, {}, 0, nullptr});
          }
          for (kernel_context& c : contexts)
            pointers.push_back(&c);
          backend().run_batch(0, batch, pointers);
          for (std::size_t i = 0; i < which.size(); ++i)
            CHECK(contexts[i].output.shares_buffer_with(
                batched[static_cast<std::size_t>(which[i])][0]->value));
        };
        std::vector<int> every(vars);
        for (int v = 0; v < vars; ++v)
          every[static_cast<std::size_t>(v)] = v;
        for (int step = 0; step < 3; ++step) {
          std::vector<any_tensor> grads;
          for (int v = 0; v < vars; ++v) {
            grads.push_back(to_gpu(random_tensor(
                t, alone[static_cast<std::size_t>(v)][0]->value.shape(), gen::any, 0, rng)));
            run_gpu(nodes[static_cast<std::size_t>(v)], t, inputs_of(grads.back()),
                    alone[static_cast<std::size_t>(v)], alone_res, 0);
          }
          run_batch(every, grads);
        }
        // Variable 7 twice in one batch: updated by each, in turn.
        const any_tensor g1 = to_gpu(random_tensor(t, loom::shape{7 * 37}, gen::any, 0, rng));
        const any_tensor g2 = to_gpu(random_tensor(t, loom::shape{7 * 37}, gen::any, 0, rng));
        run_gpu(nodes[7], t, inputs_of(g1), alone[7], alone_res, 0);
        run_gpu(nodes[7], t, inputs_of(g2), alone[7], alone_res, 0);
        run_batch({7, 7}, {g1, g2});
        for (std::size_t v = 0; v < vars; ++v)
          for (std::size_t k = 0; k < alone[v].size(); ++k) {
            INFO("variable " << v << " ref " << k);
            const any_tensor a = to_host(alone[v][k]->value), b = to_host(batched[v][k]->value);
            CHECK(a.shape() == b.shape());
            CHECK(std::memcmp(a.raw_data(), b.raw_data(), a.byte_size()) == 0);
          }
      }
  }

  TEST_CASE("an update refuses a variable that is not on the GPU") {
    node_def n;
    n.op = "apply_gradient_descent";
    n.name = "sgd";
    n.type = dtype::f32;
    n.attrs["_ref_name_0"] = std::string("w");
    test_resources res;
    node_def v;
    v.name = "w";
    variable_resource& w = res.variable(v);
    w.value = any_tensor::from_vector<float>(loom::shape{2}, {1, 2});
    w.initialized = true;
    const any_tensor alpha = to_gpu(any_tensor::scalar(0.5f));
    const any_tensor delta = to_gpu(any_tensor::from_vector<float>(loom::shape{2}, {1, 1}));
    CHECK_THROWS_WITH_AS(run_gpu(n, dtype::f32, {nullptr, &alpha, &delta}, {&w}, res, 0),
                         doctest::Contains("variable 'w' is float32[2] on the host"),
                         failed_precondition_error);
  }

  TEST_CASE("the sparse updates match the CPU's over several steps, repeated indices summed") {
    std::vector<update_op> updates = dense_updates(); // their sparse twins
    for (update_op& u : updates)
      u.op = "sparse_" + u.op;
    // Each step's indices: a shape and how many rows they are drawn from
    // (few: every row repeated many times), of rank 2, none, one.
    const std::vector<std::pair<loom::shape, std::int64_t>> steps{
        {loom::shape{40}, 1000}, {loom::shape{40}, 5},   {loom::shape{4, 10}, 1000},
        {loom::shape{0}, 1000},  {loom::shape{1}, 1000}, {loom::shape{300}, 3}};
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (const update_op& u : updates)
      for (dtype t : floats)
        for (dtype id : {dtype::i32, dtype::i64})
          for (const loom::shape& s : {loom::shape{50, 7}, loom::shape{30}}) {
            INFO(u.op << "<" << to_string(t) << "> nesterov " << u.nesterov << ", " << to_string(id)
                      << " indices into " << s.to_string());
            node_def n;
            n.op = u.op;
            n.name = u.op;
            n.type = t;
            n.attrs["use_nesterov"] = u.nesterov;
            test_resources cpu_res, gpu_res;
            std::vector<variable_resource*> cpu_refs, gpu_refs;
            std::vector<any_tensor> initial;
            for (int k = 0; k <= u.slots; ++k) {
              node_def v;
              v.name = "ref" + std::to_string(k);
              n.attrs["_ref_name_" + std::to_string(k)] = v.name;
              variable_resource& c = cpu_res.variable(v);
              variable_resource& g = gpu_res.variable(v);
              // Slots hold accumulated squares in some updates: positive.
              c.value = random_tensor(t, s, k == 0 ? gen::any : gen::positive, 0, rng);
              c.initialized = g.initialized = true;
              g.value = to_gpu(c.value);
              initial.push_back(c.value.clone());
              cpu_refs.push_back(&c);
              gpu_refs.push_back(&g);
            }
            const auto [scalars, dscalars] = scalar_inputs(u.scalars, t);
            const auto [after, dafter] = scalar_inputs(u.after, t);
            const std::int64_t rows = s[0], row = s.num_elements() / s[0];
            std::set<std::int64_t> touched;
            for (const auto& [ids_shape, from] : steps) {
              const any_tensor indices =
                  random_tensor(id, ids_shape, gen::labels, std::min(from, rows), rng);
              with_ids(indices, [&](const auto* i) {
                for (std::int64_t k = 0; k < indices.num_elements(); ++k)
                  touched.insert(static_cast<std::int64_t>(i[k]));
              });
              std::vector<std::int64_t> grad_dims = ids_shape.dims();
              grad_dims.insert(grad_dims.end(), s.dims().begin() + 1, s.dims().end());
              const any_tensor grad = random_tensor(t, loom::shape(grad_dims), gen::any, 0, rng);
              const any_tensor dgrad = to_gpu(grad), dindices = to_gpu(indices);
              std::vector<const any_tensor*> host_in(static_cast<std::size_t>(u.slots + 1),
                                                     nullptr);
              std::vector<const any_tensor*> dev_in = host_in;
              for (std::size_t k = 0; k < scalars.size(); ++k) {
                host_in.push_back(&scalars[k]);
                dev_in.push_back(&dscalars[k]);
              }
              host_in.push_back(&grad);
              dev_in.push_back(&dgrad);
              for (std::size_t k = 0; k < after.size(); ++k) {
                host_in.push_back(&after[k]);
                dev_in.push_back(&dafter[k]);
              }
              host_in.push_back(&indices);
              dev_in.push_back(&dindices);
              const any_tensor c = run_cpu(n, t, host_in, cpu_refs, cpu_res);
              const any_tensor g = run_gpu(n, t, dev_in, gpu_refs, gpu_res, 0);
              // In place, as on the CPU.
              CHECK(g.shares_buffer_with(gpu_refs[0]->value));
              CHECK(c.shares_buffer_with(cpu_refs[0]->value));
            }
            for (std::size_t k = 0; k < cpu_refs.size(); ++k) {
              compare(cpu_refs[k]->value, gpu_refs[k]->value, check::l2,
                      "ref " + std::to_string(k) + " after " + std::to_string(steps.size()) +
                          " steps");
              // The rows no index named are as they were, to the bit.
              const any_tensor got = to_host(gpu_refs[k]->value);
              std::int64_t changed = 0;
              for (std::int64_t r = 0; r < rows; ++r)
                if (!touched.count(r))
                  changed += std::memcmp(static_cast<const char*>(got.raw_data()) +
                                             r * row * static_cast<std::int64_t>(size_of(t)),
                                         static_cast<const char*>(initial[k].raw_data()) +
                                             r * row * static_cast<std::int64_t>(size_of(t)),
                                         static_cast<std::size_t>(row) * size_of(t)) != 0;
              CHECK_MESSAGE(changed == 0, changed << " rows no index named changed in ref " << k);
            }
          }
  }

  TEST_CASE("scatter_add, scatter_sub and scatter_update match the CPU's, repeated indices "
            "included") {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    for (const char* op : {"scatter_add", "scatter_sub", "scatter_update"})
      for (dtype t : numeric)
        for (dtype id : {dtype::i32, dtype::i64})
          for (const loom::shape& s : {loom::shape{20, 3}, loom::shape{20}}) {
            INFO(op << "<" << to_string(t) << "> " << to_string(id) << " indices into "
                    << s.to_string());
            node_def var;
            var.name = "v";
            node_def n;
            n.op = op;
            n.name = op;
            n.type = t;
            n.attrs["_ref_name_0"] = std::string("v");
            test_resources cpu_res, gpu_res;
            variable_resource& cv = cpu_res.variable(var);
            variable_resource& gv = gpu_res.variable(var);
            cv.value = random_tensor(t, s, gen::any, 0, rng);
            gv.value = to_gpu(cv.value);
            cv.initialized = gv.initialized = true;
            // Indices repeated (30 of 20 rows; 15 of 4), of rank 2, none.
            for (const auto& [ids_shape, from] : std::vector<std::pair<loom::shape, std::int64_t>>{
                     {loom::shape{30}, 20}, {loom::shape{3, 5}, 4}, {loom::shape{0}, 20}}) {
              const any_tensor indices = random_tensor(id, ids_shape, gen::labels, from, rng);
              std::vector<std::int64_t> dims = ids_shape.dims();
              dims.insert(dims.end(), s.dims().begin() + 1, s.dims().end());
              const any_tensor updates = random_tensor(t, loom::shape(dims), gen::any, 0, rng);
              const any_tensor dindices = to_gpu(indices), dupdates = to_gpu(updates);
              const any_tensor c = run_cpu(n, t, {nullptr, &indices, &updates}, {&cv}, cpu_res);
              const any_tensor g =
                  run_gpu(n, t, {nullptr, &dindices, &dupdates}, {&gv}, gpu_res, 0);
              CHECK(g.shares_buffer_with(gv.value));
              // Each row's updates applied in the CPU's order: the same numbers.
              compare(c, g, check::elementwise, std::string(op) + " of " + indices.describe());
            }
          }
  }

  TEST_CASE("resource_gather reads a variable on the GPU as the CPU's does") {
    std::mt19937_64 rng(fresh_seed());
    for (dtype t : no_strings)
      for (dtype id : {dtype::i32, dtype::i64}) {
        INFO(to_string(t) << " variable, " << to_string(id) << " ids");
        node_def var;
        var.name = "v";
        node_def n;
        n.op = "resource_gather";
        n.name = "lookup";
        n.type = t;
        n.attrs = {{"axis", std::int64_t{0}}, {"_params_name", std::string("variable 'v'")}};
        test_resources cpu_res, gpu_res;
        variable_resource& cv = cpu_res.variable(var);
        variable_resource& gv = gpu_res.variable(var);
        const any_tensor ids = random_tensor(id, loom::shape{300}, gen::labels, 40, rng);
        const any_tensor dids = to_gpu(ids);
        // Before the variable has a value: the CPU's error.
        const std::string cpu_error = error_of([&] {
          run_cpu(n, t, {nullptr, &ids}, {&cv}, cpu_res);
        });
        CHECK_FALSE(cpu_error.empty());
        CHECK(error_of([&] { run_gpu(n, t, {nullptr, &dids}, {&gv}, gpu_res, 0); }) == cpu_error);
        cv.value = random_tensor(t, loom::shape{40, 5}, gen::any, 0, rng);
        gv.value = to_gpu(cv.value);
        cv.initialized = gv.initialized = true;
        const any_tensor c = run_cpu(n, t, {nullptr, &ids}, {&cv}, cpu_res);
        compare(c, run_gpu(n, t, {nullptr, &dids}, {&gv}, gpu_res, c.byte_size()),
                check::elementwise, "resource_gather");
      }
  }

  // An embedding lookup over shards whose first shard gets no ids in a batch.
  // Checked against the values, not the CPU kernel: the CPU's dynamic_stitch
  // takes the row width from the first part and gives zeros here.
  TEST_CASE("dynamic_stitch on the GPU stitches rows after an empty first part") {
    node_def n;
    n.op = "dynamic_stitch";
    n.name = "stitch";
    n.type = dtype::f32;
    n.attrs["N"] = std::int64_t{2};
    const any_tensor d0 = to_gpu(any_tensor(dtype::f32, loom::shape{0, 2}));
    const any_tensor d1 = to_gpu(any_tensor::from_vector<float>(loom::shape{2, 2}, {1, 2, 3, 4}));
    const any_tensor i0 = to_gpu(any_tensor(dtype::i32, loom::shape{0}));
    const any_tensor i1 = to_gpu(any_tensor::from_vector<std::int32_t>(loom::shape{2}, {1, 0}));
    test_resources res;
    const any_tensor out = to_host(run_gpu(n, dtype::f32, {&d0, &d1, &i0, &i1}, {}, res, 16));
    REQUIRE(out.shape() == loom::shape{2, 2});
    CHECK(std::vector<float>(out.data<float>(), out.data<float>() + 4) ==
          std::vector<float>{3, 4, 1, 2});
  }

  TEST_CASE("an id out of range fails on the GPU with the CPU's message, and writes nothing") {
    using S = loom::shape;
    using v32 = std::vector<std::int32_t>;
    using v64 = std::vector<std::int64_t>;
    std::mt19937_64 rng(fresh_seed());
    // The op on both devices: the same error, or both none.
    auto same_error = [&](const node_def& n, dtype t, const std::vector<any_tensor>& host,
                          const std::vector<variable_resource*>& cpu_refs,
                          const std::vector<variable_resource*>& gpu_refs, std::size_t refs) {
      std::vector<any_tensor> dev;
      for (const any_tensor& h : host)
        dev.push_back(to_gpu(h));
      std::vector<const any_tensor*> host_in(refs, nullptr), dev_in(refs, nullptr);
      for (std::size_t i = 0; i < host.size(); ++i) {
        host_in.push_back(&host[i]);
        dev_in.push_back(&dev[i]);
      }
      test_resources cpu_res, gpu_res;
      const std::string cpu_error = error_of([&] { run_cpu(n, t, host_in, cpu_refs, cpu_res); });
      const std::string gpu_error = error_of([&] { run_gpu(n, t, dev_in, gpu_refs, gpu_res, 0); });
      INFO(n.op);
      CHECK_FALSE(cpu_error.empty());
      CHECK(gpu_error == cpu_error);
    };
    auto node = [](const std::string& op, dtype t, attr_map attrs) {
      node_def n;
      n.op = op;
      n.name = "bad";
      n.type = t;
      n.attrs = std::move(attrs);
      return n;
    };
    const any_tensor params = random_tensor(dtype::f32, S{50, 3}, gen::any, 0, rng);
    // gather: an id past the rows (int32), a negative one (int64).
    same_error(node("gather", dtype::f32,
                    {{"axis", std::int64_t{0}}, {"_params_name", std::string("'p'")}}),
               dtype::f32, {params, any_tensor::from_vector<std::int32_t>(S{3}, v32{3, 50, 1})}, {},
               {}, 0);
    same_error(node("gather", dtype::f32, {{"axis", std::int64_t{0}}}), dtype::f32,
               {params, any_tensor::from_vector<std::int64_t>(S{2}, v64{0, -1})}, {}, {}, 0);
    same_error(node("gather", dtype::f32, {{"axis", std::int64_t{1}}}), dtype::f32,
               {params, any_tensor::from_vector<std::int32_t>(S{1}, v32{3})}, {}, {}, 0);
    // gather_nd and its gradient: a tuple outside params, TF's message with its position.
    same_error(node("gather_nd", dtype::f32, {}), dtype::f32,
               {params, any_tensor::from_vector<std::int32_t>(S{2, 2}, v32{3, 1, 50, 0})}, {}, {},
               0);
    same_error(node("gather_nd_grad", dtype::f32, {{"shape", v64{50, 3}}}), dtype::f32,
               {random_tensor(dtype::f32, S{2}, gen::any, 0, rng),
                any_tensor::from_vector<std::int64_t>(S{2, 2}, v64{3, 1, 4, -1})},
               {}, {}, 0);
    // top_k's values: a position outside its row; range: a zero step.
    same_error(node("top_k_values", dtype::f32, {}), dtype::f32,
               {params, any_tensor::from_vector<std::int32_t>(S{50, 1}, v32(50, 3))}, {}, {}, 0);
    same_error(node("range", dtype::i64, {}), dtype::i64,
               {any_tensor::scalar(std::int64_t{1}), any_tensor::scalar(std::int64_t{5}),
                any_tensor::scalar(std::int64_t{0})},
               {}, {}, 0);
    same_error(node("indexed_slices", dtype::f32,
                    {{"axis", std::int64_t{0}}, {"dense_shape", v64{13, 3}}}),
               dtype::f32,
               {random_tensor(dtype::f32, S{2, 3}, gen::any, 0, rng),
                any_tensor::from_vector<std::int64_t>(S{2}, v64{12, 13})},
               {}, {}, 0);
    same_error(node("unsorted_segment_sum", dtype::f32, {}), dtype::f32,
               {random_tensor(dtype::f32, S{2, 3}, gen::any, 0, rng),
                any_tensor::from_vector<std::int32_t>(S{2}, v32{11, 0}),
                any_tensor::scalar(std::int32_t{11})},
               {}, {}, 0);
    same_error(node("shard_slots", dtype::i64,
                    {{"num_shards", std::int64_t{2}},
                     {"rows", std::int64_t{50}},
                     {"strategy", std::string("mod")}}),
               dtype::i64, {any_tensor::from_vector<std::int64_t>(S{3}, v64{4, 50, 2})}, {}, {}, 0);
    same_error(node("gather_shards", dtype::f32, {{"N", std::int64_t{2}}}), dtype::f32,
               {any_tensor::from_vector<std::int64_t>(S{2}, v64{1, 6}),
                random_tensor(dtype::f32, S{3, 2}, gen::any, 0, rng),
                random_tensor(dtype::f32, S{2, 2}, gen::any, 0, rng)},
               {}, {}, 0);
    same_error(node("dynamic_stitch", dtype::f32, {{"N", std::int64_t{1}}}), dtype::f32,
               {random_tensor(dtype::f32, S{2, 3}, gen::any, 0, rng),
                any_tensor::from_vector<std::int32_t>(S{2}, v32{1, -2})},
               {}, {}, 0);
    // sparse_segment_ids: an index outside the dense shape, two out of order.
    same_error(node("sparse_segment_ids", dtype::i64, {}), dtype::i64,
               {any_tensor::from_vector<std::int64_t>(S{2, 2}, v64{0, 1, 4, 0}),
                any_tensor::from_vector<std::int64_t>(S{2}, v64{4, 3})},
               {}, {}, 0);
    same_error(node("sparse_segment_ids", dtype::i64, {}), dtype::i64,
               {any_tensor::from_vector<std::int64_t>(S{2, 2}, v64{1, 1, 0, 2}),
                any_tensor::from_vector<std::int64_t>(S{2}, v64{4, 3})},
               {}, {}, 0);

    // A scatter and a sparse update: the error, and the variable (and slot) as it was.
    node_def w, accum;
    w.name = "w";
    accum.name = "accum";
    test_resources cpu_vars, gpu_vars;
    std::vector<variable_resource*> cpu_refs, gpu_refs;
    std::vector<any_tensor> before;
    for (const node_def* v : {&w, &accum}) {
      variable_resource& c = cpu_vars.variable(*v);
      variable_resource& g = gpu_vars.variable(*v);
      c.value = random_tensor(dtype::f32, S{10, 3}, gen::positive, 0, rng);
      g.value = to_gpu(c.value);
      c.initialized = g.initialized = true;
      before.push_back(c.value.clone());
      cpu_refs.push_back(&c);
      gpu_refs.push_back(&g);
    }
    const any_tensor bad_ids = any_tensor::from_vector<std::int32_t>(S{3}, v32{2, 9, 10});
    const any_tensor rows = random_tensor(dtype::f32, S{3, 3}, gen::any, 0, rng);
    same_error(node("scatter_add", dtype::f32, {{"_ref_name_0", std::string("w")}}), dtype::f32,
               {bad_ids, rows}, {cpu_refs[0]}, {gpu_refs[0]}, 1);
    same_error(node("sparse_apply_adagrad", dtype::f32,
                    {{"_ref_name_0", std::string("w")}, {"_ref_name_1", std::string("accum")}}),
               dtype::f32, {any_tensor::scalar(0.1f), rows, bad_ids}, cpu_refs, gpu_refs, 2);
    for (std::size_t k = 0; k < gpu_refs.size(); ++k)
      compare(before[k], gpu_refs[k]->value, check::elementwise,
              "ref " + std::to_string(k) + " after the failed updates");
  }

  TEST_CASE("a gather, scatter or sparse update refuses a variable that is not on the GPU") {
    test_resources res;
    node_def v;
    v.name = "w";
    variable_resource& w = res.variable(v);
    w.value = any_tensor::from_vector<float>(loom::shape{2, 2}, {1, 2, 3, 4});
    w.initialized = true;
    const any_tensor ids = to_gpu(any_tensor::from_vector<std::int32_t>(loom::shape{1}, {1}));
    const any_tensor rows = to_gpu(any_tensor::from_vector<float>(loom::shape{1, 2}, {1, 1}));
    const any_tensor alpha = to_gpu(any_tensor::scalar(0.5f));
    node_def gather;
    gather.op = "resource_gather";
    gather.name = "lookup";
    gather.attrs = {{"axis", std::int64_t{0}}, {"_params_name", std::string("variable 'w'")}};
    CHECK_THROWS_WITH_AS(run_gpu(gather, dtype::f32, {nullptr, &ids}, {&w}, res, 0),
                         doctest::Contains("variable 'w' is float32[2, 2] on the host: a "
                                           "variable read by a gather on a GPU must live there"),
                         failed_precondition_error);
    node_def scatter;
    scatter.op = "scatter_add";
    scatter.name = "scatter";
    scatter.attrs["_ref_name_0"] = std::string("w");
    CHECK_THROWS_WITH_AS(run_gpu(scatter, dtype::f32, {nullptr, &ids, &rows}, {&w}, res, 0),
                         doctest::Contains("variable 'w' is float32[2, 2] on the host: a "
                                           "variable updated on a GPU must live there"),
                         failed_precondition_error);
    node_def sgd;
    sgd.op = "sparse_apply_gradient_descent";
    sgd.name = "sgd";
    sgd.attrs["_ref_name_0"] = std::string("w");
    CHECK_THROWS_WITH_AS(
        run_gpu(sgd, dtype::f32, {nullptr, &alpha, &rows, &ids}, {&w}, res, 0),
        doctest::Contains("variable 'w' is float32[2, 2] on the host: a variable updated on a "
                          "GPU must live there"),
        failed_precondition_error);
    CHECK(w.value.data<float>()[2] == 3.0f); // nothing written
  }

  TEST_CASE("the random sources follow their distributions on the GPU") {
    struct source {
      std::string op;
      double a, b;
    };
    for (const source& src : std::vector<source>{
             {"random_uniform", -2, 3}, {"random_normal", 1, 2}, {"truncated_normal", -1, 0.5}})
      for (dtype t : floats)
        for (std::int64_t seed : {std::int64_t{0}, std::int64_t{42}}) {
          INFO(src.op << "<" << to_string(t) << "> seed " << seed);
          node_def n;
          n.op = src.op;
          n.name = src.op;
          n.type = t;
          n.shape = loom::shape{100003};
          n.attrs = {{"seed", seed}, {"seed2", std::int64_t{0}}, {"a", src.a}, {"b", src.b}};
          test_resources res;
          const any_tensor first = to_host(run_gpu(n, t, {}, {}, res, 100003 * size_of(t)));
          const any_tensor second = to_host(run_gpu(n, t, {}, {}, res, 100003 * size_of(t)));
          std::vector<double> x(100003), y(100003);
          visit_dtype(t, [&]<class T>() {
            if constexpr (std::is_floating_point_v<T>) {
              for (std::size_t i = 0; i < x.size(); ++i) {
                x[i] = first.data<T>()[i];
                y[i] = second.data<T>()[i];
              }
            }
          });
          CHECK(x != y); // a stateful source: every run draws new numbers
          double mean = 0, var = 0, lo = x[0], hi = x[0];
          for (double v : x) {
            mean += v;
            lo = std::min(lo, v);
            hi = std::max(hi, v);
          }
          mean /= static_cast<double>(x.size());
          for (double v : x)
            var += (v - mean) * (v - mean);
          const double sd = std::sqrt(var / static_cast<double>(x.size() - 1));
          double want_mean = src.a, want_sd = src.b;
          if (src.op == "random_uniform") {
            want_mean = (src.a + src.b) / 2;
            want_sd = (src.b - src.a) / std::sqrt(12.0);
            CHECK(lo >= src.a);
            CHECK(hi <= src.b);
          } else if (src.op == "truncated_normal") {
            want_sd = src.b * 0.879626; // a standard normal truncated at +-2
            CHECK(lo >= src.a - 2 * src.b - 1e-6);
            CHECK(hi <= src.a + 2 * src.b + 1e-6);
          }
          // Five standard errors of the mean; 2% on the standard deviation.
          CHECK(std::abs(mean - want_mean) <=
                5 * want_sd / std::sqrt(static_cast<double>(x.size())));
          CHECK(std::abs(sd - want_sd) <= 0.02 * want_sd);
        }
  }

  TEST_CASE("fused regions on /gpu:0 run as one GPU kernel each and match the CPU") {
    // nvcc contracts a * b + c into one fused multiply-add, rounded once; the CPU's
    // primitive kernels round twice. Where the result cancels (relu(a * b + c) * 2 - a
    // near 0) the two differ by an ulp of the operands (in [-3, 3]), not of the result.
    constexpr double fused_operand_scale = 3.0;
    fused_graph fg;
    std::mt19937_64 rng(fresh_seed());
    const detail::run_request req{
        {fg.arith, fg.mixed}, {}, {fg.a.id(), fg.b.id(), fg.c.id(), fg.k.id()}};
    const std::vector<memory_location> on_gpu(fg.g.size(), memory_location::gpu(0));
    const std::vector<memory_location> on_host(fg.g.size(), memory_location::host());
    const detail::plan gpu_plan(fg.g, req, true, on_gpu);   // fused: the cuda_host case above
    const detail::plan cpu_plan(fg.g, req, false, on_host); // the primitive CPU kernels
    for (const loom::shape& s : {loom::shape{1, 1}, loom::shape{37, 129}, loom::shape{256, 1024}}) {
      INFO("shape " << s.to_string());
      const auto in = fg.inputs(s, rng);
      // Called directly, the region's kernel takes same-shape operands.
      const gpu_leaves on_gpu(fg.leaves(fg.arith, in));
      any_tensor direct;
      CHECK(backend().run_fused(
          0, kernels::fused_kernel_registry::instance().find_gpu(fg.region(fg.arith).key),
          on_gpu.pointers, direct, "arith"));

      test_resources res;
      detail::plan_caches cpu_caches(cpu_plan), gpu_caches(gpu_plan);
      const auto cpu_values =
          detail::run_plan(cpu_plan, cpu_caches, fg.g, fg.feeds(req, in), host_device(), res);
      poison_next_blocks(static_cast<std::size_t>(s.num_elements()) * sizeof(float));
      const auto gpu_values =
          detail::run_plan(gpu_plan, gpu_caches, fg.g, fg.feeds(req, in), host_device(), res);
      for (std::size_t i : {0, 1}) { // arith, mixed: the request's fetches
        const any_tensor& got = gpu_values[i];
        CHECK(got.on_host()); // fetched values come back to the host
        compare(cpu_values[i], got, check::elementwise, fg.region(req.fetches[i]).key,
                fused_operand_scale);
      }
      compare(cpu_values[0], direct, check::elementwise, "called directly", fused_operand_scale);
    }
  }

  TEST_CASE("a pinned tensor is page-locked; its copy to the GPU has read it when it returns") {
    std::mt19937_64 rng(fresh_seed());
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    auto pinned = loom::pinned_tensor<float, 2>(loom::shape{1031, 257});
    CHECK(pinned.value().on_host());
    CHECK(cuda::is_page_locked(pinned.data()));
    loom::tensor<float, 1> pageable(loom::shape{4096});
    CHECK_FALSE(cuda::is_page_locked(pageable.data()));
    for (float& v : pinned.flat())
      v = value(rng);
    const std::vector<float> expected(pinned.flat().begin(), pinned.flat().end());
    // The copy is queued behind 20 ms of GPU work: had copy() not waited for it, the
    // writes below would reach the source before the GPU read it.
    cuda::the_backend().on_device(0, [](const kernels::gpu_context& g) {
      spin_kernel<<<1, 1, 0, g.stream>>>(20'000'000ULL);
      LOOM_CUDA_CHECK(cudaGetLastError());
    });
    const any_tensor on_gpu = to_gpu(pinned.value());
    for (float& v : pinned.flat())
      v = 7.0f;
    const any_tensor back = to_host(on_gpu);
    CHECK(std::equal(expected.begin(), expected.end(), back.data<float>()));
  }

  TEST_CASE(
      "a region on /gpu:0 whose operands need broadcasting runs as its primitive GPU kernels") {
    fused_graph fg;
    std::mt19937_64 rng(fresh_seed());
    const detail::run_request req{{fg.arith}, {}, {fg.a.id(), fg.b.id(), fg.c.id(), fg.k.id()}};
    const detail::plan gpu_plan(fg.g, req, true,
                                std::vector<memory_location>(fg.g.size(), memory_location::gpu(0)));
    const detail::plan cpu_plan(fg.g, req, false,
                                std::vector<memory_location>(fg.g.size(), memory_location::host()));
    const auto in = fg.inputs(loom::shape{33, 65}, rng, loom::shape{1, 65}); // b: one row
    const gpu_leaves on_gpu(fg.leaves(fg.arith, in));
    any_tensor declined;
    CHECK_FALSE(backend().run_fused(
        0, kernels::fused_kernel_registry::instance().find_gpu(fg.region(fg.arith).key),
        on_gpu.pointers, declined, "arith"));
    CHECK(declined.empty());

    test_resources res;
    detail::plan_caches cpu_caches(cpu_plan), gpu_caches(gpu_plan);
    const auto cpu_values =
        detail::run_plan(cpu_plan, cpu_caches, fg.g, fg.feeds(req, in), host_device(), res);
    const auto gpu_values =
        detail::run_plan(gpu_plan, gpu_caches, fg.g, fg.feeds(req, in), host_device(), res);
    compare(cpu_values[0], gpu_values[0], check::elementwise, "broadcast b"); // arith
  }

} // TEST_SUITE

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  if (!gpu_kernels_test::have_gpu())
    std::printf("no CUDA device: the cuda_device test cases are skipped "
                "(the cuda_host ones still run)\n");
  return context.run();
}

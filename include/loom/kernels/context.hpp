// What a kernel runs with (kernel_context): its node, inputs, variables, the
// process's resources and device, and its step's cancellation. The executor
// fills it; kernels read it; the registry (kernels/registry.hpp) maps ops to
// the kernels that take it.
#pragma once

#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/graph/node.hpp>
#include <loom/kernels/cpu_device.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace loom::kernels {

// A variable's storage in a resource container. An update writes its buffer in
// place only when nothing else holds it, and otherwise writes another buffer
// and swaps it in (assign: kernels/cpu/state.hpp; the optimizers' apply ops:
// unshare_refs), so a tensor read earlier in a step keeps its value.
//
// `changes`, where an incremental checkpoint follows the variable (a hash table's
// rows: train/incremental_saver.hpp), says which rows changed since it last asked.
struct row_changes;
struct variable_resource {
  std::mutex mu;
  any_tensor value;
  bool initialized = false;
  std::shared_ptr<row_changes> changes; // under mu
};

// Which rows of a variable changed, by epoch: an incremental save begins the next
// epoch and takes the rows stamped with the one that ended (hash_embedding_changes).
// Every kernel that writes rows in place stamps them (mark); one that replaces the
// whole value drops this, so the next save knows it must take every row. 4 bytes a row.
struct row_changes {
  explicit row_changes(std::int64_t rows) : epoch_of(static_cast<std::size_t>(rows), 0) {}
  void mark(std::int64_t row) { epoch_of[static_cast<std::size_t>(row)] = epoch; }
  std::vector<std::uint32_t> epoch_of;
  std::uint32_t epoch = 0; // 0: not begun by a save yet
};

// Mutexes held together, taken in address order and each once: the one lock order
// of the kernels that hold several (an update's variable and slots, a hash lookup's
// keys, rows, index and slots), so that no two of them can deadlock. add() them,
// then lock(); released when this goes. Fixed room: no allocation on a step's path.
class ordered_locks {
public:
  static constexpr std::size_t capacity = 8;

  ordered_locks() = default;
  explicit ordered_locks(std::initializer_list<std::mutex*> mus) {
    for (std::mutex* m : mus)
      add(*m);
  }

  void add(std::mutex& m) {
    if (std::find(mus_.begin(), mus_.begin() + static_cast<std::ptrdiff_t>(n_), &m) !=
        mus_.begin() + static_cast<std::ptrdiff_t>(n_))
      return;
    if (n_ == capacity)
      throw internal_error("ordered_locks: more than " + std::to_string(capacity) + " mutexes");
    mus_[n_++] = &m;
  }

  void lock() {
    // Insertion sort by address: n is small, and g++ 12's -Warray-bounds misreads std::sort.
    for (std::size_t i = 1; i < n_; ++i)
      for (std::size_t j = i; j > 0 && std::less<>{}(mus_[j], mus_[j - 1]); --j)
        std::swap(mus_[j], mus_[j - 1]);
    for (std::size_t k = 0; k < n_; ++k)
      locks_[k] = std::unique_lock(*mus_[k]);
  }

private:
  std::array<std::mutex*, capacity> mus_{};
  std::size_t n_ = 0;
  std::array<std::unique_lock<std::mutex>, capacity> locks_;
};

// Any other state a kernel keeps in a resource container (a gradient
// accumulator, a step counter): TF's ResourceBase.
struct resource_base {
  virtual ~resource_base() = default;
};

// What a kernel may ask of the process it runs in: its variables, other
// resources, and the random-number state of stateful random ops.
class resource_access {
public:
  virtual ~resource_access() = default;
  // The variable a "variable" node names, created (uninitialised) if missing.
  virtual variable_resource& variable(const node_def& variable_node) = 0;
  // Names the set of variables variable() hands out: while it is unchanged, a
  // node's variable() is the same object, so a caller (the executor's plans)
  // may keep what variable() returned instead of asking again (two attribute
  // reads and two map finds by name a step per variable). It changes when the
  // variables are replaced (reset()); no two sets ever share one, across
  // objects too. 0: never keep.
  virtual std::uint64_t generation() const noexcept { return 0; }
  // A random engine that lives as long as the variables do, one per node.
  virtual std::mt19937_64& random_engine(const node_def& node, std::uint64_t seed) = 0;
  // The resource (container, name), made by `make` if missing. Shared, so a
  // kernel waiting on it outlives a reset() of its container.
  virtual std::shared_ptr<resource_base>
  resource(const std::string& container, const std::string& name,
           const std::function<std::shared_ptr<resource_base>()>& make) = 0;

  // The resource (container, name) of type R, default-constructed if missing.
  template <class R>
  std::shared_ptr<R> resource(const std::string& container, const std::string& name) {
    auto r = resource(container, name, [] { return std::make_shared<R>(); });
    if (auto typed = std::dynamic_pointer_cast<R>(r))
      return typed;
    throw invalid_argument_error("resource '" + name + "' in container '" + container +
                                 "' exists with another type");
  }
};

// Lets a kernel that waits for other steps (op_def::blocking) return when its
// own step is aborted: a deadline passed, its client went away, the task stops.
class step_cancellation {
public:
  using callback = std::function<void(const std::string& reason)>;
  virtual ~step_cancellation() = default;
  // Calls fn once, from the aborting thread, if the step is aborted before
  // forget(id); at once if it already was. The callback runs under the
  // table's lock: it may lock a resource's mutex, so a kernel must not hold
  // that mutex while it calls on_abort or forget.
  virtual std::uint64_t on_abort(callback fn) = 0;
  // After forget returns the callback is not running and will not run.
  virtual void forget(std::uint64_t id) = 0;
};

// What a GPU kernel launches on: its device, stream, cuBLAS handle and
// allocator. Defined by the GPU backend (cuda/backend.hpp), which sets
// kernel_context::gpu for kernels registered under device_gpu.
struct gpu_context;

// A kernel's attributes, decoded from its node once per plan item (TF decodes them once too,
// when it constructs an OpKernel): kernel_context::decoded<A>() builds an A from the node
// (A(const node_def&)) at the item's first run, and its plan_caches keep it for later runs. A
// worker of examples/ctr runs some 500 gathers, routes, stitches, slices and concats a step, and
// their lookups by name (std::map finds on cold node_defs) were 3.6 % of its CPU.
class decoded_attrs {
public:
  template <class A> const A& get(const node_def& n) {
    if (const void* a = value_.load(std::memory_order_acquire))
      return as<A>(n, a);
    std::lock_guard lock(mu_);
    if (!held_) { // first run; concurrent executions of the plan wait for one decoding
      held_ = std::make_shared<const A>(n);
      type_ = &tag<A>;
      value_.store(held_.get(), std::memory_order_release);
    }
    return as<A>(n, held_.get());
  }

private:
  template <class A> static constexpr char tag = 0; // its address names A
  template <class A> const A& as(const node_def& n, const void* a) const {
    if (type_ != &tag<A>) // one kernel per step, so one type: a second is a bug
      throw internal_error("node " + n.describe() +
                           ": its kernel asked for its attributes decoded as two types");
    return *static_cast<const A*>(a);
  }

  std::mutex mu_;
  std::atomic<const void*> value_{nullptr}; // held_.get() once decoded
  const void* type_ = nullptr;              // set before value_ is
  std::shared_ptr<const void> held_;
};

struct kernel_context {
  const node_def& node;
  std::span<const any_tensor* const> inputs; // data inputs; nullptr for ref inputs
  std::span<variable_resource* const> refs;  // one per ref input, in input order
  const cpu_device& device;
  resource_access& resources;
  any_tensor output;
  // Bit i: no later step reads input i and the request does not return it, so
  // the kernel may keep its buffer (TF's forward_input) if nothing else holds it.
  std::uint32_t forwardable = 0;
  // The step's abort notifications; nullptr in a local session.
  step_cancellation* cancellation = nullptr;
  // For a GPU kernel: where to launch; its inputs are on that GPU and its
  // output must be. nullptr for CPU kernels.
  gpu_context* gpu = nullptr;
  // The plan item's decoded attributes (its plan_caches'); nullptr (a kernel run outside a
  // plan): decoded() keeps them in attrs_here, for this run only.
  decoded_attrs* attrs = nullptr;
  std::shared_ptr<decoded_attrs> attrs_here{};

  const any_tensor& input(std::size_t i) const { return *inputs[i]; }
  // The node's attributes as A(node) decodes them, once per plan item.
  template <class A> const A& decoded() {
    if (!attrs) {
      attrs_here = std::make_shared<decoded_attrs>();
      attrs = attrs_here.get();
    }
    return attrs->get<A>(node);
  }
  bool may_forward(std::size_t i) const {
    return (forwardable >> i & 1u) && inputs[i] && inputs[i]->sole_owner();
  }
};

} // namespace loom::kernels

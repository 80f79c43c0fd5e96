// The executor: runs a plan (runtime/plan.hpp) as dataflow. A step runs once
// the steps it depends on have, lowest node id first. Without _recv nodes that
// is exactly node-id order (ids are a topological order); with them, a step
// waiting for a tensor from another task never blocks the steps that do not
// need it, so partitions that feed each other (a worker's gradients to a ps,
// the ps's variables back) cannot deadlock.
#pragma once

#include <loom/cluster/environment.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/runtime/plan.hpp>
#include <loom/runtime/step_tracer.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <queue>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace loom::detail {

// How a step's _send and _recv nodes reach other tasks: implemented by the
// worker service of a cluster task (runtime/rendezvous.hpp).
class step_rendezvous {
public:
  using recv_done = std::function<void(any_tensor value, std::exception_ptr error)>;
  virtual ~step_rendezvous() = default;
  // Starts delivering `value` (empty for a control edge) to the recv of `send`'s key.
  virtual void send(const transfer_def& send, const any_tensor& value) = 0;
  // Calls done exactly once: with the value, or with the error that ended the wait.
  virtual void recv(const transfer_def& recv, recv_done done) = 0;
  // Delivers what send() has held back. A rendezvous may hold sends back to
  // carry a burst of them to a task as one message; the executor flushes
  // before the step can wait (for a recv, in a blocking kernel) and when it
  // ends, so nothing it waits for hangs on a held send.
  virtual void flush() {}
  // Where blocking kernels learn that the step was aborted; nullptr if never.
  virtual kernels::step_cancellation* cancellation() noexcept { return nullptr; }
};

// The threads of an intra-op pool asked for as `requested` (session_options,
// server_options): 0 or less means LOOM_INTRA_OP_THREADS where it is set, else
// one per CPU the process may run on (schedulable_cpus: its affinity mask, which
// mpirun's and Slurm's binding set). loom-launch sets it to each task's share of the
// host's cores: tasks that share a host and each size their pool to every core
// oversubscribe it (measured on examples/ctr's 1 ps + 2 workers sharing 2 cores
// under load). Throws invalid_argument_error naming the variable when it
// is not a number of threads.
LOOM_COMPILED_ONCE int intra_op_threads(int requested,
                                        const environment& env = process_environment());

// A kernel's input or ref pointers: on the stack up to 8 (nearly every
// kernel), so running a node allocates nothing for them (a ctr worker's step
// runs several nodes per table shard: routing, unique, gather, their gradients).
template <class T> class pointer_list {
public:
  explicit pointer_list(std::size_t n) : n_(n) {
    if (n_ > on_stack)
      heap_.resize(n_);
  }
  T*& operator[](std::size_t i) { return n_ > on_stack ? heap_[i] : stack_[i]; }
  std::span<T* const> span() const {
    return n_ > on_stack ? std::span<T* const>(heap_) : std::span<T* const>(stack_.data(), n_);
  }

private:
  static constexpr std::size_t on_stack = 8;
  std::size_t n_;
  std::array<T*, on_stack> stack_{};
  std::vector<T*> heap_;
};

// The values of one rendezvous message, delivered together: while a batch is open on a
// thread, a step that one of them would resume is resumed once, by run(), with all of them
// already arrived, so that it runs the nodes they make ready together and flushes its sends
// once (one message per destination task), not once per value. Without it a ps's step
// resumed by the first of its ~104 id tensors ran that gather, found nothing else ready, flushed,
// and sent each table's rows to the worker as a message of its own (#23: 108 sendmsg a step).
class arrival_batch {
public:
  arrival_batch() : outer_(current()) { current() = this; }
  arrival_batch(const arrival_batch&) = delete;
  arrival_batch& operator=(const arrival_batch&) = delete;
  ~arrival_batch() {
    try {
      run();
    } catch (...) { // only on a path that already failed (run() not reached)
    }
  }
  // Closes the batch and resumes the steps its values made runnable.
  void run();
  static arrival_batch*& current() {
    thread_local arrival_batch* open = nullptr;
    return open;
  }
  void defer(std::function<void()> f) { deferred_.push_back(std::move(f)); }

private:
  arrival_batch* outer_;
  std::vector<std::function<void()>> deferred_;
};

// Called once when a started step ends: with its fetched values (in the order of the
// plan's request), or with the error that ended it.
using plan_done_fn =
    std::function<void(std::vector<any_tensor>& fetched, std::exception_ptr error)>;

// One run of a plan in flight (run_plan, start_plan): the plan is read, its caches are
// shared with its other runs, and what changes (the values, what is ready) is the run's.
class plan_execution {
public:
  using item = plan::item;
  using slot = plan::slot;
  using done_fn = plan_done_fn;

  plan_execution(const plan& p, plan_caches& c) : p_(p), caches_(c) {}

  // Runs the plan on the calling thread, which waits there for its recvs; returns the
  // fetched values. A tracer, where given, records every item it runs.
  std::vector<any_tensor> run(const graph& g, std::vector<any_tensor> feeds,
                              const kernels::cpu_device& device,
                              kernels::resource_access& resources,
                              step_rendezvous* rendezvous = nullptr,
                              step_tracer* tracer = nullptr) const;

  // run() without a rendezvous or a tracer, whose fetched values stay where the plan made
  // them: on a GPU, for a step recorded into a CUDA graph (runtime/captured_step.hpp),
  // which copies them to the host after the graph's launch.
  std::vector<any_tensor> run_on_device(const graph& g, std::vector<any_tensor> feeds,
                                        const kernels::cpu_device& device,
                                        kernels::resource_access& resources) const;

  // Runs the plan on the calling thread until it waits for a recv, then
  // returns; the thread that delivers the recv's value runs it on (TF's
  // executor continues where a recv completes too). A task's io thread that
  // receives a step's tensor so runs the step's next kernels itself, without
  // waking a thread that waits for it. `done` runs on the thread that ends the
  // step. Not for a plan that blocks(): its kernels would wait on that thread.
  // The plan, its caches, g, device, resources and rendezvous must outlive the
  // step: `done` is the place to release them.
  void start(const graph& g, std::vector<any_tensor> feeds, const kernels::cpu_device& device,
             kernels::resource_access& resources, step_rendezvous& rendezvous, done_fn done,
             step_tracer* tracer = nullptr) const;

private:
  // One run of the plan in flight: what run() and start() keep between the
  // kernels they run. Shared with the recv callbacks, which may come late
  // (the step failed while a recv was outstanding).
  struct execution {
    execution(const plan& p, const graph& g, std::vector<any_tensor> feeds,
              const kernels::cpu_device& d, kernels::resource_access& r, step_rendezvous* rv,
              step_tracer* t);
    const graph& g;
    std::vector<any_tensor> values; // by slot
    const kernels::cpu_device& device;
    kernels::resource_access& resources;
    step_rendezvous* rendezvous;
    step_tracer* tracer;      // null: not traced
    std::vector<int> pending; // per item: inputs not yet computed
    std::vector<int> readers; // per slot: items yet to read it
    std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> ready;
    // A plan with GPU items keeps, beside each value, its copy at the other
    // location (host or GPU), made when the first reader elsewhere needs it.
    std::vector<any_tensor> elsewhere;
    std::size_t done = 0, waiting = 0;
    bool fetch_to_host = true; // false: run_on_device()

    std::mutex mu; // guards what follows: recv callbacks come from other threads
    std::condition_variable cv;
    // Each: the recv's item, its value or error, and when it arrived (traced only).
    std::deque<std::tuple<std::size_t, any_tensor, std::exception_ptr, std::int64_t>> arrived;
    bool suspended = false; // started, and no thread runs it: an arrival resumes it
    bool ended = false;     // started, and done was called: arrivals are dropped
    done_fn on_done;        // set: started (start()), else run()
  };

  // The fetched values, in the request's order (a node fetched twice is there twice).
  // Moved out, so that a fetch nothing else holds stays its sole owner (a session then
  // hands it over without a copy).
  std::vector<any_tensor> fetched(execution& x) const;

  // Runs what is ready. True when every item ran; false when the run waits
  // for a recv (a started run is then suspended, under the lock that its
  // next arrival takes).
  bool advance(const std::shared_ptr<execution>& st) const;

  // A started run: runs it until it waits or ends; at its end calls on_done.
  static void drive(const plan& p, plan_caches& c, const std::shared_ptr<execution>& st);

  void release(execution& x, slot s) const {
    if (!p_.fetched(s))
      release_value(x, s);
  }
  void release_value(execution& x, slot s) const {
    x.values[s] = {};
    if (p_.on_gpu())
      x.elsewhere[s] = {};
  }

  // The value in slot s at `where`: itself, or its copy there.
  const any_tensor& value_at(execution& x, slot s, memory_location where) const;

  void finish(execution& x, std::size_t k) const;

  // A GPU constant's value from an earlier run of this plan (plan_caches::kept).
  bool reuse_kept(execution& x, const item& s) const;

  // An item's variable inputs, read again (reread_variables); a copy at the
  // other location of a read that changed is dropped.
  void reread_inputs(execution& x, const item& s) const;

  // TF reads a variable when its consumer runs, not when the variable's node
  // does: a read under a control dependency on an update sees the update.
  // True when the item reads a variable.
  bool reread_variables(execution& x, const item& s) const;

  // A fused region at its location: the fused kernel, or its primitive items
  // where the kernel declines the shapes. Its leaves are read at the region's
  // location, copied there once if they are elsewhere.
  void run_fused(execution& x, const item& s) const;

  // Item k with the ready items after it that share its batch kernel (plan::item::batch),
  // run in one call and finished; false, running nothing, when none is ready beside it.
  bool run_batched(execution& x, std::size_t k, std::int64_t started) const;

  // The GPU backend that runs node n on `where`; one clear error without one.
  static kernels::gpu_backend& gpu_of(const node_def& n, memory_location where);

  // Runs a kernel item on `inputs` (its data inputs, at the item's location).
  // Its refs are the variables of its ref inputs; a variable node's own
  // variable is its one ref (variable_cpu reads it there).
  void run_item(execution& x, const item& s, std::span<const any_tensor* const> inputs,
                std::uint32_t forwardable = 0,
                kernels::step_cancellation* cancellation = nullptr) const;

  const plan& p_;
  plan_caches& caches_;
};

// Runs `p` on the calling thread, which waits there for its recvs. `feeds` are the values
// of the plan's request's fed nodes, in its order; returns the fetched values in the order
// of its fetches. A plan with _send or _recv nodes needs a rendezvous.
inline std::vector<any_tensor>
run_plan(const plan& p, plan_caches& caches, const graph& g, std::vector<any_tensor> feeds,
         const kernels::cpu_device& device, kernels::resource_access& resources,
         step_rendezvous* rendezvous = nullptr, step_tracer* tracer = nullptr) {
  return plan_execution(p, caches).run(g, std::move(feeds), device, resources, rendezvous, tracer);
}

// Runs `p` on the calling thread until it waits for a recv, then returns; the
// thread that delivers the recv's value runs it on (TF's executor continues
// where a recv completes too). `done` runs on the thread that ends the step,
// with the fetched values or the error. Not for a plan that blocks(). The plan,
// its caches, g, device, resources and rendezvous must outlive the step: `done`
// is the place to release them.
inline void start_plan(const plan& p, plan_caches& caches, const graph& g,
                       std::vector<any_tensor> feeds, const kernels::cpu_device& device,
                       kernels::resource_access& resources, step_rendezvous& rendezvous,
                       plan_done_fn done, step_tracer* tracer = nullptr) {
  plan_execution(p, caches).start(g, std::move(feeds), device, resources, rendezvous,
                                  std::move(done), tracer);
}

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE int intra_op_threads(int requested, const environment& env) {
  if (requested > 0)
    return requested;
  if (const auto v = env("LOOM_INTRA_OP_THREADS"); v && !v->empty()) {
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v->c_str(), &end, 10);
    if (errno != 0 || end != v->c_str() + v->size() || n < 1 || n > 4096)
      throw invalid_argument_error("LOOM_INTRA_OP_THREADS is \"" + *v +
                                   "\"; expected the threads of each task's kernel pool, 1 to "
                                   "4096");
    return static_cast<int>(n);
  }
  return schedulable_cpus();
}

LOOM_COMPILED_ONCE void arrival_batch::run() {
  if (current() == this)
    current() = outer_;
  auto deferred = std::move(deferred_);
  deferred_.clear();
  for (auto& f : deferred)
    f();
}

LOOM_COMPILED_ONCE auto plan_execution::run(const graph& g, std::vector<any_tensor> feeds,
                                            const kernels::cpu_device& device,
                                            kernels::resource_access& resources,
                                            step_rendezvous* rendezvous, step_tracer* tracer) const
    -> std::vector<any_tensor> {
  auto st =
      std::make_shared<execution>(p_, g, std::move(feeds), device, resources, rendezvous, tracer);
  while (!advance(st)) {
    std::unique_lock lock(st->mu);
    st->cv.wait(lock, [&] { return !st->arrived.empty(); });
  }
  return fetched(*st);
}

LOOM_COMPILED_ONCE auto plan_execution::run_on_device(const graph& g, std::vector<any_tensor> feeds,
                                                      const kernels::cpu_device& device,
                                                      kernels::resource_access& resources) const
    -> std::vector<any_tensor> {
  auto st =
      std::make_shared<execution>(p_, g, std::move(feeds), device, resources, nullptr, nullptr);
  st->fetch_to_host = false;
  if (!advance(st))
    throw internal_error("executor: a plan without recvs waited for one");
  return fetched(*st);
}

LOOM_COMPILED_ONCE void plan_execution::start(const graph& g, std::vector<any_tensor> feeds,
                                              const kernels::cpu_device& device,
                                              kernels::resource_access& resources,
                                              step_rendezvous& rendezvous, done_fn done,
                                              step_tracer* tracer) const {
  if (p_.blocks())
    throw internal_error("executor: a plan with blocking kernels cannot run as continuations");
  auto st =
      std::make_shared<execution>(p_, g, std::move(feeds), device, resources, &rendezvous, tracer);
  st->on_done = std::move(done);
  drive(p_, caches_, st);
}

LOOM_COMPILED_ONCE
plan_execution::execution::execution(const plan& p, const graph& g, std::vector<any_tensor> feeds,
                                     const kernels::cpu_device& d, kernels::resource_access& r,
                                     step_rendezvous* rv, step_tracer* t)
    : g(g), values(p.slots()), device(d), resources(r), rendezvous(rv), tracer(t),
      pending(p.pending()), readers(p.readers()), elsewhere(p.on_gpu() ? p.slots() : 0) {
  if (feeds.size() != p.fed().size())
    throw internal_error("executor: " + std::to_string(feeds.size()) + " feeds for " +
                         std::to_string(p.fed().size()) + " fed nodes");
  for (std::size_t i = 0; i < feeds.size(); ++i)
    values[p.fed()[i]] = std::move(feeds[i]);
  for (std::size_t k = 0; k < p.items().size(); ++k)
    if (pending[k] == 0)
      ready.push(k);
}

LOOM_COMPILED_ONCE auto plan_execution::fetched(execution& x) const -> std::vector<any_tensor> {
  const std::vector<slot>& fetches = p_.fetches();
  std::vector<any_tensor> out;
  out.reserve(fetches.size());
  for (auto f = fetches.begin(); f != fetches.end(); ++f) {
    any_tensor& v = x.values[*f];
    out.push_back(std::find(f + 1, fetches.end(), *f) != fetches.end() ? v : std::move(v));
  }
  return out;
}

LOOM_COMPILED_ONCE bool plan_execution::advance(const std::shared_ptr<execution>& st) const {
  execution& x = *st;
  const std::vector<item>& items = p_.items();
  while (x.done < items.size()) {
    if (x.ready.empty()) {
      if (x.waiting == 0)
        throw internal_error("executor: no item is ready and none is waiting (a cycle?)");
      x.rendezvous->flush();
      std::deque<std::tuple<std::size_t, any_tensor, std::exception_ptr, std::int64_t>> arrivals;
      {
        std::lock_guard lock(x.mu);
        if (x.arrived.empty()) {
          x.suspended = static_cast<bool>(x.on_done);
          return false;
        }
        arrivals.swap(x.arrived);
      }
      for (auto& [k, value, error, arrived_at] : arrivals) {
        --x.waiting;
        if (error)
          std::rethrow_exception(error);
        const std::int64_t taken = x.tracer ? steady_now_ns() : 0;
        x.values[items[k].out] = std::move(value);
        if (x.tracer)
          x.tracer->ran(x.g, items[k], taken, steady_now_ns(), arrived_at);
        finish(x, k);
      }
      continue;
    }
    const std::size_t k = x.ready.top();
    x.ready.pop();
    const item& s = items[k];
    const std::int64_t started = x.tracer ? steady_now_ns() : 0;
    switch (s.k) {
    case item::kind::recv:
      if (!x.rendezvous)
        throw internal_error("executor: a _recv node without a rendezvous");
      ++x.waiting;
      if (x.tracer)
        x.tracer->requested(s.id, started);
      // The plan and its caches, not this object (a caller's temporary), outlive the run.
      x.rendezvous->recv(
          s.transfer, [plan = &p_, caches = &caches_, st, k](any_tensor v, std::exception_ptr e) {
            const std::int64_t arrived_at = st->tracer ? steady_now_ns() : 0;
            bool resume = false;
            {
              std::lock_guard lock(st->mu);
              if (st->ended)
                return;
              st->arrived.emplace_back(k, std::move(v), std::move(e), arrived_at);
              resume = std::exchange(st->suspended, false);
              if (!st->on_done)
                st->cv.notify_one();
            }
            if (!resume)
              return;
            if (auto* batch = arrival_batch::current())
              batch->defer([plan, caches, st] { drive(*plan, *caches, st); });
            else
              drive(*plan, *caches, st);
          });
      continue;
    case item::kind::send:
      if (!x.rendezvous)
        throw internal_error("executor: a _send node without a rendezvous");
      x.rendezvous->send(s.transfer, value_at(x, s.inputs[0], memory_location::host()));
      break;
    case item::kind::fused:
      reread_inputs(x, s);
      run_fused(x, s);
      break;
    case item::kind::kernel: {
      if (s.kept && reuse_kept(x, s))
        break;
      if (s.batch && run_batched(x, k, started))
        continue;
      reread_inputs(x, s);
      std::uint32_t forwardable = 0;
      for (std::size_t i = 0; i < s.inputs.size() && i < 32; ++i) {
        const slot in = s.inputs[i];
        if (in != plan::no_slot && x.readers[in] == 1 && !p_.fetched(in))
          forwardable |= 1u << i;
      }
      pointer_list<const any_tensor> inputs(s.inputs.size());
      for (std::size_t i = 0; i < s.inputs.size(); ++i)
        inputs[i] = s.inputs[i] == plan::no_slot ? nullptr : &value_at(x, s.inputs[i], s.where);
      if (s.blocking && x.rendezvous)
        x.rendezvous->flush();
      run_item(x, s, inputs.span(), forwardable,
               x.rendezvous ? x.rendezvous->cancellation() : nullptr);
      if (s.kept)
        caches_.keep(s.out, x.values[s.out]);
      break;
    }
    }
    if (x.tracer)
      x.tracer->ran(x.g, s, started, steady_now_ns());
    finish(x, k);
  }
  if (x.rendezvous)
    x.rendezvous->flush();
  if (p_.on_gpu() && x.fetch_to_host) // what the caller fetches, it reads on the host
    for (slot f : p_.fetches())
      x.values[f] = any_tensor(value_at(x, f, memory_location::host()));
  return true;
}

LOOM_COMPILED_ONCE void plan_execution::drive(const plan& p, plan_caches& c,
                                              const std::shared_ptr<execution>& st) {
  const plan_execution self(p, c);
  std::exception_ptr error;
  std::vector<any_tensor> out;
  try {
    if (!self.advance(st))
      return; // an arrival resumes it
    out = self.fetched(*st);
  } catch (...) {
    error = std::current_exception();
  }
  done_fn done;
  {
    std::lock_guard lock(st->mu);
    st->ended = true;
    done = std::move(st->on_done);
  }
  done(out, error);
}

LOOM_COMPILED_ONCE auto plan_execution::value_at(execution& x, slot s, memory_location where) const
    -> const any_tensor& {
  const any_tensor& v = x.values[s];
  if (!p_.on_gpu() || v.empty() || v.location() == where)
    return v;
  any_tensor& copy = x.elsewhere[s];
  if (copy.empty() || copy.location() != where)
    copy = kernels::at_location(v, where);
  return copy;
}

LOOM_COMPILED_ONCE void plan_execution::finish(execution& x, std::size_t k) const {
  ++x.done;
  const item& s = p_.items()[k];
  for (slot in : s.inputs)
    if (in != plan::no_slot && --x.readers[in] == 0)
      release(x, in);
  if (x.readers[s.out] == 0)
    release(x, s.out);
  for (std::size_t c : p_.consumers(k))
    if (--x.pending[c] == 0)
      x.ready.push(c);
}

LOOM_COMPILED_ONCE bool plan_execution::reuse_kept(execution& x, const item& s) const {
  auto kept = caches_.kept(s.out);
  if (!kept)
    return false;
  x.values[s.out] = std::move(*kept);
  return true;
}

LOOM_COMPILED_ONCE void plan_execution::reread_inputs(execution& x, const item& s) const {
  if (reread_variables(x, s) && p_.on_gpu())
    for (slot in : s.inputs)
      if (in != plan::no_slot && p_.reads_variable(in))
        x.elsewhere[in] = {}; // the read may have changed
}

LOOM_COMPILED_ONCE bool plan_execution::reread_variables(execution& x, const item& s) const {
  bool read = false;
  for (slot in : s.inputs) {
    if (in == plan::no_slot || !p_.reads_variable(in))
      continue;
    any_tensor& v = x.values[in];
    if (v.empty())
      continue;
    kernels::variable_resource& r = caches_.variable(p_, x.g, in, x.resources);
    std::lock_guard lock(r.mu);
    if (r.initialized) {
      read = read || !v.shares_buffer_with(r.value);
      v = r.value;
    }
  }
  return read;
}

LOOM_COMPILED_ONCE void plan_execution::run_fused(execution& x, const item& s) const {
  std::vector<const any_tensor*> leaves;
  leaves.reserve(s.leaves.size());
  for (slot l : s.leaves)
    leaves.push_back(&value_at(x, l, s.where));
  any_tensor out;
  const std::string& name = x.g.node(s.id).name;
  if (s.where.on_host() ? s.fused(x.device, leaves, out, name)
                        : gpu_of(x.g.node(s.id), s.where)
                              .run_fused(s.where.device, s.gpu_fused, leaves, out, name)) {
    x.values[s.out] = std::move(out);
    return;
  }
  for (const item& f : s.fallback) {
    pointer_list<const any_tensor> inputs(f.inputs.size());
    for (std::size_t i = 0; i < f.inputs.size(); ++i)
      inputs[i] = f.inputs[i] == plan::no_slot ? nullptr : &value_at(x, f.inputs[i], f.where);
    run_item(x, f, inputs.span());
  }
  for (const item& f : s.fallback)
    if (f.id != s.id)
      release_value(x, f.out);
}

LOOM_COMPILED_ONCE bool plan_execution::run_batched(execution& x, std::size_t k,
                                                    std::int64_t started) const {
  const std::vector<item>& items = p_.items();
  const item& first = items[k];
  const auto joins = [&](std::size_t next) {
    const item& s = items[next];
    return s.k == item::kind::kernel && s.batch == first.batch && s.where == first.where &&
           !p_.reads_variable(s.out);
  };
  // Nothing ready beside it (one GPU update alone): no batch, and nothing allocated.
  if (p_.reads_variable(first.out) || x.ready.empty() || !joins(x.ready.top()))
    return false;
  std::vector<std::size_t> batch{k};
  // The ready queue gives the lowest item first: an optimizer's updates, made one after
  // another after the gradients, come out together.
  while (!x.ready.empty() && joins(x.ready.top())) {
    batch.push_back(x.ready.top());
    x.ready.pop();
  }
  // Each node's inputs at the GPU and its refs, as run_item gives a kernel its own.
  std::vector<std::vector<const any_tensor*>> inputs(batch.size());
  std::vector<std::vector<kernels::variable_resource*>> refs(batch.size());
  std::vector<kernels::kernel_context> contexts;
  contexts.reserve(batch.size());
  std::vector<kernels::kernel_context*> pointers;
  kernels::step_cancellation* cancellation = x.rendezvous ? x.rendezvous->cancellation() : nullptr;
  // Every variable read first: a read that changed drops its copy elsewhere, which an
  // earlier node's inputs may already point to.
  for (std::size_t member : batch)
    reread_inputs(x, items[member]);
  for (std::size_t b = 0; b < batch.size(); ++b) {
    const item& s = items[batch[b]];
    for (slot in : s.inputs)
      inputs[b].push_back(in == plan::no_slot ? nullptr : &value_at(x, in, s.where));
    for (slot r : s.refs)
      refs[b].push_back(&caches_.variable(p_, x.g, r, x.resources));
    contexts.push_back(kernels::kernel_context{
        x.g.node(s.id), inputs[b], refs[b], x.device, x.resources, {}, 0, cancellation});
    contexts.back().attrs = &caches_.attrs(s);
  }
  for (kernels::kernel_context& c : contexts)
    pointers.push_back(&c);
  gpu_of(x.g.node(first.id), first.where).run_batch(first.where.device, first.batch, pointers);
  const std::int64_t ended = x.tracer ? steady_now_ns() : 0;
  for (std::size_t b = 0; b < batch.size(); ++b) {
    x.values[items[batch[b]].out] = std::move(contexts[b].output);
    if (x.tracer)
      x.tracer->ran(x.g, items[batch[b]], started, ended);
    finish(x, batch[b]);
  }
  return true;
}

LOOM_COMPILED_ONCE auto plan_execution::gpu_of(const node_def& n, memory_location where)
    -> kernels::gpu_backend& {
  kernels::gpu_backend* gpu = kernels::gpu_backend::registered();
  if (!gpu)
    throw internal_error("node " + n.describe() + " is placed on " + where.to_string() +
                         " but this process has no GPU backend");
  return *gpu;
}

LOOM_COMPILED_ONCE void plan_execution::run_item(execution& x, const item& s,
                                                 std::span<const any_tensor* const> inputs,
                                                 std::uint32_t forwardable,
                                                 kernels::step_cancellation* cancellation) const {
  const node_def& n = x.g.node(s.id);
  const bool variable = p_.reads_variable(s.out);
  pointer_list<kernels::variable_resource> refs(variable ? 1 : s.refs.size());
  if (variable)
    refs[0] = &caches_.variable(p_, x.g, s.out, x.resources);
  for (std::size_t i = 0; !variable && i < s.refs.size(); ++i)
    refs[i] = &caches_.variable(p_, x.g, s.refs[i], x.resources);
  kernels::kernel_context ctx{n,           inputs, refs.span(), x.device,
                              x.resources, {},     forwardable, cancellation};
  ctx.attrs = &caches_.attrs(s);
  if (s.where.on_host())
    s.kernel(ctx);
  else
    gpu_of(n, s.where).run(s.where.device, s.kernel, ctx);
  x.values[s.out] = std::move(ctx.output);
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

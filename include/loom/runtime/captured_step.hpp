// A local plan whose every item runs on one GPU, run as one CUDA graph (PyTorch's
// torch.cuda.graphs, TF's XLA-less answer to launch overhead): the plan's kernels are
// recorded once and later runs replay them with one launch, so a small step costs the
// GPU's time rather than the host's ~50 launches and executor work (issue #51).
//
// A run of such a plan (local_master, session_options::gpu_graphs):
//   run 1   as always (it makes the GPU constants, cuBLAS's handle, the allocator's cache);
//   run 2   as always, watched: it must not move data between host and GPU inside a kernel
//           (a kernel that reads ids on the host, a shape op's upload) nor give a variable a
//           new buffer (a copy-on-write); either would not replay, and the plan runs as
//           always from then on, said once in the log;
//   run 3   recorded: the feeds are copied into device buffers the graph keeps, the executor
//           runs the plan with every kernel launch recorded, not run (the kernels'
//           allocations come from a memory pool of the graph's own, which no one else can
//           take between replays); then the graph runs once, for this step;
//   run 4+  replayed: the feeds are copied into the graph's buffers, the graph launches,
//           the fetches are copied into page-locked buffers of the graph's own, all on the
//           GPU's stream, and the host waits for the GPU once, then hands out their copies. A feed
//           whose shape or dtype differs from the recorded one runs the plan as always (said once);
//           a variable given another buffer since (assigned from another plan, restored) drops the
//           graph, and the plan is watched and recorded again (at most 3 times, then as always).
// The static reasons a plan runs as always: an item on the host or on another GPU, a
// _send or _recv, a blocking kernel, a random op (its kernel's key comes from the host,
// a new one each run), a fed value fetched as it is, a traced run, or a GPU backend that
// cannot capture (the stand-in of the tests).
// Replays of one plan take its lock: they share its feed and fetch buffers.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/log.hpp>
#include <loom/kernels/gpu_backend.hpp>
#include <loom/runtime/executor.hpp>
#include <loom/runtime/plan.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace loom::detail {

class captured_step {
public:
  // Why `p` cannot run as a CUDA graph in this process, or "" when it can; `device` is
  // then its GPU.
  LOOM_COMPILED_ONCE static std::string why_not(const plan& p, const graph& g, int& device);

  captured_step() = default;
  captured_step(const captured_step&) = delete;
  captured_step& operator=(const captured_step&) = delete;
  ~captured_step() { drop(); }

  // Runs `p` (run_plan's arguments): as always, watched, recorded or replayed.
  LOOM_COMPILED_ONCE std::vector<any_tensor> run(const plan& p, plan_caches& caches, const graph& g,
                                                 std::vector<any_tensor> feeds,
                                                 const kernels::cpu_device& device,
                                                 kernels::resource_access& resources);

private:
  enum class phase : std::uint8_t { first, watch, record, replay, off };

  // The address of each variable the plan reads or updates (nullptr: none yet).
  std::vector<const void*> variable_addresses(const plan& p, plan_caches& caches, const graph& g,
                                              kernels::resource_access& resources);
  // Runs off for good, saying why once.
  void turn_off(const plan& p, const graph& g, const std::string& why);
  std::vector<any_tensor> record(const plan& p, plan_caches& caches, const graph& g,
                                 std::vector<any_tensor> feeds, const kernels::cpu_device& device,
                                 kernels::resource_access& resources);
  std::vector<any_tensor> replay(const std::vector<any_tensor>& feeds);
  // Drops the graph and what it holds, its pool last.
  void drop();

  std::mutex mu_; // a plan's runs take turns through the phases and replays
  phase phase_ = phase::first;
  int device_ = -1;
  int recordings_ = 0;
  bool said_shapes_ = false;
  std::vector<const void*> variables_; // their addresses when watched or recorded
  // The graph, then what it reads and writes: destroyed in reverse, the buffers first.
  std::unique_ptr<kernels::gpu_backend::graph> graph_;
  std::vector<any_tensor> feed_buffers_;  // on the GPU, one per fed slot
  std::vector<any_tensor> fetch_buffers_; // views of the fetched values on the GPU
  std::vector<any_tensor> fetch_staging_; // page-locked, one per fetch, refilled by each replay
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE std::string captured_step::why_not(const plan& p, const graph& g, int& device) {
  kernels::gpu_backend* b = kernels::gpu_backend::registered();
  if (!b || !b->can_capture())
    return "this process's GPU backend cannot capture";
  if (!p.on_gpu())
    return "no item runs on a GPU";
  if (p.blocks())
    return "a kernel may wait for other steps";
  device = -1;
  std::string why;
  const auto check = [&](const plan::item& s) {
    const node_def& n = g.node(s.id);
    if (s.k == plan::item::kind::send || s.k == plan::item::kind::recv)
      why = "node " + n.describe() + " is a transfer to or from another task";
    else if (s.where.on_host())
      why = "node " + n.describe() + " runs on the host";
    else if (device >= 0 && s.where.device != device)
      why = "the plan runs on two GPUs";
    else if (n.op == "random_uniform" || n.op == "random_normal" || n.op == "truncated_normal")
      why = "node " + n.describe() + " draws other numbers each run (its key is the host's)";
    device = s.where.device;
  };
  for (const plan::item& s : p.items()) {
    check(s);
    for (const plan::item& f : s.fallback)
      if (why.empty())
        check(f);
    if (!why.empty())
      return why;
  }
  for (plan::slot f : p.fetches())
    for (plan::slot fed : p.fed())
      if (f == fed)
        return "a fed value is fetched as it is";
  return device >= 0 ? "" : "no item runs on a GPU";
}

LOOM_COMPILED_ONCE std::vector<any_tensor> captured_step::run(const plan& p, plan_caches& caches,
                                                              const graph& g,
                                                              std::vector<any_tensor> feeds,
                                                              const kernels::cpu_device& device,
                                                              kernels::resource_access& resources) {
  std::unique_lock lock(mu_);
  switch (phase_) {
  case phase::off: break;
  case phase::first:
    phase_ = phase::watch;
    if (const std::string why = why_not(p, g, device_); !why.empty()) {
      phase_ = phase::off;
      logging::debug("a plan of " + std::to_string(p.items().size()) +
                     " items runs without a CUDA graph: " + why);
    }
    break;
  case phase::watch: {
    kernels::gpu_backend& b = *kernels::gpu_backend::registered();
    const std::uint64_t transfers = b.kernel_host_transfers();
    variables_ = variable_addresses(p, caches, g, resources);
    auto out = run_plan(p, caches, g, std::move(feeds), device, resources);
    if (b.kernel_host_transfers() != transfers)
      turn_off(p, g, "a GPU kernel of it moves data between host and GPU itself");
    else if (variable_addresses(p, caches, g, resources) != variables_)
      turn_off(p, g, "a variable's buffer changed in a step");
    else
      phase_ = phase::record;
    return out;
  }
  case phase::record: return record(p, caches, g, std::move(feeds), device, resources);
  case phase::replay: {
    bool same_feeds = feeds.size() == feed_buffers_.size();
    for (std::size_t i = 0; same_feeds && i < feeds.size(); ++i)
      same_feeds = feeds[i].type() == feed_buffers_[i].type() &&
                   feeds[i].shape() == feed_buffers_[i].shape();
    if (!same_feeds) {
      if (!std::exchange(said_shapes_, true))
        logging::info("a step fed values of other shapes than its CUDA graph's runs without "
                      "it (and so does every such step)");
      break;
    }
    if (variable_addresses(p, caches, g, resources) != variables_) {
      drop(); // assigned or restored from elsewhere: watched and recorded again
      phase_ = recordings_ < 3 ? phase::watch : phase::off;
      if (phase_ == phase::off)
        turn_off(p, g, "its variables were given new buffers three times");
      break;
    }
    return replay(feeds);
  }
  }
  lock.unlock();
  return run_plan(p, caches, g, std::move(feeds), device, resources);
}

LOOM_COMPILED_ONCE std::vector<const void*>
captured_step::variable_addresses(const plan& p, plan_caches& caches, const graph& g,
                                  kernels::resource_access& resources) {
  std::vector<const void*> out;
  const auto add = [&](plan::slot s) {
    kernels::variable_resource& r = caches.variable(p, g, s, resources);
    std::lock_guard lock(r.mu);
    out.push_back(r.value.empty()     ? nullptr
                  : r.value.on_host() ? r.value.raw_data()
                                      : r.value.device_data());
  };
  const auto visit = [&](const plan::item& s) {
    if (p.reads_variable(s.out))
      add(s.out);
    for (plan::slot r : s.refs)
      add(r);
  };
  for (const plan::item& s : p.items()) {
    visit(s);
    for (const plan::item& f : s.fallback)
      visit(f);
  }
  return out;
}

LOOM_COMPILED_ONCE void captured_step::turn_off(const plan& p, const graph& g,
                                                const std::string& why) {
  phase_ = phase::off;
  std::string fetched;
  for (plan::slot f : p.fetches())
    for (const plan::item& s : p.items())
      if (s.out == f) {
        fetched += (fetched.empty() ? "" : ", ") + g.node(s.id).name;
        break;
      }
  logging::info("the step of " + std::to_string(p.items().size()) + " GPU items" +
                (fetched.empty() ? std::string() : " fetching " + fetched) +
                " runs without a CUDA graph: " + why);
}

LOOM_COMPILED_ONCE std::vector<any_tensor>
captured_step::record(const plan& p, plan_caches& caches, const graph& g,
                      std::vector<any_tensor> feeds, const kernels::cpu_device& device,
                      kernels::resource_access& resources) {
  kernels::gpu_backend& b = *kernels::gpu_backend::registered();
  const memory_location gpu = memory_location::gpu(device_);
  // Another plan's run since the watched one may have given a variable a new buffer.
  variables_ = variable_addresses(p, caches, g, resources);
  // The feeds in buffers of the graph's own, before the recording: each replay refills them.
  feed_buffers_.clear();
  for (const any_tensor& f : feeds) // a fed GPU tensor is the caller's: copied too
    feed_buffers_.push_back(b.copy(f, gpu));
  std::vector<any_tensor> out;
  std::string why;
  {
    auto capture = b.begin_capture(device_);
    try {
      // A fetched variable is held as a view, not an owner: its buffer held here would be
      // shared, and the next update of it outside this graph (another plan's) would copy
      // it. The variables' addresses are checked before each replay.
      for (const any_tensor& f :
           plan_execution(p, caches).run_on_device(g, feed_buffers_, device, resources)) {
        const bool variable = !f.empty() && std::find(variables_.begin(), variables_.end(),
                                                      f.device_data()) != variables_.end();
        fetch_buffers_.push_back(!variable ? f
                                           : any_tensor::adopt(f.type(), f.shape(), f.location(),
                                                               const_cast<void*>(f.device_data()),
                                                               [](void*) {}));
      }
    } catch (...) {
      why = "recording it failed";
    }
    if (why.empty())
      graph_ = capture->finish(why);
    if (graph_) {
      if (variable_addresses(p, caches, g, resources) != variables_)
        why = "a variable's buffer changed while it was recorded";
      graph_->launch(); // this step's work, recorded and not yet run
      for (const any_tensor& f : fetch_buffers_) {
        out.push_back(f.empty() ? f : b.copy(f, memory_location::host()));
        fetch_staging_.push_back(f.empty() ? f : b.allocate_pinned(f.type(), f.shape()));
      }
    }
  }
  if (!why.empty()) {
    const bool ran = graph_ != nullptr;
    drop();
    turn_off(p, g, why);
    if (!ran) // nothing of this step ran: run it as always
      return run_plan(p, caches, g, std::move(feeds), device, resources);
    return out;
  }
  ++recordings_;
  phase_ = phase::replay;
  logging::debug("a step of " + std::to_string(p.items().size()) +
                 " GPU items runs as one CUDA graph from now on");
  return out;
}

LOOM_COMPILED_ONCE std::vector<any_tensor>
captured_step::replay(const std::vector<any_tensor>& feeds) {
  kernels::gpu_backend& b = *kernels::gpu_backend::registered();
  for (std::size_t i = 0; i < feeds.size(); ++i)
    b.copy_into(feed_buffers_[i], feeds[i]);
  graph_->launch();
  for (std::size_t i = 0; i < fetch_buffers_.size(); ++i)
    if (!fetch_buffers_[i].empty())
      b.copy_into(fetch_staging_[i], fetch_buffers_[i]);
  // One wait: the feeds' copies (which may read the caller's page-locked tensors), the graph
  // and the fetches' copies. The staging buffers are the next replay's: the caller gets
  // copies.
  b.synchronize(device_);
  std::vector<any_tensor> out;
  out.reserve(fetch_staging_.size());
  for (const any_tensor& f : fetch_staging_)
    out.push_back(f.clone());
  return out;
}

LOOM_COMPILED_ONCE void captured_step::drop() {
  fetch_staging_.clear();
  fetch_buffers_.clear();
  feed_buffers_.clear();
  graph_.reset();
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

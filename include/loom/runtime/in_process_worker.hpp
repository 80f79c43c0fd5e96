// A task's worker for a session in this process whose target the task is
// (runtime/worker_interface.hpp; TF's LocalMaster reaching its LocalWorker):
// the calls a remote master makes, made directly on the task's worker service,
// and each step run on the session's own thread, its feeds and fetches handed
// over in memory. It outlives the task where a session holds it: detach()
// waits for the calls in flight, and later calls fail saying the task stopped.
#pragma once

#include <loom/runtime/worker_interface.hpp>
#include <loom/runtime/worker_service.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

namespace loom::detail {

class in_process_worker final : public worker_interface {
public:
  // `task` names the task in the error a call after detach() throws.
  in_process_worker(worker_service& service, std::string task)
      : service_(&service), task_(std::move(task)) {}

  // The task stops: waits for the calls in flight; later calls fail.
  void detach() {
    std::unique_lock lock(mu_);
    service_ = nullptr;
  }

  protocol::cluster_info_reply cluster_info() override {
    std::shared_lock lock(mu_);
    return live().cluster_info();
  }
  std::uint64_t register_graph(const graph& partition, const run_request& req) override {
    std::shared_lock lock(mu_);
    return live().register_graph(partition, req);
  }
  std::function<void()> deregister_graph(std::uint64_t handle) noexcept override {
    std::shared_lock lock(mu_);
    if (service_)
      service_->deregister_graph(handle);
    return {};
  }
  pending_run run_graph(std::uint64_t handle, step_id step, std::vector<any_tensor> feeds,
                        const run_graph_options& o) override {
    return pending_run(std::make_unique<deferred_run>(*this, handle, step, std::move(feeds), o));
  }
  void abort_step(step_id step, const std::string& reason) noexcept override {
    std::shared_lock lock(mu_);
    if (service_)
      service_->abort_step(step, reason);
  }
  void reset(const std::vector<std::string>& containers,
             std::chrono::steady_clock::time_point) override {
    std::shared_lock lock(mu_);
    live().reset(containers);
  }
  void shutdown(std::chrono::steady_clock::time_point) override {
    std::shared_lock lock(mu_);
    live().shutdown("a session in this process asked");
  }

private:
  // A step run by get(), on the caller's thread: a master starts the other tasks' parts
  // first and runs this one while they run.
  struct deferred_run final : pending_run::state {
    deferred_run(in_process_worker& w, std::uint64_t handle, step_id step,
                 std::vector<any_tensor> feeds, run_graph_options o)
        : worker(w), handle(handle), step(step), feeds(std::move(feeds)), options(std::move(o)) {}
    std::vector<any_tensor> get() override {
      std::shared_lock lock(worker.mu_);
      return worker.live().run_graph_here(handle, step, std::move(feeds), options);
    }
    bool runs_on_caller() const noexcept override { return true; }

    in_process_worker& worker;
    std::uint64_t handle;
    step_id step;
    std::vector<any_tensor> feeds;
    run_graph_options options;
  };

  worker_service& live() const {
    if (!service_)
      throw unavailable_error(task_ + " (the session's target, in this process) stopped");
    return *service_;
  }

  std::shared_mutex mu_; // held shared by a call in flight, so the service outlives it
  worker_service* service_;
  std::string task_;
};

} // namespace loom::detail

// Saves summaries every N global steps and/or every N seconds (TF's
// SummarySaverHook): it asks for the summary op only with the steps that are
// due, so the steps between pay nothing for it, and writes each with the
// global step read after the step, as TF's. monitored_training_session makes
// one on the chief where summary_dir is set (save_summaries_steps/_secs), as
// TF's MonitoredTrainingSession: one writer per cluster. Put in hooks (not
// chief_only_hooks) it runs on every worker, each needing its own logdir.
// Given the examples a global step trains on, it also writes the cluster's
// "examples/s" with every save after the first: a host-side value, measured
// between saves, as TF's StepCounterHook writes global_step/sec beside the
// summaries (which would be a second hook sharing the writer). Where this process's GPUs
// hold tensors, each save adds their memory (loom::gpu_memory) in MB: "gpu_<i>/allocated_mb",
// "gpu_<i>/cached_mb" and "gpu_<i>/peak_mb", the peak since the save before.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/graph/ops/summary.hpp>
#include <loom/kernels/gpu_backend.hpp>
#include <loom/train/hooks.hpp>
#include <loom/train/summary_writer.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace loom {

struct summary_saver_options {
  std::string logdir;
  std::int64_t every_n_steps = 100; // 0: not by steps
  double every_n_secs = 0;          // 0: not by time
  // The summary to write; none: merge_all_summaries of the graph at begin().
  std::optional<node_id> summary_op{};
  // > 0: each save after the first adds "examples/s", the global steps since
  // the save before times this, over the seconds since then (the cluster's
  // rate: every worker's steps advance the global step). With sync replicas a
  // global step is replicas_to_aggregate batches.
  std::int64_t examples_per_global_step = 0;
  summary_writer_options writer{};
};

class summary_saver_hook final : public session_run_hook {
public:
  explicit summary_saver_hook(summary_saver_options o);

  void begin(graph& g) override;

  std::vector<node_id> before_run() override {
    request_ = !next_step_ || due(*next_step_);
    if (request_)
      return {*o_.summary_op};
    return {};
  }

  void after_run(run_context& c, std::span<const any_tensor> v) override;

  void end(session&, std::int64_t) override { writer_->flush(); }

  summary_writer& writer() { return *writer_; }

private:
  using clock = std::chrono::steady_clock;
  bool due(std::int64_t step) const;

  summary_saver_options o_;
  std::unique_ptr<summary_writer> writer_;
  bool request_ = false;
  std::optional<std::int64_t> next_step_, last_step_;
  clock::time_point last_time_{};
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE summary_saver_hook::summary_saver_hook(summary_saver_options o)
    : o_(std::move(o)) {
  if (o_.every_n_steps <= 0 && o_.every_n_secs <= 0)
    throw invalid_argument_error("summary_saver_hook: give every_n_steps or every_n_secs (both "
                                 "are 0: it would never save)");
  if (o_.every_n_steps < 0 || o_.every_n_secs < 0)
    throw invalid_argument_error("summary_saver_hook: every_n_steps and every_n_secs must not be "
                                 "negative");
  if (o_.examples_per_global_step < 0)
    throw invalid_argument_error("summary_saver_hook: examples_per_global_step must not be "
                                 "negative");
}

LOOM_COMPILED_ONCE void summary_saver_hook::begin(graph& g) {
  if (!o_.summary_op) {
    auto all = merge_all_summaries(g);
    if (!all)
      throw failed_precondition_error("summary_saver_hook: the graph has no summaries (add "
                                      "scalar_summary or histogram_summary ops first)");
    o_.summary_op = all->id();
  }
  if (!writer_)
    writer_ = std::make_unique<summary_writer>(o_.logdir, o_.writer);
}

LOOM_COMPILED_ONCE void summary_saver_hook::after_run(run_context& c,
                                                      std::span<const any_tensor> v) {
  std::int64_t step = c.global_step + 1; // the step read with the run may miss its own update
  if (!next_step_ || request_)
    step = c.read_global_step();
  if (!next_step_)
    writer_->add_session_start(step);
  if (request_) {
    const auto now = clock::now();
    writer_->add_summary(v[0], step);
    if (o_.examples_per_global_step > 0 && last_step_ && step > *last_step_ && now > last_time_) {
      const double secs = std::chrono::duration<double>(now - last_time_).count();
      writer_->add_scalar(
          "examples/s",
          static_cast<double>((step - *last_step_) * o_.examples_per_global_step) / secs, step);
    }
    if (kernels::gpu_backend* b = kernels::gpu_backend::registered())
      for (int d = 0; d < b->device_count(); ++d)
        if (const gpu_memory_info m = b->memory(d); m.allocated || m.cached || m.peak) {
          const std::string gpu = "gpu_" + std::to_string(d) + "/";
          writer_->add_scalar(gpu + "allocated_mb", static_cast<double>(m.allocated) / 1e6, step);
          writer_->add_scalar(gpu + "cached_mb", static_cast<double>(m.cached) / 1e6, step);
          writer_->add_scalar(gpu + "peak_mb", static_cast<double>(m.peak) / 1e6, step);
          b->reset_memory_peak(d);
        }
    last_step_ = step;
    last_time_ = now;
  }
  next_step_ = step + 1;
}

LOOM_COMPILED_ONCE bool summary_saver_hook::due(std::int64_t step) const {
  if (!last_step_)
    return true;
  const bool by_steps = o_.every_n_steps > 0 && step >= *last_step_ + o_.every_n_steps;
  const bool by_time =
      o_.every_n_secs > 0 &&
      std::chrono::duration<double>(clock::now() - last_time_).count() >= o_.every_n_secs;
  return by_steps || by_time;
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

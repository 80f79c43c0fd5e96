// Hooks that watch a monitored training loop (TF's SessionRunHook and the
// hooks of tf.train): stop at a step, log progress, save checkpoints, guard
// against a NaN loss. A hook asks for extra values in before_run; they are
// fetched in the same step as the caller's fetches and handed to after_run.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/log.hpp>
#include <loom/runtime/session.hpp>
#include <loom/train/incremental_saver.hpp>
#include <loom/train/saver.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace loom {

struct run_context {
  // Read in the same step, so it may not include this step's own update.
  std::int64_t global_step = 0;
  // Reads the global step again, after the step (one more round trip).
  std::function<std::int64_t()> read_global_step{};
  bool stop_requested = false;
  void request_stop() noexcept { stop_requested = true; }
};

class session_run_hook {
public:
  virtual ~session_run_hook() = default;
  // Before the session exists; the graph may still grow (a saver adds nodes).
  virtual void begin(graph&) {}
  // After the chief initialized or restored, or the variables became ready.
  virtual void after_create_session(session&, std::int64_t /*global_step*/) {}
  // Node ids to fetch with the next step.
  virtual std::vector<node_id> before_run() { return {}; }
  // Their values, in order.
  virtual void after_run(run_context&, std::span<const any_tensor>) {}
  // When the monitored session closes normally.
  virtual void end(session&, std::int64_t /*global_step*/) {}
};

// Requests a stop once the global step reaches last_step (TF's StopAtStepHook).
class stop_at_step_hook final : public session_run_hook {
public:
  explicit stop_at_step_hook(std::int64_t last_step) : last_(last_step) {}
  // As TF's: the step read with the run may miss the run's own update, so
  // near the end it is read again before stopping.
  void after_run(run_context& c, std::span<const any_tensor>) override {
    if (c.global_step + 1 >= last_ && (c.global_step >= last_ || c.read_global_step() >= last_))
      c.request_stop();
  }

private:
  std::int64_t last_;
};

// Fails the step whose loss is NaN or infinite (TF's NanTensorHook).
class nan_guard_hook final : public session_run_hook {
public:
  explicit nan_guard_hook(node_id loss) : loss_(loss) {}
  std::vector<node_id> before_run() override { return {loss_}; }
  void after_run(run_context& c, std::span<const any_tensor> v) override;

private:
  node_id loss_;
};

// Prints the global step, the loss and examples/s every `every` local steps:
// this worker's rate and the cluster's (from the global step's progress).
struct logging_options {
  std::string label = "worker";     // printed first on each line
  std::int64_t every_n_steps = 100; // local steps between lines
  std::int64_t batch_size = 1;      // examples in one local step
  // Examples one global step stands for: the batch size in async training,
  // batch size x replicas_to_aggregate with synchronous replicas.
  std::int64_t examples_per_global_step = 1;
  // The global step training stops at (stop_at_step_hook's); where known (> 0), each
  // line also says how far training is, its global steps a second and the time left.
  std::int64_t last_step = 0;
  std::FILE* out = stdout;
};

class logging_hook final : public session_run_hook {
public:
  logging_hook(node_id loss, logging_options o) : loss_(loss), o_(std::move(o)) {}
  std::vector<node_id> before_run() override { return {loss_}; }
  void after_run(run_context& c, std::span<const any_tensor> v) override;

private:
  using clock = std::chrono::steady_clock;

  // "  12.5 % done  250.0 steps/s  0:00:42 left", at `rate` global steps a second.
  std::string progress(std::int64_t global_step, double rate) const;

  node_id loss_;
  logging_options o_;
  std::int64_t local_ = 0, last_local_ = 0, last_global_ = 0;
  std::optional<clock::time_point> last_;
};

// Saves a checkpoint every `secs` seconds and/or every `steps` global steps,
// after the session is created and at the end (TF's CheckpointSaverHook), and
// logs each (core/log.hpp, info). The chief's hook: one writer per cluster.
struct checkpoint_options {
  std::string dir;
  double secs = 600;      // 0: not by time
  std::int64_t steps = 0; // 0: not by steps
  // With an incremental_saver, between the full checkpoints: an increment when this
  // many seconds have passed, or the global step has advanced this many, since the last
  // save of either kind (0: not by time, not by steps).
  double increment_secs = 0;
  std::int64_t increment_steps = 0;
};

// Saves checkpoints by time and steps (TF's CheckpointSaverHook): at the session's start,
// then as the options say, and at the end. With an incremental_saver, where a chain is
// begun, the start and the end save increments (a restarted task resumes without writing
// its tables whole), and between the full checkpoints increments as the options say.
class checkpoint_saver_hook final : public session_run_hook {
public:
  checkpoint_saver_hook(saver& s, checkpoint_options o) : saver_(&s), o_(std::move(o)) {}
  checkpoint_saver_hook(incremental_saver& s, checkpoint_options o)
      : incremental_(&s), o_(std::move(o)) {}
  void after_create_session(session& s, std::int64_t step) override {
    session_ = &s;
    save(s, step, !(incremental_ && incremental_->has_chain()));
    last_full_time_ = last_time_; // the full checkpoints' period counts from here
    last_full_step_ = step;
  }
  void after_run(run_context& c, std::span<const any_tensor>) override;
  void end(session& s, std::int64_t step) override {
    if (step != last_step_)
      save(s, step, !(incremental_ && incremental_->has_chain()));
  }

private:
  using clock = std::chrono::steady_clock;
  void save(session& s, std::int64_t step, bool full);

  saver* saver_ = nullptr;
  incremental_saver* incremental_ = nullptr;
  checkpoint_options o_;
  session* session_ = nullptr;
  clock::time_point last_time_ = clock::now(), last_full_time_ = last_time_;
  std::int64_t last_step_ = -1, last_full_step_ = -1;
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE void nan_guard_hook::after_run(run_context& c, std::span<const any_tensor> v) {
  const double loss =
      v[0].type() == dtype::f64 ? *v[0].data<double>() : static_cast<double>(*v[0].data<float>());
  if (!std::isfinite(loss))
    throw invalid_argument_error("the loss is " + std::to_string(loss) + " at global step " +
                                 std::to_string(c.global_step) +
                                 " (nan_guard_hook): training diverged");
}

LOOM_COMPILED_ONCE void logging_hook::after_run(run_context& c, std::span<const any_tensor> v) {
  const auto now = clock::now();
  if (!last_) {
    last_ = now;
    last_global_ = c.global_step;
  }
  if (++local_ % o_.every_n_steps != 0)
    return;
  const double secs = std::chrono::duration<double>(now - *last_).count();
  const double loss =
      v[0].type() == dtype::f64 ? *v[0].data<double>() : static_cast<double>(*v[0].data<float>());
  const auto steps = static_cast<double>(local_ - last_local_);
  const auto global = static_cast<double>(c.global_step - last_global_);
  std::fprintf(o_.out,
               "%s: step %lld  global step %lld  loss %.4f  %.0f examples/s  "
               "(cluster %.0f examples/s)%s\n",
               o_.label.c_str(), static_cast<long long>(local_),
               static_cast<long long>(c.global_step), loss,
               secs > 0 ? steps * static_cast<double>(o_.batch_size) / secs : 0.0,
               secs > 0 ? global * static_cast<double>(o_.examples_per_global_step) / secs : 0.0,
               progress(c.global_step, secs > 0 ? global / secs : 0.0).c_str());
  std::fflush(o_.out);
  last_ = now;
  last_local_ = local_;
  last_global_ = c.global_step;
}

LOOM_COMPILED_ONCE std::string logging_hook::progress(std::int64_t global_step, double rate) const {
  if (o_.last_step <= 0)
    return {};
  const auto left = static_cast<double>(std::max<std::int64_t>(o_.last_step - global_step, 0));
  char eta[32] = "?";
  if (rate > 0) {
    const auto s = static_cast<long long>(left / rate + 0.5);
    std::snprintf(eta, sizeof eta, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  }
  char line[96];
  std::snprintf(line, sizeof line, "  %.1f %% done  %.1f steps/s  %s left",
                100.0 * static_cast<double>(std::min(global_step, o_.last_step)) /
                    static_cast<double>(o_.last_step),
                rate, eta);
  return line;
}

LOOM_COMPILED_ONCE void checkpoint_saver_hook::after_run(run_context& c,
                                                         std::span<const any_tensor>) {
  if (!session_)
    return;
  const auto now = clock::now();
  auto due = [&](double secs, std::int64_t steps, clock::time_point since_time,
                 std::int64_t since_step) {
    return (secs > 0 && std::chrono::duration<double>(now - since_time).count() >= secs) ||
           (steps > 0 && c.global_step - since_step >= steps);
  };
  if (due(o_.secs, o_.steps, last_full_time_, last_full_step_))
    save(*session_, c.global_step, true);
  else if (incremental_ && incremental_->has_chain() &&
           due(o_.increment_secs, o_.increment_steps, last_time_, last_step_))
    save(*session_, c.global_step, false);
}

LOOM_COMPILED_ONCE void checkpoint_saver_hook::save(session& s, std::int64_t step, bool full) {
  const std::string prefix = o_.dir + "/model.ckpt";
  const std::string path = !incremental_ ? saver_->save(s, prefix, step)
                           : full        ? incremental_->save(s, prefix, step)
                                         : incremental_->save_increment(s, prefix, step);
  logging::info(std::string(full ? "saved checkpoint " : "saved incremental checkpoint ") + path +
                " (global step " + std::to_string(step) + ")");
  last_time_ = clock::now();
  last_step_ = step;
  if (full) {
    last_full_time_ = last_time_;
    last_full_step_ = step;
  }
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

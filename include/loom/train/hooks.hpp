// Hooks that watch a monitored training loop (TF's SessionRunHook and the
// hooks of tf.train): stop at a step, log progress, save checkpoints, guard
// against a NaN loss. A hook asks for extra values in before_run; they are
// fetched in the same step as the caller's fetches and handed to after_run.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/log.hpp>
#include <loom/runtime/session.hpp>
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
};

class checkpoint_saver_hook final : public session_run_hook {
public:
  checkpoint_saver_hook(saver& s, checkpoint_options o) : saver_(s), o_(std::move(o)) {}
  void after_create_session(session& s, std::int64_t step) override {
    session_ = &s;
    save(s, step);
  }
  void after_run(run_context& c, std::span<const any_tensor>) override;
  void end(session& s, std::int64_t step) override {
    if (step != last_step_)
      save(s, step);
  }

private:
  using clock = std::chrono::steady_clock;
  void save(session& s, std::int64_t step);

  saver& saver_;
  checkpoint_options o_;
  session* session_ = nullptr;
  clock::time_point last_time_ = clock::now();
  std::int64_t last_step_ = -1;
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
  const bool by_time =
      o_.secs > 0 && std::chrono::duration<double>(clock::now() - last_time_).count() >= o_.secs;
  const bool by_steps = o_.steps > 0 && c.global_step - last_step_ >= o_.steps;
  if ((by_time || by_steps) && session_)
    save(*session_, c.global_step);
}

LOOM_COMPILED_ONCE void checkpoint_saver_hook::save(session& s, std::int64_t step) {
  const std::string path = saver_.save(s, o_.dir + "/model.ckpt", step);
  logging::info("saved checkpoint " + path + " (global step " + std::to_string(step) + ")");
  last_time_ = clock::now();
  last_step_ = step;
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

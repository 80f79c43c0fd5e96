// Learning-rate schedules (TF 1.x's tf.train.*_decay): scalar float nodes computed from
// the global step each step, what every optimizer takes as its learning rate (a
// hyperparameter may be a node). Built from elementwise ops, so each schedule is one
// fused kernel; the step is read where the graph reads the global step (on its ps).
#pragma once

#include <loom/core/error.hpp>
#include <loom/expr/expr.hpp>
#include <loom/graph/lower.hpp>
#include <loom/graph/ops/math.hpp>
#include <loom/graph/output.hpp>
#include <loom/graph/variables.hpp>

#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

namespace loom {

namespace detail {
template <class S> constexpr void check_step() {
  static_assert(std::is_integral_v<value_type_of<S>> && rank_of<S> == 0,
                "loom's learning-rate schedules take the global step: an integer scalar "
                "(loom::create_global_step(g) or loom::get_global_step(g))");
}
inline void check_decay_steps(const char* fn, std::int64_t decay_steps) {
  if (decay_steps <= 0)
    throw invalid_argument_error(std::string("loom::") + fn + ": decay_steps " +
                                 std::to_string(decay_steps) + " must be positive");
}
} // namespace detail

// lr * rate^(step / decay_steps), the exponent floored with `staircase`
// (tf.train.exponential_decay).
template <class T = float, expression S>
output<T, 0> exponential_decay(double learning_rate, const S& global_step, std::int64_t decay_steps,
                               double decay_rate, bool staircase = false) {
  detail::check_step<S>();
  detail::check_decay_steps("exponential_decay", decay_steps);
  auto p = lower(cast<double>(global_step) / static_cast<double>(decay_steps));
  if (staircase)
    p = lower(cast<double>(cast<std::int64_t>(global_step) / decay_steps));
  return lower(cast<T>(learning_rate * pow(decay_rate, p)));
}

// values[i] while step <= boundaries[i] (and past the last boundary the last value), TF's
// tf.train.piecewise_constant. The boundaries must increase; one more value than
// boundaries.
template <class T = float, expression S>
output<T, 0> piecewise_constant(const S& global_step, const std::vector<std::int64_t>& boundaries,
                                const std::vector<double>& values) {
  detail::check_step<S>();
  if (values.size() != boundaries.size() + 1)
    throw invalid_argument_error("loom::piecewise_constant: " + std::to_string(values.size()) +
                                 " values for " + std::to_string(boundaries.size()) +
                                 " boundaries (one more value than boundaries)");
  for (std::size_t i = 1; i < boundaries.size(); ++i)
    if (boundaries[i] <= boundaries[i - 1])
      throw invalid_argument_error(
          "loom::piecewise_constant: boundaries " + detail::dims_to_string(boundaries) +
          " do not increase (boundary " + std::to_string(i) + " is " +
          std::to_string(boundaries[i]) + " after " + std::to_string(boundaries[i - 1]) + ")");
  auto step = lower(cast<std::int64_t>(global_step));
  graph g = step.graph();
  output<T, 0> rate = constant(g, static_cast<T>(values.back()));
  for (std::size_t i = boundaries.size(); i-- > 0;)
    rate =
        lower(where(less_equal(step, boundaries[i]), constant(g, static_cast<T>(values[i])), rate));
  return rate;
}

// (lr - end) * (1 - step / decay_steps)^power + end, the step held at decay_steps; with
// `cycle` decay_steps grows to the next multiple past the step (tf.train.polynomial_decay).
template <class T = float, expression S>
output<T, 0> polynomial_decay(double learning_rate, const S& global_step, std::int64_t decay_steps,
                              double end_learning_rate = 0.0001, double power = 1.0,
                              bool cycle = false) {
  detail::check_step<S>();
  detail::check_decay_steps("polynomial_decay", decay_steps);
  auto step = lower(cast<double>(global_step));
  output<double, 0> steps = constant(step.graph(), static_cast<double>(decay_steps));
  if (cycle) {
    // decay_steps * ceil(step / decay_steps), and decay_steps itself at step 0.
    auto multiple =
        lower(cast<double>((cast<std::int64_t>(global_step) + decay_steps - 1) / decay_steps));
    steps = lower(maximum(multiple, 1.0) * static_cast<double>(decay_steps));
  } else {
    step = lower(minimum(step, static_cast<double>(decay_steps)));
  }
  auto fraction = lower(1.0 - step / steps);
  return lower(
      cast<T>((learning_rate - end_learning_rate) * pow(fraction, power) + end_learning_rate));
}

// lr * ((1 - alpha) * (1 + cos(pi * step / decay_steps)) / 2 + alpha), the step held at
// decay_steps (tf.train.cosine_decay).
template <class T = float, expression S>
output<T, 0> cosine_decay(double learning_rate, const S& global_step, std::int64_t decay_steps,
                          double alpha = 0.0) {
  detail::check_step<S>();
  detail::check_decay_steps("cosine_decay", decay_steps);
  auto step = lower(minimum(cast<double>(global_step), static_cast<double>(decay_steps)));
  auto cosine = lower(0.5 * (1.0 + cos(step * (std::numbers::pi / decay_steps))));
  return lower(cast<T>(learning_rate * ((1 - alpha) * cosine + alpha)));
}

// A linear warmup in front of a schedule: from `initial` at step 0 up to the schedule's
// value at warmup_steps, the schedule after (as the warmups of TF's official models).
template <class T = float, expression S, expression R>
output<T, 0> linear_warmup(const R& schedule, const S& global_step, std::int64_t warmup_steps,
                           double initial = 0.0) {
  detail::check_step<S>();
  static_assert(std::is_same_v<value_type_of<R>, T> && rank_of<R> == 0,
                "loom::linear_warmup: the schedule is a scalar of the learning rate's dtype");
  detail::check_decay_steps("linear_warmup", warmup_steps);
  auto step = lower(cast<std::int64_t>(global_step));
  auto to = lower(schedule);
  auto ramp = lower(static_cast<T>(initial) +
                    (to - static_cast<T>(initial)) *
                        (cast<T>(step) * static_cast<T>(1.0 / static_cast<double>(warmup_steps))));
  return lower(where(less(step, warmup_steps), ramp, to));
}

} // namespace loom

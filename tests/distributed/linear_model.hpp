// A linear model y = x w + b for the cluster tests, its variables placed by
// replica_device_setter over the ps tasks when `ps_tasks` > 0 (all local
// otherwise), and one fixed batch: the same model trained on a cluster and in
// one process must give the same losses.
#pragma once

#include <loom/api.hpp>

#include <optional>

namespace loom::testing {

enum class trained_by {
  gradient_descent,      // minimize(loss), no global step
  adam_with_global_step, // Adam's slots, beta powers and the global step's increment
};

struct linear_model {
  loom::graph g;
  loom::placeholder<float, 2> x{g, loom::shape{-1, 3}, "x"};
  loom::placeholder<float, 2> y{g, loom::shape{-1, 2}, "y"};
  std::optional<loom::variable<std::int64_t, 0>> global_step;
  std::optional<loom::variable<float, 2>> w;
  std::optional<loom::variable<float, 1>> b;
  std::optional<loom::output<float, 0>> loss;
  std::optional<loom::operation> train;

  explicit linear_model(int ps_tasks, trained_by how = trained_by::gradient_descent) {
    g.set_random_seed(3);
    auto build = [&] {
      w.emplace(g, "w", loom::shape{3, 2}, loom::random_normal_initializer{.stddev = 0.5});
      b.emplace(g, "b", loom::shape{2}, loom::ones_initializer{});
      auto pred = loom::xw_plus_b(x, *w, *b);
      loss = loom::lower(loom::reduce_mean(loom::square(pred - y)));
      if (how == trained_by::gradient_descent) {
        train = loom::gradient_descent_optimizer{0.1}.minimize(*loss);
      } else {
        global_step.emplace(loom::create_global_step(g));
        train = loom::adam_optimizer{0.05}.minimize(*loss, *global_step);
      }
    };
    if (ps_tasks > 0) {
      auto _ = g.device(loom::replica_device_setter({.ps_tasks = ps_tasks}));
      build();
    } else {
      build();
    }
  }
};

inline loom::tensor<float, 2> batch_x() {
  return loom::tensor<float, 2>(loom::shape{4, 3}, {1, 2, 3, 0, 1, 0, -1, 2, 1, 3, 0, 1});
}
inline loom::tensor<float, 2> batch_y() {
  return loom::tensor<float, 2>(loom::shape{4, 2}, {1, 0, 0, 1, 1, 1, 0.5f, -1});
}

} // namespace loom::testing

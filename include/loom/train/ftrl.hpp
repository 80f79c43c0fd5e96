// FTRL-Proximal (tf.train.FtrlOptimizer, McMahan et al. 2013), the optimizer
// of click-through models: slots "accum" ("<var>/Ftrl", starting at
// initial_accumulator_value) and "linear" ("<var>/Ftrl_1", zeros); per element
// (TF's ApplyFtrlV2):
//   g' = grad + 2 * l2_shrinkage * var;   n = accum + grad^2
//   linear += g' - (n^-p - accum^-p) / lr * var        (p = learning_rate_power)
//   var = |linear| > l1 ? (sign(linear) * l1 - linear) / (n^-p / lr + 2 * l2) : 0
//   accum = n
// The dense update recomputes every element from `linear` (an untouched one
// with linear 0 becomes 0, as in TF); the sparse one only the touched rows.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/train/optimizer.hpp>

#include <string>

namespace loom {

struct ftrl_options {
  double learning_rate_power = -0.5;
  double initial_accumulator_value = 0.1;
  double l1_regularization_strength = 0.0;
  double l2_regularization_strength = 0.0;
  double l2_shrinkage_regularization_strength = 0.0;
};

class ftrl_optimizer final : public optimizer {
public:
  explicit ftrl_optimizer(hyperparameter learning_rate, ftrl_options o = {},
                          std::string name = "Ftrl");

protected:
  void create_slots(graph& g, const std::vector<node_id>& vars) override {
    for (node_id v : vars) {
      make_slot(g, v, "accum", o_.initial_accumulator_value);
      make_slot(g, v, "linear", 0.0);
    }
  }
  node_id apply_dense(graph& g, node_id grad, node_id var) override;

private:
  hyperparameter learning_rate_;
  ftrl_options o_;
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE ftrl_optimizer::ftrl_optimizer(hyperparameter learning_rate, ftrl_options o,
                                                  std::string name)
    : optimizer(std::move(name)), learning_rate_(std::move(learning_rate)), o_(o) {
  // TF's checks, with TF's reasons.
  if (o_.learning_rate_power > 0)
    throw invalid_argument_error("ftrl_optimizer: learning_rate_power must be 0 or less, got " +
                                 std::to_string(o_.learning_rate_power));
  if (o_.initial_accumulator_value < 0)
    throw invalid_argument_error(
        "ftrl_optimizer: initial_accumulator_value must be 0 or more, got " +
        std::to_string(o_.initial_accumulator_value));
  for (const auto& [what, v] :
       {std::pair{"l1_regularization_strength", o_.l1_regularization_strength},
        std::pair{"l2_regularization_strength", o_.l2_regularization_strength},
        std::pair{"l2_shrinkage_regularization_strength", o_.l2_shrinkage_regularization_strength}})
    if (v < 0)
      throw invalid_argument_error(std::string("ftrl_optimizer: ") + what +
                                   " must be 0 or more, got " + std::to_string(v));
}

LOOM_COMPILED_ONCE auto ftrl_optimizer::apply_dense(graph& g, node_id grad, node_id var)
    -> node_id {
  const dtype t = g.node(var).type;
  return update(
      g, "apply_ftrl",
      {var, slot(g, var, "accum"), slot(g, var, "linear"), grad,
       hyper(g, learning_rate_, "learning_rate", t),
       hyper(g, o_.l1_regularization_strength, "l1_regularization_strength", t),
       hyper(g, o_.l2_regularization_strength, "l2_regularization_strength", t),
       hyper(g, o_.l2_shrinkage_regularization_strength, "l2_shrinkage_regularization_strength", t),
       hyper(g, o_.learning_rate_power, "learning_rate_power", t)});
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

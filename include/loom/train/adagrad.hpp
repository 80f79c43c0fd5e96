// Adagrad (tf.train.AdagradOptimizer), one "accumulator" slot per variable
// ("<var>/Adagrad") starting at initial_accumulator_value:
//   accum += grad^2;  var -= lr * grad / sqrt(accum)
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/train/optimizer.hpp>

#include <string>

namespace loom {

class adagrad_optimizer final : public optimizer {
public:
  explicit adagrad_optimizer(hyperparameter learning_rate, double initial_accumulator_value = 0.1,
                             std::string name = "Adagrad")
      : optimizer(std::move(name)), learning_rate_(std::move(learning_rate)),
        initial_accumulator_value_(initial_accumulator_value) {
    // A zero accumulator would divide the first update by zero.
    if (!(initial_accumulator_value > 0))
      throw invalid_argument_error("initial_accumulator_value must be positive: " +
                                   std::to_string(initial_accumulator_value));
  }

protected:
  void create_slots(graph& g, const std::vector<node_id>& vars) override {
    for (node_id v : vars)
      make_slot(g, v, "accumulator", initial_accumulator_value_);
  }
  node_id apply_dense(graph& g, node_id grad, node_id var) override;

private:
  hyperparameter learning_rate_;
  double initial_accumulator_value_;
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE auto adagrad_optimizer::apply_dense(graph& g, node_id grad, node_id var)
    -> node_id {
  const dtype t = g.node(var).type;
  return update(
      g, "apply_adagrad",
      {var, slot(g, var, "accumulator"), hyper(g, learning_rate_, "learning_rate", t), grad});
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

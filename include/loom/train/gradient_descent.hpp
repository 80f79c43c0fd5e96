// Plain gradient descent (tf.train.GradientDescentOptimizer):
// var -= learning_rate * grad.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/train/optimizer.hpp>

#include <string>

namespace loom {

class gradient_descent_optimizer final : public optimizer {
public:
  explicit gradient_descent_optimizer(hyperparameter learning_rate,
                                      std::string name = "GradientDescent")
      : optimizer(std::move(name)), learning_rate_(std::move(learning_rate)) {}

protected:
  node_id apply_dense(graph& g, node_id grad, node_id var) override;

private:
  hyperparameter learning_rate_;
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE auto gradient_descent_optimizer::apply_dense(graph& g, node_id grad, node_id var)
    -> node_id {
  const dtype t = g.node(var).type;
  return update(g, "apply_gradient_descent",
                {var, hyper(g, learning_rate_, "learning_rate", t), grad});
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

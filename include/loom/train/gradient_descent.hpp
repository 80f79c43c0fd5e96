// Plain gradient descent (tf.train.GradientDescentOptimizer):
// var -= learning_rate * grad.
#pragma once

#include <loom/train/optimizer.hpp>

#include <string>

namespace loom {

class gradient_descent_optimizer final : public optimizer {
public:
  explicit gradient_descent_optimizer(hyperparameter learning_rate,
                                      std::string name = "GradientDescent")
      : optimizer(std::move(name)), learning_rate_(std::move(learning_rate)) {}

protected:
  node_id apply_dense(graph& g, node_id grad, node_id var) override {
    const dtype t = g.node(var).type;
    return update(g, "apply_gradient_descent",
                  {var, hyper(g, learning_rate_, "learning_rate", t), grad});
  }

private:
  hyperparameter learning_rate_;
};

} // namespace loom

// Momentum (tf.train.MomentumOptimizer), one "momentum" slot per variable
// ("<var>/Momentum"):
//   accum = accum * momentum + grad
//   var  -= lr * accum                                  (use_nesterov = false)
//   var  -= lr * grad + lr * momentum * accum           (use_nesterov = true)
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/train/optimizer.hpp>

#include <string>

namespace loom {

class momentum_optimizer final : public optimizer {
public:
  momentum_optimizer(hyperparameter learning_rate, hyperparameter momentum,
                     bool use_nesterov = false, std::string name = "Momentum")
      : optimizer(std::move(name)), learning_rate_(std::move(learning_rate)),
        momentum_(std::move(momentum)), use_nesterov_(use_nesterov) {}

protected:
  void create_slots(graph& g, const std::vector<node_id>& vars) override {
    for (node_id v : vars)
      zeros_slot(g, v, "momentum");
  }
  node_id apply_dense(graph& g, node_id grad, node_id var) override;

private:
  hyperparameter learning_rate_;
  hyperparameter momentum_;
  bool use_nesterov_;
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE auto momentum_optimizer::apply_dense(graph& g, node_id grad, node_id var)
    -> node_id {
  const dtype t = g.node(var).type;
  return update(g, "apply_momentum",
                {var, slot(g, var, "momentum"), hyper(g, learning_rate_, "learning_rate", t), grad,
                 hyper(g, momentum_, "momentum", t)},
                {{"use_nesterov", use_nesterov_}});
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

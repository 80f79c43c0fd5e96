// RMSProp (tf.train.RMSPropOptimizer, uncentered), slots "rms" (starting at
// one, "<var>/RMSProp") and "momentum" ("<var>/RMSProp_1"):
//   ms  = decay * ms + (1 - decay) * grad^2
//   mom = momentum * mom + lr * grad / sqrt(ms + epsilon)
//   var -= mom
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/train/optimizer.hpp>

#include <string>

namespace loom {

class rmsprop_optimizer final : public optimizer {
public:
  explicit rmsprop_optimizer(hyperparameter learning_rate, hyperparameter decay = 0.9,
                             hyperparameter momentum = 0.0, hyperparameter epsilon = 1e-10,
                             std::string name = "RMSProp")
      : optimizer(std::move(name)), learning_rate_(std::move(learning_rate)),
        decay_(std::move(decay)), momentum_(std::move(momentum)), epsilon_(std::move(epsilon)) {}

protected:
  void create_slots(graph& g, const std::vector<node_id>& vars) override {
    for (node_id v : vars) {
      make_slot(g, v, "rms", 1.0);
      zeros_slot(g, v, "momentum");
    }
  }
  node_id apply_dense(graph& g, node_id grad, node_id var) override;

private:
  hyperparameter learning_rate_;
  hyperparameter decay_;
  hyperparameter momentum_;
  hyperparameter epsilon_;
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE auto rmsprop_optimizer::apply_dense(graph& g, node_id grad, node_id var)
    -> node_id {
  const dtype t = g.node(var).type;
  return update(g, "apply_rms_prop",
                {var, slot(g, var, "rms"), slot(g, var, "momentum"),
                 hyper(g, learning_rate_, "learning_rate", t), hyper(g, decay_, "decay", t),
                 hyper(g, momentum_, "momentum", t), hyper(g, epsilon_, "epsilon", t), grad});
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// Adam (tf.train.AdamOptimizer), slots "m" ("<var>/Adam") and "v"
// ("<var>/Adam_1"), and per graph the non-slot variables "beta1_power" and
// "beta2_power" (beta^t, colocated with the first variable by name):
//   alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
//   m += (grad - m) * (1 - beta1);  v += (grad^2 - v) * (1 - beta2)
//   var -= alpha * m / (sqrt(v) + epsilon)
// after which both powers are multiplied by their beta.
#pragma once

#include <loom/train/optimizer.hpp>

#include <algorithm>
#include <string>
#include <utility>

namespace loom {

class adam_optimizer final : public optimizer {
public:
  explicit adam_optimizer(hyperparameter learning_rate = 0.001, hyperparameter beta1 = 0.9,
                          hyperparameter beta2 = 0.999, hyperparameter epsilon = 1e-8,
                          std::string name = "Adam")
      : optimizer(std::move(name)), learning_rate_(std::move(learning_rate)),
        beta1_(std::move(beta1)), beta2_(std::move(beta2)), epsilon_(std::move(epsilon)) {}

  // The "beta1_power" and "beta2_power" variables of g, once created.
  std::optional<std::pair<node_id, node_id>> beta_accumulators(const graph& g) const {
    auto b1 = get_non_slot_variable(g, "beta1_power");
    auto b2 = get_non_slot_variable(g, "beta2_power");
    if (!b1 || !b2)
      return std::nullopt;
    return std::pair{*b1, *b2};
  }

protected:
  void create_slots(graph& g, const std::vector<node_id>& vars) override {
    // TF keeps the powers in the dtype of the beta (float32 for a number); the
    // first variable's dtype keeps a float64 model at float64 precision.
    const node_id first = *std::min_element(vars.begin(), vars.end(), [&](node_id a, node_id b) {
      return g.node(a).name < g.node(b).name;
    });
    make_non_slot_variable(g, "beta1_power", beta1_, first);
    make_non_slot_variable(g, "beta2_power", beta2_, first);
    for (node_id v : vars) {
      zeros_slot(g, v, "m");
      zeros_slot(g, v, "v");
    }
  }

  node_id apply_dense(graph& g, node_id grad, node_id var) override {
    const dtype t = g.node(var).type;
    return g.add_node("apply_adam",
                      {var, slot(g, var, "m"), slot(g, var, "v"),
                       cast_to(g, non_slot_variable(g, "beta1_power"), t),
                       cast_to(g, non_slot_variable(g, "beta2_power"), t),
                       hyper(g, learning_rate_, "learning_rate", t), hyper(g, beta1_, "beta1", t),
                       hyper(g, beta2_, "beta2", t), hyper(g, epsilon_, "epsilon", t), grad});
  }

  std::vector<node_id> finish(graph& g, const std::vector<node_id>& update_ops) override {
    const node_id beta1_power = non_slot_variable(g, "beta1_power");
    const node_id beta2_power = non_slot_variable(g, "beta2_power");
    const dtype t = g.node(beta1_power).type;
    const node_id beta1 = hyper(g, beta1_, "beta1", t);
    const node_id beta2 = hyper(g, beta2_, "beta2", t);
    // The powers advance only after every update has read them, where they
    // live (TF's colocate_with(beta1_power)): on a cluster neither the powers
    // nor their products cross the network.
    auto after = g.control_dependencies(update_ops);
    auto advance = [&](node_id power, node_id beta) {
      const node_id product = build::mul(g, power, beta);
      colocate(g, product, power);
      const node_id update = g.add_node("assign", {power, product});
      colocate(g, update, power);
      return update;
    };
    return {advance(beta1_power, beta1), advance(beta2_power, beta2)};
  }

private:
  hyperparameter learning_rate_;
  hyperparameter beta1_;
  hyperparameter beta2_;
  hyperparameter epsilon_;
};

} // namespace loom

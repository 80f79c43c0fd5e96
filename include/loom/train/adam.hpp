// Adam (tf.train.AdamOptimizer), slots "m" ("<var>/Adam") and "v"
// ("<var>/Adam_1"), and per graph the non-slot variables "beta1_power" and
// "beta2_power" (beta^t, colocated with the first variable by name):
//   alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
//   m += (grad - m) * (1 - beta1);  v += (grad^2 - v) * (1 - beta2)
//   var -= alpha * m / (sqrt(v) + epsilon)
// after which both powers are multiplied by their beta.
//
// A sparse gradient (of an embedding lookup) updates only its rows of the
// variable, m and v: TF's LazyAdam (tf.contrib.opt.LazyAdamOptimizer). TF's
// AdamOptimizer instead decays m and v of every row at every step, touched or
// not, which costs the whole table per step; lazy(false) does that (the
// sparse gradient is applied as the dense one it stands for).
#pragma once

#include <loom/core/compiled_once.hpp>
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

  // Whether a sparse gradient updates only its rows (true, the default:
  // LazyAdam) or every row as TF's AdamOptimizer does (false).
  adam_optimizer& lazy(bool only_touched_rows) {
    lazy_ = only_touched_rows;
    return *this;
  }

  // The "beta1_power" and "beta2_power" variables of g, once created.
  std::optional<std::pair<node_id, node_id>> beta_accumulators(const graph& g) const;

protected:
  void create_slots(graph& g, const std::vector<node_id>& vars) override;

  node_id apply_dense(graph& g, node_id grad, node_id var) override;

  std::vector<node_id> finish(graph& g, const std::vector<node_id>& update_ops) override;

private:
  hyperparameter learning_rate_;
  hyperparameter beta1_;
  hyperparameter beta2_;
  hyperparameter epsilon_;
  bool lazy_ = true;
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE auto adam_optimizer::beta_accumulators(const graph& g) const
    -> std::optional<std::pair<node_id, node_id>> {
  auto b1 = get_non_slot_variable(g, "beta1_power");
  auto b2 = get_non_slot_variable(g, "beta2_power");
  if (!b1 || !b2)
    return std::nullopt;
  return std::pair{*b1, *b2};
}

LOOM_COMPILED_ONCE void adam_optimizer::create_slots(graph& g, const std::vector<node_id>& vars) {
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

LOOM_COMPILED_ONCE auto adam_optimizer::apply_dense(graph& g, node_id grad, node_id var)
    -> node_id {
  const dtype t = g.node(var).type;
  std::vector<node_id> inputs{var,
                              slot(g, var, "m"),
                              slot(g, var, "v"),
                              cast_to(g, non_slot_variable(g, "beta1_power"), t),
                              cast_to(g, non_slot_variable(g, "beta2_power"), t),
                              hyper(g, learning_rate_, "learning_rate", t),
                              hyper(g, beta1_, "beta1", t),
                              hyper(g, beta2_, "beta2", t),
                              hyper(g, epsilon_, "epsilon", t),
                              grad};
  // Not lazy: the sparse gradient's node is read as the dense gradient.
  return lazy_ ? update(g, "apply_adam", std::move(inputs))
               : g.add_node("apply_adam", std::move(inputs));
}

LOOM_COMPILED_ONCE auto adam_optimizer::finish(graph& g, const std::vector<node_id>& update_ops)
    -> std::vector<node_id> {
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
    const node_id product = detail::build::mul(g, power, beta);
    colocate(g, product, power);
    const node_id update = g.add_node("assign", {power, product});
    colocate(g, update, power);
    return update;
  };
  return {advance(beta1_power, beta1), advance(beta2_power, beta2)};
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

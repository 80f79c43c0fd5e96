// tf.train.ExponentialMovingAverage: a shadow variable per variable ("w/ExponentialMovingAverage"),
// colocated with it (so on its ps), starting at the variable's initial value, and an apply op
// that moves every shadow toward its variable: shadow -= (1 - decay) (shadow - variable),
// decay min(decay, (1 + n) / (10 + n)) with a step count n. variables_to_restore() is the
// saver's name map that reads the shadows into the variables, to evaluate with the averages.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/lower.hpp>
#include <loom/graph/variables.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace loom {

class exponential_moving_average {
public:
  // `num_updates`: an integer scalar (the global step) for TF's warm-up of the decay.
  explicit exponential_moving_average(double decay,
                                      std::optional<output<std::int64_t, 0>> num_updates = {},
                                      std::string name = "ExponentialMovingAverage")
      : decay_(decay), num_updates_(std::move(num_updates)), name_(std::move(name)) {
    if (!(decay >= 0 && decay <= 1))
      throw invalid_argument_error("loom::exponential_moving_average: decay " +
                                   std::to_string(decay) + " must be in [0, 1]");
  }

  // Creates the shadows of `vars` (float or double variables; once each) and returns the op
  // that updates them all.
  operation apply(graph& g, const std::vector<node_id>& vars);

  // The shadow of a variable apply() was given.
  node_id average(node_id var) const;

  // The name under which a variable's shadow is saved: "<variable>/<name>" (TF's average_name).
  std::string average_name(const graph& g, node_id var) const {
    return g.node(var).name + "/" + name_;
  }

  // A saver's name map (saver_options::var_names) that restores the averages into the
  // variables, to evaluate with them (TF's variables_to_restore): each variable to average
  // from its shadow's name, every other global variable from its own. The variables to
  // average are `averaged`, or as TF's default the trainable variables and the
  // moving_average_variables collection; so an evaluation graph that never called apply()
  // restores the averages its training graph saved.
  std::vector<std::pair<std::string, node_id>>
  variables_to_restore(const graph& g, std::optional<std::vector<node_id>> averaged = {}) const;

private:
  node_id make_shadow(graph& g, node_id v);

  node_id decay_node(graph& g, dtype t) const;

  double decay_;
  std::optional<output<std::int64_t, 0>> num_updates_;
  std::string name_;
  std::map<node_id, node_id> shadows_;
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE auto exponential_moving_average::apply(graph& g,
                                                          const std::vector<node_id>& vars)
    -> operation {
  std::vector<node_id> updates;
  for (node_id v : vars) {
    const node_def& var = g.node(v);
    if (var.op != "variable" || (var.type != dtype::f32 && var.type != dtype::f64))
      throw invalid_argument_error("loom::exponential_moving_average: " + var.describe() +
                                   " is not a float or double variable");
    if (shadows_.count(v))
      throw invalid_argument_error("loom::exponential_moving_average: " + var.describe() +
                                   " already has an average");
    const node_id shadow = make_shadow(g, v);
    shadows_[v] = shadow;
    // shadow -= (shadow - var) * (1 - decay), beside both (the shadow is colocated).
    const node_id rate =
        detail::build::sub(g, detail::build::scalar(g, var.type, 1.0), decay_node(g, var.type));
    const node_id step = detail::build::mul(g, detail::build::sub(g, shadow, v), rate);
    const node_id update = g.add_node("assign_sub", {shadow, step});
    g.mutable_node(update).colocation_group = g.node(shadow).colocation();
    updates.push_back(update);
  }
  return group(g, updates, name_);
}

LOOM_COMPILED_ONCE auto exponential_moving_average::average(node_id var) const -> node_id {
  auto it = shadows_.find(var);
  if (it == shadows_.end())
    throw not_found_error("loom::exponential_moving_average: no average of node " +
                          std::to_string(var) + " (give it to apply() first)");
  return it->second;
}

LOOM_COMPILED_ONCE auto
exponential_moving_average::variables_to_restore(const graph& g,
                                                 std::optional<std::vector<node_id>> averaged) const
    -> std::vector<std::pair<std::string, node_id>> {
  if (!averaged) {
    averaged = g.collection(collection::trainable_variables);
    const auto& listed = g.collection(collection::moving_average_variables);
    averaged->insert(averaged->end(), listed.begin(), listed.end());
  }
  std::map<std::string, node_id> names;
  std::set<node_id> averaged_ids;
  for (node_id v : *averaged)
    if (averaged_ids.insert(v).second)
      names[average_name(g, v)] = v;
  for (node_id v : g.collection(collection::global_variables))
    if (!averaged_ids.count(v))
      names.emplace(g.node(v).name, v); // not where a shadow's name is taken (TF's)
  return {names.begin(), names.end()};
}

LOOM_COMPILED_ONCE auto exponential_moving_average::make_shadow(graph& g, node_id v) -> node_id {
  const node_def& var = g.node(v);
  // Named after the variable, outside any name scope; on the variable's device.
  auto names = g.name_scope("");
  const node_id assign = static_cast<node_id>(var.attr<std::int64_t>("initializer"));
  if (assign < 0)
    throw invalid_argument_error("loom::exponential_moving_average: variable '" + var.name +
                                 "' has no initializer");
  // The variable's own initial value, so both start equal (one evaluation per run).
  const node_id initial = g.node(assign).inputs[1];
  node_id shadow = no_node;
  visit_dtype(var.type, [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      auto init = [&]<int R>() {
        variable<T, R> s(g, average_name(g, v), output<T, R>(g, initial),
                         variable_options{.trainable = false});
        shadow = s.id();
      };
      switch (var.shape.rank()) {
      case 0: init.template operator()<0>(); break;
      case 1: init.template operator()<1>(); break;
      case 2: init.template operator()<2>(); break;
      case 3: init.template operator()<3>(); break;
      case 4: init.template operator()<4>(); break;
      default:
        throw unimplemented_error("loom::exponential_moving_average: variable '" + var.name +
                                  "' of rank " + std::to_string(var.shape.rank()) +
                                  " (ranks 0 to 4 are supported)");
      }
    }
  });
  if (shadow == no_node) // apply() admits float and double variables only
    throw internal_error("loom::exponential_moving_average: no shadow for variable '" + var.name +
                         "' of " + std::string(to_string(var.type)));
  // Beside the variable, and its initial value too (the shadow's constructor colocated
  // the value with the shadow).
  const std::string group = g.node(v).colocation();
  g.mutable_node(shadow).colocation_group = group;
  if (g.node(initial).colocation_group == g.node(shadow).name)
    g.mutable_node(initial).colocation_group = group;
  // TF lists the averaged variable, not its shadow.
  g.add_to_collection(collection::moving_average_variables, v);
  return shadow;
}

LOOM_COMPILED_ONCE auto exponential_moving_average::decay_node(graph& g, dtype t) const -> node_id {
  const node_id decay = detail::build::scalar(g, t, decay_);
  if (!num_updates_)
    return decay;
  const node_id n = g.add_node("cast", {num_updates_->id()}, {{"dst", t}});
  const node_id warm =
      detail::build::div(g, detail::build::add(g, detail::build::scalar(g, t, 1.0), n),
                         detail::build::add(g, detail::build::scalar(g, t, 10.0), n));
  return g.add_node("minimum", {decay, warm});
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// The global step (TF's training_util): an int64 scalar variable that counts
// training steps, found through the "global_step" collection. Optimizers
// increment it after their updates; learning-rate schedules read it.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/graph/variables.hpp>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace loom {

namespace detail {

// TF's init_scope: nodes created in it (variables an optimizer or the global
// step needs, and their initializers) take no name scope and no control
// dependencies from wherever the caller happens to build them, since running
// an initializer must never also run a train op.
class lifted_scope {
public:
  explicit lifted_scope(graph& g)
      : names_(g.name_scope("")), deps_(g.control_dependencies(nullptr)) {}
  lifted_scope(const lifted_scope&) = delete;
  lifted_scope& operator=(const lifted_scope&) = delete;

private:
  scope_guard names_, deps_;
};

} // namespace detail

// The graph's global step: the one variable in the "global_step" collection,
// or else a node named "global_step"; none when neither exists.
LOOM_COMPILED_ONCE std::optional<variable<std::int64_t, 0>> get_global_step(graph& g);

// Creates the global step: "global_step", int64, initialised to zero, not
// trainable, in the global variables and the "global_step" collection.
LOOM_COMPILED_ONCE variable<std::int64_t, 0> create_global_step(graph& g);

inline variable<std::int64_t, 0> get_or_create_global_step(graph& g) {
  if (auto step = get_global_step(g))
    return *step;
  return create_global_step(g);
}

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE std::optional<variable<std::int64_t, 0>> get_global_step(graph& g) {
  const auto& in_collection = g.collection(collection::global_step);
  if (in_collection.size() > 1)
    throw invalid_argument_error("there are " + std::to_string(in_collection.size()) +
                                 " variables in the \"global_step\" collection; there must be "
                                 "at most one");
  node_id id = no_node;
  if (in_collection.size() == 1)
    id = in_collection.front();
  else if (auto found = g.try_find("global_step"))
    id = *found;
  else
    return std::nullopt;
  const node_def& n = g.node(id);
  if (n.op != "variable" || n.type != dtype::i64 || n.shape.rank() != 0)
    throw invalid_argument_error("existing \"global_step\" " + n.describe() +
                                 " must be an int64 scalar variable, but it is " +
                                 std::string(to_string(n.type)) + n.shape.to_string());
  return variable<std::int64_t, 0>::existing(g, id);
}

LOOM_COMPILED_ONCE variable<std::int64_t, 0> create_global_step(graph& g) {
  if (get_global_step(g))
    throw already_exists_error("\"global_step\" already exists in this graph");
  detail::lifted_scope lift(g);
  variable<std::int64_t, 0> step(g, "global_step", loom::shape{}, zeros_initializer{},
                                 variable_options{.trainable = false});
  g.add_to_collection(collection::global_step, step.id());
  return step;
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

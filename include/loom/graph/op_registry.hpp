// The op registry: for every op id, how to infer its output dtype and shape and
// how to differentiate it (TF's OpDef + RegisterGradient). Kernels are
// registered separately, per (op id, dtype, device type), in kernels/.
//
// Each header under graph/ops/ registers its ops before main() through an
// inline variable. In a program that links loom::kernels (LOOM_COMPILED_KERNELS)
// only that library's unit does: the registrations, their shape functions and
// gradients are then compiled once per program instead of once per unit (a
// fifth of an API unit's time). Such a program builds its graphs from main()
// on, as it runs them (the kernels register the same way).
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/graph/node.hpp>

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace loom {
class graph;
} // namespace loom

namespace loom::detail {

struct op_def {
  std::string name{};
  // Number of data inputs; -1 for any number.
  int num_inputs = -1;
  // Sets node.type and node.shape from the inputs and attrs; throws an
  // invalid_argument_error naming the node and the offending shapes.
  std::function<void(node_def& node, const std::vector<const node_def*>& inputs)> infer{};
  // Given dy (the adjoint of the node's output), returns one adjoint per data
  // input, no_node where the input gets no gradient. Empty: not differentiable.
  std::function<std::vector<node_id>(graph& g, const node_def& node, node_id dy)> gradient{};
  // Stateful ops (variables, assignments, random numbers) are never merged by CSE.
  bool stateful = false;
  // Elementwise ops may be fused into one kernel with their neighbours.
  bool elementwise = false;
  // Input i is a variable reference (bit i set): the kernel receives the
  // variable itself, not its current value, and the variable need not be
  // initialised for the op to run (that is how assign initialises it).
  std::uint32_t ref_inputs = 0;
  // Of the ref inputs, those the op only reads (a gather from a variable):
  // gradients flow through them as through data inputs.
  std::uint32_t read_refs = 0;
  // The op produces no value, only effects (no_op, group).
  bool no_output = false;
  // Which input's dtype selects the kernel (TF's "T" attr); -1: the output's.
  int type_input = 0;
  // The kernel may wait for other steps (a barrier, a gradient accumulator):
  // a cluster task never runs it on an io thread, and it wakes when its step
  // is aborted (kernel_context::cancellation).
  bool blocking = false;
};

class op_registry {
public:
  static op_registry& instance() {
    static op_registry r;
    return r;
  }

  void add(op_def def);

  const op_def& find(std::string_view name) const;

  bool contains(std::string_view name) const {
    std::lock_guard lock(mu_);
    return ops_.find(name) != ops_.end();
  }

  std::vector<std::string> names() const;

private:
  op_registry() = default;
  mutable std::mutex mu_;
  std::map<std::string, op_def, std::less<>> ops_;
};

// Registers an op at static-initialisation time: `inline const op_registration
// reg_exp{op_def{...}};` in the op's header.
struct op_registration {
  explicit op_registration(op_def def) { op_registry::instance().add(std::move(def)); }
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE void op_registry::add(op_def def) {
  std::lock_guard lock(mu_);
  auto name = def.name;
  if (!ops_.emplace(name, std::move(def)).second)
    throw already_exists_error("op '" + name + "' is registered twice");
}

LOOM_COMPILED_ONCE auto op_registry::find(std::string_view name) const -> const op_def& {
  std::lock_guard lock(mu_);
  auto it = ops_.find(name);
  if (it == ops_.end())
    throw not_found_error("no op '" + std::string(name) +
                          "' is registered in this process (is its header included, and the "
                          "program linked with loom::kernels where it uses it?)");
  return it->second;
}

LOOM_COMPILED_ONCE auto op_registry::names() const -> std::vector<std::string> {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (auto& [k, v] : ops_)
    out.push_back(k);
  return out;
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

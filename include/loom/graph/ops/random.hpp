// Op definitions of the seeded random sources: random_uniform, random_normal,
// truncated_normal. Attributes: dtype, shape (or an input that gives it), seed, seed2 and
// the distribution's parameters (a, b: min/max or mean/stddev).
#pragma once

#include <loom/graph/graph.hpp>
#include <loom/graph/op_registry.hpp>

#include <vector>

namespace loom::detail {

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_random_ops() {
  // No input: the "shape" attribute, fully defined. One input: that input's shape when
  // the step runs (TF's shape tensor; a dropout mask over a batch of any size), which
  // the input's values do not reach.
  for (const char* name : {"random_uniform", "random_normal", "truncated_normal"})
    op_registry::instance().add(
        {.name = name,
         .num_inputs = -1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               n.type = n.attr<dtype>("dtype");
               if (in.size() > 1)
                 throw invalid_argument_error("node " + n.describe() +
                                              ": takes at most one input, whose shape it draws");
               if (in.size() == 1) {
                 n.shape = in[0]->shape;
                 return;
               }
               n.shape = n.attr<loom::shape>("shape");
               if (!n.shape.fully_defined())
                 throw invalid_argument_error("node " + n.describe() + ": shape " +
                                              n.shape.to_string() + " is not fully defined");
             },
         .gradient = [](graph&, const node_def& n,
                        node_id) { return std::vector<node_id>(n.inputs.size(), no_node); },
         .stateful = true,
         .type_input = -1});
  return true;
}

inline const bool random_ops_registered = register_random_ops();
#endif

} // namespace loom::detail

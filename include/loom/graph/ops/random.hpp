// Op definitions of the seeded random sources: random_uniform, random_normal,
// truncated_normal. Attributes: dtype, shape, seed, seed2 and the
// distribution's parameters (a, b: min/max or mean/stddev).
#pragma once

#include <loom/graph/op_registry.hpp>

namespace loom::detail {

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_random_ops() {
  for (const char* name : {"random_uniform", "random_normal", "truncated_normal"})
    op_registry::instance().add({.name = name,
                                 .num_inputs = 0,
                                 .infer =
                                     [](node_def& n, const std::vector<const node_def*>&) {
                                       n.type = n.attr<dtype>("dtype");
                                       n.shape = n.attr<loom::shape>("shape");
                                       if (!n.shape.fully_defined())
                                         throw invalid_argument_error(
                                             "node " + n.describe() + ": shape " +
                                             n.shape.to_string() + " is not fully defined");
                                     },
                                 .stateful = true,
                                 .type_input = -1});
  return true;
}

inline const bool random_ops_registered = register_random_ops();
#endif

} // namespace loom::detail

// The ops that carry a tensor across tasks (TF's _Send and _Recv). The master
// inserts them when it partitions a graph: every edge from a node on task A to
// a node on task B becomes A: _send(x) and B: _recv, both keyed by
// "<x's name>-><B>", and a control edge becomes a _send of x's (empty) output.
// They have no kernels: the executor hands them to the step's rendezvous.
#pragma once

#include <loom/graph/op_registry.hpp>

namespace loom::detail {

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_transfer_ops() {
  auto& r = op_registry::instance();
  r.add({.name = "_send",
         .num_inputs = 1,
         .infer = [](node_def& n, const std::vector<const node_def*>&) { n.shape = {}; },
         .stateful = true,
         .no_output = true});
  r.add({.name = "_recv",
         .num_inputs = 0,
         .infer =
             [](node_def& n, const std::vector<const node_def*>&) {
               n.type = n.attr<dtype>("dtype");
               n.shape = n.attr<loom::shape>("shape");
             },
         .stateful = true,
         .type_input = -1});
  return true;
}

inline const bool transfer_ops_registered = register_transfer_ops();
#endif

} // namespace loom::detail

// Typed handles to graph nodes: the leaves of expressions. output<T, R> is a
// node whose value has element type T and rank R; operation is a node run
// only for its effect (an initializer, a train op). Both hold the graph by
// shared handle, so they stay valid as long as they exist.
#pragma once

#include <loom/core/dtype.hpp>
#include <loom/core/error.hpp>
#include <loom/expr/expr.hpp>
#include <loom/graph/graph.hpp>

#include <string>

namespace loom {

template <element_type T, int R> class output {
public:
  using value_type = T;
  static constexpr int rank = R;
  using device_kind = any_device;
  static constexpr bool is_leaf = true;

  output(loom::graph g, node_id id) : graph_(std::move(g)), id_(id) {
    const node_def& n = graph_.node(id_);
    if (n.type != dtype_of<T> || n.shape.rank() != R)
      throw invalid_argument_error(
          "node " + n.describe() + " is " + std::string(to_string(n.type)) + n.shape.to_string() +
          ", not " + std::string(to_string(dtype_of<T>)) + " of rank " + std::to_string(R));
  }

  loom::graph& graph() const noexcept { return graph_; }
  node_id id() const noexcept { return id_; }
  const node_def& node() const { return graph_.node(id_); }
  const std::string& name() const { return node().name; }
  // The static shape; -1 where known only at run time.
  const loom::shape& shape() const { return node().shape; }

private:
  mutable loom::graph graph_;
  node_id id_;
};

class operation {
public:
  operation(loom::graph g, node_id id) : graph_(std::move(g)), id_(id) { graph_.node(id_); }
  loom::graph& graph() const noexcept { return graph_; }
  node_id id() const noexcept { return id_; }
  const node_def& node() const { return graph_.node(id_); }
  const std::string& name() const { return node().name; }

private:
  mutable loom::graph graph_;
  node_id id_;
};

// Anything with a node in a graph: a typed output, a variable, an operation.
template <class H>
concept node_handle = requires(const H& h) {
  { h.id() } -> std::convertible_to<node_id>;
  { h.graph() } -> std::convertible_to<loom::graph&>;
};

template <node_handle H> operation as_operation(const H& h) {
  return {h.graph(), h.id()};
}

} // namespace loom

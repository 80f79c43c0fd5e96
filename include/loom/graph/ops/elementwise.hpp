// Op definitions of the elementwise ops: shape inference by broadcasting and
// gradients (TF's math_grad.py, expressed with loom's primitive ops).
#pragma once

#include <loom/expr/ops.hpp>
#include <loom/graph/builder.hpp>
#include <loom/graph/op_registry.hpp>

#include <set>

namespace loom::detail {

inline void infer_elementwise(node_def& n, const std::vector<const node_def*>& in) {
  const bool is_select = n.op == "select";
  const std::size_t first = is_select ? 1 : 0;
  if (is_select && in[0]->type != dtype::boolean)
    throw invalid_argument_error("node " + n.describe() + ": the condition " + in[0]->describe() +
                                 " is " + std::string(to_string(in[0]->type)) + ", not bool");
  for (std::size_t i = first + 1; i < in.size(); ++i)
    if (in[i]->type != in[first]->type)
      throw invalid_argument_error("node " + n.describe() + ": inputs " + in[first]->describe() +
                                   " and " + in[i]->describe() + " have different dtypes (" +
                                   std::string(to_string(in[first]->type)) + " and " +
                                   std::string(to_string(in[i]->type)) + ")");
  loom::shape s = in[0]->shape;
  for (std::size_t i = 1; i < in.size(); ++i)
    s = broadcast_shapes(s, in[i]->shape, "node " + n.describe());
  n.shape = s;
  static const std::set<std::string, std::less<>> predicates{
      "less", "less_equal", "greater", "greater_equal", "equal", "not_equal"};
  if (predicates.count(n.op))
    n.type = dtype::boolean;
  else if (n.op == "cast")
    n.type = n.attr<dtype>("dst");
  else
    n.type = in[first]->type;
}

using grad_fn = std::function<std::vector<node_id>(graph&, const node_def&, node_id)>;

template <class Op> void register_elementwise(grad_fn gradient) {
  op_def def;
  def.name = Op::id;
  def.num_inputs = Op::arity;
  def.infer = infer_elementwise;
  def.gradient = std::move(gradient);
  def.elementwise = true;
  if constexpr (requires { Op::type_input; })
    def.type_input = Op::type_input;
  op_registry::instance().add(std::move(def));
}

inline bool register_elementwise_ops() {
  using namespace build;
  auto in = [](const node_def& n, std::size_t i) { return n.inputs[i]; };
  auto dt = [](graph& g, node_id x) { return g.node(x).type; };

  register_elementwise<ops::neg>(
      [](graph& g, const node_def&, node_id dy) { return std::vector{neg(g, dy)}; });
  register_elementwise<ops::exp>(
      [](graph& g, const node_def& n, node_id dy) { return std::vector{mul(g, dy, n.id)}; });
  register_elementwise<ops::log>(
      [=](graph& g, const node_def& n, node_id dy) { return std::vector{div(g, dy, in(n, 0))}; });
  register_elementwise<ops::sqrt>([=](graph& g, const node_def& n, node_id dy) {
    return std::vector{div(g, mul(g, dy, scalar(g, dt(g, dy), 0.5)), n.id)};
  });
  register_elementwise<ops::square>([=](graph& g, const node_def& n, node_id dy) {
    return std::vector{mul(g, dy, mul(g, scalar(g, dt(g, dy), 2.0), in(n, 0)))};
  });
  register_elementwise<ops::abs>([=](graph& g, const node_def& n, node_id dy) {
    return std::vector{mul(g, dy, op(g, "sign", {in(n, 0)}))};
  });
  register_elementwise<ops::sign>([](graph&, const node_def&, node_id) { // zero a.e. (TF)
    return std::vector{no_node};
  });
  register_elementwise<ops::relu>([=](graph& g, const node_def& n, node_id dy) {
    return std::vector{op(g, "relu_grad", {dy, in(n, 0)})};
  });
  register_elementwise<ops::sigmoid>([=](graph& g, const node_def& n, node_id dy) {
    node_id one_minus_y = sub(g, scalar(g, dt(g, dy), 1.0), n.id);
    return std::vector{mul(g, dy, mul(g, n.id, one_minus_y))};
  });
  register_elementwise<ops::tanh>([=](graph& g, const node_def& n, node_id dy) {
    node_id one_minus_y2 = sub(g, scalar(g, dt(g, dy), 1.0), op(g, "square", {n.id}));
    return std::vector{mul(g, dy, one_minus_y2)};
  });
  register_elementwise<ops::reciprocal>([=](graph& g, const node_def& n, node_id dy) {
    return std::vector{neg(g, mul(g, dy, op(g, "square", {n.id})))};
  });
  register_elementwise<ops::add>([=](graph& g, const node_def& n, node_id dy) {
    return std::vector{sum_to(g, dy, in(n, 0)), sum_to(g, dy, in(n, 1))};
  });
  register_elementwise<ops::sub>([=](graph& g, const node_def& n, node_id dy) {
    return std::vector{sum_to(g, dy, in(n, 0)), sum_to(g, neg(g, dy), in(n, 1))};
  });
  register_elementwise<ops::mul>([=](graph& g, const node_def& n, node_id dy) {
    return std::vector{sum_to(g, mul(g, dy, in(n, 1)), in(n, 0)),
                       sum_to(g, mul(g, dy, in(n, 0)), in(n, 1))};
  });
  register_elementwise<ops::div>([=](graph& g, const node_def& n, node_id dy) {
    node_id a = in(n, 0), b = in(n, 1);
    node_id db = neg(g, div(g, mul(g, dy, a), op(g, "square", {b})));
    return std::vector{sum_to(g, div(g, dy, b), a), sum_to(g, db, b)};
  });
  auto choose = [=](const char* cmp) {
    return [=](graph& g, const node_def& n, node_id dy) {
      node_id a = in(n, 0), b = in(n, 1);
      node_id c = op(g, cmp, {a, b});
      node_id zero = zeros_like(g, dy);
      return std::vector{sum_to(g, select(g, c, dy, zero), a),
                         sum_to(g, select(g, c, zero, dy), b)};
    };
  };
  register_elementwise<ops::maximum>(choose("greater_equal"));
  register_elementwise<ops::minimum>(choose("less_equal"));
  register_elementwise<ops::relu_grad>({});
  register_elementwise<ops::less>({});
  register_elementwise<ops::less_equal>({});
  register_elementwise<ops::greater>({});
  register_elementwise<ops::greater_equal>({});
  register_elementwise<ops::equal>({});
  register_elementwise<ops::not_equal>({});
  // The bounds get no gradient (they are scalars in loom's typed API).
  register_elementwise<ops::clip_by_value>([=](graph& g, const node_def& n, node_id dy) {
    node_id x = in(n, 0);
    node_id zero = zeros_like(g, dy);
    node_id inside = select(g, op(g, "less", {x, in(n, 1)}), zero,
                            select(g, op(g, "greater", {x, in(n, 2)}), zero, dy));
    return std::vector{sum_to(g, inside, x), no_node, no_node};
  });
  register_elementwise<ops::select>([=](graph& g, const node_def& n, node_id dy) {
    node_id zero = zeros_like(g, dy);
    return std::vector{no_node, sum_to(g, select(g, in(n, 0), dy, zero), in(n, 1)),
                       sum_to(g, select(g, in(n, 0), zero, dy), in(n, 2))};
  });
  register_elementwise<ops::cast<float>>([=](graph& g, const node_def& n, node_id dy) {
    dtype from = g.node(in(n, 0)).type;
    if (from != dtype::f32 && from != dtype::f64)
      return std::vector{no_node};
    return std::vector{op(g, "cast", {dy}, {{"dst", from}})};
  });
  return true;
}

// Once per program where it links loom::kernels (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline const bool elementwise_ops_registered = register_elementwise_ops();
#endif

} // namespace loom::detail

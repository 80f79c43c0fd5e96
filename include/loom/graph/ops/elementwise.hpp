// Op definitions of the elementwise ops: shape inference by broadcasting and
// gradients (TF's math_grad.py, expressed with loom's primitive ops).
#pragma once

#include <loom/expr/ops.hpp>
#include <loom/graph/builder.hpp>
#include <loom/graph/op_registry.hpp>

#include <map>
#include <string>

namespace loom::detail {

template <class> inline constexpr bool is_cast = false;
template <class U> inline constexpr bool is_cast<ops::cast<U>> = true;

// Shape inference of an elementwise node: its inputs broadcast; its dtype is
// the op's result type for its inputs' (bool for a comparison), or a cast's
// destination.
template <class Op> void infer_elementwise(node_def& n, const std::vector<const node_def*>& in) {
  constexpr std::size_t first = [] {
    if constexpr (requires { Op::type_input; })
      return static_cast<std::size_t>(Op::type_input);
    else
      return std::size_t{0};
  }();
  if constexpr (first > 0) // select's condition
    if (in[0]->type != dtype::boolean)
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
  if constexpr (is_cast<Op>)
    n.type = n.attr<dtype>("dst");
  else
    n.type =
        visit_dtype(in[first]->type, [&]<class T>() { return dtype_of<ops::result_for_t<Op, T>>; });
}

using grad_fn = std::function<std::vector<node_id>(graph&, const node_def&, node_id)>;

template <class Op> void register_elementwise(grad_fn gradient) {
  op_def def;
  def.name = Op::id;
  def.num_inputs = Op::arity;
  def.infer = infer_elementwise<Op>;
  def.gradient = std::move(gradient);
  def.elementwise = true;
  if constexpr (requires { Op::type_input; })
    def.type_input = Op::type_input;
  op_registry::instance().add(std::move(def));
}

// Registers every op of ops::elementwise_ops with its gradient from `gradients`
// (an empty one where the op has none), and cast. An op of the list without
// an entry, or an entry for no op of it, is loom's own mistake: it stops the
// program at its start, naming the op.
template <class... Op>
void register_elementwise_list(type_list<Op...>, std::map<std::string, grad_fn> gradients) {
  auto take = [&](const char* id) {
    auto it = gradients.find(id);
    if (it == gradients.end())
      throw internal_error(std::string("graph/ops/elementwise.hpp: elementwise op '") + id +
                           "' has no gradient entry (write an empty one if it has no gradient)");
    grad_fn g = std::move(it->second);
    gradients.erase(it);
    return g;
  };
  (register_elementwise<Op>(take(Op::id)), ...);
  register_elementwise<ops::cast<float>>(take("cast"));
  if (!gradients.empty())
    throw internal_error("graph/ops/elementwise.hpp: a gradient for '" + gradients.begin()->first +
                         "', which is not in ops::elementwise_ops");
}

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_elementwise_ops() {
  using namespace build;
  auto in = [](const node_def& n, std::size_t i) { return n.inputs[i]; };
  auto dt = [](graph& g, node_id x) { return g.node(x).type; };
  std::map<std::string, grad_fn> gradients;

  gradients["neg"] = [](graph& g, const node_def&, node_id dy) { return std::vector{neg(g, dy)}; };
  gradients["exp"] = [](graph& g, const node_def& n, node_id dy) {
    return std::vector{mul(g, dy, n.id)};
  };
  gradients["log"] = [=](graph& g, const node_def& n, node_id dy) {
    return std::vector{div(g, dy, in(n, 0))};
  };
  gradients["sqrt"] = [=](graph& g, const node_def& n, node_id dy) {
    return std::vector{div(g, mul(g, dy, scalar(g, dt(g, dy), 0.5)), n.id)};
  };
  gradients["square"] = [=](graph& g, const node_def& n, node_id dy) {
    return std::vector{mul(g, dy, mul(g, scalar(g, dt(g, dy), 2.0), in(n, 0)))};
  };
  gradients["abs"] = [=](graph& g, const node_def& n, node_id dy) {
    return std::vector{mul(g, dy, op(g, "sign", {in(n, 0)}))};
  };
  gradients["sign"] = [](graph&, const node_def&, node_id) { // zero a.e. (TF)
    return std::vector{no_node};
  };
  gradients["relu"] = [=](graph& g, const node_def& n, node_id dy) {
    return std::vector{op(g, "relu_grad", {dy, in(n, 0)})};
  };
  gradients["sigmoid"] = [=](graph& g, const node_def& n, node_id dy) {
    node_id one_minus_y = sub(g, scalar(g, dt(g, dy), 1.0), n.id);
    return std::vector{mul(g, dy, mul(g, n.id, one_minus_y))};
  };
  gradients["tanh"] = [=](graph& g, const node_def& n, node_id dy) {
    node_id one_minus_y2 = sub(g, scalar(g, dt(g, dy), 1.0), op(g, "square", {n.id}));
    return std::vector{mul(g, dy, one_minus_y2)};
  };
  gradients["reciprocal"] = [=](graph& g, const node_def& n, node_id dy) {
    return std::vector{neg(g, mul(g, dy, op(g, "square", {n.id})))};
  };
  // TF's RsqrtGrad: dy * -y^3 / 2.
  gradients["rsqrt"] = [=](graph& g, const node_def& n, node_id dy) {
    node_id y3 = mul(g, n.id, op(g, "square", {n.id}));
    return std::vector{mul(g, dy, mul(g, scalar(g, dt(g, dy), -0.5), y3))};
  };
  // TF's EluGrad: dy * (y + 1) below zero, dy elsewhere.
  gradients["elu"] = [=](graph& g, const node_def& n, node_id dy) {
    node_id below = op(g, "less", {in(n, 0), scalar(g, dt(g, dy), 0.0)});
    node_id scaled = mul(g, dy, add(g, n.id, scalar(g, dt(g, dy), 1.0)));
    return std::vector{select(g, below, scaled, dy)};
  };
  gradients["cos"] = [=](graph& g, const node_def& n, node_id dy) {
    return std::vector{neg(g, mul(g, dy, op(g, "sin", {in(n, 0)})))};
  };
  gradients["sin"] = [=](graph& g, const node_def& n, node_id dy) {
    return std::vector{mul(g, dy, op(g, "cos", {in(n, 0)}))};
  };
  gradients["softplus"] = [=](graph& g, const node_def& n, node_id dy) {
    return std::vector{mul(g, dy, op(g, "sigmoid", {in(n, 0)}))};
  };
  gradients["add"] = [=](graph& g, const node_def& n, node_id dy) {
    return std::vector{sum_to(g, dy, in(n, 0)), sum_to(g, dy, in(n, 1))};
  };
  gradients["sub"] = [=](graph& g, const node_def& n, node_id dy) {
    return std::vector{sum_to(g, dy, in(n, 0)), sum_to(g, neg(g, dy), in(n, 1))};
  };
  gradients["mul"] = [=](graph& g, const node_def& n, node_id dy) {
    return std::vector{sum_to(g, mul(g, dy, in(n, 1)), in(n, 0)),
                       sum_to(g, mul(g, dy, in(n, 0)), in(n, 1))};
  };
  gradients["div"] = [=](graph& g, const node_def& n, node_id dy) {
    node_id a = in(n, 0), b = in(n, 1);
    node_id db = neg(g, div(g, mul(g, dy, a), op(g, "square", {b})));
    return std::vector{sum_to(g, div(g, dy, b), a), sum_to(g, db, b)};
  };
  auto choose = [=](const char* cmp) {
    return [=](graph& g, const node_def& n, node_id dy) {
      node_id a = in(n, 0), b = in(n, 1);
      node_id c = op(g, cmp, {a, b});
      node_id zero = zeros_like(g, dy);
      return std::vector{sum_to(g, select(g, c, dy, zero), a),
                         sum_to(g, select(g, c, zero, dy), b)};
    };
  };
  // TF's PowGrad: z = x^y; dx = dy y x^(y-1); dy' = dy z log(x) where x > 0, else 0.
  gradients["pow"] = [=](graph& g, const node_def& n, node_id dy) {
    node_id x = in(n, 0), y = in(n, 1);
    const dtype t = dt(g, dy);
    node_id dx = mul(g, dy, mul(g, y, op(g, "pow", {x, sub(g, y, scalar(g, t, 1.0))})));
    node_id positive = op(g, "greater", {x, scalar(g, t, 0.0)});
    node_id safe_x = select(g, positive, x, ones_like(g, x));
    node_id log_x = select(g, positive, op(g, "log", {safe_x}), zeros_like(g, x));
    node_id dexp = mul(g, dy, mul(g, n.id, log_x));
    return std::vector{sum_to(g, dx, x), sum_to(g, dexp, y)};
  };
  gradients["maximum"] = choose("greater_equal");
  gradients["minimum"] = choose("less_equal");
  gradients["relu_grad"] = {};
  gradients["less"] = {};
  gradients["less_equal"] = {};
  gradients["greater"] = {};
  gradients["greater_equal"] = {};
  gradients["equal"] = {};
  gradients["not_equal"] = {};
  // The bounds get no gradient (they are scalars in loom's typed API).
  gradients["clip_by_value"] = [=](graph& g, const node_def& n, node_id dy) {
    node_id x = in(n, 0);
    node_id zero = zeros_like(g, dy);
    node_id inside = select(g, op(g, "less", {x, in(n, 1)}), zero,
                            select(g, op(g, "greater", {x, in(n, 2)}), zero, dy));
    return std::vector{sum_to(g, inside, x), no_node, no_node};
  };
  gradients["select"] = [=](graph& g, const node_def& n, node_id dy) {
    node_id zero = zeros_like(g, dy);
    return std::vector{no_node, sum_to(g, select(g, in(n, 0), dy, zero), in(n, 1)),
                       sum_to(g, select(g, in(n, 0), zero, dy), in(n, 2))};
  };
  gradients["cast"] = [=](graph& g, const node_def& n, node_id dy) {
    dtype from = g.node(in(n, 0)).type;
    if (from != dtype::f32 && from != dtype::f64)
      return std::vector{no_node};
    return std::vector{op(g, "cast", {dy}, {{"dst", from}})};
  };
  register_elementwise_list(ops::elementwise_ops{}, std::move(gradients));
  return true;
}

inline const bool elementwise_ops_registered = register_elementwise_ops();
#endif

} // namespace loom::detail

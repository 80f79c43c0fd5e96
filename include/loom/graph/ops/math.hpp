// The non-elementwise math ops: add_n, the reductions (sum,
// mean, max, min, prod; any and all of bools), argmax/argmin and reshape. Op definitions (shape
// inference, TF's gradients) and the typed functions users call; kernels are in
// kernels/cpu/math.hpp. matmul and xw_plus_b are graph/ops/matmul.hpp's.
#pragma once

#include <loom/graph/builder.hpp>
#include <loom/graph/lower.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/ops/elementwise.hpp>
#include <loom/graph/output.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace loom {

// Selects the reductions' overloads that keep the reduced axes with size 1
// (TF's keepdims=True). A tag rather than a bool because it changes the
// result's rank, which is part of the result's type.
struct keepdims_t {
  explicit keepdims_t() = default;
};
inline constexpr keepdims_t keepdims{};

namespace detail {

inline std::string dims_to_string(const std::vector<std::int64_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i)
      s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

// The axes of a reduction as a mask over the input's dimensions (empty axes:
// all of them). Negative axes count from the end. `n` names the node in errors;
// used both by shape inference and by the kernels (a graph may come from
// elsewhere).
inline std::vector<char> reduction_mask(const node_def& n, const loom::shape& in,
                                        const std::vector<std::int64_t>& axes) {
  const int r = in.rank();
  std::vector<char> mask(static_cast<std::size_t>(r), axes.empty() ? 1 : 0);
  for (std::int64_t a : axes) {
    const std::int64_t k = a < 0 ? a + r : a;
    if (k < 0 || k >= r)
      throw invalid_argument_error("node " + n.describe() + ": axis " + std::to_string(a) +
                                   " is out of range for an input of shape " + in.to_string() +
                                   " (rank " + std::to_string(r) + "; axes " +
                                   dims_to_string(axes) + ")");
    auto& m = mask[static_cast<std::size_t>(k)];
    if (m)
      throw invalid_argument_error("node " + n.describe() + ": axis " + std::to_string(a) +
                                   " is repeated in axes " + dims_to_string(axes) +
                                   " for an input of shape " + in.to_string());
    m = 1;
  }
  return mask;
}

inline loom::shape reduced_shape(const loom::shape& in, const std::vector<char>& mask, bool keep) {
  std::vector<std::int64_t> out;
  for (int i = 0; i < in.rank(); ++i) {
    if (!mask[static_cast<std::size_t>(i)])
      out.push_back(in[i]);
    else if (keep)
      out.push_back(1);
  }
  return loom::shape(std::move(out));
}

// A single axis (argmax, argmin), normalised.
inline int normalize_axis(const node_def& n, const loom::shape& in, std::int64_t axis) {
  const int r = in.rank();
  const std::int64_t k = axis < 0 ? axis + r : axis;
  if (k < 0 || k >= r)
    throw invalid_argument_error("node " + n.describe() + ": axis " + std::to_string(axis) +
                                 " is out of range for an input of shape " + in.to_string());
  return static_cast<int>(k);
}

// The shape a reshape produces from an input of shape `in`: one dimension may
// be -1 (inferred from the element count). With a partial input the result may
// be partial; with a fully defined one it is checked and complete.
inline loom::shape reshape_target(const node_def& n, const loom::shape& in,
                                  const std::vector<std::int64_t>& dims) {
  int infer_at = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1) {
      if (infer_at >= 0)
        throw invalid_argument_error("node " + n.describe() + ": the target shape " +
                                     dims_to_string(dims) + " has more than one -1");
      infer_at = static_cast<int>(i);
    } else if (dims[i] < -1) {
      throw invalid_argument_error("node " + n.describe() + ": the target shape " +
                                   dims_to_string(dims) + " has a negative dimension");
    } else {
      known *= dims[i];
    }
  }
  auto mismatch = [&](const std::string& count) {
    return invalid_argument_error("node " + n.describe() + ": cannot reshape a tensor of shape " +
                                  in.to_string() + " (" + count + ") into shape " +
                                  dims_to_string(dims));
  };
  std::vector<std::int64_t> out = dims;
  if (in.fully_defined()) {
    const std::int64_t count = in.num_elements();
    const std::string what = std::to_string(count) + " elements";
    if (infer_at < 0) {
      if (known != count)
        throw mismatch(what);
    } else {
      if (known == 0 || count % known != 0)
        throw mismatch(what);
      out[static_cast<std::size_t>(infer_at)] = count / known;
    }
  } else if (infer_at < 0) {
    // The known part of the input must still divide the target's count.
    std::int64_t in_known = 1;
    for (auto d : in.dims())
      if (d >= 0)
        in_known *= d;
    if (in_known > 0 && known % in_known != 0)
      throw mismatch("a multiple of " + std::to_string(in_known) + " elements");
  }
  return loom::shape(std::move(out));
}

inline void check_same_type(const node_def& n, const node_def& a, const node_def& b) {
  if (a.type != b.type)
    throw invalid_argument_error("node " + n.describe() + ": inputs " + a.describe() + " and " +
                                 b.describe() + " have different dtypes (" +
                                 std::string(to_string(a.type)) + " and " +
                                 std::string(to_string(b.type)) + ")");
}

inline void check_rank(const node_def& n, const node_def& in, int rank, const char* role) {
  if (in.shape.rank() != rank)
    throw invalid_argument_error("node " + n.describe() + ": " + role + " " + in.describe() +
                                 " must have rank " + std::to_string(rank) + ", got shape " +
                                 in.shape.to_string());
}

inline void check_floating(const node_def& n, dtype t) {
  if (t != dtype::f32 && t != dtype::f64)
    throw invalid_argument_error("node " + n.describe() + " needs float32 or float64, not " +
                                 std::string(to_string(t)));
}

// reduce_any and reduce_all reduce bools, the others numbers.
inline bool logical_reduction(const std::string& op) {
  return op == "reduce_any" || op == "reduce_all";
}

inline void infer_reduction(node_def& n, const std::vector<const node_def*>& in) {
  const node_def& x = *in[0];
  if (logical_reduction(n.op) ? x.type != dtype::boolean
                              : x.type == dtype::boolean || x.type == dtype::string)
    throw invalid_argument_error("node " + n.describe() + ": cannot reduce " + x.describe() +
                                 " of dtype " + std::string(to_string(x.type)) +
                                 (logical_reduction(n.op) ? " (" + n.op + " reduces bools)" : ""));
  const auto mask = reduction_mask(n, x.shape, n.attr_or<std::vector<std::int64_t>>("axes", {}));
  n.type = x.type;
  n.shape = reduced_shape(x.shape, mask, n.attr_or<bool>("keepdims", false));
}

inline void infer_arg_reduction(node_def& n, const std::vector<const node_def*>& in) {
  const node_def& x = *in[0];
  if (x.type == dtype::boolean || x.type == dtype::string)
    throw invalid_argument_error("node " + n.describe() + ": cannot take the " + n.op + " of " +
                                 x.describe() + " of dtype " + std::string(to_string(x.type)));
  const int axis = normalize_axis(n, x.shape, n.attr<std::int64_t>("axis"));
  std::vector<char> mask(static_cast<std::size_t>(x.shape.rank()), 0);
  mask[static_cast<std::size_t>(axis)] = 1;
  n.type = dtype::i64;
  n.shape = reduced_shape(x.shape, mask, false);
}

inline node_id reduce_node(graph& g, const std::string& op, node_id x,
                           std::vector<std::int64_t> axes, bool keep) {
  return g.add_node(op, {x}, {{"axes", std::move(axes)}, {"keepdims", keep}});
}

// dy of a reduction broadcast back to x's shape (divided by the count for a mean).
inline node_id reduce_grad_node(graph& g, node_id dy, node_id x, const node_def& reduction,
                                const std::string& mode) {
  return g.add_node("reduce_grad", {dy, x},
                    {{"axes", reduction.attr_or<std::vector<std::int64_t>>("axes", {})},
                     {"keepdims", reduction.attr_or<bool>("keepdims", false)},
                     {"mode", mode}});
}

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_math_ops() {
  auto& r = op_registry::instance();

  // TF's AddN: the sum of tensors of one dtype and shape (no broadcasting), in
  // one node however many there are; each input's adjoint is dy itself, where
  // a chain of adds would reduce dy to each operand's shape (a sum_to_shape per
  // operand wherever the batch dimension is unknown).
  r.add({.name = "add_n",
         .num_inputs = -1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               if (in.empty())
                 throw invalid_argument_error("node " + n.describe() + ": add_n needs an input");
               const node_def& first = *in[0];
               std::vector<std::int64_t> d = first.shape.dims();
               for (std::size_t i = 1; i < in.size(); ++i) {
                 const node_def& x = *in[i];
                 bool fits = x.type == first.type && x.shape.rank() == first.shape.rank();
                 for (int a = 0; fits && a < x.shape.rank(); ++a) {
                   auto& da = d[static_cast<std::size_t>(a)];
                   if (da < 0)
                     da = x.shape[a];
                   else if (x.shape[a] >= 0 && x.shape[a] != da)
                     fits = false;
                 }
                 if (!fits)
                   throw invalid_argument_error(
                       "node " + n.describe() + ": input " + std::to_string(i) + ", " +
                       x.describe() + " (" + std::string(to_string(x.type)) + ", shape " +
                       x.shape.to_string() + "), cannot be added to input 0, " + first.describe() +
                       " (" + std::string(to_string(first.type)) + ", shape " +
                       first.shape.to_string() + "): add_n sums tensors of one dtype and shape");
               }
               n.type = first.type;
               n.shape = loom::shape(std::move(d));
             },
         .gradient = [](graph&, const node_def& n,
                        node_id dy) { return std::vector<node_id>(n.inputs.size(), dy); }});

  r.add({.name = "reduce_sum",
         .num_inputs = 1,
         .infer = infer_reduction,
         .gradient = [](graph& g, const node_def& n, node_id dy) {
           return std::vector{reduce_grad_node(g, dy, n.inputs[0], n, "sum")};
         }});
  r.add({.name = "reduce_mean",
         .num_inputs = 1,
         .infer = infer_reduction,
         .gradient = [](graph& g, const node_def& n, node_id dy) {
           return std::vector{reduce_grad_node(g, dy, n.inputs[0], n, "mean")};
         }});
  // TF's _MaxGrad (and _MinGrad): dy goes to the elements equal to the maximum
  // (minimum), split equally among ties.
  for (const char* extremum : {"reduce_max", "reduce_min"})
    r.add({.name = extremum,
           .num_inputs = 1,
           .infer = infer_reduction,
           .gradient = [](graph& g, const node_def& n, node_id dy) {
             const node_id x = n.inputs[0];
             const node_id y = reduce_grad_node(g, n.id, x, n, "sum");
             const node_id hits =
                 build::op(g, "cast", {build::op(g, "equal", {y, x})}, {{"dst", n.type}});
             const node_id ties =
                 reduce_grad_node(g,
                                  reduce_node(g, "reduce_sum", hits,
                                              n.attr_or<std::vector<std::int64_t>>("axes", {}),
                                              n.attr_or<bool>("keepdims", false)),
                                  x, n, "sum");
             return std::vector{
                 build::mul(g, build::div(g, hits, ties), reduce_grad_node(g, dy, x, n, "sum"))};
           }});
  // TF's _ProdGrad: each element's dy times the product of the other elements of its
  // reduction, computed as the product of the exclusive products before and after it
  // (TF's two exclusive cumprods), so zeros need no division. One kernel,
  // reduce_prod_grad; floats only, as TF's.
  r.add({.name = "reduce_prod",
         .num_inputs = 1,
         .infer = infer_reduction,
         .gradient = [](graph& g, const node_def& n, node_id dy) {
           return std::vector{
               g.add_node("reduce_prod_grad", {dy, n.inputs[0]},
                          {{"axes", n.attr_or<std::vector<std::int64_t>>("axes", {})},
                           {"keepdims", n.attr_or<bool>("keepdims", false)}})};
         }});
  // Inputs (dy, x); attrs as the reduction's: dx of reduce_prod (not differentiable again).
  r.add({.name = "reduce_prod_grad",
         .num_inputs = 2,
         .infer = [](node_def& n, const std::vector<const node_def*>& in) {
           check_same_type(n, *in[0], *in[1]);
           check_floating(n, in[0]->type);
           reduction_mask(n, in[1]->shape, n.attr_or<std::vector<std::int64_t>>("axes", {}));
           n.type = in[0]->type;
           n.shape = in[1]->shape;
         }});
  // TF's Any and All: over bools, not differentiable.
  for (const char* logical : {"reduce_any", "reduce_all"})
    r.add({.name = logical,
           .num_inputs = 1,
           .infer = infer_reduction,
           .gradient = [](graph&, const node_def&, node_id) { return std::vector{no_node}; }});
  // Inputs (dy, x): dy broadcast to x's shape; attrs as the reduction's plus
  // "mode" ("sum" or "mean").
  r.add({.name = "reduce_grad",
         .num_inputs = 2,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               check_same_type(n, *in[0], *in[1]);
               check_floating(n, in[0]->type);
               reduction_mask(n, in[1]->shape, n.attr_or<std::vector<std::int64_t>>("axes", {}));
               n.type = in[0]->type;
               n.shape = in[1]->shape;
             },
         // Linear in dy: its adjoint is the reduction itself.
         .gradient =
             [](graph& g, const node_def& n, node_id ddx) {
               const bool mean = n.attr<std::string>("mode") == "mean";
               return std::vector{reduce_node(g, mean ? "reduce_mean" : "reduce_sum", ddx,
                                              n.attr_or<std::vector<std::int64_t>>("axes", {}),
                                              n.attr_or<bool>("keepdims", false)),
                                  no_node};
             }});

  for (const char* name : {"argmax", "argmin"})
    r.add({.name = name, .num_inputs = 1, .infer = infer_arg_reduction});

  r.add({.name = "reshape",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               n.type = in[0]->type;
               n.shape = reshape_target(n, in[0]->shape, n.attr<std::vector<std::int64_t>>("dims"));
             },
         .gradient =
             [](graph& g, const node_def& n, node_id dy) {
               const node_id x = n.inputs[0];
               const loom::shape& s = g.node(x).shape;
               // A static shape needs no run-time input, so x need not stay alive.
               if (s.fully_defined())
                 return std::vector{g.add_node("reshape", {dy}, {{"dims", s.dims()}})};
               return std::vector{g.add_node("reshape_like", {dy, x})};
             }});
  // Inputs (x, like): x reshaped to like's run-time shape.
  r.add({.name = "reshape_like",
         .num_inputs = 2,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               n.type = in[0]->type;
               n.shape = in[1]->shape;
             },
         .gradient =
             [](graph& g, const node_def& n, node_id dy) {
               return std::vector{g.add_node("reshape_like", {dy, n.inputs[0]}), no_node};
             }});
  return true;
}

inline const bool math_ops_registered = register_math_ops();
#endif

// The graph all operands of a typed op live in; `fn` names the op in the error.
template <class First, class... Rest>
graph common_graph(const char* fn, const First& first, const Rest&... rest) {
  graph g = first.graph();
  if (!((rest.graph() == g) && ...))
    throw invalid_argument_error(std::string("loom::") + fn +
                                 ": the operands belong to different graphs");
  return g;
}

template <class I> std::vector<std::int64_t> to_axes(const I* axes, std::size_t n) {
  return std::vector<std::int64_t>(axes, axes + n);
}

template <class T> inline constexpr bool dependent_false = false;

template <class T>
concept bool_type = std::is_same_v<T, bool>;

} // namespace detail

// -- add_n -----------------------------------------------------------------------

// The sum of tensors of one dtype and shape, in one node (tf.math.add_n): no
// broadcasting, and each input's gradient is the sum's.
template <class T, int R> output<T, R> add_n(const std::vector<output<T, R>>& inputs) {
  static_assert(numeric_type<T>, "loom::add_n: needs numeric tensors (not bool or string)");
  if (inputs.empty())
    throw invalid_argument_error("loom::add_n: no tensors to add");
  graph g = inputs.front().graph();
  std::vector<node_id> ids;
  ids.reserve(inputs.size());
  for (const auto& x : inputs) {
    if (!(x.graph() == g))
      throw invalid_argument_error("loom::add_n: the tensors belong to different graphs");
    ids.push_back(x.id());
  }
  if (ids.size() == 1)
    return inputs.front(); // TF returns a lone input as it is
  return {g, g.add_node("add_n", std::move(ids))};
}

// -- reductions --------------------------------------------------------------------
// reduce_sum(x)                   all axes, rank 0
// reduce_sum(x, keepdims)         all axes, rank R (every dimension 1)
// reduce_sum(x, axis)             rank R-1
// reduce_sum(x, axis, keepdims)   rank R
// reduce_sum(x, {0, 2})           rank R-N (also a std::array<I, N>)
// reduce_sum(x, {0, 2}, keepdims) rank R
// Negative axes count from the end.

#define LOOM_REDUCTION(NAME, OK, WHAT)                                                             \
  template <expression E> output<value_type_of<E>, 0> NAME(const E& x) {                           \
    static_assert(OK<value_type_of<E>>, "loom::" #NAME ": needs " WHAT);                           \
    auto lx = lower(x);                                                                            \
    return {lx.graph(), detail::reduce_node(lx.graph(), #NAME, lx.id(), {}, false)};               \
  }                                                                                                \
  template <expression E> output<value_type_of<E>, rank_of<E>> NAME(const E& x, keepdims_t) {      \
    static_assert(OK<value_type_of<E>>, "loom::" #NAME ": needs " WHAT);                           \
    auto lx = lower(x);                                                                            \
    return {lx.graph(), detail::reduce_node(lx.graph(), #NAME, lx.id(), {}, true)};                \
  }                                                                                                \
  template <expression E, std::integral I, std::size_t N>                                          \
  requires(!std::is_same_v<I, bool>) output < value_type_of<E>,                                    \
      (N <= rank_of<E> ? rank_of<E> - static_cast<int>(N) : 0)                                     \
  > NAME(const E& x, const std::array<I, N>& axes) {                                               \
    static_assert(OK<value_type_of<E>>, "loom::" #NAME ": needs " WHAT);                           \
    static_assert(N <= rank_of<E>, "loom::" #NAME ": more axes than the tensor has dimensions");   \
    auto lx = lower(x);                                                                            \
    if constexpr (N == 0)                                                                          \
      return lx; /* TF: an empty axis list reduces nothing */                                      \
    else                                                                                           \
      return {lx.graph(), detail::reduce_node(lx.graph(), #NAME, lx.id(),                          \
                                              detail::to_axes(axes.data(), N), false)};            \
  }                                                                                                \
  template <expression E, std::integral I, std::size_t N>                                          \
  requires(!std::is_same_v<I, bool>) output<value_type_of<E>, rank_of<E>> NAME(                    \
      const E& x, const std::array<I, N>& axes, keepdims_t) {                                      \
    static_assert(OK<value_type_of<E>>, "loom::" #NAME ": needs " WHAT);                           \
    static_assert(N <= rank_of<E>, "loom::" #NAME ": more axes than the tensor has dimensions");   \
    auto lx = lower(x);                                                                            \
    if constexpr (N == 0)                                                                          \
      return lx;                                                                                   \
    else                                                                                           \
      return {lx.graph(), detail::reduce_node(lx.graph(), #NAME, lx.id(),                          \
                                              detail::to_axes(axes.data(), N), true)};             \
  }                                                                                                \
  template <expression E, std::size_t N> auto NAME(const E& x, const int(&axes)[N]) {              \
    return NAME(x, std::to_array(axes));                                                           \
  }                                                                                                \
  template <expression E, std::size_t N>                                                           \
  auto NAME(const E& x, const int(&axes)[N], keepdims_t k) {                                       \
    return NAME(x, std::to_array(axes), k);                                                        \
  }                                                                                                \
  template <expression E, std::integral I>                                                         \
  requires(!std::is_same_v<I, bool>) output < value_type_of<E>,                                    \
      (rank_of<E> >= 1 ? rank_of<E> - 1 : 0)                                                       \
  > NAME(const E& x, I axis) {                                                                     \
    static_assert(rank_of<E> >= 1, "loom::" #NAME ": a scalar has no axis to reduce");             \
    return NAME(x, std::array<I, 1>{axis});                                                        \
  }                                                                                                \
  template <expression E, std::integral I>                                                         \
  requires(!std::is_same_v<I, bool>) output<value_type_of<E>, rank_of<E>> NAME(const E& x, I axis, \
                                                                               keepdims_t k) {     \
    static_assert(rank_of<E> >= 1, "loom::" #NAME ": a scalar has no axis to reduce");             \
    return NAME(x, std::array<I, 1>{axis}, k);                                                     \
  }                                                                                                \
  template <expression E, class A> void NAME(const E&, const A&, bool) {                           \
    static_assert(detail::dependent_false<A>,                                                      \
                  "loom::" #NAME ": keepdims is the tag loom::keepdims, not a bool (it changes "   \
                  "the result's rank, which is part of its type)");                                \
  }

LOOM_REDUCTION(reduce_sum, numeric_type, "a numeric tensor (not bool or string)")
LOOM_REDUCTION(reduce_mean, numeric_type, "a numeric tensor (not bool or string)")
LOOM_REDUCTION(reduce_max, numeric_type, "a numeric tensor (not bool or string)")
LOOM_REDUCTION(reduce_min, numeric_type, "a numeric tensor (not bool or string)")
LOOM_REDUCTION(reduce_prod, numeric_type, "a numeric tensor (not bool or string)")
LOOM_REDUCTION(reduce_any, detail::bool_type, "a bool tensor")
LOOM_REDUCTION(reduce_all, detail::bool_type, "a bool tensor")
#undef LOOM_REDUCTION

// The index of the largest (smallest) element along `axis` (tf.argmax); int64,
// rank R-1. Ties give the first index. Not differentiable.
template <expression E, std::integral I>
requires(!std::is_same_v<I, bool>)
    output<std::int64_t, (rank_of<E> >= 1 ? rank_of<E> - 1 : 0)> argmax(const E& x, I axis) {
  static_assert(rank_of<E> >= 1, "loom::argmax: a scalar has no axis");
  static_assert(numeric_type<value_type_of<E>>, "loom::argmax: needs a numeric tensor");
  auto lx = lower(x);
  return {lx.graph(),
          lx.graph().add_node("argmax", {lx.id()}, {{"axis", static_cast<std::int64_t>(axis)}})};
}
template <expression E, std::integral I>
requires(!std::is_same_v<I, bool>)
    output<std::int64_t, (rank_of<E> >= 1 ? rank_of<E> - 1 : 0)> argmin(const E& x, I axis) {
  static_assert(rank_of<E> >= 1, "loom::argmin: a scalar has no axis");
  static_assert(numeric_type<value_type_of<E>>, "loom::argmin: needs a numeric tensor");
  auto lx = lower(x);
  return {lx.graph(),
          lx.graph().add_node("argmin", {lx.id()}, {{"axis", static_cast<std::int64_t>(axis)}})};
}

// -- reshape -----------------------------------------------------------------------
// reshape(x, {-1, 784}) or reshape<2>(x, {-1, 784}): the result's rank is the
// number of dimensions; one of them may be -1 (inferred from the element
// count). The result shares x's buffer.
template <std::size_t N, expression E, std::integral I = std::int64_t>
requires(!std::is_same_v<I, bool>) output < value_type_of<E>,
static_cast<int>(N) > reshape(const E& x, const std::array<I, N>& dims) {
  auto lx = lower(x);
  return {lx.graph(),
          lx.graph().add_node("reshape", {lx.id()}, {{"dims", detail::to_axes(dims.data(), N)}})};
}
template <std::size_t N, expression E>
output<value_type_of<E>, static_cast<int>(N)> reshape(const E& x, const std::int64_t (&dims)[N]) {
  return reshape<N>(x, std::to_array(dims));
}

} // namespace loom

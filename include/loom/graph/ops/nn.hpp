// Neural-network ops over the last axis: softmax, log_softmax and the softmax
// cross-entropies (TF's tf.nn.*), with their dedicated gradient ops. Kernels
// are in kernels/cpu/nn.hpp.
#pragma once

#include <loom/graph/lower.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/ops/math.hpp>
#include <loom/graph/output.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace loom {

namespace detail {

inline void check_min_rank(const node_def& n, const node_def& in, int rank, const char* role) {
  if (in.shape.rank() < rank)
    throw invalid_argument_error("node " + n.describe() + ": " + role + " " + in.describe() +
                                 " must have rank " + std::to_string(rank) +
                                 " or more, got shape " + in.shape.to_string());
}

// The shape both a and b may have (unknown dimensions filled from the other).
inline loom::shape merge_shapes(const node_def& n, const node_def& a, const node_def& b) {
  if (!a.shape.compatible_with(b.shape))
    throw invalid_argument_error("node " + n.describe() + ": " + a.describe() + " of shape " +
                                 a.shape.to_string() + " and " + b.describe() + " of shape " +
                                 b.shape.to_string() + " must have the same shape");
  std::vector<std::int64_t> d = a.shape.dims();
  for (int i = 0; i < a.shape.rank(); ++i)
    if (d[static_cast<std::size_t>(i)] < 0)
      d[static_cast<std::size_t>(i)] = b.shape[i];
  return loom::shape(std::move(d));
}

inline loom::shape without_last(const loom::shape& s) {
  std::vector<std::int64_t> d = s.dims();
  d.pop_back();
  return loom::shape(std::move(d));
}

// Labels of a sparse cross-entropy have the logits' shape without its last
// dimension.
inline void check_sparse_labels(const node_def& n, const node_def& labels, const node_def& logits) {
  if (labels.type != dtype::i32 && labels.type != dtype::i64)
    throw invalid_argument_error("node " + n.describe() + ": the labels " + labels.describe() +
                                 " must be int32 or int64, not " +
                                 std::string(to_string(labels.type)));
  if (!labels.shape.compatible_with(without_last(logits.shape)))
    throw invalid_argument_error("node " + n.describe() + ": labels of shape " +
                                 labels.shape.to_string() + " do not match logits of shape " +
                                 logits.shape.to_string() +
                                 " (the labels need the logits' shape without its last dimension)");
}

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_nn_ops() {
  auto& r = op_registry::instance();
  auto infer_softmax = [](node_def& n, const std::vector<const node_def*>& in) {
    check_min_rank(n, *in[0], 1, "the logits");
    check_floating(n, in[0]->type);
    n.type = in[0]->type;
    n.shape = in[0]->shape;
  };
  // Inputs (y, dy): y the forward op's output.
  auto infer_softmax_grad = [](node_def& n, const std::vector<const node_def*>& in) {
    check_same_type(n, *in[0], *in[1]);
    n.type = in[0]->type;
    n.shape = merge_shapes(n, *in[0], *in[1]);
  };
  r.add({.name = "softmax",
         .num_inputs = 1,
         .infer = infer_softmax,
         .gradient = [](graph& g, const node_def& n, node_id dy) {
           return std::vector{g.add_node("softmax_grad", {n.id, dy})};
         }});
  r.add({.name = "log_softmax",
         .num_inputs = 1,
         .infer = infer_softmax,
         .gradient = [](graph& g, const node_def& n, node_id dy) {
           return std::vector{g.add_node("log_softmax_grad", {n.id, dy})};
         }});
  r.add({.name = "softmax_grad", .num_inputs = 2, .infer = infer_softmax_grad});
  r.add({.name = "log_softmax_grad", .num_inputs = 2, .infer = infer_softmax_grad});

  // Inputs (labels, logits) -> per-row loss.
  r.add({.name = "softmax_cross_entropy_with_logits",
         .num_inputs = 2,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               check_min_rank(n, *in[1], 1, "the logits");
               check_same_type(n, *in[0], *in[1]);
               check_floating(n, in[1]->type);
               n.type = in[1]->type;
               n.shape = without_last(merge_shapes(n, *in[0], *in[1]));
             },
         // Both adjoints, as TF computes them: logits get dy (softmax - labels),
         // labels get -dy log_softmax(logits).
         .gradient =
             [](graph& g, const node_def& n, node_id dy) {
               const node_id labels = n.inputs[0], logits = n.inputs[1];
               return std::vector{
                   g.add_node("xent_grad", {dy, labels, logits}, {{"wrt", std::string("labels")}}),
                   g.add_node("xent_grad", {dy, labels, logits}, {{"wrt", std::string("logits")}})};
             }});
  // Inputs (dy, labels, logits); attr "wrt": "logits" or "labels".
  r.add({.name = "xent_grad",
         .num_inputs = 3,
         .infer = [](node_def& n, const std::vector<const node_def*>& in) {
           check_same_type(n, *in[0], *in[2]);
           n.type = in[2]->type;
           n.shape = merge_shapes(n, *in[1], *in[2]);
         }});

  // Inputs (labels, logits): labels int32/int64 class indices.
  r.add({.name = "sparse_softmax_cross_entropy_with_logits",
         .num_inputs = 2,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               check_min_rank(n, *in[1], 1, "the logits");
               check_floating(n, in[1]->type);
               check_sparse_labels(n, *in[0], *in[1]);
               n.type = in[1]->type;
               n.shape = without_last(in[1]->shape);
             },
         // Integer labels get no gradient.
         .gradient =
             [](graph& g, const node_def& n, node_id dy) {
               return std::vector{no_node,
                                  g.add_node("sparse_xent_grad", {dy, n.inputs[0], n.inputs[1]})};
             },
         .type_input = 1});
  // Inputs (dy, labels, logits).
  r.add({.name = "sparse_xent_grad",
         .num_inputs = 3,
         .infer = [](node_def& n, const std::vector<const node_def*>& in) {
           check_same_type(n, *in[0], *in[2]);
           check_sparse_labels(n, *in[1], *in[2]);
           n.type = in[2]->type;
           n.shape = in[2]->shape;
         }});
  return true;
}

inline const bool nn_ops_registered = register_nn_ops();
#endif

} // namespace detail

// softmax over the last axis (tf.nn.softmax), computed stably.
template <expression E> output<value_type_of<E>, rank_of<E>> softmax(const E& logits) {
  static_assert(rank_of<E> >= 1, "loom::softmax: the logits must have rank 1 or more");
  static_assert(floating_type<value_type_of<E>>, "loom::softmax: needs float or double logits");
  auto l = lower(logits);
  return {l.graph(), l.graph().add_node("softmax", {l.id()})};
}

// log(softmax(x)) over the last axis (tf.nn.log_softmax), computed stably.
template <expression E> output<value_type_of<E>, rank_of<E>> log_softmax(const E& logits) {
  static_assert(rank_of<E> >= 1, "loom::log_softmax: the logits must have rank 1 or more");
  static_assert(floating_type<value_type_of<E>>, "loom::log_softmax: needs float or double logits");
  auto l = lower(logits);
  return {l.graph(), l.graph().add_node("log_softmax", {l.id()})};
}

// The cross-entropy between `labels` (a probability distribution over the
// last axis) and softmax(logits), one value per row (TF's
// softmax_cross_entropy_with_logits). Differentiable in both.
template <expression L, expression Z>
output<value_type_of<Z>, (rank_of<Z> >= 1 ? rank_of<Z> - 1 : 0)>
softmax_cross_entropy_with_logits(const L& labels, const Z& logits) {
  static_assert(rank_of<Z> >= 1,
                "loom::softmax_cross_entropy_with_logits: the logits must have rank 1 or more");
  static_assert(rank_of<L> == rank_of<Z>, "loom::softmax_cross_entropy_with_logits: the labels "
                                          "and the logits must have the same rank");
  static_assert(std::is_same_v<value_type_of<L>, value_type_of<Z>>,
                "loom::softmax_cross_entropy_with_logits: the labels and the logits must have "
                "the same dtype");
  static_assert(floating_type<value_type_of<Z>>,
                "loom::softmax_cross_entropy_with_logits: needs float or double");
  auto la = lower(labels);
  auto lz = lower(logits);
  graph g = detail::common_graph("softmax_cross_entropy_with_logits", la, lz);
  return {g, g.add_node("softmax_cross_entropy_with_logits", {la.id(), lz.id()})};
}

// The same with labels given as class indices, int32 or int64 with the
// logits' shape less its last axis (tf.nn.sparse_softmax_cross_entropy_with_logits).
// A label outside [0, classes) is an error at run time.
template <expression L, expression Z>
output<value_type_of<Z>, (rank_of<Z> >= 1 ? rank_of<Z> - 1 : 0)>
sparse_softmax_cross_entropy_with_logits(const L& labels, const Z& logits) {
  static_assert(rank_of<Z> >= 1, "loom::sparse_softmax_cross_entropy_with_logits: the logits "
                                 "must have rank 1 or more");
  static_assert(rank_of<L> + 1 == rank_of<Z>,
                "loom::sparse_softmax_cross_entropy_with_logits: the labels must have one "
                "dimension fewer than the logits");
  static_assert(std::is_same_v<value_type_of<L>, std::int32_t> ||
                    std::is_same_v<value_type_of<L>, std::int64_t>,
                "loom::sparse_softmax_cross_entropy_with_logits: the labels must be int32 or "
                "int64 class indices");
  static_assert(floating_type<value_type_of<Z>>,
                "loom::sparse_softmax_cross_entropy_with_logits: needs float or double logits");
  auto la = lower(labels);
  auto lz = lower(logits);
  graph g = detail::common_graph("sparse_softmax_cross_entropy_with_logits", la, lz);
  return {g, g.add_node("sparse_softmax_cross_entropy_with_logits", {la.id(), lz.id()})};
}

// The logistic loss of `logits` against `labels` (probabilities in [0, 1]),
// elementwise (tf.nn.sigmoid_cross_entropy_with_logits), in TF's stable form
// max(x, 0) - x z + log(1 + exp(-|x|)), with TF's choices at x = 0 (so its
// gradient there is sigmoid(0) - z). An expression: it fuses with what is
// around it into one kernel.
template <expression L, expression Z>
auto sigmoid_cross_entropy_with_logits(const L& labels, const Z& logits) {
  using T = value_type_of<Z>;
  static_assert(floating_type<T>,
                "loom::sigmoid_cross_entropy_with_logits: needs float or double logits");
  static_assert(std::is_same_v<value_type_of<L>, T>,
                "loom::sigmoid_cross_entropy_with_logits: the labels and the logits must have "
                "the same dtype");
  const auto nonnegative = greater_equal(logits, T(0));
  const auto relu_logits = where(nonnegative, logits, logits * T(0));
  const auto neg_abs_logits = where(nonnegative, -logits, logits);
  return relu_logits - logits * labels + log(T(1) + exp(neg_abs_logits));
}

// x where x > 0, else alpha x (tf.nn.leaky_relu): an expression, fused with its neighbours;
// its gradient is dy or alpha dy by the same choice.
template <expression E> auto leaky_relu(const E& x, double alpha = 0.2) {
  using T = value_type_of<E>;
  static_assert(floating_type<T>, "loom::leaky_relu: needs float or double");
  return where(greater(x, T(0)), x, x * static_cast<T>(alpha));
}

// sum(x^2) / 2 (tf.nn.l2_loss): a weight decay term.
template <expression E> output<value_type_of<E>, 0> l2_loss(const E& x) {
  using T = value_type_of<E>;
  static_assert(floating_type<T>, "loom::l2_loss: needs float or double");
  return lower(reduce_sum(square(x)) * T(0.5));
}

namespace detail {
// x with each element kept with probability 1 - rate and scaled by 1 / (1 - rate), else
// 0: the mask a seeded uniform draw of x's shape when the step runs (TF's dropout).
template <expression E>
output<value_type_of<E>, rank_of<E>> dropped_out(const E& x, double rate,
                                                 std::optional<std::int64_t> seed) {
  using T = value_type_of<E>;
  static_assert(floating_type<T>, "loom::dropout: needs float or double");
  if (!(rate >= 0 && rate < 1))
    throw invalid_argument_error("loom::dropout: rate " + std::to_string(rate) +
                                 " is outside [0, 1) (the fraction of elements dropped)");
  auto lx = lower(x);
  if (rate == 0)
    return lx;
  graph g = lx.graph();
  const auto [s1, s2] = g.next_seeds(seed);
  output<T, rank_of<E>> u(
      g, g.add_node("random_uniform", {lx.id()},
                    {{"dtype", dtype_of<T>}, {"seed", s1}, {"seed2", s2}, {"a", 0.0}, {"b", 1.0}}));
  return lower(lx * cast<T>(greater_equal(u, static_cast<T>(rate))) *
               static_cast<T>(1 / (1 - rate)));
}
} // namespace detail

// dropout(x, rate) while training (tf.layers.dropout / tf.nn.dropout with rate): each
// element zeroed with probability `rate` (in [0, 1)), the rest scaled by 1 / (1 - rate);
// x itself when not training. `seed`: the op seed (with the graph's seed, TF's rule).
template <expression E>
output<value_type_of<E>, rank_of<E>> dropout(const E& x, double rate,
                                             std::optional<std::int64_t> seed = std::nullopt,
                                             bool training = true) {
  if (!training) {
    if (!(rate >= 0 && rate < 1))
      throw invalid_argument_error("loom::dropout: rate " + std::to_string(rate) +
                                   " is outside [0, 1) (the fraction of elements dropped)");
    return lower(x);
  }
  return detail::dropped_out(x, rate, seed);
}
// The same with `training` a bool scalar of the graph (a placeholder fed true while
// training): the choice is made when the step runs.
template <expression E, expression B>
output<value_type_of<E>, rank_of<E>> dropout(const E& x, double rate,
                                             std::optional<std::int64_t> seed, const B& training) {
  static_assert(std::is_same_v<value_type_of<B>, bool> && rank_of<B> == 0,
                "loom::dropout: `training` is a bool or a bool scalar of the graph");
  auto lx = lower(x);
  return lower(where(training, detail::dropped_out(lx, rate, seed), lx));
}

} // namespace loom

// Op definitions of fused batch normalization (TF's FusedBatchNorm, NHWC: the channels last),
// as four single-output ops whose every pass over the activations is one kernel:
//   batch_norm_moments(x) -> [3, C]: per channel the mean, the (biased) variance it normalizes
//     by, and the Bessel-corrected variance TF reports for the moving averages;
//   fused_batch_norm(x, scale, offset, mean, variance) -> y, one pass;
//   and the gradients: fused_batch_norm_grad_sums (sum(dy * x_hat) and sum(dy) per channel,
//   one pass) and batch_norm_moments_grad (one pass).
// y's gradient with respect to mean and variance is per channel, so a training graph (mean
// and variance from batch_norm_moments of the same x) and an inference graph (the moving
// averages) are the same ops and autodiff gives each its exact gradient: TF's training-mode
// formula falls out of the moments' own gradient. Kernels in kernels/cpu/batch_norm.hpp and
// kernels/cuda/batch_norm.cuh.
#pragma once

#include <loom/graph/builder.hpp>
#include <loom/graph/lower.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/ops/math.hpp>
#include <loom/graph/ops/strided.hpp>
#include <loom/graph/output.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace loom::detail {

// x [..., C] (rank 1 or more, C known when the graph is built, float or double): its channels.
inline std::int64_t batch_norm_channels(const node_def& n, const node_def& x) {
  check_floating(n, x.type);
  if (x.shape.rank() < 1 || x.shape[x.shape.rank() - 1] < 0)
    throw invalid_argument_error("node " + n.describe() + ": the input " + x.describe() +
                                 " must have rank 1 or more and its last dimension (the "
                                 "channels) known when the graph is built");
  return x.shape[x.shape.rank() - 1];
}

// A per-channel input (scale, offset, mean, variance) must be [C] of x's dtype.
inline void check_per_channel(const node_def& n, const node_def& x, std::int64_t channels,
                              const node_def& v, const char* what) {
  if (v.type != x.type || !v.shape.compatible_with(loom::shape{channels}))
    throw invalid_argument_error("node " + n.describe() + ": the " + what + " " + v.describe() +
                                 " must be a vector of " + std::to_string(channels) + " " +
                                 std::string(to_string(x.type)) + " (one per channel of " +
                                 x.describe() + ")");
}

// moments [K, C] of x's dtype (K = 3 for the moments, 2 for the gradient sums).
inline void check_channel_rows(const node_def& n, const node_def& x, std::int64_t channels,
                               const node_def& m, std::int64_t rows, const char* what) {
  if (m.type != x.type || !m.shape.compatible_with(loom::shape{rows, channels}))
    throw invalid_argument_error("node " + n.describe() + ": the " + what + " " + m.describe() +
                                 " must be [" + std::to_string(rows) + ", " +
                                 std::to_string(channels) + "] of " +
                                 std::string(to_string(x.type)));
}

// Row `row` of a [K, C] node, [C].
inline node_id channel_row(graph& g, node_id rows, std::int64_t row) {
  return g.add_node("strided_slice", {rows},
                    {{"begin", std::vector<std::int64_t>{row, 0}},
                     {"end", std::vector<std::int64_t>{row + 1, 0}},
                     {"strides", std::vector<std::int64_t>{1, 1}},
                     {"begin_mask", std::int64_t{0}},
                     {"end_mask", std::int64_t{2}},
                     {"ellipsis_mask", std::int64_t{0}},
                     {"new_axis_mask", std::int64_t{0}},
                     {"shrink_axis_mask", std::int64_t{1}}});
}

#ifndef LOOM_COMPILED_KERNELS
inline bool register_batch_norm_ops() {
  auto& r = op_registry::instance();
  // Input x [..., C]: [3, C] of the mean over every axis but the last, the variance
  // mean((x - mean)^2), and that variance times n / (n - 1) (n the elements per channel;
  // times 1 where n <= 1), TF's reported batch variance.
  r.add({.name = "batch_norm_moments",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               n.type = in[0]->type;
               n.shape = loom::shape{3, batch_norm_channels(n, *in[0])};
             },
         .gradient =
             [](graph& g, const node_def& n, node_id dm) {
               return std::vector{g.add_node("batch_norm_moments_grad", {dm, n.inputs[0], n.id})};
             }});
  // Inputs (dm [3, C], x, moments [3, C]): dx = dm0 / n + (dm1 + dm2 n / (n - 1)) 2 (x - mean) / n.
  // Linear in dm; not differentiated again (its second derivatives are not built).
  r.add({.name = "batch_norm_moments_grad",
         .num_inputs = 3,
         .infer = [](node_def& n, const std::vector<const node_def*>& in) {
           const std::int64_t c = batch_norm_channels(n, *in[1]);
           check_channel_rows(n, *in[1], c, *in[0], 3, "gradient of the moments");
           check_channel_rows(n, *in[1], c, *in[2], 3, "moments");
           n.type = in[1]->type;
           n.shape = in[1]->shape;
         }});
  // Inputs (x [..., C], scale, offset, mean, variance [C]), attr "epsilon":
  // y = (x - mean) rsqrt(variance + epsilon) scale + offset.
  r.add({.name = "fused_batch_norm",
         .num_inputs = 5,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               const std::int64_t c = batch_norm_channels(n, *in[0]);
               const char* what[] = {"scale", "offset", "mean", "variance"};
               for (int i = 1; i < 5; ++i)
                 check_per_channel(n, *in[0], c, *in[static_cast<std::size_t>(i)], what[i - 1]);
               if (!(n.attr<double>("epsilon") > 0))
                 throw invalid_argument_error("node " + n.describe() + ": epsilon " +
                                              std::to_string(n.attr<double>("epsilon")) +
                                              " must be positive");
               n.type = in[0]->type;
               n.shape = in[0]->shape;
             },
         .gradient =
             [](graph& g, const node_def& n, node_id dy) {
               using namespace build;
               const node_id x = n.inputs[0], scale = n.inputs[1], mean = n.inputs[3],
                             variance = n.inputs[4];
               const double epsilon = n.attr<double>("epsilon");
               // r = rsqrt(variance + epsilon); k = scale r, per channel.
               const node_id r = op(g, "rsqrt", {add(g, variance, scalar(g, n.type, epsilon))});
               const node_id k = mul(g, scale, r);
               const node_id sums = g.add_node("fused_batch_norm_grad_sums",
                                               {dy, x, mean, variance}, {{"epsilon", epsilon}});
               const node_id dy_xhat = channel_row(g, sums, 0), dy_sum = channel_row(g, sums, 1);
               return std::vector{mul(g, dy, k),             // x
                                  dy_xhat,                   // scale: sum(dy x_hat)
                                  dy_sum,                    // offset: sum(dy)
                                  neg(g, mul(g, dy_sum, k)), // mean: -sum(dy) scale r
                                  // variance: -sum(dy x_hat) scale r^2 / 2
                                  mul(g, mul(g, dy_xhat, mul(g, k, r)), scalar(g, n.type, -0.5))};
             }});
  // Inputs (dy, x [..., C], mean, variance [C]), attr "epsilon": [2, C] of sum(dy x_hat) and
  // sum(dy) over every axis but the last, x_hat = (x - mean) rsqrt(variance + epsilon).
  // Not differentiated again.
  r.add({.name = "fused_batch_norm_grad_sums",
         .num_inputs = 4,
         .infer = [](node_def& n, const std::vector<const node_def*>& in) {
           const std::int64_t c = batch_norm_channels(n, *in[1]);
           if (in[0]->type != in[1]->type || !in[0]->shape.compatible_with(in[1]->shape))
             throw invalid_argument_error("node " + n.describe() + ": dy " + in[0]->describe() +
                                          " does not match x " + in[1]->describe());
           check_per_channel(n, *in[1], c, *in[2], "mean");
           check_per_channel(n, *in[1], c, *in[3], "variance");
           n.type = in[1]->type;
           n.shape = loom::shape{2, c};
         }});
  return true;
}

inline const bool batch_norm_ops_registered = register_batch_norm_ops();
#endif

} // namespace loom::detail

namespace loom {

// What tf.nn.fused_batch_norm returns: y, and the mean and variance it reports (in training
// the batch's, the variance Bessel-corrected as TF's; in inference the ones given).
template <class T, int R> struct fused_batch_norm_result {
  output<T, R> y;
  output<T, 1> mean;
  output<T, 1> variance;
};

namespace detail {
template <expression X, expression S, expression O, expression M, expression V>
output<value_type_of<X>, rank_of<X>> fused_batch_norm_node(const X& x, const S& scale,
                                                           const O& offset, const M& mean,
                                                           const V& variance, double epsilon) {
  auto lx = lower(x);
  graph g = lx.graph();
  return {g, g.add_node("fused_batch_norm",
                        {lx.id(), lower(scale).id(), lower(offset).id(), lower(mean).id(),
                         lower(variance).id()},
                        {{"epsilon", epsilon}})};
}

template <expression X, expression S, expression O> void check_fused_batch_norm_types() {
  using T = value_type_of<X>;
  static_assert(rank_of<X> >= 1, "loom::fused_batch_norm: x needs rank 1 or more (NHWC: its last "
                                 "dimension the channels)");
  static_assert(floating_type<T>, "loom::fused_batch_norm: needs float or double");
  static_assert(rank_of<S> == 1 && rank_of<O> == 1 && std::is_same_v<value_type_of<S>, T> &&
                    std::is_same_v<value_type_of<O>, T>,
                "loom::fused_batch_norm: scale and offset are vectors (one per channel) of x's "
                "dtype");
}
} // namespace detail

// Training form (tf.nn.fused_batch_norm with is_training=True): x [..., C] normalized by its
// own batch's per-channel mean and variance over every axis but the last, then scaled and
// offset. Returns y, the batch's mean, and its variance times n / (n - 1) (for the moving
// averages, as TF). The gradient is TF's training-mode one: it goes through the statistics.
template <expression X, expression S, expression O>
fused_batch_norm_result<value_type_of<X>, rank_of<X>>
fused_batch_norm(const X& x, const S& scale, const O& offset, double epsilon = 1e-3) {
  detail::check_fused_batch_norm_types<X, S, O>();
  auto lx = lower(x);
  graph g = lx.graph();
  const node_id moments = g.add_node("batch_norm_moments", {lx.id()});
  output<value_type_of<X>, 1> mean(g, detail::channel_row(g, moments, 0));
  output<value_type_of<X>, 1> variance(g, detail::channel_row(g, moments, 1));
  output<value_type_of<X>, 1> reported(g, detail::channel_row(g, moments, 2));
  return {detail::fused_batch_norm_node(lx, scale, offset, mean, variance, epsilon), mean,
          reported};
}

// Inference form (is_training=False): x normalized by the given per-channel mean and
// variance (the moving averages). Returns y and the mean and variance given.
template <expression X, expression S, expression O, expression M, expression V>
fused_batch_norm_result<value_type_of<X>, rank_of<X>>
fused_batch_norm(const X& x, const S& scale, const O& offset, const M& mean, const V& variance,
                 double epsilon = 1e-3) {
  detail::check_fused_batch_norm_types<X, S, O>();
  static_assert(rank_of<M> == 1 && rank_of<V> == 1 &&
                    std::is_same_v<value_type_of<M>, value_type_of<X>> &&
                    std::is_same_v<value_type_of<V>, value_type_of<X>>,
                "loom::fused_batch_norm: mean and variance are vectors (one per channel) of x's "
                "dtype");
  auto lm = lower(mean);
  auto lv = lower(variance);
  return {detail::fused_batch_norm_node(x, scale, offset, lm, lv, epsilon), lm, lv};
}

} // namespace loom

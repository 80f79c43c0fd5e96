// Op definitions of the depthwise convolution (TF's DepthwiseConv2dNative, NHWC) and its two
// backprops, depthwise_conv2d_native_backprop_input and _filter: each input channel convolved
// with its own channel_multiplier filters, over conv2d's window geometry (graph/ops/conv.hpp:
// TF's SAME/VALID arithmetic, strides, dilations). Kernels in kernels/cpu/depthwise_conv.hpp and
// kernels/cuda/depthwise_conv.cuh.
#pragma once

#include <loom/graph/builder.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/ops/conv.hpp>
#include <loom/graph/output.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace loom::detail {

// The geometry of a depthwise convolution of x [n, h, w, c] with filter [kh, kw, c, m]: a
// window of kh x kw per output, out_c = c * m (output channel k * m + q is input channel k
// through filter q). Mismatches are one error naming the node and both shapes.
inline conv_window depthwise_window_of(const node_def& n, const window_attrs& a,
                                       const loom::shape& x, const loom::shape& f) {
  if (f.rank() != 4)
    throw invalid_argument_error("node " + n.describe() + ": filter of shape " + f.to_string() +
                                 " must have rank 4 (height, width, in channels, channel "
                                 "multiplier)");
  if (f[2] >= 0 && x.rank() == 4 && x[3] >= 0 && f[2] != x[3])
    throw invalid_argument_error("node " + n.describe() + ": the input of shape " + x.to_string() +
                                 " has " + std::to_string(x[3]) +
                                 " channels, but the depthwise filter of shape " + f.to_string() +
                                 " expects " + std::to_string(f[2]));
  if (f[0] < 0 || f[1] < 0)
    throw invalid_argument_error("node " + n.describe() + ": the filter's height and width " +
                                 f.to_string() + " must be known when the graph is built");
  window_attrs with_window = a;
  with_window.window_h = f[0];
  with_window.window_w = f[1];
  conv_window w = window_of(n, with_window, x, nullptr);
  const std::int64_t c = w.in_c >= 0 ? w.in_c : f[2];
  w.in_c = c;
  w.out_c = c >= 0 && f[3] >= 0 ? c * f[3] : -1;
  return w;
}

// The channel multiplier of a depthwise window: out_c / in_c.
inline std::int64_t multiplier_of(const conv_window& w) {
  return w.in_c > 0 ? w.out_c / w.in_c : 0;
}

#ifndef LOOM_COMPILED_KERNELS
inline bool register_depthwise_conv_ops() {
  auto& r = op_registry::instance();
  // Inputs (x [n, h, w, c], filter [kh, kw, c, m]); attrs strides, padding, dilations:
  // out[b, y, x, k * m + q] = sum over the window of x[b, ., ., k] * filter[., ., k, q].
  r.add(
      {.name = "depthwise_conv2d",
       .num_inputs = 2,
       .infer =
           [](node_def& n, const std::vector<const node_def*>& in) {
             check_float(n, *in[0]);
             if (in[1]->type != in[0]->type)
               throw invalid_argument_error("node " + n.describe() + ": the filter " +
                                            in[1]->describe() + " and the input " +
                                            in[0]->describe() + " have different dtypes");
             n.type = in[0]->type;
             n.shape =
                 depthwise_window_of(n, window_attrs(n), in[0]->shape, in[1]->shape).output_shape();
           },
       .gradient =
           [](graph& g, const node_def& n, node_id dy) {
             const node_id x = n.inputs[0], f = n.inputs[1];
             const attr_map a = window_attr_map(n);
             return std::vector{with_shape_of(g, "depthwise_conv2d_native_backprop_input", {f, dy},
                                              a, x, "input_shape"),
                                with_shape_of(g, "depthwise_conv2d_native_backprop_filter", {x, dy},
                                              a, f, "filter_shape")};
           }});
  // Inputs (filter, dy) and "input_shape", or (filter, dy, x): TF's
  // DepthwiseConv2dNativeBackpropInput.
  r.add({.name = "depthwise_conv2d_native_backprop_input",
         .num_inputs = -1,
         .infer = [](node_def& n, const std::vector<const node_def*>& in) {
           n.type = in[0]->type;
           n.shape = shape_operand(n, in, 2, "input_shape");
           const loom::shape want =
               depthwise_window_of(n, window_attrs(n), n.shape, in[0]->shape).output_shape();
           if (!in[1]->shape.compatible_with(want))
             throw invalid_argument_error("node " + n.describe() + ": dy of shape " +
                                          in[1]->shape.to_string() +
                                          " is not depthwise_conv2d's output " + want.to_string());
         }});
  // Inputs (x, dy) and "filter_shape", or (x, dy, filter): TF's
  // DepthwiseConv2dNativeBackpropFilter.
  r.add({.name = "depthwise_conv2d_native_backprop_filter",
         .num_inputs = -1,
         .infer = [](node_def& n, const std::vector<const node_def*>& in) {
           n.type = in[0]->type;
           n.shape = shape_operand(n, in, 2, "filter_shape");
           const loom::shape want =
               depthwise_window_of(n, window_attrs(n), in[0]->shape, n.shape).output_shape();
           if (!in[1]->shape.compatible_with(want))
             throw invalid_argument_error("node " + n.describe() + ": dy of shape " +
                                          in[1]->shape.to_string() +
                                          " is not depthwise_conv2d's output " + want.to_string());
         }});
  return true;
}

inline const bool depthwise_conv_ops_registered = register_depthwise_conv_ops();
#endif

} // namespace loom::detail

namespace loom {

// A depthwise 2-D convolution of x [batch, height, width, in] with filter [kh, kw, in,
// multiplier] (tf.nn.depthwise_conv2d, NHWC): each input channel convolved with its own
// `multiplier` filters, [batch, out_h, out_w, in * multiplier]. Options as conv2d's.
template <expression X, expression F>
output<value_type_of<X>, 4> depthwise_conv2d(const X& x, const F& filter,
                                             const conv2d_options& o = {}) {
  static_assert(rank_of<X> == 4, "loom::depthwise_conv2d: the input must have rank 4 (NHWC: "
                                 "batch, height, width, channels)");
  static_assert(rank_of<F> == 4, "loom::depthwise_conv2d: the filter must have rank 4 (height, "
                                 "width, in channels, channel multiplier)");
  static_assert(std::is_same_v<value_type_of<X>, value_type_of<F>> &&
                    floating_type<value_type_of<X>>,
                "loom::depthwise_conv2d: the input and the filter must be float or double, of "
                "one dtype");
  auto lx = lower(x);
  auto lf = lower(filter);
  graph g = detail::common_graph("depthwise_conv2d", lx, lf);
  return {g, g.add_node("depthwise_conv2d", {lx.id(), lf.id()},
                        {{"strides", detail::nhwc(o.strides)},
                         {"dilations", detail::nhwc(o.dilations)},
                         {"padding", o.padding}})};
}

} // namespace loom

// Op definitions of the convolutions and poolings (TF's nn_ops, NHWC): conv2d and its two
// backprops, max_pool and avg_pool and their gradients, with TF's SAME/VALID arithmetic,
// strides and dilations; bias_add is x + b. Kernels: kernels/cpu/conv.hpp and
// kernels/cuda/conv.cuh, both over one window geometry (conv_window below).
#pragma once

#include <loom/graph/builder.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/ops/math.hpp>
#include <loom/graph/output.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::detail {

// TF's padding: "VALID" (windows inside the input) or "SAME" (as many outputs as
// ceil(input / stride), the input padded evenly, the extra row or column at the end).
enum class conv_padding { valid, same };

// The window attributes of a conv2d or a pooling node: strides and dilations as TF
// writes them ([1, h, w, 1]), padding; a pooling's window size ("ksize").
struct window_attrs {
  std::int64_t stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  std::int64_t window_h = 0, window_w = 0; // poolings only
  conv_padding padding = conv_padding::valid;

  explicit window_attrs(const node_def& n) {
    auto pair = [&](const char* name, std::int64_t& h, std::int64_t& w, bool needed) {
      if (!needed && !n.has_attr(name))
        return;
      const auto v = n.attr<std::vector<std::int64_t>>(name);
      if (v.size() != 4 || v[0] != 1 || v[3] != 1 || v[1] < 1 || v[2] < 1)
        throw invalid_argument_error("node " + n.describe() + ": " + name + " " +
                                     dims_to_string(v) +
                                     " must be [1, h, w, 1] with h, w >= 1 (NHWC)");
      h = v[1];
      w = v[2];
    };
    pair("strides", stride_h, stride_w, true);
    pair("dilations", dilation_h, dilation_w, false);
    if (n.op.find("pool") != std::string::npos)
      pair("ksize", window_h, window_w, true);
    const std::string p = n.attr<std::string>("padding");
    if (p != "SAME" && p != "VALID")
      throw invalid_argument_error("node " + n.describe() + ": padding \"" + p +
                                   "\"; expected \"SAME\" or \"VALID\"");
    padding = p == "SAME" ? conv_padding::same : conv_padding::valid;
  }
};

// One spatial dimension of a window op: the output's size and the padding before it.
struct window_extent {
  std::int64_t out = -1, pad_before = 0;
};

inline window_extent window_along(std::int64_t in, std::int64_t window, std::int64_t stride,
                                  std::int64_t dilation, conv_padding padding) {
  if (in < 0)
    return {};
  const std::int64_t effective = (window - 1) * dilation + 1;
  if (padding == conv_padding::valid)
    return {in >= effective ? (in - effective) / stride + 1 : 0, 0};
  const std::int64_t out = (in + stride - 1) / stride;
  const std::int64_t total = std::max<std::int64_t>((out - 1) * stride + effective - in, 0);
  return {out, total / 2};
}

// The whole geometry of a conv2d or a pooling on an input [n, h, w, c]: the kernels'
// one description of which input element each window reads.
struct conv_window {
  std::int64_t batch, in_h, in_w, in_c;
  std::int64_t window_h, window_w, out_c; // out_c: the filter's outputs (a pooling: in_c)
  std::int64_t out_h, out_w, stride_h, stride_w, dilation_h, dilation_w, pad_top, pad_left;

  loom::shape output_shape() const { return loom::shape{batch, out_h, out_w, out_c}; }
  // The rows of a window's patch: window_h * window_w * in_c.
  std::int64_t patch_size() const { return window_h * window_w * in_c; }
};

// The geometry of node n on input x; `filter` [h, w, in_c, out_c] for a convolution,
// nullptr for a pooling (whose window is its ksize). Unknown dimensions (-1) stay unknown
// in the output; every mismatch is one error naming the node and both shapes.
inline conv_window window_of(const node_def& n, const window_attrs& a, const loom::shape& x,
                             const loom::shape* filter) {
  if (x.rank() != 4)
    throw invalid_argument_error("node " + n.describe() + ": input of shape " + x.to_string() +
                                 " must have rank 4 (NHWC: batch, height, width, channels)");
  conv_window w{};
  w.batch = x[0];
  w.in_h = x[1];
  w.in_w = x[2];
  w.in_c = x[3];
  w.stride_h = a.stride_h;
  w.stride_w = a.stride_w;
  w.dilation_h = a.dilation_h;
  w.dilation_w = a.dilation_w;
  if (filter) {
    const loom::shape& f = *filter;
    if (f.rank() != 4)
      throw invalid_argument_error("node " + n.describe() + ": filter of shape " + f.to_string() +
                                   " must have rank 4 (height, width, in channels, out channels)");
    if (f[2] >= 0 && x[3] >= 0 && f[2] != x[3])
      throw invalid_argument_error("node " + n.describe() + ": the input of shape " +
                                   x.to_string() + " has " + std::to_string(x[3]) +
                                   " channels, but the filter of shape " + f.to_string() +
                                   " expects " + std::to_string(f[2]));
    if (f[0] < 0 || f[1] < 0)
      throw invalid_argument_error("node " + n.describe() + ": the filter's height and width " +
                                   f.to_string() + " must be known when the graph is built");
    w.window_h = f[0];
    w.window_w = f[1];
    w.out_c = f[3];
  } else {
    w.window_h = a.window_h;
    w.window_w = a.window_w;
    w.out_c = x[3];
  }
  const window_extent h = window_along(w.in_h, w.window_h, w.stride_h, w.dilation_h, a.padding);
  const window_extent v = window_along(w.in_w, w.window_w, w.stride_w, w.dilation_w, a.padding);
  w.out_h = h.out;
  w.out_w = v.out;
  w.pad_top = h.pad_before;
  w.pad_left = v.pad_before;
  if ((w.in_h >= 0 && w.out_h == 0) || (w.in_w >= 0 && w.out_w == 0))
    throw invalid_argument_error("node " + n.describe() + ": a window of " +
                                 std::to_string(w.window_h) + "x" + std::to_string(w.window_w) +
                                 " (dilated " + std::to_string(w.dilation_h) + "x" +
                                 std::to_string(w.dilation_w) +
                                 ") does not fit the input of "
                                 "shape " +
                                 x.to_string() + " with VALID padding");
  return w;
}

// The shape a backprop produces: its "input_shape"/"filter_shape" attribute, or the shape of
// the input at `index` that stands for it (known only when the step runs).
inline loom::shape shape_operand(const node_def& n, const std::vector<const node_def*>& in,
                                 std::size_t index, const char* attr) {
  if (in.size() > index)
    return in[index]->shape;
  return loom::shape(n.attr<std::vector<std::int64_t>>(attr));
}

// The attributes a window op's gradient keeps: strides, dilations, padding, ksize.
inline attr_map window_attr_map(const node_def& n) {
  attr_map a;
  for (const char* name : {"strides", "dilations", "padding", "ksize"})
    if (n.has_attr(name))
      a[name] = n.attrs.at(name);
  return a;
}

// A gradient node that needs the shape of `of`: as an attribute where the graph knows it,
// else `of` itself as the last input.
inline node_id with_shape_of(graph& g, const std::string& op, std::vector<node_id> inputs,
                             attr_map attrs, node_id of, const char* attr) {
  const loom::shape& s = g.node(of).shape;
  if (s.fully_defined())
    attrs[attr] = s.dims();
  else
    inputs.push_back(of);
  return g.add_node(op, std::move(inputs), std::move(attrs));
}

inline void check_float(const node_def& n, const node_def& x) {
  if (x.type != dtype::f32 && x.type != dtype::f64)
    throw invalid_argument_error("node " + n.describe() + ": " + x.describe() + " is " +
                                 std::string(to_string(x.type)) + "; needs float or double");
}

#ifndef LOOM_COMPILED_KERNELS
inline bool register_conv_ops() {
  auto& r = op_registry::instance();

  // Inputs (x [n, h, w, c], filter [kh, kw, c, o]); attrs strides, padding, dilations:
  // TF's Conv2D.
  r.add({.name = "conv2d",
         .num_inputs = 2,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               check_float(n, *in[0]);
               if (in[1]->type != in[0]->type)
                 throw invalid_argument_error("node " + n.describe() + ": the filter " +
                                              in[1]->describe() + " and the input " +
                                              in[0]->describe() + " have different dtypes");
               n.type = in[0]->type;
               n.shape = window_of(n, window_attrs(n), in[0]->shape, &in[1]->shape).output_shape();
             },
         .gradient =
             [](graph& g, const node_def& n, node_id dy) {
               const node_id x = n.inputs[0], f = n.inputs[1];
               const attr_map a = window_attr_map(n);
               return std::vector{
                   with_shape_of(g, "conv2d_backprop_input", {f, dy}, a, x, "input_shape"),
                   with_shape_of(g, "conv2d_backprop_filter", {x, dy}, a, f, "filter_shape")};
             }});
  // Inputs (filter, dy) and "input_shape", or (filter, dy, x): TF's Conv2DBackpropInput.
  r.add({.name = "conv2d_backprop_input",
         .num_inputs = -1,
         .infer = [](node_def& n, const std::vector<const node_def*>& in) {
           n.type = in[0]->type;
           n.shape = shape_operand(n, in, 2, "input_shape");
           const loom::shape want =
               window_of(n, window_attrs(n), n.shape, &in[0]->shape).output_shape();
           if (!in[1]->shape.compatible_with(want))
             throw invalid_argument_error("node " + n.describe() + ": dy of shape " +
                                          in[1]->shape.to_string() + " is not conv2d's output " +
                                          want.to_string());
         }});
  // Inputs (x, dy) and "filter_shape", or (x, dy, filter): TF's Conv2DBackpropFilter.
  r.add({.name = "conv2d_backprop_filter",
         .num_inputs = -1,
         .infer = [](node_def& n, const std::vector<const node_def*>& in) {
           n.type = in[0]->type;
           n.shape = shape_operand(n, in, 2, "filter_shape");
           const loom::shape want =
               window_of(n, window_attrs(n), in[0]->shape, &n.shape).output_shape();
           if (!in[1]->shape.compatible_with(want))
             throw invalid_argument_error("node " + n.describe() + ": dy of shape " +
                                          in[1]->shape.to_string() + " is not conv2d's output " +
                                          want.to_string());
         }});

  // Input x [n, h, w, c]; attrs ksize, strides, padding: TF's MaxPool and AvgPool. An
  // average over a SAME window near an edge counts only the input's elements, as TF's.
  r.add({.name = "max_pool",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               n.type = in[0]->type;
               n.shape = window_of(n, window_attrs(n), in[0]->shape, nullptr).output_shape();
             },
         .gradient =
             [](graph& g, const node_def& n, node_id dy) {
               return std::vector{
                   g.add_node("max_pool_grad", {n.inputs[0], n.id, dy}, window_attr_map(n))};
             }});
  r.add({.name = "avg_pool",
         .num_inputs = 1,
         .infer =
             [](node_def& n, const std::vector<const node_def*>& in) {
               check_float(n, *in[0]);
               n.type = in[0]->type;
               n.shape = window_of(n, window_attrs(n), in[0]->shape, nullptr).output_shape();
             },
         .gradient =
             [](graph& g, const node_def& n, node_id dy) {
               return std::vector{with_shape_of(g, "avg_pool_grad", {dy}, window_attr_map(n),
                                                n.inputs[0], "input_shape")};
             }});
  // Inputs (x, y, dy): dy of each window to the window's first largest element (TF's
  // MaxPoolGrad on the CPU).
  r.add({.name = "max_pool_grad",
         .num_inputs = 3,
         .infer = [](node_def& n, const std::vector<const node_def*>& in) {
           n.type = in[0]->type;
           n.shape = in[0]->shape;
         }});
  // Inputs (dy) and "input_shape", or (dy, x): dy of each window spread evenly over it.
  r.add({.name = "avg_pool_grad",
         .num_inputs = -1,
         .infer = [](node_def& n, const std::vector<const node_def*>& in) {
           n.type = in[0]->type;
           n.shape = shape_operand(n, in, 1, "input_shape");
         }});
  return true;
}

inline const bool conv_ops_registered = register_conv_ops();
#endif

} // namespace loom::detail

namespace loom {

// The window options of conv2d and the poolings, TF's: strides and dilations along height
// and width, padding "SAME" or "VALID".
struct conv2d_options {
  std::array<std::int64_t, 2> strides{1, 1};
  std::string padding = "SAME";
  std::array<std::int64_t, 2> dilations{1, 1};
};
struct pool_options {
  std::array<std::int64_t, 2> strides{2, 2};
  std::string padding = "VALID";
};

namespace detail {
inline std::vector<std::int64_t> nhwc(const std::array<std::int64_t, 2>& hw) {
  return {1, hw[0], hw[1], 1};
}
} // namespace detail

// A 2-D convolution of x [batch, height, width, in] with filter [kh, kw, in, out] (tf.nn.conv2d,
// NHWC): [batch, out_h, out_w, out].
template <expression X, expression F>
output<value_type_of<X>, 4> conv2d(const X& x, const F& filter, const conv2d_options& o = {}) {
  static_assert(rank_of<X> == 4, "loom::conv2d: the input must have rank 4 (NHWC: batch, "
                                 "height, width, channels)");
  static_assert(rank_of<F> == 4, "loom::conv2d: the filter must have rank 4 (height, width, "
                                 "in channels, out channels)");
  static_assert(std::is_same_v<value_type_of<X>, value_type_of<F>> &&
                    floating_type<value_type_of<X>>,
                "loom::conv2d: the input and the filter must be float or double, of one dtype");
  auto lx = lower(x);
  auto lf = lower(filter);
  graph g = detail::common_graph("conv2d", lx, lf);
  return {g, g.add_node("conv2d", {lx.id(), lf.id()},
                        {{"strides", detail::nhwc(o.strides)},
                         {"dilations", detail::nhwc(o.dilations)},
                         {"padding", o.padding}})};
}

// The largest (max_pool) or mean (avg_pool) element of each window of size ksize
// (tf.nn.max_pool, tf.nn.avg_pool; NHWC).
template <expression X>
output<value_type_of<X>, 4> max_pool(const X& x, std::array<std::int64_t, 2> ksize,
                                     const pool_options& o = {}) {
  static_assert(rank_of<X> == 4, "loom::max_pool: the input must have rank 4 (NHWC)");
  static_assert(numeric_type<value_type_of<X>>, "loom::max_pool: needs a numeric input");
  auto lx = lower(x);
  return {lx.graph(), lx.graph().add_node("max_pool", {lx.id()},
                                          {{"ksize", detail::nhwc(ksize)},
                                           {"strides", detail::nhwc(o.strides)},
                                           {"padding", o.padding}})};
}
template <expression X>
output<value_type_of<X>, 4> avg_pool(const X& x, std::array<std::int64_t, 2> ksize,
                                     const pool_options& o = {}) {
  static_assert(rank_of<X> == 4, "loom::avg_pool: the input must have rank 4 (NHWC)");
  static_assert(floating_type<value_type_of<X>>, "loom::avg_pool: needs float or double");
  auto lx = lower(x);
  return {lx.graph(), lx.graph().add_node("avg_pool", {lx.id()},
                                          {{"ksize", detail::nhwc(ksize)},
                                           {"strides", detail::nhwc(o.strides)},
                                           {"padding", o.padding}})};
}

// x + b along x's last dimension (tf.nn.bias_add, NHWC): an elementwise add, so it fuses
// with what follows it (a relu).
template <expression X, expression B> auto bias_add(const X& x, const B& bias) {
  static_assert(rank_of<B> == 1, "loom::bias_add: the bias must be a vector (rank 1)");
  static_assert(rank_of<X> >= 2, "loom::bias_add: the input must have rank 2 or more");
  return x + bias;
}

} // namespace loom

// conv2d and depthwise_conv2d and their backprops, max_pool and avg_pool and their gradients on
// the CPU, against naive loops over TF's definitions (SAME and VALID, strides, dilations, a 1x1
// filter, a batch whose patches take several chunks, channel multipliers), and their shape errors.
// In double conv2d runs im2col; in float, oneDNN where loom is built with it (LOOM_HAVE_DNNL),
// checked against the same definitions.
#include <doctest/doctest.h>
#include <support/messages.hpp>

#include <loom/loom.hpp>
#if defined(LOOM_HAVE_DNNL)
#include <loom/kernels/cpu/dnnl.hpp>
#endif

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

using loom::graph;
using loom::shape;
using loom::tensor;
using loom::testing::contains;
using loom::testing::message_of;

namespace {

tensor<double, 4> random_nhwc(const shape& s, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> v(static_cast<std::size_t>(s.num_elements()));
  for (double& x : v)
    x = static_cast<double>(rng() >> 11) * 0x1.0p-53 * 2 - 1;
  return tensor<double, 4>(s, v);
}

struct geometry {
  std::int64_t out, pad;
};
// TF's output size and leading padding along one dimension.
geometry along(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t dilation,
               bool same) {
  const std::int64_t eff = (k - 1) * dilation + 1;
  if (!same)
    return {(in - eff) / stride + 1, 0};
  const std::int64_t out = (in + stride - 1) / stride;
  return {out, std::max<std::int64_t>((out - 1) * stride + eff - in, 0) / 2};
}

struct conv_case {
  shape x, f;
  std::array<std::int64_t, 2> strides, dilations;
  const char* padding;
};

// The convolution by its definition: y[n, i, j, o] = sum x[n, i*s - p + a*d, ...] f[a, b, c, o].
std::vector<double> naive_conv(const conv_case& k, const tensor<double, 4>& x,
                               const tensor<double, 4>& f) {
  const bool same = std::string(k.padding) == "SAME";
  const auto h = along(k.x[1], k.f[0], k.strides[0], k.dilations[0], same);
  const auto w = along(k.x[2], k.f[1], k.strides[1], k.dilations[1], same);
  std::vector<double> y;
  for (std::int64_t n = 0; n < k.x[0]; ++n)
    for (std::int64_t i = 0; i < h.out; ++i)
      for (std::int64_t j = 0; j < w.out; ++j)
        for (std::int64_t o = 0; o < k.f[3]; ++o) {
          double sum = 0;
          for (std::int64_t a = 0; a < k.f[0]; ++a)
            for (std::int64_t b = 0; b < k.f[1]; ++b) {
              const std::int64_t r = i * k.strides[0] - h.pad + a * k.dilations[0];
              const std::int64_t s = j * k.strides[1] - w.pad + b * k.dilations[1];
              if (r < 0 || r >= k.x[1] || s < 0 || s >= k.x[2])
                continue;
              for (std::int64_t c = 0; c < k.x[3]; ++c)
                sum += x.flat()[static_cast<std::size_t>(((n * k.x[1] + r) * k.x[2] + s) * k.x[3] +
                                                         c)] *
                       f.flat()[static_cast<std::size_t>(((a * k.f[1] + b) * k.f[2] + c) * k.f[3] +
                                                         o)];
            }
          y.push_back(sum);
        }
  return y;
}

} // namespace

TEST_CASE("conv2d against its definition: SAME and VALID, strides, dilations, 1x1, chunks") {
  const std::vector<conv_case> cases{
      {shape{2, 7, 6, 3}, shape{3, 3, 3, 4}, {1, 1}, {1, 1}, "SAME"},
      {shape{2, 7, 6, 3}, shape{3, 2, 3, 4}, {2, 3}, {1, 1}, "SAME"},
      {shape{2, 7, 6, 3}, shape{3, 3, 3, 2}, {2, 1}, {1, 1}, "VALID"},
      {shape{1, 9, 9, 2}, shape{3, 3, 2, 2}, {1, 1}, {2, 2}, "SAME"},
      {shape{1, 9, 8, 2}, shape{2, 3, 2, 2}, {1, 2}, {3, 1}, "VALID"},
      {shape{3, 4, 5, 6}, shape{1, 1, 6, 5}, {1, 1}, {1, 1}, "SAME"},
      {shape{2, 5, 5, 1}, shape{5, 5, 1, 3}, {1, 1}, {1, 1}, "SAME"}, // a window past the input
      // 64 images of 28x28 outputs by 5x5x4 patches: past the patch budget, several chunks.
      {shape{64, 28, 28, 4}, shape{5, 5, 4, 2}, {1, 1}, {1, 1}, "SAME"},
  };
  for (const conv_case& k : cases) {
    INFO("x " << k.x.to_string() << ", filter " << k.f.to_string() << ", strides " << k.strides[0]
              << "x" << k.strides[1] << ", dilations " << k.dilations[0] << "x" << k.dilations[1]
              << ", " << k.padding);
    graph g;
    loom::placeholder<double, 4> x(g, shape{-1, k.x[1], k.x[2], k.x[3]}, "x");
    loom::placeholder<double, 4> f(g, k.f, "f");
    auto y =
        loom::conv2d(x, f, {.strides = k.strides, .padding = k.padding, .dilations = k.dilations});
    loom::session s(g);
    const auto xv = random_nhwc(k.x, 1), fv = random_nhwc(k.f, 2);
    const auto got = s.run(y, {{x, xv}, {f, fv}});
    const auto want = naive_conv(k, xv, fv);
    REQUIRE(static_cast<std::size_t>(got.shape().num_elements()) == want.size());
    double worst = 0;
    for (std::size_t i = 0; i < want.size(); ++i)
      worst = std::max(worst, std::abs(got.flat()[i] - want[i]));
    CHECK(worst < 1e-12);
  }
}

// The float convolution and both its backprops (oneDNN's where loom has it) against the
// definitions computed in double: y = x * f, dx[n, r, s, c] = sum dy[n, i, j, o] f[a, b, c, o],
// df[a, b, c, o] = sum x[n, r, s, c] dy[n, i, j, o] over the windows' positions.
TEST_CASE("float conv2d and its backprops against their definitions: SAME and VALID, strides, "
          "dilations, odd sizes, batches") {
#if defined(LOOM_HAVE_DNNL)
  const std::size_t made_before = loom::kernels::dnnl_conv::primitives().made();
#endif
  const std::vector<conv_case> cases{
      {shape{3, 7, 9, 3}, shape{3, 3, 3, 5}, {1, 1}, {1, 1}, "SAME"},
      {shape{2, 7, 9, 3}, shape{3, 3, 3, 5}, {1, 1}, {1, 1}, "VALID"},
      {shape{2, 9, 7, 4}, shape{3, 3, 4, 6}, {2, 2}, {1, 1}, "SAME"},
      {shape{2, 10, 11, 3}, shape{3, 2, 3, 4}, {2, 2}, {1, 1}, "VALID"},
      {shape{2, 11, 9, 2}, shape{3, 3, 2, 3}, {1, 1}, {2, 2}, "SAME"},
      {shape{3, 13, 12, 3}, shape{3, 3, 3, 4}, {1, 2}, {2, 2}, "VALID"},
      {shape{2, 15, 15, 5}, shape{5, 5, 5, 7}, {2, 2}, {1, 1}, "SAME"},
      {shape{4, 28, 28, 1}, shape{5, 5, 1, 8}, {1, 1}, {1, 1}, "SAME"}, // examples/cnn's conv1
  };
  for (const conv_case& k : cases) {
    INFO("x " << k.x.to_string() << ", filter " << k.f.to_string() << ", strides " << k.strides[0]
              << "x" << k.strides[1] << ", dilations " << k.dilations[0] << "x" << k.dilations[1]
              << ", " << k.padding);
    const bool same = std::string(k.padding) == "SAME";
    const auto h = along(k.x[1], k.f[0], k.strides[0], k.dilations[0], same);
    const auto w = along(k.x[2], k.f[1], k.strides[1], k.dilations[1], same);
    const shape ys{k.x[0], h.out, w.out, k.f[3]};
    graph g;
    loom::placeholder<float, 4> x(g, k.x, "x");
    loom::placeholder<float, 4> f(g, k.f, "f");
    loom::placeholder<float, 4> dy(g, ys, "dy");
    auto y =
        loom::conv2d(x, f, {.strides = k.strides, .padding = k.padding, .dilations = k.dilations});
    const auto grads = loom::gradients(g, {y.id()}, {x.id(), f.id()}, {dy.id()});
    loom::session s(g);
    auto as_float = [](const tensor<double, 4>& t) {
      std::vector<float> v(t.flat().begin(), t.flat().end());
      return tensor<float, 4>(t.shape(), v);
    };
    const auto xv = as_float(random_nhwc(k.x, 4)), fv = as_float(random_nhwc(k.f, 5)),
               dv = as_float(random_nhwc(ys, 6));
    const loom::feed_dict feeds{{x, xv}, {f, fv}, {dy, dv}};
    const auto got_y = s.run(y, feeds);
    const auto got_dx = s.run(loom::output<float, 4>(g, grads[0]), feeds);
    const auto got_df = s.run(loom::output<float, 4>(g, grads[1]), feeds);
    std::vector<double> want_y(static_cast<std::size_t>(ys.num_elements())),
        want_dx(static_cast<std::size_t>(k.x.num_elements())),
        want_df(static_cast<std::size_t>(k.f.num_elements()));
    for (std::int64_t n = 0; n < k.x[0]; ++n)
      for (std::int64_t i = 0; i < h.out; ++i)
        for (std::int64_t j = 0; j < w.out; ++j)
          for (std::int64_t a = 0; a < k.f[0]; ++a)
            for (std::int64_t b = 0; b < k.f[1]; ++b) {
              const std::int64_t r = i * k.strides[0] - h.pad + a * k.dilations[0];
              const std::int64_t q = j * k.strides[1] - w.pad + b * k.dilations[1];
              if (r < 0 || r >= k.x[1] || q < 0 || q >= k.x[2])
                continue;
              for (std::int64_t c = 0; c < k.x[3]; ++c)
                for (std::int64_t o = 0; o < k.f[3]; ++o) {
                  const auto xi =
                      static_cast<std::size_t>(((n * k.x[1] + r) * k.x[2] + q) * k.x[3] + c);
                  const auto fi =
                      static_cast<std::size_t>(((a * k.f[1] + b) * k.f[2] + c) * k.f[3] + o);
                  const auto yi =
                      static_cast<std::size_t>(((n * h.out + i) * w.out + j) * k.f[3] + o);
                  want_y[yi] += double{xv.flat()[xi]} * fv.flat()[fi];
                  want_dx[xi] += double{dv.flat()[yi]} * fv.flat()[fi];
                  want_df[fi] += double{xv.flat()[xi]} * dv.flat()[yi];
                }
            }
    auto worst = [](const tensor<float, 4>& got, const std::vector<double>& want) {
      REQUIRE(static_cast<std::size_t>(got.shape().num_elements()) == want.size());
      double d = 0;
      for (std::size_t i = 0; i < want.size(); ++i)
        d = std::max(d, std::abs(got.flat()[i] - want[i]));
      return d;
    };
    // Sums of at most a few hundred products of numbers in [-1, 1], in float.
    CHECK(worst(got_y, want_y) < 1e-4);
    CHECK(worst(got_dx, want_dx) < 1e-4);
    CHECK(worst(got_df, want_df) < 1e-4);
  }
#if defined(LOOM_HAVE_DNNL)
  // oneDNN ran them: it made a primitive for each shape's three passes.
  CHECK(loom::kernels::dnnl_conv::primitives().made() >= made_before + 3 * cases.size());
#endif
}

TEST_CASE("max_pool and avg_pool against their definitions, SAME windows counting the input") {
  for (const char* padding : {"VALID", "SAME"}) {
    INFO(padding);
    graph g;
    loom::placeholder<double, 4> x(g, shape{2, 5, 7, 3}, "x");
    auto mx = loom::max_pool(x, {3, 2}, {.strides = {2, 2}, .padding = padding});
    auto av = loom::avg_pool(x, {3, 2}, {.strides = {2, 2}, .padding = padding});
    loom::session s(g);
    const auto xv = random_nhwc(shape{2, 5, 7, 3}, 3);
    const auto m = s.run(mx, {{x, xv}});
    const auto a = s.run(av, {{x, xv}});
    const bool same = std::string(padding) == "SAME";
    const auto h = along(5, 3, 2, 1, same), w = along(7, 2, 2, 1, same);
    REQUIRE(m.shape() == shape{2, h.out, w.out, 3});
    std::size_t e = 0;
    for (std::int64_t n = 0; n < 2; ++n)
      for (std::int64_t i = 0; i < h.out; ++i)
        for (std::int64_t j = 0; j < w.out; ++j)
          for (std::int64_t c = 0; c < 3; ++c, ++e) {
            double best = -1e300, sum = 0;
            int count = 0;
            for (std::int64_t r = i * 2 - h.pad; r < i * 2 - h.pad + 3; ++r)
              for (std::int64_t q = j * 2 - w.pad; q < j * 2 - w.pad + 2; ++q)
                if (r >= 0 && r < 5 && q >= 0 && q < 7) {
                  const double v =
                      xv.flat()[static_cast<std::size_t>(((n * 5 + r) * 7 + q) * 3 + c)];
                  best = std::max(best, v);
                  sum += v;
                  ++count;
                }
            CHECK(m.flat()[e] == best);
            CHECK(std::abs(a.flat()[e] - sum / count) < 1e-15);
          }
  }
}

TEST_CASE("max_pool and its gradient, which goes to each window's first largest element: ties, "
          "overlapping windows, channel counts below, at and across the kernels' block of 8") {
  for (const std::int64_t channels : {3, 8, 11, 20}) {
    for (const char* padding : {"VALID", "SAME"}) {
      CAPTURE(channels);
      CAPTURE(padding);
      const shape xs{2, 4, 5, channels};
      const bool same = std::string(padding) == "SAME";
      const auto h = along(4, 2, 1, 1, same), w = along(5, 3, 2, 1, same);
      const shape ys{2, h.out, w.out, channels};
      graph g;
      loom::placeholder<float, 4> x(g, xs, "x");
      loom::placeholder<float, 4> dy(g, ys, "dy");
      auto y = loom::max_pool(x, {2, 3}, {.strides = {1, 2}, .padding = padding});
      const auto grads = loom::gradients(g, {y.id()}, {x.id()}, {dy.id()});
      // Values from {0, 1, 2}: most windows hold their largest more than once.
      std::mt19937_64 rng(7);
      std::vector<float> xv(static_cast<std::size_t>(xs.num_elements()));
      for (float& v : xv)
        v = static_cast<float>(rng() % 3);
      std::vector<float> dv(static_cast<std::size_t>(ys.num_elements()));
      for (std::size_t i = 0; i < dv.size(); ++i)
        dv[i] = static_cast<float>(i % 7 + 1);
      loom::session s(g);
      const loom::feed_dict feeds{{x, tensor<float, 4>(xs, xv)}, {dy, tensor<float, 4>(ys, dv)}};
      const auto got_y = s.run(y, feeds);
      const auto got = s.run(loom::output<float, 4>(g, grads[0]), feeds);
      std::vector<float> want(xv.size(), 0.0f), want_y;
      const auto at = [&](std::int64_t n, std::int64_t r, std::int64_t q, std::int64_t c) {
        return static_cast<std::size_t>(((n * 4 + r) * 5 + q) * channels + c);
      };
      std::size_t e = 0;
      for (std::int64_t n = 0; n < 2; ++n)
        for (std::int64_t i = 0; i < h.out; ++i)
          for (std::int64_t j = 0; j < w.out; ++j)
            for (std::int64_t c = 0; c < channels; ++c, ++e) {
              std::size_t first = xv.size(); // in window order: rows, then columns
              for (std::int64_t r = i - h.pad; r < i - h.pad + 2; ++r)
                for (std::int64_t q = j * 2 - w.pad; q < j * 2 - w.pad + 3; ++q)
                  if (r >= 0 && r < 4 && q >= 0 && q < 5 &&
                      (first == xv.size() || xv[at(n, r, q, c)] > xv[first]))
                    first = at(n, r, q, c);
              want[first] += dv[e];
              want_y.push_back(xv[first]);
            }
      CHECK(std::vector<float>(got_y.flat().begin(), got_y.flat().end()) == want_y);
      CHECK(std::vector<float>(got.flat().begin(), got.flat().end()) == want);
    }
  }
}

TEST_CASE("max_pool's gradient over examples/cnn's windows (2x2, stride 2) that tile the input, "
          "leave a row and a column out, or are padded: each element its window's dy where it "
          "is the first largest, else 0") {
  struct input_size {
    std::int64_t h, w;
    const char* padding;
  };
  // 4x6 VALID: the windows tile the input; 5x5 VALID: the last row and column are in no
  // window; 5x5 SAME: the last windows padded.
  for (const input_size in :
       {input_size{4, 6, "VALID"}, input_size{5, 5, "VALID"}, input_size{5, 5, "SAME"}})
    for (const std::int64_t channels : {3, 8, 11}) {
      CAPTURE(in.h);
      CAPTURE(in.padding);
      CAPTURE(channels);
      const bool same = std::string(in.padding) == "SAME";
      const auto h = along(in.h, 2, 2, 1, same), w = along(in.w, 2, 2, 1, same);
      const shape xs{2, in.h, in.w, channels}, ys{2, h.out, w.out, channels};
      graph g;
      loom::placeholder<float, 4> x(g, xs, "x");
      loom::placeholder<float, 4> dy(g, ys, "dy");
      auto y = loom::max_pool(x, {2, 2}, {.strides = {2, 2}, .padding = in.padding});
      const auto grads = loom::gradients(g, {y.id()}, {x.id()}, {dy.id()});
      std::mt19937_64 rng(11);
      std::vector<float> xv(static_cast<std::size_t>(xs.num_elements()));
      for (float& v : xv)
        v = static_cast<float>(rng() % 3); // ties in most windows
      std::vector<float> dv(static_cast<std::size_t>(ys.num_elements()));
      for (std::size_t i = 0; i < dv.size(); ++i)
        dv[i] = static_cast<float>(i % 7 + 1);
      loom::session s(g);
      const loom::feed_dict feeds{{x, tensor<float, 4>(xs, xv)}, {dy, tensor<float, 4>(ys, dv)}};
      const auto got = s.run(loom::output<float, 4>(g, grads[0]), feeds);
      std::vector<float> want(xv.size(), 0.0f);
      const auto at = [&](std::int64_t n, std::int64_t r, std::int64_t q, std::int64_t c) {
        return static_cast<std::size_t>(((n * in.h + r) * in.w + q) * channels + c);
      };
      std::size_t e = 0;
      for (std::int64_t n = 0; n < 2; ++n)
        for (std::int64_t i = 0; i < h.out; ++i)
          for (std::int64_t j = 0; j < w.out; ++j)
            for (std::int64_t c = 0; c < channels; ++c, ++e) {
              std::size_t first = xv.size();
              for (std::int64_t r = i * 2 - h.pad; r < i * 2 - h.pad + 2; ++r)
                for (std::int64_t q = j * 2 - w.pad; q < j * 2 - w.pad + 2; ++q)
                  if (r >= 0 && r < in.h && q >= 0 && q < in.w &&
                      (first == xv.size() || xv[at(n, r, q, c)] > xv[first]))
                    first = at(n, r, q, c);
              want[first] += dv[e];
            }
      CHECK(std::vector<float>(got.flat().begin(), got.flat().end()) == want);
    }
}

TEST_CASE("bias_add adds along the channels; conv shapes that do not fit are one error") {
  graph g;
  loom::placeholder<float, 4> x(g, shape{-1, 28, 28, 3}, "x");
  loom::placeholder<float, 4> wrong(g, shape{5, 5, 4, 8}, "wrong");
  loom::placeholder<float, 4> big(g, shape{30, 30, 3, 8}, "big");
  auto error = [](auto&& f) { return message_of<loom::invalid_argument_error>(f); };
  CHECK(contains(error([&] { loom::conv2d(x, wrong); }),
                 "the input of shape [?, 28, 28, 3] has 3 channels, but the filter of shape "
                 "[5, 5, 4, 8] expects 4"));
  CHECK(contains(error([&] { loom::conv2d(x, big, {.padding = "VALID"}); }),
                 "does not fit the input of shape [?, 28, 28, 3] with VALID padding"));
  CHECK(contains(error([&] { loom::conv2d(x, big, {.padding = "FULL"}); }),
                 "padding \"FULL\"; expected \"SAME\" or \"VALID\""));
  CHECK(contains(error([&] {
                   loom::max_pool(x, {2, 2}, {.strides = {0, 1}});
                 }),
                 "strides [1, 0, 1, 1] must be [1, h, w, 1]"));
  loom::placeholder<float, 1> b(g, shape{3}, "b");
  auto y = loom::lower(loom::bias_add(x, b));
  loom::session s(g);
  const auto got = s.run(y, {{x, tensor<float, 4>(shape{1, 28, 28, 3}, 1.f)},
                             {b, tensor<float, 1>(shape{3}, {1, 2, 3})}});
  CHECK(got.flat()[0] == 2.f);
  CHECK(got.flat()[5] == 4.f);
}

namespace {

// The depthwise convolution by its definition: y[n, i, j, c * m + q] = sum over the window of
// x[n, i*s - p + a*d, j*s - p + b*d, c] f[a, b, c, q].
std::vector<double> naive_depthwise(const conv_case& k, const tensor<double, 4>& x,
                                    const tensor<double, 4>& f) {
  const bool same = std::string(k.padding) == "SAME";
  const auto h = along(k.x[1], k.f[0], k.strides[0], k.dilations[0], same);
  const auto w = along(k.x[2], k.f[1], k.strides[1], k.dilations[1], same);
  const std::int64_t ch = k.x[3], m = k.f[3];
  std::vector<double> y;
  for (std::int64_t n = 0; n < k.x[0]; ++n)
    for (std::int64_t i = 0; i < h.out; ++i)
      for (std::int64_t j = 0; j < w.out; ++j)
        for (std::int64_t c = 0; c < ch; ++c)
          for (std::int64_t q = 0; q < m; ++q) {
            double sum = 0;
            for (std::int64_t a = 0; a < k.f[0]; ++a)
              for (std::int64_t b = 0; b < k.f[1]; ++b) {
                const std::int64_t r = i * k.strides[0] - h.pad + a * k.dilations[0];
                const std::int64_t s = j * k.strides[1] - w.pad + b * k.dilations[1];
                if (r < 0 || r >= k.x[1] || s < 0 || s >= k.x[2])
                  continue;
                sum +=
                    x.flat()[static_cast<std::size_t>(((n * k.x[1] + r) * k.x[2] + s) * ch + c)] *
                    f.flat()[static_cast<std::size_t>(((a * k.f[1] + b) * ch + c) * m + q)];
              }
            y.push_back(sum);
          }
  return y;
}

double dot(const loom::any_tensor& a, const loom::any_tensor& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.num_elements(); ++i)
    s += a.data<double>()[i] * b.data<double>()[i];
  return s;
}

} // namespace

TEST_CASE("depthwise_conv2d against its definition, and its backprops as its adjoints") {
  const std::vector<conv_case> cases{
      {shape{2, 7, 6, 3}, shape{3, 3, 3, 1}, {1, 1}, {1, 1}, "SAME"},
      {shape{2, 7, 6, 3}, shape{3, 2, 3, 2}, {2, 3}, {1, 1}, "SAME"},
      {shape{1, 7, 6, 2}, shape{3, 3, 2, 3}, {2, 1}, {1, 1}, "VALID"},
      {shape{1, 9, 9, 2}, shape{3, 3, 2, 2}, {1, 1}, {2, 2}, "SAME"},
      {shape{2, 5, 5, 1}, shape{5, 5, 1, 2}, {1, 1}, {1, 1}, "SAME"}, // a window past the input
  };
  for (const conv_case& k : cases) {
    INFO("x " << k.x.to_string() << ", filter " << k.f.to_string() << ", strides " << k.strides[0]
              << "x" << k.strides[1] << ", dilations " << k.dilations[0] << "x" << k.dilations[1]
              << ", " << k.padding);
    graph g;
    loom::placeholder<double, 4> x(g, shape{-1, k.x[1], k.x[2], k.x[3]}, "x");
    loom::placeholder<double, 4> f(g, k.f, "f");
    auto y = loom::depthwise_conv2d(
        x, f, {.strides = k.strides, .padding = k.padding, .dilations = k.dilations});
    loom::session s(g);
    const auto xv = random_nhwc(k.x, 1), fv = random_nhwc(k.f, 2);
    const auto got = s.run(y, {{x, xv}, {f, fv}});
    const auto want = naive_depthwise(k, xv, fv);
    REQUIRE(static_cast<std::size_t>(got.shape().num_elements()) == want.size());
    CHECK(got.shape()[3] == k.x[3] * k.f[3]);
    double worst = 0;
    for (std::size_t i = 0; i < want.size(); ++i)
      worst = std::max(worst, std::abs(got.flat()[i] - want[i]));
    CHECK(worst < 1e-12);
    // <y(x, f), dy> = <x, dx(f, dy)> = <f, df(x, dy)>: the backprops are the adjoints.
    loom::placeholder<double, 4> dy(g, got.shape(), "dy");
    const loom::attr_map a{
        {"strides", std::vector<std::int64_t>{1, k.strides[0], k.strides[1], 1}},
        {"dilations", std::vector<std::int64_t>{1, k.dilations[0], k.dilations[1], 1}},
        {"padding", std::string(k.padding)}};
    loom::attr_map ai = a, af = a;
    ai["input_shape"] = k.x.dims();
    af["filter_shape"] = k.f.dims();
    const auto dx = g.add_node("depthwise_conv2d_native_backprop_input", {f.id(), dy.id()}, ai);
    const auto df = g.add_node("depthwise_conv2d_native_backprop_filter", {x.id(), dy.id()}, af);
    const auto dyv = random_nhwc(got.shape(), 3);
    const auto grads = s.run_nodes(
        {dx, df}, {}, {{x.id(), xv.value()}, {f.id(), fv.value()}, {dy.id(), dyv.value()}});
    const double forward = dot(got.value(), dyv.value());
    CHECK(std::abs(dot(xv.value(), grads[0]) - forward) < 1e-10 * std::max(1.0, std::abs(forward)));
    CHECK(std::abs(dot(fv.value(), grads[1]) - forward) < 1e-10 * std::max(1.0, std::abs(forward)));
  }
}

TEST_CASE("depthwise_conv2d by hand, and its shape errors") {
  graph g;
  loom::placeholder<float, 4> x(g, shape{1, 3, 3, 1}, "x");
  loom::placeholder<float, 4> f(g, shape{2, 2, 1, 2}, "f");
  auto y = loom::depthwise_conv2d(x, f, {.padding = "VALID"});
  CHECK(y.shape() == shape{1, 2, 2, 2});
  loom::session s(g);
  // Filter 0: the window's diagonal; filter 1: the window's sum.
  const auto got = s.run(y, {{x, tensor<float, 4>(shape{1, 3, 3, 1}, {1, 2, 3, 4, 5, 6, 7, 8, 9})},
                             {f, tensor<float, 4>(shape{2, 2, 1, 2}, {1, 1, 0, 1, 0, 1, 1, 1})}});
  CHECK(std::vector<float>(got.flat().begin(), got.flat().end()) ==
        std::vector<float>{6, 12, 8, 16, 12, 24, 14, 28});
  loom::placeholder<float, 4> wrong(g, shape{3, 3, 2, 1}, "wrong");
  auto error = [](auto&& fn) { return message_of<loom::invalid_argument_error>(fn); };
  CHECK(contains(error([&] { loom::depthwise_conv2d(x, wrong); }),
                 "the input of shape [1, 3, 3, 1] has 1 channels, but the depthwise filter of "
                 "shape [3, 3, 2, 1] expects 2"));
  loom::placeholder<float, 4> big(g, shape{4, 4, 1, 1}, "big");
  CHECK(contains(error([&] { loom::depthwise_conv2d(x, big, {.padding = "VALID"}); }),
                 "does not fit the input of shape [1, 3, 3, 1] with VALID padding"));
}

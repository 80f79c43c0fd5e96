// The correct versions of every compile-fail case: this must compile.
#include <loom/api.hpp>

#include <cstdint>

#include <string>

int main() {
  loom::graph g;
  loom::placeholder<float, 2> x(g, loom::shape{2, 2}, "x");
  loom::placeholder<float, 1> v(g, loom::shape{2}, "v");
  loom::placeholder<std::int32_t, 1> i(g, loom::shape{2}, "i");
  auto sum = x + v;                                            // same dtypes, broadcast
  auto mixed = v + loom::cast<float>(i);                       // an explicit cast
  auto e = loom::exp(loom::cast<double>(i));                   // exp of a floating type
  auto m = loom::matmul(x, x);                                 // rank-2 operands
  auto c = loom::clip_by_value(x, 0.0f, 1.0f);                 // scalar bounds
  auto c2 = loom::clip_by_value(x, loom::reduce_max(x), 1.0f); // a scalar expression bound
  (void)sum;
  (void)mixed;
  (void)e;
  (void)m;
  (void)c;
  (void)c2;
  auto any = loom::reduce_any(x > 0.0f, 1); // any of a comparison (bools)
  (void)any;
  loom::session s(g);
  loom::tensor<float, 2> fetched = s.run(sum, {{x, loom::tensor<float, 2>(loom::shape{2, 2}, 1.0f)},
                                               {v, loom::tensor<float, 1>(loom::shape{2}, 1.0f)}});
  float scalar = s.run(loom::reduce_sum(x), {{x, loom::tensor<float, 2>(loom::shape{2, 2}, 1.0f)}});
  (void)fetched;
  (void)scalar;
  // The correct forms of the cf_ cases: a scalar variable from a number (tf.Variable(1.0)),
  // a policy returning a device string, several fetches.
  loom::variable<float, 0> a(g, "a", 1.0);
  auto on_ps = g.device([](const loom::node_def& n, const loom::device_spec&) {
    return n.op == "variable" ? "/job:ps" : "/job:worker";
  });
  auto [r1, r2] = s.run(loom::fetches(loom::reduce_sum(x), a),
                        {{x, loom::tensor<float, 2>(loom::shape{2, 2}, 1.0f)}});
  (void)r1;
  (void)r2;
}

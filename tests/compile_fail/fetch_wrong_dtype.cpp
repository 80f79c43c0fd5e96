// A fetch of a float node is a tensor<float, R>, not a tensor<double, R>.
#include <loom/api.hpp>

#include <cstdint>

int main() {
  loom::graph g;
  loom::placeholder<float, 2> x(g, loom::shape{2, 2}, "x");
  loom::session s(g);
  loom::tensor<double, 2> y =
      s.run(x * 2.0f, {{x, loom::tensor<float, 2>(loom::shape{2, 2}, 1.0f)}});
  (void)y;
}

// A fetch of a rank-2 node is a tensor<T, 2>, not a tensor<T, 1>.
#include <loom/api.hpp>

#include <cstdint>

int main() {
  loom::graph g;
  loom::placeholder<float, 2> x(g, loom::shape{2, 2}, "x");
  loom::session s(g);
  loom::tensor<float, 1> y =
      s.run(x * 2.0f, {{x, loom::tensor<float, 2>(loom::shape{2, 2}, 1.0f)}});
  (void)y;
}

// Feeding a tensor<double, 2> to a placeholder<float, 2>.
#include <loom/api.hpp>

#include <cstdint>

int main() {
  loom::graph g;
  loom::placeholder<float, 2> x(g, loom::shape{2, 2}, "x");
  loom::session s(g);
  auto y = s.run(x * 2.0f, {{x, loom::tensor<double, 2>(loom::shape{2, 2}, 1.0)}});
  (void)y;
}

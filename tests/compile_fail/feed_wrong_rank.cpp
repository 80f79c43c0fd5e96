// Feeding a rank-1 tensor to a rank-2 placeholder.
#include <loom/api.hpp>

#include <cstdint>

int main() {
  loom::graph g;
  loom::placeholder<float, 2> x(g, loom::shape{-1, 2}, "x");
  loom::session s(g);
  auto y = s.run(x * 2.0f, {{x, loom::tensor<float, 1>(loom::shape{2}, 1.0f)}});
  (void)y;
}

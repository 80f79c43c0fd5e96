// matmul needs rank-2 operands.
#include <loom/api.hpp>

#include <cstdint>

int main() {
  loom::graph g;
  loom::placeholder<float, 1> v(g, loom::shape{3}, "v");
  loom::placeholder<float, 2> m(g, loom::shape{3, 3}, "m");
  auto y = loom::matmul(v, m);
  (void)y;
}

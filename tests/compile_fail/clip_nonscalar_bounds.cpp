// clip_by_value takes scalar bounds.
#include <loom/api.hpp>

#include <cstdint>

int main() {
  loom::graph g;
  loom::placeholder<float, 1> x(g, loom::shape{3}, "x");
  loom::placeholder<float, 1> lo(g, loom::shape{3}, "lo");
  auto y = loom::clip_by_value(x, lo, 1.0f);
  (void)y;
}

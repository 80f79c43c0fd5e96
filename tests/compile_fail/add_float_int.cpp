// Adding a float and an int32 expression: loom never converts implicitly.
#include <loom/api.hpp>

#include <cstdint>

int main() {
  loom::graph g;
  loom::placeholder<float, 1> x(g, loom::shape{3}, "x");
  loom::placeholder<std::int32_t, 1> i(g, loom::shape{3}, "i");
  auto y = x + i;
  (void)y;
}

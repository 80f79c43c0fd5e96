// Nothing casts to (or from) string.
#include <loom/api.hpp>

#include <cstdint>

#include <string>

int main() {
  loom::graph g;
  loom::placeholder<float, 1> x(g, loom::shape{3}, "x");
  auto y = loom::cast<std::string>(x);
  (void)y;
}

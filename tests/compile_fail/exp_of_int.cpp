// exp has kernels for float and double only.
#include <loom/api.hpp>

#include <cstdint>

int main() {
  loom::graph g;
  loom::placeholder<std::int32_t, 1> i(g, loom::shape{3}, "i");
  auto y = loom::exp(i);
  (void)y;
}

// on<Kind> takes a device kind, loom::gpu or loom::cpu, not a device string or index.
#include <loom/api.hpp>

int main() {
  loom::graph g;
  loom::placeholder<float, 1> x(g, loom::shape{3}, "x");
  auto y = loom::on<int>(loom::relu(x));
  (void)y;
}

// reduce_any and reduce_all reduce bools: a float tensor is a mistake the compiler names
// (compare it first: reduce_any(x > 0.f)).
#include <loom/api.hpp>

int main() {
  loom::graph g;
  loom::placeholder<float, 2> x(g, loom::shape{-1, 3}, "x");
  auto any = loom::reduce_any(x, 1);
  (void)any;
}

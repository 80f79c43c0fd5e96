// one_hot's ids must be integers: a float tensor of labels is a mistake the compiler names.
#include <loom/api.hpp>

int main() {
  loom::graph g;
  loom::placeholder<float, 1> labels(g, loom::shape{-1}, "labels");
  auto y = loom::one_hot(labels, 10);
  (void)y;
}

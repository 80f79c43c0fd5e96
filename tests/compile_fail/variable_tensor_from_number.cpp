// A number initializes a scalar variable (tf.Variable(1.0)); a rank-1 one needs a shape.
#include <loom/api.hpp>

int main() {
  loom::graph g;
  loom::variable<float, 1> v(g, "v", 1.0);
  (void)v;
}

// TF's sess.run([a, b]) written as sess.run({a, b}): the error names loom::fetches(a, b).
#include <loom/api.hpp>

int main() {
  loom::graph g;
  auto a = loom::constant(g, 1.0f);
  auto b = loom::constant(g, 2.0f);
  loom::session s(g);
  s.run({a, b});
}

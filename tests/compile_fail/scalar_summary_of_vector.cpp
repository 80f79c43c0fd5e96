// scalar_summary logs one value per step: a rank-1 tensor does not compile.
#include <loom/api.hpp>

int main() {
  loom::graph g;
  loom::placeholder<float, 1> losses(g, loom::shape{3}, "losses");
  auto s = loom::scalar_summary("loss", losses);
  (void)s;
}

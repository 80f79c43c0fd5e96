// A placement policy returns a device_spec or a device string, not an int.
#include <loom/api.hpp>

int main() {
  loom::graph g;
  auto scope = g.device([](const loom::node_def&, const loom::device_spec&) { return 3; });
}

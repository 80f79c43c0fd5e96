// A device scope given something that is not a placement policy must fail with
// loom's static_assert, not with a wall of std::function errors.
#include <loom/graph/graph.hpp>

#include <string>

// Callable, but with the wrong signature and result (a TF-style device function
// returning a string is not a loom policy).
struct not_a_policy {
  std::string operator()(const loom::node_def&) const { return "/job:ps"; }
};

int main() {
  loom::graph g;
  auto scope = g.device(not_a_policy{});
}

// Page-locked memory is for what a GPU copies; strings never go there, and asking is a
// mistake the compiler names.
#include <loom/api.hpp>

int main() {
  auto t = loom::pinned_tensor<std::string, 1>(loom::shape{4});
  (void)t;
}

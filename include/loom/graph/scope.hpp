// A graph's scopes (TF's name scopes, device scopes and control dependencies)
// as an immutable chain: each entry links to the entries outside it, and the
// graph's current scope is a pointer to its innermost entry. Entering a scope
// links one entry; leaving it restores the pointer. Because entries never
// change, an expression keeps the pointer current where it was written (one
// shared pointer), and lowering it later, wherever that happens, restores
// exactly those scopes: `auto b = a + 2.f;` inside g.device("/job:worker")
// runs on the worker, as TF places it.
#pragma once

#include <loom/core/device_spec.hpp>
#include <loom/graph/node.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace loom::detail {

struct scope_frame {
  enum class kind : std::uint8_t {
    name,            // name_scope: `name_scope` is the new one
    device_merge,    // device(spec): `spec` fills what inner scopes left unset
    device_function, // device(policy): `fn` called with the node
    device_clear,    // device(nullptr): hides every enclosing device scope
    control,         // control_dependencies(deps)
    control_clear,   // control_dependencies(nullptr): hides every enclosing one
  };

  std::shared_ptr<const scope_frame> outer;
  kind k = kind::name;
  // The name scope in effect here: the innermost name entry's, copied into
  // every entry so that reading it never walks the chain.
  std::string name_scope;
  device_spec spec;
  std::function<device_spec(const node_def&, const device_spec&)> fn;
  std::uint64_t id = 0; // device_function: tells policy scopes apart in CSE keys
  std::vector<node_id> deps;

  bool is_device() const noexcept {
    return k == kind::device_merge || k == kind::device_function || k == kind::device_clear;
  }
};

using scope_ptr = std::shared_ptr<const scope_frame>;

} // namespace loom::detail

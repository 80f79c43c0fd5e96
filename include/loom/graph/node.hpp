// The runtime graph's node: what a generic server that never saw the user's
// C++ types needs to execute it. Every node has exactly one output (an op with
// no result, like no_op or group, outputs an empty tensor).
#pragma once

#include <loom/core/dtype.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/tensor.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace loom {

using node_id = std::int32_t;
inline constexpr node_id no_node = -1;

using attr_value = std::variant<std::int64_t, double, bool, std::string, std::vector<std::int64_t>,
                                loom::shape, dtype, any_tensor>;
using attr_map = std::map<std::string, attr_value, std::less<>>;

struct node_def {
  node_id id = no_node;
  std::string op;   // a registered op id, stable across builds ("add", "matmul", ...)
  std::string name; // unique within the graph, with its name scope ("layer1/add_2")
  dtype type = dtype::f32;
  loom::shape shape; // may be partial: -1 for dimensions known only at run time
  attr_map attrs;
  std::vector<node_id> inputs;
  std::vector<node_id> control_inputs;
  std::string requested_device; // from device scopes
  std::string assigned_device;  // set by the placer
  std::string colocation_group; // nodes that must share a device (a variable and its updates)
  // The group a node that must run beside this one joins (TF's colocate_with).
  const std::string& colocation() const noexcept {
    return colocation_group.empty() ? name : colocation_group;
  }

  template <class T> const T& attr(std::string_view key) const {
    auto it = attrs.find(key);
    if (it == attrs.end())
      throw not_found_error("node '" + name + "' (" + op + ") has no attribute '" +
                            std::string(key) + "'");
    if (auto* v = std::get_if<T>(&it->second))
      return *v;
    throw internal_error("node '" + name + "' (" + op + "): attribute '" + std::string(key) +
                         "' has another type");
  }
  template <class T> T attr_or(std::string_view key, T fallback) const {
    auto it = attrs.find(key);
    if (it == attrs.end())
      return fallback;
    if (auto* v = std::get_if<T>(&it->second))
      return *v;
    return fallback;
  }
  bool has_attr(std::string_view key) const { return attrs.find(key) != attrs.end(); }

  // "'hid/add_1' (add)", for messages.
  std::string describe() const { return "'" + name + "' (" + op + ")"; }
};

} // namespace loom

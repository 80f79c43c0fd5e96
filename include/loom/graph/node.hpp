// The runtime graph's node: what a generic server that never saw the user's
// C++ types needs to execute it. Every node has exactly one output (an op with
// no result, like no_op or group, outputs an empty tensor).
#pragma once

#include <loom/core/dtype.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/tensor.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace loom {

using node_id = std::int32_t;
inline constexpr node_id no_node = -1;

using attr_value = std::variant<std::int64_t, double, bool, std::string, std::vector<std::int64_t>,
                                loom::shape, dtype, any_tensor>;
// A node's attributes by name: a vector of (name, value) sorted by name, not
// a std::map. Kernels and the executor read attributes by name on every step
// (a node has a handful); a scan of one contiguous array, comparing lengths
// first, costs a fraction of a tree's walk through separately allocated nodes
// (std::map's finds were 4 % of a ps's and a worker's CPU in examples/ctr).
// The subset of std::map's interface the graph uses, in the same order.
class attr_map {
public:
  using value_type = std::pair<std::string, attr_value>;
  using iterator = std::vector<value_type>::iterator;
  using const_iterator = std::vector<value_type>::const_iterator;

  attr_map() = default;
  // As std::map's: the first of two equal names wins.
  attr_map(std::initializer_list<value_type> entries) {
    entries_.reserve(entries.size());
    for (const auto& e : entries)
      emplace(e.first, e.second);
  }

  iterator begin() noexcept { return entries_.begin(); }
  iterator end() noexcept { return entries_.end(); }
  const_iterator begin() const noexcept { return entries_.begin(); }
  const_iterator end() const noexcept { return entries_.end(); }
  std::size_t size() const noexcept { return entries_.size(); }
  bool empty() const noexcept { return entries_.empty(); }
  void clear() noexcept { entries_.clear(); }

  iterator find(std::string_view key) noexcept { return begin() + index_of(key); }
  const_iterator find(std::string_view key) const noexcept { return begin() + index_of(key); }
  bool contains(std::string_view key) const noexcept { return find(key) != end(); }

  const attr_value& at(std::string_view key) const {
    auto it = find(key);
    if (it == end())
      throw std::out_of_range("attr_map::at: no attribute '" + std::string(key) + "'");
    return it->second;
  }
  attr_value& operator[](std::string_view key) { return emplace(key, attr_value{}).first->second; }

  // Inserts (key, value) unless key is present; the entry and whether it was inserted.
  template <class V> std::pair<iterator, bool> emplace(std::string_view key, V&& value) {
    if (auto it = find(key); it != end())
      return {it, false};
    auto at = std::lower_bound(
        entries_.begin(), entries_.end(), key,
        [](const value_type& e, std::string_view k) { return std::string_view(e.first) < k; });
    return {entries_.emplace(at, std::string(key), attr_value(std::forward<V>(value))), true};
  }

private:
  std::ptrdiff_t index_of(std::string_view key) const noexcept {
    const auto n = static_cast<std::ptrdiff_t>(entries_.size());
    for (std::ptrdiff_t i = 0; i < n; ++i) {
      if (std::string_view(entries_[static_cast<std::size_t>(i)].first) == key)
        return i;
    }
    return n;
  }

  std::vector<value_type> entries_;
};

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

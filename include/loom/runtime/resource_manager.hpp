// Resource containers: the variables of one process (one task of a cluster,
// or a local session) under (container, shared name), TF's ResourceMgr. Every
// session that reaches this process shares them; reset() clears containers.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/kernels/registry.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

namespace loom::detail {

class resource_manager final : public kernels::resource_access {
public:
  kernels::variable_resource& variable(const node_def& var) override;

  std::mt19937_64& random_engine(const node_def& node, std::uint64_t seed) override;

  std::shared_ptr<kernels::resource_base>
  resource(const std::string& container, const std::string& name,
           const std::function<std::shared_ptr<kernels::resource_base>()>& make) override {
    std::lock_guard lock(mu_);
    auto& slot = others_[container][name];
    if (!slot)
      slot = make();
    return slot;
  }
  using resource_access::resource;

  std::uint64_t generation() const noexcept override {
    return generation_.load(std::memory_order_acquire);
  }

  // Names of the variables in a container that are not yet initialised.
  std::vector<std::string> uninitialized(const std::string& container,
                                         const std::vector<std::string>& names);

  // Clears the named containers (all when empty), TF's Session.reset.
  void reset(const std::vector<std::string>& containers = {});

private:
  // Unique over the process's resource managers and their resets.
  static std::uint64_t next_generation() noexcept {
    static std::atomic<std::uint64_t> last{0};
    return last.fetch_add(1, std::memory_order_relaxed) + 1;
  }

  std::atomic<std::uint64_t> generation_{next_generation()};
  std::mutex mu_;
  std::map<std::string, std::map<std::string, std::unique_ptr<kernels::variable_resource>>>
      containers_;
  std::map<std::string, std::map<std::string, std::shared_ptr<kernels::resource_base>>> others_;
  std::map<std::string, std::unique_ptr<std::mt19937_64>> engines_;
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE auto resource_manager::variable(const node_def& var)
    -> kernels::variable_resource& {
  const std::string container = var.attr_or<std::string>("container", "");
  const std::string shared_name = var.attr_or<std::string>("shared_name", var.name);
  std::lock_guard lock(mu_);
  auto& slot = containers_[container][shared_name];
  if (!slot)
    slot = std::make_unique<kernels::variable_resource>();
  return *slot;
}

LOOM_COMPILED_ONCE auto resource_manager::random_engine(const node_def& node, std::uint64_t seed)
    -> std::mt19937_64& {
  std::lock_guard lock(mu_);
  auto& slot = engines_[node.name];
  if (!slot)
    slot = std::make_unique<std::mt19937_64>(seed ? seed : std::random_device{}());
  return *slot;
}

LOOM_COMPILED_ONCE auto resource_manager::uninitialized(const std::string& container,
                                                        const std::vector<std::string>& names)
    -> std::vector<std::string> {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  auto c = containers_.find(container);
  for (auto& n : names) {
    if (c == containers_.end()) {
      out.push_back(n);
      continue;
    }
    auto it = c->second.find(n);
    if (it == c->second.end()) {
      out.push_back(n);
      continue;
    }
    std::lock_guard vlock(it->second->mu);
    if (!it->second->initialized)
      out.push_back(n);
  }
  return out;
}

LOOM_COMPILED_ONCE void resource_manager::reset(const std::vector<std::string>& containers) {
  std::lock_guard lock(mu_);
  generation_.store(next_generation(), std::memory_order_release);
  if (containers.empty()) {
    containers_.clear();
    others_.clear();
    engines_.clear();
    return;
  }
  for (auto& c : containers) {
    containers_.erase(c);
    others_.erase(c);
  }
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

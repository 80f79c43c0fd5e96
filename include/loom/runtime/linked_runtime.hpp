// The runtime's implementation, registered as the program's runtime_factory
// (runtime/interfaces.hpp) before main(): local sessions run on the local
// master, sessions with a target on the cluster master, servers serve through
// the task server. Included by one unit per program: loom::kernels' (CMake),
// or <loom/loom.hpp>'s in a program built without it.
#pragma once

#include <loom/runtime/interfaces.hpp>
#include <loom/runtime/local_master.hpp>
#include <loom/runtime/master.hpp>
#include <loom/runtime/task_server.hpp>

#include <memory>
#include <string>
#include <vector>

namespace loom::detail {

class linked_runtime final : public runtime_factory {
public:
  std::unique_ptr<master_interface> local_master(const session_options& o) override {
    return std::make_unique<loom::detail::local_master>(o);
  }
  std::unique_ptr<master_interface> cluster_master(const std::string& target,
                                                   cluster_session_options o) override {
    return std::make_unique<loom::detail::cluster_master>(target, std::move(o));
  }
  std::unique_ptr<server_interface> server(cluster_spec cluster, std::string job, int task,
                                           server_options o) override {
    return std::make_unique<task_server>(std::move(cluster), std::move(job), task, std::move(o));
  }
  void reset(const std::string& target, const std::vector<std::string>& containers) override {
    loom::detail::cluster_master(target).reset(containers);
  }
  void shutdown_cluster(const std::string& target, const std::vector<std::string>& jobs) override {
    loom::detail::cluster_master(target).shutdown_cluster(jobs);
  }
};

inline linked_runtime the_linked_runtime;
inline const bool linked_runtime_installed = runtime_factory::install(the_linked_runtime);

} // namespace loom::detail

// The runtime's implementation, registered as the program's runtime_factory
// (runtime/interfaces.hpp) before main(): local sessions run on the local
// master, sessions with a target on the cluster master, servers serve through
// the task server. Included by one unit per program: loom::kernels' (CMake),
// or <loom/loom.hpp>'s in a program built without it.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/runtime/interfaces.hpp>
#include <loom/runtime/local_master.hpp>
#include <loom/runtime/master.hpp>
#include <loom/runtime/spdlog_sink.hpp>
#include <loom/runtime/task_server.hpp>

#include <chrono>
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
  void reset(const std::string& target, const std::vector<std::string>& containers,
             cluster_session_options o) override;
  shutdown_report shutdown_cluster(const std::string& target, const std::vector<std::string>& jobs,
                                   cluster_session_options o) override;
  ping_report ping_cluster(const std::string& target, const std::vector<std::string>& jobs,
                           cluster_session_options o) override {
    o.quiet = true; // the report says who did not answer
    return loom::detail::cluster_master(target, std::move(o)).ping(jobs);
  }
};

// The logger's sink first: a line the runtime logs as it starts finds it installed.
inline const bool log_sink_installed = spdlog_sink::install_from_environment();
inline linked_runtime the_linked_runtime;
inline const bool linked_runtime_installed = runtime_factory::install(the_linked_runtime);

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE void linked_runtime::reset(const std::string& target,
                                              const std::vector<std::string>& containers,
                                              cluster_session_options o) {
  const auto deadline = std::chrono::steady_clock::now() + o.connect_timeout;
  o.quiet = true; // a task not reached is named in the error, not logged while retried
  loom::detail::cluster_master(target, std::move(o)).reset(containers, deadline);
}

LOOM_COMPILED_ONCE auto linked_runtime::shutdown_cluster(const std::string& target,
                                                         const std::vector<std::string>& jobs,
                                                         cluster_session_options o)
    -> shutdown_report {
  const auto deadline = std::chrono::steady_clock::now() + o.connect_timeout;
  const bool quiet = o.quiet;
  o.quiet = true; // a task not reached is named once below, not logged while retried
  shutdown_report report =
      loom::detail::cluster_master(target, std::move(o)).shutdown_cluster(jobs, deadline);
  if (!quiet && !report.all_stopped()) {
    std::string line = "shutdown_cluster: " + std::to_string(report.unreachable.size()) +
                       " task(s) not reached, gone already or cut off (if one still runs, "
                       "stop it by hand): ";
    for (std::size_t i = 0; i < report.unreachable.size(); ++i)
      line += (i ? "; " : "") + report.unreachable[i];
    logging::warn(line);
  }
  return report;
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

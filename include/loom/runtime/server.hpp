// A task of a cluster (TF's tf.train.Server): serves at once, hosts the task's
// resource containers (its variables, shared by every session and client that
// reaches it), registers and runs graph partitions for masters, and moves
// tensors to the other tasks. join() returns when the cluster is shut down,
// which TF's never does.
//
//   loom::server ps(cluster, "ps", 0);   // serving now
//   ps.join();                          // until a client calls shutdown
//
// The serving itself (runtime/task_server.hpp: the message layer, the worker
// service) is the runtime's, compiled once per program (runtime/interfaces.hpp).
#pragma once

#include <loom/cluster/cluster_spec.hpp>
#include <loom/core/log.hpp>
#include <loom/runtime/interfaces.hpp>
#include <loom/runtime/resource_manager.hpp>

#include <memory>
#include <string>

namespace loom {

class server {
public:
  using transfer_counts = detail::server_interface::transfer_counts;

  // Serves task `task` of job `job` at its address in `cluster` at once.
  // Throws unavailable_error (the port is taken, the host cannot be bound),
  // not_found_error (no such job or task) or failed_precondition_error (an
  // address beyond loopback without a token), each naming the task.
  server(cluster_spec cluster, std::string job, int task, server_options o = {})
      : impl_(detail::runtime_factory::linked().server(
            std::move(cluster), names_log_lines(std::move(job), task), task, std::move(o))) {}

  // A single-task server on 127.0.0.1, port chosen by the OS, under job
  // "localhost" (TF's tf.train.Server.create_local_server()).
  static std::unique_ptr<server> create_local_server(server_options o = {}) {
    return std::make_unique<server>(cluster_spec{{"localhost", {"127.0.0.1:0"}}}, "localhost", 0,
                                    std::move(o));
  }

  // What a session connects to: "loom://host:port".
  std::string target() const { return impl_->target(); }
  const cluster_spec& cluster() const noexcept { return impl_->cluster(); }
  const std::string& job_name() const noexcept { return impl_->job_name(); }
  int task_index() const noexcept { return impl_->task_index(); }
  detail::resource_manager& resources() noexcept { return impl_->resources(); }

  // Graph partitions sessions have registered here and not deregistered.
  std::size_t registered_graphs() { return impl_->registered_graphs(); }

  // What this task received from other tasks' _sends: messages, and the
  // tensors (control edges included) in them. A step's sends to one task
  // travel as one message.
  transfer_counts received() const noexcept { return impl_->received(); }

  // Blocks until the cluster is shut down (a client's shutdown call) or
  // stop() is called, then stops serving. Shut down by a client, it answers
  // the calls in flight first (for at most 2 s), so that each caller learns
  // whether its call ran.
  void join() { impl_->join(); }

  // Stops serving: steps in flight fail, join() returns. Idempotent.
  void stop() { impl_->stop(); }

private:
  // The process's first server names its task on every log line (core/log.hpp), before
  // it binds: the lines of its start carry it too.
  static std::string names_log_lines(std::string job, int task) {
    logging::set_task_if_unset("/job:" + job + "/task:" + std::to_string(task));
    return job;
  }

  std::unique_ptr<detail::server_interface> impl_;
};

} // namespace loom

// Seed 004: "you could use a simpler implementation of replica_device_setter":
// the answer's simple_setter written as a user-defined placement policy (a
// lambda), then a policy composed from loom's building blocks: variables of
// more than --big_bytes bytes round-robin over the ps tasks, smaller ones on
// ps task 0, every other op on this worker. log_device_placement prints where
// each node went, and each model runs a training step. One binary runs as any
// task:
//
//   custom_placement --ps_hosts=H:P,H:P --worker_hosts=H:P --job_name=ps --task_index=0
//   custom_placement --ps_hosts=H:P,H:P --worker_hosts=H:P --job_name=ps --task_index=1
//   custom_placement --ps_hosts=H:P,H:P --worker_hosts=H:P --job_name=worker --task_index=0
//
// Worker task 0 (the chief) shuts the cluster down when it is done, so every
// task exits 0.
#include <loom/loom.hpp>

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>

namespace {

// A node predicate: a variable holding more than `bytes` bytes.
struct bigger_than {
  std::int64_t bytes;
  bool operator()(const loom::node_def& n) const {
    return loom::is_variable{}(n) &&
           n.shape.num_elements() * static_cast<std::int64_t>(loom::size_of(n.type)) > bytes;
  }
};

loom::cluster_session_options logged() {
  loom::cluster_session_options o;
  o.log_device_placement = true;
  o.placement_log = &std::cout;
  return o;
}

// Seed 004's simple_setter: variables on ps task 0, everything else on this
// worker. A lambda is a placement policy (operator()(node_def, device_spec)).
void simple_setter_model(const std::string& target, int task) {
  std::printf("== simple_setter\n");
  auto simple_setter = [task](const loom::node_def& n, const loom::device_spec&) {
    if (n.op == "variable")
      return loom::device_spec::from_string("/job:ps/task:0");
    return loom::device_spec::from_string("/job:worker/task:" + std::to_string(task));
  };
  loom::graph g;
  auto scope = g.device(simple_setter);
  auto w = loom::get_variable<float, 1>(g, "w", loom::shape{4}, loom::constant_initializer{0.5});
  auto b = loom::get_variable<float, 0>(g, "b", loom::shape{}, loom::constant_initializer{1});
  auto loss = loom::named(loom::reduce_sum(w * w) + b, "loss"); // 4 * 0.25 + 1 = 2
  auto train = loom::gradient_descent_optimizer(0.25).minimize(loss);

  loom::session sess(g, target, logged());
  sess.run(loom::global_variables_initializer(g));
  const float before = sess.run(loss);
  sess.run(train); // w -= 0.25 * 2w: 0.25; b -= 0.25
  const float after = sess.run(loss);
  std::printf("simple_setter: loss %.4f -> %.4f\n", static_cast<double>(before),
              static_cast<double>(after));
  std::fflush(stdout);
}

// Big variables round-robin over the ps tasks (replica_device_setter's
// strategy), small ones on ps task 0, other ops on this worker: first_match
// asks each policy in turn; `when` declines the nodes its predicate rejects.
void composed_model(const std::string& target, int task, int ps_tasks, std::int64_t big_bytes) {
  std::printf("== composed policy: variables over %lld bytes round-robin over %d ps tasks, "
              "smaller ones on ps task 0, other ops on worker %d\n",
              static_cast<long long>(big_bytes), ps_tasks, task);
  auto policy = loom::first_match{
      loom::when{bigger_than{big_bytes}, loom::replica_device_setter({.ps_tasks = ps_tasks})},
      loom::when{loom::is_variable{}, loom::pin{"/job:ps/task:0"}},
      loom::pin{"/job:worker/task:" + std::to_string(task)}};
  loom::graph g;
  auto scope = g.device(policy);
  auto global_step = loom::create_global_step(g); // 8 bytes: ps 0
  auto inputs = loom::constant(g, loom::tensor<float, 2>(loom::shape{4, 256}, 1.0f));
  using init = loom::constant_initializer;
  auto embedding = loom::get_variable<float, 2>(g, "embedding", loom::shape{256, 16},
                                                init{0.01}); // 16 KiB: ps 0 (round robin)
  auto softmax_w = loom::get_variable<float, 2>(g, "softmax_w", loom::shape{16, 10},
                                                init{0.5}); // 640 B: ps 1 (round robin)
  auto projection = loom::get_variable<float, 2>(g, "projection", loom::shape{16, 16},
                                                 init{0.1}); // 1 KiB: ps 0 (round robin)
  auto softmax_b =
      loom::get_variable<float, 1>(g, "softmax_b", loom::shape{10}, init{0.1}); // 40 B: small, ps 0
  auto hidden = loom::matmul(loom::matmul(inputs, embedding), projection);
  auto loss =
      loom::named(loom::reduce_sum(loom::xw_plus_b(hidden, softmax_w, softmax_b)) * 0.001f, "loss");
  auto train = loom::gradient_descent_optimizer(0.01).minimize(loss, global_step);

  loom::session sess(g, target, logged());
  sess.run(loom::global_variables_initializer(g));
  const float before = sess.run(loss);
  sess.run(train);
  auto [after, step] = sess.run(loom::fetches(loss, global_step));
  std::printf("composed: loss %.4f -> %.4f, global_step %lld\n", static_cast<double>(before),
              static_cast<double>(after.item()), static_cast<long long>(step.item()));
  std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) try {
  loom::flags flags("Seed 004: user-defined and composed placement policies on a cluster.");
  loom::define_cluster_flags(flags, {.ps_hosts = "127.0.0.1:2222,127.0.0.1:2223",
                                     .worker_hosts = "127.0.0.1:2224",
                                     .job_name = "worker"});
  flags.define_int("big_bytes", 512, "Variables larger than this are spread over the ps tasks");
  if (!flags.parse(argc, argv))
    return 0;

  const auto role = loom::resolve_cluster(flags).require_task();
  const auto& cluster = role.cluster;
  const std::string& job = role.job_name;
  const int task = role.task_index;
  loom::server server(cluster, job, task);
  if (job != "worker") {
    server.join();
    return 0;
  }
  if (!cluster.has_job("ps"))
    throw loom::invalid_argument_error("custom_placement needs a ps job (--ps_hosts)");
  simple_setter_model(server.target(), task);
  composed_model(server.target(), task, cluster.num_tasks("ps"), flags.get_int("big_bytes"));
  if (task == 0)
    loom::session::shutdown_cluster(server.target());
  return 0;
} catch (const loom::error& e) {
  std::cerr << "custom_placement: " << e.what() << "\n";
  return 1;
}

// The device a between-graph replica computes on, from the examples' --num_gpus (the form of
// TF's later examples: "/job:worker/task:%d/gpu:%d" % (task_index, task_index % num_gpus)).
// One copy, shared by examples/mnist_replica, examples/cnn and examples/ctr.
#pragma once

#include <loom/api.hpp>

#include <cstdint>
#include <string>

namespace loom::examples {

// [snippet:worker-device]
// `worker_task` ("/job:worker/task:i") itself without GPUs; its GPU i % num_gpus with them.
// A worker asked for more GPUs than its process has stops at once, saying so.
inline std::string worker_device(const std::string& worker_task, std::int64_t task_index,
                                 std::int64_t num_gpus) {
  if (num_gpus > loom::gpu_count())
    throw loom::invalid_argument_error(
        "--num_gpus=" + std::to_string(num_gpus) + " but this process has " +
        std::to_string(loom::gpu_count()) +
        " GPU(s): a build with CUDA (LOOM_ENABLE_CUDA) on a machine with GPUs is needed");
  return num_gpus > 0 ? worker_task + "/gpu:" + std::to_string(task_index % num_gpus) : worker_task;
}
// [snippet-end:worker-device]

} // namespace loom::examples

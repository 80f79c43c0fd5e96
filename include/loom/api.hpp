// Everything to build graphs and run them, locally or on a cluster, without
// instantiating the CPU kernels. A program made of several translation units
// includes this in all of them but one, and <loom/loom.hpp> (this plus the
// kernels) in that one: the kernels are registered once per program, and the
// other units compile in about a quarter of the time.
#pragma once

#include <loom/cluster/cluster.hpp>
#include <loom/core/device_spec.hpp>
#include <loom/core/dtype.hpp>
#include <loom/core/error.hpp>
#include <loom/core/flags.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/tensor.hpp>
#include <loom/core/version.hpp>
#include <loom/expr/expr.hpp>
#include <loom/graph/gradients.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/hash_embedding.hpp>
#include <loom/graph/layers/layers.hpp>
#include <loom/graph/lower.hpp>
#include <loom/graph/metrics.hpp>
#include <loom/graph/ops/array.hpp>
#include <loom/graph/ops/batch_matmul.hpp>
#include <loom/graph/ops/batch_norm.hpp>
#include <loom/graph/ops/checkpoint.hpp>
#include <loom/graph/ops/conv.hpp>
#include <loom/graph/ops/depthwise_conv.hpp>
#include <loom/graph/ops/elementwise.hpp>
#include <loom/graph/ops/embedding_lookup.hpp>
#include <loom/graph/ops/gather_nd.hpp>
#include <loom/graph/ops/iterator.hpp>
#include <loom/graph/ops/math.hpp>
#include <loom/graph/ops/matmul.hpp>
#include <loom/graph/ops/nn.hpp>
#include <loom/graph/ops/one_hot.hpp>
#include <loom/graph/ops/range.hpp>
#include <loom/graph/ops/scatter.hpp>
#include <loom/graph/ops/stack_split.hpp>
#include <loom/graph/ops/strided.hpp>
#include <loom/graph/ops/string.hpp>
#include <loom/graph/ops/summary.hpp>
#include <loom/graph/ops/top_k.hpp>
#include <loom/graph/output.hpp>
#include <loom/graph/partitioned_variable.hpp>
#include <loom/graph/sparse_tensor.hpp>
#include <loom/graph/variables.hpp>
#include <loom/kernels/fused.hpp>
#include <loom/kernels/gpu_backend.hpp>
#include <loom/placement/placement.hpp>
#include <loom/runtime/server.hpp>
#include <loom/runtime/session.hpp>
#include <loom/runtime/timeline.hpp>
#include <loom/train/train.hpp>

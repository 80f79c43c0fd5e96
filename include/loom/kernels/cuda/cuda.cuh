// Every GPU kernel of the op registry, registered under (op id, dtype, "GPU")
// when a translation unit compiled by nvcc includes this, together with the
// CUDA backend that runs them (one unit per program is enough).
//
// Not here, and CPU-only by design: the blocking synchronous-replica ops of
// kernels/cpu/sync.hpp (accumulate_gradient, take_gradient, close_accumulator,
// counter_raise/add/wait). They wait on host condition variables for other
// steps and keep their state in host resources, as TF's accumulators live on
// the CPU; is_variable_initialized, which does not wait, has a GPU kernel
// (state.cuh). Strings never live on a GPU, so no kernel here takes them.
//
// The kernels that take ids (ids.cuh) include CUB, whose libcu++ declares a
// global namespace `cuda` (cuda::std) that nvcc's generated stubs name
// unqualified: a unit that includes this header must not say `using namespace
// loom;` at global or unnamed-namespace scope (loom::cuda would make that name
// ambiguous); inside a named namespace it may, and names loom's `loom::cuda`.
#pragma once

#include <loom/kernels/cuda/array.cuh>
#include <loom/kernels/cuda/backend.hpp>
#include <loom/kernels/cuda/batch_matmul.cuh>
#include <loom/kernels/cuda/batch_norm.cuh>
#include <loom/kernels/cuda/conv.cuh>
#include <loom/kernels/cuda/depthwise_conv.cuh>
#include <loom/kernels/cuda/elementwise.cuh>
#include <loom/kernels/cuda/gather_nd.cuh>
#include <loom/kernels/cuda/math.cuh>
#include <loom/kernels/cuda/nn.cuh>
#include <loom/kernels/cuda/one_hot.cuh>
#include <loom/kernels/cuda/random.cuh>
#include <loom/kernels/cuda/range.cuh>
#include <loom/kernels/cuda/scatter.cuh>
#include <loom/kernels/cuda/state.cuh>
#include <loom/kernels/cuda/strided.cuh>
#include <loom/kernels/cuda/top_k.cuh>
#include <loom/kernels/cuda/training.cuh>

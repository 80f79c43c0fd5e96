// Everything a training program needs.
#pragma once

#include <loom/core/device_spec.hpp>
#include <loom/core/dtype.hpp>
#include <loom/core/error.hpp>
#include <loom/core/flags.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/tensor.hpp>
#include <loom/expr/eval.hpp>
#include <loom/expr/expr.hpp>
#include <loom/graph/gradients.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/lower.hpp>
#include <loom/graph/ops/elementwise.hpp>
#include <loom/graph/ops/math.hpp>
#include <loom/graph/ops/nn.hpp>
#include <loom/graph/output.hpp>
#include <loom/graph/variables.hpp>
#include <loom/kernels/cpu/elementwise.hpp>
#include <loom/kernels/cpu/math.hpp>
#include <loom/kernels/cpu/nn.hpp>
#include <loom/kernels/cpu/random.hpp>
#include <loom/kernels/cpu/state.hpp>
#include <loom/runtime/session.hpp>
#include <loom/train/train.hpp>

// A fixture of the layer check's own test: graph/ includes no CUDA kernels (the
// include graph/lower.hpp had before issue #18).
#pragma once

#include <loom/graph/graph.hpp>
#include <loom/kernels/cuda/fused.cuh>

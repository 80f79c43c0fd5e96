// A fixture of the layer check's own test: a layer above the kernels reaches
// the GPU through kernels/gpu_backend.hpp, never kernels/cuda/.
#pragma once

#include <loom/kernels/cuda/backend.hpp>
#include <loom/kernels/gpu_backend.hpp>

// The one translation unit that instantiates loom's GPU kernels and the CUDA
// backend (CMake target loom_cuda_kernels): including the header registers
// them before main().
#include <loom/kernels/cuda/cuda.cuh>

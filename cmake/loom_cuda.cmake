# How loom's CUDA parts are compiled, for the build tree (CMakeLists.txt) and for
# installed consumers (loomConfig.cmake) alike. Needs the CUDA language enabled and
# CUDA::cudart / CUDA::cublas (find_package(CUDAToolkit)).
#
#   loom_cuda_target(<target>)          how every loom target with CUDA sources compiles
#   loom_add_cuda_kernels(<source>)     defines loom::cuda_kernels (loom_cuda_kernels.cu)

# C++20 for nvcc: CMake < 3.26 has no C++20 flag for NVIDIA's compiler (nvcc >= 12
# takes -std=c++20).
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()

# loom_cuda_target(<target>): not by linking loom::loom: its cxx_std_20 feature has no
# nvcc mapping in CMake < 3.26, so the target gets loom's include directories,
# definitions and options (the host compiler's -march) here and links the rest itself.
# The flags are for Eigen's headers under nvcc: constexpr host functions called from its
# host-device ones; diagnostics of its own (20011/20014: its __host__ __device__ executor
# calls host-only evaluators, which the CPU's fused kernels instantiate; they run on the
# host only); its pragmas meant for nvcc's front end. -Wno-restrict: g++ 12's false
# -Wrestrict on std::string concatenation at -O3 (GCC bug 105329), which nvcc's host pass
# trips over. The shared runtime, as CUDA::cudart (CMake would add the static one as
# well). Warnings are errors where LOOM_WARNINGS_AS_ERRORS is on (loom's own build).
function(loom_cuda_target target)
  target_include_directories(${target} PRIVATE
    $<TARGET_PROPERTY:loom::loom,INTERFACE_INCLUDE_DIRECTORIES>)
  target_compile_definitions(${target} PRIVATE
    $<TARGET_PROPERTY:loom::loom,INTERFACE_COMPILE_DEFINITIONS>)
  target_compile_options(${target} PRIVATE
    $<TARGET_PROPERTY:loom::loom,INTERFACE_COMPILE_OPTIONS>)
  set_target_properties(${target} PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON
                                             CUDA_EXTENSIONS OFF CUDA_RUNTIME_LIBRARY Shared)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -diag-suppress=20011,20012,20014,2908
                               -Xcompiler=-Wall,-Wextra,-Wno-unknown-pragmas,-Wno-restrict>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${LOOM_WARNINGS_AS_ERRORS}>>:-Werror=all-warnings>)
endfunction()

# loom::cuda_kernels: the registry's GPU kernels and the CUDA backend
# (include/loom/kernels/cuda/cuda.cuh), compiled once by nvcc. A program links it to
# have GPUs: its objects register the kernels and the backend before main(); a program
# without it places nothing on a GPU. A program that links it links loom::kernels too (the
# CPU's kernels, every op's fallback), so its unit is compiled as a program's
# (LOOM_COMPILED_KERNELS): the graph code and op registrations it includes are compiled
# once, in loom::kernels' unit, not again by nvcc's host pass (48 -> 37 CPU-s at -O3).
# loom's presets give that pass -O2, as the C++ units (CMAKE_CUDA_FLAGS_RELEASE): nvcc's -O is
# the host compiler's level only (the device code's is ptxas's own), and -O3 took the unit's
# host pass from 34 to 46 CPU-s (docs/benchmarks.md, "Compiler and allocator settings").
function(loom_add_cuda_kernels source)
  if(TARGET loom_cuda_kernels)
    return()
  endif()
  add_library(loom_cuda_kernels OBJECT "${source}")
  loom_cuda_target(loom_cuda_kernels)
  target_compile_definitions(loom_cuda_kernels PRIVATE LOOM_COMPILED_KERNELS)
  target_include_directories(loom_cuda_kernels PUBLIC
    $<TARGET_PROPERTY:loom::loom,INTERFACE_INCLUDE_DIRECTORIES>)
  target_link_libraries(loom_cuda_kernels PUBLIC Eigen3::Eigen Threads::Threads CUDA::cudart
                                                 CUDA::cublas)
  add_library(loom::cuda_kernels ALIAS loom_cuda_kernels)
endfunction()

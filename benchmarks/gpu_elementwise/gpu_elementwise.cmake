# gpu_elementwise (main.cu): included from benchmarks/CMakeLists.txt when LOOM_HAS_CUDA,
# so the executable lands in build/benchmarks/ with the others and `make bench` runs it.
# Not loom_add_benchmark: linking loom::loom would carry its cxx_std_20 feature, which
# CMake < 3.26 cannot map to nvcc; loom/cuda needs only loom's include directory.
add_executable(gpu_elementwise "${CMAKE_CURRENT_LIST_DIR}/main.cu")
target_include_directories(gpu_elementwise PRIVATE "${PROJECT_SOURCE_DIR}/include")
target_link_libraries(gpu_elementwise PRIVATE CUDA::cudart)
# C++20 for nvcc. CMake < 3.26 has no C++20 flag for NVIDIA's compiler (nvcc >= 12
# takes -std=c++20); define it for this directory.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
# The shared runtime, as CUDA::cudart (CMake would add the static one as well).
set_target_properties(gpu_elementwise PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON
                                                 CUDA_EXTENSIONS OFF CUDA_RUNTIME_LIBRARY Shared)
target_compile_options(gpu_elementwise PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>
  $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${LOOM_WARNINGS_AS_ERRORS}>>:-Werror=all-warnings>)

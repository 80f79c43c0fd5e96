# gpu_elementwise (main.cu): included from benchmarks/CMakeLists.txt when LOOM_HAS_CUDA,
# so the executable lands in build/benchmarks/ with the others and `make bench` runs it.
# Not loom_add_benchmark: loom::loom cannot reach nvcc (loom_cuda_target, top-level
# CMakeLists.txt); loom/cuda needs only loom's include directory.
add_executable(gpu_elementwise "${CMAKE_CURRENT_LIST_DIR}/main.cu")
loom_cuda_target(gpu_elementwise)
target_link_libraries(gpu_elementwise PRIVATE CUDA::cudart)

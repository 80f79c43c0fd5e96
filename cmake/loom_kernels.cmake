# loom_add_kernels(<source>): defines loom::kernels, the OBJECT library that compiles
# every CPU kernel of loom's op registry once (<source> is loom_kernels.cpp), for the
# build tree (CMakeLists.txt) and for installed consumers (loomConfig.cmake) alike.
#
# An OBJECT library, not a static one: nothing references a kernel's registration by
# name, so a linker would drop it from an archive. Its objects are linked into each
# target that links loom::kernels directly. LOOM_COMPILED_KERNELS goes to those targets
# only (INTERFACE), never to the kernels' own unit, and makes their <loom/loom.hpp> the
# API alone.
function(loom_add_kernels source)
  if(TARGET loom_kernels)
    return()
  endif()
  add_library(loom_kernels OBJECT "${source}")
  target_link_libraries(loom_kernels PUBLIC loom::loom)
  # g++ at -O2 vectorizes a loop only where that needs no check at run time (its "very
  # cheap" cost model): not over a count known only then, which is most of a kernel's
  # loops (a shard's slots, a batch's ids, rows of a runtime width). The dynamic model, as
  # at -O3, vectorizes them with a check and a scalar tail: examples/ctr -3.9 % CPU (4 of 4
  # alternated rounds; +6.6 % examples/s with it on every target), for +1.6 % of this unit's
  # compile time (docs/benchmarks.md, "Compiler and allocator settings"). clang's -O2
  # vectorizes so already.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(loom_kernels PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fvect-cost-model=dynamic>)
  endif()
  target_compile_definitions(loom_kernels INTERFACE LOOM_COMPILED_KERNELS)
  add_library(loom::kernels ALIAS loom_kernels)
  _loom_link_allocator(loom_kernels)
  _loom_link_dnnl(loom_kernels)
endfunction()

# oneDNN (Debian: libdnnl-dev), the CPU's float convolution (kernels/cpu/dnnl.hpp): conv2d and
# its backprops 6-7x faster than im2col plus Eigen's GEMM on examples/cnn's shapes
# (docs/dependencies.md). Where it is found (LOOM_USE_DNNL, ON by default), loom::kernels'
# unit and the programs that link it are compiled with LOOM_HAVE_DNNL and linked with
# -ldnnl and, for the OpenMP runtime Debian builds it with, the OpenMP library (loom sets
# oneDNN's team size on the calling thread: omp_set_num_threads). Elsewhere the kernels are
# im2col's, with a message. LOOM_DNNL_LIBRARIES (cached) is what a target linking
# loom_kernels' objects by hand links too.
function(_loom_link_dnnl target)
  option(LOOM_USE_DNNL "Use oneDNN as the CPU's float convolution where it is found" ON)
  set(LOOM_HAVE_DNNL OFF CACHE INTERNAL "")
  set(LOOM_DNNL_LIBRARIES "" CACHE INTERNAL "")
  if(NOT LOOM_USE_DNNL)
    message(STATUS "loom: LOOM_USE_DNNL is OFF; the CPU's convolutions are im2col plus GEMM")
    return()
  endif()
  find_path(LOOM_DNNL_INCLUDE_DIR NAMES oneapi/dnnl/dnnl.hpp
            DOC "Directory holding oneDNN's oneapi/dnnl/dnnl.hpp")
  find_library(LOOM_DNNL_LIBRARY NAMES dnnl DOC "oneDNN's library")
  if(NOT LOOM_DNNL_INCLUDE_DIR OR NOT LOOM_DNNL_LIBRARY)
    message(STATUS "loom: oneDNN was not found (Debian: libdnnl-dev); the CPU's convolutions "
                   "are im2col plus GEMM (examples/cnn's 6-7x slower)")
    return()
  endif()
  set(libraries "${LOOM_DNNL_LIBRARY}")
  file(STRINGS "${LOOM_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_config.h" omp
       REGEX "^#define DNNL_CPU_THREADING_RUNTIME DNNL_RUNTIME_OMP")
  if(omp)
    # libgomp, the OpenMP runtime g++ (and Debian's oneDNN) uses; clang's driver finds it in
    # the same GCC installation.
    list(APPEND libraries gomp)
  endif()
  target_compile_definitions(${target} PUBLIC LOOM_HAVE_DNNL)
  if(NOT LOOM_DNNL_INCLUDE_DIR IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
    target_include_directories(${target} SYSTEM PUBLIC "${LOOM_DNNL_INCLUDE_DIR}")
  endif()
  target_link_libraries(${target} PUBLIC ${libraries})
  set(LOOM_HAVE_DNNL ON CACHE INTERNAL "")
  set(LOOM_DNNL_LIBRARIES "${libraries}" CACHE INTERNAL "")
  message(STATUS "loom: the CPU's float convolutions are oneDNN's (${LOOM_DNNL_LIBRARY})")
endfunction()

# LOOM_MALLOC: the allocator of every program that links loom::kernels (a program that
# runs loom's kernels). "jemalloc" (the default): jemalloc's static archive where it is
# found (Debian: libjemalloc-dev), else the system's with a message; "system": glibc's.
# A step allocates and frees thousands of small blocks on several threads (outputs,
# messages, the executor's state); with glibc's malloc, malloc and free were 6-8 % of each
# examples/ctr task's samples (malloc_consolidate, unlink_chunk), and jemalloc gave it +4.8 %
# examples/s at -2.6 % CPU (docs/benchmarks.md, "Compiler and allocator settings"). TF's CPU
# performance guides preload tcmalloc or jemalloc for the same reason. Static, so that a
# program runs where libjemalloc.so is not installed (the GPU machine); its malloc and free
# then serve the whole process, libstdc++'s operator new included. Never under a
# sanitizer, which brings its own allocator.
function(_loom_link_allocator target)
  set(LOOM_MALLOC "jemalloc" CACHE STRING
      "The allocator of programs that link loom::kernels: jemalloc or system")
  set_property(CACHE LOOM_MALLOC PROPERTY STRINGS jemalloc system)
  if(NOT LOOM_MALLOC MATCHES "^(jemalloc|system)$")
    message(FATAL_ERROR "loom: LOOM_MALLOC is '${LOOM_MALLOC}'; it takes jemalloc or system")
  endif()
  if(LOOM_MALLOC STREQUAL "system")
    return()
  endif()
  if(CMAKE_CXX_FLAGS MATCHES "-fsanitize=(address|memory|thread)")
    message(STATUS "loom: programs use the sanitizer's allocator (CMAKE_CXX_FLAGS: -fsanitize)")
    return()
  endif()
  find_library(LOOM_JEMALLOC_LIBRARY NAMES libjemalloc.a jemalloc
               DOC "jemalloc's library (LOOM_MALLOC=jemalloc)")
  if(NOT LOOM_JEMALLOC_LIBRARY)
    message(STATUS "loom: jemalloc was not found (Debian: libjemalloc-dev); programs use the "
                   "system allocator (examples/ctr: about 5 % fewer examples/s)")
    return()
  endif()
  find_package(Threads REQUIRED)
  target_link_libraries(${target} INTERFACE "${LOOM_JEMALLOC_LIBRARY}" Threads::Threads
                        ${CMAKE_DL_LIBS} m)
  target_compile_definitions(${target} INTERFACE LOOM_MALLOC_JEMALLOC)
  message(STATUS "loom: programs that link loom::kernels allocate with jemalloc "
                 "(${LOOM_JEMALLOC_LIBRARY}; -DLOOM_MALLOC=system for glibc's)")
endfunction()

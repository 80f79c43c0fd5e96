# The layer check (docs/architecture.md, its table of layers): every header under
# include/loom/<layer>/ includes only loom headers of the layers it may. Run by ctest
# (tests/CMakeLists.txt, test "layers"), so `make test` fails on a forbidden include with
# the file, the line and the rule:
#
#   cmake -DINCLUDE_DIR=<dir holding loom/> -P cmake/check_layers.cmake
#
# The layers, lowest first. A layer may include itself and those before it, except where
# its row narrows that: net/ knows nothing of graphs (DESIGN §1), and data/ reads files
# into tensors. data/ comes right after core/ so that the iterator's op and kernel
# (graph/ops/iterator.hpp, kernels/cpu/iterator.hpp) wrap a dataset, as every other op wraps
# its library (DESIGN §6c). kernels/cuda/ (CUDA code, compiled by nvcc) is included only from
# kernels/; the layers below reach GPU kernels through customization points
# (graph/lower.hpp's detail::register_fused_kernels) and the GPU backend interface
# (kernels/gpu_backend.hpp). api.hpp and loom.hpp, at the top, may include anything.
cmake_minimum_required(VERSION 3.20)

if(NOT DEFINED INCLUDE_DIR)
  message(FATAL_ERROR "check_layers: pass -DINCLUDE_DIR=<the directory that holds loom/>")
endif()
get_filename_component(INCLUDE_DIR "${INCLUDE_DIR}" ABSOLUTE)

set(order core data expr graph placement kernels cluster net runtime train)
set(narrowed_net core cluster net)
set(narrowed_data core data)

# allowed_<layer>: the layers a header of <layer> may include.
set(before "")
foreach(layer IN LISTS order)
  list(APPEND before ${layer})
  if(DEFINED narrowed_${layer})
    set(allowed_${layer} ${narrowed_${layer}})
  else()
    set(allowed_${layer} ${before})
  endif()
endforeach()

file(GLOB_RECURSE headers RELATIVE "${INCLUDE_DIR}" "${INCLUDE_DIR}/loom/*.hpp"
     "${INCLUDE_DIR}/loom/*.cuh")
list(SORT headers)
if(NOT headers)
  message(FATAL_ERROR "check_layers: no headers under ${INCLUDE_DIR}/loom")
endif()

set(violations 0)
foreach(header IN LISTS headers)
  if(NOT header MATCHES "^loom/([a-z_]+)/")
    continue() # loom/api.hpp, loom/loom.hpp: the top, which includes every layer
  endif()
  set(layer "${CMAKE_MATCH_1}")
  if(NOT layer IN_LIST order)
    message(NOTICE "${INCLUDE_DIR}/${header}: '${layer}/' is no layer of the table in "
                       "cmake/check_layers.cmake (add it there and to docs/architecture.md)")
    math(EXPR violations "${violations} + 1")
    continue()
  endif()
  file(STRINGS "${INCLUDE_DIR}/${header}" lines)
  set(number 0)
  foreach(line IN LISTS lines)
    math(EXPR number "${number} + 1")
    if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*[<\"]loom/([a-z_]+)(/[^>\"]*)?[>\"]")
      continue()
    endif()
    set(target "${CMAKE_MATCH_1}")
    set(rest "${CMAKE_MATCH_2}")
    if(rest STREQUAL "")
      set(why "a header of ${layer}/ includes the top (loom/${target}), which includes every layer")
    elseif(NOT target IN_LIST allowed_${layer})
      string(REPLACE ";" ", " may "${allowed_${layer}}")
      set(why "${layer}/ may include only ${may}; not ${target}/")
    elseif(rest MATCHES "^/cuda/" AND target STREQUAL "kernels" AND NOT layer STREQUAL "kernels")
      set(why "kernels/cuda/ is included only from kernels/ (CUDA code; reach it through "
              "kernels/gpu_backend.hpp or a customization point)")
    else()
      continue()
    endif()
    string(STRIP "${line}" shown)
    message(NOTICE "${INCLUDE_DIR}/${header}:${number}: ${shown}: ${why}")
    math(EXPR violations "${violations} + 1")
  endforeach()
endforeach()

list(LENGTH headers count)
if(violations GREATER 0)
  message(FATAL_ERROR "check_layers: ${violations} forbidden include(s) in ${count} headers")
endif()
message(STATUS "check_layers: ${count} headers, every include within its layer's rule")

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
  target_compile_definitions(loom_kernels INTERFACE LOOM_COMPILED_KERNELS)
  add_library(loom::kernels ALIAS loom_kernels)
endfunction()

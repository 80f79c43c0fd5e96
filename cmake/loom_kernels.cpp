// The one translation unit that instantiates loom's CPU kernels (CMake target
// loom::kernels): including the header registers every kernel before main().
// A program that links this target gets LOOM_COMPILED_KERNELS, so its own units'
// <loom/loom.hpp> is the API alone (<loom/api.hpp>) and compiles in seconds.
#include <loom/kernels/cpu/cpu.hpp>

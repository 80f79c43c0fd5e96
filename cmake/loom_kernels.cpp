// The one translation unit that compiles loom's CPU kernels and its runtime
// (the executor, the masters, the task server) for a program (CMake target
// loom::kernels): including the headers registers the kernels and the runtime
// before main(). A program that links this target gets LOOM_COMPILED_KERNELS,
// so its own units' <loom/loom.hpp> is the API alone and compiles in seconds.
// Before any include: this unit defines, once for the program, what the headers
// declare LOOM_COMPILED_ONCE for the program's other units (core/compiled_once.hpp).
#define LOOM_KERNELS_UNIT
#include <loom/api.hpp> // every op's registration (graph/op_registry.hpp)
#include <loom/kernels/cpu/cpu.hpp>
#include <loom/runtime/linked_runtime.hpp>

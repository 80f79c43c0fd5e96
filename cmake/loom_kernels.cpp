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

#ifdef LOOM_MALLOC_JEMALLOC
// jemalloc's settings for the program (cmake/loom_kernels.cmake links it): it reads this
// symbol when it starts, and the MALLOC_CONF environment variable overrides what is set
// here. thp:always marks its memory for transparent huge pages, which Debian's default
// ("madvise") grants only to memory so marked: a ps's gathers and sparse updates touch
// random rows of tables of hundreds of MB, and with 4 KiB pages nearly every row was a
// TLB miss beside its cache miss (a page walk, longer in a virtual machine).
// examples/ctr: +6.5 % examples/s (docs/benchmarks.md, "#23, stop 32"); the cost is
// resident memory in 2 MiB steps (a small ps: 25 MB instead of 12).
extern "C" {
const char* malloc_conf = "thp:always";
}
#endif

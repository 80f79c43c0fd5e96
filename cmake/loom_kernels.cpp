// The one translation unit that compiles loom's CPU kernels and its runtime
// (the executor, the masters, the task server) for a program (CMake target
// loom::kernels): including the headers registers the kernels and the runtime
// before main(). A program that links this target gets LOOM_COMPILED_KERNELS,
// so its own units' <loom/loom.hpp> is the API alone: declarations and templates.
// Before any include: this unit defines, once for the program, what the headers
// declare LOOM_COMPILED_ONCE for the program's other units (core/compiled_once.hpp),
// so it includes every header that has such definitions (tools/check_compiled_once.py).
#define LOOM_KERNELS_UNIT
#include <loom/api.hpp> // every op's registration (graph/op_registry.hpp)
#include <loom/data/batcher.hpp>
#include <loom/data/mnist.hpp>
#include <loom/data/pipeline.hpp>
#include <loom/data/random.hpp>
#include <loom/data/tfrecord_writer.hpp>
#include <loom/kernels/cpu/cpu.hpp>
#include <loom/runtime/linked_runtime.hpp>

// Everything a training program needs: the API (<loom/api.hpp>), and the CPU
// kernels and the runtime that runs graphs (the executor, the masters, the
// task server: runtime/linked_runtime.hpp).
//
// Built with CMake, a program links loom::kernels, which compiles the kernels
// and the runtime once per build and defines LOOM_COMPILED_KERNELS for the
// program's units: this header is then the API alone. Built by hand (one g++
// command, no library), it compiles them itself: a program of several units
// includes it in one of them and <loom/api.hpp> in the others.
#pragma once

#include <loom/api.hpp>
#ifndef LOOM_COMPILED_KERNELS
#include <loom/kernels/cpu/cpu.hpp>
#include <loom/runtime/linked_runtime.hpp>
#endif

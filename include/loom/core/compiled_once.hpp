// Functions compiled once per program: what a program's units need not compile.
//
// loom is header-only, so every unit that includes a header compiles its inline
// functions, and with them every template their bodies use, whether the unit
// calls them or not (a template used in a non-template body is instantiated
// where the body is). A function that is heavy to compile and that a program
// calls from one place, if at all (the TF_CONFIG parser: RapidJSON's templates),
// is declared LOOM_COMPILED_ONCE and defined under LOOM_COMPILED_ONCE_DEFINITIONS.
// A unit sees it one of three ways:
//   - header-only (neither macro below): defined inline in every unit, as ever;
//   - a program's unit that links loom::kernels (LOOM_COMPILED_KERNELS, which that
//     CMake target gives its users): declared only, so the unit neither parses its
//     body nor instantiates what the body uses;
//   - loom::kernels' own unit (cmake/loom_kernels.cpp defines LOOM_KERNELS_UNIT
//     before any include): defined once, with external linkage, for the program.
// The same split as the kernels' and the op registrations' (op_registry.hpp), and
// as Asio's separate compilation (ASIO_DECL) or spdlog's compiled library.
#pragma once

#if defined(LOOM_KERNELS_UNIT) && defined(LOOM_COMPILED_KERNELS)
#error                                                                                             \
    "LOOM_KERNELS_UNIT (loom::kernels' own unit) and LOOM_COMPILED_KERNELS (its users) exclude each other"
#endif

#if defined(LOOM_KERNELS_UNIT)
#define LOOM_COMPILED_ONCE
#define LOOM_COMPILED_ONCE_DEFINITIONS 1
#elif defined(LOOM_COMPILED_KERNELS)
#define LOOM_COMPILED_ONCE
#define LOOM_COMPILED_ONCE_DEFINITIONS 0
#else
#define LOOM_COMPILED_ONCE inline
#define LOOM_COMPILED_ONCE_DEFINITIONS 1
#endif

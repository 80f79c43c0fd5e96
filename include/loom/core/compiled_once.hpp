// Functions compiled once per program: what a program's units need not compile.
//
// loom is header-only, so every unit that includes a header compiles its inline
// functions, and with them every template their bodies use, whether the unit
// calls them or not (a template used in a non-template body is instantiated
// where the body is). So the library's non-template functions of any size (the
// saver, the graph's add_node, the connection, the TF_CONFIG parser with
// RapidJSON's templates, ...) are declared LOOM_COMPILED_ONCE, in their class or
// namespace, and defined at the end of their header under
// LOOM_COMPILED_ONCE_DEFINITIONS. Small ones (accessors, a tensor's element
// pointer) stay inline where they are, for the caller's inliner, and so do those a
// loop calls per field or per element (the protobuf reader, tf.Example parsing's
// steps): g++ -O2 inlines a function not declared inline only when it is tiny,
// even within loom::kernels' unit, and out of line they halved input_pipeline's
// records/s. A step that only compiled-once functions call is declared inline and
// defined with them: no program unit calls it, so none needs its body. A unit sees
// a compiled-once function one of three ways:
//   - header-only (neither macro below): defined inline in every unit, as ever;
//   - a program's unit that links loom::kernels (LOOM_COMPILED_KERNELS, which that
//     CMake target gives its users): declared only, so the unit neither parses its
//     body nor instantiates what the body uses (examples/ctr's unit: 80 -> 47 s of
//     g++ at -O2, half the code);
//   - loom::kernels' own unit (cmake/loom_kernels.cpp defines LOOM_KERNELS_UNIT
//     before any include): defined once, with external linkage, for the program.
//     That unit includes every header with such definitions
//     (tools/check_compiled_once.py checks it in `make test`).
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

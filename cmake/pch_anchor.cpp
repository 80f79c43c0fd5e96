// The unit that builds a precompiled <loom/api.hpp> (loom_program_pch in CMakeLists.txt,
// loom_test_pch in tests/CMakeLists.txt): the programs reuse it; it has nothing of its own.

// The one doctest main shared by every test binary (built once as an OBJECT
// library). It also registers every CPU kernel, once, so the test units
// include <loom/api.hpp> and compile in a quarter of the time.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <loom/kernels/cpu/cpu.hpp>

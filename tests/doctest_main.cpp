// The one doctest main shared by every test binary (built once as an OBJECT
// library). The CPU kernels come from loom::kernels, which every test links.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

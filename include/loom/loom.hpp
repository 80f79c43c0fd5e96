// Everything a training program needs: the API (<loom/api.hpp>) and the CPU
// kernels. A program of several translation units includes this in one of
// them and <loom/api.hpp> in the others.
#pragma once

#include <loom/api.hpp>
#include <loom/kernels/cpu/cpu.hpp>

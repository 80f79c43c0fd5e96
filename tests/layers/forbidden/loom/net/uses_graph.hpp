// A fixture of the layer check's own test: net/ knows nothing of graphs.
#pragma once

#include <loom/graph/graph.hpp>

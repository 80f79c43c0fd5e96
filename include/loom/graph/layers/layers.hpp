// loom::layers, TF 1.x's tf.layers: every layer header.
#pragma once

#include <loom/graph/layers/convolutional.hpp>
#include <loom/graph/layers/core.hpp>
#include <loom/graph/layers/layer.hpp>
#include <loom/graph/layers/normalization.hpp>

// Every CPU kernel of the op registry, registered under (op id, dtype, "CPU")
// when a translation unit includes this. One unit per program is enough.
#pragma once

#include <loom/kernels/cpu/array.hpp>
#include <loom/kernels/cpu/batch_matmul.hpp>
#include <loom/kernels/cpu/batch_norm.hpp>
#include <loom/kernels/cpu/checkpoint.hpp>
#include <loom/kernels/cpu/conv.hpp>
#include <loom/kernels/cpu/depthwise_conv.hpp>
#include <loom/kernels/cpu/elementwise.hpp>
#include <loom/kernels/cpu/exact_auc.hpp>
#include <loom/kernels/cpu/gather_nd.hpp>
#include <loom/kernels/cpu/hash_embedding.hpp>
#include <loom/kernels/cpu/iterator.hpp>
#include <loom/kernels/cpu/math.hpp>
#include <loom/kernels/cpu/nn.hpp>
#include <loom/kernels/cpu/one_hot.hpp>
#include <loom/kernels/cpu/random.hpp>
#include <loom/kernels/cpu/range.hpp>
#include <loom/kernels/cpu/scatter.hpp>
#include <loom/kernels/cpu/state.hpp>
#include <loom/kernels/cpu/strided.hpp>
#include <loom/kernels/cpu/string.hpp>
#include <loom/kernels/cpu/summary.hpp>
#include <loom/kernels/cpu/sync.hpp>
#include <loom/kernels/cpu/top_k.hpp>
#include <loom/kernels/cpu/training.hpp>

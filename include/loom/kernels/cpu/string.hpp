// CPU kernels of the string ops (graph/ops/string.hpp). The hash is
// core/fingerprint.hpp's, the one the input pipeline uses too.
#pragma once

#include <loom/core/fingerprint.hpp>
#include <loom/graph/ops/string.hpp>
#include <loom/kernels/registry.hpp>

#include <cstdint>

namespace loom::kernels {

template <class T> struct string_to_hash_bucket_fast_cpu {
  static void run(kernel_context& c) {
    c.output = string_to_hash_bucket_fast(c.input(0), c.node.attr<std::int64_t>("num_buckets"));
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_string_kernels() {
  register_kernels<string_to_hash_bucket_fast_cpu>("string_to_hash_bucket_fast",
                                                   type_list<std::string>{});
  return true;
}

inline const bool string_kernels_registered = register_string_kernels();
#endif

} // namespace loom::kernels

// Op definitions of the string ops that turn features into ids (TF's
// string_ops): string_to_hash_bucket_fast. Kernels are in kernels/cpu/string.hpp.
#pragma once

#include <loom/graph/builder.hpp>
#include <loom/graph/op_registry.hpp>
#include <loom/graph/output.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace loom::detail {

// The registration, its shape functions and gradients: once per program where it
// links loom::kernels, in that library's unit only (op_registry.hpp says why).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_string_ops() {
  auto& r = op_registry::instance();
  // Input: strings of any shape; attr num_buckets >= 1. Output: int64 of the
  // same shape, Fingerprint64(s) % num_buckets.
  r.add({.name = "string_to_hash_bucket_fast",
         .num_inputs = 1,
         .infer = [](node_def& n, const std::vector<const node_def*>& in) {
           if (in[0]->type != dtype::string)
             throw invalid_argument_error("node " + n.describe() + ": hashes strings, not " +
                                          std::string(to_string(in[0]->type)) + " " +
                                          in[0]->describe());
           if (n.attr<std::int64_t>("num_buckets") < 1)
             throw invalid_argument_error("node " + n.describe() + ": num_buckets is " +
                                          std::to_string(n.attr<std::int64_t>("num_buckets")) +
                                          "; it must be 1 or more");
           n.type = dtype::i64;
           n.shape = in[0]->shape;
         }});
  return true;
}

inline const bool string_ops_registered = register_string_ops();
#endif

} // namespace loom::detail

namespace loom {

// Each string's bucket in [0, num_buckets) (tf.strings.to_hash_bucket_fast):
// FarmHash's Fingerprint64 of its bytes modulo num_buckets, the function TF
// uses, so a feature hashed by loom lands in the bucket TF gives it and a
// model's tables can be shared. Fast, not keyed: inputs an adversary chooses
// can all fall in one bucket.
template <expression E>
output<std::int64_t, rank_of<E>> string_to_hash_bucket_fast(const E& strings,
                                                            std::int64_t num_buckets) {
  static_assert(std::is_same_v<value_type_of<E>, std::string>,
                "loom::string_to_hash_bucket_fast: hashes string tensors");
  auto s = lower(strings);
  graph g = s.graph();
  return {g, g.add_node("string_to_hash_bucket_fast", {s.id()}, {{"num_buckets", num_buckets}})};
}

} // namespace loom

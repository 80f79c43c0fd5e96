// TF's string_to_hash_bucket_fast: FarmHash's Fingerprint64 of a string's bytes
// modulo the bucket count, from Debian's libfarmhash (the library TF's
// Fingerprint64 is), linked by loom::loom. In core/ because two layers hash
// strings the same way: the op's CPU kernel (kernels/cpu/string.hpp) and the
// input pipeline's categorical features (data/), which must give TF's buckets.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>

#include <farmhash.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

namespace detail {
inline std::uint64_t fingerprint64(std::string_view bytes) noexcept {
  return util::Fingerprint64(bytes.data(), bytes.size());
}
} // namespace detail

LOOM_COMPILED_ONCE std::int64_t string_to_hash_bucket_fast(std::string_view bytes,
                                                           std::int64_t num_buckets);

// Every string of a string tensor hashed: an int64 tensor of the same shape.
LOOM_COMPILED_ONCE any_tensor string_to_hash_bucket_fast(const any_tensor& strings,
                                                         std::int64_t num_buckets);

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE std::int64_t string_to_hash_bucket_fast(std::string_view bytes,
                                                           std::int64_t num_buckets) {
  if (num_buckets <= 0)
    throw invalid_argument_error("string_to_hash_bucket_fast: num_buckets must be positive, got " +
                                 std::to_string(num_buckets));
  return static_cast<std::int64_t>(detail::fingerprint64(bytes) %
                                   static_cast<std::uint64_t>(num_buckets));
}

LOOM_COMPILED_ONCE any_tensor string_to_hash_bucket_fast(const any_tensor& strings,
                                                         std::int64_t num_buckets) {
  if (num_buckets <= 0)
    throw invalid_argument_error("string_to_hash_bucket_fast: num_buckets must be positive, got " +
                                 std::to_string(num_buckets));
  const auto buckets = static_cast<std::uint64_t>(num_buckets);
  any_tensor out(dtype::i64, strings.shape());
  const std::string* s = strings.data<std::string>();
  std::int64_t* b = out.data<std::int64_t>();
  for (std::int64_t i = 0, n = strings.num_elements(); i < n; ++i)
    b[i] = static_cast<std::int64_t>(detail::fingerprint64(s[i]) % buckets);
  return out;
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// The input pipeline's randomness (the batcher's order, shuffle's buffer,
// list_files' order), all drawn straight from std::mt19937_64, whose output the
// standard fixes exactly. std::shuffle and the std:: distributions are
// implementation-defined, so using them would make "the same seed" mean a
// different order on libstdc++ and libc++ and break reproducible training runs.
#pragma once

#include <loom/core/compiled_once.hpp>

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace loom::data {

// A uniform draw from [0, n), n > 0, without modulo bias: values below
// 2^64 mod n are rejected, leaving a range that is a multiple of n.
LOOM_COMPILED_ONCE std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t n);

// A uniform float in [0, 1) from the top 24 bits of one draw.
inline float uniform_unit(std::mt19937_64& rng) {
  return static_cast<float>(rng() >> 40) * 0x1.0p-24f;
}

// Fisher-Yates, from the back, with uniform_below.
template <class T> void shuffle_in_place(std::vector<T>& v, std::mt19937_64& rng) {
  for (std::size_t i = v.size(); i > 1; --i) {
    const auto j = static_cast<std::size_t>(uniform_below(rng, i));
    std::swap(v[i - 1], v[j]);
  }
}

} // namespace loom::data

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::data {

LOOM_COMPILED_ONCE std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t n) {
  const std::uint64_t threshold = (0 - n) % n; // == 2^64 mod n
  for (;;) {
    const std::uint64_t x = rng();
    if (x >= threshold)
      return x % n;
  }
}

} // namespace loom::data

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

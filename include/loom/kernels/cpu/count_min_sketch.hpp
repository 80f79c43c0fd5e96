// Admission's counts of a hash-table shard (graph/hash_embedding.hpp, admit_after > 1): a
// count-min sketch of one-byte counters, and the form a checkpoint holds it in
// (train/state_checkpoint.hpp), which the kernels and loom-ckpt read.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::kernels {

// A count-min sketch of one-byte counters: 4 rows of `width`, an id's count the
// least of its 4 counters. Conservative updates (only the counters at that least
// are raised) keep the error small; it is only ever upwards.
class count_min_sketch {
public:
  static constexpr int depth = 4;

  explicit count_min_sketch(std::int64_t bytes)
      : width_(std::max<std::int64_t>(1, bytes / depth)),
        counters_(static_cast<std::size_t>(width_ * depth), 0) {}

  // The bytes of a sketch made with `bytes`.
  static std::int64_t bytes_for(std::int64_t bytes) {
    return std::max<std::int64_t>(1, bytes / depth) * depth;
  }

  std::int64_t bytes() const noexcept { return width_ * depth; }

  // Its counters as a checkpoint holds them (train/state_checkpoint.hpp), and back.
  const std::vector<std::uint8_t>& counters() const noexcept { return counters_; }
  void set_counters(const unsigned char* from) {
    std::memcpy(counters_.data(), from, counters_.size());
  }

  // The id's count as it stands.
  int count(std::int64_t id) const {
    int least = 255;
    for (int d = 0; d < depth; ++d)
      least = std::min<int>(least, counters_[slot(id, d)]);
    return least;
  }

  // Counts the id once more (up to 255); its count after.
  int add(std::int64_t id) {
    std::array<std::size_t, depth> at{};
    int least = 255;
    for (int d = 0; d < depth; ++d) {
      at[static_cast<std::size_t>(d)] = slot(id, d);
      least = std::min<int>(least, counters_[at[static_cast<std::size_t>(d)]]);
    }
    const int after = std::min(least + 1, 255);
    for (std::size_t k : at)
      counters_[k] = static_cast<std::uint8_t>(std::max<int>(counters_[k], after));
    return after;
  }

  // Takes an id's count back out (an evicted id starts over): each of its counters is
  // lowered by its count. An id sharing one of them may lose counts with it, the one
  // case in which a count errs downwards.
  void forget(std::int64_t id) {
    const int c = count(id);
    for (int d = 0; d < depth; ++d) {
      std::uint8_t& k = counters_[slot(id, d)];
      k = static_cast<std::uint8_t>(std::max(0, k - c));
    }
  }

  // The distinct ids counted, estimated from the first row's empty counters
  // (linear counting: -width ln(empty / width)); with none empty, at least that of one.
  std::int64_t distinct() const {
    const auto empty = std::count(counters_.begin(), counters_.begin() + width_, 0);
    const double w = static_cast<double>(width_);
    return static_cast<std::int64_t>(
        std::llround(-w * std::log(static_cast<double>(std::max<std::int64_t>(empty, 1)) / w)));
  }

  // The ids counted and not admitted, estimated, where `admitted` were admitted.
  std::int64_t waiting(std::int64_t admitted) const {
    return std::max<std::int64_t>(0, distinct() - admitted);
  }

private:
  std::size_t slot(std::int64_t id, int d) const {
    std::uint64_t x =
        static_cast<std::uint64_t>(id) + 0x9e3779b97f4a7c15ULL * static_cast<std::uint64_t>(d + 1);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return static_cast<std::size_t>(d) * static_cast<std::size_t>(width_) +
           static_cast<std::size_t>(x % static_cast<std::uint64_t>(width_));
  }

  std::int64_t width_;
  std::vector<std::uint8_t> counters_;
};

// A shard's admission counts as a checkpoint holds them (train/state_checkpoint.hpp): the
// ids admitted by count (8 bytes, little-endian), then the sketch's counters; "" where the
// shard has counted nothing (its first lookup makes the sketch).
struct saved_admission_counts {
  static std::string encode(const count_min_sketch& sketch, std::int64_t admitted) {
    const auto& counters = sketch.counters();
    std::string saved(8 + counters.size(), '\0');
    auto n = static_cast<std::uint64_t>(admitted);
    for (std::size_t b = 0; b < 8; ++b, n >>= 8)
      saved[b] = static_cast<char>(n & 0xff);
    std::memcpy(saved.data() + 8, counters.data(), counters.size());
    return saved;
  }
  // The sketch's counters (of `saved`'s size, or nullopt where that is not `bytes`, when
  // given) and the ids admitted; nullopt for "" too.
  static std::optional<std::pair<count_min_sketch, std::int64_t>>
  decode(const std::string& saved, std::optional<std::int64_t> bytes = std::nullopt) {
    if (saved.size() <= 8 || (saved.size() - 8) % count_min_sketch::depth != 0)
      return std::nullopt;
    count_min_sketch sketch(static_cast<std::int64_t>(saved.size() - 8));
    if (bytes && *bytes != sketch.bytes())
      return std::nullopt;
    std::uint64_t admitted = 0;
    for (std::size_t b = 8; b-- > 0;)
      admitted = admitted << 8 | static_cast<unsigned char>(saved[b]);
    sketch.set_counters(reinterpret_cast<const unsigned char*>(saved.data()) + 8);
    return std::pair(std::move(sketch), static_cast<std::int64_t>(admitted));
  }
};

} // namespace loom::kernels

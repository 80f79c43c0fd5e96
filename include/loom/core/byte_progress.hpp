// The progress of a long write or read, said in the log: a checkpoint of several GB
// takes a minute, and a log that is silent for a minute looks like a hang. For a
// total of at least `every` bytes (1 GiB unless told), a line each time another
// `every` bytes are done and one at the end, with the rate; nothing for less, so a
// checkpoint of a few MB logs nothing.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/log.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

namespace loom::detail {

class byte_progress {
public:
  static constexpr std::uint64_t default_every = std::uint64_t{1} << 30;

  // `doing` and `done` name the work, e.g. "saving checkpoint /x/model.ckpt-100" and
  // "saved checkpoint /x/model.ckpt-100".
  byte_progress(std::string doing, std::string done, std::uint64_t total,
                std::uint64_t every = default_every)
      : doing_(std::move(doing)), done_(std::move(done)), total_(total),
        every_(every == 0 ? default_every : every), next_(every_),
        start_(std::chrono::steady_clock::now()) {}

  bool logs() const noexcept { return total_ >= every_; }

  void add(std::uint64_t bytes);

  // At the end of the work: its total and rate, where it was long enough to log.
  void finish();

private:
  // "4.61 GB", "12.3 MB", "800.0 kB", "24 B".
  static std::string size(std::uint64_t b);
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  double mb_per_s() const {
    const double s = seconds();
    return s > 0 ? static_cast<double>(bytes_) / 1e6 / s : 0.0;
  }

  std::string doing_, done_;
  std::uint64_t total_, every_, next_, bytes_ = 0;
  std::chrono::steady_clock::time_point start_;
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE void byte_progress::add(std::uint64_t bytes) {
  bytes_ += bytes;
  if (!logs() || bytes_ < next_ || bytes_ >= total_)
    return;
  while (next_ <= bytes_)
    next_ += every_;
  char line[64];
  std::snprintf(line, sizeof line, " (%.0f %%), %.0f MB/s",
                100.0 * static_cast<double>(bytes_) / static_cast<double>(total_), mb_per_s());
  logging::info(doing_ + ": " + size(bytes_) + " of " + size(total_) + line);
}

LOOM_COMPILED_ONCE void byte_progress::finish() {
  if (!logs())
    return;
  char line[64];
  std::snprintf(line, sizeof line, " in %.1f s (%.0f MB/s)", seconds(), mb_per_s());
  logging::info(done_ + ": " + size(bytes_) + line);
}

LOOM_COMPILED_ONCE std::string byte_progress::size(std::uint64_t b) {
  const auto v = static_cast<double>(b);
  char out[32];
  if (v >= 1e9)
    std::snprintf(out, sizeof out, "%.2f GB", v / 1e9);
  else if (v >= 1e6)
    std::snprintf(out, sizeof out, "%.1f MB", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(out, sizeof out, "%.1f kB", v / 1e3);
  else
    std::snprintf(out, sizeof out, "%llu B", static_cast<unsigned long long>(b));
  return out;
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

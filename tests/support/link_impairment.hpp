// What a link does to the packets it carries, in netem's words: the model of
// tests/support/link_emulator.cpp (the network of the namespace tests), apart from its sockets
// so that a unit test can check it packet by packet (tests/cluster/test_link_impairment.cpp).
//
//   delay TIME [JITTER]           each packet TIME later, give or take a uniform JITTER
//                                 (which reorders packets, as netem's does)
//   loss [random] PERCENT         each packet lost independently
//   loss gemodel P [R [1-H [1-K]]]  Gilbert-Elliott bursts: P% good->bad, R% bad->good
//                                 (default 100 - P), 1-H% lost in bad (100), 1-K% in good (0)
//   rate RATE                     the link's bandwidth (bit, kbit, mbit, gbit; bps, kbps,
//                                 mbps, gbps are bytes): a packet leaves once the ones
//                                 before it have
//   reorder PERCENT               packets sent at once, past the delayed ones (needs delay)
//   limit PACKETS                 packets a link holds at most (1000, netem's); more are dropped
//
// TIME takes us, ms or s (usec, msec, sec); PERCENT a '%'. A link applies it once to each
// packet, as netem on the sending host's interface: a round trip crosses it twice.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace loom::testing::netem {

using nanoseconds = std::int64_t;

// A spec that is not netem's words, naming the word.
struct bad_impairment : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct impairment {
  nanoseconds delay = 0, jitter = 0;
  double loss = 0; // independent loss, a probability
  // Gilbert-Elliott (netem's gemodel), probabilities; in effect where gemodel.
  bool gemodel = false;
  double ge_p = 0, ge_r = 1, ge_bad_loss = 1, ge_good_loss = 0;
  double rate_bytes_per_s = 0; // 0: no cap
  double reorder = 0;
  std::size_t limit = 1000;
};

namespace detail {

inline double number(const std::string& word, const std::string& what) {
  char* end = nullptr;
  const double v = std::strtod(word.c_str(), &end);
  if (word.empty() || end != word.c_str() + word.size() || !std::isfinite(v) || v < 0)
    throw bad_impairment(what + ": '" + word + "' is not a non-negative number");
  return v;
}

inline double percent(const std::string& word, const std::string& what) {
  if (word.empty() || word.back() != '%')
    throw bad_impairment(what + ": '" + word + "' is not a percentage (as 1% or 0.5%)");
  const double v = number(word.substr(0, word.size() - 1), what);
  if (v > 100)
    throw bad_impairment(what + ": '" + word + "' is over 100%");
  return v / 100;
}

inline bool ends_with(const std::string& word, const std::string& suffix) {
  return word.size() > suffix.size() &&
         word.compare(word.size() - suffix.size(), suffix.size(), suffix) == 0;
}

inline nanoseconds time(const std::string& word, const std::string& what) {
  // Longest first: "ms" before "s".
  static const std::pair<const char*, double> units[] = {{"usec", 1e3}, {"msec", 1e6}, {"sec", 1e9},
                                                         {"us", 1e3},   {"ms", 1e6},   {"s", 1e9}};
  for (const auto& [unit, scale] : units)
    if (ends_with(word, unit))
      return static_cast<nanoseconds>(
          number(word.substr(0, word.size() - std::string(unit).size()), what) * scale);
  throw bad_impairment(what + ": '" + word + "' has no unit (us, ms or s)");
}

inline double rate(const std::string& word) {
  // tc's units: the bit ones are bits per second, the bps ones bytes per second.
  static const std::pair<const char*, double> units[] = {
      {"gbit", 1e9 / 8}, {"mbit", 1e6 / 8}, {"kbit", 1e3 / 8}, {"bit", 1.0 / 8},
      {"gbps", 1e9},     {"mbps", 1e6},     {"kbps", 1e3},     {"bps", 1.0}};
  for (const auto& [unit, scale] : units)
    if (ends_with(word, unit)) {
      const double v =
          number(word.substr(0, word.size() - std::string(unit).size()), "rate") * scale;
      if (v <= 0)
        throw bad_impairment("rate: '" + word + "' is not above zero");
      return v;
    }
  throw bad_impairment("rate: '" + word + "' has no unit (as 100mbit or 1gbit)");
}

inline bool starts_like_number(const std::string& word) {
  return !word.empty() && (std::isdigit(static_cast<unsigned char>(word[0])) || word[0] == '.');
}

} // namespace detail

inline std::vector<std::string> words_of(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> words;
  for (std::string w; in >> w;)
    words.push_back(w);
  return words;
}

// netem's words (none: a perfect link); throws bad_impairment naming the word it cannot take.
inline impairment parse(const std::vector<std::string>& words) {
  impairment m;
  for (std::size_t i = 0; i < words.size();) {
    const std::string& w = words[i++];
    auto next = [&](const std::string& what) -> const std::string& {
      if (i >= words.size())
        throw bad_impairment(what + ": a value is missing");
      return words[i++];
    };
    auto more = [&] { return i < words.size() && detail::starts_like_number(words[i]); };
    if (w == "delay") {
      m.delay = detail::time(next("delay"), "delay");
      if (more())
        m.jitter = detail::time(next("delay's jitter"), "delay's jitter");
      if (m.jitter > m.delay)
        throw bad_impairment("delay: the jitter is larger than the delay");
    } else if (w == "loss") {
      if (i < words.size() && words[i] == "random")
        ++i;
      if (i < words.size() && words[i] == "gemodel") {
        ++i;
        m.gemodel = true;
        m.ge_p = detail::percent(next("loss gemodel's P"), "loss gemodel's P");
        m.ge_r = 1 - m.ge_p;
        if (more())
          m.ge_r = detail::percent(next("loss gemodel's R"), "loss gemodel's R");
        if (more())
          m.ge_bad_loss = detail::percent(next("loss gemodel's 1-H"), "loss gemodel's 1-H");
        if (more())
          m.ge_good_loss = detail::percent(next("loss gemodel's 1-K"), "loss gemodel's 1-K");
      } else {
        m.loss = detail::percent(next("loss"), "loss");
      }
    } else if (w == "rate") {
      m.rate_bytes_per_s = detail::rate(next("rate"));
    } else if (w == "reorder") {
      m.reorder = detail::percent(next("reorder"), "reorder");
    } else if (w == "limit") {
      const double v = detail::number(next("limit"), "limit");
      if (v < 1 || v != std::floor(v))
        throw bad_impairment("limit: '" + words[i - 1] + "' is not a whole number of packets >= 1");
      m.limit = static_cast<std::size_t>(v);
    } else {
      throw bad_impairment("'" + w + "' is not delay, loss, rate, reorder or limit");
    }
  }
  if (m.reorder > 0 && m.delay == 0)
    throw bad_impairment("reorder needs a delay (packets are reordered past the delayed ones)");
  return m;
}

// What became of a packet: lost, dropped by a full link, or delivered at `at`.
struct fate {
  bool lost = false, queue_full = false;
  nanoseconds at = 0;
};

// One direction of a link: the state netem keeps for its queue.
class link {
public:
  explicit link(std::uint64_t seed) : rng_(seed) {}

  // A packet of `bytes` handed to the link at `now` under `m`. A packet it delivers stays
  // on the link (counting against m.limit) until delivered() is called for it.
  fate send(const impairment& m, std::size_t bytes, nanoseconds now) {
    if (lost(m))
      return {.lost = true};
    if (in_flight_ >= m.limit)
      return {.queue_full = true};
    nanoseconds leaves = now;
    if (m.rate_bytes_per_s > 0) {
      leaves = std::max(now, free_at_) +
               static_cast<nanoseconds>(static_cast<double>(bytes) * 1e9 / m.rate_bytes_per_s);
      free_at_ = leaves;
    }
    nanoseconds at = leaves;
    if (!(m.reorder > 0 && uniform() < m.reorder)) {
      at += m.delay;
      if (m.jitter > 0)
        at += static_cast<nanoseconds>((2 * uniform() - 1) * static_cast<double>(m.jitter));
    }
    ++in_flight_;
    return {.at = at};
  }
  void delivered() noexcept { --in_flight_; }
  std::size_t in_flight() const noexcept { return in_flight_; }

private:
  double uniform() { return std::uniform_real_distribution<double>(0, 1)(rng_); }

  bool lost(const impairment& m) {
    if (m.gemodel) {
      // netem's order: the state moves, then the packet is lost by the new state's odds.
      if (bad_ ? uniform() < m.ge_r : uniform() < m.ge_p)
        bad_ = !bad_;
      return uniform() < (bad_ ? m.ge_bad_loss : m.ge_good_loss);
    }
    return m.loss > 0 && uniform() < m.loss;
  }

  std::mt19937_64 rng_;
  bool bad_ = false;        // Gilbert-Elliott's state
  nanoseconds free_at_ = 0; // when the link is done sending what it took (rate)
  std::size_t in_flight_ = 0;
};

} // namespace loom::testing::netem

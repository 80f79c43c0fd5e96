// The link emulator's model (tests/support/link_impairment.hpp), packet by packet: netem's
// words parsed or refused with the word named, and each impairment doing what it says in
// numbers large enough that chance cannot pass a wrong model.
#include <support/link_impairment.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace {

namespace netem = loom::testing::netem;
using netem::nanoseconds;

netem::impairment spec(const std::string& line) {
  return netem::parse(netem::words_of(line));
}

std::string refusal(const std::string& line) {
  try {
    spec(line);
  } catch (const netem::bad_impairment& e) {
    return e.what();
  }
  return "(taken)";
}

} // namespace

TEST_CASE("link impairment: netem's words") {
  const auto m = spec("delay 10ms 2ms loss 1.5% rate 100mbit reorder 25% limit 50");
  CHECK(m.delay == 10'000'000);
  CHECK(m.jitter == 2'000'000);
  CHECK(m.loss == doctest::Approx(0.015));
  CHECK(m.rate_bytes_per_s == doctest::Approx(12.5e6));
  CHECK(m.reorder == doctest::Approx(0.25));
  CHECK(m.limit == 50);
  CHECK(spec("delay 1s").delay == 1'000'000'000);
  CHECK(spec("delay 250us").delay == 250'000);
  CHECK(spec("rate 1mbps").rate_bytes_per_s == doctest::Approx(1e6));
  CHECK(spec("loss random 3%").loss == doctest::Approx(0.03));
  const auto ge = spec("loss gemodel 1% 10% 70% 0.1%");
  CHECK(ge.gemodel);
  CHECK(ge.ge_p == doctest::Approx(0.01));
  CHECK(ge.ge_r == doctest::Approx(0.10));
  CHECK(ge.ge_bad_loss == doctest::Approx(0.70));
  CHECK(ge.ge_good_loss == doctest::Approx(0.001));
  CHECK(spec("loss gemodel 4%").ge_r == doctest::Approx(0.96)); // netem's default: 1 - P
  const auto none = spec("");
  CHECK(none.delay == 0);
  CHECK(none.loss == 0);
  CHECK(none.rate_bytes_per_s == 0);
}

TEST_CASE("link impairment: a spec netem would refuse names the word") {
  CHECK(refusal("delay 2") == "delay: '2' has no unit (us, ms or s)");
  CHECK(refusal("delay") == "delay: a value is missing");
  CHECK(refusal("delay 1ms 2ms") == "delay: the jitter is larger than the delay");
  CHECK(refusal("loss 1") == "loss: '1' is not a percentage (as 1% or 0.5%)");
  CHECK(refusal("loss 101%") == "loss: '101%' is over 100%");
  CHECK(refusal("loss -1%") == "loss: '-1' is not a non-negative number");
  CHECK(refusal("rate 100") == "rate: '100' has no unit (as 100mbit or 1gbit)");
  CHECK(refusal("rate 0mbit") == "rate: '0mbit' is not above zero");
  CHECK(refusal("reorder 5%") ==
        "reorder needs a delay (packets are reordered past the delayed ones)");
  CHECK(refusal("limit 0") == "limit: '0' is not a whole number of packets >= 1");
  CHECK(refusal("limit 2.5") == "limit: '2.5' is not a whole number of packets >= 1");
  CHECK(refusal("delay 1xs") == "delay: '1x' is not a non-negative number");
  CHECK(refusal("duplicate 1%") == "'duplicate' is not delay, loss, rate, reorder or limit");
}

TEST_CASE("link impairment: independent loss loses its share") {
  const auto m = spec("loss 1%");
  netem::link l(7);
  const int n = 200'000;
  int lost = 0;
  for (int i = 0; i < n; ++i) {
    const auto f = l.send(m, 1500, i);
    if (f.lost)
      ++lost;
    else
      l.delivered();
  }
  // 2000 expected, standard deviation 44.5.
  CHECK(lost > 1800);
  CHECK(lost < 2200);
}

TEST_CASE("link impairment: Gilbert-Elliott loses in bursts of 1/R") {
  // P 1%, R 10%, everything lost in the bad state, nothing in the good: a tenth of the time
  // bad (P / (P + R) = 0.0909), bursts of 10 packets on average.
  const auto m = spec("loss gemodel 1% 10%");
  netem::link l(11);
  const int n = 400'000;
  int lost = 0, bursts = 0;
  bool in_burst = false;
  for (int i = 0; i < n; ++i) {
    const auto f = l.send(m, 1500, i);
    if (f.lost) {
      ++lost;
      bursts += in_burst ? 0 : 1;
    } else {
      l.delivered();
    }
    in_burst = f.lost;
  }
  const double share = static_cast<double>(lost) / n, burst = static_cast<double>(lost) / bursts;
  MESSAGE("lost " << share << " of the packets, in bursts of " << burst);
  CHECK(share == doctest::Approx(0.0909).epsilon(0.08));
  CHECK(burst == doctest::Approx(10).epsilon(0.08));
  // Independent loss at the same share would make bursts of 1.1.
}

TEST_CASE("link impairment: delay, jitter within its bounds, and the reordering it makes") {
  const nanoseconds ms = 1'000'000;
  {
    const auto m = spec("delay 10ms");
    netem::link l(3);
    for (int i = 0; i < 100; ++i)
      CHECK(l.send(m, 100, i * ms / 10).at == i * ms / 10 + 10 * ms);
  }
  const auto m = spec("delay 10ms 1ms");
  netem::link l(5);
  nanoseconds lowest = 100 * ms, highest = 0, last_at = 0;
  int inversions = 0;
  for (int i = 0; i < 10'000; ++i) {
    const nanoseconds sent = i * ms / 10; // a packet every 0.1 ms
    const nanoseconds at = l.send(m, 100, sent).at;
    l.delivered();
    lowest = std::min(lowest, at - sent);
    highest = std::max(highest, at - sent);
    inversions += at < last_at ? 1 : 0;
    last_at = at;
  }
  CHECK(lowest >= 9 * ms);
  CHECK(highest <= 11 * ms);
  CHECK(lowest < 9 * ms + ms / 10); // the whole range is used
  CHECK(highest > 11 * ms - ms / 10);
  CHECK(inversions > 1000); // 2 ms of spread over packets 0.1 ms apart
}

TEST_CASE("link impairment: a rate spaces packets by their size, reorder skips the delay") {
  const nanoseconds ms = 1'000'000;
  {
    const auto m = spec("rate 8mbit delay 5ms"); // 1 MB/s: 1000 bytes a millisecond
    netem::link l(1);
    for (int i = 0; i < 10; ++i)
      CHECK(l.send(m, 1000, 0).at == (i + 1) * ms + 5 * ms);
    // Idle long enough, the next one is not queued behind them.
    CHECK(l.send(m, 1000, 100 * ms).at == 101 * ms + 5 * ms);
  }
  const auto m = spec("delay 10ms reorder 25%");
  netem::link l(9);
  int at_once = 0, neither = 0;
  const int n = 20'000;
  for (int i = 0; i < n; ++i) {
    const auto f = l.send(m, 100, i * ms);
    l.delivered();
    at_once += f.at == i * ms ? 1 : 0;
    neither += f.at != i * ms && f.at != i * ms + 10 * ms ? 1 : 0;
  }
  CHECK(neither == 0);
  CHECK(at_once > n / 4 - 300); // 5000 expected, standard deviation 61
  CHECK(at_once < n / 4 + 300);
}

TEST_CASE("link impairment: a full link drops what comes next") {
  const auto m = spec("delay 10ms limit 3");
  netem::link l(2);
  for (int i = 0; i < 3; ++i)
    CHECK_FALSE(l.send(m, 100, 0).queue_full);
  CHECK(l.send(m, 100, 0).queue_full);
  l.delivered();
  CHECK_FALSE(l.send(m, 100, 0).queue_full);
  CHECK(l.in_flight() == 3);
}

// A task's step runners (runtime/step_runners.hpp) alone: a job never waits
// for another job to end, however quickly jobs follow each other. Jobs that
// wait for each other are a ps's daily work: a chief's take_gradient waits for
// the workers' gradients while their barrier_wait waits for the chief's update.
#include <doctest/doctest.h>

#include <loom/runtime/step_runners.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

using namespace std::chrono_literals;

namespace {

// Jobs that each wait until all of them have started: they end only if each
// has a thread of its own at the same time.
struct meeting {
  std::mutex mu;
  std::condition_variable cv;
  int expected, started = 0, met = 0, ended = 0;
  explicit meeting(int n) : expected(n) {}

  void attend() {
    std::unique_lock lock(mu);
    ++started;
    cv.notify_all();
    if (cv.wait_for(lock, 2s, [&] { return started == expected; }))
      ++met;
    ++ended;
    cv.notify_all();
  }
  // How many met the others, once every job has ended.
  int result() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return ended == expected; });
    return met;
  }
};

} // namespace

TEST_CASE("jobs submitted back to back each get a thread while an idle one is still waking up") {
  // One idle thread, then two jobs at once: the idle thread is told of the
  // first, and is still idle (not yet awake) when the second comes. Each round
  // has a new set of runners, so each starts with exactly one idle thread.
  for (int round = 0; round < 20; ++round) {
    loom::detail::step_runners runners;
    meeting warm_up(1);
    REQUIRE(runners.submit([&] { warm_up.attend(); }));
    REQUIRE(warm_up.result() == 1);
    std::this_thread::sleep_for(5ms); // its thread waits for work again

    meeting pair(2);
    REQUIRE(runners.submit([&] { pair.attend(); }));
    REQUIRE(runners.submit([&] { pair.attend(); }));
    CAPTURE(round);
    REQUIRE(pair.result() == 2);
  }
}

TEST_CASE("many jobs that wait for each other all run at once, on threads reused between rounds") {
  loom::detail::step_runners runners;
  for (int round = 0; round < 5; ++round) {
    meeting all(16);
    for (int i = 0; i < 16; ++i)
      REQUIRE(runners.submit([&] { all.attend(); }));
    CAPTURE(round);
    REQUIRE(all.result() == 16);
  }
}

TEST_CASE("a stopped set of runners refuses new jobs and has run the ones queued before") {
  loom::detail::step_runners runners;
  meeting one(1);
  REQUIRE(runners.submit([&] { one.attend(); }));
  runners.stop();
  CHECK(one.result() == 1);
  CHECK_FALSE(runners.submit([] {}));
}

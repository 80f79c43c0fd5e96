// The channel's "whoever waits reads" path: a caller blocked in
// call_handle::get() drives the connections itself while no other thread does,
// handing the replies it meets for other calls to their handles. These tests
// make several waiters share the reading, replies arrive out of order and while
// another thread reads, and calls end (cancel, deadline, stop, a lost
// connection) while their own waiter is the reader.
#include <doctest/doctest.h>

#include "net_test_util.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

using namespace loom;
using namespace loom::net;
using namespace loom::net::testing;
using namespace std::chrono_literals;

namespace {

using clk = std::chrono::steady_clock;

// Holds every "hold" request until release() answers them, in a shuffled order.
struct holder {
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::pair<std::int64_t, responder>> held;

  void install(rpc_server& srv) {
    srv.handle("hold", [this](request req, responder r) {
      const std::int64_t key = req.payloads().at(0).data<std::int64_t>()[0];
      std::lock_guard lk(m);
      held.emplace_back(key, std::move(r));
      cv.notify_all();
    });
  }
  bool wait_for(std::size_t n) {
    std::unique_lock lk(m);
    return cv.wait_for(lk, 20s, [&] { return held.size() >= n; });
  }
  void release(unsigned seed) {
    std::vector<std::pair<std::int64_t, responder>> v;
    {
      std::lock_guard lk(m);
      v.swap(held);
    }
    std::shuffle(v.begin(), v.end(), std::mt19937(seed));
    for (auto& [key, r] : v)
      r.reply(empty{}, {any_tensor::from_vector<std::int64_t>(shape{1}, {-key})});
  }
};

any_tensor key_tensor(std::int64_t key) {
  return any_tensor::from_vector<std::int64_t>(shape{1}, {key});
}

} // namespace

TEST_CASE("synchronous callers sharing a channel each get their own reply, answered out of order") {
  rpc_server srv(local_server());
  holder h;
  h.install(srv);
  channel ch(local_address(srv), local_channel());
  ch.connect();
  constexpr int threads = 8, rounds = 20;
  std::atomic<int> ok{0};
  std::vector<std::thread> ts;
  std::atomic<bool> done{false};
  // Answers whatever is held, in a shuffled order, until every caller is done:
  // replies arrive for calls whose waiter is not the one reading.
  std::thread answerer([&] {
    unsigned seed = 1;
    while (!done) {
      std::this_thread::sleep_for(200us);
      h.release(seed++);
    }
  });
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < rounds; ++i) {
        const std::int64_t key = t * 1000 + i + 1;
        const auto res = ch.call("hold", empty{}, {key_tensor(key)});
        if (res.payloads.at(0).data<std::int64_t>()[0] == -key)
          ++ok;
      }
    });
  for (auto& t : ts)
    t.join();
  done = true;
  answerer.join();
  CHECK(ok == threads * rounds);
}

TEST_CASE("a call whose reply arrives while another thread reads gets it") {
  rpc_server srv(local_server());
  holder h;
  h.install(srv);
  srv.handle("ping", [](request req, responder r) { r.reply(empty{}, std::move(req.payloads())); });
  channel ch(local_address(srv), local_channel());
  ch.connect();
  // A waits (and reads) for a reply that is held back...
  auto a = std::async(std::launch::async, [&] {
    return ch.call("hold", empty{}, {key_tensor(7)}).payloads.at(0).data<std::int64_t>()[0];
  });
  REQUIRE(h.wait_for(1));
  // ...while B's calls complete, whether B reads them or A hands them over.
  for (std::int64_t i = 1; i <= 50; ++i)
    CHECK(ch.call("ping", empty{}, {key_tensor(i)}).payloads.at(0).data<std::int64_t>()[0] == i);
  CHECK(a.wait_for(0s) == std::future_status::timeout);
  h.release(3);
  REQUIRE(a.wait_for(10s) == std::future_status::ready);
  CHECK(a.get() == -7);
}

TEST_CASE("a waiter that is reading is woken by cancel, its deadline and stop") {
  rpc_server srv(local_server());
  holder h;
  h.install(srv);
  channel ch(local_address(srv), local_channel());
  ch.connect();

  SUBCASE("cancel from another thread") {
    auto call = ch.call_async("hold", empty{}, {key_tensor(1)});
    REQUIRE(h.wait_for(1));
    const auto t0 = clk::now();
    std::thread canceller([&] {
      std::this_thread::sleep_for(50ms);
      call.cancel();
    });
    CHECK_THROWS_AS((void)call.get(), cancelled_error); // get() is the reader here
    canceller.join();
    CHECK(clk::now() - t0 < 900ms); // woken, not found by a periodic check
  }
  SUBCASE("the deadline") {
    call_options o;
    o.timeout = 150ms;
    const auto t0 = clk::now();
    CHECK_THROWS_AS((void)ch.call("hold", empty{}, {key_tensor(2)}, o), deadline_exceeded_error);
    CHECK(clk::now() - t0 >= 140ms);
    CHECK(clk::now() - t0 < 2s);
  }
  SUBCASE("the channel stops") {
    auto call = ch.call_async("hold", empty{}, {key_tensor(3)});
    REQUIRE(h.wait_for(1));
    std::thread stopper([&] {
      std::this_thread::sleep_for(50ms);
      ch.stop();
    });
    CHECK_THROWS_AS((void)call.get(), cancelled_error);
    stopper.join();
  }
  SUBCASE("the server goes away") {
    auto call = ch.call_async("hold", empty{}, {key_tensor(4)});
    REQUIRE(h.wait_for(1));
    std::thread stopper([&] {
      std::this_thread::sleep_for(50ms);
      srv.stop();
    });
    CHECK_THROWS_AS((void)call.get(), unavailable_error);
    stopper.join();
  }
  h.release(0); // replying after a stop is a no-op
}

TEST_CASE("calls nobody waits on yet complete, and done() and wait_for() read their replies") {
  rpc_server srv(local_server());
  srv.handle("ping", [](request req, responder r) { r.reply(empty{}, std::move(req.payloads())); });
  channel ch(local_address(srv), local_channel());
  std::vector<call_handle> hs;
  for (std::int64_t i = 0; i < 20; ++i)
    hs.push_back(ch.call_async("ping", empty{}, {key_tensor(i)}));
  const auto until = clk::now() + 10s;
  while (!hs.front().done() && clk::now() < until)
    std::this_thread::sleep_for(1ms);
  CHECK(hs.front().done());
  CHECK(hs.back().wait_for(10s));
  for (std::int64_t i = 0; i < 20; ++i)
    CHECK(hs[static_cast<std::size_t>(i)].get().payloads.at(0).data<std::int64_t>()[0] == i);
}

TEST_CASE(
    "a connection the server closed while the channel was idle is replaced by the next call") {
  auto srv = std::make_unique<rpc_server>(local_server());
  srv->handle("ping", [](request, responder r) { r.reply(); });
  const std::uint16_t port = srv->port();
  channel ch(local_address(*srv), local_channel());
  CHECK_NOTHROW(ch.call("ping"));
  srv.reset(); // closes the channel's connections while no call is in flight
  std::this_thread::sleep_for(50ms);
  rpc_server_options so = local_server();
  so.port = port;
  rpc_server again(so);
  again.handle("ping", [](request, responder r) { r.reply(); });
  CHECK_NOTHROW(ch.call("ping")); // reconnects instead of failing on the dead connection
}

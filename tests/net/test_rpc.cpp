// RPC over real sockets on 127.0.0.1: round trips, caller-supplied buffers,
// multiplexing, bulk vs control, deadlines, cancellation, duplicates, deferred replies.
#include <doctest/doctest.h>

#include "net_test_util.hpp"

#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

using namespace loom;
using namespace loom::net;
using namespace loom::net::testing;
using namespace std::chrono_literals;

namespace {

struct echo_meta {
  std::string text;
  std::vector<std::int64_t> ids;
  template <class A> void serialize(A& ar) { ar(text, ids); }
};

void add_echo(rpc_server& srv) {
  srv.handle("echo", [](request req, responder r) {
    auto m = req.metadata<echo_meta>();
    m.text += "!";
    r.reply(m, std::move(req.payloads()));
  });
}

any_tensor filled_f32(shape s, float base) {
  any_tensor t(dtype::f32, std::move(s));
  auto f = t.flat<float>();
  for (std::size_t i = 0; i < f.size(); ++i)
    f[i] = base + static_cast<float>(i % 1000);
  return t;
}

} // namespace

TEST_CASE("metadata and tensors of every dtype but string round-trip byte for byte") {
  rpc_server srv(local_server());
  add_echo(srv);
  channel ch(local_address(srv), local_channel());
  std::vector<any_tensor> in{
      any_tensor::from_vector<float>(shape{2, 2}, {1.5f, -2, 3e-30f, 4}),
      any_tensor::from_vector<double>(shape{3}, {1e300, -0.0, 3.14159}),
      any_tensor::from_vector<std::int32_t>(shape{1, 3}, {-1, 0, 1 << 30}),
      any_tensor::from_vector<std::int64_t>(shape{}, {std::int64_t(-1) << 62}),
      any_tensor::from_vector<bool>(shape{3}, {true, false, true}),
      any_tensor(dtype::i32, shape{0}),
      filled_f32(shape{300, 1000}, 7), // over the bulk threshold: goes over the bulk connection
  };
  const auto res = ch.call("echo", echo_meta{"hi", {4, 5}}, in);
  const auto m = res.metadata<echo_meta>();
  CHECK(m.text == "hi!");
  CHECK(m.ids == std::vector<std::int64_t>{4, 5});
  REQUIRE(res.payloads.size() == in.size());
  for (std::size_t i = 0; i < in.size(); ++i)
    CHECK(same_bytes(res.payloads[i], in[i]));
  // No metadata at all.
  srv.handle("ping", [](request, responder r) { r.reply(); });
  CHECK(ch.call("ping").payloads.empty());
}

TEST_CASE("payloads are received straight into caller-supplied buffers") {
  rpc_server srv(local_server());
  any_tensor variable(dtype::f32, shape{64, 64});
  std::atomic<const void*> seen{nullptr};
  srv.handle(
      "assign",
      [&](request req, responder r) {
        seen = req.payloads().at(0).raw_data();
        r.reply(empty{}, {variable});
      },
      [&](const request_preview& p, std::size_t i, const payload_info& info) -> any_tensor {
        CHECK(p.method == "assign");
        CHECK(i == 0);
        CHECK(info.shape == variable.shape());
        return variable;
      });
  channel ch(local_address(srv), local_channel());
  const auto value = filled_f32(shape{64, 64}, 3);
  any_tensor dest(dtype::f32, shape{64, 64});
  call_options o;
  o.response_buffers = {dest};
  const auto res = ch.call("assign", empty{}, {value}, o);
  CHECK(seen.load() == variable.raw_data()); // the server received into the variable
  CHECK(same_bytes(variable, value));
  REQUIRE(res.payloads.size() == 1);
  CHECK(res.payloads[0].raw_data() == dest.raw_data()); // and the client into dest
  CHECK(same_bytes(dest, value));

  // A supplied buffer of the wrong shape: a clear error, and the channel still works.
  any_tensor wrong(dtype::f32, shape{2});
  call_options o2;
  o2.response_buffers = {wrong};
  try {
    (void)ch.call("assign", empty{}, {value}, o2);
    FAIL("no error");
  } catch (const invalid_argument_error& e) {
    CHECK(std::string(e.what()).find("[64, 64]") != std::string::npos);
  }
  CHECK(ch.call("assign", empty{}, {value}).payloads.size() == 1);
}

TEST_CASE("concurrent calls from several threads are multiplexed on one channel") {
  rpc_server srv(local_server());
  add_echo(srv);
  channel ch(local_address(srv), local_channel());
  ch.connect();
  constexpr int threads = 6, calls = 150;
  std::atomic<int> ok{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < calls; ++i) {
        const std::int64_t key = t * 100000 + i;
        auto v = any_tensor::from_vector<std::int64_t>(shape{2}, {key, -key});
        const auto res = ch.call("echo", echo_meta{"t", {key}}, {v});
        if (res.metadata<echo_meta>().ids == std::vector<std::int64_t>{key} &&
            res.payloads.at(0).data<std::int64_t>()[1] == -key)
          ++ok;
      }
    });
  for (auto& t : ts)
    t.join();
  CHECK(ok == threads * calls);
}

TEST_CASE("a slow big payload does not block a small call") {
  rpc_server_options so = local_server();
  so.threads = 3;
  rpc_server srv(so);
  std::promise<void> big_started, small_done;
  auto small_done_f = small_done.get_future().share();
  srv.handle(
      "big",
      [](request req, responder r) {
        r.reply(empty{}, {any_tensor::scalar<std::int64_t>(
                             static_cast<std::int64_t>(req.payloads().size()))});
      },
      [&](const request_preview&, std::size_t, const payload_info&) -> any_tensor {
        // The receiver is slow: it does not read the big payload until the small call is done
        // (bounded, so a broken implementation fails instead of hanging).
        big_started.set_value();
        small_done_f.wait_for(20s);
        return {};
      });
  srv.handle("small", [](request, responder r) { r.reply(std::string("pong")); });
  channel ch(local_address(srv), local_channel());
  ch.connect();

  auto big = ch.call_async("big", empty{}, {filled_f32(shape{16, 1024, 1024}, 1)}); // 64 MiB
  REQUIRE(big_started.get_future().wait_for(20s) == std::future_status::ready);
  call_options o;
  o.timeout = 10s;
  const auto res = ch.call("small", empty{}, {}, o);
  CHECK(res.metadata<std::string>() == "pong");
  CHECK(!big.done()); // the small call finished first
  small_done.set_value();
  CHECK(big.get().payloads.at(0).data<std::int64_t>()[0] == 1);
}

TEST_CASE("a call past its deadline fails naming the method and the peer") {
  rpc_server srv(local_server());
  std::mutex m;
  std::vector<responder> held;
  srv.handle("never", [&](request, responder r) {
    std::lock_guard lk(m);
    held.push_back(std::move(r)); // never answers
  });
  channel ch(local_address(srv), local_channel());
  call_options o;
  o.timeout = 200ms;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)ch.call("never", empty{}, {}, o);
    FAIL("no error");
  } catch (const deadline_exceeded_error& e) {
    const std::string w = e.what();
    CHECK(w.find("'never'") != std::string::npos);
    CHECK(w.find("ps task 0 at " + local_address(srv)) != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 >= 190ms);
  // Answering late is harmless; the channel keeps working.
  {
    std::lock_guard lk(m);
    for (auto& r : held)
      r.reply();
    held.clear();
  }
  srv.handle("ping", [](request, responder r) { r.reply(); });
  CHECK_NOTHROW(ch.call("ping"));
}

TEST_CASE("a call can be cancelled") {
  rpc_server srv(local_server());
  std::promise<responder> got;
  srv.handle("wait", [&](request, responder r) { got.set_value(std::move(r)); });
  channel ch(local_address(srv), local_channel());
  auto h = ch.call_async("wait");
  auto rf = got.get_future();
  REQUIRE(rf.wait_for(10s) == std::future_status::ready);
  CHECK(!h.done());
  h.cancel();
  try {
    (void)h.get();
    FAIL("no error");
  } catch (const cancelled_error& e) {
    CHECK(std::string(e.what()).find("'wait'") != std::string::npos);
  }
  auto r = rf.get();
  r.reply(); // late, ignored
  srv.handle("ping", [](request, responder rr) { rr.reply(); });
  CHECK_NOTHROW(ch.call("ping"));
}

TEST_CASE("a duplicate request id is rejected instead of running twice") {
  rpc_server srv(local_server());
  std::atomic<int> runs{0};
  srv.handle("incr", [&](request, responder r) {
    ++runs;
    r.reply();
  });
  channel ch(local_address(srv), local_channel());
  call_options o;
  o.request_id = std::uint64_t(1) << 40;
  CHECK_NOTHROW(ch.call("incr", empty{}, {}, o));
  try {
    (void)ch.call("incr", empty{}, {}, o);
    FAIL("no error");
  } catch (const already_exists_error& e) {
    CHECK(std::string(e.what()).find("not run twice") != std::string::npos);
  }
  CHECK(runs == 1);
  CHECK_NOTHROW(ch.call("incr")); // fresh ids still work
  CHECK(runs == 2);
}

TEST_CASE("a handler can hold its reply and answer later from another thread") {
  // A barrier: every caller is answered once the third one arrives.
  rpc_server srv(local_server());
  std::mutex m;
  std::condition_variable cv;
  std::vector<responder> waiting;
  srv.handle("barrier", [&](request, responder r) {
    std::lock_guard lk(m);
    waiting.push_back(std::move(r));
    cv.notify_all();
  });
  std::thread releaser([&] {
    std::unique_lock lk(m);
    if (!cv.wait_for(lk, 20s, [&] { return waiting.size() == 3; }))
      return;
    std::int64_t step = 7;
    for (auto& r : waiting)
      r.reply(step);
    waiting.clear();
  });
  channel ch(local_address(srv), local_channel());
  std::vector<call_handle> hs;
  for (int i = 0; i < 3; ++i)
    hs.push_back(ch.call_async("barrier"));
  for (auto& h : hs)
    CHECK(h.get().metadata<std::int64_t>() == 7);
  releaser.join();
}

TEST_CASE("handler errors and unknown methods reach the caller with their codes") {
  rpc_server srv(local_server());
  srv.handle("fails", [](request, responder) { throw not_found_error("variable w9 not found"); });
  srv.handle("drops", [](request, responder) {});
  channel ch(local_address(srv), local_channel());
  try {
    (void)ch.call("fails");
    FAIL("no error");
  } catch (const not_found_error& e) {
    CHECK(std::string(e.what()).find("variable w9 not found") != std::string::npos);
  }
  CHECK_THROWS_AS(ch.call("drops"), internal_error);
  try {
    (void)ch.call("nope");
    FAIL("no error");
  } catch (const unimplemented_error& e) {
    CHECK(std::string(e.what()).find("'nope'") != std::string::npos);
  }
  CHECK_THROWS_AS(ch.call("fails", empty{}, {any_tensor(dtype::string, shape{1})}),
                  invalid_argument_error);
}

TEST_CASE("one client process's connections are served on one io thread, two processes' on two") {
  // A ps with two io threads and two workers, each with a master's channel and a peer
  // client's (control and bulk): each worker's step must run on a thread of its own, all
  // of it. The threads take sockets round-robin when they are accepted, so without moving
  // connections at their first request a worker's connections would be spread over both
  // threads (every step hopping between them), or both bulk connections would share one.
  rpc_server_options so = local_server();
  so.threads = 2;
  rpc_server srv(so);
  std::mutex mu;
  std::vector<std::pair<std::string, std::thread::id>> seen; // (client's call, thread)
  srv.handle("where", [&](request req, responder r) {
    {
      std::lock_guard lk(mu);
      seen.emplace_back(req.metadata<echo_meta>().text, std::this_thread::get_id());
    }
    r.reply(empty{});
  });
  auto of_process = [](std::uint64_t id) {
    channel_options o = local_channel();
    o.process_id = id;
    return o;
  };
  channel master_1(local_address(srv), of_process(1)), master_2(local_address(srv), of_process(2));
  channel a(local_address(srv), of_process(1)), b(local_address(srv), of_process(2));
  for (auto* ch : {&master_1, &master_2, &a, &b})
    ch->connect();
  const auto big = filled_f32(shape{300, 1000}, 1); // over the bulk threshold
  for (int round = 0; round < 3; ++round) {
    (void)master_1.call("where", echo_meta{"1 master", {}});
    (void)master_2.call("where", echo_meta{"2 master", {}});
    for (const auto& [ch, name] : {std::pair<channel*, std::string>{&b, "2"}, {&a, "1"}}) {
      (void)ch->call("where", echo_meta{name + " bulk", {}}, {big});
      (void)ch->call("where", echo_meta{name + " control", {}});
    }
  }
  // From each connection's second request on, it is where it stays.
  std::map<std::string, std::set<std::thread::id>> threads;
  {
    std::lock_guard lk(mu);
    std::map<std::string, int> calls;
    for (const auto& [call, thread] : seen)
      if (++calls[call] > 1)
        threads[call[0] == '1' ? "1" : "2"].insert(thread);
  }
  REQUIRE(threads["1"].size() == 1);
  REQUIRE(threads["2"].size() == 1);
  CHECK(*threads["1"].begin() != *threads["2"].begin());
  // The connections that moved carry every byte, both ways.
  add_echo(srv);
  for (auto* ch : {&a, &b}) {
    const auto res = ch->call("echo", echo_meta{"moved", {1}}, {big, big});
    CHECK(res.metadata<echo_meta>().text == "moved!");
    REQUIRE(res.payloads.size() == 2);
    CHECK(same_bytes(res.payloads[1], big));
  }
}

TEST_CASE("a small request can fetch a big reply (sent over the client's bulk connection)") {
  rpc_server srv(local_server());
  const auto value = filled_f32(shape{512, 1024}, 2); // 2 MiB, over the bulk threshold
  srv.handle("fetch", [&](request, responder r) { r.reply(empty{}, {value}); });
  srv.handle("ping", [](request, responder r) { r.reply(); });
  channel ch(local_address(srv), local_channel());
  for (int i = 0; i < 3; ++i) {
    auto big = ch.call_async("fetch");
    CHECK_NOTHROW(ch.call("ping"));
    const auto res = big.get();
    REQUIRE(res.payloads.size() == 1);
    CHECK(same_bytes(res.payloads[0], value));
  }
}

TEST_CASE("messages past the per-frame limits travel split into parts, in both directions") {
  // Small per-frame limits on both ends, so a few MiB and a hundred tensors split.
  frame_limits small;
  small.max_payloads = 16;
  small.max_frame_bytes = 64 << 10;
  auto so = local_server();
  so.limits = small;
  rpc_server srv(so);
  add_echo(srv);
  auto co = local_channel();
  co.limits = small;
  channel ch(local_address(srv), co);

  std::vector<any_tensor> in;
  for (int i = 0; i < 100; ++i)
    in.push_back(any_tensor::from_vector<std::int64_t>(shape{2}, {i, -i}));
  in.push_back(filled_f32(shape{1024, 300}, 7)); // 1.2 MB: about 38 parts
  in.push_back(any_tensor(dtype::f64, shape{0, 5}));
  in.push_back(any_tensor::from_vector<bool>(shape{3}, {true, false, true}));
  in.push_back(filled_f32(shape{3}, 1));
  echo_meta m{"split", {1, 2, 3}};
  any_tensor dest(dtype::f32, shape{1024, 300});
  call_options o;
  o.response_buffers.assign(in.size(), any_tensor{});
  o.response_buffers[100] = dest;
  const auto res = ch.call("echo", m, in, o);
  REQUIRE(res.payloads.size() == in.size());
  for (std::size_t i = 0; i < in.size(); ++i)
    CHECK_MESSAGE(same_bytes(res.payloads[i], in[i]), "payload " << i);
  CHECK(res.payloads[100].raw_data() == dest.raw_data()); // the parts went straight into dest
  CHECK(res.metadata<echo_meta>().text == "split!");
  CHECK(res.metadata<echo_meta>().ids == std::vector<std::int64_t>{1, 2, 3});
  // The connection goes on framing normally after a split message.
  CHECK(ch.call("echo", m, {filled_f32(shape{4}, 2)}).payloads.size() == 1);
}

TEST_CASE("past the message limits a sender fails at once and a receiver answers with an error") {
  frame_limits small;
  small.max_frame_bytes = 64 << 10;
  small.max_message_bytes = 256 << 10;
  SUBCASE("the sender's own limit") {
    rpc_server srv(local_server());
    add_echo(srv);
    auto co = local_channel();
    co.limits = small;
    channel ch(local_address(srv), co);
    try {
      (void)ch.call("echo", echo_meta{}, {filled_f32(shape{512, 256}, 1)});
      FAIL("no error");
    } catch (const resource_exhausted_error& e) {
      CHECK(std::string(e.what()).find("'echo'") != std::string::npos);
      CHECK(std::string(e.what()).find("524288 payload bytes") != std::string::npos);
    }
    CHECK(ch.call("echo", echo_meta{}, {filled_f32(shape{4}, 1)}).payloads.size() == 1);
  }
  SUBCASE("the receiver's limit") {
    auto so = local_server();
    so.limits = small;
    rpc_server srv(so);
    add_echo(srv);
    auto co = local_channel();
    co.limits.max_frame_bytes = 64 << 10; // splits, but allows what the server does not
    channel ch(local_address(srv), co);
    CHECK_THROWS_AS((void)ch.call("echo", echo_meta{}, {filled_f32(shape{512, 256}, 1)}),
                    resource_exhausted_error);
  }
}

TEST_CASE("a message of more than 1024 tensors needs no option") {
  rpc_server srv(local_server());
  add_echo(srv);
  channel ch(local_address(srv), local_channel());
  std::vector<any_tensor> in;
  for (int i = 0; i < 3000; ++i)
    in.push_back(any_tensor::from_vector<float>(shape{1}, {static_cast<float>(i)}));
  const auto res = ch.call("echo", echo_meta{}, in);
  REQUIRE(res.payloads.size() == 3000);
  CHECK(res.payloads[2999].flat<float>()[0] == 2999.0f);
}

namespace {

// A tensor of `bytes` bytes (u8-like: i32 elements) whose content depends on `seed`.
any_tensor patterned(std::size_t elements, std::uint32_t seed) {
  any_tensor t(dtype::i32, shape{static_cast<std::int64_t>(elements)});
  auto f = t.flat<std::int32_t>();
  for (std::size_t i = 0; i < f.size(); ++i)
    f[i] = static_cast<std::int32_t>(seed * 2654435761u + static_cast<std::uint32_t>(i));
  return t;
}

// What a "digest" reply says about the request's tensors: how many, and an FNV-1a hash of
// their shapes and bytes in order.
struct digest_meta {
  std::uint64_t count = 0, hash = 0;
  template <class A> void serialize(A& ar) { ar(count, hash); }
};

digest_meta digest_of(const std::vector<any_tensor>& ts) {
  digest_meta d{ts.size(), 1469598103934665603ull};
  const auto mix = [&](const void* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      d.hash ^= static_cast<const unsigned char*>(p)[i];
      d.hash *= 1099511628211ull;
    }
  };
  for (const auto& t : ts) {
    const auto n = t.num_elements();
    mix(&n, sizeof n);
    mix(t.raw_data(), t.byte_size());
  }
  return d;
}

} // namespace

// The receive buffer (connection.hpp) parses many frames out of one read and copies small
// payloads out of it; large ones are read straight into their tensors after a copied
// prefix. The write side copies the small buffers of a message of more than 64 into one
// run. Either would show here as a shifted, truncated or swapped byte.
TEST_CASE("buffered reads and coalesced writes keep frame boundaries and payload bytes") {
  rpc_server srv(local_server());
  add_echo(srv);
  srv.handle("digest", [](request req, responder r) { r.reply(digest_of(req.payloads())); });
  channel ch(local_address(srv), local_channel());

  SUBCASE("many small tensors around large ones, echoed in one message each way") {
    std::vector<any_tensor> in;
    for (std::uint32_t i = 0; i < 300; ++i) // 1 to 5000 elements: copied, and some not
      in.push_back(patterned(1 + (i * 37) % 5000, i));
    in.insert(in.begin() + 100, patterned((3u << 20) / 4 + 3, 1000)); // 3 MiB + 12 bytes
    in.push_back(patterned(70000, 1001));                             // past the buffer
    const auto res = ch.call("echo", echo_meta{"m", {1, 2}}, in);
    CHECK(res.metadata<echo_meta>().text == "m!");
    REQUIRE(res.payloads.size() == in.size());
    for (std::size_t i = 0; i < in.size(); ++i)
      CHECK_MESSAGE(same_bytes(res.payloads[i], in[i]), "payload " << i);
  }

  SUBCASE("a burst of calls in flight: their frames arrive back to back") {
    std::vector<call_handle> calls;
    std::vector<std::vector<any_tensor>> sent;
    for (std::uint32_t i = 0; i < 400; ++i) {
      std::vector<any_tensor> ts;
      for (std::uint32_t k = 0; k < i % 4; ++k)
        ts.push_back(patterned(1 + (i * 131 + k * 17) % (i % 50 == 0 ? 40000 : 700), i + k));
      sent.push_back(ts);
      calls.push_back(ch.call_async("digest", empty{}, std::move(ts)));
    }
    for (std::size_t i = 0; i < calls.size(); ++i) {
      const auto d = calls[i].get().metadata<digest_meta>();
      const auto want = digest_of(sent[i]);
      CHECK_MESSAGE((d.count == want.count && d.hash == want.hash), "call " << i);
    }
  }

  SUBCASE("frames split across reads at every kind of boundary, and many in one write") {
    raw_client raw(srv.port());
    raw.no_delay();
    raw.handshake();
    // Requests of 0 to 3 tensors, one of them larger than the receive buffer.
    std::string stream;
    std::vector<digest_meta> want;
    for (std::uint32_t i = 0; i < 12; ++i) {
      std::vector<any_tensor> ts;
      for (std::uint32_t k = 0; k < i % 4; ++k)
        ts.push_back(patterned(i == 6 && k == 1 ? 40000 : 3 + 11 * i + k, i * 10 + k));
      want.push_back(digest_of(ts));
      envelope env;
      env.method = "digest";
      stream += encode_frame(frame_kind::request, 100 + i, env, ts);
    }
    // First every frame in one write; then the same bytes (new request ids: a server drops
    // duplicates) in pieces of 1, 2, 3, ... 97 bytes, so that a read ends inside a header,
    // inside metadata, inside a payload and exactly at a frame's end.
    const auto expect_replies = [&](std::uint64_t first_id) {
      for (std::size_t i = 0; i < want.size(); ++i) {
        const auto f = raw.read_frame();
        CHECK(f.header.request_id == first_id + i);
        REQUIRE(f.meta.env.ok());
        const auto d = decode_metadata<digest_meta>(f.user_metadata(), "a digest");
        CHECK_MESSAGE((d.count == want[i].count && d.hash == want[i].hash), "request " << i);
      }
    };
    raw.write(stream);
    expect_replies(100);
    std::string again = stream;
    for (std::size_t at = 0; at < again.size();) { // the request ids, + 1000
      const auto h = parse_header(std::as_bytes(std::span<const char>(again.data() + at, 24)), {});
      net::detail::patch_u32(again, at + 8, static_cast<std::uint32_t>(h.request_id + 1000));
      const auto m = parse_metadata(
          h,
          std::as_bytes(std::span<const char>(again.data() + at + header_size, h.metadata_bytes)),
          {});
      at += header_size + h.metadata_bytes + m.payload_bytes;
    }
    for (std::size_t at = 0, piece = 1; at < again.size(); piece = piece % 97 + 1) {
      const std::size_t n = std::min(piece, again.size() - at);
      raw.write(std::string_view(again).substr(at, n));
      at += n;
      if (piece % 13 == 0)
        std::this_thread::sleep_for(1ms); // let the server drain its socket now and then
    }
    expect_replies(1100);
  }
}

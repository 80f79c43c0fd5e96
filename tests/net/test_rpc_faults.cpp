// The message layer under bad peers and bad configurations: unreachable peers,
// ports in use, garbage and oversized frames, half-sent payloads, tokens, stops.
#include <doctest/doctest.h>

#include "net_test_util.hpp"
#include <support/messages.hpp>

#include <asio/ip/tcp.hpp>

#include <chrono>
#include <future>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

using namespace loom;
using namespace loom::net;
using namespace loom::net::testing;
using namespace std::chrono_literals;

namespace {

void add_ping(rpc_server& srv) {
  srv.handle("ping", [](request, responder r) { r.reply(std::string("pong")); });
}

// A port nothing listens on (bound by the OS, then released).
std::uint16_t free_port() {
  asio::io_context io;
  asio::ip::tcp::acceptor a(io, {asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

using loom::testing::contains;

} // namespace

TEST_CASE("an unreachable peer gives a clear error after the connect deadline") {
  const auto port = free_port();
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  log_capture logs;
  channel_options o = local_channel("", logs.fn());
  o.connect_timeout = 400ms;
  o.initial_backoff = 20ms;
  channel ch(addr, o);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    ch.connect();
    FAIL("no error");
  } catch (const unavailable_error& e) {
    CHECK(contains(e.what(), "ps task 0 at " + addr));
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took >= 350ms);
  CHECK(took < 10s);
  CHECK(logs.contains("waiting for ps task 0 at " + addr));
  // A call does the same.
  call_options co;
  co.timeout = 200ms;
  CHECK_THROWS_AS(ch.call("ping", empty{}, {}, co), unavailable_error);
}

TEST_CASE("a channel that retries says so at once, then once per log interval with the "
          "attempts so far") {
  const auto port = free_port();
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  log_capture logs;
  channel_options o = local_channel("", logs.fn());
  o.connect_timeout = 1000ms;
  o.initial_backoff = 10ms;
  o.max_backoff = 10ms;
  o.log_interval = 300ms;
  channel ch(addr, o);
  CHECK_THROWS_AS(ch.connect(), unavailable_error);
  std::string text;
  {
    std::lock_guard lk(logs.m);
    for (const auto& line : logs.lines)
      text += line + "\n";
  }
  std::size_t lines = 0;
  for (auto at = text.find("waiting for ps task 0 at " + addr); at != std::string::npos;
       at = text.find("waiting for ps task 0 at " + addr, at + 1))
    ++lines;
  MESSAGE(text);
  // About 90 attempts in 1 s: a line at the first, then one every 300 ms.
  CHECK(lines >= 2);
  CHECK(lines <= 5);
  CHECK(contains(text, "waiting for ps task 0 at " + addr + " (attempt 1 in "));
  const std::regex later(R"(still waiting for ps task 0 at [0-9.:]+ \(attempt ([0-9]+) in)");
  std::smatch m;
  REQUIRE(std::regex_search(text, m, later));
  CHECK(std::stoi(m[1]) > 5);
}

TEST_CASE("a channel waits for a server that starts later") {
  const auto port = free_port();
  std::promise<void> waiting, done;
  std::once_flag once;
  channel_options o = local_channel("", [&](std::string_view line) {
    if (line.find("waiting for ps task 0 at 127.0.0.1:" + std::to_string(port)) !=
        std::string_view::npos)
      std::call_once(once, [&] { waiting.set_value(); });
  });
  o.initial_backoff = 20ms;
  o.max_backoff = 100ms;
  channel ch("127.0.0.1:" + std::to_string(port), o);
  std::thread starter([&, wf = waiting.get_future(), df = done.get_future()]() mutable {
    // Start the server once the channel has said that it waits for it.
    if (wf.wait_for(20s) != std::future_status::ready)
      return;
    rpc_server_options so = local_server();
    so.port = port;
    rpc_server srv(so);
    add_ping(srv);
    df.wait_for(20s);
  });
  std::string got;
  try {
    got = ch.call("ping").metadata<std::string>();
  } catch (const std::exception& e) {
    got = e.what();
  }
  done.set_value();
  starter.join();
  CHECK(got == "pong");
}

TEST_CASE("a port in use gives a clear error naming the address") {
  rpc_server a(local_server());
  rpc_server_options o = local_server();
  o.port = a.port();
  try {
    rpc_server b(o);
    FAIL("no error");
  } catch (const unavailable_error& e) {
    CHECK(contains(e.what(), "127.0.0.1:" + std::to_string(a.port())));
    CHECK(contains(e.what(), "in use"));
  }
}

TEST_CASE("garbage and oversized frames close only that connection") {
  log_capture logs;
  rpc_server srv(local_server("", logs.fn()));
  add_ping(srv);
  channel good(local_address(srv), local_channel());
  CHECK(good.call("ping").metadata<std::string>() == "pong");

  SUBCASE("garbage before the handshake") {
    raw_client raw(srv.port());
    raw.write("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    CHECK(raw.closed_by_peer());
    CHECK(logs.contains("bad frame"));
  }
  SUBCASE("an oversized declared frame before the handshake") {
    raw_client raw(srv.port());
    std::string h;
    begin_head(h, frame_kind::request, 9, 0);
    net::detail::patch_u32(h, 16, 0x7fffffffu); // 2 GiB of metadata
    raw.write(h);
    CHECK(raw.closed_by_peer());
  }
  SUBCASE("an oversized payload after the handshake gets an error reply") {
    raw_client raw(srv.port());
    raw.handshake();
    envelope env;
    env.method = "ping";
    std::string f;
    std::vector<any_tensor> t{any_tensor(dtype::f32, shape{4})};
    encode_head(f, frame_kind::request, 5, env, t, empty{});
    // Rewrite the dimension to 2^36 floats and the byte length to match: 256 GiB.
    const std::size_t d = header_size + 2 + 4 + 4 + 4 + 8;
    const std::uint64_t dim = std::uint64_t(1) << 36;
    for (int i = 0; i < 8; ++i) {
      f[d + 4 + i] = static_cast<char>((dim >> (8 * i)) & 0xff);
      f[d + 12 + i] = static_cast<char>(((dim * 4) >> (8 * i)) & 0xff);
    }
    raw.write(f);
    const auto reply = raw.read_frame();
    CHECK(reply.header.request_id == 5);
    CHECK(reply.meta.env.code() == error_code::resource_exhausted);
    CHECK(raw.closed_by_peer());
  }
  SUBCASE("an unknown frame kind gets an error reply") {
    raw_client raw(srv.port());
    raw.handshake();
    std::string f = encode_frame(frame_kind::request, 6, envelope{}, {});
    f[5] = 42;
    raw.write(f);
    const auto reply = raw.read_frame();
    CHECK(reply.header.request_id == 6);
    CHECK(reply.meta.env.code() == error_code::unimplemented);
    CHECK(raw.closed_by_peer());
  }
  SUBCASE("an unknown protocol version gets an error reply") {
    raw_client raw(srv.port());
    raw.handshake();
    std::string f = encode_frame(frame_kind::request, 8, envelope{}, {});
    f[4] = 9;
    raw.write(f);
    const auto reply = raw.read_frame();
    CHECK(reply.header.request_id == 8);
    CHECK(reply.meta.env.code() == error_code::unimplemented);
    CHECK(reply.meta.env.message.find("version 9") != std::string::npos);
    CHECK(raw.closed_by_peer());
  }
  SUBCASE("split messages out of order get an error reply") {
    raw_client raw(srv.port());
    raw.handshake();
    envelope env;
    env.method = "ping";
    frame_limits lim;
    lim.max_frame_bytes = 4096;
    out_frame m;
    encode_message(m, frame_kind::request, 11, env, {any_tensor(dtype::f32, shape{4096})}, empty{},
                   lim);
    std::vector<std::string> frames; // the head, then its parts with their bytes
    for (const auto& p : m.pieces) {
      if (p.source == 0)
        frames.emplace_back(m.head, p.offset, p.bytes);
      else
        frames.back().append(
            static_cast<const char*>(m.payloads[p.source - 1].raw_data()) + p.offset, p.bytes);
    }
    REQUIRE(frames.size() == 9); // 16 KiB in parts of 2 KiB
    std::string expect;
    SUBCASE("a part without a head") {
      raw.write(frames[1]);
      expect = "without a split head";
    }
    SUBCASE("another frame between the head and its parts") {
      raw.write(frames[0]);
      raw.write(encode_frame(frame_kind::request, 12, env, {}));
      expect = "was due";
    }
    SUBCASE("a part past the message's bytes") {
      for (std::size_t i = 0; i < frames.size(); ++i)
        raw.write(frames[i]);
      raw.write(frames[1]); // the message was complete: this part belongs to none
      CHECK(raw.read_frame().header.request_id == 11); // ping's own reply
      expect = "without a split head";
    }
    const auto reply = raw.read_frame();
    CHECK(reply.meta.env.code() == error_code::data_loss);
    CHECK_MESSAGE(reply.meta.env.message.find(expect) != std::string::npos, reply.meta.env.message);
    CHECK(raw.closed_by_peer());
  }
  SUBCASE("a client that disconnects in the middle of a payload") {
    raw_client raw(srv.port());
    raw.handshake();
    envelope env;
    env.method = "ping";
    std::string f;
    std::vector<any_tensor> t{any_tensor(dtype::f32, shape{256, 1024})}; // 1 MiB
    encode_head(f, frame_kind::request, 7, env, t, empty{});
    f.append(1000, 'x');
    raw.write(f);
    raw.close();
  }
  // The well-behaved client is still served, on its old connection and on a new one.
  CHECK(good.call("ping").metadata<std::string>() == "pong");
  channel fresh(local_address(srv), local_channel());
  CHECK(fresh.call("ping").metadata<std::string>() == "pong");
}

TEST_CASE("tokens: wrong or missing tokens are unauthenticated, the server keeps serving") {
  log_capture logs;
  rpc_server srv(local_server("s3cret", logs.fn()));
  add_ping(srv);
  const std::string addr = local_address(srv);

  channel right(addr, local_channel("s3cret"));
  CHECK(right.call("ping").metadata<std::string>() == "pong");

  SUBCASE("wrong token") {
    channel wrong(addr, local_channel("guess"));
    try {
      wrong.connect();
      FAIL("no error");
    } catch (const unauthenticated_error& e) {
      CHECK(contains(e.what(), addr));
    }
    CHECK(logs.contains("wrong cluster token"));
  }
  SUBCASE("missing token") {
    channel none(addr, local_channel(""));
    try {
      (void)none.call("ping");
      FAIL("no error");
    } catch (const unauthenticated_error& e) {
      CHECK(contains(e.what(), addr));
      CHECK(contains(e.what(), "LOOM_CLUSTER_TOKEN"));
    }
    CHECK(logs.contains("presented no cluster token"));
  }
  SUBCASE("a raw client that skips the proof") {
    raw_client raw(srv.port());
    raw.write(encode(hello_msg{connection_role::control, false, 1, random_nonce()}));
    const auto ch = raw.read_frame();
    CHECK(decode_challenge(std::as_bytes(std::span<const char>(ch.metadata))).token_required);
    raw.write(encode(auth_msg{}));
    const auto r = raw.read_frame();
    CHECK(decode_auth_result(std::as_bytes(std::span<const char>(r.metadata))).status ==
          status_of(error_code::unauthenticated));
    CHECK(raw.closed_by_peer());
  }
  CHECK(right.call("ping").metadata<std::string>() == "pong");
}

TEST_CASE("a client with a token refuses a server without one") {
  rpc_server srv(local_server(""));
  add_ping(srv);
  channel ch(local_address(srv), local_channel("s3cret"));
  try {
    ch.connect();
    FAIL("no error");
  } catch (const unauthenticated_error& e) {
    CHECK(contains(e.what(), local_address(srv)));
  }
}

TEST_CASE("serving beyond loopback needs a token unless insecure mode is requested") {
  rpc_server_options o = local_server("");
  o.host = "0.0.0.0";
  const char* env = std::getenv("LOOM_ALLOW_INSECURE");
  const std::string saved = env ? env : "";
  ::unsetenv("LOOM_ALLOW_INSECURE");
  try {
    rpc_server s(o);
    FAIL("no error");
  } catch (const failed_precondition_error& e) {
    CHECK(contains(e.what(), "0.0.0.0"));
    CHECK(contains(e.what(), "LOOM_CLUSTER_TOKEN"));
    CHECK(contains(e.what(), "allow_insecure"));
  }
  {
    rpc_server_options insecure = o;
    insecure.allow_insecure = true;
    rpc_server s(insecure);
    CHECK(s.port() != 0);
    add_ping(s);
    channel ch("127.0.0.1:" + std::to_string(s.port()), local_channel(""));
    CHECK(ch.call("ping").metadata<std::string>() == "pong");
  }
  {
    ::setenv("LOOM_ALLOW_INSECURE", "1", 1);
    CHECK_NOTHROW(rpc_server{o});
    ::unsetenv("LOOM_ALLOW_INSECURE");
  }
  {
    rpc_server_options tok = o;
    tok.token = "s3cret";
    CHECK_NOTHROW(rpc_server{tok});
  }
  if (env)
    ::setenv("LOOM_ALLOW_INSECURE", saved.c_str(), 1);
}

TEST_CASE("stopping with calls in flight fails them cleanly") {
  std::mutex m;
  std::vector<responder> held;
  std::condition_variable cv;
  auto holder = [&](request, responder r) {
    std::lock_guard lk(m);
    held.push_back(std::move(r));
    cv.notify_all();
  };
  auto wait_held = [&](std::size_t n) {
    std::unique_lock lk(m);
    return cv.wait_for(lk, 20s, [&] { return held.size() >= n; });
  };
  const auto fails_unavailable = [](call_handle& h, const std::string& addr) {
    try {
      (void)h.get();
      FAIL("no error");
    } catch (const unavailable_error& e) {
      CHECK(contains(e.what(), addr));
    }
  };

  SUBCASE("the server stops: calls fail with unavailable, later calls too") {
    auto srv = std::make_unique<rpc_server>(local_server());
    srv->handle("hold", holder);
    const std::string addr = local_address(*srv);
    channel_options co = local_channel();
    co.reconnect_timeout = 100ms;
    channel ch(addr, co);
    std::vector<call_handle> hs;
    for (int i = 0; i < 4; ++i)
      hs.push_back(ch.call_async("hold"));
    REQUIRE(wait_held(4));
    srv->stop();
    for (auto& h : hs)
      fails_unavailable(h, addr);
    srv.reset();
    {
      std::lock_guard lk(m);
      held.clear(); // replying on a stopped server is a no-op
    }
    try {
      (void)ch.call("hold");
      FAIL("no error");
    } catch (const unavailable_error& e) {
      CHECK(contains(e.what(), "ps task 0 at " + addr));
    }
  }
  SUBCASE("the server stops with a grace period: what it answers within it arrives, "
          "however large") {
    auto srv = std::make_unique<rpc_server>(local_server());
    srv->handle("hold", holder);
    channel ch(local_address(*srv), local_channel());
    std::vector<call_handle> hs;
    for (int i = 0; i < 2; ++i)
      hs.push_back(ch.call_async("hold"));
    REQUIRE(wait_held(2));
    std::thread stopper([&] { srv->stop(5s); });
    std::this_thread::sleep_for(200ms); // stop() waits for the answers
    // Far more than the sockets hold: still being written when the last answer lets the
    // connection finish.
    const std::string big(48 << 20, 'x');
    {
      std::lock_guard lk(m);
      held[0].reply(std::string("answered while stopping"));
      held[1].reply(big);
    }
    stopper.join();
    CHECK(hs[0].get().metadata<std::string>() == "answered while stopping");
    CHECK(hs[1].get().metadata<std::string>() == big);
    srv.reset();
    std::lock_guard lk(m);
    held.clear();
  }
  SUBCASE("the server stops with a grace period: a call not answered within it fails") {
    auto srv = std::make_unique<rpc_server>(local_server());
    srv->handle("hold", holder);
    const std::string addr = local_address(*srv);
    channel ch(addr, local_channel());
    call_handle h = ch.call_async("hold");
    REQUIRE(wait_held(1));
    srv->stop(300ms);
    fails_unavailable(h, addr);
    srv.reset();
    std::lock_guard lk(m);
    held.clear(); // replying on a stopped server is a no-op
  }
  SUBCASE("the server stops with a grace period: an idle client does not hold it") {
    // Nobody reads an idle channel's connections (a caller waiting for a reply does), so
    // its end of stream waits: the server closes once the client's side has acknowledged
    // it, not after linger_time (1 s).
    auto srv = std::make_unique<rpc_server>(local_server());
    add_ping(*srv);
    channel ch(local_address(*srv), local_channel());
    CHECK(ch.call("ping").metadata<std::string>() == "pong");
    std::this_thread::sleep_for(200ms); // the channel's io thread stops reading
    const auto start = std::chrono::steady_clock::now();
    srv->stop(5s);
    CHECK(std::chrono::steady_clock::now() - start < 800ms);
  }
  SUBCASE("the channel stops: calls fail with cancelled") {
    rpc_server srv(local_server());
    srv.handle("hold", holder);
    channel ch(local_address(srv), local_channel());
    std::vector<call_handle> hs;
    for (int i = 0; i < 4; ++i)
      hs.push_back(ch.call_async("hold"));
    REQUIRE(wait_held(4));
    ch.stop();
    for (auto& h : hs)
      CHECK_THROWS_AS(h.get(), cancelled_error);
    CHECK_THROWS_AS(ch.call("hold"), cancelled_error);
    std::lock_guard lk(m);
    held.clear();
  }
}

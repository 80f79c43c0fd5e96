// loom's message layer against raw TCP on the same loopback, in one run:
//   (a) a small message: raw blocking-socket ping-pong vs an RPC round trip of a
//       scalar tensor request/response;
//   (b) 64 MB: raw TCP one-way and echoed vs a 64 MB float tensor sent through
//       the RPC (one-way with an empty reply, and echoed back), with the layer
//       allocating the destination and with caller-supplied destinations.
// Targets: RPC round trip <= 2.0 x raw ping-pong; 64 MB bytes/s >= 0.9 x raw.
//   (c) with --huge only: a 1.5 GiB tensor one-way, past the 1 GiB frame limit (the
//       layer splits it into 64 MiB parts, received straight into the tensor), against
//       raw TCP one-way. LOOM_HUGE_MIB=N sets the size (1000 against 1100 compares one
//       frame with a split message of about the same size).
// Flags: --quick (fewer repetitions), --bulk (only the 64 MB cases), --smoke (every
// case once, with the fewest warm-up calls: a test that they still run, ctest
// bench_net_transfer_smoke; its figures mean nothing). Figures: docs/wire-protocol.md.
#include "../bench_util.hpp"
#include "../raw_tcp.hpp"

#include <loom/net/rpc.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace loom;

namespace {

constexpr std::size_t small_bytes = 64;
constexpr std::size_t bulk_bytes = 64u << 20;

using loom::bench::raw::check;
using loom::bench::raw::nodelay;
using loom::bench::raw::read_all;
using loom::bench::raw::write_all;
using raw_server = loom::bench::raw::server;
using raw_client = loom::bench::raw::client;

// The same ping-pong, but a reader thread receives the reply and hands it to the
// calling thread through a condition variable: the floor of any design where a
// background io thread reads responses (one extra thread wake-up per call).
double raw_handoff_case(int reps, int inner) {
  raw_server srv(small_bytes, small_bytes);
  raw_client cli(srv.port());
  std::vector<char> out(small_bytes, 'q'), in(small_bytes);
  std::mutex m;
  std::condition_variable cv;
  long sent = 0, received = 0;
  bool stop = false;
  std::thread reader([&] {
    for (;;) {
      {
        std::unique_lock lk(m);
        cv.wait(lk, [&] { return stop || sent > received; });
        if (stop)
          return;
      }
      cli.receive(in);
      {
        std::lock_guard lk(m);
        ++received;
      }
      cv.notify_all();
    }
  });
  const auto once = [&] {
    cli.send(out);
    std::unique_lock lk(m);
    ++sent;
    cv.notify_all();
    cv.wait(lk, [&] { return received == sent; });
  };
  for (int i = 0; i < 3; ++i)
    once();
  const double t = bench::median_seconds(once, reps, inner);
  {
    std::lock_guard lk(m);
    stop = true;
  }
  cv.notify_all();
  reader.join();
  return t;
}

double raw_case(std::size_t request, std::size_t reply, int reps, int inner) {
  raw_server srv(request, reply);
  raw_client cli(srv.port());
  std::vector<char> out(request, 'q'), in(reply);
  for (int i = 0; i < 3; ++i)
    cli.exchange(out, in); // warm up
  return bench::median_seconds([&] { cli.exchange(out, in); }, reps, inner);
}

// (c): one tensor of 1.5 GiB, one-way, against raw TCP; 3 repetitions each, alternating.
int huge_case() {
  const std::size_t huge_bytes =
      std::size_t(std::getenv("LOOM_HUGE_MIB") ? std::atoi(std::getenv("LOOM_HUGE_MIB")) : 1536)
      << 20;
  std::printf("loom net_transfer --huge: a %zu MiB tensor one-way (split past the 1 GiB frame "
              "limit)\n",
              huge_bytes >> 20);
  net::rpc_server_options so;
  so.token = "bench-token";
  net::rpc_server srv(so);
  srv.handle("sink", [](net::request req, net::responder r) {
    const auto& t = req.payloads().at(0);
    const auto* b = static_cast<const unsigned char*>(t.raw_data());
    if (b[0] != 1 || b[t.byte_size() - 1] != 1)
      throw data_loss_error("the tensor's bytes did not arrive");
    r.reply();
  });
  any_tensor server_buffer(dtype::f32, shape{static_cast<std::int64_t>(huge_bytes / 4)});
  std::memset(server_buffer.raw_data(), 0, server_buffer.byte_size());
  srv.handle(
      "sink_into", [](net::request, net::responder r) { r.reply(); },
      [&](const net::request_preview&, std::size_t, const net::payload_info&) {
        return server_buffer;
      });
  net::channel_options co;
  co.token = "bench-token";
  co.peer_name = "bench server";
  co.default_timeout = std::chrono::minutes(2);
  net::channel ch("127.0.0.1:" + std::to_string(srv.port()), co);
  ch.connect();
  any_tensor big(dtype::f32, shape{static_cast<std::int64_t>(huge_bytes / 4)});
  std::memset(big.raw_data(), 1, big.byte_size());
  std::vector<double> raw, rpc, rpc_into;
  for (int i = 0; i < 3; ++i) {
    raw.push_back(raw_case(huge_bytes, 1, 1, 1));
    rpc.push_back(bench::median_seconds([&] { (void)ch.call("sink", net::empty{}, {big}); }, 1));
    rpc_into.push_back(
        bench::median_seconds([&] { (void)ch.call("sink_into", net::empty{}, {big}); }, 1));
  }
  for (auto* v : {&raw, &rpc, &rpc_into})
    std::sort(v->begin(), v->end());
  bench::print_table("(c) 1.5 GiB one-way, median of 3",
                     {{"raw TCP (buffers reused)", raw[1]},
                      {"loom RPC in 64 MiB parts, layer allocates", rpc[1]},
                      {"loom RPC in 64 MiB parts, into a preallocated tensor", rpc_into[1]}},
                     "ms", 1e3);
  std::printf("bytes/s loom / raw = %.2f (allocating), %.2f (preallocated)\n", raw[1] / rpc[1],
              raw[1] / rpc_into[1]);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool quick = mode == "--quick", bulk_only = mode == "--bulk", smoke = mode == "--smoke";
  if (mode == "--huge")
    return huge_case();
  const int small_reps = bulk_only || smoke ? 1 : quick ? 5 : 21;
  const int small_inner = smoke ? 1 : bulk_only ? 10 : quick ? 200 : 1000;
  const int bulk_reps = smoke ? 1 : quick ? 3 : 11;
  const int rpc_warm_up = smoke ? 1 : 100, bulk_warm_up = smoke ? 1 : 2;

  std::printf("loom net_transfer: loopback, %zu-byte messages and %zu MB tensors\n", small_bytes,
              bulk_bytes >> 20);

  // ---- (a) small messages ----
  const double raw_pp = raw_case(small_bytes, small_bytes, small_reps, small_inner);
  const double raw_handoff = raw_handoff_case(small_reps, small_inner);

  net::rpc_server_options so;
  so.token = "bench-token";
  so.threads = std::getenv("LOOM_BENCH_SERVER_THREADS")
                   ? std::atoi(std::getenv("LOOM_BENCH_SERVER_THREADS"))
                   : 2;
  net::rpc_server srv(so);
  srv.handle("echo", [](net::request req, net::responder r) {
    r.reply(net::empty{}, std::move(req.payloads()));
  });
  srv.handle("sink", [](net::request, net::responder r) { r.reply(); });
  // Receive into one preallocated buffer, as a ps receives into a variable.
  any_tensor server_buffer(dtype::f32, shape{static_cast<std::int64_t>(bulk_bytes / 4)});
  const auto into_buffer = [&](const net::request_preview&, std::size_t,
                               const net::payload_info& p) -> any_tensor {
    return p.shape == server_buffer.shape() ? server_buffer : any_tensor{};
  };
  srv.handle(
      "echo_into",
      [](net::request req, net::responder r) { r.reply(net::empty{}, std::move(req.payloads())); },
      into_buffer);
  srv.handle(
      "sink_into", [](net::request, net::responder r) { r.reply(); }, into_buffer);

  net::channel_options co;
  co.token = "bench-token";
  co.peer_name = "bench server";
  net::channel ch("127.0.0.1:" + std::to_string(srv.port()), co);
  ch.connect();

  const auto scalar = any_tensor::scalar<float>(1.f);
  for (int i = 0; i < rpc_warm_up; ++i)
    (void)ch.call("echo", net::empty{}, {scalar});
  const double rpc_rt = bench::median_seconds(
      [&] { (void)ch.call("echo", net::empty{}, {scalar}); }, small_reps, small_inner);
  const double rpc_meta =
      bench::median_seconds([&] { (void)ch.call("sink"); }, small_reps, small_inner);

  bench::print_table("(a) small message round trip",
                     {{"raw TCP ping-pong (64 B each way)", raw_pp},
                      {"loom RPC, scalar tensor request+response", rpc_rt},
                      {"loom RPC, empty request+response", rpc_meta},
                      {"raw TCP + reader-thread handoff (floor)", raw_handoff}});

  // ---- (b) 64 MB ----
  const double raw_one = raw_case(bulk_bytes, 1, bulk_reps, 1);
  const double raw_echo = raw_case(bulk_bytes, bulk_bytes, bulk_reps, 1);

  any_tensor big(dtype::f32, shape{static_cast<std::int64_t>(bulk_bytes / 4)});
  std::memset(big.raw_data(), 1, big.byte_size());
  any_tensor client_buffer(dtype::f32, big.shape());
  for (int i = 0; i < bulk_warm_up; ++i)
    (void)ch.call("echo", net::empty{}, {big});

  const double rpc_one =
      bench::median_seconds([&] { (void)ch.call("sink", net::empty{}, {big}); }, bulk_reps);
  const double rpc_one_into =
      bench::median_seconds([&] { (void)ch.call("sink_into", net::empty{}, {big}); }, bulk_reps);
  const double rpc_echo =
      bench::median_seconds([&] { (void)ch.call("echo", net::empty{}, {big}); }, bulk_reps);
  const double rpc_echo_into = bench::median_seconds(
      [&] {
        net::call_options o;
        o.response_buffers = {client_buffer};
        (void)ch.call("echo_into", net::empty{}, {big}, std::move(o));
      },
      bulk_reps);

  bench::print_table("(b1) 64 MB one-way (reply: 1 byte raw / empty RPC)",
                     {{"raw TCP", raw_one},
                      {"loom RPC, layer allocates destination", rpc_one},
                      {"loom RPC, into a preallocated tensor", rpc_one_into}},
                     "ms", 1e3);
  bench::print_table("(b2) 64 MB echoed back",
                     {{"raw TCP", raw_echo},
                      {"loom RPC, layer allocates destinations", rpc_echo},
                      {"loom RPC, into preallocated tensors", rpc_echo_into}},
                     "ms", 1e3);

  const auto gbps = [](double bytes, double s) { return bytes / s / 1e9; };
  std::printf("\nthroughput (GB/s): raw one-way %.2f, loom one-way %.2f (allocating) %.2f "
              "(preallocated); raw echo %.2f, loom echo %.2f / %.2f\n",
              gbps(bulk_bytes, raw_one), gbps(bulk_bytes, rpc_one), gbps(bulk_bytes, rpc_one_into),
              gbps(2.0 * bulk_bytes, raw_echo), gbps(2.0 * bulk_bytes, rpc_echo),
              gbps(2.0 * bulk_bytes, rpc_echo_into));
  std::printf("targets: RPC round trip / raw ping-pong = %.2f (<= 2.0); "
              "64 MB bytes/s loom / raw = %.2f one-way, %.2f echo (>= 0.9, preallocated)\n",
              rpc_rt / raw_pp, raw_one / rpc_one_into, raw_echo / rpc_echo_into);
  return 0;
}

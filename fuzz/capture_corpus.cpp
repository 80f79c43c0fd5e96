// Writes the fuzz targets' seed corpora from the frames of a real exchange.
//
//   capture_corpus <corpus dir>    (fuzz/corpus; run by the target capture_fuzz_corpus)
//
// It starts a ps and a worker (each forked into a process of its own, so the
// session reaches both over TCP, never in memory), with a cluster token, and
// puts a recording TCP proxy in front of the ps: the worker's and the
// session's cluster spec name the proxy as the ps, the ps itself listens
// behind it. A session then trains a small model (variables on the ps,
// gradients sent worker -> ps), feeds and fetches string tensors on the ps,
// fails a step, resets the containers and shuts the cluster down. The proxy
// cuts both directions of every connection into frames with the library's own
// parse_header/parse_metadata and writes, one file per distinct content:
//
//   frame_decoder_fuzz/<hash>  each whole frame up to 64 KiB: handshake
//                              (hello, challenge, auth, auth_result), requests,
//                              responses (errors included)
//   rpc_metadata_fuzz/<hash>   the selector byte of rpc_metadata_fuzz.cpp, then
//                              the caller's metadata of each loom.* request and
//                              response; register_graph's graph bytes alone too
#include <loom/api.hpp>
#include <loom/net/frame.hpp>
#include <loom/runtime/protocol.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
using namespace loom;

constexpr std::size_t max_corpus_frame = 64u << 10;
const std::string cluster_token = "fuzz-corpus-token";

// A listening socket on 127.0.0.1, port chosen by the OS.
int listen_any(int& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 64) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw unavailable_error("capture_corpus: cannot listen on 127.0.0.1");
  port = ntohs(a.sin_port);
  return fd;
}

// A port free now (the servers bind it a moment later).
int free_port() {
  int port = 0;
  ::close(listen_any(port));
  return port;
}

// The captured frames, with the method each request and response belongs to.
class recorder {
public:
  struct frame {
    std::string bytes;
    std::string method; // of the request, for a response; "" for handshake frames
  };

  void add(frame f) {
    std::lock_guard lock(mu_);
    frames_.push_back(std::move(f));
  }
  std::vector<frame> frames() {
    std::lock_guard lock(mu_);
    return frames_;
  }

private:
  std::mutex mu_;
  std::vector<frame> frames_;
};

// Request ids -> methods of one proxied connection (responses carry no method).
struct call_book {
  std::mutex mu;
  std::map<std::uint64_t, std::string> methods;
};

// Cuts one direction of a connection into frames as bytes pass through.
class frame_cutter {
public:
  frame_cutter(recorder& rec, call_book& book, bool from_client)
      : rec_(rec), book_(book), from_client_(from_client) {}

  void feed(const char* p, std::size_t n) {
    if (broken_)
      return;
    buf_.append(p, n);
    try {
      while (cut_one()) {
      }
    } catch (const error& e) { // not loom's framing: forward it, capture nothing more
      std::cerr << "capture_corpus: stopped cutting a stream: " << e.what() << "\n";
      broken_ = true;
    }
  }

private:
  bool cut_one() {
    if (buf_.size() < net::header_size)
      return false;
    const auto bytes = std::as_bytes(std::span<const char>(buf_.data(), buf_.size()));
    const net::frame_header h = net::parse_header(bytes.first(net::header_size), limits_);
    const std::size_t head = net::header_size + h.metadata_bytes;
    if (buf_.size() < head)
      return false;
    std::size_t total = head;
    std::string method;
    if (!net::is_handshake_kind(h.kind)) {
      const auto meta =
          net::parse_metadata(h, bytes.subspan(net::header_size, h.metadata_bytes), limits_);
      if (!net::is_split_head(h))
        total += meta.payload_bytes;
      std::lock_guard lock(book_.mu);
      if (from_client_ && h.kind == net::frame_kind::request) {
        book_.methods[h.request_id] = meta.env.method;
        method = meta.env.method;
      } else if (auto it = book_.methods.find(h.request_id); it != book_.methods.end())
        method = it->second;
    }
    if (buf_.size() < total)
      return false;
    rec_.add({buf_.substr(0, total), method});
    buf_.erase(0, total);
    return true;
  }

  recorder& rec_;
  call_book& book_;
  bool from_client_;
  bool broken_ = false;
  std::string buf_;
  net::frame_limits limits_{};
};

// Copies `from` to `to`, cutting what passes into frames; closes `to`'s write
// side when `from` ends.
void pump(int from, int to, frame_cutter cutter) {
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(from, buf, sizeof buf);
    if (n <= 0)
      break;
    cutter.feed(buf, static_cast<std::size_t>(n));
    for (ssize_t sent = 0; sent < n;) {
      const ssize_t w = ::write(to, buf + sent, static_cast<std::size_t>(n - sent));
      if (w <= 0)
        return;
      sent += w;
    }
  }
  ::shutdown(to, SHUT_WR);
}

// Accepts connections on `listener` and relays each to 127.0.0.1:`target_port`.
void run_proxy(int listener, int target_port, recorder& rec) {
  for (;;) {
    const int client = ::accept(listener, nullptr, nullptr);
    if (client < 0)
      return;
    const int server = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(target_port));
    if (::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(client);
      ::close(server);
      continue;
    }
    auto* book = new call_book; // lives as long as the process: its pumps are never joined
    std::thread(pump, client, server, frame_cutter(rec, *book, true)).detach();
    std::thread(pump, server, client, frame_cutter(rec, *book, false)).detach();
  }
}

// Serves one task until the cluster is shut down, in a child process.
pid_t fork_task(const cluster_spec& cluster, const std::string& job) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      server_options o;
      o.token = cluster_token;
      o.intra_op_threads = 1;
      o.log = [](std::string_view) {};
      server s(cluster, job, 0, o);
      s.join();
    } catch (const std::exception& e) {
      std::cerr << "capture_corpus: " << job << " task failed: " << e.what() << "\n";
      std::_Exit(1);
    }
    std::_Exit(0);
  }
  return pid;
}

cluster_session_options capture_session_options() {
  cluster_session_options o;
  o.token = cluster_token;
  o.quiet = true;
  return o;
}

// The exchange: training with variables on the ps, strings fed to and fetched
// from the ps, a failing step, a reset and the shutdown.
void run_exchange(const std::string& target) {
  graph g;
  placeholder<float, 2> x(g, shape{-1, 3}, "x");
  placeholder<float, 2> y(g, shape{-1, 2}, "y");
  std::optional<variable<float, 2>> w;
  std::optional<variable<float, 1>> b;
  std::optional<variable<float, 0>> never_initialized;
  std::optional<placeholder<std::string, 1>> words;
  node_id echoed = 0;
  std::optional<output<std::int64_t, 1>> buckets;
  {
    auto _ = g.device("/job:ps/task:0");
    w.emplace(g, "w", shape{3, 2}, random_normal_initializer{.stddev = 0.5});
    b.emplace(g, "b", shape{2}, ones_initializer{});
    never_initialized.emplace(g, "never_initialized", shape{}, zeros_initializer{});
    words.emplace(g, shape{2}, "words");
    echoed = g.add_node("identity", {words->id()});
    buckets.emplace(string_to_hash_bucket_fast(*words, 16));
  }
  output<float, 0> loss = [&] {
    auto _ = g.device("/job:worker/task:0");
    return lower(reduce_mean(square(xw_plus_b(x, *w, *b) - y)));
  }();
  operation train = [&] {
    auto _ = g.device("/job:worker/task:0");
    return gradient_descent_optimizer{0.1}.minimize(loss);
  }();
  const auto batch_x = tensor<float, 2>(shape{4, 3}, {1, 2, 3, 0, 1, 0, -1, 2, 1, 3, 0, 1});
  const auto batch_y = tensor<float, 2>(shape{4, 2}, {1, 0, 0, 1, 1, 1, 0.5f, -1});

  session s(g, target, capture_session_options());
  s.run(global_variables_initializer(g));
  for (int step = 0; step < 3; ++step)
    s.run(fetches(train, loss), {{x, batch_x}, {y, batch_y}});
  (void)s.run_nodes(
      {echoed, buckets->id()}, {},
      {{words->id(), any_tensor::from_vector<std::string>(shape{2}, {"alpha", "beta"})}});
  try {
    (void)s.run(*never_initialized); // an error response
  } catch (const error&) {
  }
  session::reset(target, {}, capture_session_options());
}

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s)
    h = (h ^ c) * 1099511628211ull;
  return h;
}

// Writes `bytes` to dir/<hash of bytes>; returns whether the file is new.
bool write_unique(const fs::path& dir, const std::string& bytes) {
  char name[17];
  std::snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(fnv1a(bytes)));
  const fs::path p = dir / name;
  if (fs::exists(p))
    return false;
  std::ofstream(p, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return true;
}

// rpc_metadata_fuzz's selector for the metadata of a frame of `method`.
std::optional<std::uint8_t> selector_of(const std::string& method, bool response) {
  namespace p = protocol;
  if (method == p::cluster_info)
    return response ? 0 : 10;
  if (method == p::register_graph)
    return response ? 2 : 1;
  if (method == p::deregister_graph)
    return response ? 10 : 3;
  if (method == p::run_graph)
    return response ? 5 : 4;
  if (method == p::rendezvous_put)
    return response ? 10 : 6;
  if (method == p::abort_step)
    return response ? 10 : 7;
  if (method == p::reset)
    return response ? 10 : 8;
  if (method == p::shutdown)
    return 10;
  return std::nullopt;
}

void write_corpus(const fs::path& root, const std::vector<recorder::frame>& frames) {
  const fs::path frame_dir = root / "frame_decoder_fuzz", rpc_dir = root / "rpc_metadata_fuzz";
  fs::create_directories(frame_dir);
  fs::create_directories(rpc_dir);
  int whole = 0, metadata = 0;
  for (const auto& f : frames) {
    if (f.bytes.size() <= max_corpus_frame)
      whole += write_unique(frame_dir, f.bytes);
    const auto bytes = std::as_bytes(std::span<const char>(f.bytes.data(), f.bytes.size()));
    const net::decoded_frame d = net::decode_frame(bytes);
    if (net::is_handshake_kind(d.header.kind) || net::is_part(d.header))
      continue;
    const bool response = d.header.kind == net::frame_kind::response;
    const auto sel = selector_of(f.method, response);
    if (!sel || !d.meta.env.ok())
      continue;
    // The high 4 bits: the payloads that came beside the string tensors.
    const auto payloads = static_cast<std::uint8_t>(std::min<std::size_t>(d.payloads.size(), 15));
    const std::string user(d.user_metadata());
    metadata +=
        write_unique(rpc_dir, std::string(1, static_cast<char>(*sel | (payloads << 4))) + user);
    if (*sel == 1) // register_graph: its graph alone, for the graph decoder
      metadata += write_unique(
          rpc_dir,
          std::string(1, '\x09') +
              net::decode_metadata<protocol::register_graph_request>(user, "a capture").graph);
  }
  std::cout << "capture_corpus: " << frames.size() << " frames captured; wrote " << whole
            << " new frame files to " << frame_dir.string() << " and " << metadata
            << " new metadata files to " << rpc_dir.string() << "\n";
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: capture_corpus <corpus dir>\n";
    return 2;
  }
  // Forked before any thread exists in this process.
  const int ps_port = free_port(), worker_port = free_port();
  int proxy_port = 0;
  const int proxy = listen_any(proxy_port);
  auto address = [](int port) { return "127.0.0.1:" + std::to_string(port); };
  const cluster_spec behind{{"ps", {address(ps_port)}}, {"worker", {address(worker_port)}}};
  const cluster_spec proxied{{"ps", {address(proxy_port)}}, {"worker", {address(worker_port)}}};
  const pid_t ps = fork_task(behind, "ps");
  const pid_t worker = fork_task(proxied, "worker");
  recorder rec;
  std::thread(run_proxy, proxy, ps_port, std::ref(rec)).detach();
  int status = 0;
  try {
    const std::string target = "loom://" + address(worker_port);
    run_exchange(target);
    const auto report = session::shutdown_cluster(target, {}, capture_session_options());
    if (!report.all_stopped())
      throw unavailable_error("capture_corpus: some tasks did not stop");
  } catch (const std::exception& e) {
    std::cerr << "capture_corpus: the exchange failed: " << e.what() << "\n";
    ::kill(ps, SIGKILL);
    ::kill(worker, SIGKILL);
    status = 1;
  }
  ::waitpid(ps, nullptr, 0);
  ::waitpid(worker, nullptr, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200)); // the pumps see the last bytes
  if (status == 0)
    write_corpus(argv[1], rec.frames());
  std::cout.flush();
  // The proxy's threads are detached and may still block in accept/read: end
  // without running static destructors under them.
  std::_Exit(status);
}

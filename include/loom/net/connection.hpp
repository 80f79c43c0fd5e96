// One framed connection of loom's message layer, over TCP or TLS (its transport,
// transport.hpp). Used by net::rpc_server and net::channel (rpc.hpp); most users never
// touch it directly.
//
// Threading: every socket operation runs on the connection's strand. Reading is
// a loop (header, metadata, payloads, then the next header) through a receive
// buffer: one read takes what the socket holds (up to receive_buffer_bytes), and
// the headers, metadata and small payloads of the frames in it are copied out of
// it, so a burst of small frames costs one recvmsg, not one per header and per
// payload; what a frame still lacks once the buffer is empty is read straight into
// its tensors when it is large (direct_read_min or more), the zero-copy path of
// big payloads. Writing is thread-safe: send() first tries a non-blocking
// sendmsg() of the whole frame from the calling thread (no thread hop for small
// frames; plain TCP only), and hands whatever did not fit to an async_write on
// the strand; frames queued meanwhile are written in order, several per
// scatter-gather call. A write of more buffers than one sendmsg takes (64) copies
// its small ones into one contiguous run first (gather_list), so a message of many
// small tensors is one sendmsg too.
//
// Memory: a frame's metadata buffer grows as its bytes arrive (a header that declares
// 64 MiB costs 4 KiB until the bytes come), and a tensor the layer allocates is written
// only with received bytes (its pages are committed as they arrive). On a server, what a
// connection holds for its unfinished message is charged to the server's receive_budget
// as it arrives, and released when the message is delivered or the connection closes.
#pragma once

#include <loom/cluster/liveness_settings.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/net/address.hpp>
#include <loom/net/auth.hpp>
#include <loom/net/frame.hpp>
#include <loom/net/io_runtime.hpp>
#include <loom/net/log.hpp>
#include <loom/net/receive_budget.hpp>
#include <loom/net/tls.hpp>
#include <loom/net/transport.hpp>

#include <asio/bind_executor.hpp>
#include <asio/buffer.hpp>
#include <asio/connect.hpp>
#include <asio/dispatch.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/write.hpp>

#if defined(__unix__) || defined(__APPLE__)
#include <cerrno>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>
#define LOOM_NET_DIRECT_SEND 1
#define LOOM_NET_MOVABLE_SOCKETS 1 // socket::release() and ::close()
#endif
#ifdef __linux__
#include <netinet/in.h>
#include <netinet/tcp.h>
#endif

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace loom::net {

// A frame as received: payloads already hold their bytes.
struct incoming_frame {
  frame_header header;
  frame_meta meta;
  std::string metadata; // raw metadata bytes (envelope, descriptors, caller's metadata)
  std::vector<any_tensor> payloads;
  // Set when a destination supplied for a payload did not match its descriptor
  // (the payload then went into a fresh tensor).
  std::string buffer_error;

  std::string_view user_metadata() const {
    return std::string_view(metadata).substr(meta.user_offset, meta.user_bytes);
  }
  std::span<const std::byte> metadata_bytes() const {
    return std::as_bytes(std::span<const char>(metadata.data(), metadata.size()));
  }
};

class connection;

namespace detail {
// The buffers of one write, at most max_buffers of them where that is possible: one
// sendmsg takes at most 64 (asio's limit too), and a message of many small tensors would
// otherwise take several. When more buffers are added than that, runs of small ones
// (under coalesce_below bytes) are copied into one contiguous staging buffer, up to
// staging_bytes in all; large buffers are never copied.
class gather_list {
public:
  static constexpr std::size_t max_buffers = 64;
  static constexpr std::size_t coalesce_below = 16u << 10;
  static constexpr std::size_t staging_bytes = 256u << 10;

  // Collects the buffers that add_all(add) passes to add(pointer, length), in order.
  template <class AddAll> void build(AddAll&& add_all) {
    raw_.clear();
    add_all([&](const void* p, std::size_t len) {
      if (len > 0)
        raw_.push_back({static_cast<const char*>(p), len});
    });
    out_.clear();
    if (raw_.size() <= max_buffers) {
      for (const auto& r : raw_)
        out_.emplace_back(r.p, r.len);
      return;
    }
    staging_.clear();
    staging_.reserve(staging_bytes); // never outgrown: pointers into it stay valid
    bool in_run = false;             // the last entry of out_ is a run in staging_
    for (const auto& r : raw_) {
      if (r.len < coalesce_below && staging_.size() + r.len <= staging_bytes) {
        const std::size_t at = staging_.size();
        staging_.append(r.p, r.len);
        if (in_run)
          out_.back() = asio::const_buffer(out_.back().data(), out_.back().size() + r.len);
        else
          out_.emplace_back(staging_.data() + at, r.len);
        in_run = true;
      } else {
        out_.emplace_back(r.p, r.len);
        in_run = false;
      }
    }
  }
  // The buffers to write (the first max_buffers of them are one sendmsg).
  const std::vector<asio::const_buffer>& buffers() const noexcept { return out_; }

private:
  struct raw_buffer {
    const char* p;
    std::size_t len;
  };
  std::vector<raw_buffer> raw_;
  std::vector<asio::const_buffer> out_;
  std::string staging_;
};

// A split message being received: its head, its tensors (each allocated when its
// first byte arrives), where the next part's bytes go, and how many have come.
struct split_message {
  frame_header header;
  frame_meta meta;
  std::string metadata;
  std::vector<any_tensor> payloads;
  std::vector<bool> fresh; // payloads[i] is memory the layer allocated (charged as it fills)
  std::size_t next = 0;
  std::uint64_t in_next = 0, received = 0;
};
} // namespace detail

// What a connection hands its frames to (the server or the channel).
class frame_sink {
public:
  virtual ~frame_sink() = default;
  // May return a tensor of exactly p.type and p.shape to receive payload i
  // into; an empty tensor means "allocate one".
  virtual any_tensor destination(connection& c, const frame_header& h, const frame_meta& m,
                                 std::string_view user_metadata, std::size_t i,
                                 const payload_info& p) = 0;
  virtual void on_frame(const std::shared_ptr<connection>& c, incoming_frame&& f) = 0;
  virtual void on_closed(const std::shared_ptr<connection>& c, const std::string& reason) = 0;
};

class connection : public std::enable_shared_from_this<connection> {
public:
  using tcp = asio::ip::tcp;
  using strand_type = asio::strand<asio::io_context::executor_type>;
  using once_fn = std::function<void(std::exception_ptr, incoming_frame&&)>;

  connection(std::shared_ptr<detail::io_runtime> rt, const frame_limits& limits, log_fn log)
      : rt_(std::move(rt)), strand_(asio::make_strand(rt_->next_context())), io_(strand_),
        timer_(strand_), limits_(limits), log_(std::move(log)) {}
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  tcp::socket& socket() noexcept { return io_.socket(); }
  // The strand its handlers run on, and its io context: fixed but for one move_to().
  strand_type strand() const {
    std::lock_guard lk(smu_);
    return strand_;
  }
  asio::io_context& context() const { return strand().get_inner_executor().context(); }
  const std::string& peer() const noexcept { return peer_; }
  void set_peer(std::string p) { peer_ = std::move(p); }
  const frame_limits& limits() const noexcept { return limits_; }

  // Set during the handshake (server side), read afterwards.
  connection_role role = connection_role::control;
  std::uint64_t client_id = 0;
  std::uint64_t process_id = 0;
  // Server side: requests received on it whose answer is not yet settled.
  std::atomic<std::uint32_t> in_flight{0};

  bool settled = false; // server side (strand only): its first request was seen

  // Server side (strand only): from the next frame on, reads and handlers run on io
  // context `to` (rpc_server chooses it at the first request, by the client process).
  // The socket moves at a frame boundary, with no read or write under way; a TLS
  // connection stays where it is (its OpenSSL stream is bound to the socket object).
  void move_to([[maybe_unused]] asio::io_context& to) {
#ifdef LOOM_NET_MOVABLE_SOCKETS
    if (&to != &context() && !io_.secure())
      move_to_ = &to;
#endif
  }

  bool closed() {
    std::lock_guard lk(wmu_);
    return closed_;
  }
  // True while frames wait in the write queue (an async write is under way).
  bool writing() {
    std::lock_guard lk(wmu_);
    return writing_ && !closed_;
  }

  // Runs f on this connection's strand (the strand it has when f runs: a connection
  // that moved meanwhile runs it on its new one).
  template <class F> void run(F&& f) {
    rt_->run_on(strand(), [self = shared_from_this(), f = std::forward<F>(f)]() mutable {
      if (!self->strand().running_in_this_thread())
        return self->run(std::move(f));
      f();
    });
  }

  // After connect/accept: TCP_NODELAY (control messages are latency bound).
  void configure_socket() {
    std::error_code ec;
    auto& sock = io_.socket();
    sock.set_option(tcp::no_delay(true), ec);
    sock.non_blocking(true, ec); // read_rest() reads without blocking
    if (peer_.empty()) {
      const auto ep = sock.remote_endpoint(ec);
      if (!ec)
        peer_ = to_string(ep);
    }
  }

  // Server side, before the first read: what this connection holds for incomplete frames
  // is charged to `budget`, which may evict it (it then closes with an error reply).
  void attach_budget(const std::shared_ptr<receive_budget>& budget) {
    budget_ = budget;
    account_ = budget->open([w = weak_from_this()](std::string why) {
      if (auto c = w.lock())
        c->run([c, why = std::move(why)] {
          if (!c->closed()) // its read is still outstanding: close, without lingering
            c->refuse(resource_exhausted_error(c->budget_message(why)), false);
        });
    });
  }

  // How long ago this connection last received a byte; zero while it is in the middle
  // of a frame (it is not idle then). Thread-safe.
  std::chrono::steady_clock::duration idle_for(std::chrono::steady_clock::time_point now) const {
    if (in_frame_.load(std::memory_order_relaxed))
      return {};
    return now.time_since_epoch() -
           std::chrono::steady_clock::duration(last_read_.load(std::memory_order_relaxed));
  }

  // When this connection last received a byte (a frame's middle included). Thread-safe.
  std::chrono::steady_clock::time_point last_received() const noexcept {
    return std::chrono::steady_clock::time_point(
        std::chrono::steady_clock::duration(last_read_.load(std::memory_order_relaxed)));
  }

  // TCP keepalive as `l` says (cluster/liveness_settings.hpp), after connect/accept: the
  // kernel drops an idle connection whose peer's host stops answering probes (Linux;
  // elsewhere SO_KEEPALIVE with the system's timing). No TCP_USER_TIMEOUT: it would also
  // drop a connection whose peer keeps its window closed that long (Linux >= 5.10 counts
  // acknowledged zero-window probes), i.e. a busy peer that has not read yet; a call in
  // flight is watched by the channel's heartbeat instead.
  void enable_keepalive(const liveness_settings& l) {
    if (l.keepalive_idle.count() <= 0)
      return;
    std::error_code ec;
    auto& sock = io_.socket();
    sock.set_option(asio::socket_base::keep_alive(true), ec);
#ifdef __linux__
    const int fd = sock.native_handle();
    const auto secs = [](std::chrono::milliseconds d) {
      return static_cast<int>(std::max<std::int64_t>(1, (d.count() + 999) / 1000));
    };
    const int idle = secs(l.keepalive_idle), interval = secs(l.keepalive_interval),
              count = std::max(1, l.keepalive_count);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
#endif
  }

  // Handshake helpers (strand only): closes the connection at `deadline`.
  void arm_deadline(std::chrono::steady_clock::time_point deadline, std::string what) {
    timer_.expires_at(deadline);
    timer_.async_wait([self = shared_from_this(), what = std::move(what)](std::error_code ec) {
      if (!ec)
        self->do_close("timed out " + what);
    });
  }
  void disarm_deadline() {
    timer_.cancel();
  }

  // Reads exactly one handshake frame and hands it to cb (strand only).
  void read_one(once_fn cb) {
    once_ = std::move(cb);
    read_header();
  }

  // ---- TLS (handshake.hpp; strand only, before the connection's first frame) ----
  bool secure() const noexcept {
    return io_.secure();
  }
  // From now on the connection speaks TLS with ctx.
  void use_tls(std::shared_ptr<tls_context> ctx) {
    io_.use_tls(std::move(ctx));
  }
  // The TLS handshake; done gets its error (the meaning: explain_tls_failure).
  void tls_handshake(std::function<void(std::error_code)> done) {
    io_.async_handshake(
        [self = shared_from_this(), done = std::move(done)](std::error_code ec) { done(ec); });
  }
  tls_failure explain_tls(const std::error_code& ec) {
    return explain_tls_failure(ec, io_.tls_handle(),
                               io_.tls() ? io_.tls()->settings().mode : tls_mode::off);
  }
  // The first byte the peer sent, without consuming it (a server telling a TLS client from
  // a plain one): cb gets it, or the error (eof: the peer closed first).
  void peek_first_byte(std::function<void(std::error_code, unsigned char)> cb) {
    io_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), cb = std::move(cb)](
                                                        std::error_code ec) mutable {
      unsigned char b = 0;
      if (!ec) {
        const std::size_t n =
            self->io_.socket().receive(asio::buffer(&b, 1), tcp::socket::message_peek, ec);
        if (ec == asio::error::would_block || ec == asio::error::try_again)
          return self->peek_first_byte(std::move(cb)); // a spurious wake-up
        if (!ec && n == 0)
          ec = asio::error::eof;
      }
      cb(ec, b);
    });
  }

  // Starts the read loop: every frame goes to the sink until the connection closes.
  void start(std::shared_ptr<frame_sink> sink) {
    run([self = shared_from_this(), sink = std::move(sink)]() mutable {
      if (self->closed()) {
        sink->on_closed(self, "closed before it started");
        return;
      }
      self->sink_ = std::move(sink);
      self->turn_read_ = 0;
      self->read_header();
      self->read_following();
    });
  }

  // Thread-safe. False when the connection is closed (the frame is dropped).
  bool send(out_frame&& f) {
    std::unique_lock lk(wmu_);
    if (closed_)
      return false;
    if (!writing_) {
#ifdef LOOM_NET_DIRECT_SEND
      if (!io_.secure() && direct_send(f))
        return true;
#endif
      writing_ = true;
      queue_.push_back(std::move(f));
      lk.unlock();
      run([self = shared_from_this()] { self->write_next(); });
      return true;
    }
    queue_.push_back(std::move(f));
    return true;
  }

  // Thread-safe: closes now (pending writes are dropped).
  void close(std::string reason) {
    {
      std::lock_guard lk(wmu_);
      if (closed_)
        return;
    }
    run([self = shared_from_this(), reason = std::move(reason)] { self->do_close(reason); });
  }

  // Thread-safe: closes once everything queued has been written.
  // linger (strand only): see linger_then_close().
  void close_after_flush(std::string reason, bool linger = false) {
    std::unique_lock lk(wmu_);
    if (closed_)
      return;
    if (writing_) {
      close_after_flush_ = true;
      linger_ = linger;
      close_reason_ = std::move(reason);
      return;
    }
    lk.unlock();
    if (linger)
      return linger_then_close(std::move(reason));
    close(std::move(reason));
  }

private:
  // ---- reading (strand only) ----
  // Every read goes through read_rest(): in_bufs_ are the buffers still to fill and
  // in_fresh_ marks those in memory the layer allocated for this message, whose bytes
  // are charged to the server's budget as they arrive (a metadata buffer is charged
  // before it grows instead).

  // The next frame's header: from the receive buffer when it holds one, else from the
  // socket. Called by read_following() once a frame was delivered (never from inside
  // deliver(): a burst of frames in the buffer is a loop, not a recursion).
  void read_header() {
    in_frame_.store(false, std::memory_order_relaxed);
    if (stopped_)
      return;
    if (move_to_ && moved()) { // the read loop goes on on the new strand
      asio::post(strand(), [self = shared_from_this()] {
        self->read_header();
        self->read_following();
      });
      return;
    }
    set_buffer(asio::buffer(hdr_), false);
    read_rest(&connection::on_header);
  }

  // Reads the frames that follow the one just delivered (or the ping just answered), for
  // as long as their bytes are here; returns once the connection waits for bytes. Run by
  // every entry into the read loop (start(), a completed asynchronous read) after its step.
  void read_following() {
    while (std::exchange(next_frame_, false))
      read_header();
  }

  // move_to()'s move, between frames (strand only): the socket's descriptor goes to a
  // socket on the new context's strand, and the timer with it. True when it moved;
  // while a write is under way it waits for a later frame boundary.
  bool moved() {
#ifndef LOOM_NET_MOVABLE_SOCKETS
    return false;
#else
    std::unique_lock lk(wmu_);
    if (closed_) {
      move_to_ = nullptr;
      return false;
    }
    if (writing_)
      return false;
    const strand_type to = asio::make_strand(*std::exchange(move_to_, nullptr));
    std::error_code ec;
    const auto protocol = io_.socket().local_endpoint(ec).protocol();
    if (ec)
      return false; // closing: the read that follows says why
    const auto fd = io_.socket().release(ec);
    if (ec)
      return false; // still the old socket's: it stays where it is
    tcp::socket moved_socket(to);
    moved_socket.assign(protocol, fd, ec);
    if (ec) {
      ::close(fd);
      lk.unlock();
      do_close("moving the connection to another io thread failed: " + ec.message());
      return false;
    }
    moved_socket.non_blocking(true, ec); // as configure_socket() left it: read_rest() never waits
    io_.socket() = std::move(moved_socket);
    timer_ = asio::steady_timer(to);
    std::lock_guard sl(smu_);
    strand_ = to;
    return true;
#endif
  }

  void set_buffer(asio::mutable_buffer b, bool fresh) {
    in_bufs_.assign(1, b);
    in_fresh_.assign(1, fresh);
  }

  void on_header(std::error_code ec) {
    if (ec)
      return read_failed(ec);
    if (once_ && !io_.secure() && looks_like_tls(hdr_))
      return refuse_tls_client();
    try {
      h_ = parse_header(hdr_, limits_);
      const bool handshake = is_handshake_kind(h_.kind);
      if (handshake != static_cast<bool>(once_))
        throw failed_precondition_error(
            handshake
                ? "a " + std::string(to_string(h_.kind)) + " frame after the handshake"
                : "a " + std::string(to_string(h_.kind)) + " frame before the handshake completed");
      // A split message's parts come back to back after its head, and only then.
      if (split_ && (!is_part(h_) || h_.kind != split_->header.kind ||
                     h_.request_id != split_->header.request_id))
        throw data_loss_error(
            "a " + std::string(to_string(h_.kind)) + " frame (request " +
            std::to_string(h_.request_id) + ") where part " + std::to_string(split_->received) +
            "/" + std::to_string(split_->meta.payload_bytes) + " bytes of split message " +
            std::to_string(split_->header.request_id) + " was due");
      if (!split_ && is_part(h_))
        throw data_loss_error("a part frame (request " + std::to_string(h_.request_id) +
                              ") without a split head before it");
    } catch (const loom::error& e) {
      return bad_frame(e);
    }
    // Liveness: answered here, on the io thread, whatever the handlers are doing; a pong
    // (like every byte received) has already counted as life.
    if (h_.kind == frame_kind::ping || h_.kind == frame_kind::pong) {
      if (h_.kind == frame_kind::ping)
        send(out_frame(encode_heartbeat(frame_kind::pong)));
      next_frame_ = true; // read_following() reads the next header
      return;
    }
    meta_.clear();
    read_metadata();
  }

  // Reads the metadata into a buffer that grows with the bytes that have arrived: at
  // least metadata_step, doubling once full, and to what the socket already holds, never
  // past what the header declares. A header that declares 64 MiB and sends nothing costs
  // 4 KiB, not 64 MiB; an honest sender's metadata usually fits the first buffer.
  void read_metadata() {
    const std::size_t have = meta_.size(), declared = h_.metadata_bytes;
    if (have == declared)
      return on_metadata({});
    std::size_t want = std::max(2 * have, metadata_step);
    if (declared > want) {
      std::error_code ec;
      const std::size_t ready = io_.available(ec);
      if (!ec)
        want = std::max(want, have + buffered() + ready);
    }
    want = std::min(want, declared);
    if (!charge(want - have))
      return;
    meta_.resize(want);
    set_buffer(asio::buffer(meta_.data() + have, want - have), false);
    read_rest(&connection::on_metadata_bytes);
  }

  void on_metadata_bytes(std::error_code ec) {
    if (ec)
      return read_failed(ec);
    read_metadata();
  }

  // Reads in_bufs_ completely, then calls (this->*next)(ec): first from the receive
  // buffer, then from the socket. What the socket already holds is read at once on this
  // strand (no trip through the scheduler; under TLS what is already decrypted,
  // transport.hpp): into the receive buffer while in_bufs_ lack less than direct_read_min
  // bytes (a read then also takes the frames behind), else straight into in_bufs_. At
  // most sync_read_limit bytes per turn, so that a peer whose frames arrive as fast as they
  // are read cannot hold this thread; the rest is read as it arrives (read_async).
  void read_rest(void (connection::*next)(std::error_code)) {
    std::error_code ec;
    while (!in_bufs_.empty()) {
      if (const std::size_t n = take_buffered()) {
        if (!received(n))
          return over_budget(refusal_); // closes the connection
        continue;
      }
      if (turn_read_ >= sync_read_limit) {
        ec = asio::error::would_block; // this turn is over: go on asynchronously
        break;
      }
      std::size_t n = 0;
      if (wanted() >= direct_read_min) {
        n = io_.read_ready(in_bufs_, ec);
        if (ec)
          break;
        if (!received(n))
          return over_budget(refusal_);
      } else {
        if (socket_drained_ && !io_.secure()) {
          // The last read left the socket empty: a read now would most likely find
          // nothing (EAGAIN), and the asynchronous one tries at once anyway.
          ec = asio::error::would_block;
          break;
        }
        n = io_.read_ready(receive_space(), ec);
        if (ec)
          break;
        filled(n);
      }
      turn_read_ += n;
    }
    if (in_bufs_.empty())
      return (this->*next)({});
    if (ec && ec != asio::error::would_block && ec != asio::error::try_again)
      return (this->*next)(ec);
    read_async(next);
  }

  // Reads the rest of in_bufs_ as it arrives, then calls next and reads the frames that
  // follow (read_following). A small rest: one read into the receive buffer, whatever
  // arrives (read_rest() then copies it out and goes on). A large one: asio::async_read
  // straight into in_bufs_ (its reads are continuations, cheaper to schedule than a chain
  // of async_read_some), noting and charging each read as it completes, so a peer that
  // stalls halfway holds only what it sent; a charge the budget refuses ends the read
  // there, and the connection closes.
  void read_async(void (connection::*next)(std::error_code)) {
    if (wanted() < direct_read_min) {
      io_.async_read_some(receive_space(),
                          [self = shared_from_this(), next](std::error_code ec, std::size_t n) {
                            if (self->stopped_) // closed meanwhile: nothing more is parsed
                              return;
                            self->turn_read_ = 0;
                            if (n > 0) {
                              self->filled(n);
                              ec = {}; // the bytes first; a closed stream shows at the next read
                            }
                            if (ec)
                              ((*self).*next)(ec);
                            else
                              self->read_rest(next);
                            self->read_following();
                          });
      return;
    }
    io_.async_read(
        in_bufs_,
        [this, done = std::size_t{0}](const std::error_code& ec,
                                      std::size_t total) mutable -> std::size_t {
          const std::size_t n = total - done;
          done = total;
          if (ec || !received(n) || in_bufs_.empty())
            return 0;
          return async_read_step;
        },
        [self = shared_from_this(), next](std::error_code ec, std::size_t total) {
          // Asio calls the condition above only between reads, not after the read that
          // fills the buffers: that read is life too.
          if (total > 0)
            self->last_read_.store(clock_now(), std::memory_order_relaxed);
          self->turn_read_ = 0;
          if (!self->refusal_.empty())
            return self->over_budget(self->refusal_);
          ((*self).*next)(ec);
          self->read_following();
        });
  }

  // ---- the receive buffer (strand only) ----
  // Bytes read but not yet parsed: rbuf_[rbeg_, rend_). Allocated at the first read, so a
  // connection that never sends holds none; it holds bytes only between a read and the
  // parsing of what that read brought, and is refilled only once empty.
  std::size_t buffered() const noexcept {
    return rend_ - rbeg_;
  }

  // Where the next read into the receive buffer goes (it is empty then).
  asio::mutable_buffer receive_space() {
    if (!rbuf_)
      rbuf_.reset(new char[receive_buffer_bytes]);
    rbeg_ = rend_ = 0;
    return asio::buffer(rbuf_.get(), receive_buffer_bytes);
  }

  // n bytes were read into the receive buffer.
  void filled(std::size_t n) {
    rbeg_ = 0;
    rend_ = n;
    socket_drained_ = n < receive_buffer_bytes;
    if (n > 0)
      last_read_.store(clock_now(), std::memory_order_relaxed);
  }

  // Copies what the receive buffer holds of in_bufs_ into them; returns how many bytes
  // (received() then accounts for them and drops them from in_bufs_).
  std::size_t take_buffered() {
    std::size_t n = 0;
    for (std::size_t i = 0; i < in_bufs_.size() && rbeg_ < rend_; ++i) {
      const std::size_t k = std::min(in_bufs_[i].size(), rend_ - rbeg_);
      std::memcpy(in_bufs_[i].data(), rbuf_.get() + rbeg_, k);
      rbeg_ += k;
      n += k;
      if (k < in_bufs_[i].size())
        break;
    }
    return n;
  }

  // Bytes in_bufs_ still lack.
  std::size_t wanted() const noexcept {
    std::size_t n = 0;
    for (const auto& b : in_bufs_)
      n += b.size();
    return n;
  }

  // n bytes arrived in in_bufs_. False when charging them passed the budget: refusal_
  // then says why (the caller closes the connection with it).
  bool received(std::size_t n) {
    if (n == 0)
      return true;
    in_frame_.store(true, std::memory_order_relaxed);
    const auto now = clock_now();
    last_read_.store(now, std::memory_order_relaxed);
    if (account_)
      account_->note_progress(now);
    const std::size_t fresh = consume(n);
    if (fresh == 0 || !account_)
      return true;
    refusal_ = refusal(account_->charge(fresh));
    return refusal_.empty();
  }

  // Drops the first n bytes of in_bufs_; returns how many of them were fresh.
  std::size_t consume(std::size_t n) {
    std::size_t i = 0, fresh = 0;
    while (i < in_bufs_.size() && n >= in_bufs_[i].size()) {
      n -= in_bufs_[i].size();
      fresh += in_fresh_[i] ? in_bufs_[i].size() : 0;
      ++i;
    }
    in_bufs_.erase(in_bufs_.begin(), in_bufs_.begin() + static_cast<std::ptrdiff_t>(i));
    in_fresh_.erase(in_fresh_.begin(), in_fresh_.begin() + static_cast<std::ptrdiff_t>(i));
    if (n && !in_bufs_.empty()) {
      in_bufs_.front() += n;
      fresh += in_fresh_.front() ? n : 0;
    }
    return fresh;
  }

  // Charges n more bytes held for the message being read; false (the connection then
  // closes) when the budget refuses them. A client connection has no budget.
  bool charge(std::size_t n) {
    if (!account_ || n == 0)
      return true;
    const std::string why = refusal(account_->charge(n));
    if (why.empty())
      return true;
    over_budget(why);
    return false;
  }

  // Why the budget refused a charge ("" when it granted it).
  std::string refusal(receive_budget::verdict v) const {
    switch (v) {
    case receive_budget::verdict::granted: return {};
    case receive_budget::verdict::over_connection:
      return "it would hold more than max_pending_bytes_per_connection (" +
             std::to_string(budget_->per_connection()) + " bytes) for one incomplete message";
    case receive_budget::verdict::over_total:
      return "the server holds " + std::to_string(budget_->held()) +
             " bytes for incomplete frames, at max_pending_bytes (" +
             std::to_string(budget_->limit()) + "), and none of it is stalled";
    case receive_budget::verdict::evicted: break;
    }
    return "it was evicted";
  }

  // The memory this connection holds for the message it was reading is its no longer
  // (delivered, or dropped).
  void release_pending() {
    if (account_)
      account_->release_all();
  }

  // A message over the server's budget: refused with resource_exhausted, then closed.
  void over_budget(const std::string& why) {
    bad_frame(resource_exhausted_error(budget_message(why)));
  }
  std::string budget_message(const std::string& why) const {
    return "not enough memory for the frame (request " + std::to_string(peek_request_id(hdr_)) +
           "): " + why;
  }

  // Fresh destinations that will hold `bytes` more: refused at once when that passes
  // the per-connection limit (rather than after reading them).
  bool fits(std::uint64_t bytes) {
    if (!account_ || bytes == 0 || account_->fits(bytes))
      return true;
    over_budget("its tensors need " + std::to_string(bytes) +
                " bytes of memory the server allocates, over max_pending_bytes_per_connection (" +
                std::to_string(budget_->per_connection()) + " bytes)");
    return false;
  }

  void on_metadata(std::error_code ec) {
    if (ec)
      return read_failed(ec);
    if (once_) {
      incoming_frame f;
      f.header = h_;
      f.metadata = std::move(meta_);
      release_pending();
      auto cb = std::move(once_);
      once_ = nullptr;
      cb(nullptr, std::move(f));
      return;
    }
    try {
      fm_ = parse_metadata(h_, std::as_bytes(std::span<const char>(meta_.data(), meta_.size())),
                           limits_);
    } catch (const loom::error& e) {
      return bad_frame(e);
    }
    if (is_part(h_))
      return read_part();
    if (is_split_head(h_))
      return begin_split();
    std::uint64_t fresh_bytes = 0;
    try {
      in_payloads_.clear();
      in_bufs_.clear();
      in_fresh_.clear();
      buffer_error_.clear();
      for (std::size_t i = 0; i < fm_.payloads.size(); ++i) {
        const auto& p = fm_.payloads[i];
        bool fresh = false;
        any_tensor t = destination_for(h_, fm_, meta_, i, fresh);
        if (p.bytes) {
          in_bufs_.emplace_back(t.raw_data(), static_cast<std::size_t>(p.bytes));
          in_fresh_.push_back(fresh);
        }
        fresh_bytes += fresh ? p.bytes : 0;
        in_payloads_.push_back(std::move(t));
      }
    } catch (const loom::error& e) {
      return bad_frame(e);
    } catch (const std::bad_alloc&) {
      return bad_frame(resource_exhausted_error(
          "cannot allocate " + std::to_string(fm_.payload_bytes) + " payload bytes"));
    }
    if (!fits(fresh_bytes))
      return;
    read_rest(&connection::on_payloads);
  }

  // The tensor to receive payload i of the frame (h, m, metadata) into: the sink's
  // buffer when it offers a matching one, else a fresh tensor (bounded by the checked
  // limits; `fresh` says so). Its pages are committed as its bytes arrive: the
  // layer never touches a fresh tensor before writing received bytes into it.
  // A mismatch is noted in buffer_error_, which the frame carries.
  any_tensor destination_for(const frame_header& h, const frame_meta& m,
                             const std::string& metadata, std::size_t i, bool& fresh) {
    const auto& p = m.payloads[i];
    any_tensor t;
    if (sink_) {
      try {
        t = sink_->destination(
            *this, h, m, std::string_view(metadata).substr(m.user_offset, m.user_bytes), i, p);
      } catch (const std::exception& e) {
        buffer_error_ =
            "choosing the destination of payload " + std::to_string(i) + " failed: " + e.what();
        t = {};
      }
    }
    if (!t.empty() && (t.type() != p.type || t.shape() != p.shape)) {
      if (buffer_error_.empty())
        buffer_error_ = "payload " + std::to_string(i) + " is " +
                        std::string(loom::to_string(p.type)) + p.shape.to_string() +
                        ", but the buffer supplied for it is " + t.describe();
      t = {};
    }
    fresh = t.empty();
    return fresh ? any_tensor::for_peer_bytes(p.type, p.shape) : std::move(t);
  }

  // A split head: its descriptors are the message's; the tensors are allocated as their
  // bytes arrive in the parts that follow.
  void begin_split() {
    split_.emplace();
    split_->header = h_;
    split_->meta = std::move(fm_);
    split_->metadata = std::move(meta_);
    split_->payloads.resize(split_->meta.payloads.size());
    buffer_error_.clear();
    if (split_->meta.payload_bytes == 0)
      return finish_split();
    read_header();
  }

  // A part: its bytes go straight into the tensors they belong to.
  void read_part() {
    auto& s = *split_;
    const std::uint64_t n = fm_.payload_bytes;
    if (account_) // the part's own metadata is parsed: only the head's is held
      account_->release(meta_.size());
    meta_.clear();
    try {
      if (n > s.meta.payload_bytes - s.received)
        throw data_loss_error("a part of " + std::to_string(n) + " bytes where split message " +
                              std::to_string(s.header.request_id) + " has " +
                              std::to_string(s.meta.payload_bytes - s.received) + " left");
      in_bufs_.clear();
      in_fresh_.clear();
      for (std::uint64_t left = n; left > 0;) {
        const auto& p = s.meta.payloads[s.next];
        if (s.in_next == p.bytes) {
          ++s.next;
          s.in_next = 0;
          continue;
        }
        auto& t = s.payloads[s.next];
        if (t.empty()) {
          bool fresh = false;
          t = destination_for(s.header, s.meta, s.metadata, s.next, fresh);
          s.fresh.resize(s.payloads.size());
          s.fresh[s.next] = fresh;
          if (fresh && !fits(p.bytes))
            return;
        }
        const std::uint64_t take = std::min(left, p.bytes - s.in_next);
        in_bufs_.emplace_back(static_cast<char*>(t.raw_data()) + s.in_next,
                              static_cast<std::size_t>(take));
        in_fresh_.push_back(s.fresh[s.next]);
        s.in_next += take;
        left -= take;
      }
      s.received += n;
    } catch (const loom::error& e) {
      return bad_frame(e);
    } catch (const std::bad_alloc&) {
      return bad_frame(resource_exhausted_error("cannot allocate payload " +
                                                std::to_string(s.next) + " of split message " +
                                                std::to_string(s.header.request_id)));
    }
    read_rest(&connection::on_payloads);
  }

  // The last part has arrived: the message goes to the sink as one frame.
  void finish_split() {
    auto s = std::move(*split_);
    split_.reset();
    try {
      bool fresh = false;
      for (std::size_t i = 0; i < s.payloads.size(); ++i)
        if (s.payloads[i].empty()) // no bytes: a tensor of 0 elements
          s.payloads[i] = destination_for(s.header, s.meta, s.metadata, i, fresh);
    } catch (const std::bad_alloc&) {
      return bad_frame(resource_exhausted_error("cannot allocate the payloads of split message " +
                                                std::to_string(s.header.request_id)));
    }
    h_ = s.header;
    fm_ = std::move(s.meta);
    meta_ = std::move(s.metadata);
    in_payloads_ = std::move(s.payloads);
    deliver();
  }

  void on_payloads(std::error_code ec) {
    if (ec)
      return read_failed(ec);
    if (split_) {
      if (split_->received < split_->meta.payload_bytes)
        return read_header();
      return finish_split();
    }
    deliver();
  }

  // Hands the frame read into h_, fm_, meta_, in_payloads_ to the sink.
  void deliver() {
    try {
      for (std::size_t i = 0; i < fm_.payloads.size(); ++i)
        validate_payload_bytes(fm_.payloads[i], in_payloads_[i].raw_data(), i);
    } catch (const loom::error& e) {
      return bad_frame(e);
    }
    release_pending(); // the message is the handler's now
    if (!sink_)
      return;
    incoming_frame f;
    f.header = h_;
    f.header.flags &= frame_flag_closing; // a split message arrives whole
    f.meta = std::move(fm_);
    f.metadata = std::move(meta_);
    f.payloads = std::move(in_payloads_);
    f.buffer_error = std::move(buffer_error_);
    in_payloads_ = {};
    auto sink = sink_;
    auto self = shared_from_this();
    in_frame_.store(false, std::memory_order_relaxed);
    sink->on_frame(self, std::move(f));
    next_frame_ = true; // read_following() reads the next frame, after on_frame returned
  }

  void read_failed(std::error_code ec) {
    std::string why;
    // Under TLS a peer that closes without close_notify reads as stream_truncated: the
    // same close (transport.hpp).
    if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated)
      why = "the peer closed the connection";
    else if (io_.secure() && ec.category() == asio::error::get_ssl_category()) {
      // A TLS alert: under TLS 1.3 a client learns that the server refused its certificate
      // only when it reads after its own handshake completed, as here. Said as what it
      // means, with its code (unauthenticated is not retried as unavailable is).
      const auto f = explain_tls(ec);
      return do_close("the TLS session with " + peer_ + " failed: " + f.why, f.code);
    } else if (ec == asio::error::operation_aborted)
      why = "the connection was closed";
    else
      why = ec.message();
    do_close(why);
  }

  // A malformed (or refused) frame: reply with the error when the bytes were a loom
  // frame, then close; past the handshake, lingering (linger_then_close).
  void bad_frame(const loom::error& e) {
    refuse(e, static_cast<bool>(sink_));
  }

  // A client that opened with a TLS handshake, on a connection without TLS. Its TLS
  // engine will read this reply as a record that is not TLS and say so (the peer "answered
  // in plain text", explain_tls_failure), rather than wait; lingering, as the rest of its
  // ClientHello is unread.
  void refuse_tls_client() {
    const std::string msg = "a TLS handshake from " + peer_ + ", but this server does not use TLS";
    log_line(log_, msg + "; closing that connection");
    send(out_frame(encode(
        auth_result_msg{status_of(error_code::failed_precondition),
                        "this server does not use TLS, and the client connected with TLS"})));
    close_after_flush(msg, true);
  }

  void refuse(const loom::error& e, bool linger) {
    const std::string msg = "bad frame from " + peer_ + ": " + e.what();
    log_line(log_, msg + "; closing that connection");
    const auto hb = std::span<const std::byte>(hdr_);
    if (has_magic(hb)) {
      out_frame f;
      if (once_) {
        f.head = encode(auth_result_msg{status_of(e.code()), e.message()});
      } else {
        envelope env;
        env.status = status_of(e.code());
        env.message = e.message();
        encode_head(f.head, frame_kind::response, peek_request_id(hb), env, {}, empty{});
        detail::patch_u16(f.head, 6, frame_flag_closing);
      }
      send(std::move(f));
    }
    close_after_flush(msg, linger);
  }

  // Past the handshake a refused peer may still be sending the rest of its message:
  // closing with those bytes unread would reset the connection, and the peer would see
  // "connection reset" instead of the reply that says why. So once the reply is out,
  // stop sending, read and discard what comes (into a small scratch buffer: nothing is
  // held) until the peer closes or linger_time passes, then close.
  void linger_then_close(std::string reason) { // strand only
    io_.shutdown_send();
    timer_.expires_after(linger_time);
    timer_.async_wait([self = shared_from_this(), reason](std::error_code e) {
      if (!e)
        self->do_close(reason);
    });
    drain_.reset(new char[drain_bytes]);
    drain(std::move(reason));
  }
  void drain(std::string reason) {
    io_.async_discard(asio::buffer(drain_.get(), drain_bytes),
                      [self = shared_from_this(), reason](std::error_code ec, std::size_t) {
                        if (ec)
                          return self->do_close(reason);
                        self->drain(reason);
                      });
  }

  // ---- writing ----
#ifdef LOOM_NET_DIRECT_SEND
  // Under wmu_: writes as much of f as the socket takes without blocking.
  // True when all of it went out.
  bool direct_send(out_frame& f) {
    const auto fd = io_.socket().native_handle();
    const std::size_t total = f.bytes();
    while (f.offset < total) {
      gather_.build([&](auto&& add) { buffers_from(f, f.offset, add); });
      const auto& bufs = gather_.buffers();
      iovec iov[detail::gather_list::max_buffers];
      const std::size_t n = std::min(bufs.size(), detail::gather_list::max_buffers);
      for (std::size_t i = 0; i < n; ++i) {
        iov[i].iov_base = const_cast<void*>(bufs[i].data());
        iov[i].iov_len = bufs[i].size();
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = n;
      int flags = MSG_DONTWAIT;
#ifdef MSG_NOSIGNAL
      flags |= MSG_NOSIGNAL;
#endif
      const auto w = ::sendmsg(fd, &msg, flags);
      if (w < 0) {
        if (errno == EINTR)
          continue;
        return false; // EAGAIN, or an error the async path will report
      }
      f.offset += static_cast<std::size_t>(w);
    }
    return true;
  }
#endif

  // Passes add(pointer, length) the bytes of f from byte `skip` on, buffer by buffer.
  template <class Add> static void buffers_from(const out_frame& f, std::size_t skip, Add& add) {
    f.for_each_buffer([&](const void* p, std::size_t len) {
      if (skip >= len) {
        skip -= len;
        return;
      }
      add(static_cast<const char*>(p) + skip, len - skip);
      skip = 0;
    });
  }

  void write_next() { // strand only
    std::unique_lock lk(wmu_);
    if (closed_)
      return;
    if (queue_.empty()) {
      writing_ = false;
      if (close_after_flush_) {
        close_after_flush_ = false;
        lk.unlock();
        if (linger_)
          return linger_then_close(close_reason_);
        do_close(close_reason_);
      }
      return;
    }
    // Frames while their buffers fit one sendmsg (at least one frame; the gather list
    // copies the small buffers of one with more).
    batch_ = 0;
    std::size_t count = 0;
    for (const auto& f : queue_) {
      if (batch_ > 0 && count + f.buffer_count() > detail::gather_list::max_buffers)
        break;
      count += f.buffer_count();
      ++batch_;
    }
    out_gather_.build([&](auto&& add) {
      for (std::size_t i = 0; i < batch_; ++i)
        buffers_from(queue_[i], queue_[i].offset, add);
    });
    lk.unlock();
    io_.async_write(
        out_gather_.buffers(),
        [self = shared_from_this()](std::error_code ec, std::size_t) { self->on_written(ec); });
  }

  void on_written(std::error_code ec) {
    if (ec) {
      do_close("writing failed: " + ec.message());
      return;
    }
    {
      std::lock_guard lk(wmu_);
      if (closed_)
        return;
      for (std::size_t i = 0; i < batch_ && !queue_.empty(); ++i)
        queue_.pop_front();
    }
    write_next();
  }

  // strand only; `code`: the error the pending handshake read (if any) fails with.
  void do_close(const std::string& reason, error_code code = error_code::unavailable) {
    {
      std::lock_guard lk(wmu_);
      if (closed_)
        return;
      closed_ = true;
    }
    io_.close(); // cancels the pending operations: nothing touches the buffers after this
    timer_.cancel();
    stopped_ = true; // no frame is parsed out of the receive buffer after this
    rbeg_ = rend_ = 0;
    // What the unfinished message held goes now, not when the last reference to this
    // connection does.
    meta_ = {};
    in_payloads_ = {};
    in_bufs_.clear();
    in_fresh_.clear();
    split_.reset();
    release_pending();
    {
      std::lock_guard lk(wmu_);
      queue_.clear();
      writing_ = false;
    }
    auto self = shared_from_this();
    auto sink = std::move(sink_);
    sink_ = nullptr;
    auto once = std::move(once_);
    once_ = nullptr;
    if (once)
      once(make_error(code, reason), incoming_frame{});
    if (sink)
      sink->on_closed(self, reason);
  }

  static constexpr std::size_t sync_read_limit = 4u << 20;
  // The most one read of read_async() asks for.
  static constexpr std::size_t async_read_step = 1u << 20;
  // The receive buffer: one read takes up to this much (a burst of small frames).
  static constexpr std::size_t receive_buffer_bytes = 64u << 10;
  // A frame that still lacks this much is read straight into its buffers, not through
  // the receive buffer (at most receive_buffer_bytes of a large payload is copied).
  static constexpr std::size_t direct_read_min = receive_buffer_bytes;
  // The first metadata buffer of a frame (smaller when the header declares less).
  static constexpr std::size_t metadata_step = 4u << 10;
  // A refused peer's bytes are drained for at most this long (linger_then_close).
  static constexpr std::chrono::milliseconds linger_time{1000};
  static constexpr std::size_t drain_bytes = 16u << 10;

  static std::chrono::steady_clock::rep clock_now() noexcept {
    return std::chrono::steady_clock::now().time_since_epoch().count();
  }

  std::shared_ptr<detail::io_runtime> rt_; // first: destroyed last
  mutable std::mutex smu_;                 // guards strand_, which move_to() changes once
  strand_type strand_;
  transport io_;
  asio::steady_timer timer_;
  frame_limits limits_;
  log_fn log_;
  std::string peer_;

  // reading state (strand only)
  std::array<std::byte, header_size> hdr_{};
  frame_header h_;
  std::string meta_;
  frame_meta fm_;
  std::vector<any_tensor> in_payloads_;
  std::vector<asio::mutable_buffer> in_bufs_;
  std::vector<bool> in_fresh_; // in_bufs_[i] is in memory the layer allocated
  std::string refusal_;        // why the budget refused the last read's bytes
  std::string buffer_error_;
  std::optional<detail::split_message> split_;
  std::shared_ptr<frame_sink> sink_;
  once_fn once_;
  std::shared_ptr<receive_budget> budget_;           // server side only
  std::unique_ptr<receive_budget::account> account_; // its share of budget_
  std::unique_ptr<char[]> drain_;                    // linger_then_close()'s scratch
  std::unique_ptr<char[]> rbuf_;                     // the receive buffer (receive_space())
  std::size_t rbeg_ = 0, rend_ = 0;                  // its unparsed bytes
  std::size_t turn_read_ = 0; // bytes read without waiting since the read loop was entered
  bool next_frame_ = false;   // a frame ended: read_following() reads the next one
  asio::io_context* move_to_ = nullptr; // move_to()'s context, until the move
  bool socket_drained_ = false;         // the last read into rbuf_ took less than it could
  bool stopped_ = false;                // do_close() ran
  std::atomic<bool> in_frame_{false};   // between a header's first byte and delivery
  std::atomic<std::chrono::steady_clock::rep> last_read_{clock_now()};

  // writing state (wmu_)
  std::mutex wmu_;
  bool closed_ = false, writing_ = false, close_after_flush_ = false, linger_ = false;
  std::string close_reason_;
  std::deque<out_frame> queue_;
  detail::gather_list gather_;     // direct_send()'s (under wmu_)
  detail::gather_list out_gather_; // strand only: the async write's buffers
  std::size_t batch_ = 0;          // strand only
};

} // namespace loom::net

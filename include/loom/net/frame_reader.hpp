// The receiving half of a connection (connection.hpp): the read loop that turns the bytes
// of its transport into frames, and hands each to the connection's sink (frame_sink.hpp),
// or during the handshake to a one-shot callback.
//
// The loop reads a header, the metadata, the payloads, then the next header, through a
// receive buffer: one read takes what the socket holds (read_buffers.hpp), and
// the headers, metadata and small payloads of the frames in it are copied out of it, so a
// burst of small frames costs one recvmsg, not one per header and per payload; what a
// frame still lacks once the buffer is empty is read straight into its tensors when it is
// large (direct_read_min or more), the zero-copy path of big payloads. A message split
// into parts (out_frame.hpp) is put together here and delivered whole.
//
// Memory: a frame's metadata buffer grows as its bytes arrive (a header that declares
// 64 MiB costs 4 KiB until the bytes come), and a tensor the layer allocates is written
// only with received bytes (its pages are committed as they arrive). What the unfinished
// message holds is charged as it arrives (receive_charge, receive_budget.hpp), and
// released when the message is delivered or the connection closes.
//
// Everything here runs on the connection's strand. What the loop cannot decide alone
// (closing, replying to a bad frame, answering a ping, moving to another thread) it asks
// of its owner, the connection; its pending reads keep the connection alive (owner::self).
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/tensor.hpp>
#include <loom/net/frame.hpp>
#include <loom/net/frame_sink.hpp>
#include <loom/net/liveness.hpp>
#include <loom/net/read_buffers.hpp>
#include <loom/net/receive_budget.hpp>
#include <loom/net/transport.hpp>

#include <asio/buffer.hpp>
#include <asio/error.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::net {

namespace detail {
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

class frame_reader {
public:
  using once_fn = std::function<void(std::exception_ptr, incoming_frame&&)>;

  // What the loop asks of the connection it reads for (on its strand).
  class owner {
  public:
    // The connection: what a pending read holds on to, and what the sink is given.
    virtual std::shared_ptr<connection> self() = 0;
    // At a frame boundary: true when the connection has just moved to another io thread
    // (socket_placement.hpp); the loop then stops here and the owner resumes it there.
    virtual bool moved_at_boundary() = 0;
    // A ping arrived: answer it (liveness, whatever the handlers are doing).
    virtual void ping() = 0;
    // The stream failed or ended.
    virtual void read_failed(std::error_code ec) = 0;
    // A malformed frame, or one over the budget: reply with e where possible, and close.
    virtual void refuse(const loom::error& e) = 0;
    // A TLS handshake where a plain hello was due (a TLS client, a server without TLS).
    virtual void refuse_tls_client() = 0;

  protected:
    ~owner() = default;
  };

  frame_reader(owner& o, connection& c, transport& io, const frame_limits& limits,
               receive_charge& charge, link_activity& activity)
      : owner_(o), conn_(c), io_(io), limits_(limits), charge_(charge), activity_(activity) {}
  frame_reader(const frame_reader&) = delete;
  frame_reader& operator=(const frame_reader&) = delete;

  // Starts the loop: every frame goes to sink until stop().
  void start(std::shared_ptr<frame_sink> sink) {
    sink_ = std::move(sink);
    turn_read_ = 0;
    resume();
  }
  // Goes on reading frames (on the new strand after a move).
  void resume() {
    read_header();
    read_following();
  }
  // Reads exactly one handshake frame and hands it to cb.
  void read_one(once_fn cb) {
    once_ = std::move(cb);
    read_header();
  }

  // Between the handshake's frames (a one-shot callback waits), and past it (a sink takes
  // the frames).
  bool in_handshake() const noexcept { return static_cast<bool>(once_); }
  bool has_sink() const noexcept { return static_cast<bool>(sink_); }

  // The last header read, as bytes (a refusal names its request).
  std::span<const std::byte> header_bytes() const noexcept { return hdr_; }
  // The reply's text when the budget refused the message being read.
  std::string budget_message(const std::string& why) const {
    return "not enough memory for the frame (request " + std::to_string(peek_request_id(hdr_)) +
           "): " + why;
  }

  // The connection closed (its socket is closed, nothing is pending): nothing more is
  // parsed, what the unfinished message held goes now (not when the last reference to the
  // connection does), and the consumers are handed back to be told.
  std::pair<std::shared_ptr<frame_sink>, once_fn> stop();

private:
  // Every read goes through read_rest(): in_ holds the buffers still to fill, those in
  // memory the layer allocated for this message marked fresh, their bytes charged to the
  // budget as they arrive (a metadata buffer is charged before it grows instead).
  using step_fn = void (frame_reader::*)(std::error_code);

  // The next frame's header: from the receive buffer when it holds one, else from the
  // socket. Called by read_following() once a frame was delivered (never from inside
  // deliver(): a burst of frames in the buffer is a loop, not a recursion).
  void read_header();

  // Reads the frames that follow the one just delivered (or the ping just answered), for
  // as long as their bytes are here; returns once the connection waits for bytes. Run by
  // every entry into the read loop (start(), a completed asynchronous read) after its step.
  void read_following() {
    while (std::exchange(next_frame_, false))
      read_header();
  }

  void on_header(std::error_code ec);

  // Reads the metadata into a buffer that grows with the bytes that have arrived: at
  // least metadata_step, doubling once full, and to what the socket already holds, never
  // past what the header declares. A header that declares 64 MiB and sends nothing costs
  // 4 KiB, not 64 MiB; an honest sender's metadata usually fits the first buffer.
  void read_metadata();

  void on_metadata_bytes(std::error_code ec) {
    if (ec)
      return owner_.read_failed(ec);
    read_metadata();
  }

  // Reads in_ completely, then calls (this->*next)(ec): first from the receive
  // buffer, then from the socket. What the socket already holds is read at once on this
  // strand (no trip through the scheduler; under TLS what is already decrypted,
  // transport.hpp): into the receive buffer while in_ lacks less than direct_read_min
  // bytes (a read then also takes the frames behind), else straight into in_. At
  // most sync_read_limit bytes per turn, so that a peer whose frames arrive as fast as they
  // are read cannot hold this thread; the rest is read as it arrives (read_async).
  void read_rest(step_fn next);

  // Reads the rest of in_ as it arrives, then calls next and reads the frames that
  // follow (read_following). A small rest: one read into the receive buffer, whatever
  // arrives (read_rest() then copies it out and goes on). A large one: asio::async_read
  // straight into in_ (its reads are continuations, cheaper to schedule than a chain
  // of async_read_some), noting and charging each read as it completes, so a peer that
  // stalls halfway holds only what it sent; a charge the budget refuses ends the read
  // there, and the connection closes.
  void read_async(step_fn next);

  // n bytes were read into the receive buffer.
  void filled(std::size_t n) {
    rbuf_.filled(n);
    if (n > 0)
      activity_.received(link_activity::now());
  }

  // n bytes arrived in in_. False when charging them passed the budget: refusal_
  // then says why (the caller closes the connection with it).
  bool received(std::size_t n);

  // A message over the server's budget: refused with resource_exhausted, then closed.
  void over_budget(const std::string& why) {
    owner_.refuse(resource_exhausted_error(budget_message(why)));
  }

  // Fresh destinations that will hold `bytes` more: refused at once when that passes the
  // per-connection limit. False when refused (the connection then closes).
  bool fits(std::uint64_t bytes) {
    const std::string why = charge_.fits(bytes);
    if (why.empty())
      return true;
    over_budget(why);
    return false;
  }

  void on_metadata(std::error_code ec);

  // The tensor to receive payload i of the frame (h, m, metadata) into: the sink's
  // buffer when it offers a matching one, else a fresh tensor (bounded by the checked
  // limits; `fresh` says so). Its pages are committed as its bytes arrive: the
  // layer never touches a fresh tensor before writing received bytes into it.
  // A mismatch is noted in buffer_error_, which the frame carries.
  any_tensor destination_for(const frame_header& h, const frame_meta& m,
                             const std::string& metadata, std::size_t i, bool& fresh);

  // A split head: its descriptors are the message's; the tensors are allocated as their
  // bytes arrive in the parts that follow.
  void begin_split();

  // A part: its bytes go straight into the tensors they belong to.
  void read_part();

  // The last part has arrived: the message goes to the sink as one frame.
  void finish_split();

  void on_payloads(std::error_code ec);

  // Hands the frame read into h_, fm_, meta_, in_payloads_ to the sink.
  void deliver();

  static constexpr std::size_t sync_read_limit = 4u << 20;
  // The most one read of read_async() asks for.
  static constexpr std::size_t async_read_step = 1u << 20;
  // A frame that still lacks this much is read straight into its buffers, not through
  // the receive buffer (at most its capacity of a large payload is copied).
  static constexpr std::size_t direct_read_min = detail::receive_buffer::capacity;
  // The first metadata buffer of a frame (smaller when the header declares less).
  static constexpr std::size_t metadata_step = 4u << 10;

  owner& owner_;
  connection& conn_; // what the sink's destination() is told
  transport& io_;
  const frame_limits& limits_;
  receive_charge& charge_;
  link_activity& activity_;

  std::shared_ptr<frame_sink> sink_; // past the handshake
  once_fn once_;                     // during it: the one frame awaited
  std::array<std::byte, header_size> hdr_{};
  frame_header h_;
  std::string meta_;
  frame_meta fm_;
  std::vector<any_tensor> in_payloads_;
  detail::read_target in_; // what the loop fills now
  std::string refusal_;    // why the budget refused the last read's bytes
  std::string buffer_error_;
  std::optional<detail::split_message> split_;
  detail::receive_buffer rbuf_; // bytes read, not yet parsed
  std::size_t turn_read_ = 0;   // bytes read without waiting since the read loop was entered
  bool next_frame_ = false;     // a frame ended: read_following() reads the next one
  bool stopped_ = false;        // stop() ran
};

} // namespace loom::net

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net {

LOOM_COMPILED_ONCE auto frame_reader::stop() -> std::pair<std::shared_ptr<frame_sink>, once_fn> {
  stopped_ = true; // no frame is parsed out of the receive buffer after this
  rbuf_.clear();
  meta_ = {};
  in_payloads_ = {};
  in_.clear();
  split_.reset();
  charge_.release_all();
  return {std::exchange(sink_, nullptr), std::exchange(once_, nullptr)};
}

LOOM_COMPILED_ONCE void frame_reader::read_header() {
  activity_.in_frame(false);
  if (stopped_ || owner_.moved_at_boundary())
    return;
  in_.set(asio::buffer(hdr_), false);
  read_rest(&frame_reader::on_header);
}

LOOM_COMPILED_ONCE void frame_reader::on_header(std::error_code ec) {
  if (ec)
    return owner_.read_failed(ec);
  if (once_ && !io_.secure() && looks_like_tls(hdr_))
    return owner_.refuse_tls_client();
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
          std::to_string(h_.request_id) + ") where part " + std::to_string(split_->received) + "/" +
          std::to_string(split_->meta.payload_bytes) + " bytes of split message " +
          std::to_string(split_->header.request_id) + " was due");
    if (!split_ && is_part(h_))
      throw data_loss_error("a part frame (request " + std::to_string(h_.request_id) +
                            ") without a split head before it");
  } catch (const loom::error& e) {
    return owner_.refuse(e);
  }
  // Liveness: answered here, on the io thread, whatever the handlers are doing; a pong
  // (like every byte received) has already counted as life.
  if (h_.kind == frame_kind::ping || h_.kind == frame_kind::pong) {
    if (h_.kind == frame_kind::ping)
      owner_.ping();
    next_frame_ = true; // read_following() reads the next header
    return;
  }
  meta_.clear();
  read_metadata();
}

LOOM_COMPILED_ONCE void frame_reader::read_metadata() {
  const std::size_t have = meta_.size(), declared = h_.metadata_bytes;
  if (have == declared)
    return on_metadata({});
  std::size_t want = std::max(2 * have, metadata_step);
  if (declared > want) {
    std::error_code ec;
    const std::size_t ready = io_.available(ec);
    if (!ec)
      want = std::max(want, have + rbuf_.size() + ready);
  }
  want = std::min(want, declared);
  if (const std::string why = charge_.charge(want - have); !why.empty())
    return over_budget(why);
  meta_.resize(want);
  in_.set(asio::buffer(meta_.data() + have, want - have), false);
  read_rest(&frame_reader::on_metadata_bytes);
}

LOOM_COMPILED_ONCE void frame_reader::read_rest(step_fn next) {
  std::error_code ec;
  while (!in_.empty()) {
    if (const std::size_t n = rbuf_.copy_into(in_.buffers())) {
      if (!received(n))
        return over_budget(refusal_); // closes the connection
      continue;
    }
    if (turn_read_ >= sync_read_limit) {
      ec = asio::error::would_block; // this turn is over: go on asynchronously
      break;
    }
    std::size_t n = 0;
    if (in_.wanted() >= direct_read_min) {
      n = io_.read_ready(in_.buffers(), ec);
      if (ec)
        break;
      if (!received(n))
        return over_budget(refusal_);
    } else {
      if (rbuf_.drained() && !io_.secure()) {
        // The last read left the socket empty: a read now would most likely find
        // nothing (EAGAIN), and the asynchronous one tries at once anyway.
        ec = asio::error::would_block;
        break;
      }
      n = io_.read_ready(rbuf_.space(), ec);
      if (ec)
        break;
      filled(n);
    }
    turn_read_ += n;
  }
  if (in_.empty())
    return (this->*next)({});
  if (ec && ec != asio::error::would_block && ec != asio::error::try_again)
    return (this->*next)(ec);
  read_async(next);
}

LOOM_COMPILED_ONCE void frame_reader::read_async(step_fn next) {
  if (in_.wanted() < direct_read_min) {
    io_.async_read_some(rbuf_.space(),
                        [this, self = owner_.self(), next](std::error_code ec, std::size_t n) {
                          if (stopped_) // closed meanwhile: nothing more is parsed
                            return;
                          turn_read_ = 0;
                          if (n > 0) {
                            filled(n);
                            ec = {}; // the bytes first; a closed stream shows at the next read
                          }
                          if (ec)
                            (this->*next)(ec);
                          else
                            read_rest(next);
                          read_following();
                        });
    return;
  }
  io_.async_read(
      in_.buffers(),
      [this, done = std::size_t{0}](const std::error_code& ec,
                                    std::size_t total) mutable -> std::size_t {
        const std::size_t n = total - done;
        done = total;
        if (ec || !received(n) || in_.empty())
          return 0;
        return async_read_step;
      },
      [this, self = owner_.self(), next](std::error_code ec, std::size_t total) {
        // Asio calls the condition above only between reads, not after the read that
        // fills the buffers: that read is life too.
        if (total > 0)
          activity_.received(link_activity::now());
        turn_read_ = 0;
        if (!refusal_.empty())
          return over_budget(refusal_);
        (this->*next)(ec);
        read_following();
      });
}

LOOM_COMPILED_ONCE bool frame_reader::received(std::size_t n) {
  if (n == 0)
    return true;
  activity_.in_frame(true);
  const auto now = link_activity::now();
  activity_.received(now);
  charge_.note_progress(now);
  refusal_ = charge_.charge(in_.consume(n));
  return refusal_.empty();
}

LOOM_COMPILED_ONCE void frame_reader::on_metadata(std::error_code ec) {
  if (ec)
    return owner_.read_failed(ec);
  if (once_) {
    incoming_frame f;
    f.header = h_;
    f.metadata = std::move(meta_);
    charge_.release_all();
    auto cb = std::exchange(once_, nullptr);
    cb(nullptr, std::move(f));
    return;
  }
  try {
    fm_ = parse_metadata(h_, std::as_bytes(std::span<const char>(meta_.data(), meta_.size())),
                         limits_);
  } catch (const loom::error& e) {
    return owner_.refuse(e);
  }
  if (is_part(h_))
    return read_part();
  if (is_split_head(h_))
    return begin_split();
  std::uint64_t fresh_bytes = 0;
  try {
    in_payloads_.clear();
    in_.clear();
    buffer_error_.clear();
    for (std::size_t i = 0; i < fm_.payloads.size(); ++i) {
      const auto& p = fm_.payloads[i];
      bool fresh = false;
      any_tensor t = destination_for(h_, fm_, meta_, i, fresh);
      if (p.bytes)
        in_.add(asio::buffer(t.raw_data(), static_cast<std::size_t>(p.bytes)), fresh);
      fresh_bytes += fresh ? p.bytes : 0;
      in_payloads_.push_back(std::move(t));
    }
  } catch (const loom::error& e) {
    return owner_.refuse(e);
  } catch (const std::bad_alloc&) {
    return owner_.refuse(resource_exhausted_error(
        "cannot allocate " + std::to_string(fm_.payload_bytes) + " payload bytes"));
  }
  if (!fits(fresh_bytes))
    return;
  read_rest(&frame_reader::on_payloads);
}

LOOM_COMPILED_ONCE auto frame_reader::destination_for(const frame_header& h, const frame_meta& m,
                                                      const std::string& metadata, std::size_t i,
                                                      bool& fresh) -> any_tensor {
  const auto& p = m.payloads[i];
  any_tensor t;
  if (sink_) {
    try {
      t = sink_->destination(conn_, h, m,
                             std::string_view(metadata).substr(m.user_offset, m.user_bytes), i, p);
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

LOOM_COMPILED_ONCE void frame_reader::begin_split() {
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

LOOM_COMPILED_ONCE void frame_reader::read_part() {
  auto& s = *split_;
  const std::uint64_t n = fm_.payload_bytes;
  charge_.release(meta_.size()); // the part's own metadata is parsed: only the head's is held
  meta_.clear();
  try {
    if (n > s.meta.payload_bytes - s.received)
      throw data_loss_error("a part of " + std::to_string(n) + " bytes where split message " +
                            std::to_string(s.header.request_id) + " has " +
                            std::to_string(s.meta.payload_bytes - s.received) + " left");
    in_.clear();
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
      in_.add(asio::buffer(static_cast<char*>(t.raw_data()) + s.in_next,
                           static_cast<std::size_t>(take)),
              s.fresh[s.next]);
      s.in_next += take;
      left -= take;
    }
    s.received += n;
  } catch (const loom::error& e) {
    return owner_.refuse(e);
  } catch (const std::bad_alloc&) {
    return owner_.refuse(resource_exhausted_error("cannot allocate payload " +
                                                  std::to_string(s.next) + " of split message " +
                                                  std::to_string(s.header.request_id)));
  }
  read_rest(&frame_reader::on_payloads);
}

LOOM_COMPILED_ONCE void frame_reader::finish_split() {
  auto s = std::move(*split_);
  split_.reset();
  try {
    bool fresh = false;
    for (std::size_t i = 0; i < s.payloads.size(); ++i)
      if (s.payloads[i].empty()) // no bytes: a tensor of 0 elements
        s.payloads[i] = destination_for(s.header, s.meta, s.metadata, i, fresh);
  } catch (const std::bad_alloc&) {
    return owner_.refuse(resource_exhausted_error("cannot allocate the payloads of split message " +
                                                  std::to_string(s.header.request_id)));
  }
  h_ = s.header;
  fm_ = std::move(s.meta);
  meta_ = std::move(s.metadata);
  in_payloads_ = std::move(s.payloads);
  deliver();
}

LOOM_COMPILED_ONCE void frame_reader::on_payloads(std::error_code ec) {
  if (ec)
    return owner_.read_failed(ec);
  if (split_) {
    if (split_->received < split_->meta.payload_bytes)
      return read_header();
    return finish_split();
  }
  deliver();
}

LOOM_COMPILED_ONCE void frame_reader::deliver() {
  try {
    for (std::size_t i = 0; i < fm_.payloads.size(); ++i)
      validate_payload_bytes(fm_.payloads[i], in_payloads_[i].raw_data(), i);
  } catch (const loom::error& e) {
    return owner_.refuse(e);
  }
  charge_.release_all(); // the message is the handler's now
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
  auto self = owner_.self();
  activity_.in_frame(false);
  sink->on_frame(self, std::move(f));
  next_frame_ = true; // read_following() reads the next frame, after on_frame returned
}

} // namespace loom::net

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

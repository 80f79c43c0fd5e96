// Where the bytes a connection reads go (frame_reader.hpp): the receive buffer that one
// read fills with whatever the socket holds, and the buffers the read loop is filling
// now (a header, a metadata buffer, a frame's tensors). Strand only, like the loop.
#pragma once

#include <loom/core/compiled_once.hpp>

#include <asio/buffer.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

namespace loom::net::detail {

// Bytes read but not yet parsed. Allocated at the first read, so a connection that never
// sends holds none; it holds bytes only between a read and the parsing of what that read
// brought, and is refilled only once empty. One read takes up to `capacity`, so a burst of
// small frames costs one recvmsg, not one per header and per payload.
class receive_buffer {
public:
  static constexpr std::size_t capacity = 64u << 10;

  // Bytes not yet parsed.
  std::size_t size() const noexcept { return end_ - begin_; }
  // The last read took less than it could: the socket is most likely empty.
  bool drained() const noexcept { return drained_; }

  // Where the next read goes (the buffer is empty then).
  asio::mutable_buffer space() {
    if (!data_)
      data_.reset(new char[capacity]);
    begin_ = end_ = 0;
    return asio::buffer(data_.get(), capacity);
  }
  // n bytes were read into space().
  void filled(std::size_t n) noexcept {
    begin_ = 0;
    end_ = n;
    drained_ = n < capacity;
  }
  // Drops what it holds (the connection closed).
  void clear() noexcept { begin_ = end_ = 0; }

  // Copies what it holds into `to`, in order, as far as it goes; returns how many bytes.
  std::size_t copy_into(const std::vector<asio::mutable_buffer>& to) noexcept;

private:
  std::unique_ptr<char[]> data_;
  std::size_t begin_ = 0, end_ = 0; // the unparsed bytes: data_[begin_, end_)
  bool drained_ = false;
};

// The buffers the read loop fills next, each marked fresh when it is memory the layer
// allocated for the message (whose bytes are charged to the budget as they arrive).
class read_target {
public:
  void set(asio::mutable_buffer b, bool fresh) {
    bufs_.assign(1, b);
    fresh_.assign(1, fresh);
  }
  void add(asio::mutable_buffer b, bool fresh) {
    bufs_.push_back(b);
    fresh_.push_back(fresh);
  }
  void clear() noexcept {
    bufs_.clear();
    fresh_.clear();
  }

  bool empty() const noexcept { return bufs_.empty(); }
  const std::vector<asio::mutable_buffer>& buffers() const noexcept { return bufs_; }
  // Bytes still lacking.
  std::size_t wanted() const noexcept {
    std::size_t n = 0;
    for (const auto& b : bufs_)
      n += b.size();
    return n;
  }

  // The first n bytes arrived: drops them; returns how many of them were fresh.
  std::size_t consume(std::size_t n);

private:
  std::vector<asio::mutable_buffer> bufs_;
  std::vector<bool> fresh_;
};

} // namespace loom::net::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::net::detail {

LOOM_COMPILED_ONCE std::size_t
receive_buffer::copy_into(const std::vector<asio::mutable_buffer>& to) noexcept {
  std::size_t n = 0;
  for (std::size_t i = 0; i < to.size() && begin_ < end_; ++i) {
    const std::size_t k = std::min(to[i].size(), end_ - begin_);
    std::memcpy(to[i].data(), data_.get() + begin_, k);
    begin_ += k;
    n += k;
    if (k < to[i].size())
      break;
  }
  return n;
}

LOOM_COMPILED_ONCE std::size_t read_target::consume(std::size_t n) {
  std::size_t i = 0, fresh = 0;
  while (i < bufs_.size() && n >= bufs_[i].size()) {
    n -= bufs_[i].size();
    fresh += fresh_[i] ? bufs_[i].size() : 0;
    ++i;
  }
  bufs_.erase(bufs_.begin(), bufs_.begin() + static_cast<std::ptrdiff_t>(i));
  fresh_.erase(fresh_.begin(), fresh_.begin() + static_cast<std::ptrdiff_t>(i));
  if (n && !bufs_.empty()) {
    bufs_.front() += n;
    fresh += fresh_.front() ? n : 0;
  }
  return fresh;
}

} // namespace loom::net::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

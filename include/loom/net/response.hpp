// net::response: what a call (channel.hpp) returns, the caller's metadata as the server
// sent it, decoded on request, and the payloads, already in their tensors.
#pragma once

#include <loom/core/tensor.hpp>
#include <loom/net/frame_metadata.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::net {

class response {
public:
  std::string_view raw_metadata() const noexcept {
    return std::string_view(raw_).substr(offset_, size_);
  }
  template <class T> T metadata() const { return decode_metadata<T>(raw_metadata(), "a response"); }
  std::vector<any_tensor> payloads;

  // Used by the channel: adopts the received metadata bytes (the whole metadata, of which
  // the caller's is `size` bytes at `offset`), so a response holds them without a copy.
  void adopt_metadata(std::string raw, std::size_t offset, std::size_t size) {
    raw_ = std::move(raw);
    offset_ = offset;
    size_ = size;
  }

private:
  std::string raw_;
  std::size_t offset_ = 0, size_ = 0;
};

} // namespace loom::net

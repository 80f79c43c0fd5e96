// Where a connection's frames go (connection.hpp): a frame as received, and the
// interface of whoever takes it, the server (server.hpp, one sink per admitted
// connection) or the channel (channel_core.hpp). Its own header so that the reader
// (frame_reader.hpp) that produces frames and the sinks that consume them need
// not know each other.
#pragma once

#include <loom/core/tensor.hpp>
#include <loom/net/frame.hpp>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::net {

class connection;

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

} // namespace loom::net

// libFuzzer target for the cereal-decoded metadata of every loom.* RPC
// (include/loom/runtime/protocol.hpp), decoded exactly as the task server and
// the client decode it: net::decode_metadata<T> (what net::request::metadata<T>
// and net::response::metadata<T> call), then what each side does next with
// the bytes before anything else runs: the string tensors put back among the
// payloads (string_values::restore), the graph of register_graph deserialized
// (deserialize_graph), the cluster of cluster_info rebuilt (cluster_def::spec).
//
// Input: one selector byte, then the caller's metadata bytes as they follow the
// envelope in a frame. The selector's low 4 bits pick the message; its high 4
// bits are the number of (non-string) payloads that arrived with it, which
// restore() interleaves with the string tensors.
//
// Every input must decode or throw a loom::error; anything else (a crash,
// another exception, an allocation over -malloc_limit_mb, an ASan or UBSan
// report) is a bug. Corpus: fuzz/corpus/rpc_metadata_fuzz (fuzz/capture_corpus).
#include <loom/api.hpp> // every op's registration: deserialize_graph checks node ops against it
#include <loom/net/frame.hpp>
#include <loom/runtime/protocol.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace loom;

// The payloads a request carried beside its string tensors.
std::vector<any_tensor> payloads_of(std::uint8_t selector) {
  std::vector<any_tensor> p;
  for (int i = 0; i < (selector >> 4); ++i)
    p.push_back(any_tensor(dtype::f32, loom::shape({2})));
  return p;
}

template <class T> T decode(std::string_view bytes) {
  return net::decode_metadata<T>(bytes, "a fuzzed frame");
}

void decode_message(std::uint8_t selector, std::string_view bytes) {
  switch (selector & 0xf) {
  case 0: { // the client, on the target's reply
    const auto m = decode<protocol::cluster_info_reply>(bytes);
    (void)m.cluster.spec();
    break;
  }
  case 1: { // the task server, on register_graph
    const auto m = decode<protocol::register_graph_request>(bytes);
    (void)deserialize_graph(m.graph);
    break;
  }
  case 2: (void)decode<protocol::register_graph_reply>(bytes); break;
  case 3: (void)decode<protocol::deregister_graph_request>(bytes); break;
  case 4: { // the task server, on run_graph
    auto m = decode<protocol::run_graph_request>(bytes);
    auto payloads = payloads_of(selector);
    std::move(m.strings).restore(payloads);
    break;
  }
  case 5: { // the client, on run_graph's reply
    auto m = decode<protocol::run_graph_reply>(bytes);
    auto payloads = payloads_of(selector);
    std::move(m.strings).restore(payloads);
    break;
  }
  case 6: { // the task server, on rendezvous_put
    auto m = decode<protocol::rendezvous_put_request>(bytes);
    auto payloads = payloads_of(selector);
    std::move(m.strings).restore(payloads);
    break;
  }
  case 7: (void)decode<protocol::abort_step_request>(bytes); break;
  case 8: (void)decode<protocol::reset_request>(bytes); break;
  case 9: // register_graph's graph bytes alone, to reach the graph decoder directly
    (void)deserialize_graph(std::string(bytes));
    break;
  default: // cluster_info and shutdown requests carry net::empty: nothing to decode
    (void)decode<net::empty>(bytes);
    break;
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0)
    return 0;
  try {
    decode_message(data[0], std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  } catch (const loom::error&) {
    // A clear error: fine.
  }
  return 0;
}

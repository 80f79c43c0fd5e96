// example_builder (TF's tf.train.Example built by hand): named int64, float
// and bytes lists serialized as a tf.Example proto, which TensorFlow's
// parse_example and loom's read. Lists are written packed, as TF writes them.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/protobuf_wire.hpp>

#include <bit>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace loom::data {

class example_builder {
public:
  example_builder& add_int64(const std::string& name, const std::vector<std::int64_t>& values);
  example_builder& add_float(const std::string& name, const std::vector<float>& values);
  example_builder& add_bytes(const std::string& name, const std::vector<std::string>& values) {
    loom::detail::protobuf::writer list;
    for (const auto& v : values)
      list.bytes(1, v);
    return add(name, 1, list);
  }

  // The Example's bytes, features in name order.
  std::string serialize() const;

private:
  // Feature: bytes_list = 1, float_list = 2, int64_list = 3.
  example_builder& add(const std::string& name, std::uint32_t kind,
                       const loom::detail::protobuf::writer& list) {
    features_[name] = std::move(loom::detail::protobuf::writer().message(kind, list)).bytes();
    return *this;
  }
  std::map<std::string, std::string> features_;
};

} // namespace loom::data

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::data {

LOOM_COMPILED_ONCE auto example_builder::add_int64(const std::string& name,
                                                   const std::vector<std::int64_t>& values)
    -> example_builder& {
  std::string packed;
  for (const std::int64_t v : values)
    for (auto u = static_cast<std::uint64_t>(v);; u >>= 7) {
      if (u < 0x80) {
        packed.push_back(static_cast<char>(u));
        break;
      }
      packed.push_back(static_cast<char>(u | 0x80));
    }
  return add(name, 3, loom::detail::protobuf::writer().bytes(1, packed));
}

LOOM_COMPILED_ONCE auto example_builder::add_float(const std::string& name,
                                                   const std::vector<float>& values)
    -> example_builder& {
  std::string packed;
  for (const float v : values) {
    const auto bits = std::bit_cast<std::uint32_t>(v);
    for (int i = 0; i < 4; ++i)
      packed.push_back(static_cast<char>(bits >> (8 * i) & 0xff));
  }
  return add(name, 2, loom::detail::protobuf::writer().bytes(1, packed));
}

LOOM_COMPILED_ONCE std::string example_builder::serialize() const {
  loom::detail::protobuf::writer features;
  for (const auto& [name, feature] : features_)
    features.message(1, loom::detail::protobuf::writer().bytes(1, name).bytes(2, feature));
  return std::move(loom::detail::protobuf::writer().message(1, features)).bytes();
}

} // namespace loom::data

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// A cereal input archive for bytes that came from a peer (RPC metadata, a
// graph sent to register_graph): it reads exactly what cereal's
// PortableBinaryOutputArchive writes, but never trusts a declared size.
//
// cereal's own PortableBinaryInputArchive resizes a container to the size the
// bytes declare before it reads a single element, so eight bytes saying
// "2^40 strings" allocate terabytes (std::bad_alloc at best, the OOM killer at
// worst) long before the input runs out. Here:
//   - every size (of a string, vector, map, ...) is checked against the bytes
//     left, since each element occupies at least one byte;
//   - a vector of structs grows as its elements decode instead of being
//     resized up front (a node_def is hundreds of bytes in memory for a few on
//     the wire);
//   - a bool must be 0 or 1 (any other byte would be undefined behaviour);
// so what one decode allocates is bounded by a small multiple of the bytes it
// was given, and a bad input is a data_loss_error naming the offset.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>

#include <cereal/archives/portable_binary.hpp>
#include <cereal/cereal.hpp>
#include <cereal/details/traits.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace loom::detail {

class bounded_input_archive
    : public cereal::InputArchive<bounded_input_archive, cereal::AllowEmptyClassElision> {
public:
  // `bytes` must outlive the archive. Reads the byte-order flag that
  // PortableBinaryOutputArchive writes first.
  explicit bounded_input_archive(std::string_view bytes);

  std::size_t remaining() const noexcept { return bytes_.size() - pos_; }
  std::size_t offset() const noexcept { return pos_; }

  // Reads `size` bytes of elements of `element_size` bytes each, in the
  // sender's byte order.
  void read_elements(void* data, std::size_t size, std::size_t element_size);

  // Throws unless `count` elements of at least `min_bytes` bytes each can
  // still follow: what every declared size passes before anything is allocated.
  // `declared_at`: the offset of the size, for the error.
  void check_count(std::uint64_t count, std::size_t min_bytes, std::string_view what,
                   std::size_t declared_at) const;

private:
  void read_bytes(void* out, std::size_t n);

  std::string_view bytes_;
  std::size_t pos_ = 0;
  bool swap_ = false;
};

// What cereal needs of an input archive (as cereal/archives/portable_binary.hpp
// defines them for its own), found by argument-dependent lookup.

template <class T>
requires std::is_arithmetic_v<T>
void CEREAL_LOAD_FUNCTION_NAME(bounded_input_archive& ar, T& value) {
  if constexpr (std::is_same_v<T, bool>) {
    std::uint8_t b = 0;
    const std::size_t at = ar.offset();
    ar.read_elements(&b, 1, 1);
    if (b > 1)
      throw data_loss_error("cereal portable binary: bool of byte value " + std::to_string(b) +
                            " at offset " + std::to_string(at));
    value = b == 1;
  } else {
    ar.read_elements(&value, sizeof value, sizeof value);
  }
}

template <class T>
void CEREAL_LOAD_FUNCTION_NAME(bounded_input_archive& ar, cereal::NameValuePair<T>& t) {
  ar(t.value);
}

// Every size cereal reads (strings, vectors, maps, sets): each element takes a
// byte at least (no loom type that travels in a container is an empty class).
template <class T>
void CEREAL_LOAD_FUNCTION_NAME(bounded_input_archive& ar, cereal::SizeTag<T>& t) {
  const std::size_t at = ar.offset();
  ar(t.size);
  ar.check_count(static_cast<std::uint64_t>(t.size), 1, "a container", at);
}

template <class T>
void CEREAL_LOAD_FUNCTION_NAME(bounded_input_archive& ar, cereal::BinaryData<T>& bd) {
  using element = std::remove_pointer_t<T>;
  static_assert(!std::is_same_v<std::remove_cv_t<element>, bool>,
                "a bool array is read element by element (each must be 0 or 1)");
  ar.read_elements(bd.data, static_cast<std::size_t>(bd.size), sizeof(element));
}

// A vector of arithmetic elements: all its bytes must be present, then one read.
template <class T, class A>
requires(std::is_arithmetic_v<T> &&
         !std::is_same_v<T, bool>) void CEREAL_LOAD_FUNCTION_NAME(bounded_input_archive& ar,
                                                                  std::vector<T, A>& v) {
  cereal::size_type n = 0;
  const std::size_t at = ar.offset();
  ar(cereal::make_size_tag(n));
  ar.check_count(n, sizeof(T), "a vector", at);
  v.resize(static_cast<std::size_t>(n));
  ar.read_elements(v.data(), static_cast<std::size_t>(n) * sizeof(T), sizeof(T));
}

// Any other vector grows as its elements decode: its declared size reserves no
// more than the bytes left could hold.
template <class T, class A>
requires(!std::is_arithmetic_v<T>) void CEREAL_LOAD_FUNCTION_NAME(bounded_input_archive& ar,
                                                                  std::vector<T, A>& v) {
  cereal::size_type n = 0;
  ar(cereal::make_size_tag(n));
  v.clear();
  v.reserve(static_cast<std::size_t>(std::min<cereal::size_type>(n, 64)));
  for (cereal::size_type i = 0; i < n; ++i) {
    v.emplace_back();
    ar(v.back());
  }
}

template <class A>
void CEREAL_LOAD_FUNCTION_NAME(bounded_input_archive& ar, std::vector<bool, A>& v) {
  cereal::size_type n = 0;
  ar(cereal::make_size_tag(n));
  v.clear();
  for (cereal::size_type i = 0; i < n; ++i) {
    bool b = false;
    ar(b);
    v.push_back(b);
  }
}

// Decodes one T from `bytes`, as PortableBinaryOutputArchive wrote it.
template <class T> T bounded_decode(std::string_view bytes) {
  bounded_input_archive ar(bytes);
  T value{};
  ar(value);
  return value;
}

} // namespace loom::detail

// cereal finds the output archive of an input archive for load_minimal (enums
// travel as their underlying type). Only this direction: PortableBinaryOutputArchive's
// input archive stays cereal's own.
namespace cereal::traits::detail {
template <> struct get_output_from_input<loom::detail::bounded_input_archive> {
  using type = cereal::PortableBinaryOutputArchive;
};
} // namespace cereal::traits::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE bounded_input_archive::bounded_input_archive(std::string_view bytes)
    : cereal::InputArchive<bounded_input_archive, cereal::AllowEmptyClassElision>(this),
      bytes_(bytes) {
  std::uint8_t little = 0;
  read_bytes(&little, 1);
  if (little > 1)
    throw data_loss_error("cereal portable binary: byte-order flag " + std::to_string(little) +
                          " at offset 0 (expected 0 or 1)");
  swap_ = (little == 1) != (std::endian::native == std::endian::little);
}

LOOM_COMPILED_ONCE void bounded_input_archive::read_elements(void* data, std::size_t size,
                                                             std::size_t element_size) {
  read_bytes(data, size);
  if (swap_ && element_size > 1) {
    auto* p = static_cast<unsigned char*>(data);
    for (std::size_t i = 0; i + element_size <= size; i += element_size)
      std::reverse(p + i, p + i + element_size);
  }
}

LOOM_COMPILED_ONCE void bounded_input_archive::check_count(std::uint64_t count,
                                                           std::size_t min_bytes,
                                                           std::string_view what,
                                                           std::size_t declared_at) const {
  if (min_bytes != 0 && count > remaining() / min_bytes)
    throw data_loss_error("cereal portable binary: " + std::string(what) + " of " +
                          std::to_string(count) + " element(s) declared at offset " +
                          std::to_string(declared_at) + ", but only " +
                          std::to_string(remaining()) + " byte(s) follow");
}

LOOM_COMPILED_ONCE void bounded_input_archive::read_bytes(void* out, std::size_t n) {
  if (n > remaining())
    throw data_loss_error("cereal portable binary: needs " + std::to_string(n) +
                          " more byte(s) at offset " + std::to_string(pos_) + ", only " +
                          std::to_string(remaining()) + " left");
  if (n)
    std::memcpy(out, bytes_.data() + pos_, n);
  pos_ += n;
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

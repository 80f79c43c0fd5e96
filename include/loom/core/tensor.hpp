// Tensors. any_tensor is the runtime value that kernels, the executor and the
// wire see: a dtype, a shape and a shared buffer, 64-byte-aligned host memory
// or, for a node placed on a GPU, device memory that a GPU backend adopted
// (kernels/cuda/backend.hpp). tensor<T, R> is a host value with its element type and
// rank in the type, which is what users feed and fetch. Copies share the
// buffer, as TF's Tensor does; clone() makes a deep copy.
#pragma once

#include <loom/core/block_cache.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/dtype.hpp>
#include <loom/core/error.hpp>
#include <loom/core/shape.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <vector>

namespace loom {

// Where a tensor's elements live: host memory, or the memory of GPU `device`.
struct memory_location {
  enum class kind : std::uint8_t { host, gpu };
  kind where = kind::host;
  int device = 0;

  static memory_location host() noexcept { return {}; }
  static memory_location gpu(int d) noexcept { return {kind::gpu, d}; }
  bool on_host() const noexcept { return where == kind::host; }
  bool operator==(const memory_location&) const = default;
  // "host", "GPU:0": for error messages.
  std::string to_string() const { return on_host() ? "host" : "GPU:" + std::to_string(device); }
};

namespace detail {

// An aligned allocation of n elements of one dtype. Strings are constructed and
// destroyed; arithmetic elements are left uninitialised, because kernels
// overwrite every output element and zeroing would be a wasted pass.
//
// A buffer may instead adopt memory someone else allocated (a GPU backend's
// device memory): `release` gives it back when the last tensor lets go.
class buffer {
public:
  static constexpr std::size_t alignment = 64;
  using release_fn = std::function<void(void*)>;

  buffer(dtype d, std::int64_t n, pages kind = pages::huge_where_large);
  buffer(dtype d, std::int64_t n, void* adopted, memory_location where, release_fn release)
      : dtype_(d), n_(n), bytes_(size_of(d) * static_cast<std::size_t>(n)), data_(adopted),
        where_(where), release_(std::move(release)) {}
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  ~buffer();

  void* data() noexcept { return data_; }
  memory_location location() const noexcept { return where_; }

private:
  std::string* strings() noexcept { return static_cast<std::string*>(data_); }
  dtype dtype_;
  std::int64_t n_;
  pages pages_ = pages::huge_where_large;
  std::size_t bytes_;
  void* data_;
  memory_location where_{};
  release_fn release_;
};

} // namespace detail

class any_tensor {
public:
  any_tensor() = default;
  any_tensor(dtype d, loom::shape s)
      : dtype_(d), shape_(std::move(s)),
        buffer_(std::make_shared<detail::buffer>(d, shape_.num_elements())) {}

  // A tensor for the bytes a peer sends (the message layer's receive buffers): in
  // small pages only, so a peer that declares a large tensor and sends a few bytes of
  // it commits no more memory than it sent (core/block_cache.hpp).
  static any_tensor for_peer_bytes(dtype d, loom::shape s);

  // A tensor over memory at `where` that someone else allocated; `release`
  // frees it when the last copy of the tensor is gone. Strings live on the host only.
  static any_tensor adopt(dtype d, loom::shape s, memory_location where, void* data,
                          detail::buffer::release_fn release);

  template <element_type T> static any_tensor scalar(T v) {
    any_tensor t(dtype_of<T>, loom::shape{});
    *t.data<T>() = std::move(v);
    return t;
  }

  template <element_type T>
  static any_tensor from_vector(const loom::shape& s, const std::vector<T>& values) {
    any_tensor t(dtype_of<T>, s);
    if (static_cast<std::int64_t>(values.size()) != t.num_elements())
      throw invalid_argument_error("tensor of shape " + s.to_string() + " needs " +
                                   std::to_string(t.num_elements()) + " values, got " +
                                   std::to_string(values.size()));
    std::copy(values.begin(), values.end(), t.data<T>());
    return t;
  }

  bool empty() const noexcept { return !buffer_; }
  dtype type() const noexcept { return dtype_; }
  const loom::shape& shape() const noexcept { return shape_; }
  int rank() const noexcept { return shape_.rank(); }
  std::int64_t num_elements() const { return empty() ? 0 : shape_.num_elements(); }
  std::size_t byte_size() const {
    return static_cast<std::size_t>(num_elements()) * size_of(dtype_);
  }

  // Where the elements live; an empty tensor is on the host.
  memory_location location() const noexcept {
    return buffer_ ? buffer_->location() : memory_location::host();
  }
  bool on_host() const noexcept { return location().on_host(); }

  // Host memory: a tensor on a GPU throws here, so that host code that missed
  // a device copy fails with a message instead of reading device memory.
  void* raw_data() {
    check_host();
    return buffer_ ? buffer_->data() : nullptr;
  }
  const void* raw_data() const {
    check_host();
    return buffer_ ? buffer_->data() : nullptr;
  }
  // The elements wherever they live: for GPU kernels and copies.
  void* device_data() noexcept { return buffer_ ? buffer_->data() : nullptr; }
  const void* device_data() const noexcept { return buffer_ ? buffer_->data() : nullptr; }
  template <element_type T> T* device_data() {
    check_type<T>();
    return static_cast<T*>(device_data());
  }
  template <element_type T> const T* device_data() const {
    check_type<T>();
    return static_cast<const T*>(device_data());
  }

  template <element_type T> T* data() {
    check_type<T>();
    return static_cast<T*>(raw_data());
  }
  template <element_type T> const T* data() const {
    check_type<T>();
    return static_cast<const T*>(raw_data());
  }
  template <element_type T> std::span<T> flat() {
    return {data<T>(), static_cast<std::size_t>(num_elements())};
  }
  template <element_type T> std::span<const T> flat() const {
    return {data<T>(), static_cast<std::size_t>(num_elements())};
  }

  // The same buffer under another shape with the same element count.
  any_tensor reshaped(loom::shape s) const;

  any_tensor clone() const;

  // True when no other tensor, variable or constant holds this buffer, so the
  // caller may write it. use_count() is a relaxed load: alone it would not
  // order the caller's writes after the reads of holders that just let go
  // (their decrement is a release). The acquire fence does, in the C++ memory
  // model. ThreadSanitizer does not model fences, so the copy's increment of
  // the same count (acq_rel in libstdc++) shows it the same order.
  bool sole_owner() const noexcept;

  bool shares_buffer_with(const any_tensor& o) const noexcept {
    return buffer_ && buffer_ == o.buffer_;
  }

  // "float32[100, 784]" ("float32[100, 784] on GPU:0" off the host), for error messages.
  std::string describe() const;

private:
  void check_host() const {
    if (buffer_ && !buffer_->location().on_host())
      throw internal_error("a tensor " + describe() +
                           " was read as host memory (a device copy is missing)");
  }
  template <element_type T> void check_type() const {
    if (dtype_of<T> != dtype_)
      throw invalid_argument_error("tensor holds " + std::string(to_string(dtype_)) +
                                   ", accessed as " + std::string(to_string(dtype_of<T>)));
  }
  dtype dtype_ = dtype::f32;
  loom::shape shape_;
  std::shared_ptr<detail::buffer> buffer_;
};

// A host tensor whose element type and rank are part of its type: what a
// session returns for a fetch and accepts for a feed. A rank-0 tensor converts
// to its scalar.
template <element_type T, int R> class tensor {
  static_assert(R >= 0, "loom::tensor: rank must be non-negative");

public:
  using value_type = T;
  static constexpr int rank = R;

  tensor() : value_(dtype_of<T>, zero_shape()) {}
  explicit tensor(const loom::shape& s) : value_(dtype_of<T>, checked(s)) {}
  tensor(const loom::shape& s, const std::vector<T>& values)
      : value_(any_tensor::from_vector<T>(checked(s), values)) {}
  tensor(const loom::shape& s, T fill) : value_(dtype_of<T>, checked(s)) {
    std::fill_n(data(), size(), fill);
  }
  // A scalar from its value: tensor<float, 0> t = 3.f;
  tensor(T v) requires(R == 0) : value_(any_tensor::scalar<T>(std::move(v))) {}
  // Never converts between element types or ranks; this constructor exists only
  // to say so in words (e.g. for `tensor<double, 2> t = sess.run(float_node);`).
  template <element_type U, int R2>
  requires(!std::is_same_v<U, T> || R2 != R) tensor(const tensor<U, R2>&) {
    static_assert(std::is_same_v<U, T> && R2 == R,
                  "loom::tensor: a tensor of another dtype or rank does not convert; a fetch "
                  "returns the fetched node's dtype and rank (use loom::cast<T>() in the graph)");
  }

  // Adopts a runtime value, checking its dtype and rank; `what` names it in the error.
  static tensor from(any_tensor v, const std::string& what = "tensor") {
    if (v.type() != dtype_of<T> || v.rank() != R)
      throw invalid_argument_error(what + " is " + v.describe() + ", expected " +
                                   std::string(to_string(dtype_of<T>)) + " of rank " +
                                   std::to_string(R));
    tensor t;
    t.value_ = std::move(v);
    return t;
  }

  const loom::shape& shape() const noexcept { return value_.shape(); }
  std::int64_t dim(int i) const { return value_.shape()[i]; }
  std::int64_t size() const { return value_.num_elements(); }
  T* data() { return value_.template data<T>(); }
  const T* data() const { return value_.template data<T>(); }
  std::span<T> flat() { return value_.template flat<T>(); }
  std::span<const T> flat() const { return value_.template flat<T>(); }

  template <class... I>
  requires(sizeof...(I) == R && (std::is_integral_v<I> && ...)) T& operator()(I... idx) {
    return data()[offset(static_cast<std::int64_t>(idx)...)];
  }
  template <class... I>
  requires(sizeof...(I) == R && (std::is_integral_v<I> && ...)) const T&
  operator()(I... idx) const {
    return data()[offset(static_cast<std::int64_t>(idx)...)];
  }

  operator T() const requires(R == 0) { return *data(); }
  T item() const requires(R == 0) { return *data(); }

  const any_tensor& value() const& noexcept { return value_; }
  any_tensor&& value() && noexcept { return std::move(value_); }
  tensor clone() const { return from(value_.clone()); }

private:
  static loom::shape zero_shape() {
    return loom::shape(std::vector<std::int64_t>(static_cast<std::size_t>(R), 0));
  }
  static const loom::shape& checked(const loom::shape& s) {
    if (s.rank() != R)
      throw invalid_argument_error("tensor<" + std::string(to_string(dtype_of<T>)) + ", " +
                                   std::to_string(R) + "> cannot have shape " + s.to_string());
    return s;
  }
  template <class... I> std::int64_t offset(I... idx) const {
    const std::array<std::int64_t, sizeof...(I)> ix{idx...};
    std::int64_t off = 0;
    for (int i = 0; i < R; ++i) {
      const auto d = shape()[i];
      if (ix[static_cast<std::size_t>(i)] < 0 || ix[static_cast<std::size_t>(i)] >= d)
        throw out_of_range_error("index " + std::to_string(ix[static_cast<std::size_t>(i)]) +
                                 " out of range for dimension " + std::to_string(i) + " of shape " +
                                 shape().to_string());
      off = off * d + ix[static_cast<std::size_t>(i)];
    }
    return off;
  }

  any_tensor value_;
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE buffer::buffer(dtype d, std::int64_t n, pages kind)
    : dtype_(d), n_(n), pages_(kind) {
  bytes_ = std::max<std::size_t>(size_of(d) * static_cast<std::size_t>(n), 1);
  data_ = block_cache::instance().allocate(bytes_, pages_);
  if (d == dtype::string)
    std::uninitialized_default_construct_n(strings(), n);
}

LOOM_COMPILED_ONCE buffer::~buffer() {
  if (release_) {
    release_(data_);
    return;
  }
  if (dtype_ == dtype::string)
    std::destroy_n(strings(), n_);
  block_cache::instance().release(data_, bytes_, pages_);
}
} // namespace loom::detail

namespace loom {

LOOM_COMPILED_ONCE auto any_tensor::for_peer_bytes(dtype d, loom::shape s) -> any_tensor {
  any_tensor t;
  t.dtype_ = d;
  t.shape_ = std::move(s);
  t.buffer_ = std::make_shared<detail::buffer>(d, t.shape_.num_elements(), detail::pages::small);
  return t;
}

LOOM_COMPILED_ONCE auto any_tensor::adopt(dtype d, loom::shape s, memory_location where, void* data,
                                          detail::buffer::release_fn release) -> any_tensor {
  if (d == dtype::string && !where.on_host())
    throw invalid_argument_error("a string tensor cannot live on " + where.to_string());
  any_tensor t;
  t.dtype_ = d;
  t.shape_ = std::move(s);
  t.buffer_ =
      std::make_shared<detail::buffer>(d, t.shape_.num_elements(), data, where, std::move(release));
  return t;
}

LOOM_COMPILED_ONCE auto any_tensor::reshaped(loom::shape s) const -> any_tensor {
  if (s.num_elements() != num_elements())
    throw invalid_argument_error("cannot reshape a tensor of shape " + shape_.to_string() + " (" +
                                 std::to_string(num_elements()) + " elements) to " + s.to_string());
  any_tensor t = *this;
  t.shape_ = std::move(s);
  return t;
}

LOOM_COMPILED_ONCE auto any_tensor::clone() const -> any_tensor {
  if (empty())
    return {};
  any_tensor t(dtype_, shape_);
  if (dtype_ == dtype::string)
    std::copy_n(data<std::string>(), num_elements(), t.data<std::string>());
  else
    std::memcpy(t.raw_data(), raw_data(), byte_size());
  return t;
}

LOOM_COMPILED_ONCE bool any_tensor::sole_owner() const noexcept {
  if (buffer_.use_count() != 1)
    return false;
  std::atomic_thread_fence(std::memory_order_acquire);
  [[maybe_unused]] const std::shared_ptr<detail::buffer> ordered = buffer_;
  return true;
}

LOOM_COMPILED_ONCE std::string any_tensor::describe() const {
  std::string d = std::string(to_string(dtype_)) + shape_.to_string();
  return on_host() ? d : d + " on " + location().to_string();
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

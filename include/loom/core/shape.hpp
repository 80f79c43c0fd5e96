// Tensor shapes. A dimension of -1 is unknown until run time (TF's None), as in
// a placeholder's batch dimension; a shape with an unknown dimension is partial.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace loom {

class shape {
public:
  static constexpr std::int64_t unknown = -1;

  shape() = default; // rank 0: a scalar
  shape(std::initializer_list<std::int64_t> dims) : dims_(dims) { validate(); }
  explicit shape(std::vector<std::int64_t> dims) : dims_(std::move(dims)) { validate(); }

  int rank() const noexcept { return static_cast<int>(dims_.size()); }
  std::int64_t operator[](int i) const { return dims_.at(static_cast<std::size_t>(i)); }
  std::int64_t dim(int i) const { return dims_.at(static_cast<std::size_t>(i)); }
  const std::vector<std::int64_t>& dims() const noexcept { return dims_; }

  bool fully_defined() const noexcept {
    for (auto d : dims_)
      if (d < 0)
        return false;
    return true;
  }

  // Number of elements; 1 for a scalar. Throws on a partial shape.
  std::int64_t num_elements() const;

  // True if some fully defined shape matches both (unknown dims match anything).
  bool compatible_with(const shape& o) const noexcept;

  std::string to_string() const;

  friend bool operator==(const shape&, const shape&) = default;

  template <class Archive> void serialize(Archive& ar) { ar(dims_); }

private:
  void validate() const {
    for (auto d : dims_)
      if (d < unknown)
        throw invalid_argument_error("shape dimension " + std::to_string(d) +
                                     " is negative (use -1 for unknown)");
  }
  std::vector<std::int64_t> dims_;
};

// NumPy/TF broadcasting of two (possibly partial) shapes. Throws naming both
// shapes when they are incompatible; `what` says where (the node's name).
LOOM_COMPILED_ONCE shape broadcast_shapes(const shape& a, const shape& b, const std::string& what);

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE std::int64_t shape::num_elements() const {
  std::int64_t n = 1;
  for (auto d : dims_) {
    if (d < 0)
      throw invalid_argument_error("num_elements of partial shape " + to_string());
    n *= d;
  }
  return n;
}

LOOM_COMPILED_ONCE bool shape::compatible_with(const shape& o) const noexcept {
  if (rank() != o.rank())
    return false;
  for (std::size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i] >= 0 && o.dims_[i] >= 0 && dims_[i] != o.dims_[i])
      return false;
  return true;
}

LOOM_COMPILED_ONCE std::string shape::to_string() const {
  std::string s = "[";
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    if (i)
      s += ", ";
    s += dims_[i] < 0 ? std::string("?") : std::to_string(dims_[i]);
  }
  return s + "]";
}

LOOM_COMPILED_ONCE shape broadcast_shapes(const shape& a, const shape& b, const std::string& what) {
  const int r = a.rank() > b.rank() ? a.rank() : b.rank();
  std::vector<std::int64_t> out(static_cast<std::size_t>(r));
  for (int i = 0; i < r; ++i) {
    const int ia = a.rank() - r + i, ib = b.rank() - r + i;
    const std::int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    std::int64_t d;
    if (da == 1)
      d = db;
    else if (db == 1)
      d = da;
    else if (da == shape::unknown)
      d = db;
    else if (db == shape::unknown || da == db)
      d = da;
    else
      throw invalid_argument_error(what + ": shapes " + a.to_string() + " and " + b.to_string() +
                                   " cannot be broadcast together (dimension " + std::to_string(i) +
                                   ": " + std::to_string(da) + " vs " + std::to_string(db) + ")");
    out[static_cast<std::size_t>(i)] = d;
  }
  return shape(std::move(out));
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

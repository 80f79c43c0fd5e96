// A box of a tensor: per dimension a start and a length, or the whole dimension (TF's
// TensorSlice). A partitioned variable's parts are slices of its full shape, and TF's
// checkpoints record them as such (core/tensor_bundle.hpp). Their text is TF's:
// "0,4:-" is rows [0, 4) and every column; a save_slice_info spec "10 4 0,4:0,4" is the
// full shape followed by the slice.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/dtype.hpp>
#include <loom/core/error.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/tensor.hpp>

#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

class tensor_slice {
public:
  // A dimension's length when the slice takes all of it (TF's kFullExtent).
  static constexpr std::int64_t whole = -1;

  tensor_slice() = default;
  // Every dimension whole.
  static tensor_slice full(int rank);
  // [start, start + length) per dimension; a length of `whole` takes it all (start 0).
  tensor_slice(std::vector<std::int64_t> starts, std::vector<std::int64_t> lengths);

  // TF's text: dimensions separated by ':', each "start,length" or "-" (whole).
  static tensor_slice parse(std::string_view text);

  // A save_slice_info spec, "10 4 0,4:0,4": the full shape, then the slice.
  static std::pair<loom::shape, tensor_slice> parse_spec(std::string_view spec);

  int rank() const noexcept { return static_cast<int>(starts_.size()); }
  bool whole_at(int d) const { return at(lengths_, d) == whole; }
  bool is_full() const noexcept {
    for (int d = 0; d < rank(); ++d)
      if (!whole_at(d))
        return false;
    return true;
  }
  std::int64_t start(int d) const { return at(starts_, d); }
  // The length, `whole` for a whole dimension.
  std::int64_t length(int d) const { return at(lengths_, d); }
  // Where the slice begins and ends in dimension d (of a tensor of shape `full`).
  std::int64_t begin(int d) const { return whole_at(d) ? 0 : start(d); }
  std::int64_t end_in(const loom::shape& full, int d) const {
    return whole_at(d) ? full[d] : start(d) + length(d);
  }

  // The shape of this slice of a tensor of shape `full`; throws where it does not fit.
  loom::shape shape_in(const loom::shape& full) const;
  // True when the slice is all of a tensor of shape `full`.
  bool covers(const loom::shape& full) const { return shape_in(full) == full; }

  // The part both slices hold of a tensor of shape `full`; nullopt when they do not meet.
  std::optional<tensor_slice> intersect(const tensor_slice& o, const loom::shape& full) const;

  // TF's DebugString: "0,4:-".
  std::string to_string() const;

  friend bool operator==(const tensor_slice&, const tensor_slice&) = default;

private:
  static std::optional<std::int64_t> number(std::string_view s);
  static std::int64_t at(const std::vector<std::int64_t>& v, int d) {
    return v.at(static_cast<std::size_t>(d));
  }

  std::vector<std::int64_t> starts_;
  std::vector<std::int64_t> lengths_;
};

// Copies the elements that slices `from_slice` and `to_slice` of a tensor of shape
// `full` have in common from `from` (holding from_slice) into `to` (holding
// to_slice); returns how many. Both tensors are host tensors of one dtype.
namespace detail {
LOOM_COMPILED_ONCE std::int64_t copy_common_elements(const any_tensor& from,
                                                     const tensor_slice& from_slice, any_tensor& to,
                                                     const tensor_slice& to_slice,
                                                     const loom::shape& full);
} // namespace detail

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE auto tensor_slice::full(int rank) -> tensor_slice {
  tensor_slice s;
  s.starts_.assign(static_cast<std::size_t>(rank), 0);
  s.lengths_.assign(static_cast<std::size_t>(rank), whole);
  return s;
}

LOOM_COMPILED_ONCE tensor_slice::tensor_slice(std::vector<std::int64_t> starts,
                                              std::vector<std::int64_t> lengths)
    : starts_(std::move(starts)), lengths_(std::move(lengths)) {
  if (starts_.size() != lengths_.size())
    throw invalid_argument_error("tensor_slice: " + std::to_string(starts_.size()) +
                                 " starts but " + std::to_string(lengths_.size()) + " lengths");
  for (std::size_t d = 0; d < starts_.size(); ++d)
    if (!(starts_[d] == 0 && lengths_[d] == whole) &&
        (starts_[d] < 0 || lengths_[d] <= 0 ||
         lengths_[d] > std::numeric_limits<std::int64_t>::max() - starts_[d]))
      throw invalid_argument_error("tensor_slice: dimension " + std::to_string(d) + " has start " +
                                   std::to_string(starts_[d]) + " and length " +
                                   std::to_string(lengths_[d]) +
                                   " (a start >= 0 and a length > 0, or the whole dimension)");
}

LOOM_COMPILED_ONCE auto tensor_slice::parse(std::string_view text) -> tensor_slice {
  std::vector<std::int64_t> starts, lengths;
  auto bad = [&](const std::string& why) {
    return invalid_argument_error("tensor slice '" + std::string(text) + "': " + why);
  };
  while (!text.empty()) {
    const std::size_t colon = text.find(':');
    const std::string_view dim = text.substr(0, colon);
    text = colon == std::string_view::npos ? std::string_view{} : text.substr(colon + 1);
    if (dim.empty())
      continue; // TF skips empty items
    if (dim == "-") {
      starts.push_back(0);
      lengths.push_back(whole);
      continue;
    }
    const std::size_t comma = dim.find(',');
    const auto start =
        comma == std::string_view::npos ? std::nullopt : number(dim.substr(0, comma));
    const auto length =
        comma == std::string_view::npos ? std::nullopt : number(dim.substr(comma + 1));
    if (!start || !length)
      throw bad("'" + std::string(dim) + "' is not 'start,length' or '-'");
    if (*start < 0 || *length <= 0)
      throw bad("'" + std::string(dim) + "' needs a start >= 0 and a length > 0");
    starts.push_back(*start);
    lengths.push_back(*length);
  }
  return tensor_slice(std::move(starts), std::move(lengths));
}

LOOM_COMPILED_ONCE auto tensor_slice::parse_spec(std::string_view spec)
    -> std::pair<loom::shape, tensor_slice> {
  std::vector<std::int64_t> dims;
  std::size_t space;
  while ((space = spec.find(' ')) != std::string_view::npos) {
    const auto d = number(spec.substr(0, space));
    if (!d || *d < 0)
      throw invalid_argument_error("slice spec '" + std::string(spec) + "': '" +
                                   std::string(spec.substr(0, space)) + "' is not a dimension");
    dims.push_back(*d);
    spec.remove_prefix(space + 1);
  }
  loom::shape full(std::move(dims));
  tensor_slice slice = parse(spec);
  slice.shape_in(full); // checks that the slice fits
  return {std::move(full), std::move(slice)};
}

LOOM_COMPILED_ONCE auto tensor_slice::shape_in(const loom::shape& full) const -> loom::shape {
  if (full.rank() != rank())
    throw invalid_argument_error("slice " + to_string() + " has rank " + std::to_string(rank()) +
                                 ", the shape " + full.to_string() + " has rank " +
                                 std::to_string(full.rank()));
  std::vector<std::int64_t> dims;
  for (int d = 0; d < rank(); ++d) {
    if (!whole_at(d) && end_in(full, d) > full[d])
      throw invalid_argument_error("slice " + to_string() + " runs past dimension " +
                                   std::to_string(d) + " of shape " + full.to_string());
    dims.push_back(end_in(full, d) - begin(d));
  }
  return loom::shape(std::move(dims));
}

LOOM_COMPILED_ONCE auto tensor_slice::intersect(const tensor_slice& o,
                                                const loom::shape& full) const
    -> std::optional<tensor_slice> {
  std::vector<std::int64_t> starts, lengths;
  for (int d = 0; d < rank(); ++d) {
    const std::int64_t b = std::max(begin(d), o.begin(d));
    const std::int64_t e = std::min(end_in(full, d), o.end_in(full, d));
    if (e <= b)
      return std::nullopt;
    starts.push_back(b);
    lengths.push_back(e - b);
  }
  return tensor_slice(std::move(starts), std::move(lengths));
}

LOOM_COMPILED_ONCE std::string tensor_slice::to_string() const {
  std::string s;
  for (int d = 0; d < rank(); ++d) {
    if (d)
      s += ':';
    s +=
        whole_at(d) ? std::string("-") : std::to_string(start(d)) + "," + std::to_string(length(d));
  }
  return s;
}

LOOM_COMPILED_ONCE auto tensor_slice::number(std::string_view s) -> std::optional<std::int64_t> {
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty())
    return std::nullopt;
  return v;
}
} // namespace loom

namespace loom::detail {

LOOM_COMPILED_ONCE std::int64_t copy_common_elements(const any_tensor& from,
                                                     const tensor_slice& from_slice, any_tensor& to,
                                                     const tensor_slice& to_slice,
                                                     const loom::shape& full) {
  if (from.type() != to.type())
    throw invalid_argument_error("copy between slices of " + from.describe() + " and " +
                                 to.describe());
  const std::optional<tensor_slice> common = from_slice.intersect(to_slice, full);
  if (!common)
    return 0;
  const loom::shape box = common->shape_in(full);
  const int rank = full.rank();
  if (box.num_elements() == 0)
    return 0;
  // Row-major strides of both tensors, and where the common box begins in each.
  auto strides_of = [rank](const loom::shape& s) {
    std::vector<std::int64_t> st(static_cast<std::size_t>(rank), 1);
    for (int d = rank - 2; d >= 0; --d)
      st[static_cast<std::size_t>(d)] = st[static_cast<std::size_t>(d) + 1] * s[d + 1];
    return st;
  };
  const auto from_strides = strides_of(from.shape());
  const auto to_strides = strides_of(to.shape());
  const std::int64_t run = rank == 0 ? 1 : box[rank - 1]; // contiguous in both
  std::vector<std::int64_t> index(static_cast<std::size_t>(rank), 0);
  visit_dtype(from.type(), [&]<class T>() {
    const T* src = from.data<T>();
    T* dst = to.data<T>();
    while (true) {
      std::int64_t src_at = 0, dst_at = 0;
      for (int d = 0; d < rank; ++d) {
        const std::int64_t g = common->begin(d) + index[static_cast<std::size_t>(d)];
        src_at += (g - from_slice.begin(d)) * from_strides[static_cast<std::size_t>(d)];
        dst_at += (g - to_slice.begin(d)) * to_strides[static_cast<std::size_t>(d)];
      }
      std::copy_n(src + src_at, run, dst + dst_at);
      int d = rank - 2; // the odometer over every dimension but the last
      while (d >= 0 && ++index[static_cast<std::size_t>(d)] == box[d])
        index[static_cast<std::size_t>(d--)] = 0;
      if (d < 0)
        break;
    }
  });
  return box.num_elements();
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// The records of TensorBoard's event files, encoded with the field numbers of
// TensorFlow's protos (core/util/event.proto, core/framework/summary.proto):
//
//   Event          { double wall_time = 1; int64 step = 2;
//                    oneof { string file_version = 3; Summary summary = 5;
//                            SessionLog session_log = 7; } }
//   SessionLog     { SessionStatus status = 1; }             START = 1
//   Summary        { repeated Value value = 1; }
//   Summary.Value  { string tag = 1; float simple_value = 2; HistogramProto histo = 5; }
//   HistogramProto { double min = 1; max = 2; num = 3; sum = 4; sum_squares = 5;
//                    repeated double bucket_limit = 6 [packed]; repeated double bucket = 7
//                    [packed]; }
//
// A serialized Summary is a sequence of field-1 Values, so the concatenation of
// two is their merge (protobuf's rule for repeated fields): merge_summary and
// an event's summary need no decoding. Here in core/ so that the summary
// kernels (kernels/cpu/summary.hpp) and the writer (train/summary_writer.hpp)
// share one encoding.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/protobuf_wire.hpp>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::detail::summary_format {

// Field numbers (the protos above).
namespace event_field {
inline constexpr std::uint32_t wall_time = 1, step = 2, file_version = 3, summary = 5,
                               session_log = 7;
}
namespace value_field {
inline constexpr std::uint32_t tag = 1, simple_value = 2, histo = 5;
}
namespace histogram_field {
inline constexpr std::uint32_t min = 1, max = 2, num = 3, sum = 4, sum_squares = 5,
                               bucket_limit = 6, bucket = 7;
}
inline constexpr std::uint32_t summary_value_field = 1;
inline constexpr std::uint32_t session_log_status_field = 1;
inline constexpr std::uint64_t session_log_start = 1;

// What the first record of every event file says (TF's EventsWriter).
inline constexpr std::string_view file_version = "brain.Event:2";

// TF's histogram (core/lib/histogram/histogram.cc) with its default buckets:
// limits growing by 10% from 1e-12 to 1e20, mirrored below 0, with 0 and
// +-DBL_MAX; a value v counts in the first bucket whose limit is above v. The
// same limits as TF's, so TensorBoard draws a loom histogram as TF's.
class histogram {
public:
  histogram() : counts_(limits().size(), 0.0) {}

  static const std::vector<double>& limits();

  // A finite value (the caller refuses NaN and infinities, as TF's kernel does).
  void add(double v);

  double count() const noexcept { return num_; }

  // A HistogramProto, runs of empty buckets collapsed into their last limit
  // (TF's EncodeToProto with preserve_zero_buckets = false).
  protobuf::writer encode() const;

private:
  // The first limit above v (std::upper_bound's answer), found from a guess:
  // the limits grow by 1.1 from 1e-12, so k = (log2 |v| - log2 1e-12) /
  // log2 1.1 counts the positive limits up to |v|. log2 |v| is read from the
  // double's exponent and mantissa, a linear guess within the octave that is
  // low by under a bucket, so the answer is among three limits from the
  // guess: three comparisons without branches find it (a binary search over
  // the 1 549 limits, its branches mispredicted, took ~30 ns a value, most of
  // a histogram summary of a model's weights). The loops after them keep the
  // answer exact should the guess ever be further off.
  static std::size_t bucket(double v);

  std::vector<double> counts_;
  double min_ = DBL_MAX, max_ = -DBL_MAX, num_ = 0, sum_ = 0, sum_squares_ = 0;
};

// A Summary of one scalar value (tf.summary.scalar's), serialized.
LOOM_COMPILED_ONCE std::string scalar_summary(std::string_view tag, float value);

// A Summary of one histogram (tf.summary.histogram's), serialized.
LOOM_COMPILED_ONCE std::string histogram_summary(std::string_view tag, const histogram& h);

// The tags of a serialized Summary's values, in order; `what` names it in
// errors (data_loss_error where it is not a Summary).
LOOM_COMPILED_ONCE std::vector<std::string> summary_tags(std::string_view summary,
                                                         const std::string& what);

// Events, serialized (the data of one TFRecord each).
LOOM_COMPILED_ONCE std::string file_version_event(double wall_time);

LOOM_COMPILED_ONCE std::string summary_event(double wall_time, std::int64_t step,
                                             std::string_view serialized_summary);

// SessionLog START: TensorBoard drops the events of a run's earlier life past
// this step (a job restarted from a checkpoint), as after TF's SummarySaverHook.
LOOM_COMPILED_ONCE std::string session_start_event(double wall_time, std::int64_t step);

} // namespace loom::detail::summary_format

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail::summary_format {

LOOM_COMPILED_ONCE auto histogram::limits() -> const std::vector<double>& {
  static const std::vector<double> l = [] {
    std::vector<double> pos;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1)
      pos.push_back(v);
    pos.push_back(DBL_MAX);
    std::vector<double> all;
    for (auto it = pos.rbegin(); it != pos.rend(); ++it)
      all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), pos.begin(), pos.end());
    return all;
  }();
  return l;
}

LOOM_COMPILED_ONCE void histogram::add(double v) {
  counts_[std::min(bucket(v), counts_.size() - 1)] += 1.0;
  min_ = std::min(min_, v);
  max_ = std::max(max_, v);
  num_ += 1.0;
  sum_ += v;
  sum_squares_ += v * v;
}

LOOM_COMPILED_ONCE auto histogram::encode() const -> protobuf::writer {
  std::vector<double> limit, count;
  const auto& l = limits();
  for (std::size_t i = 0; i < counts_.size();) {
    double end = l[i], c = counts_[i];
    ++i;
    if (c <= 0.0)
      while (i < counts_.size() && counts_[i] <= 0.0) {
        end = l[i];
        c = counts_[i];
        ++i;
      }
    limit.push_back(end);
    count.push_back(c);
  }
  protobuf::writer h;
  h.float64(histogram_field::min, min_)
      .float64(histogram_field::max, max_)
      .float64(histogram_field::num, num_)
      .float64(histogram_field::sum, sum_)
      .float64(histogram_field::sum_squares, sum_squares_)
      .packed_float64(histogram_field::bucket_limit, limit)
      .packed_float64(histogram_field::bucket, count);
  return h;
}

LOOM_COMPILED_ONCE std::size_t histogram::bucket(double v) {
  const auto& l = limits();
  const std::size_t size = l.size(), zero = size / 2; // l[zero] == 0: mirrored around it
  const auto bits = std::bit_cast<std::uint64_t>(std::abs(v));
  const double log2_abs = static_cast<double>(static_cast<int>(bits >> 52) - 1023) +
                          static_cast<double>(bits & ((std::uint64_t{1} << 52) - 1)) * 0x1p-52;
  constexpr double log2_first = -39.863137138648348; // log2(1e-12)
  constexpr double per_log2 = 7.2725408973417128;    // 1 / log2(1.1)
  const auto k = static_cast<std::ptrdiff_t>(
      std::clamp((log2_abs - log2_first) * per_log2, 0.0, double(zero)));
  // Positive v: the answer is zero + 1 + (limits up to v) - 0..2 below; negative:
  // zero - (limits below |v|), mirrored. 0 and subnormals: k is 0.
  const std::ptrdiff_t first = v > 0 ? std::ptrdiff_t(zero) + k : std::ptrdiff_t(zero) - 2 - k;
  std::size_t b = static_cast<std::size_t>(
      std::clamp(first, std::ptrdiff_t{0}, static_cast<std::ptrdiff_t>(size) - 3));
  b += static_cast<std::size_t>(l[b] <= v) + static_cast<std::size_t>(l[b + 1] <= v) +
       static_cast<std::size_t>(l[b + 2] <= v);
  while (b < size && l[b] <= v)
    ++b;
  while (b > 0 && l[b - 1] > v)
    --b;
  return b;
}

LOOM_COMPILED_ONCE std::string scalar_summary(std::string_view tag, float value) {
  protobuf::writer v;
  v.bytes(value_field::tag, tag).float32(value_field::simple_value, value);
  return std::move(protobuf::writer{}.message(summary_value_field, v)).bytes();
}

LOOM_COMPILED_ONCE std::string histogram_summary(std::string_view tag, const histogram& h) {
  protobuf::writer v;
  v.bytes(value_field::tag, tag).message(value_field::histo, h.encode());
  return std::move(protobuf::writer{}.message(summary_value_field, v)).bytes();
}

LOOM_COMPILED_ONCE std::vector<std::string> summary_tags(std::string_view summary,
                                                         const std::string& what) {
  std::vector<std::string> tags;
  protobuf::reader r(summary, what);
  const std::string value_name = what + " value";
  while (!r.done()) {
    const protobuf::field f = r.next();
    if (f.number != summary_value_field || f.type != protobuf::wire_type::length_delimited)
      throw data_loss_error("malformed " + what + ": field " + std::to_string(f.number) +
                            " is not a Summary's value");
    protobuf::reader value(f.bytes, value_name);
    std::string tag;
    while (!value.done()) {
      const protobuf::field g = value.next();
      if (g.number == value_field::tag && g.type == protobuf::wire_type::length_delimited)
        tag = std::string(g.bytes);
    }
    tags.push_back(std::move(tag));
  }
  return tags;
}

LOOM_COMPILED_ONCE std::string file_version_event(double wall_time) {
  protobuf::writer e;
  e.float64(event_field::wall_time, wall_time)
      .bytes(event_field::file_version, summary_format::file_version);
  return std::move(e).bytes();
}

LOOM_COMPILED_ONCE std::string summary_event(double wall_time, std::int64_t step,
                                             std::string_view serialized_summary) {
  protobuf::writer e;
  e.float64(event_field::wall_time, wall_time)
      .int64(event_field::step, step)
      .bytes(event_field::summary, serialized_summary);
  return std::move(e).bytes();
}

LOOM_COMPILED_ONCE std::string session_start_event(double wall_time, std::int64_t step) {
  protobuf::writer log;
  log.varint(session_log_status_field, session_log_start);
  protobuf::writer e;
  e.float64(event_field::wall_time, wall_time)
      .int64(event_field::step, step)
      .message(event_field::session_log, log);
  return std::move(e).bytes();
}

} // namespace loom::detail::summary_format

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

// Writes TensorBoard event files (TF's tf.summary.FileWriter and its
// EventsWriter): `events.out.tfevents.<seconds>.<hostname>` in a log
// directory, a TFRecord file (core/tfrecord.hpp) of Event protos
// (core/summary_format.hpp) whose first says "brain.Event:2". Events are
// buffered and flushed (and fsynced, as TF's Flush) every flush_secs by a
// background thread, by flush(), and by close() or the destructor.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/summary_format.hpp>
#include <loom/core/tensor.hpp>
#include <loom/core/tfrecord.hpp>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>

#include <unistd.h>

namespace loom {

struct summary_writer_options {
  // Between background flushes of what was added (TF's FileWriter: 120 s);
  // 0: only flush(), close() and the destructor flush.
  double flush_secs = 120;
  // Appended to the file's name (TF's filename_suffix).
  std::string filename_suffix{};
};

class summary_writer {
public:
  // Creates `logdir` (and its parents) where missing, and the event file in
  // it; failed_precondition_error naming the directory or file where either
  // cannot be made (an unwritable directory, a path through a file).
  explicit summary_writer(std::string logdir, summary_writer_options o = {});

  summary_writer(const summary_writer&) = delete;
  summary_writer& operator=(const summary_writer&) = delete;
  ~summary_writer() {
    try {
      close();
    } catch (...) { // a destructor cannot report it; close() does
    }
  }

  // The event file's path.
  const std::string& path() const noexcept { return path_; }
  const std::string& logdir() const noexcept { return logdir_; }

  // A serialized Summary (a summary op's value) at a global step
  // (FileWriter.add_summary).
  void add_summary(std::string_view serialized_summary, std::int64_t global_step) {
    write_record(
        detail::summary_format::summary_event(wall_time(), global_step, serialized_summary));
  }
  // A summary op's value as fetched: a string scalar.
  void add_summary(const any_tensor& summary, std::int64_t global_step);
  // A value computed on the host (examples/s), as tf.Summary(value=[...]).
  void add_scalar(std::string_view tag, double value, std::int64_t global_step) {
    add_summary(detail::summary_format::scalar_summary(tag, static_cast<float>(value)),
                global_step);
  }
  // SessionLog START (SummarySaverHook writes it first): TensorBoard then drops
  // events of an earlier life of the run at later steps.
  void add_session_start(std::int64_t global_step) {
    write_record(detail::summary_format::session_start_event(wall_time(), global_step));
  }

  // Writes what was added to the file and fsyncs it.
  void flush() {
    std::lock_guard lock(mu_);
    flush_locked();
  }

  // Flushes and closes the file; later adds fail. Idempotent.
  void close();

private:
  static double wall_time() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  static std::string seconds_field(double now) { // TF's %010lld
    char s[32];
    std::snprintf(s, sizeof s, "%010lld", static_cast<long long>(now));
    return s;
  }
  static std::string hostname() {
    char h[256] = {};
    if (::gethostname(h, sizeof h - 1) != 0 || !h[0])
      return "localhost";
    return h;
  }

  void write_record(const std::string& event);

  void flush_locked();

  void flush_periodically(std::stop_token stop);

  std::string logdir_;
  summary_writer_options o_;
  std::string path_;
  std::mutex mu_;
  std::condition_variable_any wake_;
  std::FILE* file_ = nullptr;
  bool dirty_ = false;
  std::jthread flusher_;
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE summary_writer::summary_writer(std::string logdir, summary_writer_options o)
    : logdir_(std::move(logdir)), o_(std::move(o)) {
  std::error_code ec;
  std::filesystem::create_directories(logdir_, ec);
  if (ec)
    throw failed_precondition_error("summary_writer: cannot create the log directory " + logdir_ +
                                    ": " + ec.message());
  const double now = wall_time();
  const std::string base = (std::filesystem::path(logdir_) /
                            ("events.out.tfevents." + seconds_field(now) + "." + hostname()))
                               .string();
  // Two writers started in the same second on one host would share TF's
  // name: the second takes a numbered one instead of clobbering the first.
  for (int n = 0; !file_; ++n) {
    path_ = base + (n ? "." + std::to_string(n) : std::string()) + o_.filename_suffix;
    file_ = std::fopen(path_.c_str(), "wbx");
    if (!file_ && (errno != EEXIST || n == 100))
      throw failed_precondition_error("summary_writer: cannot create the event file " + path_ +
                                      ": " + std::strerror(errno));
  }
  write_record(detail::summary_format::file_version_event(now));
  flush();
  if (o_.flush_secs > 0)
    flusher_ = std::jthread([this](std::stop_token stop) { flush_periodically(stop); });
}

LOOM_COMPILED_ONCE void summary_writer::add_summary(const any_tensor& summary,
                                                    std::int64_t global_step) {
  if (summary.type() != dtype::string || summary.num_elements() != 1)
    throw invalid_argument_error("summary_writer::add_summary: a summary is a string scalar, "
                                 "not " +
                                 summary.describe());
  add_summary(*summary.data<std::string>(), global_step);
}

LOOM_COMPILED_ONCE void summary_writer::close() {
  if (flusher_.joinable()) {
    flusher_.request_stop();
    wake_.notify_all();
    flusher_.join();
  }
  std::lock_guard lock(mu_);
  if (!file_)
    return;
  flush_locked();
  const int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0)
    throw data_loss_error("summary_writer: closing " + path_ + " failed: " + std::strerror(errno));
}

LOOM_COMPILED_ONCE void summary_writer::write_record(const std::string& event) {
  const std::string record = tfrecord::frame(event);
  std::lock_guard lock(mu_);
  if (!file_)
    throw failed_precondition_error("summary_writer: " + path_ + " is closed");
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size())
    throw data_loss_error("summary_writer: writing " + path_ + " failed: " + std::strerror(errno));
  dirty_ = true;
}

LOOM_COMPILED_ONCE void summary_writer::flush_locked() {
  if (!file_ || !dirty_)
    return;
  if (std::fflush(file_) != 0 || ::fsync(::fileno(file_)) != 0)
    throw data_loss_error("summary_writer: flushing " + path_ + " failed: " + std::strerror(errno));
  dirty_ = false;
}

LOOM_COMPILED_ONCE void summary_writer::flush_periodically(std::stop_token stop) {
  const auto every = std::chrono::duration<double>(o_.flush_secs);
  std::unique_lock lock(mu_);
  while (!stop.stop_requested()) {
    wake_.wait_for(lock, stop, every, [] { return false; });
    if (stop.stop_requested())
      return;
    try {
      flush_locked();
    } catch (const error&) { // reported by the next flush() or close(): dirty_ stays set
    }
  }
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

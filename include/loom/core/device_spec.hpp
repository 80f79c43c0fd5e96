// A (possibly partial) device specification with TensorFlow 1.x DeviceSpec
// semantics, so device strings written for TF ("/job:ps/task:0/cpu:0") mean the
// same thing here: every field is optional, nested device scopes merge with the
// inner scope winning, and to_string() prints TF's canonical form.
//
// Where TF's Python parser silently accepts nonsense (negative or signed
// indices, an empty job name, a key-less part such as ":0", "/job:a/job:b"
// keeping only the last job), loom rejects it instead: a device string is a
// placement decision and a typo should fail loudly, not place work elsewhere.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>

#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace loom {

class device_spec {
public:
  device_spec() = default;

  // Accepts "/job:J/replica:R/task:T/device:TYPE:IDX" with every part optional
  // and in any order, the legacy "/cpu:0" / "/GPU:1" / "/cpu" forms, and "*" as
  // the device index (any index, i.e. unset). The leading slash is optional and
  // empty parts ("//") are skipped, as in TF. Throws invalid_argument_error.
  [[nodiscard]] static device_spec from_string(std::string_view spec);

  // TF's canonical form: "/job:ps/replica:0/task:1/device:CPU:0", unset parts
  // left out, a type without an index printed as "/device:CPU:*". A device index
  // without a device type is not printed, exactly as TF does, because the index
  // alone names no device; it still takes part in merging and equality.
  [[nodiscard]] std::string to_string() const;

  const std::optional<std::string>& job() const noexcept { return job_; }
  std::optional<int> replica() const noexcept { return replica_; }
  std::optional<int> task() const noexcept { return task_; }
  const std::optional<std::string>& device_type() const noexcept { return device_type_; }
  std::optional<int> device_index() const noexcept { return device_index_; }

  // Setters take std::nullopt to unset a field. They validate like the parser so
  // that every spec prints to a string that parses back to the same spec.
  // Lvalue overloads return *this for chaining; rvalue overloads return by value
  // so that `const auto& s = device_spec{}.with_job("ps");` cannot dangle.
  device_spec& with_job(std::optional<std::string_view> job) &;
  device_spec with_job(std::optional<std::string_view> job) && {
    with_job(job);
    return std::move(*this);
  }
  device_spec& with_replica(std::optional<int> replica) &;
  device_spec with_replica(std::optional<int> replica) && {
    with_replica(replica);
    return std::move(*this);
  }
  device_spec& with_task(std::optional<int> task) &;
  device_spec with_task(std::optional<int> task) && {
    with_task(task);
    return std::move(*this);
  }
  // "cpu" and "gpu" become "CPU" and "GPU" (TF's backwards compatibility);
  // other types are kept as given, since TF treats them as opaque names.
  device_spec& with_device_type(std::optional<std::string_view> device_type) &;
  device_spec with_device_type(std::optional<std::string_view> device_type) && {
    with_device_type(device_type);
    return std::move(*this);
  }
  device_spec& with_device_index(std::optional<int> device_index) &;
  device_spec with_device_index(std::optional<int> device_index) && {
    with_device_index(device_index);
    return std::move(*this);
  }

  // TF's merge_from: each field set in `other` overwrites this one's; fields
  // unset in `other` are kept. Fields merge independently, so merging "/cpu"
  // over "/device:GPU:1" yields "/device:CPU:1", as in TF.
  device_spec& merge_from(const device_spec& other) &;
  device_spec merge_from(const device_spec& other) && {
    merge_from(other);
    return std::move(*this);
  }

  // `inner` takes precedence over `outer`, as an inner tf.device scope does.
  [[nodiscard]] static device_spec merged(device_spec outer, const device_spec& inner) {
    outer.merge_from(inner);
    return outer;
  }

  bool empty() const noexcept {
    return !job_ && !replica_ && !task_ && !device_type_ && !device_index_;
  }
  bool is_cpu() const noexcept { return device_type_ == "CPU"; }
  bool is_gpu() const noexcept { return device_type_ == "GPU"; }

  // True when every field set in `filter` equals this spec's field; unset
  // fields in the filter match anything. This is how TF's device_filters
  // ("/job:ps", "/job:worker/task:1") select devices. A field the filter sets
  // but this spec leaves unset does not match: the spec might be anywhere.
  bool matches(const device_spec& filter) const noexcept;

  // Field-wise, unlike TF's comparison of to_string(), so that two specs that
  // merge differently (one carries a bare device index) are not equal.
  friend bool operator==(const device_spec&, const device_spec&) = default;

private:
  std::optional<std::string> job_;
  std::optional<int> replica_;
  std::optional<int> task_;
  std::optional<std::string> device_type_;
  std::optional<int> device_index_;
};

namespace detail::device_spec_impl {

inline std::string quoted(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  out += s;
  out += '"';
  return out;
}

LOOM_COMPILED_ONCE std::vector<std::string_view> split(std::string_view s, char sep);

enum class int_parse { ok, not_an_integer, out_of_range };

// Digits only: a sign, spaces or a suffix would be accepted by Python's int()
// but almost always mean a malformed string.
LOOM_COMPILED_ONCE int_parse parse_index(std::string_view s, int& value);

inline std::string normalize_device_type(std::string_view type) {
  if (type == "cpu")
    return "CPU";
  if (type == "gpu")
    return "GPU";
  return std::string(type);
}

LOOM_COMPILED_ONCE bool ascii_iequals(std::string_view a, std::string_view upper);

inline std::string device_str(const std::optional<std::string>& type,
                              const std::optional<int>& index) {
  return type.value_or("") + ":" + (index ? std::to_string(*index) : std::string("*"));
}

// Separators would make the printed form parse back as something else.
LOOM_COMPILED_ONCE void check_name(std::string_view what, std::string_view name);

inline void check_index(std::string_view what, const std::optional<int>& index) {
  if (index && *index < 0)
    throw invalid_argument_error("device_spec: " + std::string(what) + " " +
                                 std::to_string(*index) + " is negative");
}

} // namespace detail::device_spec_impl

inline device_spec device_spec::from_string(std::string_view spec) {
  namespace impl = detail::device_spec_impl;
  auto fail = [&](const std::string& why) -> void {
    throw invalid_argument_error("device string " + impl::quoted(spec) + ": " + why);
  };

  auto index_of = [&](std::string_view what, std::string_view text, bool star_ok) {
    std::optional<int> out;
    if (star_ok && text == "*")
      return out;
    int value = 0;
    switch (impl::parse_index(text, value)) {
    case impl::int_parse::ok: out = value; break;
    case impl::int_parse::out_of_range:
      fail(std::string(what) + " " + impl::quoted(text) + " is out of range");
      break;
    case impl::int_parse::not_an_integer:
      fail(std::string(what) + " " + impl::quoted(text) + " is not a non-negative integer" +
           (star_ok ? " or \"*\"" : ""));
      break;
    }
    return out;
  };

  // A repeated field is harmless when it agrees, but "/job:a/job:b" is almost
  // certainly a mistake that TF would silently resolve to "b".
  auto set_job = [&](device_spec& s, std::string_view v) {
    if (s.job_ && *s.job_ != v)
      fail("job " + impl::quoted(v) + " conflicts with earlier job " + impl::quoted(*s.job_));
    s.job_ = std::string(v);
  };
  auto set_int = [&](std::optional<int>& field, std::string_view what, int v) {
    if (field && *field != v)
      fail(std::string(what) + " " + std::to_string(v) + " conflicts with earlier " +
           std::string(what) + " " + std::to_string(*field));
    field = v;
  };
  bool have_device = false;
  auto set_device = [&](device_spec& s, std::string type, std::optional<int> index) {
    const std::optional<std::string> t = std::move(type);
    if (have_device && (s.device_type_ != t || s.device_index_ != index))
      fail("device " + impl::quoted(impl::device_str(t, index)) +
           " conflicts with earlier device " +
           impl::quoted(impl::device_str(s.device_type_, s.device_index_)));
    have_device = true;
    s.device_type_ = t;
    s.device_index_ = index;
  };

  auto trailing = [&](std::string_view part, const std::vector<std::string_view>& fields,
                      std::size_t expected) {
    // Everything after the expected fields, with its leading ':'.
    std::size_t used = 0;
    for (std::size_t i = 0; i < expected; ++i)
      used += fields[i].size() + 1;
    fail("part " + impl::quoted(part) + " has unexpected trailing " +
         impl::quoted(part.substr(used - 1)));
  };

  device_spec s;
  for (std::string_view part : impl::split(spec, '/')) {
    if (part.empty())
      continue;
    const auto fields = impl::split(part, ':');
    const std::string_view key = fields[0];
    const std::size_t n = fields.size();

    if (key.empty()) {
      fail("part " + impl::quoted(part) + " has no key");
    } else if (key == "job" || key == "replica" || key == "task") {
      if (n == 1)
        fail("part " + impl::quoted(part) + " has no value; expected \"" + std::string(key) +
             ":VALUE\"");
      if (n > 2)
        trailing(part, fields, 2);
      if (key == "job") {
        if (fields[1].empty())
          fail("job name is empty in part " + impl::quoted(part));
        set_job(s, fields[1]);
      } else {
        const std::string what = std::string(key) + " index";
        set_int(key == "replica" ? s.replica_ : s.task_, key,
                *index_of(what, fields[1], /*star_ok=*/false));
      }
    } else if (impl::ascii_iequals(key, "CPU") || impl::ascii_iequals(key, "GPU")) {
      // Legacy "/cpu:0": TF upper-cases the key whatever its case.
      if (n > 2)
        trailing(part, fields, 2);
      const std::optional<int> index =
          n == 2 ? index_of("device index", fields[1], /*star_ok=*/true) : std::nullopt;
      set_device(s, key.front() == 'c' || key.front() == 'C' ? "CPU" : "GPU", index);
    } else if (key == "device") {
      if (n < 3)
        fail("part " + impl::quoted(part) +
             " is incomplete; expected \"device:TYPE:INDEX\" or \"device:TYPE:*\"");
      if (n > 3)
        trailing(part, fields, 3);
      if (fields[1].empty())
        fail("device type is empty in part " + impl::quoted(part));
      const std::optional<int> index = index_of("device index", fields[2], /*star_ok=*/true);
      set_device(s, impl::normalize_device_type(fields[1]), index);
    } else {
      fail("unknown key " + impl::quoted(key) + " in part " + impl::quoted(part) +
           "; expected job, replica, task, device, cpu or gpu");
    }
  }
  return s;
}

inline std::string device_spec::to_string() const {
  std::string out;
  if (job_)
    out += "/job:" + *job_;
  if (replica_)
    out += "/replica:" + std::to_string(*replica_);
  if (task_)
    out += "/task:" + std::to_string(*task_);
  if (device_type_)
    out += "/device:" + detail::device_spec_impl::device_str(device_type_, device_index_);
  return out;
}

inline device_spec& device_spec::with_job(std::optional<std::string_view> job) & {
  if (job)
    detail::device_spec_impl::check_name("job name", *job);
  job_ = job ? std::optional<std::string>(std::string(*job)) : std::nullopt;
  return *this;
}

inline device_spec& device_spec::with_replica(std::optional<int> replica) & {
  detail::device_spec_impl::check_index("replica index", replica);
  replica_ = replica;
  return *this;
}

inline device_spec& device_spec::with_task(std::optional<int> task) & {
  detail::device_spec_impl::check_index("task index", task);
  task_ = task;
  return *this;
}

inline device_spec& device_spec::with_device_type(std::optional<std::string_view> device_type) & {
  if (device_type)
    detail::device_spec_impl::check_name("device type", *device_type);
  device_type_ = device_type ? std::optional<std::string>(
                                   detail::device_spec_impl::normalize_device_type(*device_type))
                             : std::nullopt;
  return *this;
}

inline device_spec& device_spec::with_device_index(std::optional<int> device_index) & {
  detail::device_spec_impl::check_index("device index", device_index);
  device_index_ = device_index;
  return *this;
}

inline device_spec& device_spec::merge_from(const device_spec& other) & {
  if (other.job_)
    job_ = other.job_;
  if (other.replica_)
    replica_ = other.replica_;
  if (other.task_)
    task_ = other.task_;
  if (other.device_type_)
    device_type_ = other.device_type_;
  if (other.device_index_)
    device_index_ = other.device_index_;
  return *this;
}

inline bool device_spec::matches(const device_spec& filter) const noexcept {
  return (!filter.job_ || filter.job_ == job_) &&
         (!filter.replica_ || filter.replica_ == replica_) &&
         (!filter.task_ || filter.task_ == task_) &&
         (!filter.device_type_ || filter.device_type_ == device_type_) &&
         (!filter.device_index_ || filter.device_index_ == device_index_);
}

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail::device_spec_impl {

LOOM_COMPILED_ONCE std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t pos = s.find(sep, start);
    if (pos == std::string_view::npos) {
      out.push_back(s.substr(start));
      return out;
    }
    out.push_back(s.substr(start, pos - start));
    start = pos + 1;
  }
}

LOOM_COMPILED_ONCE int_parse parse_index(std::string_view s, int& value) {
  if (s.empty())
    return int_parse::not_an_integer;
  for (char c : s)
    if (c < '0' || c > '9')
      return int_parse::not_an_integer;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec == std::errc::result_out_of_range)
    return int_parse::out_of_range;
  if (ec != std::errc() || ptr != s.data() + s.size())
    return int_parse::not_an_integer;
  return int_parse::ok;
}

LOOM_COMPILED_ONCE bool ascii_iequals(std::string_view a, std::string_view upper) {
  if (a.size() != upper.size())
    return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const char c = (a[i] >= 'a' && a[i] <= 'z') ? static_cast<char>(a[i] - 'a' + 'A') : a[i];
    if (c != upper[i])
      return false;
  }
  return true;
}

LOOM_COMPILED_ONCE void check_name(std::string_view what, std::string_view name) {
  if (name.empty())
    throw invalid_argument_error("device_spec: " + std::string(what) + " is empty");
  if (name.find_first_of("/:") != std::string_view::npos)
    throw invalid_argument_error("device_spec: " + std::string(what) + " " + quoted(name) +
                                 " must not contain '/' or ':'");
}

} // namespace loom::detail::device_spec_impl

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

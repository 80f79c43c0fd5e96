// loom::cluster_spec: TF's tf.train.ClusterSpec. A cluster is a set of jobs
// ("ps", "worker", ...); each job is a set of tasks, given densely as a list
// of "host:port" addresses (task i is the i-th) or sparsely as
// {task index: address}. Jobs are kept sorted by name, as TF's ClusterSpec
// sorts them.
//
//   loom::cluster_spec cluster{{"ps", {"127.0.0.1:2221", "127.0.0.1:2222"}},
//                              {"worker", {"127.0.0.1:2223", "127.0.0.1:2224"}}};
//   loom::cluster_spec sparse{{"worker", {{1, "b:2222"}, {3, "d:2222"}}}};
//   auto from_flags = loom::cluster_spec::from_flags("a:1,b:2", "c:3,d:4");
//
// Unlike TF, every address is checked when the spec is built ("host:port",
// port 0..65535, IPv6 hosts in brackets: "[::1]:2222"), and job names must be
// usable in device strings ([A-Za-z][A-Za-z0-9_]*), so a typo fails here with
// the job, task and string named instead of when a server tries to connect.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/device_spec.hpp>
#include <loom/core/error.hpp>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace loom {

// A task address split into host (without IPv6 brackets) and port.
struct host_port {
  std::string host;
  std::uint16_t port = 0;
  friend bool operator==(const host_port&, const host_port&) = default;
};

namespace detail::cluster_impl {

inline std::string in_quotes(std::string_view s) {
  return "\"" + std::string(s) + "\"";
}

// Why `address` is not "host:port", or "" when it is; fills `out`.
LOOM_COMPILED_ONCE std::string check_address(std::string_view address, host_port& out);

LOOM_COMPILED_ONCE bool valid_job_name(std::string_view name);

LOOM_COMPILED_ONCE std::string trim(std::string_view s);

} // namespace detail::cluster_impl

// "host:port" (or "[v6]:port") split; throws invalid_argument_error saying why not.
LOOM_COMPILED_ONCE host_port parse_host_port(std::string_view address);

class cluster_spec {
public:
  // One job's tasks, dense or sparse; what the initializer lists build.
  struct job_def {
    std::map<int, std::string> tasks;

    job_def(std::initializer_list<std::string> addresses)
        : job_def(std::vector<std::string>(addresses)) {}
    job_def(std::initializer_list<std::pair<int, std::string>> sparse) {
      for (const auto& [index, address] : sparse)
        add(index, address);
    }
    job_def(const std::vector<std::string>& addresses);
    job_def(const std::map<int, std::string>& sparse) {
      for (const auto& [index, address] : sparse)
        add(index, address);
    }

  private:
    void add(int index, const std::string& address) {
      if (!tasks.emplace(index, address).second)
        throw invalid_argument_error("cluster_spec: task " + std::to_string(index) +
                                     " is given twice");
    }
  };

  // A job as TF's ClusterSpec.as_dict() gives it: a list when its task
  // indices are 0..n-1, else {index: address}.
  using job_value = std::variant<std::vector<std::string>, std::map<int, std::string>>;

  cluster_spec() = default;
  cluster_spec(std::initializer_list<std::pair<const std::string, job_def>> jobs) {
    for (const auto& [name, def] : jobs)
      add_job(name, def);
  }
  explicit cluster_spec(const std::map<std::string, std::vector<std::string>>& dense_jobs) {
    for (const auto& [name, addresses] : dense_jobs)
      add_job(name, addresses);
  }

  // The seeds' flags: --ps_hosts=a:1,b:2 --worker_hosts=c:3 (comma-separated,
  // spaces around entries ignored). An empty flag leaves its job out.
  static cluster_spec from_flags(std::string_view ps_hosts, std::string_view worker_hosts);

  // Adds a job; throws invalid_argument_error for a bad or repeated job name,
  // a negative task index or a malformed address, naming the job and task.
  cluster_spec& add_job(const std::string& name, const job_def& def);

  // Job names, sorted (as TF's ClusterSpec.jobs).
  std::vector<std::string> jobs() const {
    std::vector<std::string> out;
    for (const auto& [name, tasks] : jobs_)
      out.push_back(name);
    return out;
  }
  bool has_job(std::string_view job) const { return jobs_.find(job) != jobs_.end(); }
  bool empty() const noexcept { return jobs_.empty(); }

  int num_tasks(std::string_view job) const { return static_cast<int>(tasks_of(job).size()); }

  std::vector<int> task_indices(std::string_view job) const {
    std::vector<int> out;
    for (const auto& [index, address] : tasks_of(job))
      out.push_back(index);
    return out;
  }
  bool has_task(std::string_view job, int index) const {
    auto it = jobs_.find(job);
    return it != jobs_.end() && it->second.count(index);
  }

  const std::string& task_address(std::string_view job, int index) const;

  // Dense list up to the highest index, "" for the holes of a sparse job (TF
  // gives None there).
  std::vector<std::string> job_tasks(std::string_view job) const;

  std::map<std::string, job_value> as_dict() const;

  // "/job:J/replica:0/task:T" for an existing task (throws not_found_error).
  device_spec task_device(std::string_view job, int index) const {
    task_address(job, index);
    return device_spec{}.with_job(job).with_replica(0).with_task(index);
  }

  // Every task's "/job:J/replica:0/task:T/device:CPU:0", followed by its
  // GPU:0 .. GPU:gpus_per_task-1: the available devices for the placer.
  std::vector<device_spec> devices(int gpus_per_task = 0) const;

  // JSON, as TF_CONFIG's "cluster" takes it: {"ps": ["a:1"], "worker": {"1": "b:2"}}.
  std::string to_string() const;

  friend bool operator==(const cluster_spec&, const cluster_spec&) = default;
  friend std::ostream& operator<<(std::ostream& os, const cluster_spec& c) {
    return os << c.to_string();
  }

private:
  static bool is_dense(const std::map<int, std::string>& tasks) {
    return tasks.empty() || tasks.rbegin()->first + 1 == static_cast<int>(tasks.size());
  }

  const std::map<int, std::string>& tasks_of(std::string_view job) const;

  // The task before (job, index) that has address `hp` ("job 'ps' task 0"),
  // among the jobs already added and the earlier tasks of `tasks`; empty when
  // none. Hosts compare as written, ignoring case: two names of one machine
  // ("localhost", "127.0.0.1") are not resolved here, the second server then
  // fails to bind and says so.
  std::string task_at(const host_port& hp, const std::string& job, int index,
                      const std::map<int, std::string>& tasks) const;

  static std::string index_list(const std::map<int, std::string>& tasks);

  static std::vector<std::string> split_hosts(std::string_view flag, std::string_view list);

  std::map<std::string, std::map<int, std::string>, std::less<>> jobs_;
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail::cluster_impl {

LOOM_COMPILED_ONCE std::string check_address(std::string_view address, host_port& out) {
  if (address.empty())
    return "it is empty";
  if (const auto scheme = address.find("://"); scheme != std::string_view::npos)
    return "drop the scheme " + in_quotes(address.substr(0, scheme + 3)) + "; expected host:port";
  for (char c : address)
    if (c <= ' ' || c == '/' || c == '\\' || c == '"' || c == '\'' || c == ',' || c == 127)
      return "it contains the character " +
             (c <= ' ' ? std::string("code ") + std::to_string(static_cast<int>(c))
                       : in_quotes(std::string(1, c)));
  std::string_view host, port;
  if (address.front() == '[') {
    const auto close = address.find(']');
    if (close == std::string_view::npos)
      return "the '[' of an IPv6 host is not closed";
    host = address.substr(1, close - 1);
    if (host.empty())
      return "the host is empty";
    for (char c : host)
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') ||
            c == ':' || c == '.' || c == '%'))
        return "the bracketed host " + in_quotes(host) + " is not an IPv6 address";
    const std::string_view rest = address.substr(close + 1);
    if (rest.empty() || rest.front() != ':')
      return "it has no port; expected [host]:port";
    port = rest.substr(1);
  } else {
    const auto colon = address.rfind(':');
    if (colon == std::string_view::npos)
      return "it has no port; expected host:port";
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.empty())
      return "the host is empty";
    if (host.find(':') != std::string_view::npos)
      return "an IPv6 host must be written in brackets, as in [::1]:2222";
    if (host.find('[') != std::string_view::npos || host.find(']') != std::string_view::npos)
      return "a bracketed host must come first, as in [::1]:2222";
  }
  if (port.empty())
    return "the port is empty";
  if (port.size() > 5)
    return "the port " + in_quotes(port) + " is not a number in 0..65535";
  unsigned value = 0;
  for (char c : port) {
    if (c < '0' || c > '9')
      return "the port " + in_quotes(port) + " is not a number in 0..65535";
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value > 65535)
    return "the port " + in_quotes(port) + " is not a number in 0..65535";
  out.host = std::string(host);
  out.port = static_cast<std::uint16_t>(value);
  return {};
}

LOOM_COMPILED_ONCE bool valid_job_name(std::string_view name) {
  if (name.empty())
    return false;
  const auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  if (!alpha(name.front()))
    return false;
  for (char c : name)
    if (!alpha(c) && !(c >= '0' && c <= '9') && c != '_')
      return false;
  return true;
}

LOOM_COMPILED_ONCE std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return std::string(s);
}
} // namespace loom::detail::cluster_impl

namespace loom {

LOOM_COMPILED_ONCE host_port parse_host_port(std::string_view address) {
  host_port out;
  const std::string why = detail::cluster_impl::check_address(address, out);
  if (!why.empty())
    throw invalid_argument_error("address " + detail::cluster_impl::in_quotes(address) +
                                 " is not host:port: " + why);
  return out;
}

LOOM_COMPILED_ONCE cluster_spec::job_def::job_def(const std::vector<std::string>& addresses) {
  for (std::size_t i = 0; i < addresses.size(); ++i)
    tasks.emplace(static_cast<int>(i), addresses[i]);
}

LOOM_COMPILED_ONCE auto cluster_spec::from_flags(std::string_view ps_hosts,
                                                 std::string_view worker_hosts) -> cluster_spec {
  cluster_spec c;
  if (auto ps = split_hosts("--ps_hosts", ps_hosts); !ps.empty())
    c.add_job("ps", ps);
  if (auto w = split_hosts("--worker_hosts", worker_hosts); !w.empty())
    c.add_job("worker", w);
  return c;
}

LOOM_COMPILED_ONCE auto cluster_spec::add_job(const std::string& name, const job_def& def)
    -> cluster_spec& {
  namespace impl = detail::cluster_impl;
  if (!impl::valid_job_name(name))
    throw invalid_argument_error("cluster_spec: job name " + impl::in_quotes(name) +
                                 " is not valid; expected a letter followed by letters, "
                                 "digits or '_'");
  if (jobs_.count(name))
    throw invalid_argument_error("cluster_spec: job '" + name + "' is given twice");
  for (const auto& [index, address] : def.tasks) {
    if (index < 0)
      throw invalid_argument_error("cluster_spec: job '" + name + "' task " +
                                   std::to_string(index) + ": a task index must be >= 0");
    host_port hp;
    const std::string why = impl::check_address(address, hp);
    if (!why.empty())
      throw invalid_argument_error("cluster_spec: job '" + name + "' task " +
                                   std::to_string(index) + ": address " + impl::in_quotes(address) +
                                   " is not host:port: " + why);
    if (hp.port != 0) // port 0: each task's server takes a port of the OS's choosing
      if (const auto other = task_at(hp, name, index, def.tasks); !other.empty())
        throw invalid_argument_error(
            "cluster_spec: " + other + " and job '" + name + "' task " + std::to_string(index) +
            " share the address " + impl::in_quotes(address) +
            "; every task needs an address of its own (a pasted host list?)");
  }
  jobs_.emplace(name, def.tasks);
  return *this;
}

LOOM_COMPILED_ONCE auto cluster_spec::task_address(std::string_view job, int index) const
    -> const std::string& {
  const auto& tasks = tasks_of(job);
  auto it = tasks.find(index);
  if (it == tasks.end())
    throw not_found_error("cluster_spec: no task " + std::to_string(index) + " in job '" +
                          std::string(job) + "'; its tasks are " + index_list(tasks));
  return it->second;
}

LOOM_COMPILED_ONCE auto cluster_spec::job_tasks(std::string_view job) const
    -> std::vector<std::string> {
  const auto& tasks = tasks_of(job);
  std::vector<std::string> out;
  if (!tasks.empty())
    out.resize(static_cast<std::size_t>(tasks.rbegin()->first) + 1);
  for (const auto& [index, address] : tasks)
    out[static_cast<std::size_t>(index)] = address;
  return out;
}

LOOM_COMPILED_ONCE auto cluster_spec::as_dict() const -> std::map<std::string, job_value> {
  std::map<std::string, job_value> out;
  for (const auto& [name, tasks] : jobs_) {
    if (is_dense(tasks))
      out.emplace(name, job_tasks(name));
    else
      out.emplace(name, tasks);
  }
  return out;
}

LOOM_COMPILED_ONCE auto cluster_spec::devices(int gpus_per_task) const -> std::vector<device_spec> {
  if (gpus_per_task < 0)
    throw invalid_argument_error("cluster_spec::devices: gpus_per_task must be >= 0, got " +
                                 std::to_string(gpus_per_task));
  std::vector<device_spec> out;
  for (const auto& [name, tasks] : jobs_)
    for (const auto& [index, address] : tasks) {
      device_spec task = device_spec{}.with_job(name).with_replica(0).with_task(index);
      out.push_back(device_spec(task).with_device_type("CPU").with_device_index(0));
      for (int g = 0; g < gpus_per_task; ++g)
        out.push_back(device_spec(task).with_device_type("GPU").with_device_index(g));
    }
  return out;
}

LOOM_COMPILED_ONCE std::string cluster_spec::to_string() const {
  std::string out = "{";
  bool first_job = true;
  for (const auto& [name, tasks] : jobs_) {
    out += (first_job ? "\"" : ", \"") + name + "\": ";
    first_job = false;
    const bool dense = is_dense(tasks);
    out += dense ? "[" : "{";
    bool first = true;
    for (const auto& [index, address] : tasks) {
      out += first ? "" : ", ";
      first = false;
      if (!dense)
        out += "\"" + std::to_string(index) + "\": ";
      out += "\"" + address + "\"";
    }
    out += dense ? "]" : "}";
  }
  return out + "}";
}

LOOM_COMPILED_ONCE auto cluster_spec::tasks_of(std::string_view job) const
    -> const std::map<int, std::string>& {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) {
    std::string names;
    for (const auto& [name, tasks] : jobs_)
      names += (names.empty() ? "" : ", ") + name;
    throw not_found_error("cluster_spec: no job '" + std::string(job) + "'; the jobs are " +
                          (names.empty() ? std::string("none (the cluster is empty)") : names));
  }
  return it->second;
}

LOOM_COMPILED_ONCE std::string
cluster_spec::task_at(const host_port& hp, const std::string& job, int index,
                      const std::map<int, std::string>& tasks) const {
  const auto same = [&](const std::string& address) {
    host_port other;
    if (!detail::cluster_impl::check_address(address, other).empty() || other.port != hp.port ||
        other.host.size() != hp.host.size())
      return false;
    return std::equal(other.host.begin(), other.host.end(), hp.host.begin(), [](char a, char b) {
      return std::tolower(static_cast<unsigned char>(a)) ==
             std::tolower(static_cast<unsigned char>(b));
    });
  };
  const auto name = [](const std::string& j, int i) {
    return "job '" + j + "' task " + std::to_string(i);
  };
  for (const auto& [other_job, other_tasks] : jobs_)
    for (const auto& [i, address] : other_tasks)
      if (same(address))
        return name(other_job, i);
  for (const auto& [i, address] : tasks)
    if (i < index && same(address))
      return name(job, i);
  return {};
}

LOOM_COMPILED_ONCE std::string cluster_spec::index_list(const std::map<int, std::string>& tasks) {
  if (tasks.empty())
    return "none";
  std::string out;
  for (const auto& [index, address] : tasks)
    out += (out.empty() ? "" : ", ") + std::to_string(index);
  return out;
}

LOOM_COMPILED_ONCE auto cluster_spec::split_hosts(std::string_view flag, std::string_view list)
    -> std::vector<std::string> {
  std::vector<std::string> out;
  if (detail::cluster_impl::trim(list).empty())
    return out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = list.find(',', start);
    const std::string entry = detail::cluster_impl::trim(list.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (entry.empty())
      throw invalid_argument_error(std::string(flag) + "=" + std::string(list) + ": entry " +
                                   std::to_string(out.size()) +
                                   " is empty; expected comma-separated host:port addresses");
    host_port hp;
    const std::string why = detail::cluster_impl::check_address(entry, hp);
    if (!why.empty())
      throw invalid_argument_error(std::string(flag) + ": entry " + std::to_string(out.size()) +
                                   " " + detail::cluster_impl::in_quotes(entry) +
                                   " is not host:port: " + why);
    out.push_back(entry);
    if (comma == std::string_view::npos)
      return out;
    start = comma + 1;
  }
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

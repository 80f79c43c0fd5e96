// Cluster programs started by real launchers and daemons in tests (srun and Slurm's
// daemons, mpirun, ip netns exec): where a program is installed, the launcher variables
// the test's own environment must not hand down to the tasks, a temporary directory
// whose path marks every process of one run, and the processes a run left behind, found
// by that mark and killed by their PIDs.
//
// A launcher's tasks are its children, not the test's: a test that is killed, or a
// launcher that dies, can leave them running. Every process of a run gets the run's
// directory in its command line (--checkpoint_dir=<dir>/...) or environment
// (SLURM_CONF=<dir>/slurm.conf), so `processes_mentioning(dir)` finds exactly them.
#pragma once

#include <support/process.hpp>

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

extern char** environ;

namespace loom::testing {

// The path of `program` on PATH, or in /usr/sbin or /sbin (where Debian puts daemons and
// ip, off a non-root PATH); "" when it is not installed.
inline std::string find_program(std::string_view program) {
  std::string dirs = std::getenv("PATH") ? std::getenv("PATH") : "";
  dirs += ":/usr/sbin:/sbin:/usr/bin:/bin";
  std::istringstream in(dirs);
  for (std::string dir; std::getline(in, dir, ':');) {
    if (dir.empty())
      continue;
    const std::filesystem::path p = std::filesystem::path(dir) / program;
    if (::access(p.c_str(), X_OK) == 0)
      return p.string();
  }
  return "";
}

// Removes from a child's environment every variable through which a launcher or
// TF_CONFIG would tell it its task (those of a Slurm job or mpirun the test itself
// runs under), and the cluster token ones, so that a test gives exactly what it means.
inline env_overrides without_launcher_environment() {
  env_overrides out{{"TF_CONFIG", std::nullopt},
                    {"LOOM_CLUSTER_TOKEN", std::nullopt},
                    {"LOOM_CLUSTER_TOKEN_FILE", std::nullopt},
                    {"LOOM_ALLOW_INSECURE", std::nullopt}};
  for (char** e = environ; e && *e; ++e) {
    const std::string_view kv(*e);
    const std::string key(kv.substr(0, kv.find('=')));
    for (std::string_view prefix : {"SLURM_", "SLURMD_", "OMPI_", "PMI_", "PMIX_"})
      if (key.rfind(prefix, 0) == 0)
        out[key] = std::nullopt;
  }
  return out;
}

// A fresh directory under the system's temporary directory, removed with what it holds
// when the scope ends. Its path is unique to this run (prefix, PID, random suffix).
class temp_dir {
public:
  explicit temp_dir(const std::string& prefix) {
    std::string pattern =
        (std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()) + "-XXXXXX"))
            .string();
    if (!::mkdtemp(pattern.data()))
      throw sys_error("mkdtemp " + pattern);
    path_ = pattern;
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const noexcept { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

private:
  std::filesystem::path path_;
};

namespace detail {
inline std::string read_proc_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
} // namespace detail

// A process other than this one whose command line or environment holds `marker`.
struct marked_process {
  pid_t pid;
  std::string command; // its command line, arguments separated by spaces
};

inline std::vector<marked_process> processes_mentioning(std::string_view marker) {
  std::vector<marked_process> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos)
      continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (pid == ::getpid())
      continue;
    std::string cmdline = detail::read_proc_file(entry.path() / "cmdline");
    if (cmdline.find(marker) == std::string::npos &&
        detail::read_proc_file(entry.path() / "environ").find(marker) == std::string::npos)
      continue;
    for (char& c : cmdline)
      if (c == '\0')
        c = ' ';
    out.push_back({pid, cmdline});
  }
  return out;
}

// SIGKILLs the processes that hold `marker` (see processes_mentioning) until none is
// left or 5 s passed; returns those it found the first time, for the test's message.
inline std::vector<marked_process> kill_processes_mentioning(std::string_view marker) {
  const auto found = processes_mentioning(marker);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (auto left = found; !left.empty() && std::chrono::steady_clock::now() < deadline;
       left = processes_mentioning(marker)) {
    for (const auto& p : left)
      ::kill(p.pid, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(50)); // for the kernel to reap them
  }
  return found;
}

// Kills what is left of a run (the processes holding `marker`) when the scope ends,
// whether the test case passed, failed a REQUIRE or threw. Declare it after the run's
// temp_dir and before the launcher and daemons, so it runs after they are stopped.
class reaper {
public:
  explicit reaper(std::string marker) : marker_(std::move(marker)) {}
  reaper(const reaper&) = delete;
  reaper& operator=(const reaper&) = delete;
  ~reaper() { kill_processes_mentioning(marker_); }
  // Kills them now; returns those found, for the check that none was left.
  std::vector<marked_process> reap() { return kill_processes_mentioning(marker_); }

private:
  std::string marker_;
};

inline std::string describe(const std::vector<marked_process>& ps) {
  std::string out;
  for (const auto& p : ps)
    out += "  pid " + std::to_string(p.pid) + ": " + p.command + "\n";
  return out;
}

// Stops a daemon the test started: SIGTERM by its PID, then SIGKILL (the child's own
// guard) if it has not exited within `grace`.
inline void stop_daemon(child& c, std::chrono::milliseconds grace = std::chrono::seconds(10)) {
  if (!c.running())
    return;
  ::kill(c.pid(), SIGTERM);
  if (!c.wait(grace))
    c.kill();
}

// The last `n` lines of `text` (a daemon's log, for a skip or failure message).
inline std::string last_lines(const std::string& text, std::size_t n) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  std::string out;
  for (std::size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); ++i)
    out += lines[i] + "\n";
  return out;
}

// Whether `text` has a line that starts with `line` (a launcher's label, then the
// program's own words).
inline bool has_line_starting(const std::string& text, const std::string& line) {
  return text.rfind(line, 0) == 0 || text.find("\n" + line) != std::string::npos;
}

// The number that follows `line` in a program's output (a worker's "test accuracy = "),
// or nothing where the line is missing.
inline std::optional<double> accuracy_after(const std::string& text, const std::string& line) {
  const auto at = text.find(line);
  if (at == std::string::npos)
    return std::nullopt;
  return std::strtod(text.c_str() + at + line.size(), nullptr);
}

} // namespace loom::testing

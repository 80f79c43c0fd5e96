// fake_cluster_task: a stand-in cluster binary for the loom-launch tests. It takes the
// cluster flags loom-launch adds and behaves as its own flags say (all --name=value):
//
//   --marker=PATH       the chief creates PATH when it exits; a ps (and, with --forever, no
//                       task) exits 0 once PATH exists. Without it a ps waits until stopped.
//   --forever           every task runs until it is stopped by a signal
//   --chief_exit=N      the chief's exit status (default 0)
//   --fail_task=JOB:I   that task exits with --fail_code (default 3) ...
//   --signal_task=JOB:I that task kills itself with SIGUSR1 ...
//                       ... once --tasks files exist in --ready_dir (when both are given;
//                       the chief, too, waits for them before it exits)
//   --ready_dir=DIR     every task creates DIR/JOB.I once its SIGTERM handler is in place
//   --tasks=N           the number of tasks in the cluster
//   --hang=JOB:I        that task ignores SIGTERM (prints that it does)
//   --chatter=N         N lines, each written in three pieces with pauses between them
//   --long_line=N       one line of N characters written in pieces
//   --tail=TEXT         TEXT at the very end, without a newline
//
// On start it prints "fake job=J task=I pid=P ps_hosts=... worker_hosts=... args=..." on
// stdout and "fake stderr J:I" on stderr, then "fake ready J:I". On SIGTERM (unless it
// hangs) it prints "fake got SIGTERM" and exits 143.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>

namespace {

void write_out(int fd, const std::string& s) {
  std::size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n <= 0)
      return;
    done += static_cast<std::size_t>(n);
  }
}

void on_term(int) {
  static const char msg[] = "fake got SIGTERM\n";
  [[maybe_unused]] const ssize_t w = ::write(STDOUT_FILENO, msg, sizeof msg - 1);
  ::_exit(143);
}

void on_term_ignored(int) {
  static const char msg[] = "fake ignoring SIGTERM\n";
  [[maybe_unused]] const ssize_t w = ::write(STDOUT_FILENO, msg, sizeof msg - 1);
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

int count_files(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d)
    return 0;
  int n = 0;
  while (const dirent* e = ::readdir(d))
    if (e->d_name[0] != '.')
      ++n;
  ::closedir(d);
  return n;
}

void sleep_ms(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

} // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flag;
  std::string all_args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    all_args += (i > 1 ? " " : "") + a;
    if (a.rfind("--", 0) != 0)
      continue;
    const auto eq = a.find('=');
    flag[a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2)] =
        eq == std::string::npos ? "true" : a.substr(eq + 1);
  }
  auto get = [&](const std::string& name, const std::string& fallback = "") {
    const auto it = flag.find(name);
    return it == flag.end() ? fallback : it->second;
  };
  const std::string job = get("job_name", "?");
  const std::string index = get("task_index", "?");
  const std::string me = job + ":" + index;
  const bool chief = job == "worker" && index == "0";

  if (get("hang") == me)
    ::signal(SIGTERM, on_term_ignored);
  else
    ::signal(SIGTERM, on_term);

  write_out(STDOUT_FILENO, "fake job=" + job + " task=" + index + " pid=" +
                               std::to_string(::getpid()) + " ps_hosts=" + get("ps_hosts") +
                               " worker_hosts=" + get("worker_hosts") + " args=" + all_args + "\n");
  write_out(STDERR_FILENO, "fake stderr " + me + "\n");
  if (const std::string dir = get("ready_dir"); !dir.empty())
    std::ofstream(dir + "/" + job + "." + index) << "ready\n";
  write_out(STDOUT_FILENO, "fake ready " + me + "\n");

  const int chatter = std::atoi(get("chatter", "0").c_str());
  for (int k = 0; k < chatter; ++k) {
    write_out(STDOUT_FILENO, "chatter " + me + " ");
    sleep_ms(1);
    write_out(STDOUT_FILENO, std::to_string(k) + " ");
    sleep_ms(1);
    write_out(STDOUT_FILENO, "end\n");
  }
  if (const int n = std::atoi(get("long_line", "0").c_str()); n > 0) {
    std::string line = "L" + me + ":";
    line.resize(static_cast<std::size_t>(n), 'x');
    for (std::size_t at = 0; at < line.size(); at += 4096) {
      write_out(STDOUT_FILENO, line.substr(at, 4096));
      sleep_ms(2);
    }
    write_out(STDOUT_FILENO, "\n");
  }

  const bool fails = get("fail_task") == me;
  const bool signals = get("signal_task") == me;
  if (fails || signals) {
    const std::string dir = get("ready_dir");
    const int tasks = std::atoi(get("tasks", "0").c_str());
    while (!dir.empty() && count_files(dir) < tasks)
      sleep_ms(10);
    write_out(STDOUT_FILENO, std::string("fake ") + (fails ? "failing" : "raising SIGUSR1") + "\n");
    if (signals)
      ::kill(::getpid(), SIGUSR1);
    return std::atoi(get("fail_code", "3").c_str());
  }

  const std::string marker = get("marker");
  if (get("forever") == "true" || (job == "ps" && marker.empty())) {
    for (;;)
      ::pause();
  }
  if (job == "ps") {
    while (!exists(marker))
      sleep_ms(10);
  }
  if (const std::string tail = get("tail"); !tail.empty())
    write_out(STDOUT_FILENO, tail);
  if (chief) {
    const std::string dir = get("ready_dir");
    const int tasks = std::atoi(get("tasks", "0").c_str());
    while (!dir.empty() && count_files(dir) < tasks)
      sleep_ms(10);
    if (!marker.empty())
      std::ofstream(marker) << "done\n";
    return std::atoi(get("chief_exit", "0").c_str());
  }
  return 0;
}

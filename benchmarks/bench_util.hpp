// Shared by the benchmarks: medians of repeated timings, a ratio table, the bytes of a
// checkpoint.
// These machines are small and noisy, so every figure is a median over
// repetitions, and results are read as ratios against a baseline measured in
// the same run.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <stdio.h> // popen, pclose
#include <string>
#include <sys/wait.h>
#include <vector>

namespace loom::bench {

// Seconds of one call of f (a phase timed once: a save, a restore).
template <class F> double seconds_of(F&& f) {
  const auto a = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

// Median seconds per call of f, over `reps` repetitions of `inner` calls each.
template <class F> double median_seconds(F&& f, int reps, int inner = 1) {
  std::vector<double> t;
  t.reserve(static_cast<std::size_t>(reps));
  for (int r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i)
      f();
    const auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double>(b - a).count() / inner);
  }
  std::nth_element(t.begin(), t.begin() + static_cast<long>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

// Median seconds per call of each of `fs`, timed in turns (a repetition of `inner` calls of
// each, `reps` times), so that the machine's noise hits all of them alike.
template <class... F>
std::array<double, sizeof...(F)> alternated_median_seconds(int reps, int inner, F&... fs) {
  std::array<std::vector<double>, sizeof...(F)> t;
  for (int r = 0; r < reps; ++r) {
    std::size_t k = 0;
    ((t[k++].push_back(median_seconds(fs, 1, inner))), ...);
  }
  std::array<double, sizeof...(F)> out{};
  for (std::size_t k = 0; k < t.size(); ++k) {
    std::nth_element(t[k].begin(), t[k].begin() + static_cast<long>(t[k].size() / 2), t[k].end());
    out[k] = t[k][t[k].size() / 2];
  }
  return out;
}

// The bytes of a checkpoint's files: `prefix` and the files named "<prefix>.<anything>"
// (TF's index and data files, a sharded checkpoint's shards).
inline std::uint64_t checkpoint_bytes(const std::string& prefix) {
  std::uint64_t total = 0;
  const std::filesystem::path p(prefix);
  const std::string stem = p.filename().string();
  for (const auto& e : std::filesystem::directory_iterator(p.parent_path())) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.rfind(stem, 0) == 0 &&
        (name.size() == stem.size() || name[stem.size()] == '.'))
      total += e.file_size();
  }
  return total;
}

struct row {
  std::string name;
  double seconds;
};

// Prints each row's time and its ratio to the first row (the baseline).
inline void print_table(const std::string& title, const std::vector<row>& rows,
                        const std::string& unit = "us", double scale = 1e6) {
  std::printf("\n%s\n", title.c_str());
  std::printf("%-44s %14s %10s\n", "case", ("median " + unit).c_str(), "ratio");
  for (const auto& r : rows)
    std::printf("%-44s %14.1f %10.3f\n", r.name.c_str(), r.seconds * scale,
                r.seconds / rows.front().seconds);
}

// A word for the shell, in single quotes.
inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

struct command_result {
  int status = -1; // the exit status, or 128 + signal
  std::string output;
};

// Runs `cmd` through the shell, stdout and stderr together.
inline command_result run_command(const std::string& cmd) {
  command_result r;
  std::FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p)
    return r;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p))
    r.output += buf;
  const int st = ::pclose(p);
  if (st != -1)
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
  return r;
}

} // namespace loom::bench

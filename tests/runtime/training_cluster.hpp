// What the training_processes cases share (test_training*.cpp): examples/mnist_replica's
// prerequisites and flags, reading what its processes print, a scratch directory.
#pragma once

#include <loom/core/checkpoint_format.hpp>
#include <loom/core/tensor_bundle.hpp>
#include <loom/data/mnist.hpp>
#include <loom/train/checkpoint_state.hpp>

#include <doctest/doctest.h>

#include "support/examples.hpp"
#include "support/process.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <regex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace loom::testing::training {

namespace lt = loom::testing;
using lt::cluster_flags;
using lt::expect_exit;
using lt::plus;
using namespace std::chrono_literals;

// What is missing of the Fashion-MNIST files mnist_replica reads by default, or "".
inline std::string missing_fashion_mnist() {
  const std::filesystem::path dir(loom::data::default_fashion_mnist_dir);
  const char* const how = " Install it with tools/setup.sh (Debian package dataset-fashion-mnist; "
                          "`make test` runs it).";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return "Fashion-MNIST is missing: no directory " + dir.string() + "." + how;
  std::string missing;
  for (const char* base : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                           "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    if (!std::filesystem::is_regular_file(dir / (std::string(base) + ".gz"), ec) &&
        !std::filesystem::is_regular_file(dir / base, ec))
      missing += std::string(missing.empty() ? "" : ", ") + base + "[.gz]";
  }
  if (missing.empty())
    return "";
  return "Fashion-MNIST is incomplete: " + dir.string() + " lacks " + missing + "." + how;
}

// Without the replica binary or the data every process would fail on its own,
// some only after a timeout; one message says what is missing instead.
inline void require_prerequisites() {
  std::string why = lt::missing_example("mnist_replica");
  if (const std::string data = missing_fashion_mnist(); !data.empty())
    why += (why.empty() ? "" : "\n") + data;
  if (!why.empty())
    FAIL(why);
}

inline std::string replica() {
  return lt::example("mnist_replica");
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Every integer captured by `pattern`'s first group, in order.
inline std::vector<long long> captured(const std::string& text, const std::string& pattern) {
  std::vector<long long> out;
  const std::regex re(pattern);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it)
    out.push_back(std::stoll((*it)[1].str()));
  return out;
}

inline double test_accuracy(const std::string& out) {
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_search(out, m, std::regex("test accuracy = ([0-9.]+)")), out);
  return std::stod(m[1].str());
}

inline long long local_steps(const std::string& out) {
  auto v = captured(out, "Training ends: ([0-9]+) local steps");
  REQUIRE_MESSAGE(v.size() == 1, out);
  return v[0];
}

// Sync replicas without backups: a worker's every step took part in one update, so it took
// `updates` steps. Except across a recovery: a step whose gradient counted but whose wait for
// the update then failed is retried in a new session, and the retry's gradient joins a later
// update, so the worker counts one step fewer per such recovery. A recovery says so, with its
// error, on the worker's output (it was seen once under a loaded CI: 1999 of 2000).
inline void check_took_part_in_every_update(const lt::child& w, long long updates) {
  const long long steps = local_steps(w.output());
  const auto recoveries = static_cast<long long>(
      captured(w.output(), "recreating the session \\(recovery ([0-9]+)").size());
  INFO(w.report());
  CHECK(steps <= updates);
  CHECK(steps + recoveries >= updates);
  if (steps < updates)
    MESSAGE("a worker took " << steps << " steps for " << updates << " updates across "
                             << recoveries << " recovery(ies): see its output above");
}

inline long long final_global_step(const std::string& out) {
  auto v = captured(out, "final global step ([0-9]+)");
  REQUIRE_MESSAGE(v.size() == 1, out);
  return v[0];
}

struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    path = std::filesystem::temp_directory_path() /
           ("loom-training-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    std::filesystem::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

inline std::vector<std::string> common(const temp_dir& d, const std::string& steps,
                                       const std::string& shutdown_wait_secs = "30") {
  return {"--train_steps=" + steps, "--learning_rate=0.001", "--log_every=100",
          "--checkpoint_dir=" + d.path.string(), "--shutdown_wait_secs=" + shutdown_wait_secs};
}

// The chief's summaries: one event file in `d` (the examples' --logdir defaults to their
// --checkpoint_dir) holding every tag (the records' format: tests/train/test_summary.cpp).
inline void check_event_file_tags(const temp_dir& d, std::initializer_list<const char*> tags) {
  std::vector<std::filesystem::path> events;
  for (const auto& e : std::filesystem::directory_iterator(d.path))
    if (e.path().filename().string().starts_with("events.out.tfevents."))
      events.push_back(e.path());
  REQUIRE(events.size() == 1);
  std::ifstream in(events.front(), std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), {}};
  for (const char* tag : tags)
    CHECK_MESSAGE(bytes.find(tag) != std::string::npos, "no summary tagged " << tag);
}

template <class... S>
inline std::vector<std::string> args(std::vector<std::string> a, const std::vector<std::string>& b,
                                     S... more) {
  a.insert(a.end(), b.begin(), b.end());
  return plus(std::move(a), more...);
}

} // namespace loom::testing::training

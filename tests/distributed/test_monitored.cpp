// monitored_training_session on an in-process cluster: the chief initializes,
// then restores from its checkpoint directory; hooks stop at a step, save
// checkpoints and refuse a NaN loss; a non-chief waits until the chief has
// initialized the variables.
#include <loom/api.hpp>
#include <loom/core/tensor_bundle.hpp>

#include <doctest/doctest.h>
#include <support/cluster.hpp>
#include <support/log_capture.hpp>
#include <support/messages.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <future>
#include <limits>
#include <sstream>
#include <thread>

namespace {

using loom::testing::contains;
using loom::testing::local_cluster;
using namespace std::chrono_literals;

struct temp_dir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("loom-monitored-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
  temp_dir() { std::filesystem::create_directories(path); }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// w on the ps, trained toward a fed target by gradient descent.
struct regression {
  loom::graph g;
  std::optional<loom::variable<std::int64_t, 0>> step;
  std::optional<loom::variable<float, 1>> w;
  loom::placeholder<float, 1> target{g, loom::shape{2}, "target"};
  std::optional<loom::output<float, 0>> loss;
  std::optional<loom::operation> train;

  regression() {
    auto _ = g.device(loom::replica_device_setter({.ps_tasks = 1}));
    step = loom::create_global_step(g);
    w.emplace(g, "w", loom::shape{2}, loom::zeros_initializer{});
    loss = loom::lower(loom::reduce_sum(loom::square(*w - target)));
    train = loom::gradient_descent_optimizer{0.1}.minimize(*loss, *step);
  }
  loom::feed_dict feeds(float v) {
    return {{target, loom::tensor<float, 1>::from(
                         loom::any_tensor::from_vector<float>(loom::shape{2}, {v, v}))}};
  }
};

// Worker 0 is the chief and logs as "worker: ..."; the others as "worker <n>: ...", so that
// a case's log_capture tells the chief's lines from theirs.
loom::monitored_session_options options(local_cluster& c, int worker) {
  static std::ostringstream sink;
  loom::monitored_session_options o;
  o.master = c.worker(worker).target();
  o.is_chief = worker == 0;
  o.config.placement_log = &sink;
  o.recovery_wait = 50ms;
  o.shutdown_cluster = false;
  if (worker != 0)
    o.label = "worker " + std::to_string(worker);
  return o;
}

} // namespace

TEST_CASE("the chief initializes, stops at the step, saves a checkpoint; a new chief restores "
          "it") {
  local_cluster c(1, 1);
  temp_dir dir;
  {
    loom::testing::log_capture log;
    regression m;
    auto o = options(c, 0);
    o.checkpoint_dir = (dir.path / "created" / "by_the_session").string();
    o.hooks = {std::make_shared<loom::stop_at_step_hook>(5)};
    loom::monitored_training_session s(m.g, o);
    // Its lines go to the library's logger, at info.
    CHECK_MESSAGE(log.contains("worker: initialized the variables"), log.text());
    CHECK(log.level_of("worker: initialized the variables") == loom::logging::level::info);
    CHECK_MESSAGE(log.contains("saved checkpoint "), log.text()); // the checkpoint hook's
    CHECK(log.level_of("saved checkpoint ") == loom::logging::level::info);
    int steps = 0;
    while (!s.should_stop()) {
      s.run(*m.train, m.feeds(1.0f));
      ++steps;
    }
    CHECK(steps == 5);
    CHECK(s.global_step() == 5);
    s.close();
  }
  const auto latest = loom::latest_checkpoint((dir.path / "created" / "by_the_session").string());
  REQUIRE(latest.has_value());
  CHECK(contains(*latest, "model.ckpt-5"));

  // A fresh cluster (the ps lost its state): the chief restores step 5.
  local_cluster c2(1, 1);
  regression m;
  auto o = options(c2, 0);
  o.checkpoint_dir = (dir.path / "created" / "by_the_session").string();
  loom::testing::log_capture log;
  loom::monitored_training_session s(m.g, o);
  CHECK(s.global_step() == 5);
  CHECK_MESSAGE(log.contains("worker: restored " + *latest), log.text());
  s.close();
}

namespace {

// A checkpoint directory of a chief that ran to step 10, saving every 2 steps
// and at the end (the newest 5 kept, the last model.ckpt-10).
std::filesystem::path trained_checkpoints(const std::filesystem::path& dir) {
  local_cluster c(1, 1);
  regression m;
  auto o = options(c, 0);
  o.checkpoint_dir = dir.string();
  o.save_checkpoint_secs = 0;
  o.save_checkpoint_steps = 2;
  o.hooks = {std::make_shared<loom::stop_at_step_hook>(10)};
  loom::monitored_training_session s(m.g, o);
  while (!s.should_stop())
    s.run(*m.train, m.feeds(1.0f));
  s.close();
  return dir;
}

void write_text(const std::filesystem::path& p, const std::string& text) {
  std::FILE* f = std::fopen(p.c_str(), "wb");
  REQUIRE(f != nullptr);
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
}

// Flips the last byte of checkpoint `prefix`'s data (TF's format, the default: its one
// data file; loom's: its file).
void flip_last_byte(const std::filesystem::path& prefix) {
  const std::filesystem::path tf_data = prefix.string() + ".data-00000-of-00001";
  const std::filesystem::path p = std::filesystem::exists(tf_data) ? tf_data : prefix;
  std::FILE* f = std::fopen(p.c_str(), "r+b");
  REQUIRE(f != nullptr);
  std::fseek(f, -1, SEEK_END);
  const int c = std::fgetc(f);
  std::fseek(f, -1, SEEK_END);
  std::fputc(c ^ 0x40, f);
  std::fclose(f);
}

// A new chief on a fresh cluster over `dir`: its global step, and what it logged.
std::pair<std::int64_t, std::string> restart_chief(const std::filesystem::path& dir,
                                                   bool initialize_over_damaged = false) {
  local_cluster c(1, 1);
  regression m;
  loom::testing::log_capture log;
  auto o = options(c, 0);
  o.checkpoint_dir = dir.string();
  o.initialize_over_damaged_checkpoints = initialize_over_damaged;
  loom::monitored_training_session s(m.g, o);
  const std::int64_t step = s.global_step();
  s.close();
  return {step, log.text()};
}

} // namespace

TEST_CASE("a damaged checkpoint state file costs no progress: the chief restores the newest "
          "intact checkpoint and says why") {
  temp_dir tmp;
  const auto dir = trained_checkpoints(tmp.path / "run");
  const auto state = dir / "checkpoint";
  REQUIRE(loom::detail::checkpoint_files_in(dir.string()).size() == 5);
  const std::string good_state = [&] {
    std::FILE* f = std::fopen(state.c_str(), "rb");
    std::string t(4096, '\0');
    t.resize(std::fread(t.data(), 1, t.size(), f));
    std::fclose(f);
    return t;
  }();

  struct damage {
    const char* what;
    std::function<void()> apply;
    const char* said;
  };
  const std::vector<damage> damages{
      {"truncated", [&] { write_text(state, good_state.substr(0, 17)); }, "cannot be read"},
      {"garbage", [&] { write_text(state, "\x01\x02 not a checkpoint state\n"); },
       "cannot be read"},
      {"names a missing file",
       [&] { write_text(state, "model_checkpoint_path: \"model.ckpt-999\"\n"); },
       "model.ckpt-999, which does not exist"},
      {"removed", [&] { std::filesystem::remove(state); }, "has no state file"},
  };
  for (const damage& d : damages) {
    CAPTURE(d.what);
    d.apply();
    const auto [step, log] = restart_chief(dir);
    CHECK(step == 10);
    CHECK(contains(log, d.said));
    CHECK(contains(log, "restoring " + (dir / "model.ckpt-10").string() +
                            ", the newest intact of the 5 checkpoint file(s)"));
    // The state file names the checkpoints again, so the next start needs no rescue.
    const auto latest = loom::latest_checkpoint(dir.string());
    REQUIRE(latest.has_value());
    CHECK(contains(*latest, "model.ckpt-10"));
  }

  SUBCASE("the newest checkpoint is damaged too: the one before it, naming the damaged one") {
    const auto files = loom::detail::checkpoint_files_in(dir.string());
    REQUIRE(files.size() == 5);
    const std::string& before = files[3]; // model.ckpt-<step>
    write_text(state, "garbage");
    flip_last_byte(dir / "model.ckpt-10");
    const auto [step, log] = restart_chief(dir);
    // The step saved in it (a file's name is the step read with the step that
    // triggered the save, which may miss that step's own update).
    CHECK(step ==
          loom::tensor_bundle::reader(before).read_tensor("global_step").data<std::int64_t>()[0]);
    CHECK(step < 10);
    CHECK(contains(log, "restoring " + before));
    CHECK(contains(log, "newer, damaged: " + (dir / "model.ckpt-10").string()));
  }
  SUBCASE("none is intact: one clear error instead of step 0, unless asked to initialize") {
    write_text(state, "garbage");
    for (const auto& f : loom::detail::checkpoint_files_in(dir.string()))
      flip_last_byte(f);
    const std::string what = loom::testing::message_of<loom::error>([&] { restart_chief(dir); });
    CHECK(contains(what, "none of its 5 checkpoint file(s) is intact"));
    CHECK(contains(what, "initialize_over_damaged_checkpoints"));
    const auto [step, log] = restart_chief(dir, true);
    CHECK(step == 0);
    CHECK(contains(log, "initializing over them"));
  }
}

TEST_CASE("a non-chief waits until the chief has initialized the variables") {
  local_cluster c(1, 2);
  regression chief_model, worker_model;
  auto wo = options(c, 1);
  auto waiting = std::async(std::launch::async, [&] {
    loom::monitored_training_session s(worker_model.g, wo);
    return s.global_step();
  });
  CHECK(waiting.wait_for(300ms) == std::future_status::timeout);
  loom::monitored_training_session chief(chief_model.g, options(c, 0));
  REQUIRE(waiting.wait_for(20s) == std::future_status::ready);
  CHECK(waiting.get() == 0);
}

TEST_CASE("a non-chief gives up after ready_timeout, naming a variable it waited for") {
  local_cluster c(1, 2);
  regression m;
  auto o = options(c, 1);
  o.ready_timeout = 200ms;
  const std::string what = loom::testing::message_of<loom::deadline_exceeded_error>(
      [&] { loom::monitored_training_session s(m.g, o); });
  CHECK(contains(what, "the chief did not initialize"));
  CHECK(contains(what, "global_step"));
}

TEST_CASE("the NaN guard fails the step whose loss is not finite") {
  local_cluster c(1, 1);
  regression m;
  auto o = options(c, 0);
  o.hooks = {std::make_shared<loom::nan_guard_hook>(m.loss->id())};
  loom::monitored_training_session s(m.g, o);
  s.run(*m.train, m.feeds(1.0f));
  const std::string what = loom::testing::message_of<loom::invalid_argument_error>(
      [&] { s.run(*m.train, m.feeds(std::numeric_limits<float>::quiet_NaN())); });
  CHECK(contains(what, "training diverged"));
}

TEST_CASE("a sync chief whose barrier passes its deadline (a worker died, no backup) shuts the ps "
          "tasks down instead of leaving them serving") {
  local_cluster c(1, 2);
  loom::graph g;
  loom::placeholder<float, 1> target(g, loom::shape{2}, "target");
  loom::gradient_descent_optimizer sgd{0.1};
  loom::sync_replicas_optimizer sync(
      sgd, {.replicas_to_aggregate = 2, .total_num_replicas = 2, .barrier_timeout = 500ms});
  std::optional<loom::operation> train;
  {
    auto _ = g.device(loom::replica_device_setter({.ps_tasks = 1}));
    auto step = loom::create_global_step(g);
    loom::variable<float, 1> w(g, "w", loom::shape{2}, loom::zeros_initializer{});
    train = sync.minimize(loom::reduce_sum(loom::square(w - target)), step);
  }
  loom::testing::log_capture log;
  auto o = options(c, 0);
  o.num_workers = 2;
  o.sync_replicas = &sync;
  o.shutdown_cluster = true;
  auto ps_joined = std::async(std::launch::async, [&] { c.ps(0).join(); });
  {
    loom::monitored_training_session chief(g, o);
    // Worker 1 died before its first step: the update never gets its second gradient.
    CHECK_THROWS_AS(chief.run(*train, {{target, loom::tensor<float, 1>(loom::shape{2}, 1.0f)}}),
                    loom::deadline_exceeded_error);
  }
  CHECK(ps_joined.wait_for(20s) == std::future_status::ready); // told to stop, not orphaned
  const std::string text = log.text();
  CHECK_MESSAGE(!contains(text, "waiting for ps task"), text); // nothing dials the ps it stopped
  CHECK_MESSAGE(contains(text, "worker: step failed for good ("), text);
  CHECK_MESSAGE(contains(text, "shutting the ps tasks down"), text);
  CHECK(log.level_of("failed for good") == loom::logging::level::error);
}

TEST_CASE("a chief that gives up with shutdown_cluster = false says the ps tasks still serve and "
          "how to stop them") {
  local_cluster c(1, 1);
  regression m;
  loom::testing::log_capture log;
  auto o = options(c, 0);
  o.hooks = {std::make_shared<loom::nan_guard_hook>(m.loss->id())};
  {
    loom::monitored_training_session s(m.g, o);
    CHECK_THROWS_AS(s.run(*m.train, m.feeds(std::numeric_limits<float>::quiet_NaN())),
                    loom::invalid_argument_error);
  }
  const std::string text = log.text();
  CHECK_MESSAGE(contains(text, "the ps tasks still serve: stop them with "
                               "loom::session::shutdown_cluster(\"" +
                                   c.worker(0).target() + "\", {\"ps\"})"),
                text);
  // And they do: a session still reaches the ps.
  loom::graph g;
  auto k = g.on("/job:ps/task:0", [&] { return loom::constant(g, 7.0f); });
  loom::session s(g, c.worker(0).target(), loom::testing::quiet());
  CHECK(static_cast<float>(s.run(k)) == 7.0f);
}

TEST_CASE("a closing chief does not wait for workers that are gone, finished or not") {
  local_cluster c(1, 3);
  regression chief_model, other_model;
  loom::testing::log_capture log;
  auto o = options(c, 0);
  o.num_workers = 3;
  o.shutdown_cluster = true;
  o.shutdown_wait = 60s;
  auto ps_joined = std::async(std::launch::async, [&] { c.ps(0).join(); });
  loom::monitored_training_session chief(chief_model.g, o);
  chief.run(*chief_model.train, chief_model.feeds(1.0f));
  {
    // Worker 1 trains, says it is done and exits; worker 2 dies without a word.
    auto o1 = options(c, 1);
    o1.num_workers = 3;
    loom::monitored_training_session other(other_model.g, o1);
    other.run(*other_model.train, other_model.feeds(1.0f));
    other.close();
  }
  c.worker(1).stop();
  c.worker(2).stop();

  const auto start = std::chrono::steady_clock::now();
  chief.close();
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took < 15s); // not shutdown_wait's 60 s
  CHECK(ps_joined.wait_for(10s) == std::future_status::ready);
  const std::string text = log.text();
  CHECK_MESSAGE(contains(text, "worker: 2 of 3 worker(s) finished and no other worker answers ("),
                text);
  CHECK_MESSAGE(contains(text, "/job:worker/replica:0/task:2: "), text);
  CHECK_MESSAGE(contains(text, "shutting the ps tasks down"), text);
}

TEST_CASE("a closing chief waits for a worker that still works, and no longer than it takes") {
  local_cluster c(1, 2);
  regression chief_model, other_model;
  loom::testing::log_capture log;
  auto o = options(c, 0);
  o.num_workers = 2;
  o.shutdown_cluster = true;
  o.shutdown_wait = 60s;
  auto ps_joined = std::async(std::launch::async, [&] { c.ps(0).join(); });
  loom::monitored_training_session chief(chief_model.g, o);
  auto o1 = options(c, 1);
  o1.num_workers = 2;
  loom::monitored_training_session other(other_model.g, o1);
  chief.run(*chief_model.train, chief_model.feeds(1.0f));

  auto closed = std::async(std::launch::async, [&] { chief.close(); });
  CHECK(closed.wait_for(1500ms) == std::future_status::timeout); // worker 1 still trains
  other.run(*other_model.train, other_model.feeds(1.0f));
  other.close();
  CHECK(closed.wait_for(10s) == std::future_status::ready);
  closed.get();
  CHECK(ps_joined.wait_for(10s) == std::future_status::ready);
  const std::string text = log.text();
  CHECK_MESSAGE(!contains(text, "no other worker answers"), text);
  CHECK_MESSAGE(!contains(text, "shutting down anyway"), text);
  CHECK_MESSAGE(contains(text, "final global step 2"), text);
}

namespace {

// Fails the steps it is told to with aborted, as a step that lost its ps does.
struct failing_hook : loom::session_run_hook {
  std::function<bool(int)> fails; // by the count of after_run calls so far
  int calls = 0;
  explicit failing_hook(std::function<bool(int)> f) : fails(std::move(f)) {}
  void after_run(loom::run_context&, std::span<const loom::any_tensor>) override {
    if (fails(calls++))
      throw loom::aborted_error("failing_hook: the ps went away");
  }
};

int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    ++n;
  return n;
}

} // namespace

TEST_CASE("recovery has no lifetime cap: 15 failed steps, 15 recoveries, each logged once, and "
          "training goes on") {
  local_cluster c(1, 1);
  regression m;
  loom::testing::log_capture log;
  auto o = options(c, 0);
  o.recovery_wait = 1ms;
  o.hooks = {std::make_shared<failing_hook>([](int call) { return call % 2 == 0 && call < 30; })};
  loom::monitored_training_session s(m.g, o);
  for (int i = 0; i < 20; ++i)
    s.run(*m.train, m.feeds(1.0f));
  s.close();
  const std::string text = log.text();
  CHECK_MESSAGE(count_of(text, "recreating the session") == 15, text);
  CHECK(log.level_of("recreating the session") == loom::logging::level::warn);
  CHECK_MESSAGE(contains(text,
                         "step failed (aborted: failing_hook: the ps went away); recreating the "
                         "session (recovery 15)"),
                text);
  CHECK_FALSE(contains(text, "failed again"));
}

TEST_CASE("one recovery goes on until recovery_deadline, waiting longer each attempt, logged at "
          "its start and after 2, 4, 8 ... attempts") {
  local_cluster c(1, 1);
  regression m;
  loom::testing::log_capture log;
  auto o = options(c, 0);
  o.recovery_wait = 10ms;
  o.max_recovery_wait = 80ms;
  o.recovery_deadline = 1s;
  o.hooks = {std::make_shared<failing_hook>([](int) { return true; })};
  loom::monitored_training_session s(m.g, o);
  const auto begin = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(s.run(*m.train, m.feeds(1.0f)), loom::aborted_error);
  const auto took = std::chrono::steady_clock::now() - begin;
  CHECK(took >= 1s);
  CHECK(took < 10s);
  const std::string text = log.text();
  CHECK_MESSAGE(count_of(text, "recreating the session (recovery 1)") == 1, text);
  // 10 + 20 + 40 + 80 + 80 ... ms: about 15 attempts in 1 s, logged at 2, 4 and 8.
  CHECK_MESSAGE(count_of(text, "failed again") == 3, text);
  CHECK_MESSAGE(contains(text, "recovery 1 goes on (8 attempts in "), text);
  CHECK_MESSAGE(contains(text, "recovery 1 did not succeed within recovery_deadline (1000 ms)"),
                text);
  CHECK(log.level_of("did not succeed within recovery_deadline") == loom::logging::level::error);
}

TEST_CASE("a restarted chief joins the variables the ps holds instead of rolling them back to its "
          "checkpoint") {
  local_cluster c(1, 1);
  temp_dir dir;
  {
    regression m;
    auto o = options(c, 0);
    o.checkpoint_dir = dir.path.string();
    o.save_checkpoint_secs = 0;
    o.save_checkpoint_steps = 0; // only the one at the start, at step 0
    loom::monitored_training_session s(m.g, o);
    for (int i = 0; i < 7; ++i)
      s.run(*m.train, m.feeds(1.0f));
    // killed: no close()
  }
  regression m;
  loom::testing::log_capture log;
  auto o = options(c, 0);
  o.checkpoint_dir = dir.path.string();
  loom::monitored_training_session s(m.g, o);
  CHECK(s.global_step() == 7);
  const std::string text = log.text();
  CHECK_MESSAGE(contains(text, "every global variable is initialized on the ps tasks (global step "
                               "7): joining them"),
                text);
  CHECK_FALSE(contains(text, "restored"));
}

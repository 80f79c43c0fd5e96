// monitored_training_session: TF's tf.train.MonitoredTrainingSession (and the
// Supervisor before it) for between-graph replication.
//
//   - The chief joins the variables the ps tasks hold where every one is
//     initialized (a restarted chief, TF's SessionManager finding the model
//     ready), else restores the latest checkpoint of checkpoint_dir, or runs
//     the initializers; the others wait, saying what they wait for, until
//     every global variable is initialized.
//   - Every worker then initializes its local variables; with synchronous
//     replicas the chief resets the accumulators and the barrier to the global
//     step (sync_replicas_optimizer::reset_op), every worker sets its local
//     step, and the chief starts the update loop.
//   - run() runs one step plus what the hooks ask for; the global step is
//     fetched with every step. stop_at_step, logging, checkpoints (chief) and
//     the NaN guard are hooks.
//   - A step, the creation of the session (restore, readiness wait) or a stage
//     of close() that fails with aborted or unavailable (a ps task restarted,
//     a call in flight lost its connection) makes the session recreate itself:
//     the chief restores the last checkpoint, the others wait for it, and the
//     step is retried (TF's _RecoverableSession). Attempts wait recovery_wait,
//     doubling up to max_recovery_wait; they go on for as long as
//     recovery_deadline allows (10 minutes by default; TF's go on without end,
//     and a worker cut off while the chief finished the run, its ps shut down,
//     would retry for ever: with no task left to tell it, a bound is the only
//     signal that can reach it). Each
//     recovery is logged once when it begins (and again after 2, 4, 8, ...
//     failed attempts).
//   - close(): the hooks' end (the chief's final checkpoint); each worker
//     counts itself done on the global step's task; the chief waits for the
//     others, then tells the cluster to shut down, so every ps task's join()
//     returns and its process exits 0. It waits at most shutdown_wait, and
//     not at all for workers that are gone: once no other worker's server
//     answers (each has exited, finished or not), one that never said done
//     never will.
//   - A chief that fails for good (a sync barrier's deadline passed because a
//     worker died, a recovery passed its deadline, a hook refused a step) tells the ps
//     tasks to shut down before the error reaches its caller, or, with
//     shutdown_cluster = false, says that they still serve and how to stop
//     them: no ps is left serving a job that has ended.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/log.hpp>
#include <loom/runtime/session.hpp>
#include <loom/train/global_step.hpp>
#include <loom/train/hooks.hpp>
#include <loom/train/incremental_saver.hpp>
#include <loom/train/monitored_session_options.hpp>
#include <loom/train/saver.hpp>
#include <loom/train/summary_saver_hook.hpp>
#include <loom/train/sync_replicas_optimizer.hpp>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace loom {

class monitored_training_session {
public:
  monitored_training_session(graph& g, monitored_session_options o);

  monitored_training_session(const monitored_training_session&) = delete;
  monitored_training_session& operator=(const monitored_training_session&) = delete;
  ~monitored_training_session() {
    if (chief_loop_) {
      try {
        chief_loop_->stop(session_.get());
      } catch (...) {
      }
    }
  }

  // One step: the fetches (an expression, an operation or fetches(...)) with
  // the feeds, plus the global step and the hooks' requests; traced into
  // `metadata` with options.trace_level = trace_level::full (TF's
  // MonitoredSession.run(fetches, feed_dict, options, run_metadata)).
  //
  // A step that finds the end of its input (an iterator's out_of_range,
  // graph/ops/iterator.hpp) is a clean stop, as TF's: should_stop() and
  // input_ended() turn true and run returns an empty result (nothing for an
  // operation), its hooks not called: the step trained on no batch (what of it
  // does not depend on the batch may have run, as in TF).
  template <class F>
  auto run(const F& fetch, const feed_dict& feeds = {}, const run_options& options = {},
           run_metadata* metadata = nullptr) {
    using result_type = decltype(session_->run_with_extra(fetch, feeds, {}, options).first);
    if (should_stop_)
      throw failed_precondition_error("monitored_training_session: run after should_stop()");
    std::vector<node_id> extra{global_step_};
    std::vector<std::size_t> first;
    for (auto& h : hooks_) {
      first.push_back(extra.size());
      auto ids = h->before_run();
      extra.insert(extra.end(), ids.begin(), ids.end());
    }
    first.push_back(extra.size());
    for (;;) {
      try {
        auto [result, values] = session_->run_with_extra(fetch, feeds, extra, options, metadata);
        run_context ctx{*values[0].template data<std::int64_t>(), [this] {
                          return global_step_value_ = *session_->run_nodes({global_step_}, {})
                                                           .front()
                                                           .template data<std::int64_t>();
                        }};
        global_step_value_ = std::max(global_step_value_, ctx.global_step);
        for (std::size_t k = 0; k < hooks_.size(); ++k)
          hooks_[k]->after_run(
              ctx, std::span<const any_tensor>(values).subspan(first[k], first[k + 1] - first[k]));
        should_stop_ = should_stop_ || ctx.stop_requested;
        recovered();
        return result;
      } catch (const out_of_range_error& e) {
        say(logging::level::info, "the input ended (%s); stopping", e.what());
        should_stop_ = input_ended_ = true;
        recovered();
        return result_type{};
      } catch (const error& e) {
        prepare_recovery(e, "step");
        create_session_recovering();
      }
    }
  }

  bool should_stop() const noexcept { return should_stop_; }
  // The last run found the end of its input: it trained on nothing (a loop that
  // counts its steps does not count that one).
  bool input_ended() const noexcept { return input_ended_; }
  std::int64_t global_step() const noexcept { return global_step_value_; }
  // The session under the hooks, for evaluation after training.
  session& raw_session() { return *session_; }

  // Ends training: hooks' end, the chief's update loop, then the shutdown
  // handshake (see the top of this file). Idempotent. Each stage recovers as
  // a step does; a session recreated while closing starts no update loop.
  void close();

private:
  // One line of this session's log: "<label>: " and the printf-formatted message, through
  // the library's logger at `level`. Never throws: a line lost to a failed allocation is
  // not worth the step.
  [[gnu::format(printf, 3, 4)]] void say(logging::level level, const char* format,
                                         ...) const noexcept;

  // The chief, closing: waits until every worker has counted itself done, at
  // most shutdown_wait, and not for workers that are gone. The count cannot
  // say which worker is missing, but the servers can: once no other worker
  // answers, on two checks recovery_wait apart (a worker being restarted is
  // not taken for gone), whoever has not said done has exited without it.
  void wait_for_other_workers();

  // How often the closing chief looks who is gone: every recovery_wait, at
  // least 200 ms apart.
  std::chrono::milliseconds check_interval() const {
    return std::max(o_.recovery_wait, std::chrono::milliseconds(200));
  }

  // How many workers other than this chief serve; `gone` gets those of the
  // workers' jobs (every job but shutdown_jobs) that did not answer.
  int other_workers_answering(std::vector<std::string>& gone) const;

  static bool recoverable(const error& e) {
    return e.code() == error_code::aborted || e.code() == error_code::unavailable;
  }

  // Called in a handler of e: rethrows e unless it is recoverable and the
  // recovery's deadline (if any) has not passed, else says so (once per
  // recovery, and again after 2, 4, 8, ... failed attempts) and waits before
  // the next attempt: recovery_wait, doubling, at most max_recovery_wait.
  void prepare_recovery(const error& e, const char* what);

  // A step (or a stage of close()) succeeded: the recovery, if any, is over.
  void recovered() noexcept { attempts_ = 0; }

  // Runs f, recovering from its failures as a step does (close()'s stages).
  template <class F> void recovering(const char* what, F&& f) {
    for (;;) {
      try {
        f();
        recovered();
        return;
      } catch (const error& e) {
        prepare_recovery(e, what);
        create_session_recovering();
      }
    }
  }

  // The chief fails for good (a sync barrier passed its deadline because a
  // worker died, a recovery passed its deadline, a hook refused a step): nothing else
  // would tell the ps tasks to stop, so it tells them, or says that they
  // still serve and how to stop them. Never throws: e is what the caller sees.
  void give_up(const error& e, const char* what) noexcept;

  // A ps task may go away while the session is being created too (a worker
  // waiting for the chief while the ps restarts): creating it is retried like
  // a step, as TF's _RecoverableSession does.
  void create_session_recovering() {
    for (;;) {
      try {
        create_session();
        return;
      } catch (const error& e) {
        prepare_recovery(e, "creating the session");
      }
    }
  }

  void create_session();

  // The chief: join the variables where the ps tasks hold every one
  // initialized (a restarted chief: rolling them back to a checkpoint would
  // lose the steps since it, and a restore is no safer than what the ps
  // holds); else restore the latest checkpoint, else initialize. A damaged
  // state file falls back on the newest intact checkpoint in the directory,
  // which the state file then names again (find_checkpoint_to_restore).
  void prepare();

  // The names of the global variables not initialized on the ps tasks.
  std::vector<std::string> uninitialized_variables();

  // The others: wait until the chief has initialized every global variable.
  void wait_until_ready();

  graph graph_;
  monitored_session_options o_;
  std::vector<std::shared_ptr<session_run_hook>> hooks_;
  // The chief's checkpoints: a saver, or with increments an incremental_saver.
  std::optional<saver> saver_;
  std::optional<incremental_saver> incremental_saver_;
  saver* full_saver() {
    return incremental_saver_ ? &incremental_saver_->full() : saver_ ? &*saver_ : nullptr;
  }
  node_id global_step_ = no_node, init_ = no_node, local_init_ = no_node, done_ = no_node,
          done_count_ = no_node, all_done_ = no_node;
  std::vector<node_id> ready_vars_, ready_checks_;
  std::unique_ptr<session> session_;
  std::unique_ptr<sync_replicas_chief> chief_loop_;
  std::int64_t global_step_value_ = 0;
  bool should_stop_ = false, input_ended_ = false, closed_ = false, closing_ = false;
  int recoveries_ = 0; // recoveries begun in the session's life, for logs
  int attempts_ = 0;   // failed attempts of the recovery under way; 0: none
  std::chrono::steady_clock::time_point recovering_since_{};
};

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE
monitored_training_session::monitored_training_session(graph& g, monitored_session_options o)
    : graph_(g), o_(std::move(o)) {
  auto gs = get_global_step(g);
  if (!gs)
    throw failed_precondition_error("monitored_training_session: the graph has no global step "
                                    "(create one with create_global_step)");
  global_step_ = gs->id();
  hooks_ = o_.hooks;
  if (o_.is_chief) {
    hooks_.insert(hooks_.end(), o_.chief_only_hooks.begin(), o_.chief_only_hooks.end());
    if (!o_.checkpoint_dir.empty()) {
      std::error_code ec; // TF creates the directory too
      std::filesystem::create_directories(o_.checkpoint_dir, ec);
      if (ec)
        throw failed_precondition_error("monitored_training_session: cannot create the "
                                        "checkpoint directory " +
                                        o_.checkpoint_dir + ": " + ec.message());
      const saver_options so{.max_to_keep = o_.max_checkpoints_to_keep,
                             .sharded = o_.sharded_checkpoints,
                             .format = o_.checkpoint_format};
      const checkpoint_options co{.dir = o_.checkpoint_dir,
                                  .secs = o_.save_checkpoint_secs,
                                  .steps = o_.save_checkpoint_steps,
                                  .increment_secs = o_.save_increment_secs,
                                  .increment_steps = o_.save_increment_steps};
      if (o_.save_increment_secs > 0 || o_.save_increment_steps > 0)
        hooks_.push_back(
            std::make_shared<checkpoint_saver_hook>(incremental_saver_.emplace(g, so), co));
      else
        hooks_.push_back(std::make_shared<checkpoint_saver_hook>(saver_.emplace(g, so), co));
    }
    const std::string& summary_dir = o_.summary_dir.empty() ? o_.checkpoint_dir : o_.summary_dir;
    if (!summary_dir.empty() && !g.collection(collection::summaries).empty() &&
        (o_.save_summaries_steps > 0 || o_.save_summaries_secs > 0))
      hooks_.push_back(std::make_shared<summary_saver_hook>(
          summary_saver_options{.logdir = summary_dir,
                                .every_n_steps = o_.save_summaries_steps,
                                .every_n_secs = o_.save_summaries_secs,
                                .examples_per_global_step = o_.examples_per_global_step}));
  }
  for (auto& h : hooks_)
    h->begin(g);
  // Built once, before the first session, so the graph stays as registered.
  {
    auto lifted = detail::lifted_scope(g);
    init_ = global_variables_initializer(g).id();
    local_init_ = local_variables_initializer(g).id();
    for (node_id v : g.collection(collection::global_variables)) {
      ready_vars_.push_back(v);
      ready_checks_.push_back(g.add_node("is_variable_initialized", {v}));
    }
    done_ = g.add_node("counter_add", {global_step_, detail::scalar_node(g, std::int64_t{1})},
                       {{"counter", std::string("workers_done")}}, "worker_done");
    done_count_ = g.add_node("counter_add", {global_step_, detail::scalar_node(g, std::int64_t{0})},
                             {{"counter", std::string("workers_done")}}, "workers_done");
    // Wakes the moment the last worker counts itself done; it gives up
    // after one check interval, so that the chief can look who is gone.
    all_done_ = g.add_node("counter_wait",
                           {global_step_, detail::scalar_node(g, std::int64_t{o_.num_workers - 1})},
                           {{"counter", std::string("workers_done")},
                            {"timeout_ms", static_cast<std::int64_t>(check_interval().count())}},
                           "all_workers_done");
  }
  create_session_recovering();
}

LOOM_COMPILED_ONCE void monitored_training_session::close() {
  if (closed_)
    return;
  closed_ = true;
  closing_ = true;
  recovering("closing (the hooks' end)", [&] {
    for (auto& h : hooks_)
      h->end(*session_, global_step_value_);
  });
  recovering("closing (stopping the update loop)", [&] {
    if (auto loop = std::move(chief_loop_))
      loop->stop(session_.get());
  });
  recovering("closing (counting this worker done)", [&] { session_->run_nodes({}, {done_}); });
  if (!o_.is_chief || !o_.shutdown_cluster)
    return;
  if (o_.num_workers > 1)
    recovering("closing (waiting for the other workers)", [&] { wait_for_other_workers(); });
  std::int64_t final_step = 0;
  recovering("closing (reading the final global step)", [&] {
    final_step = *session_->run_nodes({global_step_}, {}).front().data<std::int64_t>();
  });
  say(logging::level::info, "final global step %lld; shutting the ps tasks down",
      static_cast<long long>(final_step));
  // The other workers exit on their own once they are done; the ps tasks
  // serve until told.
  session::shutdown_cluster(o_.master, o_.shutdown_jobs, o_.config);
}

LOOM_COMPILED_ONCE void monitored_training_session::say(logging::level level, const char* format,
                                                        ...) const noexcept {
  if (!logging::enabled(level))
    return;
  try {
    std::va_list args;
    va_start(args, format);
    const int n = std::vsnprintf(nullptr, 0, format, args);
    va_end(args);
    std::string line = o_.label + ": ";
    if (n > 0) {
      const std::size_t at = line.size();
      line.resize(at + static_cast<std::size_t>(n) + 1);
      va_start(args, format);
      std::vsnprintf(line.data() + at, static_cast<std::size_t>(n) + 1, format, args);
      va_end(args);
      line.pop_back(); // vsnprintf's '\0'
    }
    logging::write(level, line);
  } catch (...) {
  }
}

LOOM_COMPILED_ONCE void monitored_training_session::wait_for_other_workers() {
  using clock = std::chrono::steady_clock;
  say(logging::level::info, "waiting for the other %d worker(s) to finish", o_.num_workers - 1);
  const auto deadline = clock::now() + o_.shutdown_wait;
  constexpr auto never = clock::time_point::max();
  auto none_answer_since = never; // when no other worker answered first, of late
  for (;;) {
    try {
      session_->run_nodes({all_done_}, {}); // returns when every worker is done
      return;
    } catch (const deadline_exceeded_error&) { // one check interval passed
    }
    const auto now = clock::now();
    const auto done_so_far = [&] {
      return static_cast<long long>(
          *session_->run_nodes({done_count_}, {}).front().data<std::int64_t>());
    };
    if (now >= deadline) {
      say(logging::level::warn,
          "%lld of %d worker(s) finished within shutdown_wait (%lld ms); "
          "shutting down anyway",
          done_so_far(), o_.num_workers, static_cast<long long>(o_.shutdown_wait.count()));
      return;
    }
    std::vector<std::string> gone;
    if (other_workers_answering(gone) > 0) {
      none_answer_since = never;
    } else if (none_answer_since == never) {
      none_answer_since = now;
    } else if (now - none_answer_since >= o_.recovery_wait) {
      std::string names;
      for (const auto& g : gone)
        names += (names.empty() ? "" : "; ") + g;
      say(logging::level::warn,
          "%lld of %d worker(s) finished and no other worker answers (%s): "
          "not waiting for the rest",
          done_so_far(), o_.num_workers, names.empty() ? "none left" : names.c_str());
      return;
    }
  }
}

LOOM_COMPILED_ONCE int
monitored_training_session::other_workers_answering(std::vector<std::string>& gone) const {
  cluster_session_options probe = o_.config;
  probe.connect_timeout = std::chrono::seconds(2);
  const ping_report r = session::ping_cluster(o_.master, {}, probe);
  const auto is_worker = [&](const std::string& entry) { // "<task>" or "<task>: <why>"
    const auto job = device_spec::from_string(entry.substr(0, entry.find(": "))).job();
    return std::find(o_.shutdown_jobs.begin(), o_.shutdown_jobs.end(), *job) ==
           o_.shutdown_jobs.end();
  };
  int answering = 0;
  for (const auto& t : r.answered)
    answering += is_worker(t);
  for (const auto& t : r.unreachable)
    if (is_worker(t))
      gone.push_back(t);
  return answering - 1; // this chief answered too (its server is the target)
}

LOOM_COMPILED_ONCE void monitored_training_session::prepare_recovery(const error& e,
                                                                     const char* what) {
  using clock = std::chrono::steady_clock;
  const auto now = clock::now();
  if (attempts_ == 0)
    recovering_since_ = now;
  if (!recoverable(e) ||
      (o_.recovery_deadline.count() > 0 && now - recovering_since_ >= o_.recovery_deadline)) {
    if (recoverable(e)) {
      say(logging::level::error, "recovery %d did not succeed within recovery_deadline (%lld ms)",
          recoveries_, static_cast<long long>(o_.recovery_deadline.count()));
    }
    give_up(e, what);
    throw;
  }
  ++attempts_;
  auto wait = o_.recovery_wait;
  for (int i = 1; i < attempts_ && wait < o_.max_recovery_wait; ++i)
    wait *= 2;
  wait = std::min(wait, std::max(o_.max_recovery_wait, o_.recovery_wait));
  if (attempts_ == 1) {
    ++recoveries_;
    say(logging::level::warn, "%s failed (%s); recreating the session (recovery %d)", what,
        e.what(), recoveries_);
  } else if ((attempts_ & (attempts_ - 1)) == 0) {
    say(logging::level::warn,
        "%s failed again (%s); recovery %d goes on (%d attempts in %.0f s, the "
        "next in %lld ms)",
        what, e.what(), recoveries_, attempts_,
        std::chrono::duration<double>(now - recovering_since_).count(),
        static_cast<long long>(wait.count()));
  }
  std::this_thread::sleep_for(wait);
}

LOOM_COMPILED_ONCE void monitored_training_session::give_up(const error& e,
                                                            const char* what) noexcept {
  if (!o_.is_chief)
    return;
  try {
    if (!o_.shutdown_cluster) {
      say(logging::level::error,
          "%s failed for good (%s); the ps tasks still serve: stop them with "
          "loom::session::shutdown_cluster(\"%s\", {\"ps\"}) or by ending their "
          "processes",
          what, e.what(), o_.master.c_str());
      return;
    }
    say(logging::level::error, "%s failed for good (%s); shutting the ps tasks down", what,
        e.what());
    session::shutdown_cluster(o_.master, o_.shutdown_jobs, o_.config);
    // The update loop ends as its ps goes; nothing is run on the ps again
    // (its close op would only dial a task that is gone).
    if (auto loop = std::move(chief_loop_)) {
      try {
        loop->stop(nullptr);
      } catch (...) { // the ps stopped under it
      }
    }
  } catch (const std::exception& x) {
    say(logging::level::error, "could not shut the ps tasks down (%s); they may still serve",
        x.what());
  }
}

LOOM_COMPILED_ONCE void monitored_training_session::create_session() {
  if (chief_loop_) {
    try {
      chief_loop_->stop(nullptr);
    } catch (...) { // the failure that brought us here
    }
    chief_loop_.reset();
  }
  session_.reset();
  session_ = std::make_unique<session>(graph_, session_target{o_.master}, o_.config);
  if (o_.is_chief)
    prepare();
  else
    wait_until_ready();
  session_->run_nodes({}, {local_init_});
  if (o_.sync_replicas) {
    // The chief's reset comes first, so that its own local step and epoch
    // are the new ones. While closing, the loop is not started again, and
    // workers still waiting for an update are released instead.
    if (o_.is_chief && !closing_)
      session_->run_nodes({}, {o_.sync_replicas->reset_op().id()});
    session_->run_nodes({}, {o_.sync_replicas->local_step_init_op().id()});
    if (o_.is_chief && closing_)
      session_->run_nodes({}, {o_.sync_replicas->release_all_op().id()});
    else if (o_.is_chief)
      chief_loop_ = std::make_unique<sync_replicas_chief>(*o_.sync_replicas, graph_,
                                                          session_target{o_.master}, o_.config);
  }
  global_step_value_ = *session_->run_nodes({global_step_}, {}).front().data<std::int64_t>();
  for (auto& h : hooks_)
    h->after_create_session(*session_, global_step_value_);
}

LOOM_COMPILED_ONCE void monitored_training_session::prepare() {
  if (uninitialized_variables().empty()) {
    say(logging::level::info,
        "every global variable is initialized on the ps tasks (global step %lld): "
        "joining them, not restoring or initializing",
        static_cast<long long>(
            *session_->run_nodes({global_step_}, {}).front().data<std::int64_t>()));
    // The chief's own input, though, restarts with it: it goes on from the latest
    // checkpoint's position (train/state_checkpoint.hpp).
    if (const auto latest = full_saver() && !graph_.collection(collection::iterators).empty()
                                ? latest_checkpoint(o_.checkpoint_dir)
                                : std::nullopt) {
      full_saver()->restore_iterators(*session_, *latest); // an increment holds them too
      say(logging::level::info, "the input goes on from %s", latest->c_str());
    }
    return;
  }
  if (full_saver()) {
    const checkpoint_to_restore found =
        find_checkpoint_to_restore(o_.checkpoint_dir, o_.initialize_over_damaged_checkpoints);
    if (!found.note.empty()) {
      say(logging::level::warn, "%s", found.note.c_str());
    }
    if (!found.path.empty()) {
      if (incremental_saver_)
        incremental_saver_->restore(*session_, found.path);
      else
        saver_->restore(*session_, found.path);
      if (!found.intact.empty()) { // max_to_keep goes on from them
        if (incremental_saver_)
          incremental_saver_->recover_last_checkpoints(found.intact);
        else
          saver_->recover_last_checkpoints(found.intact);
        write_checkpoint_state(o_.checkpoint_dir, found.intact);
      }
      say(logging::level::info, "restored %s", found.path.c_str());
      return;
    }
  }
  session_->run_nodes({}, {init_});
  say(logging::level::info, "initialized the variables");
}

LOOM_COMPILED_ONCE auto monitored_training_session::uninitialized_variables()
    -> std::vector<std::string> {
  std::vector<any_tensor> ready = session_->run_nodes(ready_checks_, {});
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < ready.size(); ++i)
    if (!*ready[i].data<bool>())
      missing.push_back(graph_.node(ready_vars_[i]).name);
  return missing;
}

LOOM_COMPILED_ONCE void monitored_training_session::wait_until_ready() {
  const auto deadline = std::chrono::steady_clock::now() + o_.ready_timeout;
  for (;;) {
    const std::vector<std::string> missing = uninitialized_variables();
    if (missing.empty())
      return;
    if (std::chrono::steady_clock::now() >= deadline)
      throw deadline_exceeded_error(o_.label + ": the chief did not initialize " +
                                    std::to_string(missing.size()) + " variable(s) (" +
                                    missing.front() + ", ...) within " +
                                    std::to_string(o_.ready_timeout.count()) + " ms");
    std::string list;
    for (std::size_t i = 0; i < missing.size() && i < 4; ++i)
      list += (i ? ", " : "") + missing[i];
    if (missing.size() > 4)
      list += ", ...";
    say(logging::level::info, "waiting for the chief to initialize %zu variable(s): %s",
        missing.size(), list.c_str());
    std::this_thread::sleep_for(o_.recovery_wait);
  }
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

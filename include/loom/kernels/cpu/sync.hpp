// CPU kernels of the synchronous-replica state (graph/ops/sync.hpp): a
// gradient accumulator and an int64 counter, each a resource beside a
// variable. Waiting kernels sleep on the resource's condition variable and
// wake on the event they wait for, on their step's abort, or at their
// timeout_ms attr (0: none); they never poll.
#pragma once

#include <loom/graph/ops/array.hpp>
#include <loom/graph/ops/sync.hpp>
#include <loom/kernels/cpu/parallel_for.hpp>
#include <loom/kernels/registry.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace loom::kernels {

// What the accumulators of one variable's gradients share (TF's
// ConditionalAccumulatorBase): a gradient computed at a local step older
// than the accumulator's step is stale and dropped; a take waits for
// num_required fresh gradients.
struct accumulator_state : resource_base {
  std::mutex mu;
  std::condition_variable cv;
  std::int64_t count = 0;
  std::int64_t step = 0;    // gradients of local steps below this are stale
  std::int64_t dropped = 0; // stale gradients seen, for logs and tests
  // close_accumulator and reset_accumulator calls: each ends the take waiting.
  std::uint64_t closes = 0;
  // Since a close_accumulator (until a reset_accumulator): every take fails at
  // once, so a chief that stops needs one close however its loop is placed (a
  // close that came before the loop's next take ends that take too).
  bool closed = false;
  // Since a reset_accumulator, whose step is the chief's global step, only
  // that step's gradients are fresh: a later one was computed before the reset
  // (variables restored to an older step), its worker's barrier_wait fails.
  bool reset = false;

  // Under mu: whether a gradient of local_step counts (a stale one is
  // counted as dropped).
  bool fresh(std::int64_t local_step) {
    if (local_step == step || (local_step > step && !reset))
      return true;
    ++dropped;
    return false;
  }
  // Under mu, when a take has its gradients: the accumulator moves on, so
  // gradients of this step that arrive later are stale.
  void taken(std::int64_t global_step) {
    count = 0;
    step = std::max(step, global_step + 1);
  }
};

// Sums dense gradients (TF's ConditionalAccumulator).
struct gradient_accumulator : accumulator_state {
  any_tensor sum;
  void clear() { sum = {}; }
};

// Sums gradients of rows (TF's SparseConditionalAccumulator): per id, the sum
// of its rows and how many gradients touched it; a take returns each row's
// mean over those gradients (TF averages element-wise, not over all of them),
// the ids ascending.
template <class T> struct sparse_gradient_accumulator : accumulator_state {
  std::unordered_map<std::int64_t, std::size_t> slot_of; // id -> its row in rows
  std::vector<std::int64_t> ids;
  std::vector<std::int64_t> touches;    // gradients that touched each id
  std::vector<std::int64_t> last_touch; // the gradient (count + 1) that last did
  std::vector<T> rows;
  std::int64_t width = 0;              // elements per row (the variable's)
  std::vector<std::int64_t> taken_ids; // of the last take, for sparse_gradient_indices
  void clear() {
    slot_of.clear();
    ids.clear();
    touches.clear();
    last_touch.clear();
    rows.clear();
  }
};

// An int64 that steps raise and wait on: the barrier of synchronous replicas
// (the latest global step whose update was applied) and similar counts.
struct step_counter : resource_base {
  std::mutex mu;
  std::condition_variable cv;
  std::int64_t value = 0;
  // As a barrier: barrier_reset calls so far; a worker's wait of another
  // epoch began before the chief reset the barrier and the accumulators.
  std::int64_t epoch = 0;
  // The workers that reached the barrier at each local step not yet passed
  // (a worker waits once its step's gradients are sent; unnamed ones are
  // counted), and every worker that ever reached it: what a barrier's
  // timeout names as missing.
  struct arrivals {
    std::int64_t unnamed = 0;
    std::set<std::string> named;
  };
  std::map<std::int64_t, arrivals> arrived;
  std::set<std::string> seen;
};

// Registers for the step's abort while a kernel waits on (mu, cv). Construct
// it before locking mu: it is destroyed after the lock is released, because
// the abort callback takes mu (see step_cancellation).
class abort_watch {
public:
  abort_watch(kernel_context& c, std::mutex& mu, std::condition_variable& cv)
      : cancellation_(c.cancellation) {
    if (cancellation_)
      id_ = cancellation_->on_abort([this, &mu, &cv](const std::string& why) {
        {
          std::lock_guard lock(mu);
          reason_ = why;
        }
        cv.notify_all();
      });
  }
  ~abort_watch() {
    if (cancellation_ && id_)
      cancellation_->forget(id_);
  }
  abort_watch(const abort_watch&) = delete;
  abort_watch& operator=(const abort_watch&) = delete;

  // Read under mu.
  const std::optional<std::string>& reason() const noexcept { return reason_; }

private:
  step_cancellation* cancellation_;
  std::uint64_t id_ = 0;
  std::optional<std::string> reason_;
};

// Waits under `lock` until ready() holds; throws if the step is aborted or the
// node's timeout_ms passes first. what() says what it waits for, for errors
// (called under `lock` when one is thrown, so it may say how far things got).
template <class Ready, class What>
void wait_for(kernel_context& c, const abort_watch& watch, std::unique_lock<std::mutex>& lock,
              std::condition_variable& cv, Ready ready, What what) {
  const auto timeout = std::chrono::milliseconds(c.node.attr_or<std::int64_t>("timeout_ms", 0));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!ready()) {
    if (watch.reason())
      throw aborted_error("node " + c.node.describe() + " stopped waiting for " + what() + ": " +
                          *watch.reason());
    if (timeout.count() <= 0) {
      cv.wait(lock);
    } else if (cv.wait_until(lock, deadline) == std::cv_status::timeout && !ready()) {
      throw deadline_exceeded_error("node " + c.node.describe() + " waited " +
                                    std::to_string(timeout.count()) + " ms for " + what());
    }
  }
}

template <class R> std::shared_ptr<R> attached_resource(kernel_context& c) {
  return c.resources.resource<R>(c.node.attr<std::string>("resource_container"),
                                 c.node.attr<std::string>("resource_name"));
}

// Another resource beside the same variable: the node's attached one is named
// "<variable>/<attached>" (attach_to_variable), this one "<variable>/<suffix>".
template <class R>
std::shared_ptr<R> sibling_resource(kernel_context& c, const std::string& attached,
                                    const std::string& suffix) {
  const std::string& name = c.node.attr<std::string>("resource_name");
  if (!name.ends_with("/" + attached))
    throw internal_error("node " + c.node.describe() + ": resource " + name + " is not a '" +
                         attached + "'");
  return c.resources.resource<R>(c.node.attr<std::string>("resource_container"),
                                 name.substr(0, name.size() - attached.size()) + suffix);
}

// Waits under `lock` until `acc` holds the node's num_required gradients;
// throws cancelled if the accumulator is closed first (and as wait_for does).
inline void await_gradients(kernel_context& c, const abort_watch& watch,
                            std::unique_lock<std::mutex>& lock, accumulator_state& acc,
                            const char* kind) {
  const auto required = c.node.attr_or<std::int64_t>("num_required", 1);
  const std::uint64_t closes = acc.closes;
  wait_for(
      c, watch, lock, acc.cv,
      [&] { return acc.closed || acc.count >= required || acc.closes != closes; },
      [&] {
        return std::to_string(required) + " " + kind + " of step " + std::to_string(acc.step) +
               " for variable '" + c.node.attr_or<std::string>("_ref_name_0", "?") + "'";
      });
  if (acc.closed || acc.count < required)
    throw cancelled_error("node " + c.node.describe() + ": the accumulator was closed");
}

template <class T> struct accumulate_gradient_cpu {
  static void run(kernel_context& c) {
    auto acc = attached_resource<gradient_accumulator>(c);
    const any_tensor& grad = c.input(1);
    const std::int64_t local_step = *c.input(2).data<std::int64_t>();
    std::lock_guard lock(acc->mu);
    if (!acc->fresh(local_step))
      return;
    if (acc->count == 0) {
      // A gradient received for this step and held by nothing else becomes
      // the sum as it is: no copy of its bytes per worker step.
      acc->sum = c.may_forward(1) ? grad : grad.clone();
    } else {
      if (grad.shape() != acc->sum.shape())
        throw invalid_argument_error("node " + c.node.describe() + ": gradient of shape " +
                                     grad.shape().to_string() + ", the accumulator holds " +
                                     acc->sum.shape().to_string());
      const auto n = static_cast<Eigen::DenseIndex>(grad.num_elements());
      chunk_map<T>(acc->sum.data<T>(), n) += chunk_map<const T>(grad.data<T>(), n);
    }
    ++acc->count;
    acc->cv.notify_all();
  }
};

template <class T> struct take_gradient_cpu {
  static void run(kernel_context& c) {
    auto acc = attached_resource<gradient_accumulator>(c);
    const std::int64_t global_step = *c.input(1).data<std::int64_t>();
    abort_watch watch(c, acc->mu, acc->cv);
    {
      std::unique_lock lock(acc->mu);
      await_gradients(c, watch, lock, *acc, "gradients");
      any_tensor mean = std::move(acc->sum);
      const auto n = static_cast<Eigen::DenseIndex>(mean.num_elements());
      chunk_map<T>(mean.data<T>(), n) =
          chunk_map<T>(mean.data<T>(), n) / static_cast<T>(acc->count);
      acc->clear();
      acc->taken(global_step);
      c.output = std::move(mean);
    }
  }
};

template <class T> struct accumulate_sparse_gradient_cpu {
  static void run(kernel_context& c) {
    auto acc = attached_resource<sparse_gradient_accumulator<T>>(c);
    const any_tensor& values = c.input(1);
    const any_tensor& indices = c.input(2);
    const std::int64_t local_step = *c.input(3).data<std::int64_t>();
    const auto n = static_cast<std::int64_t>(indices.num_elements());
    // The variable's shape, not the gradient's, says how wide a row is: a
    // gradient of no rows (a batch with no id in this shard) is still one.
    const loom::shape var_shape = variable_shape(c);
    const std::int64_t rows = var_shape.dim(0);
    const std::int64_t width = rows == 0 ? 0 : var_shape.num_elements() / rows;
    if (!(values.shape() == detail::gathered_shape(var_shape, indices.shape(), 0)))
      throw invalid_argument_error(
          "node " + c.node.describe() + ": rows of shape " + values.shape().to_string() +
          " do not match ids of shape " + indices.shape().to_string() + " into variable '" +
          c.node.attr_or<std::string>("_ref_name_0", "?") + "' of shape " + var_shape.to_string());
    std::lock_guard lock(acc->mu);
    if (!acc->fresh(local_step))
      return;
    acc->width = width;
    const T* v = values.data<T>();
    visit_ids(indices, [&](auto* id) {
      // Every id checked before any row is added: a bad gradient leaves the
      // sum as it was.
      for (std::int64_t i = 0; i < n; ++i)
        if (id[i] < 0 || static_cast<std::int64_t>(id[i]) >= rows)
          throw invalid_argument_error("node " + c.node.describe() + ": id " +
                                       std::to_string(id[i]) + " is outside variable '" +
                                       c.node.attr_or<std::string>("_ref_name_0", "?") +
                                       "' (rows 0 to " + std::to_string(rows - 1) + ")");
      for (std::int64_t i = 0; i < n; ++i) {
        const auto row = static_cast<std::int64_t>(id[i]);
        auto [it, fresh] = acc->slot_of.try_emplace(row, acc->ids.size());
        if (fresh) {
          acc->ids.push_back(row);
          acc->touches.push_back(0);
          acc->last_touch.push_back(0);
          acc->rows.resize(acc->rows.size() + static_cast<std::size_t>(width), T(0));
        }
        // A gradient counts once for each id it names, however often it does.
        if (acc->last_touch[it->second] != acc->count + 1) {
          acc->last_touch[it->second] = acc->count + 1;
          ++acc->touches[it->second];
        }
        T* dst = acc->rows.data() + it->second * static_cast<std::size_t>(width);
        for (std::int64_t j = 0; j < width; ++j)
          dst[j] += v[i * width + j];
      }
    });
    ++acc->count;
    acc->cv.notify_all();
  }

  // The shape of the variable the gradient is of (its value's: the static
  // shape may say less).
  static loom::shape variable_shape(kernel_context& c) {
    variable_resource& var = *c.refs[0];
    std::lock_guard lock(var.mu);
    if (!var.initialized)
      throw failed_precondition_error("node " + c.node.describe() + ": variable '" +
                                      c.node.attr_or<std::string>("_ref_name_0", "?") +
                                      "' is not initialized");
    if (var.value.rank() < 1)
      throw invalid_argument_error("node " + c.node.describe() + ": variable '" +
                                   c.node.attr_or<std::string>("_ref_name_0", "?") +
                                   "' is a scalar; a sparse gradient has rows");
    return var.value.shape();
  }

  // Calls f with the indices' elements as int32 or int64.
  template <class F> static void visit_ids(const any_tensor& t, F&& f) {
    if (t.type() == dtype::i32)
      f(t.data<std::int32_t>());
    else
      f(t.data<std::int64_t>());
  }
};

template <class T> struct take_sparse_gradient_cpu {
  static void run(kernel_context& c) {
    auto acc = attached_resource<sparse_gradient_accumulator<T>>(c);
    const std::int64_t global_step = *c.input(1).data<std::int64_t>();
    abort_watch watch(c, acc->mu, acc->cv);
    std::unique_lock lock(acc->mu);
    await_gradients(c, watch, lock, *acc, "sparse gradients");
    // Each row's mean, ids ascending.
    std::vector<std::size_t> order(acc->ids.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return acc->ids[a] < acc->ids[b]; });
    // Rows as wide as the take's static shape says (the variable's).
    std::int64_t row_elements = 1;
    for (std::size_t d = 1; d < c.node.shape.dims().size(); ++d)
      row_elements *= c.node.shape.dims()[d];
    if (!acc->ids.empty() && acc->width != row_elements)
      throw internal_error("node " + c.node.describe() + ": the accumulator holds rows of " +
                           std::to_string(acc->width) + " elements, the variable's have " +
                           std::to_string(row_elements));
    const auto width = static_cast<std::size_t>(row_elements);
    std::vector<std::int64_t> dims(c.node.shape.dims().begin(), c.node.shape.dims().end());
    dims[0] = static_cast<std::int64_t>(order.size());
    any_tensor mean(dtype_of<T>, shape(std::move(dims)));
    T* out = mean.data<T>();
    acc->taken_ids.resize(order.size());
    for (std::size_t k = 0; k < order.size(); ++k) {
      const std::size_t s = order[k];
      acc->taken_ids[k] = acc->ids[s];
      const T* src = acc->rows.data() + s * width;
      const T touches = static_cast<T>(acc->touches[s]);
      for (std::size_t j = 0; j < width; ++j)
        out[k * width + j] = src[j] / touches;
    }
    acc->clear();
    acc->taken(global_step);
    c.output = std::move(mean);
  }
};

template <class T> struct sparse_gradient_indices_cpu {
  static void run(kernel_context& c) {
    auto acc = attached_resource<sparse_gradient_accumulator<T>>(c);
    std::lock_guard lock(acc->mu);
    any_tensor ids(dtype::i64, shape{static_cast<std::int64_t>(acc->taken_ids.size())});
    std::copy(acc->taken_ids.begin(), acc->taken_ids.end(), ids.data<std::int64_t>());
    c.output = std::move(ids);
  }
};

template <class T> struct close_accumulator_cpu {
  static void run(kernel_context& c) {
    std::shared_ptr<accumulator_state> acc;
    if (c.node.attr_or<bool>("sparse", false))
      acc = attached_resource<sparse_gradient_accumulator<T>>(c);
    else
      acc = attached_resource<gradient_accumulator>(c);
    {
      std::lock_guard lock(acc->mu);
      ++acc->closes;
      acc->closed = true;
    }
    acc->cv.notify_all();
  }
};

template <class T> struct reset_accumulator_cpu {
  static void run(kernel_context& c) {
    const std::int64_t step = *c.input(1).data<std::int64_t>();
    const auto reset = [&](auto& acc) {
      {
        std::lock_guard lock(acc.mu);
        acc.clear();
        acc.count = 0;
        acc.step = step;
        acc.reset = true;
        acc.closed = false;
        ++acc.closes; // a take still waiting (its chief is gone) ends
      }
      acc.cv.notify_all();
    };
    if (c.node.attr_or<bool>("sparse", false))
      reset(*attached_resource<sparse_gradient_accumulator<T>>(c));
    else
      reset(*attached_resource<gradient_accumulator>(c));
  }
};

// The update barrier of synchronous replicas (step_counter as a barrier).
template <class T> struct barrier_cpu {
  static void run(kernel_context& c) {
    auto barrier = attached_resource<step_counter>(c);
    const std::string& op = c.node.op;
    std::int64_t out;
    if (op == "barrier_wait") {
      out = wait(c, *barrier);
    } else if (op == "barrier_reset") {
      {
        std::lock_guard lock(barrier->mu);
        barrier->value = *c.input(1).data<std::int64_t>();
        barrier->arrived.clear();
        out = ++barrier->epoch;
      }
      barrier->cv.notify_all(); // every waiter of the old epoch fails
    } else {
      std::lock_guard lock(barrier->mu);
      out = barrier->epoch;
    }
    c.output = any_tensor::scalar(out);
  }

  static std::int64_t wait(kernel_context& c, step_counter& b) {
    const std::int64_t local_step = *c.input(1).data<std::int64_t>();
    const std::int64_t epoch = *c.input(2).data<std::int64_t>();
    const auto replica = c.node.attr_or<std::string>("replica", "");
    abort_watch watch(c, b.mu, b.cv);
    std::unique_lock lock(b.mu);
    const auto reset_since = [&] {
      return aborted_error(
          "node " + c.node.describe() + ": the chief reset the update barrier to step " +
          std::to_string(b.value) + " (it restarted or restored a checkpoint) after this " +
          "worker's session began (barrier epoch " + std::to_string(epoch) + ", now " +
          std::to_string(b.epoch) + "): the gradients of its step " + std::to_string(local_step) +
          " may be lost; the session starts again from the chief's step");
    };
    if (b.epoch != epoch)
      throw reset_since();
    b.arrived.erase(b.arrived.begin(), b.arrived.lower_bound(b.value)); // steps passed
    if (replica.empty()) {
      ++b.arrived[local_step].unnamed;
    } else {
      b.arrived[local_step].named.insert(replica);
      b.seen.insert(replica);
    }
    wait_for(
        c, watch, lock, b.cv, [&] { return b.value > local_step || b.epoch != epoch; },
        [&] { return missing_for(c, b, local_step); });
    if (b.epoch != epoch)
      throw reset_since();
    return b.value;
  }

  // Under b.mu: what the update of `step` still waits for. The workers that
  // reached the barrier at `step` have sent its gradients; the others that
  // ever reached it have not (one that never did has no name here).
  static std::string missing_for(kernel_context& c, const step_counter& b, std::int64_t step) {
    const auto required = c.node.attr_or<std::int64_t>("replicas_to_aggregate", 1);
    const auto at = b.arrived.find(step);
    const std::set<std::string> sent =
        at == b.arrived.end() ? std::set<std::string>{} : at->second.named;
    const std::int64_t arrived =
        static_cast<std::int64_t>(sent.size()) + (at == b.arrived.end() ? 0 : at->second.unnamed);
    const auto list = [](const std::set<std::string>& names) {
      std::string out;
      for (const auto& n : names)
        out += (out.empty() ? "" : ", ") + n;
      return out;
    };
    std::string what = "the update of step " + std::to_string(step) + ": the gradients of " +
                       std::to_string(arrived) + " of the " + std::to_string(required) +
                       " replica(s) it aggregates arrived" +
                       (sent.empty() ? "" : " (from " + list(sent) + ")");
    if (arrived >= required)
      return what + ", and the chief's update loop has not applied them (is the chief running?)";
    std::set<std::string> not_sent;
    for (const auto& w : b.seen)
      if (!sent.count(w))
        not_sent.insert(w);
    if (!not_sent.empty())
      return what + "; not sent: " + list(not_sent) + " (is it running?)";
    return what + "; no other worker has reached this barrier yet (is each running?)";
  }
};

template <class T> struct counter_cpu {
  static void run(kernel_context& c) {
    auto counter = attached_resource<step_counter>(c);
    const std::int64_t v = *c.input(1).data<std::int64_t>();
    const std::string& op = c.node.op;
    std::int64_t now;
    if (op == "counter_wait") {
      abort_watch watch(c, counter->mu, counter->cv);
      std::unique_lock lock(counter->mu);
      wait_for(
          c, watch, lock, counter->cv, [&] { return counter->value > v; },
          [&] {
            return "counter '" + c.node.attr<std::string>("resource_name") + "' to pass " +
                   std::to_string(v) + " (it is " + std::to_string(counter->value) + ")";
          });
      now = counter->value;
    } else {
      {
        std::lock_guard lock(counter->mu);
        counter->value = op == "counter_add" ? counter->value + v : std::max(counter->value, v);
        now = counter->value;
      }
      counter->cv.notify_all();
    }
    c.output = any_tensor::scalar(now);
  }
};

template <class T> struct is_variable_initialized_cpu {
  static void run(kernel_context& c) {
    variable_resource& v = *c.refs[0];
    std::lock_guard lock(v.mu);
    c.output = any_tensor::scalar(v.initialized);
  }
};

// In a program that links loom::kernels, registered in its unit only (kernels/registry.hpp).
#ifndef LOOM_COMPILED_KERNELS
inline bool register_sync_kernels() {
  register_kernels<accumulate_gradient_cpu>("accumulate_gradient", floating_types{});
  register_kernels<take_gradient_cpu>("take_gradient", floating_types{});
  register_kernels<close_accumulator_cpu>("close_accumulator", floating_types{});
  register_kernels<accumulate_sparse_gradient_cpu>("accumulate_sparse_gradient", floating_types{});
  register_kernels<take_sparse_gradient_cpu>("take_sparse_gradient", floating_types{});
  register_kernels<sparse_gradient_indices_cpu>("sparse_gradient_indices", floating_types{});
  register_kernels<reset_accumulator_cpu>("reset_accumulator", floating_types{});
  for (const char* op : {"counter_raise", "counter_add", "counter_wait"})
    register_kernels<counter_cpu>(op, type_list<std::int64_t>{});
  for (const char* op : {"barrier_wait", "barrier_reset", "barrier_epoch"})
    register_kernels<barrier_cpu>(op, type_list<std::int64_t>{});
  register_kernels<is_variable_initialized_cpu>("is_variable_initialized", type_list<bool>{});
  return true;
}

inline const bool sync_kernels_registered = register_sync_kernels();
#endif

} // namespace loom::kernels

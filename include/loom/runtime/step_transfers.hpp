// The remote rendezvous of a cluster task (TF's RpcRemoteRendezvous): how a
// step's _sends reach the tasks that _recv them, over the worker cache's
// remote workers, batched per destination.
#pragma once

#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/net/rpc.hpp>
#include <loom/runtime/executor.hpp>
#include <loom/runtime/protocol.hpp>
#include <loom/runtime/remote_worker.hpp>
#include <loom/runtime/rendezvous.hpp>
#include <loom/runtime/step_runners.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <future>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

namespace loom::detail {

// The rendezvous of one step on one task: _recv waits in the task's table,
// _send pushes its value to the destination task's table. Sends are held
// until the executor flushes, then go as one message per destination task:
// the ps's reads of a step's weights reach a worker in one message, and wake
// it once.
//
// A step may run on an io thread (start_plan), which must never wait for the
// network: what it waits for may need that very thread (a peer in this
// process answering a connection's handshake, or acknowledging a send). So a
// send to a task not yet connected is issued by a runner thread, which
// connects first, and sends_delivered() says without waiting whether the end
// of the step can wait for the acknowledgements here.
class step_transfers final : public step_rendezvous, private kernels::step_cancellation {
public:
  step_transfers(rendezvous_table& table, worker_cache& peers, step_runners& runners,
                 std::uint64_t step)
      : table_(table), peers_(peers), runners_(runners), step_(step) {}

  void send(const transfer_def& t, const any_tensor& value) override;

  void recv(const transfer_def& t, recv_done done) override {
    table_.recv(step_, t.key, std::move(done));
  }

  void flush() override;

  step_cancellation* cancellation() noexcept override { return this; }

  // True when every value sent in this step was delivered (or failed to be):
  // wait_sent() would not wait. Reads what has arrived; never waits.
  bool sends_delivered();
  // Waits until every value sent in this step was delivered; throws the first failure.
  void wait_sent();
  void cancel_sends() noexcept;

private:
  std::uint64_t on_abort(callback fn) override { return table_.on_abort(step_, std::move(fn)); }
  void forget(std::uint64_t id) override { table_.forget(id); }

  struct held_sends {
    std::string dst;
    protocol::rendezvous_put_request message;
    std::vector<any_tensor> payload;
  };

  rendezvous_table& table_;
  worker_cache& peers_;
  step_runners& runners_;
  std::uint64_t step_;
  std::vector<held_sends> held_; // by destination, until flush()
  std::vector<net::call_handle> sends_;
  std::vector<std::future<net::call_handle>> deferred_; // issued by a runner thread
};

} // namespace loom::detail

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom::detail {

LOOM_COMPILED_ONCE void step_transfers::send(const transfer_def& t, const any_tensor& value) {
  const std::string& dst = t.peer_task;
  auto it =
      std::find_if(held_.begin(), held_.end(), [&](const held_sends& h) { return h.dst == dst; });
  if (it == held_.end()) {
    held_.push_back({dst, {step_, {}, {}, {}}, {}});
    it = std::prev(held_.end());
  }
  const bool carries = !t.control && !value.empty();
  it->message.keys.push_back(t.key);
  it->message.carries_value.push_back(carries ? 1 : 0);
  if (carries)
    it->payload.push_back(value);
}

LOOM_COMPILED_ONCE void step_transfers::flush() {
  for (auto& h : held_) {
    remote_worker& peer = peers_.worker(h.dst);
    if (peer.connected()) {
      sends_.push_back(peer.put_tensors(std::move(h.message), std::move(h.payload)));
      continue;
    }
    auto issued = std::make_shared<std::promise<net::call_handle>>();
    deferred_.push_back(issued->get_future());
    const bool submitted =
        runners_.submit([&peer, issued, m = std::move(h.message), p = std::move(h.payload)] {
          try {
            issued->set_value(peer.put_tensors(m, p));
          } catch (...) {
            issued->set_exception(std::current_exception());
          }
        });
    if (!submitted)
      issued->set_exception(std::make_exception_ptr(
          unavailable_error("the task is stopping: a tensor for " + h.dst + " was not sent")));
  }
  held_.clear();
}

LOOM_COMPILED_ONCE bool step_transfers::sends_delivered() {
  for (auto& d : deferred_)
    if (d.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
      return false;
  return std::all_of(sends_.begin(), sends_.end(), [](net::call_handle& s) { return s.done(); });
}

LOOM_COMPILED_ONCE void step_transfers::wait_sent() {
  for (auto& d : deferred_)
    sends_.push_back(d.get());
  deferred_.clear();
  for (auto& s : sends_)
    s.get();
  sends_.clear();
}

LOOM_COMPILED_ONCE void step_transfers::cancel_sends() noexcept {
  held_.clear();
  deferred_.clear(); // a runner still sends them: the receiver drops an aborted step's values
  for (auto& s : sends_) {
    try {
      s.cancel();
    } catch (...) {
    }
  }
  sends_.clear();
}

} // namespace loom::detail

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

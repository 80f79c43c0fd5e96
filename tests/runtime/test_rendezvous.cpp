// The rendezvous of one task (runtime/rendezvous.hpp) alone, without sockets:
// a _send's tensor meets the _recv of the same (step, key) whichever comes
// first, and crosses without a copy; an aborted step or a closed task fails
// its waiting receives once, and drops what arrives later; a finished step
// leaves nothing behind. Every receive's callback runs exactly once.
#include <doctest/doctest.h>
#include <support/messages.hpp>

#include <loom/runtime/rendezvous.hpp>

#include <atomic>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using loom::any_tensor;
using loom::detail::rendezvous_table;
using loom::testing::contains;

namespace {

// What one recv's callback was called with, and how many times.
struct received {
  int calls = 0;
  any_tensor value;
  std::exception_ptr error;
  rendezvous_table::done_fn done() {
    return [this](any_tensor v, std::exception_ptr e) {
      ++calls;
      value = std::move(v);
      error = std::move(e);
    };
  }
  template <class E> std::string error_text() const {
    try {
      if (error)
        std::rethrow_exception(error);
    } catch (const E& e) {
      return e.what();
    } catch (...) {
      return "<another error>";
    }
    return "<no error>";
  }
};

any_tensor scalar(float v) {
  return any_tensor::scalar(v);
}

} // namespace

TEST_CASE("rendezvous: a value meets its recv whichever comes first, without a copy") {
  rendezvous_table table;
  any_tensor sent = scalar(1.f);
  table.put(7, "w:0->task1", sent);
  received early;
  table.recv(7, "w:0->task1", early.done());
  CHECK(early.calls == 1);
  CHECK_FALSE(early.error);
  CHECK(early.value.shares_buffer_with(sent));

  received waiting;
  table.recv(7, "b:0->task1", waiting.done());
  CHECK(waiting.calls == 0);
  table.put(7, "b:0->task1", scalar(2.f));
  CHECK(waiting.calls == 1);
  CHECK(waiting.value.data<float>()[0] == 2.f);
}

TEST_CASE("rendezvous: steps and keys are separate") {
  rendezvous_table table;
  table.put(1, "k", scalar(1.f));
  table.put(2, "k", scalar(2.f));
  table.put(1, "j", scalar(3.f));
  received a, b, c;
  table.recv(2, "k", a.done());
  table.recv(1, "j", b.done());
  table.recv(1, "k", c.done());
  CHECK(a.value.data<float>()[0] == 2.f);
  CHECK(b.value.data<float>()[0] == 3.f);
  CHECK(c.value.data<float>()[0] == 1.f);
}

TEST_CASE("rendezvous: a second value for one key in one step is an error naming both") {
  rendezvous_table table;
  table.put(3, "x:0", scalar(1.f));
  const std::string m = loom::testing::message_of<loom::already_exists_error>(
      [&] { table.put(3, "x:0", scalar(2.f)); });
  CHECK(contains(m, "a second value for key 'x:0' in step 3"));
}

TEST_CASE("rendezvous: an aborted step fails its receives once and drops later values") {
  rendezvous_table table;
  received waiting, other_step;
  table.recv(5, "a", waiting.done());
  table.recv(6, "a", other_step.done());
  int watched = 0;
  std::string watched_reason;
  table.on_abort(5, [&](const std::string& r) {
    ++watched;
    watched_reason = r;
  });
  const std::uint64_t forgotten = table.on_abort(5, [&](const std::string&) { ++watched; });
  table.forget(forgotten);

  table.abort(5, "worker 1 failed");
  CHECK(waiting.calls == 1);
  CHECK(contains(waiting.error_text<loom::aborted_error>(), "worker 1 failed"));
  CHECK(watched == 1);
  CHECK(watched_reason == "worker 1 failed");
  table.abort(5, "again"); // a second abort of the step changes nothing
  CHECK(waiting.calls == 1);
  CHECK(watched == 1);

  received late;
  table.recv(5, "b", late.done()); // a recv after the abort fails at once
  CHECK(late.calls == 1);
  CHECK(contains(late.error_text<loom::aborted_error>(), "worker 1 failed"));
  table.put(5, "c", scalar(1.f)); // a value after the abort is dropped, not kept
  received after_put;
  table.recv(5, "c", after_put.done());
  CHECK(after_put.error);

  int at_once = 0;
  CHECK(table.on_abort(5, [&](const std::string&) { ++at_once; }) == 0);
  CHECK(at_once == 1);

  CHECK(other_step.calls == 0); // step 6 goes on
  table.put(6, "a", scalar(4.f));
  CHECK(other_step.calls == 1);
  CHECK_FALSE(other_step.error);
}

TEST_CASE("rendezvous: a closed table fails every waiting and later receive as unavailable") {
  rendezvous_table table;
  received a, b;
  table.recv(1, "x", a.done());
  table.recv(2, "y", b.done());
  int watched = 0;
  table.on_abort(9, [&](const std::string&) { ++watched; });
  table.close("the task is stopping");
  CHECK(a.calls == 1);
  CHECK(b.calls == 1);
  CHECK(contains(a.error_text<loom::unavailable_error>(), "the task is stopping"));
  CHECK(watched == 1);
  received later;
  table.put(3, "z", scalar(1.f));
  table.recv(3, "z", later.done());
  CHECK(later.calls == 1);
  CHECK(contains(later.error_text<loom::unavailable_error>(), "the task is stopping"));
}

TEST_CASE("rendezvous: a finished step leaves nothing behind") {
  rendezvous_table table;
  table.put(4, "unread", scalar(1.f));
  table.end_step(4);
  received r;
  table.recv(4, "unread", r.done()); // the value left behind is gone: this one waits
  CHECK(r.calls == 0);
  table.put(4, "unread", scalar(2.f));
  CHECK(r.calls == 1);
  CHECK(r.value.data<float>()[0] == 2.f);
}

TEST_CASE("rendezvous: concurrent sends and receives deliver every value exactly once") {
  rendezvous_table table;
  constexpr int steps = 50, keys = 40;
  std::vector<std::atomic<int>> calls(steps * keys);
  std::atomic<int> wrong{0};
  auto index = [](int s, int k) { return static_cast<std::size_t>(s * keys + k); };
  std::thread sender([&] {
    for (int s = 0; s < steps; ++s)
      for (int k = 0; k < keys; ++k)
        table.put(static_cast<std::uint64_t>(s), std::to_string(k),
                  scalar(static_cast<float>(s * keys + k)));
  });
  std::thread receiver([&] {
    for (int s = 0; s < steps; ++s)
      for (int k = keys - 1; k >= 0; --k)
        table.recv(static_cast<std::uint64_t>(s), std::to_string(k),
                   [&, s, k](any_tensor v, std::exception_ptr e) {
                     calls[index(s, k)].fetch_add(1);
                     if (e || v.data<float>()[0] != static_cast<float>(s * keys + k))
                       wrong.fetch_add(1);
                   });
  });
  sender.join();
  receiver.join();
  int missing = 0;
  for (auto& c : calls)
    missing += c.load() != 1;
  CHECK(missing == 0);
  CHECK(wrong.load() == 0);
}

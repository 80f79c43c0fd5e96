// What a thread is to the reader of a step's trace: "io" (a task's message
// layer thread, where steps go on as their tensors arrive), "runner" (a task's
// thread for what may wait), "client" (the thread that called session::run).
// Set by whoever runs steps on the thread; the step tracer names the trace's
// threads by it (runtime/step_tracer.hpp).
#pragma once

namespace loom::detail {

// The calling thread's role; "thread" where nobody set one.
inline const char*& this_thread_role() noexcept {
  thread_local const char* role = "thread";
  return role;
}

} // namespace loom::detail

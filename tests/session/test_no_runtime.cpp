// A program built from <loom/api.hpp> alone, linking neither loom::kernels nor
// a unit that includes <loom/loom.hpp>: it links (the API names no runtime
// symbol), and its first session, server or cluster call fails with one line
// saying how to link the runtime, instead of crashing or finding no kernel.
#include <loom/api.hpp>

#include <doctest/doctest.h>

#include <string>

namespace {

template <class F> std::string precondition_message(F&& f) {
  try {
    f();
  } catch (const loom::failed_precondition_error& e) {
    return e.what();
  }
  return "nothing was thrown";
}

void check_says_how_to_link(const std::string& message) {
  CAPTURE(message);
  CHECK(message.find("no runtime linked in") != std::string::npos);
  CHECK(message.find("loom::kernels") != std::string::npos);
  CHECK(message.find("<loom/loom.hpp>") != std::string::npos);
}

} // namespace

TEST_CASE("without the runtime, a session, a server and a cluster call say how to link it") {
  loom::graph g;
  loom::variable<float, 0> v(g, "v", loom::shape{}, loom::zeros_initializer{});
  check_says_how_to_link(precondition_message([&] { loom::session sess(g); }));
  check_says_how_to_link(
      precondition_message([&] { loom::session sess(g, "loom://127.0.0.1:1"); }));
  check_says_how_to_link(precondition_message([] { loom::server::create_local_server(); }));
  check_says_how_to_link(precondition_message([] { loom::session::reset("loom://127.0.0.1:1"); }));
}

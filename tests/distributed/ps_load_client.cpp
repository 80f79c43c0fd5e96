// ps_load_client: one client of the ps load test (test_ps_load.cpp), a process of its own.
// It runs one role of tests/support/ps_load.hpp against a ps and prints its result line.
//
//   ps_load_client --role=increment --target=loom://127.0.0.1:PORT --seconds=3 --start_at_ms=T
//   ps_load_client --role=sessions --target=loom://127.0.0.1:PORT --count=100
//
// Exit status: 0 when it printed its result (failures are counted in it, for the test to
// judge), 1 when it could not start (no session, no channel), 2 for bad flags.
#include <support/ps_load.hpp>

#include <loom/loom.hpp>

#include <cstdio>
#include <iostream>

int main(int argc, char** argv) {
  namespace pl = loom::testing::ps_load;
  pl::role_args a;
  try {
    loom::flags flags("One client of the ps load test: runs a role against a ps.");
    flags.define_string("role", "", "increment, read, sessions or ping")
        .define_string("target", "", "The ps's target, loom://host:port")
        .define_float("seconds", 1.0, "How long increment, read and ping run")
        .define_int("start_at_ms", 0, "When they start, in ms since the Unix epoch (0: now)")
        .define_int("count", 0, "How many sessions the sessions role opens and closes");
    if (!flags.parse(argc, argv))
      return 0;
    a.role = flags.get_string("role");
    a.target = flags.get_string("target");
    a.seconds = flags.get_float("seconds");
    a.start_at_ms = flags.get_int("start_at_ms");
    a.count = static_cast<int>(flags.get_int("count"));
    if (a.target.empty())
      throw loom::invalid_argument_error("--target is required");
  } catch (const loom::error& e) {
    std::cerr << "ps_load_client: " << e.what() << "\n";
    return 2;
  }
  try {
    const pl::role_result r = pl::run_role(a);
    std::printf("%s\n", r.line().c_str());
    std::fflush(stdout);
    return 0;
  } catch (const loom::error& e) {
    std::cerr << "ps_load_client (" << a.role << "): " << e.what() << "\n";
    return 1;
  }
}

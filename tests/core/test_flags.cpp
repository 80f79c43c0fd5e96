// loom::flags, TF's tf.app.flags: the forms a command line takes, the errors a
// wrong one gets, and --help / --version.
#include <loom/core/flags.hpp>

#include <doctest/doctest.h>
#include <support/messages.hpp>

#include <sstream>
#include <string>
#include <vector>

using loom::testing::contains;
using loom::testing::message_of;

namespace {

loom::flags cluster_flags() {
  loom::flags f("Trains a model.");
  f.define_string("ps_hosts", "", "ps host:port list")
      .define_int("task_index", 0, "this task's index")
      .define_float("learning_rate", 0.01, "the step size")
      .define_bool("sync_replicas", false, "aggregate gradients");
  return f;
}

bool parse(loom::flags& f, std::vector<const char*> args, std::ostream& out) {
  args.insert(args.begin(), "trainer");
  return f.parse(static_cast<int>(args.size()), args.data(), out);
}

} // namespace

TEST_CASE("flags take --name=value, --name value and boolean forms") {
  loom::flags f = cluster_flags();
  std::ostringstream out;
  CHECK(parse(f,
              {"--ps_hosts=h:1,h:2", "--task_index", "3", "--learning_rate=0.5", "--sync_replicas"},
              out));
  CHECK(f.get_string("ps_hosts") == "h:1,h:2");
  CHECK(f.get_int("task_index") == 3);
  CHECK(f.get_float("learning_rate") == 0.5);
  CHECK(f.get_bool("sync_replicas"));
  CHECK(f.is_set("task_index"));
  loom::flags g = cluster_flags();
  CHECK(parse(g, {"--nosync_replicas"}, out));
  CHECK_FALSE(g.get_bool("sync_replicas"));
  CHECK_FALSE(g.is_set("ps_hosts"));
  CHECK(out.str().empty());
}

TEST_CASE("a wrong flag is one error naming it") {
  loom::flags f = cluster_flags();
  std::ostringstream out;
  const auto unknown =
      message_of<loom::invalid_argument_error>([&] { parse(f, {"--ps_host=h:1"}, out); });
  CHECK(contains(unknown, "unknown flag --ps_host"));
  CHECK(contains(unknown, "--ps_hosts"));
  CHECK(contains(
      message_of<loom::invalid_argument_error>([&] { parse(f, {"--task_index=two"}, out); }),
      "--task_index"));
  CHECK(contains(message_of<loom::invalid_argument_error>([&] { parse(f, {"--task_index"}, out); }),
                 "needs a value"));
  // A value left out before the next flag is that error, not the next flag as the value.
  loom::flags g = cluster_flags();
  const auto missing = message_of<loom::invalid_argument_error>([&] {
    parse(g, {"--ps_hosts", "--task_index=1"}, out);
  });
  CHECK(contains(missing, "flag --ps_hosts needs a value (the next argument, '--task_index=1', "
                          "is a flag; write --ps_hosts=VALUE)"));
  // A flag read as another type: both types named.
  CHECK(contains(message_of<loom::invalid_argument_error>([&] { (void)f.get_int("ps_hosts"); }),
                 "flag --ps_hosts is a string flag, read as an integer"));
  CHECK(
      contains(message_of<loom::invalid_argument_error>([&] { (void)f.get_bool("learning_rate"); }),
               "flag --learning_rate is a float flag, read as a boolean"));
}

TEST_CASE("--help prints the flags and --version loom's version; parse then says stop") {
  loom::flags f = cluster_flags();
  std::ostringstream help;
  CHECK_FALSE(parse(f, {"--help"}, help));
  CHECK(contains(help.str(), "Trains a model."));
  // Each flag on a line of its own, indented by two, its help below it indented by six.
  CHECK(contains(help.str(), "\n  --learning_rate (default: 0.01)\n      the step size\n"));
  CHECK(contains(help.str(), "--version"));
  std::ostringstream version;
  CHECK_FALSE(parse(f, {"--task_index=1", "--version"}, version));
  CHECK(version.str() == "trainer (loom " + std::string(loom::version()) + ")\n");
}

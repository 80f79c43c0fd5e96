// An embedding table on a ps task, trained from a worker with sparse updates:
// the lookup and the update run on the ps (the placement log says so), so a
// step moves ids and rows, never the table; only the looked-up rows change.
#include <loom/api.hpp>

#include <doctest/doctest.h>
#include <support/cluster.hpp>
#include <support/messages.hpp>

#include <cstdint>
#include <sstream>
#include <string>

using loom::shape;
using loom::tensor;
using loom::testing::contains;
using loom::testing::local_cluster;

TEST_CASE("an embedding table on the ps: lookups and sparse updates run there, only the touched "
          "rows change") {
  local_cluster cluster(1, 1);
  loom::graph g;
  constexpr std::int64_t rows = 50000, dim = 8;
  loom::placeholder<std::int64_t, 1> ids(g, shape{-1}, "ids");
  loom::placeholder<float, 2> target(g, shape{-1, dim}, "target");
  auto table = g.on("/job:ps/task:0", [&] {
    return loom::variable<float, 2>(g, "table", shape{rows, dim},
                                    loom::random_uniform_initializer{-1, 1, 7});
  });
  auto looked_up = g.on("/job:worker/task:0", [&] { return loom::gather(table, ids); });
  auto loss = g.on("/job:worker/task:0",
                   [&] { return loom::lower(loom::reduce_sum(loom::square(looked_up - target))); });
  auto train = loom::adagrad_optimizer{0.5}.minimize(loss);

  std::ostringstream placed;
  loom::cluster_session_options o = loom::testing::quiet();
  o.log_device_placement = true;
  o.placement_log = &placed;
  loom::session s(g, cluster.target(), o);
  s.run(loom::global_variables_initializer(g));
  const auto before = s.run(table);

  const tensor<std::int64_t, 1> batch(shape{4}, {49999, 3, 3, 12345});
  const tensor<float, 2> goal(shape{4, dim}, 0.25f);
  float first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    auto [l, _] = s.run(loom::fetches(loss, train), {{ids, batch}, {target, goal}});
    (step == 0 ? first : last) = static_cast<float>(l);
  }
  CHECK(last < first * 0.1f); // it learns

  const std::string log = placed.str();
  INFO(log);
  CHECK(contains(log, looked_up.name() + ": (resource_gather): /job:ps/replica:0/task:0"));
  CHECK(contains(log, ": (sparse_apply_adagrad): /job:ps/replica:0/task:0"));
  CHECK_FALSE(contains(log, "(apply_adagrad)")); // no dense update of the table

  const auto after = s.run(table);
  int changed_rows = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    bool changed = false;
    for (std::int64_t k = 0; k < dim; ++k)
      changed |= after(r, k) != before(r, k);
    changed_rows += changed;
    if (changed)
      CHECK((r == 3 || r == 12345 || r == 49999));
  }
  CHECK(changed_rows == 3);
}

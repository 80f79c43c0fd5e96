// The load on one ps variable (issue #20 item 10), shared by the test
// (tests/distributed/test_ps_load.cpp, through the ps_load_client program) and
// the benchmark (benchmarks/ps_load): each client is a process of its own that
// runs one role against the ps's target and ends by printing one result line,
//
//   ps_load result role=increment acknowledged=N failed=F anomalies=A per_second=n0,n1,...
//
// which the parent reads back with parse_result(). The roles:
//   increment  counter.assign_add(1) in a loop from start_at for `seconds`; acknowledged
//              counts the runs that returned, failed those that threw. Each run returns the
//              counter after its own add, so a client's values must strictly increase: an
//              anomaly is one that does not (an add lost or applied out of order).
//   read       fetches the counter in the same loop; an anomaly is a value below the one
//              read before (the counter only grows).
//   sessions   `count` sessions one after another, each created, running one read, and
//              closed (its partitions deregistered, its connections closed).
//   ping       raw RPC round trips (loom.cluster_info, answered by the task itself) in the
//              same loop: the message layer without a graph, the benchmark's baseline.
// per_second[i] counts what was acknowledged in the i-th second after start_at.
#pragma once

#include <loom/api.hpp>
#include <loom/net/rpc.hpp>
#include <loom/runtime/protocol.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace loom::testing::ps_load {

// The counter every client updates: one int64 on the ps (exact at any count, where a
// float would stop counting at 2^24).
inline constexpr const char* counter_name = "load/counter";

struct counter_graph {
  loom::graph g;
  loom::variable<std::int64_t, 0> counter = [this] {
    auto on_ps = g.device("/job:ps/task:0");
    return loom::variable<std::int64_t, 0>(g, counter_name, std::int64_t{0});
  }();
  loom::output<std::int64_t, 0> increment = counter.assign_add(std::int64_t{1});
};

struct role_args {
  std::string role;   // increment, read, sessions, ping
  std::string target; // the ps's target, "loom://127.0.0.1:port"
  double seconds = 1; // increment, read, ping
  // When the loop starts, in milliseconds since the Unix epoch (system clock, which every
  // process on the machine shares), so that all clients load the ps at once; 0: now.
  std::int64_t start_at_ms = 0;
  int count = 0; // sessions
};

struct role_result {
  std::string role;
  std::uint64_t acknowledged = 0, failed = 0, anomalies = 0;
  std::vector<std::uint64_t> per_second;
  std::string first_error; // the first failure's message (spaces kept: the line's last field)

  std::string line() const {
    std::ostringstream out;
    out << "ps_load result role=" << role << " acknowledged=" << acknowledged
        << " failed=" << failed << " anomalies=" << anomalies << " per_second=";
    for (std::size_t i = 0; i < per_second.size(); ++i)
      out << (i ? "," : "") << per_second[i];
    if (!first_error.empty())
      out << " first_error=" << first_error;
    return out.str();
  }
};

// The result line in a client's output; throws std::runtime_error naming the output when
// there is none or it is malformed.
inline role_result parse_result(const std::string& output) {
  const std::string marker = "ps_load result ";
  const auto at = output.rfind(marker);
  if (at == std::string::npos)
    throw std::runtime_error("no 'ps_load result' line in the client's output:\n" + output);
  std::string line = output.substr(at + marker.size());
  line = line.substr(0, line.find('\n'));
  role_result r;
  if (const auto e = line.find(" first_error="); e != std::string::npos) {
    r.first_error = line.substr(e + 13);
    line.resize(e);
  }
  std::istringstream fields(line);
  std::map<std::string, std::string> kv;
  for (std::string f; fields >> f;)
    if (const auto eq = f.find('='); eq != std::string::npos)
      kv[f.substr(0, eq)] = f.substr(eq + 1);
  try {
    r.role = kv.at("role");
    r.acknowledged = std::stoull(kv.at("acknowledged"));
    r.failed = std::stoull(kv.at("failed"));
    r.anomalies = std::stoull(kv.at("anomalies"));
    std::istringstream buckets(kv.at("per_second"));
    for (std::string b; std::getline(buckets, b, ',');)
      r.per_second.push_back(std::stoull(b));
  } catch (const std::exception& e) {
    throw std::runtime_error("malformed 'ps_load result' line (" + std::string(e.what()) +
                             "): " + line);
  }
  return r;
}

inline loom::cluster_session_options client_options() {
  static std::ostringstream placement_sink; // no placement lines in the clients' output
  loom::cluster_session_options o;
  o.placement_log = &placement_sink;
  o.quiet = true;
  return o;
}

namespace detail {

using clock = std::chrono::steady_clock;

// Runs `step` (true: acknowledged, false: an anomaly; a loom::error: failed) from
// start_at for `seconds`, counting into r.
template <class Step> void timed_loop(const role_args& a, role_result& r, Step&& step) {
  const auto wall_start = std::chrono::system_clock::time_point(
      std::chrono::milliseconds(a.start_at_ms > 0 ? a.start_at_ms : 0));
  if (a.start_at_ms > 0)
    std::this_thread::sleep_until(wall_start);
  const auto start = clock::now();
  const auto length =
      std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(a.seconds));
  r.per_second.assign(static_cast<std::size_t>(a.seconds + 0.999), 0);
  for (auto now = start; now - start < length; now = clock::now()) {
    try {
      if (!step())
        ++r.anomalies;
      ++r.acknowledged;
      const auto second =
          static_cast<std::size_t>((clock::now() - start) / std::chrono::seconds(1));
      if (second < r.per_second.size())
        ++r.per_second[second];
    } catch (const loom::error& e) {
      if (r.failed++ == 0)
        r.first_error = e.what();
    }
  }
}

} // namespace detail

// Runs role a.role; throws loom::error where it cannot start (no session, no channel),
// invalid_argument_error for an unknown role.
inline role_result run_role(const role_args& a) {
  role_result r;
  r.role = a.role;
  if (a.role == "increment" || a.role == "read") {
    counter_graph m;
    loom::session sess(m.g, a.target, client_options());
    std::int64_t last = -1;
    if (a.role == "increment")
      detail::timed_loop(a, r, [&] {
        const std::int64_t now = sess.run(m.increment);
        const bool in_order = now > last;
        last = now;
        return in_order;
      });
    else
      detail::timed_loop(a, r, [&] {
        const std::int64_t now = sess.run(m.counter);
        const bool in_order = now >= last;
        last = now;
        return in_order;
      });
  } else if (a.role == "ping") {
    net::channel_options co;
    co.peer_name = "ps task 0";
    const std::string scheme = "loom://";
    net::channel ch(a.target.starts_with(scheme) ? a.target.substr(scheme.size()) : a.target, co);
    detail::timed_loop(a, r, [&] {
      ch.call(loom::protocol::cluster_info);
      return true;
    });
  } else if (a.role == "sessions") {
    for (int i = 0; i < a.count; ++i) {
      try {
        counter_graph m;
        loom::session sess(m.g, a.target, client_options());
        if (sess.run(m.counter) < 0)
          ++r.anomalies;
        ++r.acknowledged;
      } catch (const loom::error& e) {
        if (r.failed++ == 0)
          r.first_error = e.what();
      }
    }
  } else {
    throw loom::invalid_argument_error("ps_load: unknown role '" + a.role +
                                       "'; expected increment, read, sessions or ping");
  }
  return r;
}

} // namespace loom::testing::ps_load

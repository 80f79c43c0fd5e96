// How a cluster program learns its cluster and its own task: TF's ClusterResolver
// (SimpleClusterResolver, TFConfigClusterResolver, SlurmClusterResolver) as one
// function over the program's flags and environment. Every example and loom-server
// defines its cluster flags with define_cluster_flags and calls resolve_cluster:
//
//   loom::flags flags("...");
//   loom::define_cluster_flags(flags, {.ps_hosts = "127.0.0.1:2222", ...});
//   flags.parse(argc, argv);
//   const loom::cluster_role role = loom::resolve_cluster(flags);
//   loom::server server(role.cluster, role.job_name, role.task_index);
//
// The sources, tried in this order (the first present gives the cluster):
//  1. flags: --ps_hosts/--worker_hosts (with --job_name/--task_index).
//  2. TF_CONFIG (Kubernetes' TFJob operator, tf.estimator launchers).
//  3. Slurm, under srun: SLURM_PROCID, SLURM_NTASKS, SLURM_STEP_NODELIST,
//     SLURM_STEP_TASKS_PER_NODE; the jobs from --jobs (default: every task a worker).
//  4. mpirun: OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE (Open MPI) or PMI_RANK/PMI_SIZE
//     (MPICH's Hydra, Intel MPI); the hosts from --hosts or --hostfile (MPI does not
//     export them), the jobs from --jobs.
//  5. none of them: the flags' defaults (each program's own: loopback ports).
// Open MPI's variables are looked at before Slurm's: mpirun inside an sbatch script
// sets them for each rank, while the SLURM_* variables it inherits are the batch
// step's (SLURM_PROCID=0 for every rank).
//
// Under Slurm and mpirun, ranks fill the jobs in the order --jobs gives them (with
// --jobs=ps:1,worker:2: rank 0 is ps 0, ranks 1 and 2 workers 0 and 1), and the
// ranks are placed on the hosts in blocks (Slurm's default --distribution=block,
// mpirun's default --map-by slot): the first host's tasks first. A task's address
// is its host and --port_base plus its local index on that host. Where the launcher
// says which host and local index it gave the task (SLURMD_NODENAME, SLURM_LOCALID,
// OMPI_COMM_WORLD_LOCAL_RANK), a placement that is not in blocks is an error.
//
// Two sources that both give the task must agree (flags and TF_CONFIG; --job_name
// and the task Slurm or mpirun gives), and flags that only one source reads
// (--jobs, --port_base, --hosts, --hostfile) are errors when another source wins.
// Every error is an invalid_argument_error naming the flag or variable and its value.
//
// The same flags carry the cluster's TLS settings (cluster/tls_settings.hpp): --tls (TLS
// keyed by the cluster token), --tls_cert, --tls_key, --tls_ca (TLS with certificates).
// They are a spelling of LOOM_TLS, LOOM_TLS_CERT, LOOM_TLS_KEY and LOOM_TLS_CA:
// resolve_cluster sets those variables from the flags given (a flag wins over the
// variable), so that every server and session the program makes, and every process it
// starts, reads the same settings, as they read the cluster token from LOOM_CLUSTER_TOKEN.
// Call it before starting threads (setenv is not thread-safe): every program calls it
// first thing in main.
//
// So are --bind (LOOM_BIND: the address a task listens on, by default every interface
// where the cluster is not all on this host's loopback; net/listen_address.hpp) and
// --heartbeat_timeout (LOOM_HEARTBEAT_TIMEOUT, seconds: how soon a silent peer is declared
// dead; cluster/liveness_settings.hpp).
#pragma once

#include <loom/cluster/cluster_spec.hpp>
#include <loom/cluster/environment.hpp>
#include <loom/cluster/liveness_settings.hpp>
#include <loom/cluster/slurm_lists.hpp>
#include <loom/cluster/tf_config.hpp>
#include <loom/cluster/tls_settings.hpp>
#include <loom/core/compiled_once.hpp>
#include <loom/core/error.hpp>
#include <loom/core/flags.hpp>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

// The defaults of a program's cluster flags (used when no source gives the cluster).
struct cluster_flag_defaults {
  std::string ps_hosts{};
  std::string worker_hosts{};
  std::string job_name{};
  std::int64_t task_index = 0;
  std::string job_name_help = "The job of this task: ps or worker";
};

// Defines the flags resolve_cluster reads: --ps_hosts, --worker_hosts, --job_name,
// --task_index, --jobs, --port_base, --hosts, --hostfile, the TLS flags --tls,
// --tls_cert, --tls_key, --tls_ca, and --bind and --heartbeat_timeout.
LOOM_COMPILED_ONCE flags& define_cluster_flags(flags& f,
                                               const cluster_flag_defaults& defaults = {});

// This process's place in its cluster.
struct cluster_role {
  cluster_spec cluster;
  std::string job_name; // "" when no source names a task (a client, or a local run)
  int task_index = 0;
  bool is_chief = false;
  std::string source; // "flags", "TF_CONFIG", "Slurm", "Open MPI", "PMI" or "defaults"

  // "/job:worker/task:1"
  std::string task_name() const {
    return "/job:" + job_name + "/task:" + std::to_string(task_index);
  }

  // Throws, saying how to give one, when no source named this process's task.
  const cluster_role& require_task() const {
    if (job_name.empty())
      throw invalid_argument_error(
          "Must specify an explicit `job_name`: give --job_name and --task_index, set "
          "TF_CONFIG, or start the program under srun or mpirun (with --jobs)");
    if (task_index < 0)
      throw invalid_argument_error("Must specify an explicit `task_index` (--task_index)");
    return *this;
  }
};

namespace detail::resolver_impl {

[[noreturn]] inline void fail(const std::string& what) {
  throw invalid_argument_error(what);
}

inline std::string quoted(std::string_view name, std::string_view value) {
  return std::string(name) + "=\"" + std::string(value) + "\"";
}

// A non-negative integer of at most 9 digits, or nullopt.
LOOM_COMPILED_ONCE std::optional<int> to_count(std::string_view s);

LOOM_COMPILED_ONCE int env_count(const environment& env, const std::string& name);

inline std::string require_env(const environment& env, const std::string& name,
                               const std::string& why) {
  const auto v = env(name);
  if (!v || v->empty())
    fail(name + " is not set" + why);
  return *v;
}

struct job_size {
  std::string name;
  int tasks;
};

// --jobs=ps:1,worker:2 in order; empty: every task a worker.
LOOM_COMPILED_ONCE std::vector<job_size> parse_jobs(std::string_view text, int total);

// One host of a rank launcher and the tasks it holds, in rank order.
struct host_slots {
  std::string host;
  int slots;
};

// The cluster a rank launcher (srun, mpirun) builds: `size` ranks placed on `hosts` in
// blocks, filling the jobs of --jobs in order. `size_name` names where size came from.
struct rank_layout {
  cluster_spec cluster;
  std::string job_name;
  int task_index = 0;
  std::string host;    // this rank's
  int local_index = 0; // this rank's index on its host
};

LOOM_COMPILED_ONCE rank_layout lay_out(const std::vector<host_slots>& hosts, int rank, int size,
                                       const std::string& size_name, std::string_view jobs_flag,
                                       std::int64_t port_base);

// A launcher's own word on where it put this rank must match the block layout.
LOOM_COMPILED_ONCE void check_placement(const environment& env, const rank_layout& layout, int rank,
                                        const char* host_variable, const char* local_variable,
                                        const std::string& remedy);

// --hosts=a:2,b:1 (mpirun's --host: a host alone has 1 slot).
LOOM_COMPILED_ONCE std::vector<host_slots> parse_hosts_flag(std::string_view text);

// An Open MPI / MPICH hostfile: "host [slots=N] [max_slots=N]" a line, '#' comments;
// a host without slots has 1.
LOOM_COMPILED_ONCE std::vector<host_slots> read_hostfile(const std::string& path);

// Sets LOOM_TLS, LOOM_TLS_CERT, LOOM_TLS_KEY and LOOM_TLS_CA from the TLS flags given, and
// checks the settings they make (tls_settings_from_environment's errors name the flags).
LOOM_COMPILED_ONCE void export_tls_flags(const flags& f);

// Sets LOOM_BIND and LOOM_HEARTBEAT_TIMEOUT from --bind and --heartbeat_timeout when given,
// and checks the timeout (liveness_settings_from_environment's error names the flag).
LOOM_COMPILED_ONCE void export_listen_flags(const flags& f);

// Whether a source other than Slurm or mpirun left their flags set.
LOOM_COMPILED_ONCE void reject_rank_flags(const flags& f, const std::string& winner);

// --job_name/--task_index given beside a source that also gives the task must agree.
LOOM_COMPILED_ONCE void check_role_flags(const flags& f, const cluster_role& role);

LOOM_COMPILED_ONCE bool chief_of(const cluster_spec& c, const std::string& job, int index);

LOOM_COMPILED_ONCE cluster_role from_slurm(const flags& f, const environment& env);

LOOM_COMPILED_ONCE cluster_role from_mpi(const flags& f, const environment& env, bool open_mpi);

} // namespace detail::resolver_impl

// This process's cluster and task from `f` (defined by define_cluster_flags and parsed)
// and the environment; the order of the sources is at the top of this header.
LOOM_COMPILED_ONCE cluster_role resolve_cluster(const flags& f,
                                                const environment& env = process_environment());

} // namespace loom

#if LOOM_COMPILED_ONCE_DEFINITIONS

namespace loom {

LOOM_COMPILED_ONCE flags& define_cluster_flags(flags& f, const cluster_flag_defaults& defaults) {
  return f.define_string("ps_hosts", defaults.ps_hosts, "Comma-separated host:port of the ps tasks")
      .define_string("worker_hosts", defaults.worker_hosts,
                     "Comma-separated host:port of the worker tasks")
      .define_string("job_name", defaults.job_name, defaults.job_name_help)
      .define_int("task_index", defaults.task_index, "Index of the task within its job")
      .define_string("jobs", "",
                     "Under srun or mpirun: the jobs and their sizes, in rank order, as "
                     "ps:1,worker:2 (default: every task a worker)")
      .define_int("port_base", 8888,
                  "Under srun or mpirun: a task listens on this port plus its index on its host")
      .define_string("hosts", "",
                     "Under mpirun: the hosts and their slots, as mpirun's --host: a:2,b:2")
      .define_string("hostfile", "",
                     "Under mpirun: the hostfile given to mpirun (host slots=N a line)")
      .define_bool("tls", false,
                   "Encrypt the cluster's connections with TLS 1.3 keyed by the cluster token "
                   "(LOOM_TLS=1; every task and client alike)")
      .define_string("tls_cert", "",
                     "TLS with certificates: this task's certificate (chain), PEM "
                     "(LOOM_TLS_CERT; with --tls_key and --tls_ca)")
      .define_string("tls_key", "", "TLS with certificates: its private key, PEM (LOOM_TLS_KEY)")
      .define_string("tls_ca", "",
                     "TLS with certificates: the CA that signed every task's certificate, PEM "
                     "(LOOM_TLS_CA)")
      .define_string("bind", "",
                     "The address this task listens on (LOOM_BIND; default: every interface, "
                     "or its loopback address where the whole cluster is on this host's "
                     "loopback); the others still reach it at its cluster-spec address")
      .define_string("heartbeat_timeout", "",
                     "Seconds without a byte from a peer with calls in flight before it is "
                     "declared dead and the calls fail (LOOM_HEARTBEAT_TIMEOUT; default 6; 0: "
                     "off)");
}
} // namespace loom

namespace loom::detail::resolver_impl {

LOOM_COMPILED_ONCE std::optional<int> to_count(std::string_view s) {
  if (s.empty() || s.size() > 9)
    return std::nullopt;
  int n = 0;
  for (char c : s) {
    if (c < '0' || c > '9')
      return std::nullopt;
    n = n * 10 + (c - '0');
  }
  return n;
}

LOOM_COMPILED_ONCE int env_count(const environment& env, const std::string& name) {
  const auto v = env(name);
  if (!v)
    fail(name + " is not set");
  const auto n = to_count(*v);
  if (!n)
    fail(quoted(name, *v) + " is not a non-negative integer");
  return *n;
}

LOOM_COMPILED_ONCE std::vector<job_size> parse_jobs(std::string_view text, int total) {
  if (text.empty())
    return {{"worker", total}};
  std::vector<job_size> out;
  std::size_t start = 0;
  while (true) {
    const auto comma = text.find(',', start);
    const std::string_view entry = text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    const std::string where = quoted("--jobs", text) + ": entry " + std::to_string(out.size()) +
                              " \"" + std::string(entry) + "\"";
    const auto colon = entry.find(':');
    if (colon == std::string_view::npos)
      fail(where + " is not job:count, as in ps:1");
    const std::string name(entry.substr(0, colon));
    if (!detail::cluster_impl::valid_job_name(name))
      fail(where + ": the job name \"" + name +
           "\" is not a letter followed by letters, digits or '_'");
    const auto n = to_count(entry.substr(colon + 1));
    if (!n || *n == 0)
      fail(where + ": the count \"" + std::string(entry.substr(colon + 1)) +
           "\" is not a positive integer");
    for (const auto& j : out)
      if (j.name == name)
        fail(where + ": the job \"" + name + "\" is given twice");
    out.push_back({name, *n});
    if (comma == std::string_view::npos)
      return out;
    start = comma + 1;
  }
}

LOOM_COMPILED_ONCE rank_layout lay_out(const std::vector<host_slots>& hosts, int rank, int size,
                                       const std::string& size_name, std::string_view jobs_flag,
                                       std::int64_t port_base) {
  const auto jobs = parse_jobs(jobs_flag, size);
  int asked = 0;
  for (const auto& j : jobs)
    asked += j.tasks;
  if (asked != size)
    fail(size_name + "=" + std::to_string(size) + " tasks, but " + quoted("--jobs", jobs_flag) +
         " asks for " + std::to_string(asked) + "; give --jobs whose counts sum to " +
         std::to_string(size));
  if (rank >= size)
    fail("rank " + std::to_string(rank) + " is not below " + size_name + "=" +
         std::to_string(size));
  if (port_base < 1 || port_base > 65535)
    fail("--port_base=" + std::to_string(port_base) + " is not a port (1..65535)");

  rank_layout out;
  std::vector<std::string> addresses;
  for (const auto& h : hosts)
    for (int local = 0; local < h.slots && static_cast<int>(addresses.size()) < size; ++local) {
      const std::int64_t port = port_base + local;
      if (port > 65535)
        fail("--port_base=" + std::to_string(port_base) + " plus local index " +
             std::to_string(local) + " on host " + h.host + " is past port 65535");
      if (static_cast<int>(addresses.size()) == rank) {
        out.host = h.host;
        out.local_index = local;
      }
      const bool v6 = h.host.find(':') != std::string::npos;
      addresses.push_back((v6 ? "[" + h.host + "]" : h.host) + ":" + std::to_string(port));
    }
  int first = 0;
  for (const auto& j : jobs) {
    out.cluster.add_job(j.name, std::vector<std::string>(addresses.begin() + first,
                                                         addresses.begin() + first + j.tasks));
    if (rank >= first && rank < first + j.tasks) {
      out.job_name = j.name;
      out.task_index = rank - first;
    }
    first += j.tasks;
  }
  return out;
}

LOOM_COMPILED_ONCE void check_placement(const environment& env, const rank_layout& layout, int rank,
                                        const char* host_variable, const char* local_variable,
                                        const std::string& remedy) {
  if (host_variable)
    if (const auto node = env(host_variable); node && !node->empty() && *node != layout.host)
      fail("rank " + std::to_string(rank) + " runs on " + quoted(host_variable, *node) +
           ", but in blocks over the hosts it belongs on \"" + layout.host + "\"; " + remedy);
  if (const auto local = env(local_variable); local && !local->empty()) {
    const auto n = to_count(*local);
    if (!n)
      fail(quoted(local_variable, *local) + " is not a non-negative integer");
    if (*n != layout.local_index)
      fail("rank " + std::to_string(rank) + " has " + quoted(local_variable, *local) +
           ", but in blocks over the hosts it is task " + std::to_string(layout.local_index) +
           " on \"" + layout.host + "\"; " + remedy);
  }
}

LOOM_COMPILED_ONCE std::vector<host_slots> parse_hosts_flag(std::string_view text) {
  std::vector<host_slots> out;
  std::size_t start = 0;
  while (true) {
    const auto comma = text.find(',', start);
    const std::string_view entry = text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    const std::string where = quoted("--hosts", text) + ": entry " + std::to_string(out.size()) +
                              " \"" + std::string(entry) + "\"";
    const auto colon = entry.rfind(':');
    const std::string host(entry.substr(0, colon));
    if (host.empty())
      fail(where + " has no host; expected host or host:slots");
    int slots = 1;
    if (colon != std::string_view::npos) {
      const auto n = to_count(entry.substr(colon + 1));
      if (!n || *n == 0)
        fail(where + ": the slots \"" + std::string(entry.substr(colon + 1)) +
             "\" are not a positive integer");
      slots = *n;
    }
    out.push_back({host, slots});
    if (comma == std::string_view::npos)
      return out;
    start = comma + 1;
  }
}

LOOM_COMPILED_ONCE std::vector<host_slots> read_hostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    fail("--hostfile=\"" + path + "\": cannot be read");
  std::vector<host_slots> out;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (const auto hash = line.find('#'); hash != std::string::npos)
      line.erase(hash);
    std::istringstream words(line);
    std::string host, word;
    if (!(words >> host))
      continue;
    int slots = 1;
    const std::string where = "--hostfile=\"" + path + "\" line " + std::to_string(number);
    // MPICH writes "host:slots".
    if (const auto colon = host.find(':'); colon != std::string::npos) {
      const auto n = to_count(std::string_view(host).substr(colon + 1));
      if (!n || *n == 0)
        fail(where + ": \"" + host + "\" is not host or host:slots");
      slots = *n;
      host.erase(colon);
    }
    while (words >> word) {
      if (word.rfind("slots=", 0) == 0) {
        const auto n = to_count(std::string_view(word).substr(6));
        if (!n || *n == 0)
          fail(where + ": \"" + word + "\" is not slots=<positive integer>");
        slots = *n;
      } else if (word.rfind("max_slots=", 0) != 0 && word.rfind("max-slots=", 0) != 0) {
        fail(where + ": \"" + word + "\" is not slots=N or max_slots=N");
      }
    }
    out.push_back({host, slots});
  }
  if (out.empty())
    fail("--hostfile=\"" + path + "\" names no host");
  return out;
}

LOOM_COMPILED_ONCE void export_tls_flags(const flags& f) {
  struct flag_variable {
    const char* flag;
    const char* variable;
  };
  bool any = false;
  for (const auto [flag, variable] :
       {flag_variable{"tls", "LOOM_TLS"}, flag_variable{"tls_cert", "LOOM_TLS_CERT"},
        flag_variable{"tls_key", "LOOM_TLS_KEY"}, flag_variable{"tls_ca", "LOOM_TLS_CA"}}) {
    if (!f.is_set(flag))
      continue;
    any = true;
    const std::string value =
        std::string(flag) == "tls" ? (f.get_bool(flag) ? "1" : "0") : f.get_string(flag);
    if (::setenv(variable, value.c_str(), 1) != 0)
      fail("cannot set " + std::string(variable) + " from --" + flag);
  }
  if (any)
    (void)tls_settings_from_environment();
}

LOOM_COMPILED_ONCE void export_listen_flags(const flags& f) {
  for (const auto& [flag, variable] :
       {std::pair{"bind", "LOOM_BIND"}, std::pair{"heartbeat_timeout", "LOOM_HEARTBEAT_TIMEOUT"}}) {
    if (!f.is_set(flag))
      continue;
    if (::setenv(variable, f.get_string(flag).c_str(), 1) != 0)
      fail("cannot set " + std::string(variable) + " from --" + flag);
  }
  if (f.is_set("heartbeat_timeout"))
    (void)liveness_settings_from_environment();
}

LOOM_COMPILED_ONCE void reject_rank_flags(const flags& f, const std::string& winner) {
  for (const char* name : {"jobs", "port_base", "hosts", "hostfile"})
    if (f.is_set(name))
      fail("--" + std::string(name) +
           " is for srun and mpirun (SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK), but the "
           "cluster comes from " +
           winner + "; drop --" + name);
}

LOOM_COMPILED_ONCE void check_role_flags(const flags& f, const cluster_role& role) {
  const bool job_set = f.is_set("job_name");
  const bool index_set = f.is_set("task_index");
  if ((job_set && f.get_string("job_name") != role.job_name) ||
      (index_set && f.get_int("task_index") != role.task_index))
    fail("--job_name=" + (job_set ? f.get_string("job_name") : std::string("(unset)")) +
         " --task_index=" + (index_set ? std::to_string(f.get_int("task_index")) : "(unset)") +
         " disagree with " + role.source + ", which makes this task " + role.task_name() +
         "; drop the flags or make them agree");
}

LOOM_COMPILED_ONCE bool chief_of(const cluster_spec& c, const std::string& job, int index) {
  if (c.has_job("chief"))
    return job == "chief";
  if (c.has_job("master"))
    return job == "master" && index == 0;
  return job == "worker" && index == 0;
}

LOOM_COMPILED_ONCE cluster_role from_slurm(const flags& f, const environment& env) {
  const int rank = env_count(env, "SLURM_PROCID");
  const int size = env_count(env, "SLURM_NTASKS");
  const std::string not_srun =
      " (it is set in a job step: start the program with srun, not straight from the batch "
      "script)";
  const std::string nodelist_text = require_env(env, "SLURM_STEP_NODELIST", not_srun);
  const std::string per_node_text = require_env(env, "SLURM_STEP_TASKS_PER_NODE", not_srun);
  const auto nodes = loom::detail::expand_nodelist(nodelist_text, "SLURM_STEP_NODELIST");
  const auto per_node =
      loom::detail::expand_tasks_per_node(per_node_text, "SLURM_STEP_TASKS_PER_NODE");
  if (nodes.size() != per_node.size())
    fail(quoted("SLURM_STEP_NODELIST", nodelist_text) + " names " + std::to_string(nodes.size()) +
         " node(s), but " + quoted("SLURM_STEP_TASKS_PER_NODE", per_node_text) + " gives " +
         std::to_string(per_node.size()));
  std::vector<host_slots> hosts;
  long placed = 0;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    hosts.push_back({nodes[i], per_node[i]});
    placed += per_node[i];
  }
  if (placed != size)
    fail(quoted("SLURM_STEP_TASKS_PER_NODE", per_node_text) + " places " + std::to_string(placed) +
         " tasks, but SLURM_NTASKS=" + std::to_string(size));
  if (const auto pmi = env("PMI_RANK"); pmi && to_count(*pmi) != rank)
    fail(quoted("PMI_RANK", *pmi) + " and SLURM_PROCID=" + std::to_string(rank) + " disagree");
  const auto layout =
      lay_out(hosts, rank, size, "SLURM_NTASKS", f.get_string("jobs"), f.get_int("port_base"));
  check_placement(env, layout, rank, "SLURMD_NODENAME", "SLURM_LOCALID",
                  "run srun with --distribution=block");
  return {layout.cluster, layout.job_name, layout.task_index,
          chief_of(layout.cluster, layout.job_name, layout.task_index), "Slurm"};
}

LOOM_COMPILED_ONCE cluster_role from_mpi(const flags& f, const environment& env, bool open_mpi) {
  const std::string rank_var = open_mpi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK";
  const std::string size_var = open_mpi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE";
  const int rank = env_count(env, rank_var);
  const int size = env_count(env, size_var);
  const bool hosts_set = f.is_set("hosts");
  const bool hostfile_set = f.is_set("hostfile");
  if (hosts_set && hostfile_set)
    fail("--hosts and --hostfile both give the hosts; give one");
  if (!hosts_set && !hostfile_set)
    fail(rank_var + " is set (started by mpirun), but MPI does not tell a task the hosts: give "
                    "--hosts=host1:slots,host2:slots (as mpirun's --host) or --hostfile (the "
                    "file given to mpirun)");
  const auto hosts =
      hosts_set ? parse_hosts_flag(f.get_string("hosts")) : read_hostfile(f.get_string("hostfile"));
  long slots = 0;
  for (const auto& h : hosts)
    slots += h.slots;
  if (slots < size)
    fail(std::string(hosts_set ? "--hosts" : "--hostfile") + " gives " + std::to_string(slots) +
         " slot(s), fewer than " + size_var + "=" + std::to_string(size));
  const auto layout =
      lay_out(hosts, rank, size, size_var, f.get_string("jobs"), f.get_int("port_base"));
  check_placement(env, layout, rank, nullptr,
                  open_mpi ? "OMPI_COMM_WORLD_LOCAL_RANK" : "MPI_LOCALRANKID",
                  "give the hosts and slots in mpirun's order and map by slot (--map-by slot)");
  return {layout.cluster, layout.job_name, layout.task_index,
          chief_of(layout.cluster, layout.job_name, layout.task_index),
          open_mpi ? "Open MPI" : "PMI"};
}
} // namespace loom::detail::resolver_impl

namespace loom {

LOOM_COMPILED_ONCE cluster_role resolve_cluster(const flags& f, const environment& env) {
  namespace impl = detail::resolver_impl;
  impl::export_tls_flags(f);
  impl::export_listen_flags(f);
  const bool hosts_given = f.is_set("ps_hosts") || f.is_set("worker_hosts");
  std::optional<tf_config> tf;
  if (const auto text = env("TF_CONFIG");
      text && text->find_first_not_of(" \t\r\n") != std::string::npos)
    tf = parse_tf_config(*text, "TF_CONFIG");
  const bool tf_has_task = tf && !tf->task_type.empty();

  if (hosts_given) {
    cluster_role role{
        cluster_spec::from_flags(f.get_string("ps_hosts"), f.get_string("worker_hosts")),
        f.get_string("job_name"), static_cast<int>(f.get_int("task_index")), false, "flags"};
    role.is_chief = impl::chief_of(role.cluster, role.job_name, role.task_index);
    if (tf_has_task && (tf->cluster != role.cluster || tf->task_type != role.job_name ||
                        tf->task_index != role.task_index))
      impl::fail("the flags and TF_CONFIG both give the cluster, and differently: "
                 "--ps_hosts/--worker_hosts/--job_name/--task_index give " +
                 role.cluster.to_string() + " " + role.task_name() + ", TF_CONFIG gives " +
                 tf->cluster.to_string() + " /job:" + tf->task_type +
                 "/task:" + std::to_string(tf->task_index) + "; unset TF_CONFIG or drop the flags");
    impl::reject_rank_flags(f, "--ps_hosts/--worker_hosts");
    return role;
  }
  if (tf_has_task) {
    cluster_role role{tf->cluster, tf->task_type, tf->task_index, tf->is_chief, "TF_CONFIG"};
    impl::check_role_flags(f, role);
    impl::reject_rank_flags(f, "TF_CONFIG");
    return role;
  }
  std::optional<cluster_role> ranked;
  if (env("OMPI_COMM_WORLD_RANK"))
    ranked = impl::from_mpi(f, env, true);
  else if (env("SLURM_PROCID"))
    ranked = impl::from_slurm(f, env);
  else if (env("PMI_RANK"))
    ranked = impl::from_mpi(f, env, false);
  if (ranked) {
    impl::check_role_flags(f, *ranked);
    return *ranked;
  }
  impl::reject_rank_flags(f, "the flags' defaults (no TF_CONFIG, srun or mpirun)");
  cluster_role role{
      cluster_spec::from_flags(f.get_string("ps_hosts"), f.get_string("worker_hosts")),
      f.get_string("job_name"), static_cast<int>(f.get_int("task_index")), false, "defaults"};
  role.is_chief = impl::chief_of(role.cluster, role.job_name, role.task_index);
  return role;
}

} // namespace loom

#endif // LOOM_COMPILED_ONCE_DEFINITIONS

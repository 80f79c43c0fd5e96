// The cluster resolver: each source (flags, TF_CONFIG, Slurm, Open MPI, PMI, the
// defaults), their precedence, Slurm's compressed lists, and every bad input's message.
#include <loom/cluster/cluster_resolver.hpp>

#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using env_map = std::map<std::string, std::string>;

loom::environment env_of(env_map vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    if (auto it = vars.find(name); it != vars.end())
      return it->second;
    return std::nullopt;
  };
}

// The role resolved from command-line `args` and environment `env`.
loom::cluster_role resolve(std::vector<std::string> args, env_map env,
                           loom::cluster_flag_defaults defaults = {}) {
  loom::flags f;
  loom::define_cluster_flags(f, defaults);
  std::vector<const char*> argv{"program"};
  for (auto& a : args)
    argv.push_back(a.c_str());
  REQUIRE(f.parse(static_cast<int>(argv.size()), argv.data()));
  return loom::resolve_cluster(f, env_of(std::move(env)));
}

std::string error_of(std::vector<std::string> args, env_map env) {
  try {
    (void)resolve(std::move(args), std::move(env));
  } catch (const loom::invalid_argument_error& e) {
    return e.message();
  }
  return "<no invalid_argument_error>";
}

template <class F> std::string error_in(F&& f) {
  try {
    f();
  } catch (const loom::invalid_argument_error& e) {
    return e.message();
  }
  return "<no invalid_argument_error>";
}

const std::string tf_worker1 =
    R"({"cluster": {"ps": ["p:1"], "worker": ["w0:1", "w1:1"]}, "task": {"type": "worker", "index": 1}})";

// srun -n 3 over node[01-02] (2 tasks, then 1), as rank `rank`.
env_map slurm(int rank, env_map extra = {}) {
  env_map e{{"SLURM_PROCID", std::to_string(rank)},
            {"SLURM_NTASKS", "3"},
            {"SLURM_STEP_NODELIST", "node[01-02]"},
            {"SLURM_STEP_TASKS_PER_NODE", "2,1"}};
  for (auto& [k, v] : extra)
    e[k] = v;
  return e;
}

} // namespace

TEST_CASE("Slurm node lists expand ranges, padding, several groups and plain names") {
  CHECK(loom::detail::expand_nodelist("node[01-04,07]") ==
        std::vector<std::string>{"node01", "node02", "node03", "node04", "node07"});
  CHECK(loom::detail::expand_nodelist("n[8-10],login.example.org") ==
        std::vector<std::string>{"n8", "n9", "n10", "login.example.org"});
  CHECK(loom::detail::expand_nodelist("n[08-10]") == std::vector<std::string>{"n08", "n09", "n10"});
  CHECK(loom::detail::expand_nodelist("r[1-2]-n[1-2]") ==
        std::vector<std::string>{"r1-n1", "r1-n2", "r2-n1", "r2-n2"});
  CHECK(loom::detail::expand_nodelist("solo") == std::vector<std::string>{"solo"});
  CHECK(loom::detail::expand_tasks_per_node("2(x3),1") == std::vector<int>{2, 2, 2, 1});
  CHECK(loom::detail::expand_tasks_per_node("4") == std::vector<int>{4});
}

TEST_CASE("a malformed Slurm list names the variable, its value and the position") {
  const auto nodelist = [](const char* v) {
    return error_in([&] { loom::detail::expand_nodelist(v, "SLURM_STEP_NODELIST"); });
  };
  CHECK(nodelist("node[01-04") ==
        R"(SLURM_STEP_NODELIST="node[01-04": at position 10: the '[' is not closed by ']')");
  CHECK(nodelist("node[04-01]") ==
        R"(SLURM_STEP_NODELIST="node[04-01]": at position 8: the range 4-1 runs backwards)");
  CHECK(nodelist("node[a]") == R"(SLURM_STEP_NODELIST="node[a]": at position 5: expected )"
                               R"(a range's first number (digits), got 'a')");
  CHECK(nodelist("node[1;2]") == R"(SLURM_STEP_NODELIST="node[1;2]": at position 6: expected )"
                                 R"(',', '-' or ']' in a bracket, got ';')");
  CHECK(nodelist("a,,b") == R"(SLURM_STEP_NODELIST="a,,b": at position 2: an empty host name)");
  CHECK(nodelist("a,") ==
        R"(SLURM_STEP_NODELIST="a,": at position 2: an empty host name after the last ',')");
  CHECK(nodelist("a]") == R"(SLURM_STEP_NODELIST="a]": at position 1: a ']' without its '[')");
  CHECK(
      nodelist("a b") ==
      R"(SLURM_STEP_NODELIST="a b": at position 1: the character ' ' cannot be part of a host name)");
  CHECK(nodelist("") == R"(SLURM_STEP_NODELIST="": at position 0: the node list is empty)");
  CHECK(nodelist("n[0-9999999]") == R"(SLURM_STEP_NODELIST="n[0-9999999]": at position 2: the )"
                                    R"(list expands to more than 1048576 names)");

  const auto per_node = [](const char* v) {
    return error_in([&] { loom::detail::expand_tasks_per_node(v, "SLURM_STEP_TASKS_PER_NODE"); });
  };
  CHECK(per_node("2(3)") == R"~(SLURM_STEP_TASKS_PER_NODE="2(3)": at position 2: expected 'x' )~"
                            R"~(after '(', as in "2(x3)")~");
  CHECK(per_node("2(x3") ==
        R"~(SLURM_STEP_TASKS_PER_NODE="2(x3": at position 4: expected ')' to close "(x3")~");
  CHECK(per_node("2;1") ==
        R"~(SLURM_STEP_TASKS_PER_NODE="2;1": at position 1: expected ',' or "(xN)", got ';')~");
  CHECK(per_node("0") == R"(SLURM_STEP_TASKS_PER_NODE="0": at position 0: a node with 0 tasks)");
  CHECK(per_node("2,") == R"(SLURM_STEP_TASKS_PER_NODE="2,": at position 2: expected a task )"
                          R"(count (digits), got the end)");
}

TEST_CASE("explicit flags give the cluster and the task") {
  const auto r = resolve(
      {"--ps_hosts=p:1", "--worker_hosts=w0:1,w1:1", "--job_name=worker", "--task_index=1"}, {});
  CHECK(r.source == "flags");
  CHECK(r.cluster == loom::cluster_spec::from_flags("p:1", "w0:1,w1:1"));
  CHECK(r.task_name() == "/job:worker/task:1");
  CHECK_FALSE(r.is_chief);
  // Slurm's variables beside explicit flags: the flags win (a script that passes them).
  CHECK(resolve({"--ps_hosts=p:1", "--worker_hosts=w0:1", "--job_name=ps"}, slurm(2)).source ==
        "flags");
}

TEST_CASE("TF_CONFIG gives the cluster when no host flags do") {
  const auto r = resolve({}, {{"TF_CONFIG", tf_worker1}});
  CHECK(r.source == "TF_CONFIG");
  CHECK(r.cluster == loom::cluster_spec::from_flags("p:1", "w0:1,w1:1"));
  CHECK(r.task_name() == "/job:worker/task:1");
  // Agreeing --job_name/--task_index, and flags equal to TF_CONFIG, are fine.
  CHECK(resolve({"--job_name=worker", "--task_index=1"}, {{"TF_CONFIG", tf_worker1}}).source ==
        "TF_CONFIG");
  CHECK(
      resolve({"--ps_hosts=p:1", "--worker_hosts=w0:1,w1:1", "--job_name=worker", "--task_index=1"},
              {{"TF_CONFIG", tf_worker1}})
          .source == "flags");
  // TF_CONFIG wins over Slurm (a TFJob pod that happens to carry SLURM_* variables).
  auto both = slurm(0);
  both["TF_CONFIG"] = tf_worker1;
  CHECK(resolve({}, both).source == "TF_CONFIG");
  // A TF_CONFIG without a task (a local run) gives nothing: the defaults apply.
  CHECK(resolve({}, {{"TF_CONFIG", "{}"}}, {.ps_hosts = "127.0.0.1:5"}).source == "defaults");
}

TEST_CASE("flags and TF_CONFIG that differ are an error naming both") {
  CHECK(error_of(
            {"--ps_hosts=p:1", "--worker_hosts=w0:1,w1:1", "--job_name=worker", "--task_index=0"},
            {{"TF_CONFIG", tf_worker1}}) ==
        "the flags and TF_CONFIG both give the cluster, and differently: "
        "--ps_hosts/--worker_hosts/--job_name/--task_index give "
        R"({"ps": ["p:1"], "worker": ["w0:1", "w1:1"]} /job:worker/task:0, TF_CONFIG gives )"
        R"({"ps": ["p:1"], "worker": ["w0:1", "w1:1"]} /job:worker/task:1; unset TF_CONFIG or )"
        "drop the flags");
  CHECK(error_of({"--job_name=ps"}, {{"TF_CONFIG", tf_worker1}}) ==
        "--job_name=ps --task_index=(unset) disagree with TF_CONFIG, which makes this task "
        "/job:worker/task:1; drop the flags or make them agree");
  CHECK(error_of({"--jobs=ps:1,worker:2"}, {{"TF_CONFIG", tf_worker1}}) ==
        "--jobs is for srun and mpirun (SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK), but "
        "the cluster comes from TF_CONFIG; drop --jobs");
  CHECK(error_of({}, {{"TF_CONFIG", "{"}}).find("TF_CONFIG: is not valid JSON") == 0);
}

TEST_CASE("Slurm: ranks fill --jobs in order, hosts in blocks, ports from --port_base") {
  const std::vector<std::string> jobs{"--jobs=ps:1,worker:2", "--port_base=7000"};
  const auto expected = loom::cluster_spec::from_flags("node01:7000", "node01:7001,node02:7000");
  const char* names[] = {"/job:ps/task:0", "/job:worker/task:0", "/job:worker/task:1"};
  for (int rank = 0; rank < 3; ++rank) {
    CAPTURE(rank);
    const auto r = resolve(jobs, slurm(rank));
    CHECK(r.source == "Slurm");
    CHECK(r.cluster == expected);
    CHECK(r.task_name() == names[rank]);
    CHECK(r.is_chief == (rank == 1));
  }
  // The launcher's own word on the placement, when it agrees.
  CHECK(resolve(jobs, slurm(2, {{"SLURMD_NODENAME", "node02"}, {"SLURM_LOCALID", "0"}}))
            .task_name() == "/job:worker/task:1");
  // Without --jobs every task is a worker (TF's default); the default port base is 8888.
  const auto all_workers = resolve({}, slurm(0));
  CHECK(all_workers.cluster ==
        loom::cluster_spec::from_flags("", "node01:8888,node01:8889,node02:8888"));
  CHECK(all_workers.task_name() == "/job:worker/task:0");
  // A job order other than ps first: ranks still follow --jobs.
  CHECK(resolve({"--jobs=worker:2,ps:1"}, slurm(2)).task_name() == "/job:ps/task:0");
  // Agreeing --job_name/--task_index are fine; PMI_RANK equal to SLURM_PROCID (srun --mpi=pmi2).
  CHECK(resolve({"--jobs=ps:1,worker:2", "--job_name=worker", "--task_index=0"},
                slurm(1, {{"PMI_RANK", "1"}}))
            .source == "Slurm");
}

TEST_CASE("Slurm's bad or incomplete environments are errors naming the variable") {
  const std::vector<std::string> jobs{"--jobs=ps:1,worker:2"};
  CHECK(error_of({"--jobs=ps:1,worker:1"}, slurm(0)) ==
        R"(SLURM_NTASKS=3 tasks, but --jobs="ps:1,worker:1" asks for 2; give --jobs whose )"
        "counts sum to 3");
  CHECK(error_of(jobs, slurm(0, {{"SLURM_STEP_NODELIST", "node[01-02"}})) ==
        R"(SLURM_STEP_NODELIST="node[01-02": at position 10: the '[' is not closed by ']')");
  CHECK(error_of(jobs, slurm(0, {{"SLURM_STEP_TASKS_PER_NODE", "2(x2"}})) ==
        R"~(SLURM_STEP_TASKS_PER_NODE="2(x2": at position 4: expected ')' to close "(x2")~");
  CHECK(error_of(jobs, slurm(0, {{"SLURM_STEP_TASKS_PER_NODE", "1(x3)"}})) ==
        R"~(SLURM_STEP_NODELIST="node[01-02]" names 2 node(s), but )~"
        R"~(SLURM_STEP_TASKS_PER_NODE="1(x3)" gives 3)~");
  CHECK(error_of(jobs, slurm(0, {{"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}})) ==
        R"~(SLURM_STEP_TASKS_PER_NODE="2(x2)" places 4 tasks, but SLURM_NTASKS=3)~");
  CHECK(error_of(jobs, slurm(3)) == "rank 3 is not below SLURM_NTASKS=3");
  CHECK(error_of(jobs, slurm(0, {{"SLURM_PROCID", "x"}})) ==
        R"(SLURM_PROCID="x" is not a non-negative integer)");
  auto no_ntasks = slurm(0);
  no_ntasks.erase("SLURM_NTASKS");
  CHECK(error_of(jobs, no_ntasks) == "SLURM_NTASKS is not set");
  auto batch_script = slurm(0);
  batch_script.erase("SLURM_STEP_NODELIST");
  CHECK(error_of(jobs, batch_script) ==
        "SLURM_STEP_NODELIST is not set (it is set in a job step: start the program with srun, "
        "not straight from the batch script)");
  CHECK(error_of(jobs, slurm(1, {{"PMI_RANK", "2"}})) ==
        R"(PMI_RANK="2" and SLURM_PROCID=1 disagree)");
  CHECK(error_of(jobs, slurm(2, {{"SLURMD_NODENAME", "node01"}})) ==
        R"(rank 2 runs on SLURMD_NODENAME="node01", but in blocks over the hosts it belongs )"
        R"(on "node02"; run srun with --distribution=block)");
  CHECK(error_of(jobs, slurm(1, {{"SLURM_LOCALID", "0"}})) ==
        R"(rank 1 has SLURM_LOCALID="0", but in blocks over the hosts it is task 1 on )"
        R"("node01"; run srun with --distribution=block)");
  CHECK(error_of({"--jobs=ps:1,worker:2", "--job_name=ps"}, slurm(1)) ==
        "--job_name=ps --task_index=(unset) disagree with Slurm, which makes this task "
        "/job:worker/task:0; drop the flags or make them agree");
  CHECK(error_of({"--jobs=ps:1,worker:2", "--port_base=65535"}, slurm(0)) ==
        "--port_base=65535 plus local index 1 on host node01 is past port 65535");
  CHECK(error_of({"--jobs=ps:1,worker:2", "--port_base=0"}, slurm(0)) ==
        "--port_base=0 is not a port (1..65535)");
}

TEST_CASE("--jobs: each malformed entry is named") {
  CHECK(error_of({"--jobs=ps"}, slurm(0)) ==
        R"(--jobs="ps": entry 0 "ps" is not job:count, as in ps:1)");
  CHECK(error_of({"--jobs=ps:1,9w:2"}, slurm(0)) ==
        R"(--jobs="ps:1,9w:2": entry 1 "9w:2": the job name "9w" is not a letter followed by )"
        "letters, digits or '_'");
  CHECK(error_of({"--jobs=ps:0,worker:3"}, slurm(0)) ==
        R"(--jobs="ps:0,worker:3": entry 0 "ps:0": the count "0" is not a positive integer)");
  CHECK(error_of({"--jobs=ps:1,ps:2"}, slurm(0)) ==
        R"(--jobs="ps:1,ps:2": entry 1 "ps:2": the job "ps" is given twice)");
}

TEST_CASE("mpirun: Open MPI and PMI ranks over --hosts or a hostfile") {
  const env_map ompi{{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"}};
  const auto r = resolve({"--jobs=ps:1,worker:2", "--hosts=a:2,b", "--port_base=5000"}, ompi);
  CHECK(r.source == "Open MPI");
  CHECK(r.cluster == loom::cluster_spec::from_flags("a:5000", "a:5001,b:5000"));
  CHECK(r.task_name() == "/job:worker/task:1");
  // Open MPI's own variables win over the SLURM_* an sbatch script's mpirun inherits.
  auto in_sbatch = ompi;
  in_sbatch["SLURM_PROCID"] = "0";
  in_sbatch["SLURM_NTASKS"] = "1";
  CHECK(resolve({"--jobs=ps:1,worker:2", "--hosts=a:3"}, in_sbatch).source == "Open MPI");

  const auto hostfile = std::filesystem::temp_directory_path() /
                        ("loom_resolver_hostfile_" + std::to_string(::getpid()));
  {
    std::ofstream out(hostfile);
    out << "# the cluster\na slots=1 max_slots=4\n\nb:2  # MPICH's form\n";
  }
  const auto p = resolve({"--jobs=ps:1,worker:2", "--hostfile=" + hostfile.string()},
                         {{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}});
  CHECK(p.source == "PMI");
  CHECK(p.cluster == loom::cluster_spec::from_flags("a:8888", "b:8888,b:8889"));
  CHECK(p.task_name() == "/job:worker/task:0");
  {
    std::ofstream out(hostfile);
    out << "a slots=2\nb slot=1\n";
  }
  CHECK(error_of({"--hostfile=" + hostfile.string()}, {{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}}) ==
        "--hostfile=\"" + hostfile.string() +
            R"(" line 2: "slot=1" is not slots=N or max_slots=N)");
  std::filesystem::remove(hostfile);
  CHECK(error_of({"--hostfile=" + hostfile.string()}, {{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}}) ==
        "--hostfile=\"" + hostfile.string() + "\": cannot be read");
}

TEST_CASE("mpirun's bad or incomplete environments are errors") {
  const env_map ompi{{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "3"}};
  CHECK(error_of({}, ompi) ==
        "OMPI_COMM_WORLD_RANK is set (started by mpirun), but MPI does not tell a task the "
        "hosts: give --hosts=host1:slots,host2:slots (as mpirun's --host) or --hostfile (the "
        "file given to mpirun)");
  CHECK(error_of({"--hosts=a:2"}, ompi) == "--hosts gives 2 slot(s), fewer than "
                                           "OMPI_COMM_WORLD_SIZE=3");
  CHECK(error_of({"--hosts=a:x"}, ompi) ==
        R"(--hosts="a:x": entry 0 "a:x": the slots "x" are not a positive integer)");
  CHECK(error_of({"--hosts=a,:2"}, ompi) == R"(--hosts="a,:2": entry 1 ":2" has no host; )"
                                            "expected host or host:slots");
  CHECK(error_of({"--hosts=a", "--hostfile=f"}, ompi) ==
        "--hosts and --hostfile both give the hosts; give one");
  CHECK(error_of({"--hosts=a:3", "--jobs=ps:1,worker:1"}, ompi) ==
        R"(OMPI_COMM_WORLD_SIZE=3 tasks, but --jobs="ps:1,worker:1" asks for 2; give --jobs )"
        "whose counts sum to 3");
  auto no_size = ompi;
  no_size.erase("OMPI_COMM_WORLD_SIZE");
  CHECK(error_of({"--hosts=a:3"}, no_size) == "OMPI_COMM_WORLD_SIZE is not set");
  auto local = ompi;
  local["OMPI_COMM_WORLD_LOCAL_RANK"] = "0";
  CHECK(error_of({"--hosts=a:3"}, local) ==
        R"(rank 1 has OMPI_COMM_WORLD_LOCAL_RANK="0", but in blocks over the hosts it is task 1 )"
        R"(on "a"; give the hosts and slots in mpirun's order and map by slot (--map-by slot))");
}

TEST_CASE("no source: the program's defaults, and the rank-only flags are errors") {
  const auto r = resolve({"--job_name=ps"}, {},
                         {.ps_hosts = "127.0.0.1:2222", .worker_hosts = "127.0.0.1:2223"});
  CHECK(r.source == "defaults");
  CHECK(r.cluster == loom::cluster_spec::from_flags("127.0.0.1:2222", "127.0.0.1:2223"));
  CHECK(r.task_name() == "/job:ps/task:0");
  CHECK(error_of({"--port_base=9000"}, {}) ==
        "--port_base is for srun and mpirun (SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK), "
        "but the cluster comes from the flags' defaults (no TF_CONFIG, srun or mpirun); drop "
        "--port_base");
  CHECK(error_of({"--ps_hosts=p:1", "--hosts=a"}, {}) ==
        "--hosts is for srun and mpirun (SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK), but "
        "the cluster comes from --ps_hosts/--worker_hosts; drop --hosts");
  CHECK(error_in([&] { resolve({}, {}).require_task(); }) ==
        "Must specify an explicit `job_name`: give --job_name and --task_index, set TF_CONFIG, "
        "or start the program under srun or mpirun (with --jobs)");
  CHECK(error_in([&] {
          resolve({"--job_name=ps", "--task_index=-1"}, {}).require_task();
        }) == "Must specify an explicit `task_index` (--task_index)");
}

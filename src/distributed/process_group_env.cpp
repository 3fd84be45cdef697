#include "distributed/process_group_env.h"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <optional>

#include "core/error.h"

namespace mt {

namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

// A whole non-negative decimal number.
int parse_count(const char* name, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v.c_str(), &end, 10);
  const bool whole = end != v.c_str() && *end == '\0';
  if (!whole || errno != 0 || x < 0 || x > 1'000'000)
    fail("environment: {}='{}' is not a non-negative integer", name, v);
  return static_cast<int>(x);
}

struct Names {
  const char *rank, *world, *local_rank, *local_world, *source;  // local_world null: worked out below
  RankSource from;
  bool keyed_by_world;  // the set applies only when its world variable is there (the rank may be set anyway)
};

unsigned long long parse_id(const char* name, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v[0] == '-' || *end != '\0' || errno != 0)
    fail("environment: {}='{}' is not a non-negative integer", name, v);
  return x;
}

}  // namespace

ProcessGroupEnv process_group_env_from_environment() {
  ProcessGroupEnv e;
  const Names sets[] = {
      {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "torchrun-style variables (RANK, WORLD_SIZE)",
       RankSource::torchrun, false},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
       "OpenMPI (OMPI_COMM_WORLD_*)", RankSource::open_mpi, false},
      // Only srun's tasks have the step variables: a batch script or an salloc shell also has SLURM_PROCID and
      // the allocation's SLURM_NTASKS, but is one process (its job may start the ranks with srun or launch).
      {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", nullptr,
       "Slurm's srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS)", RankSource::slurm, true},
  };
  for (const Names& n : sets) {
    const auto rank = env(n.rank), world = env(n.world);
    if (n.keyed_by_world ? !world : (!rank && !world)) continue;
    if (!rank || !world) fail("environment: {} is set but {} is not", rank ? n.rank : n.world, rank ? n.world : n.rank);
    e.rank = parse_count(n.rank, *rank);
    e.world = parse_count(n.world, *world);
    if (e.world < 1) fail("environment: {}={} must be at least 1", n.world, e.world);
    if (e.rank >= e.world) fail("environment: {}={} is not below {}={}", n.rank, e.rank, n.world, e.world);
    const auto lr = env(n.local_rank);
    e.local_rank = lr ? parse_count(n.local_rank, *lr) : e.rank;
    const char* local_world_var = n.local_world;
    e.local_world = e.world;
    if (n.local_world) {
      if (const auto lw = env(n.local_world)) e.local_world = parse_count(n.local_world, *lw);
    } else if (const auto per_node = env("SLURM_STEP_TASKS_PER_NODE")) {
      // This node's tasks: entry SLURM_NODEID of the step's per-node counts ("2(x3),1").
      const auto node = env("SLURM_NODEID");
      e.local_world = slurm_tasks_on_node(*per_node, node ? parse_count("SLURM_NODEID", *node) : 0,
                                          "SLURM_STEP_TASKS_PER_NODE");
      local_world_var = "SLURM_STEP_TASKS_PER_NODE";
    }
    if (e.local_world < 1 || e.local_rank >= e.local_world)
      fail("environment: {}={} is not below {}={}", n.local_rank, e.local_rank,
           local_world_var ? local_world_var : n.world, e.local_world);
    e.source = n.source;
    e.from = n.from;
    break;
  }
  if (const auto a = env("MASTER_ADDR"); a) {
    if (a->empty()) fail("environment: MASTER_ADDR is empty");
    e.master_addr = *a;
    e.master_addr_given = true;
  }
  if (const auto fd = env(kRendezvousFdVar); fd && e.rank == 0) e.rendezvous_fd = parse_count(kRendezvousFdVar, *fd);
  if (const auto p = env("MASTER_PORT"); p) {
    const int port = parse_count("MASTER_PORT", *p);
    if (port < 1 || port > 65535) fail("environment: MASTER_PORT={} is not a port (1..65535)", port);
    e.master_port = port;
    e.master_port_given = true;
  }
  if (e.from == RankSource::slurm && e.world > 1) {
    // srun without MASTER_ADDR / MASTER_PORT: task 0 runs on the step's first node.
    if (!e.master_addr_given) {
      for (const char* var : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
        if (const auto list = env(var); list) {
          e.master_addr = slurm_first_host(*list, var);
          e.source += std::string(", rendezvous on the first host of ") + var;
          break;
        }
      }
    }
    if (const auto job = env("SLURM_JOB_ID"); job && !e.master_port_given) {
      const auto step = env("SLURM_STEP_ID");
      e.master_port =
          slurm_rendezvous_port(parse_id("SLURM_JOB_ID", *job), step ? parse_id("SLURM_STEP_ID", *step) : 0);
    }
  }
  return e;
}

std::string slurm_first_host(const std::string& list, const char* var) {
  auto bad = [&](const char* why) {
    fail("environment: {}='{}' is not a Slurm host list ({})", var, list, why);
  };
  // The first entry: up to the first comma outside brackets.
  std::string first;
  int depth = 0;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) bad("a ']' without its '['");
    if (c == ',' && depth == 0) break;
    first += c;
  }
  if (depth != 0) bad("a '[' without its ']'");
  // Each bracketed range set gives its first number, zero padding kept ("[007-010,012]" -> "007").
  std::string host;
  for (size_t i = 0; i < first.size();) {
    if (first[i] != '[') {
      host += first[i++];
      continue;
    }
    const size_t close = first.find(']', i);
    const std::string ranges = first.substr(i + 1, close - i - 1);
    size_t digits = 0;
    while (digits < ranges.size() && ranges[digits] >= '0' && ranges[digits] <= '9') ++digits;
    if (digits == 0) bad("a range that does not start with a number");
    host += ranges.substr(0, digits);
    i = close + 1;
  }
  if (host.empty()) bad("no host");
  return host;
}

int slurm_tasks_on_node(const std::string& spec, int node, const char* var) {
  auto bad = [&]() { fail("environment: {}='{}' is not a list of tasks per node (e.g. 2(x3),1)", var, spec); };
  // Every entry is checked, then the node's is looked up.
  int64_t nodes = 0;
  int found = 0;
  for (size_t i = 0; i <= spec.size();) {
    size_t end = spec.find(',', i);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(i, end - i);
    char* rest = nullptr;
    errno = 0;
    const long tasks = std::strtol(item.c_str(), &rest, 10);
    if (item.empty() || rest == item.c_str() || errno != 0 || tasks < 1 || tasks > 1'000'000) bad();
    long repeat = 1;
    if (*rest == '(') {
      if (rest[1] != 'x') bad();
      char* close = nullptr;
      repeat = std::strtol(rest + 2, &close, 10);
      if (close == rest + 2 || *close != ')' || close[1] != '\0' || repeat < 1 || repeat > 1'000'000) bad();
    } else if (*rest != '\0') {
      bad();
    }
    if (found == 0 && node < nodes + repeat) found = static_cast<int>(tasks);
    nodes += repeat;
    i = end + 1;
  }
  if (found == 0) fail("environment: {}='{}' lists {} nodes, SLURM_NODEID is {}", var, spec, nodes, node);
  return found;
}

int slurm_rendezvous_port(unsigned long long job_id, unsigned long long step_id) {
  return static_cast<int>(20000 + (job_id % 10000) * 4 + step_id % 4);
}

}  // namespace mt

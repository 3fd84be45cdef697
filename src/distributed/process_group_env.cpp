#include "distributed/process_group_env.h"

#include <cerrno>
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

// A whole non-negative decimal number (Slurm's SLURM_NTASKS_PER_NODE may read "4(x2)": its first number).
int parse_count(const char* name, const std::string& v, bool leading_only = false) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v.c_str(), &end, 10);
  const bool whole = end != v.c_str() && (leading_only || *end == '\0');
  if (!whole || errno != 0 || x < 0 || x > 1'000'000)
    fail("environment: {}='{}' is not a non-negative integer", name, v);
  return static_cast<int>(x);
}

struct Names {
  const char *rank, *world, *local_rank, *local_world, *source;
};

}  // namespace

ProcessGroupEnv process_group_env_from_environment() {
  ProcessGroupEnv e;
  const Names sets[] = {
      {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "torchrun-style variables (RANK, WORLD_SIZE)"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
       "OpenMPI (OMPI_COMM_WORLD_*)"},
      {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "Slurm (SLURM_PROCID, SLURM_NTASKS)"},
  };
  for (const Names& n : sets) {
    const auto rank = env(n.rank), world = env(n.world);
    if (!rank && !world) continue;
    if (!rank || !world) fail("environment: {} is set but {} is not", rank ? n.rank : n.world, rank ? n.world : n.rank);
    e.rank = parse_count(n.rank, *rank);
    e.world = parse_count(n.world, *world);
    if (e.world < 1) fail("environment: {}={} must be at least 1", n.world, e.world);
    if (e.rank >= e.world) fail("environment: {}={} is not below {}={}", n.rank, e.rank, n.world, e.world);
    const auto lr = env(n.local_rank), lw = env(n.local_world);
    e.local_rank = lr ? parse_count(n.local_rank, *lr) : e.rank;
    e.local_world = lw ? parse_count(n.local_world, *lw, /*leading_only=*/true) : e.world;
    if (e.local_world < 1 || e.local_rank >= e.local_world)
      fail("environment: {}={} is not below {}={}", n.local_rank, e.local_rank, n.local_world, e.local_world);
    e.source = n.source;
    e.open_mpi = std::string(n.rank) == "OMPI_COMM_WORLD_RANK";
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
  return e;
}

}  // namespace mt

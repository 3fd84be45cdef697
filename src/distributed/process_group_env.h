// Where this process sits in a multi-process job, read from the launcher's environment:
//   torchrun style (what `mixtune launch` sets): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//     MASTER_PORT;
//   OpenMPI's mpirun: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//     OMPI_COMM_WORLD_LOCAL_SIZE;
//   Slurm's srun: SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, and this node's entry (SLURM_NODEID) of
//     SLURM_STEP_TASKS_PER_NODE. Without the step variables (a batch script, an salloc shell): one process.
// The first complete set wins in that order. The rendezvous address comes from MASTER_ADDR / MASTER_PORT
// (default 127.0.0.1:29500, enough for one node). Under srun without them: the first host of the step's node
// list (where Slurm starts task 0) and a port from the job and step ids, so a job across nodes needs neither;
// under mpirun in a build with MPI, MPI bootstraps it (distributed/mpi_bootstrap.h). No variable at all: a
// single process (rank 0 of 1).
#pragma once
#include <string>

namespace mt {

// Set by `mixtune launch` for rank 0 only: the file descriptor of the rendezvous socket it already listens on.
inline constexpr const char* kRendezvousFdVar = "MIXTUNE_RENDEZVOUS_FD";

// Which launcher's variables gave the ranks.
enum class RankSource { single, torchrun, open_mpi, slurm };

struct ProcessGroupEnv {
  int rank = 0, world = 1;
  int local_rank = 0, local_world = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single process";  // which launcher's variables were read
  int rendezvous_fd = -1;  // rank 0 under `mixtune launch`: the already-listening rendezvous socket
  bool master_addr_given = false;  // MASTER_ADDR was in the environment (else the default above)
  bool master_port_given = false;  // MASTER_PORT likewise
  RankSource from = RankSource::single;
};

// Throws mt::Error naming the variable for a malformed or inconsistent value (rank outside the world, a
// port outside 1..65535, ...).
ProcessGroupEnv process_group_env_from_environment();

// The first host of a Slurm host list ("gpu-[007-010,012],cpu3" -> "gpu-007"); `var` names the variable in the
// error for a malformed list.
std::string slurm_first_host(const std::string& list, const char* var);

// The tasks a Slurm step runs on node `node` (0-based) from a per-node list such as SLURM_STEP_TASKS_PER_NODE
// ("2(x3),1": three nodes of 2, then one of 1); errors name `var`.
int slurm_tasks_on_node(const std::string& spec, int node, const char* var);

// The rendezvous port of a Slurm job step without MASTER_PORT: 20000 + (job id mod 10000) * 4 + step id mod 4, so
// concurrent jobs (and up to four concurrent steps of one job) sharing a node pick different ports.
int slurm_rendezvous_port(unsigned long long job_id, unsigned long long step_id);

}  // namespace mt

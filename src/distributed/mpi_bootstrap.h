// Jobs started by Open MPI's mpirun (rank and size from OMPI_COMM_WORLD_*, process_group_env.h). In a build
// with MPI (CMake finds it: -DMIXTUNE_MPI=OFF leaves it out) such a job initialises MPI and bootstraps through
// it, so a job across nodes needs no MASTER_ADDR / MASTER_PORT: rank 0 opens the TCP rendezvous on a free
// port (MASTER_PORT when given) and MPI broadcasts where it listens; NCCL's unique ids also go through MPI
// (distributed/cuda/nccl_communicator.cpp). The CPU collectives stay on the TCP mesh, as under `mixtune launch`.
// MPI is finalised only when the command succeeds: a failing rank exits without it, and mpirun, seeing a rank
// end without finalising, stops the others (no rank hangs).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "distributed/process_group_env.h"

namespace mt {

// Whether this build has MPI.
bool mpi_built();

// A multi-rank job under mpirun in a build with MPI: initialises MPI (once; its rank and size must be env's)
// and, unless MASTER_ADDR was given, returns env with master_addr / master_port where rank 0 now listens
// (rank 0's rendezvous_fd is that listener) and " rendezvous through MPI" added to its source. Any other
// job: env unchanged. Errors (a port that cannot be bound, MPI failing) throw mt::Error on every rank.
ProcessGroupEnv mpi_bootstrap(const ProcessGroupEnv& env);

// Whether mpi_bootstrap initialised MPI in this process.
bool mpi_active();

// root's bytes to every rank of the job over MPI (requires mpi_active()).
void mpi_broadcast(void* data, size_t bytes, int root, const std::string& what);

// Ends MPI after a successful command; nothing when MPI is not active.
void mpi_finalize();

// Where the other ranks reach rank 0, from every rank's host name (rank order): loopback when all ranks run
// on rank 0's host, else rank 0's host name.
std::string rendezvous_host(const std::vector<std::string>& host_names);

}  // namespace mt

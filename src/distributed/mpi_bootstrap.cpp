#include "distributed/mpi_bootstrap.h"

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "distributed/tcp_socket.h"

#ifdef MIXTUNE_HAVE_MPI
// MPI's C API only: without these, mpi.h in C++ pulls in the C++ bindings (a library we do not link).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace mt {

namespace {
bool g_active = false;
}  // namespace

std::string rendezvous_host(const std::vector<std::string>& host_names) {
  MT_CHECK(!host_names.empty(), "rendezvous_host: no host names");
  for (const std::string& h : host_names)
    if (h != host_names[0]) return host_names[0];
  return "127.0.0.1";
}

bool mpi_active() { return g_active; }

#ifdef MIXTUNE_HAVE_MPI

namespace {

void check(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail("{}: {}", what, std::string(text, static_cast<size_t>(len)));
}

constexpr int kHostBytes = 256;

// What rank 0 broadcasts: where it listens, or why it could not.
struct Rendezvous {
  int32_t ok = 0, port = 0;
  char addr[kHostBytes] = {};
  char error[512] = {};
};

}  // namespace

bool mpi_built() { return true; }

ProcessGroupEnv mpi_bootstrap(const ProcessGroupEnv& env) {
  if (env.from != RankSource::open_mpi || env.world <= 1) return env;
  const std::string who = "rank " + std::to_string(env.rank) + ": MPI bootstrap";
  if (!g_active) {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), who + ": MPI_Init_thread");
    }
    g_active = true;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  int rank = -1, size = -1;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &rank), who + ": MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &size), who + ": MPI_Comm_size");
  if (rank != env.rank || size != env.world)
    fail("{}: MPI says rank {} of {}, OMPI_COMM_WORLD_RANK / _SIZE say {} of {}", who, rank, size, env.rank,
         env.world);
  if (env.master_addr_given) return env;  // the user's rendezvous; NCCL ids still go through MPI

  char host[kHostBytes] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) fail("{}: gethostname: {}", who, std::strerror(errno));
  std::vector<char> all(static_cast<size_t>(kHostBytes) * static_cast<size_t>(size));
  check(MPI_Allgather(host, kHostBytes, MPI_CHAR, all.data(), kHostBytes, MPI_CHAR, MPI_COMM_WORLD),
        who + ": MPI_Allgather(host names)");
  std::vector<std::string> names;
  for (int r = 0; r < size; ++r) names.emplace_back(all.data() + static_cast<size_t>(r) * kHostBytes);

  Rendezvous where;
  Socket listener;
  if (rank == 0) {
    // Every interface: the other nodes' ranks connect to rank 0's host name.
    try {
      int port = 0;
      listener = tcp_listen("0.0.0.0", env.master_port_given ? env.master_port : 0, &port,
                            "rank 0: rendezvous listener");
      where.ok = 1;
      where.port = port;
      std::snprintf(where.addr, sizeof(where.addr), "%s", rendezvous_host(names).c_str());
    } catch (const Error& e) {
      std::snprintf(where.error, sizeof(where.error), "%s", e.what());
    }
  }
  check(MPI_Bcast(&where, sizeof(where), MPI_BYTE, 0, MPI_COMM_WORLD), who + ": MPI_Bcast(rendezvous address)");
  if (!where.ok) {
    if (rank == 0) fail("{}", where.error);
    fail("{}: rank 0 could not open the rendezvous: {}", who, where.error);
  }
  ProcessGroupEnv out = env;
  out.master_addr = where.addr;
  out.master_port = where.port;
  if (rank == 0) out.rendezvous_fd = listener.release();
  out.source += ", rendezvous through MPI";
  return out;
}

void mpi_broadcast(void* data, size_t bytes, int root, const std::string& what) {
  MT_CHECK(g_active, "mpi_broadcast ({}): MPI is not initialised", what);
  MT_CHECK(bytes <= static_cast<size_t>(INT32_MAX), "mpi_broadcast ({}): {} bytes is too many", what, bytes);
  check(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast(" + what + ")");
}

void mpi_finalize() {
  if (!g_active) return;
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (!finalised) MPI_Finalize();
  g_active = false;
}

#else  // built without MPI: mpirun jobs rendezvous at MASTER_ADDR:MASTER_PORT like any other.

bool mpi_built() { return false; }
ProcessGroupEnv mpi_bootstrap(const ProcessGroupEnv& env) { return env; }
void mpi_broadcast(void*, size_t, int, const std::string& what) {
  fail("mpi_broadcast ({}): this build has no MPI", what);
}
void mpi_finalize() {}

#endif

}  // namespace mt

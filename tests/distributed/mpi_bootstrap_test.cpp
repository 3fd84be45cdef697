// The MPI bootstrap's parts that need no mpirun: where the ranks meet rank 0, and that a job not started by
// mpirun is left alone. tests/cli/launch_cli_test.cpp runs real mpirun jobs (MpirunBootstraps…).
#include "distributed/mpi_bootstrap.h"

#include <gtest/gtest.h>

namespace mt {
namespace {

TEST(MpiBootstrap, RanksOnRankZerosHostMeetOnLoopbackElseAtItsName) {
  EXPECT_EQ(rendezvous_host({"node-a"}), "127.0.0.1");
  EXPECT_EQ(rendezvous_host({"node-a", "node-a", "node-a"}), "127.0.0.1");
  EXPECT_EQ(rendezvous_host({"node-a", "node-a", "node-b"}), "node-a");
  EXPECT_EQ(rendezvous_host({"node-b", "node-a"}), "node-b");
}

TEST(MpiBootstrap, JobsNotStartedByMpirunAreLeftAlone) {
  ProcessGroupEnv torchrun;
  torchrun.rank = 1;
  torchrun.world = 2;
  torchrun.master_addr = "10.0.0.7";
  torchrun.master_port = 23456;
  torchrun.source = "torchrun-style variables";
  const ProcessGroupEnv a = mpi_bootstrap(torchrun);
  EXPECT_EQ(a.master_addr, "10.0.0.7");
  EXPECT_EQ(a.master_port, 23456);
  EXPECT_EQ(a.source, "torchrun-style variables");
  ProcessGroupEnv single;
  single.from = RankSource::open_mpi;  // mpirun -np 1: nothing to bootstrap
  EXPECT_EQ(mpi_bootstrap(single).source, single.source);
  EXPECT_FALSE(mpi_active());
}

}  // namespace
}  // namespace mt

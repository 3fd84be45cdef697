// NCCL's unique ids through MPI (distributed/mpi_bootstrap.h) on one GPU: the test starts this test binary
// under mpirun as two ranks that run the disabled child test below. Each rank makes its own one-rank NCCL
// group ({0} and {1}: rank 1 is the root of its group's id broadcast), so both can share the GPU; they check
// MPI's broadcast from either root and use their communicators.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <unistd.h>

#include "../../cli/cli_process.h"
#include "../../kernels/cuda/cuda_test_util.h"
#include "../mpirun_util.h"
#include "distributed/communicator.h"
#include "distributed/cuda/nccl_communicator.h"
#include "distributed/mpi_bootstrap.h"
#include "distributed/process_group_env.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

TEST(CudaNcclIds, GoThroughMpiUnderMpirun) {
  MT_SKIP_WITHOUT_CUDA();
  if (!mpi_built()) GTEST_SKIP() << "built without MPI (-DMIXTUNE_MPI=OFF)";
  const std::string mpirun = test::find_on_path("mpirun");
  ASSERT_FALSE(mpirun.empty()) << "mpirun is not on PATH (apt-get install openmpi-bin)";
  const fs::path self = fs::read_symlink("/proc/self/exe");
  const fs::path log = fs::temp_directory_path() / ("mt_nccl_ids_mpi_" + std::to_string(::getpid()) + ".log");
  const int rc = test::wait_exit(test::spawn_program(
      mpirun,
      test::mpirun_args(2, {}, self.string(),
                        {"--gtest_also_run_disabled_tests", "--gtest_color=no", "--gtest_filter=CudaNcclIdsChild.*"}),
      log, {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}));
  const std::string out = test::slurp(log);
  fs::remove(log);
  ASSERT_EQ(rc, 0) << out;
  size_t ok = 0;
  for (size_t at = out.find("[       OK ] CudaNcclIdsChild."); at != std::string::npos;
       at = out.find("[       OK ] CudaNcclIdsChild.", at + 1))
    ++ok;
  EXPECT_EQ(ok, 2u) << out;  // one per rank
}

// Runs only as a rank of the test above (disabled otherwise).
TEST(CudaNcclIdsChild, DISABLED_OneRankGroupsTakeTheirIdsThroughMpi) {
  const ProcessGroupEnv pg = mpi_bootstrap(process_group_env_from_environment());
  ASSERT_EQ(pg.world, 2);
  ASSERT_TRUE(mpi_active());
  EXPECT_NE(pg.source.find("rendezvous through MPI"), std::string::npos) << pg.source;
  for (int root = 0; root < 2; ++root) {
    int value = pg.rank == root ? 100 + root : -1;
    mpi_broadcast(&value, sizeof value, root, "test value");
    EXPECT_EQ(value, 100 + root) << "broadcast from rank " << root;
  }
  {
    std::unique_ptr<Communicator> host = tcp_communicator_create(pg, std::chrono::seconds(60));
    std::unique_ptr<NcclCommunicator> comm =
        NcclCommunicator::create_group(*host, 0, std::chrono::seconds(60), {{0}, {1}}, "test group");
    EXPECT_EQ(comm->size(), 1);
    EXPECT_EQ(comm->rank(), 0);
    cudaStream_t s = cuda::device_context(0).stream;
    float* d = nullptr;
    MT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(float)));
    const float x = 3.0f + static_cast<float>(pg.rank);
    MT_CUDA_CHECK(cudaMemcpyAsync(d, &x, sizeof x, cudaMemcpyHostToDevice, s));
    comm->all_reduce_sum(d, 1, DType::F32, s, "test all_reduce");
    comm->wait(s, "test all_reduce");
    float y = 0;
    MT_CUDA_CHECK(cudaMemcpyAsync(&y, d, sizeof y, cudaMemcpyDeviceToHost, s));
    MT_CUDA_CHECK(cudaStreamSynchronize(s));
    MT_CUDA_CHECK(cudaFree(d));
    EXPECT_EQ(y, x);  // a group of one sums only its own value
  }
  mpi_finalize();
}

}  // namespace
}  // namespace mt

// The trail of queued collectives (distributed/cuda/collective_trail.h) names the first one that has not
// finished: a spin kernel stands in for a collective whose peer never came.
#include "distributed/cuda/collective_trail.h"

#include <gtest/gtest.h>

#include "../../kernels/cuda/cuda_test_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/gpu_spin.h"

namespace mt {
namespace {

TEST(CudaCollectiveTrail, NamesTheFirstUnfinishedCollective) {
  MT_SKIP_WITHOUT_CUDA();
  cudaStream_t s = cuda::device_context(0).stream;
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
  CollectiveTrail trail;
  EXPECT_EQ(trail.first_unfinished(), "");
  trail.record(s, "layer 0: all_gather(tokens)");
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
  cuda::gpu_spin(400'000'000, s);  // 0.4 s: "layer 1" waits behind it
  trail.record(s, "layer 1: all_gather(tokens)");
  trail.record(s, "layer 1: reduce_scatter(combine)");
  EXPECT_EQ(trail.first_unfinished(), "layer 1: all_gather(tokens)");
  // Finished entries are dropped as new ones come: layer 0's went at the second record.
  EXPECT_EQ(trail.pending(), 2u);
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(trail.first_unfinished(), "");
  trail.record(s, "step 1: all_reduce(gradients)");
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(trail.pending(), 1u);  // the finished ones returned their events at this record
  EXPECT_EQ(trail.first_unfinished(), "");
}

TEST(CudaCollectiveTrail, KeepsAtMostItsLimitAndTheNewestNames) {
  MT_SKIP_WITHOUT_CUDA();
  cudaStream_t s = cuda::device_context(0).stream;
  CollectiveTrail trail;
  cuda::gpu_spin(300'000'000, s);
  for (size_t i = 0; i < CollectiveTrail::kMaxPending + 10; ++i) trail.record(s, "op " + std::to_string(i));
  EXPECT_EQ(trail.pending(), CollectiveTrail::kMaxPending);
  EXPECT_EQ(trail.first_unfinished(), "op 10");  // the ten oldest forgotten
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(trail.first_unfinished(), "");
}

}  // namespace
}  // namespace mt

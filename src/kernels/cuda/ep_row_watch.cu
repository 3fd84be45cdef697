#include <climits>
#include <cstdint>

#include "kernels/cuda/ep_row_watch.h"
#include "kernels/cuda/kernel_launch.cuh"

namespace mt::cuda::detail {

namespace {

// One block, thread j for offsets[j], j <= live (at most 1025 entries: moe_plan takes up to 1024 buckets).
__global__ void ep_watch_kernel(int32_t* __restrict__ offsets, int live, int32_t capacity, int64_t share,
                                int64_t scale, int32_t* __restrict__ watch) {
  pdl_wait();
  for (int j = threadIdx.x; j <= live; j += blockDim.x) {
    const int32_t v = offsets[j];
    if (j == live) {
      const int64_t load = (static_cast<int64_t>(v) * scale + share - 1) / share;
      atomicMax(&watch[0], static_cast<int32_t>(load < INT32_MAX ? load : INT32_MAX));
      if (v > capacity) atomicAdd(&watch[1], 1);
    }
    // Each thread reads and writes its own entries only: no barrier between the read and the clamp.
    if (v > capacity) offsets[j] = capacity;
  }
}

}  // namespace

void ep_watch_launch(int32_t* offsets, int live, int32_t capacity, int64_t share, int64_t scale, int32_t* watch,
                     cudaStream_t stream) {
  const int threads = (live + 1 + 31) / 32 * 32 < 1024 ? (live + 1 + 31) / 32 * 32 : 1024;
  launch_kernel(ep_watch_kernel, 1, threads, 0, stream, offsets, live, capacity, share, scale, watch);
}

}  // namespace mt::cuda::detail

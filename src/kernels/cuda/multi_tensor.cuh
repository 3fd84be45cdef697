// Multi-tensor launches: many tensors updated by one kernel, the tensor list passed by value in the
// kernel parameters (no host->device copy, nothing to synchronise). Each tensor is cut into chunks of
// kChunkElems; a block finds its tensor by searching the chunk prefix sums. A list longer than
// kMaxTensors is split over several launches.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_common.cuh"

namespace mt::cuda {

constexpr int kMultiTensorMax = 24;
constexpr int64_t kChunkElems = 65536;
constexpr int kMultiTensorThreads = 512;

// Per-launch tensor table. chunk_begin[i] is the first block of tensor i; chunk_begin[count] the total.
struct MultiTensorTable {
  int count = 0;
  int64_t numel[kMultiTensorMax];
  int64_t chunk_begin[kMultiTensorMax + 1];
};

inline int64_t chunks_of(int64_t n) { return (n + kChunkElems - 1) / kChunkElems; }

// Fills the chunk prefix sums of a table whose numel[] is set; returns the block count.
inline int64_t table_finish(MultiTensorTable& t) {
  t.chunk_begin[0] = 0;
  for (int i = 0; i < t.count; ++i) t.chunk_begin[i + 1] = t.chunk_begin[i] + chunks_of(t.numel[i]);
  return t.chunk_begin[t.count];
}

// The tensor owning block b (binary search over chunk_begin).
__device__ inline int table_tensor(const MultiTensorTable& t, int64_t b) {
  int lo = 0, hi = t.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.chunk_begin[mid] <= b) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

}  // namespace mt::cuda

#include <climits>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_attention_kernels.h"
#include "kernels/cuda/kernel_launch.cuh"

// Per-token document bounds for packed sequences: start[t] = first token of t's document, end[t] = one
// past its last. From doc ids (a new document begins where the id changes, and at each batch row) one
// block per batch row runs a max-scan of the start positions left to right and a min-scan of the end
// positions right to left, 1024 tokens at a time with a carry.

namespace mt::cuda {

namespace {

constexpr int kScanThreads = 1024;

// Inclusive scan of one value per thread over the block (op = max or min), with `carry` folded in first.
template <bool MAX>
__device__ int block_scan(int v, int* s_warp) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  auto op = [](int x, int y) { return MAX ? max(x, y) : min(x, y); };
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v = op(v, u);
  }
  if (lane == 31) s_warp[warp] = v;
  __syncthreads();
  int prev = MAX ? INT_MIN : INT_MAX;
  for (int w = 0; w < warp; ++w) prev = op(prev, s_warp[w]);
  __syncthreads();
  return op(prev, v);
}

__global__ void __launch_bounds__(kScanThreads)
    docs_from_ids_kernel(const int32_t* __restrict__ doc, int S, int32_t* __restrict__ start,
                         int32_t* __restrict__ end) {
  pdl_wait();
  __shared__ int s_warp[kScanThreads / 32];
  __shared__ int s_carry;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * S;
  const int32_t* d = doc ? doc + row : nullptr;
  if (threadIdx.x == 0) s_carry = 0;
  __syncthreads();
  for (int c0 = 0; c0 < S; c0 += kScanThreads) {
    const int i = c0 + threadIdx.x;
    int v = INT_MIN;
    if (i < S) v = (i == 0 || (d && d[i] != d[i - 1])) ? i : 0;
    v = max(v, s_carry);
    v = block_scan<true>(v, s_warp);
    if (i < S) start[row + i] = static_cast<int32_t>(row + v);
    if (threadIdx.x == kScanThreads - 1) s_carry = v;
    __syncthreads();
  }
  if (threadIdx.x == 0) s_carry = S;
  __syncthreads();
  // Right to left: thread j of a chunk takes position c1 − 1 − j, so the scan order runs leftwards.
  for (int c1 = S; c1 > 0; c1 -= kScanThreads) {
    const int i = c1 - 1 - static_cast<int>(threadIdx.x);
    int v = INT_MAX;
    if (i >= 0) v = (i == S - 1 || (d && d[i + 1] != d[i])) ? i + 1 : S;
    v = min(v, s_carry);
    v = block_scan<false>(v, s_warp);
    if (i >= 0) end[row + i] = static_cast<int32_t>(row + v);
    if (threadIdx.x == kScanThreads - 1) s_carry = v;
    __syncthreads();
  }
}

// One block per document of cu_seqlens.
__global__ void docs_from_cu_kernel(const int32_t* __restrict__ cu, int32_t* __restrict__ start,
                                    int32_t* __restrict__ end) {
  pdl_wait();
  const int b = cu[blockIdx.x], e = cu[blockIdx.x + 1];
  for (int t = b + static_cast<int>(threadIdx.x); t < e; t += blockDim.x) start[t] = b, end[t] = e;
}

}  // namespace

namespace detail {

void attention_docs_from_ids_launch(const int32_t* doc, int B, int S, int32_t* start, int32_t* end,
                                    cudaStream_t stream) {
  if (B == 0 || S == 0) return;
  launch_kernel(docs_from_ids_kernel, B, kScanThreads, 0, stream, doc, S, start, end);
}

void attention_docs_from_cu_seqlens_launch(const int32_t* cu, int docs, int32_t* start, int32_t* end,
                                           cudaStream_t stream) {
  if (docs == 0) return;
  launch_kernel(docs_from_cu_kernel, docs, 256, 0, stream, cu, start, end);
}

}  // namespace detail
}  // namespace mt::cuda

#include "kernels/cuda/ep_regroup.h"

#include <cuda_bf16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/tensor_checks.h"
#include "kernels/cuda/kernel_launch.cuh"

namespace mt::cuda {

namespace {

// One thread: the table is ep·El entries (= E, at most a few hundred), once per layer.
__global__ void ep_layout_kernel(const int32_t* __restrict__ g, int ep, int me, int el, int32_t* __restrict__ seg,
                                 int32_t* __restrict__ local_offsets) {
  pdl_wait();
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const int E = ep * el, n = ep * el;
  int32_t* src_first = seg;
  int32_t* dst_first = seg + n;
  int32_t* count = seg + 2 * n;
  int32_t src_row = 0;
  for (int s = 0; s < ep; ++s) {
    const int32_t* off = g + static_cast<int64_t>(s) * (E + 1);
    for (int e = 0; e < el; ++e) {
      const int32_t c = off[me * el + e + 1] - off[me * el + e];
      src_first[s * el + e] = src_row;
      count[s * el + e] = c;
      src_row += c;
    }
  }
  int32_t dst_row = 0;
  for (int e = 0; e < el; ++e) {
    local_offsets[e] = dst_row;
    for (int s = 0; s < ep; ++s) {
      dst_first[s * el + e] = dst_row;
      dst_row += count[s * el + e];
    }
  }
  local_offsets[el] = dst_row;
}

// Block (x, segment): rows x, x + gridDim.x, ... of the segment, one warp per row, 16 bytes per lane.
__global__ void ep_regroup_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, const int32_t* __restrict__ seg,
                                  int n, int64_t row_vecs, bool to_expert_major) {
  pdl_wait();
  const int s = blockIdx.y;
  const int32_t count = seg[2 * n + s];
  const int64_t from0 = to_expert_major ? seg[s] : seg[n + s];
  const int64_t to0 = to_expert_major ? seg[n + s] : seg[s];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * warps + warp; r < count; r += static_cast<int64_t>(gridDim.x) * warps) {
    const uint4* a = src + (from0 + r) * row_vecs;
    uint4* b = dst + (to0 + r) * row_vecs;
    for (int64_t v = lane; v < row_vecs; v += 32) b[v] = a[v];
  }
}

}  // namespace

EpLayout ep_layout(const Tensor& gathered, int me, int64_t experts_per_rank, cudaStream_t stream) {
  const char* op = "ep_layout";
  MT_CUDA_REQUIRE(gathered.defined() && gathered.device().is_cuda() && gathered.dtype() == DType::I32 &&
                      gathered.ndim() == 2,
                  std::string(op) + ": expected I32 [ep, E + 1] on a GPU, got " + tensor_where(gathered));
  const int64_t ep = gathered.dim(0);
  MT_CUDA_REQUIRE(experts_per_rank > 0 && gathered.dim(1) == ep * experts_per_rank + 1 && me >= 0 && me < ep,
                  std::string(op) + ": " + tensor_where(gathered) + " does not match " + std::to_string(experts_per_rank) +
                      " experts per rank (rank " + std::to_string(me) + ")");
  EpLayout L;
  L.ranks = ep;
  L.experts_per_rank = experts_per_rank;
  L.segments = Tensor::empty({3, ep * experts_per_rank}, DType::I32, gathered.device());
  L.local_offsets = Tensor::empty({experts_per_rank + 1}, DType::I32, gathered.device());
  launch_kernel(ep_layout_kernel, 1, 32, 0, stream, gathered.data_as<int32_t>(), static_cast<int>(ep), me,
      static_cast<int>(experts_per_rank), L.segments.data_as<int32_t>(), L.local_offsets.data_as<int32_t>());
  return L;
}

void ep_regroup(const Tensor& src, const EpLayout& layout, bool to_expert_major, Tensor& dst, cudaStream_t stream) {
  const char* op = "ep_regroup";
  MT_CUDA_REQUIRE(src.defined() && src.device().is_cuda() && src.ndim() == 2 && src.dtype() == DType::BF16,
                  std::string(op) + ": src must be BF16 [N, H] on a GPU, got " + tensor_where(src));
  check_tensor(dst, op, src.device().index, DType::BF16, src.numel());
  const int64_t row_bytes = src.dim(1) * 2;
  MT_CUDA_REQUIRE(row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(src.data()) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(dst.data()) % 16 == 0,
                  std::string(op) + ": rows must be 16-byte multiples at 16-byte aligned addresses");
  const int n = static_cast<int>(layout.ranks * layout.experts_per_rank);
  if (src.dim(0) == 0 || n == 0) return;
  const dim3 grid(8, static_cast<unsigned>(n));
  launch_kernel(ep_regroup_kernel, grid, 256, 0, stream, static_cast<const uint4*>(src.data()),
      static_cast<uint4*>(dst.data()), layout.segments.data_as<int32_t>(), n, row_bytes / 16, to_expert_major);
}

}  // namespace mt::cuda

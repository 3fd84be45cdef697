#include "kernels/cuda/expert_bias.h"

#include <cmath>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernel_launch.cuh"
#include "kernels/cuda/tensor_checks.h"

namespace mt::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int64_t kMaxExperts = 65536;

// One block: Σ load in int64 (a fixed-order tree, though integer sums are exact in any order), then each thread
// updates its experts e = tid, tid + 1024, ...
__global__ void expert_bias_update_kernel(const int32_t* __restrict__ load, float* __restrict__ bias, int E, float rate) {
  pdl_wait();
  __shared__ long long warp_sum[kThreads / 32];
  __shared__ long long total;
  long long s = 0;
  for (int e = threadIdx.x; e < E; e += blockDim.x) s += load[e];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) warp_sum[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    long long t = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) t += warp_sum[w];
    total = t;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    // sign(mean − load_e) = sign(Σ − E·load_e), exact.
    const long long d = total - static_cast<long long>(E) * load[e];
    if (d > 0)
      bias[e] = __fadd_rn(bias[e], rate);
    else if (d < 0)
      bias[e] = __fsub_rn(bias[e], rate);
  }
}

}  // namespace

void expert_bias_update(const Tensor& load, Tensor& bias, double rate, cudaStream_t stream) {
  MT_CUDA_REQUIRE(load.defined() && load.ndim() == 1 && load.device().is_cuda() && load.dtype() == DType::I32 &&
                      load.dim(0) >= 1 && load.dim(0) <= kMaxExperts,
                  "expert bias update: load must be a CUDA I32 [E] with 1 <= E <= 65536, got " + tensor_where(load));
  check_tensor(bias, "expert bias update: bias", load.device().index, DType::F32, load.dim(0));
  MT_CUDA_REQUIRE(bias.ndim() == 1, "expert bias update: bias must be [E], got " + tensor_where(bias));
  MT_CUDA_REQUIRE(std::isfinite(rate) && rate >= 0,
                  "expert bias update: rate " + std::to_string(rate) + " must be finite and >= 0");
  const int E = static_cast<int>(load.dim(0));
  const int threads = E >= kThreads ? kThreads : ((E + 31) / 32) * 32;
  launch_kernel(expert_bias_update_kernel, 1, threads, 0, stream, load.data_as<int32_t>(), bias.data_as<float>(), E,
                static_cast<float>(rate));
}

}  // namespace mt::cuda

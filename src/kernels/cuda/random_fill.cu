#include "kernels/cuda/random_fill.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/tensor_checks.h"
#include "kernels/cuda/kernel_launch.cuh"

namespace mt::cuda {

namespace {

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

template <typename T>
__global__ void fill_normal_kernel(T* p, int64_t n, float stddev, uint64_t seed) {
  pdl_wait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t r = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(i)));
    // Two 24-bit uniforms in (0, 1]; Box-Muller's cosine branch.
    const float u1 = (static_cast<float>((r >> 40) & 0xFFFFFF) + 1.0f) * (1.0f / 16777216.0f);
    const float u2 = static_cast<float>((r >> 8) & 0xFFFFFF) * (1.0f / 16777216.0f);
    const float z = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    Elt<T>::store(p, i, z * stddev);
  }
}

template <typename T>
__global__ void fill_constant_kernel(T* p, int64_t n, float v) {
  pdl_wait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    Elt<T>::store(p, i, v);
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

}  // namespace

void fill_normal(Tensor& t, float stddev, uint64_t seed, cudaStream_t stream) {
  check_float_dtype(t, "fill_normal");
  if (t.numel() == 0) return;
  if (t.dtype() == DType::BF16)
    launch_kernel(fill_normal_kernel<bf16>, grid_for(t.numel()), 256, 0, stream, static_cast<bf16*>(t.data()),
        t.numel(), stddev, seed);
  else
    launch_kernel(fill_normal_kernel<float>, grid_for(t.numel()), 256, 0, stream, t.data_as<float>(), t.numel(),
        stddev, seed);
}

void fill_constant(Tensor& t, float value, cudaStream_t stream) {
  check_float_dtype(t, "fill_constant");
  if (t.numel() == 0) return;
  if (t.dtype() == DType::BF16)
    launch_kernel(fill_constant_kernel<bf16>, grid_for(t.numel()), 256, 0, stream, static_cast<bf16*>(t.data()),
        t.numel(), value);
  else
    launch_kernel(fill_constant_kernel<float>, grid_for(t.numel()), 256, 0, stream, t.data_as<float>(), t.numel(),
        value);
}

}  // namespace mt::cuda

// Device-side helpers shared by the CUDA kernels: element loads/stores for the two activation
// types (bf16 with round-to-nearest-even stores, fp32), warp/block reductions, launch helpers.
// A kernel templated on T runs "bf16 mode" (HF's bf16 rounding points) when T is __nv_bfloat16 and
// plain fp32 math when T is float; nothing else is instantiated, to keep compile time down.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace mt::cuda {

using bf16 = __nv_bfloat16;

template <typename T>
struct Elt;
template <>
struct Elt<float> {
  static constexpr bool kBf16 = false;
  __device__ static float load(const float* p, int64_t i) { return p[i]; }
  __device__ static void store(float* p, int64_t i, float v) { p[i] = v; }
  // The value as this type would hold it (identity for fp32).
  __device__ static float round(float v) { return v; }
};
template <>
struct Elt<bf16> {
  static constexpr bool kBf16 = true;
  __device__ static float load(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
  __device__ static void store(bf16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
  __device__ static float round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
};

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024) in a fixed order, so the
// result does not depend on scheduling. Every thread gets the total. `scratch` holds 32 floats.
__device__ inline float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(t);
}
__device__ inline float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(t);
}

// 16-byte packets of 8 bf16 (one vector load/store) to and from fp32, round-to-nearest-even.
__device__ inline void bf16x8_to_float(const uint4& raw, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 t = __bfloat1622float2(h[q]);
    f[2 * q] = t.x, f[2 * q + 1] = t.y;
  }
}
__device__ inline uint4 float_to_bf16x8(const float (&f)[8]) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int q = 0; q < 4; ++q) h[q] = __floats2bfloat162_rn(f[2 * q], f[2 * q + 1]);
  return raw;
}

inline unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace mt::cuda

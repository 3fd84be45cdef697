// Device helpers shared by the small Mamba2 ops (conv1d_causal.cu, mamba2_dt.cu, rmsnorm_gated.cu): V-wide
// loads/stores of consecutive elements, parameters of either dtype, silu / softplus as the CPU block writes them,
// and the ordered column sum that turns per-block partial rows into a parameter gradient (deterministic: the order
// depends on the shape only, no atomics).
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernel_launch.cuh"

namespace mt::cuda {

namespace {

// V consecutive elements at p (p aligned to V · sizeof(T): the callers check it) as floats.
template <int V>
__device__ __forceinline__ void load_vec(const float* p, float (&f)[V]) {
  if constexpr (V == 4) {
    const float4 r = *reinterpret_cast<const float4*>(p);
    f[0] = r.x, f[1] = r.y, f[2] = r.z, f[3] = r.w;
  } else if constexpr (V == 2) {
    const float2 r = *reinterpret_cast<const float2*>(p);
    f[0] = r.x, f[1] = r.y;
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) f[e] = p[e];
  }
}
template <int V>
__device__ __forceinline__ void load_vec(const bf16* p, float (&f)[V]) {
  if constexpr (V == 8) {
    bf16x8_to_float(*reinterpret_cast<const uint4*>(p), f);
  } else if constexpr (V == 4) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
    const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
  } else if constexpr (V == 2) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
    f[0] = a.x, f[1] = a.y;
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) f[e] = __bfloat162float(p[e]);
  }
}

// Stores V floats, rounded to nearest even in bf16.
template <int V>
__device__ __forceinline__ void store_vec(float* p, const float (&f)[V]) {
  if constexpr (V == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(f[0], f[1], f[2], f[3]);
  } else if constexpr (V == 2) {
    *reinterpret_cast<float2*>(p) = make_float2(f[0], f[1]);
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) p[e] = f[e];
  }
}
template <int V>
__device__ __forceinline__ void store_vec(bf16* p, const float (&f)[V]) {
  if constexpr (V == 8) {
    *reinterpret_cast<uint4*>(p) = float_to_bf16x8(f);
  } else if constexpr (V == 4) {
    uint2 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
    h[0] = __floats2bfloat162_rn(f[0], f[1]);
    h[1] = __floats2bfloat162_rn(f[2], f[3]);
    *reinterpret_cast<uint2*>(p) = raw;
  } else if constexpr (V == 2) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(f[0], f[1]);
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) p[e] = __float2bfloat16_rn(f[e]);
  }
}

// Element i of a BF16 or F32 parameter (the dtype decided at run time: uniform over the grid).
__device__ __forceinline__ float load_param(const void* p, bool is_bf16, int64_t i) {
  return is_bf16 ? __bfloat162float(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
}

// As the CPU block (and torch): silu(x) = x / (1 + exp(−x)); silu'(x) = sig · (1 + x · (1 − sig)).
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_grad_f(float x) {
  const float sig = 1.0f / (1.0f + expf(-x));
  return sig * (1.0f + x * (1.0f - sig));
}
// torch's softplus (beta 1, threshold 20).
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// out[c] += Σ_{p < parts} partial[p · n + c]: thread row y adds rows p = y, y + 32, … in order, then thread row 0
// adds the 32 row sums in y order. Block 32 × 32, one block per 32 columns.
__global__ void __launch_bounds__(1024)
    ordered_column_sum_kernel(const float* __restrict__ partial, int64_t parts, int64_t n, float* __restrict__ out) {
  pdl_wait();
  __shared__ float s[32][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float v = 0.0f;
  if (c < n)
    for (int64_t p = threadIdx.y; p < parts; p += 32) v += partial[p * n + c];
  s[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y == 0 && c < n) {
    float t = 0.0f;
#pragma unroll
    for (int y = 0; y < 32; ++y) t += s[y][threadIdx.x];
    out[c] += t;
  }
}

inline void ordered_column_sum(const float* partial, int64_t parts, int64_t n, float* out, cudaStream_t stream) {
  if (parts <= 0 || n <= 0) return;
  launch_kernel(ordered_column_sum_kernel, blocks_for(n, 32), dim3(32, 32), 0, stream, partial, parts, n, out);
}

}  // namespace

}  // namespace mt::cuda

// Kernels of kernels/cuda/mla_assemble.h: one thread per output element (the copies are plain bf16 moves, the RoPE
// columns go through kernels/cuda/rope_math.cuh's formulas, as the half-split RoPE kernels do). blockIdx.y picks the
// output: forward query | key | value, backward dq | dkv | the rope key's columns of dckv.
// NOTE: scalar accesses; the copies are memory-bound and small beside the projections' GEMMs (per token
// 2·heads·(nope + rope) + heads·v_pad values each way). Vector (16-byte) moves are an optimisation left for later.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernel_launch.cuh"
#include "kernels/cuda/mla_assemble.h"
#include "kernels/cuda/rope_math.cuh"

namespace mt::cuda {

namespace {

// The input columns (relative to the rope block) of rotation pair k: (2k, 2k+1) interleaved, (k, k + half) split.
__device__ inline void pair_inputs(int64_t k, int64_t half, bool interleaved, int64_t& first, int64_t& second) {
  first = interleaved ? 2 * k : k;
  second = interleaved ? 2 * k + 1 : k + half;
}

// Rope output column j (< rope) of the rope block `src` (bf16) at token t.
__device__ inline float rope_output(const bf16* src, int64_t j, int64_t half, bool interleaved, const float* cosv,
                                    const float* sinv, int64_t t) {
  const int64_t k = j < half ? j : j - half;
  int64_t a, b;
  pair_inputs(k, half, interleaved, a, b);
  const float x1 = __bfloat162float(src[a]), x2 = __bfloat162float(src[b]);
  const float c = cosv[t * half + k], s = sinv[t * half + k];
  // out_k = x1·c − x2·s, out_{half+k} = x2·c + x1·s (each product and the sum rounded to bf16)
  return j < half ? rope_out_forward_bf16(x1, x2, c, -s) : rope_out_forward_bf16(x2, x1, c, s);
}

// The gradient of rope input column m (< rope) from the output gradients g1 = d out_k, g2 = d out_{half+k}, fp32.
__device__ inline bool rope_input_is_first(int64_t m, int64_t half, bool interleaved, int64_t& k) {
  if (interleaved) {
    k = m / 2;
    return (m & 1) == 0;
  }
  k = m < half ? m : m - half;
  return m < half;
}
__device__ inline float rope_input_grad(bool first, float g1, float g2, float c, float s) {
  // d x1 = g1·c + g2·s, d x2 = g2·c − g1·s
  return first ? rope_out_backward(g1, g2, c, s) : rope_out_backward(g2, g1, c, -s);
}

__global__ void mla_forward_kernel(const bf16* __restrict__ q, const bf16* __restrict__ ckv, int64_t ld_ckv,
                                   const bf16* __restrict__ kv, const float* __restrict__ cosv,
                                   const float* __restrict__ sinv, int64_t T, int64_t H, int64_t nope, int64_t rope,
                                   int64_t dv, int64_t dv_pad, bool interleaved, bf16* __restrict__ query,
                                   bf16* __restrict__ key, bf16* __restrict__ value) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t D = nope + rope, half = rope / 2, W = nope + dv;
  const int which = static_cast<int>(blockIdx.y);
  if (which == 2) {  // value, zero-padded
    if (i >= T * H * dv_pad) return;
    const int64_t row = i / dv_pad, j = i - row * dv_pad;
    value[i] = j < dv ? kv[row * W + nope + j] : __float2bfloat16_rn(0.0f);
    return;
  }
  if (i >= T * H * D) return;
  const int64_t row = i / D, j = i - row * D, t = row / H;
  bf16* out = which == 0 ? query : key;
  if (j < nope) {
    out[i] = which == 0 ? q[i] : kv[row * W + j];
    return;
  }
  const bf16* src = which == 0 ? q + row * D + nope : ckv + t * ld_ckv + (ld_ckv - rope);
  out[i] = __float2bfloat16_rn(rope_output(src, j - nope, half, interleaved, cosv, sinv, t));
}

__global__ void mla_backward_kernel(const bf16* __restrict__ dquery, const bf16* __restrict__ dkey,
                                    const bf16* __restrict__ dvalue, const float* __restrict__ cosv,
                                    const float* __restrict__ sinv, int64_t T, int64_t H, int64_t nope, int64_t rope,
                                    int64_t dv, int64_t dv_pad, bool interleaved, bf16* __restrict__ dq,
                                    bf16* __restrict__ dkv, bf16* __restrict__ dckv, int64_t ld_ckv) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t D = nope + rope, half = rope / 2, W = nope + dv;
  const int which = static_cast<int>(blockIdx.y);
  if (which == 0) {  // dq: the nope columns copied, the rope ones rotated back
    if (i >= T * H * D) return;
    const int64_t row = i / D, j = i - row * D, t = row / H;
    if (j < nope) {
      dq[i] = dquery[i];
      return;
    }
    int64_t k;
    const bool first = rope_input_is_first(j - nope, half, interleaved, k);
    const bf16* g = dquery + row * D + nope;
    const float v = rope_input_grad(first, __bfloat162float(g[k]), __bfloat162float(g[half + k]),
                                    cosv[t * half + k], sinv[t * half + k]);
    dq[i] = __float2bfloat16_rn(v);
    return;
  }
  if (which == 1) {  // dkv = [dk_nope | dv] per head
    if (i >= T * H * W) return;
    const int64_t row = i / W, j = i - row * W;
    dkv[i] = j < nope ? dkey[row * D + j] : dvalue[row * dv_pad + (j - nope)];
    return;
  }
  // The shared rope key: Σ over heads (fp32, in head order), then rotated back.
  if (i >= T * rope) return;
  const int64_t t = i / rope, m = i - t * rope;
  int64_t k;
  const bool first = rope_input_is_first(m, half, interleaved, k);
  float g1 = 0.0f, g2 = 0.0f;
  for (int64_t h = 0; h < H; ++h) {
    const bf16* g = dkey + (t * H + h) * D + nope;
    g1 += __bfloat162float(g[k]);
    g2 += __bfloat162float(g[half + k]);
  }
  const float v = rope_input_grad(first, g1, g2, cosv[t * half + k], sinv[t * half + k]);
  dckv[t * ld_ckv + (ld_ckv - rope) + m] = __float2bfloat16_rn(v);
}

}  // namespace

namespace detail {

void mla_assemble_forward_launch(const void* q, const void* ckv, int64_t ld_ckv, const void* kv, const float* cos,
                                 const float* sin, int64_t T, int64_t heads, int64_t nope, int64_t rope, int64_t dv,
                                 int64_t dv_pad, bool interleaved, void* query, void* key, void* value,
                                 cudaStream_t stream) {
  const int64_t n = std::max(T * heads * (nope + rope), T * heads * dv_pad);
  if (n == 0) return;
  launch_kernel(mla_forward_kernel, dim3(blocks_for(n, 256), 3), 256, 0, stream, static_cast<const bf16*>(q),
                static_cast<const bf16*>(ckv), ld_ckv, static_cast<const bf16*>(kv), cos, sin, T, heads, nope, rope,
                dv, dv_pad, interleaved, static_cast<bf16*>(query), static_cast<bf16*>(key),
                static_cast<bf16*>(value));
}

void mla_assemble_backward_launch(const void* dquery, const void* dkey, const void* dvalue, const float* cos,
                                  const float* sin, int64_t T, int64_t heads, int64_t nope, int64_t rope, int64_t dv,
                                  int64_t dv_pad, bool interleaved, void* dq, void* dkv, void* dckv, int64_t ld_ckv,
                                  cudaStream_t stream) {
  const int64_t n = std::max({T * heads * (nope + rope), T * heads * (nope + dv), T * rope});
  if (n == 0) return;
  launch_kernel(mla_backward_kernel, dim3(blocks_for(n, 256), 3), 256, 0, stream, static_cast<const bf16*>(dquery),
                static_cast<const bf16*>(dkey), static_cast<const bf16*>(dvalue), cos, sin, T, heads, nope, rope, dv,
                dv_pad, interleaved, static_cast<bf16*>(dq), static_cast<bf16*>(dkv), static_cast<bf16*>(dckv),
                ld_ckv);
}

}  // namespace detail

}  // namespace mt::cuda

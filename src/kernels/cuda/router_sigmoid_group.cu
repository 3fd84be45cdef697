#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kernel_launch.cuh"
#include "kernels/cuda/router_sigmoid_group_kernels.h"

// Layout as router.cu: one warp per token; lane l holds experts l, l+32, l+64, ... (EPL experts per lane, a
// compile-time constant so the per-lane arrays stay in registers). The group step goes through shared memory, where
// groups are contiguous ranges: each warp writes its token's biased scores c[E] there, lane g (g += 32) sums the top-2
// of group g, and a group is kept when fewer than topk_groups groups rank before it (the same total order as the
// top-k: NaN first, larger value, lower index), so the kept set is exactly the CPU's topk_row of the group scores.
// Per-expert loads: a block histogram in shared memory, then one integer atomicAdd per expert and block (integer
// sums, so the result does not depend on the order).
// NOTE: ranks_before / topk_warp are router.cu's, copied (router.cu keeps them in its anonymous
// namespace; it is left untouched here while other branches edit it).

namespace mt::cuda {

namespace {

using bf16 = __nv_bfloat16;
constexpr int kWarps = 8;  // warps (one token each at a time) per block
constexpr int kNone = INT_MAX;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void store_out(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_out(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

// torch's CUDA sigmoid for fp32 (1 / (1 + exp(−x)), expf without fast math), and the CPU op's formula.
__device__ __forceinline__ float sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }

// Total order of the top-k: NaN first, then larger value, then lower index.
__device__ __forceinline__ bool ranks_before(float va, int ia, float vb, int ib) {
  if (ib == kNone) return ia != kNone;
  if (ia == kNone) return false;
  const bool na = isnan(va), nb = isnan(vb);
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

// NaN first, then larger value (values only: which of two equal values comes first does not change a top-2 sum).
__device__ __forceinline__ bool greater_nan_first(float a, float b) { return (isnan(a) && !isnan(b)) || a > b; }

// Top-k over the warp's values (experts >= E never chosen); lane s < k receives the s-th selection in (idx, val).
template <int EPL>
__device__ __forceinline__ void topk_warp(const float (&p)[EPL], int E, int k, int lane, int& idx, float& val) {
  uint32_t taken = 0;
#pragma unroll
  for (int j = 0; j < EPL; ++j)
    if (lane + 32 * j >= E) taken |= 1u << j;
  for (int s = 0; s < k; ++s) {
    float bv = 0.0f;
    int bi = kNone;
#pragma unroll
    for (int j = 0; j < EPL; ++j)
      if (!((taken >> j) & 1u) && ranks_before(p[j], lane + 32 * j, bv, bi)) bv = p[j], bi = lane + 32 * j;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ranks_before(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (bi != kNone && (bi & 31) == lane) taken |= 1u << (bi >> 5);
    if (lane == s) idx = bi, val = bv;
  }
}

// Shared memory (floats): bias[E] | per warp, when grouped: c[E], group score[groups], kept[groups] | load[E] (ints).
__host__ __device__ inline size_t forward_smem_floats(int E, int groups, bool grouped, bool load) {
  return static_cast<size_t>(E) + (grouped ? static_cast<size_t>(kWarps) * (E + 2 * groups) : 0) + (load ? E : 0);
}

// NOTE: minBlocks 1 in the launch bounds: without it ptxas (CUDA 13) capped EPL 8/16 at 48 registers and spilled.
template <int EPL, typename Tin>
__global__ void __launch_bounds__(kWarps * 32, 1)
    sigmoid_group_forward_kernel(const Tin* __restrict__ logits, const float* __restrict__ bias, int T, int E, int k,
                                 int groups, int topk_groups, bool norm, float scale, int tokens_per_block,
                                 int32_t* __restrict__ index, float* __restrict__ weights, int32_t* __restrict__ load) {
  pdl_wait();
  extern __shared__ float smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool grouped = topk_groups < groups;
  const int per_group = E / groups;
  float* s_bias = smem;
  float* s_c = smem + E + (grouped ? warp * (E + 2 * groups) : 0);
  float* s_gscore = s_c + E;
  float* s_kept = s_gscore + groups;
  int* s_load = reinterpret_cast<int*>(smem + forward_smem_floats(E, groups, grouped, false));
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    s_bias[e] = bias ? bias[e] : 0.0f;
    if (load) s_load[e] = 0;
  }
  __syncthreads();

  const int t0 = blockIdx.x * tokens_per_block, t1 = min(T, t0 + tokens_per_block);
  for (int t = t0 + warp; t < t1; t += kWarps) {
    const Tin* row = logits + static_cast<int64_t>(t) * E;
    float c[EPL];
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
      const int e = lane + 32 * j;
      c[j] = e < E ? sigmoid_f32(to_float(row[e])) + s_bias[e] : -INFINITY;
    }
    if (grouped) {
#pragma unroll
      for (int j = 0; j < EPL; ++j)
        if (lane + 32 * j < E) s_c[lane + 32 * j] = c[j];
      __syncwarp();
      for (int g = lane; g < groups; g += 32) {
        const float* cg = s_c + g * per_group;  // per_group >= 2 (checked on the host)
        float b1 = cg[0], b2 = cg[1];
        if (greater_nan_first(b2, b1)) {
          const float x = b1;
          b1 = b2, b2 = x;
        }
        for (int i = 2; i < per_group; ++i) {
          const float x = cg[i];
          if (greater_nan_first(x, b1))
            b2 = b1, b1 = x;
          else if (greater_nan_first(x, b2))
            b2 = x;
        }
        s_gscore[g] = b1 + b2;
      }
      __syncwarp();
      for (int g = lane; g < groups; g += 32) {
        const float v = s_gscore[g];
        int rank = 0;
        for (int h = 0; h < groups; ++h) rank += ranks_before(s_gscore[h], h, v, g);
        s_kept[g] = rank < topk_groups ? 1.0f : 0.0f;
      }
      __syncwarp();
#pragma unroll
      for (int j = 0; j < EPL; ++j) {
        const int e = lane + 32 * j;
        if (e < E && s_kept[e / per_group] == 0.0f) c[j] = -INFINITY;  // HF's masked_fill(−inf)
      }
      __syncwarp();  // the next token overwrites s_c, s_gscore and s_kept
    }
    int idx = 0;
    float val = 0.0f;
    topk_warp<EPL>(c, E, k, lane, idx, val);
    // The unbiased s of each selected expert, recomputed by its slot's lane from the logit (the same expression as
    // the s inside c; cheaper than keeping s[EPL] in registers). Σ in slot order, as the CPU.
    const float my_s = lane < k ? sigmoid_f32(to_float(row[min(max(idx, 0), E - 1)])) : 0.0f;
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += __shfl_sync(0xffffffffu, my_s, j);
    if (lane < k) {
      const float v = norm ? my_s / (sum + 1e-20f) : my_s;
      index[static_cast<int64_t>(t) * k + lane] = idx;
      weights[static_cast<int64_t>(t) * k + lane] = v * scale;
      if (load && idx >= 0 && idx < E) atomicAdd(&s_load[idx], 1);
    }
  }
  if (!load) return;
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    if (s_load[e]) atomicAdd(&load[e], s_load[e]);
}

// One warp per token; lane s < k owns slot s: s_j recomputed from the logit of its expert, then
// ds_j = (dv_j − Σ_i dv_i·v_i) / D (norm; D = Σ s + 1e-20, v = s / D) or dv_j, dv = scale·dw; dlogit = ds·(1 − s)·s.
template <typename Tin, typename Tout>
__global__ void __launch_bounds__(kWarps * 32)
    sigmoid_group_backward_kernel(const float* __restrict__ dweights, const Tin* __restrict__ logits,
                                  const int32_t* __restrict__ index, int T, int E, int k, bool norm, float scale,
                                  Tout* __restrict__ dlogits) {
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * kWarps + threadIdx.x / 32;
  if (t >= T) return;
  const int my_idx = lane < k ? min(max(index[static_cast<int64_t>(t) * k + lane], 0), E - 1) : 0;
  const float my_dw = lane < k ? dweights[static_cast<int64_t>(t) * k + lane] : 0.0f;
  const float my_s = lane < k ? sigmoid_f32(to_float(logits[static_cast<int64_t>(t) * E + my_idx])) : 0.0f;
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum += __shfl_sync(0xffffffffu, my_s, j);
  const float denom = sum + 1e-20f;
  const float dv = my_dw * scale;
  float ds = dv;
  if (norm) {
    const double term = static_cast<double>(dv) * (my_s / denom);
    double dot = 0.0;  // slot order, as the CPU
    for (int j = 0; j < k; ++j) dot += __shfl_sync(0xffffffffu, term, j);
    ds = (dv - static_cast<float>(dot)) / denom;
  }
  const float g = ds * (1.0f - my_s) * my_s;
  // Zero the row (coalesced), then each slot's lane writes its expert's gradient; __syncwarp orders the two stores
  // among the warp's lanes. The forward's experts are distinct; a repeated (corrupt) index keeps one slot's value.
  Tout* out = dlogits + static_cast<int64_t>(t) * E;
  for (int e = lane; e < E; e += 32) store_out(out + e, 0.0f);
  __syncwarp();
  if (lane < k) store_out(out + my_idx, g);
}

// A block histogram in shared memory when E fits there (smem_load), then one global atomicAdd per expert and block:
// the counts are integers, so the order does not matter; a block has 256 threads and up to 64 blocks, so a layer of
// T·k slots costs ≤ 64·E global atomics instead of T·k of them onto E addresses.
__global__ void expert_load_kernel(const int32_t* __restrict__ index, int64_t slots, int E, int32_t* __restrict__ load,
                                   bool smem_load) {
  pdl_wait();
  extern __shared__ int s_count[];
  if (smem_load) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) s_count[e] = 0;
    __syncthreads();
  }
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < slots;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int e = index[i];
    if (e >= 0 && e < E) atomicAdd(smem_load ? &s_count[e] : &load[e], 1);
  }
  if (!smem_load) return;
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    if (s_count[e]) atomicAdd(&load[e], s_count[e]);
}

int experts_per_lane(int E) {
  int epl = 1;
  while (epl * 32 < E) epl *= 2;
  return epl;
}

template <typename F>
void with_epl(int epl, F&& f) {
  switch (epl) {
    case 1:
      f(std::integral_constant<int, 1>{});
      break;
    case 2:
      f(std::integral_constant<int, 2>{});
      break;
    case 4:
      f(std::integral_constant<int, 4>{});
      break;
    case 8:
      f(std::integral_constant<int, 8>{});
      break;
    case 16:
      f(std::integral_constant<int, 16>{});
      break;
    case 32:
      f(std::integral_constant<int, 32>{});
      break;
    default:
      MT_CUDA_REQUIRE(false, "sigmoid group router: more than 1024 experts");
  }
}

}  // namespace

namespace detail {

void router_sigmoid_group_forward_launch(const void* logits, bool logits_bf16, const float* bias, int T, int E, int k,
                                         int groups, int topk_groups, bool norm, float scale, int32_t* index,
                                         float* weights, int32_t* load, cudaStream_t stream) {
  // Tokens per block as router.cu: at most ~2048 blocks, so at most ~2048·E load atomics.
  const int tokens_per_block = std::max(kWarps, (T + 2047) / 2048);
  const int blocks = (T + tokens_per_block - 1) / tokens_per_block;
  const size_t smem = forward_smem_floats(E, groups, topk_groups < groups, load != nullptr) * sizeof(float);
  with_epl(experts_per_lane(E), [&](auto epl_c) {
    constexpr int EPL = decltype(epl_c)::value;
    auto launch = [&](auto* in) {
      using Tin = std::remove_const_t<std::remove_pointer_t<decltype(in)>>;
      auto kern = sigmoid_group_forward_kernel<EPL, Tin>;
      if (smem > 48 * 1024)
        MT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      launch_kernel(kern, blocks, kWarps * 32, smem, stream, in, bias, T, E, k, groups, topk_groups, norm, scale,
                    tokens_per_block, index, weights, load);
    };
    if (logits_bf16)
      launch(static_cast<const bf16*>(logits));
    else
      launch(static_cast<const float*>(logits));
  });
}

void router_sigmoid_group_backward_launch(const float* dweights, const void* logits, bool logits_bf16,
                                          const int32_t* index, int T, int E, int k, bool norm, float scale,
                                          void* dlogits, bool dlogits_bf16, cudaStream_t stream) {
  const int blocks = (T + kWarps - 1) / kWarps;
  auto launch = [&](auto* in, auto* out) {
    using Tin = std::remove_const_t<std::remove_pointer_t<decltype(in)>>;
    using Tout = std::remove_pointer_t<decltype(out)>;
    launch_kernel(sigmoid_group_backward_kernel<Tin, Tout>, blocks, kWarps * 32, 0, stream, dweights, in, index, T, E,
                  k, norm, scale, out);
  };
  auto with_out = [&](auto* in) {
    if (dlogits_bf16)
      launch(in, static_cast<bf16*>(dlogits));
    else
      launch(in, static_cast<float*>(dlogits));
  };
  if (logits_bf16)
    with_out(static_cast<const bf16*>(logits));
  else
    with_out(static_cast<const float*>(logits));
}

void router_expert_load_launch(const int32_t* index, int64_t slots, int E, int32_t* load, cudaStream_t stream) {
  const bool smem_load = E <= 12288;  // 48 KiB of counts: no opt-in needed
  const int blocks = static_cast<int>(std::min<int64_t>((slots + 255) / 256, smem_load ? 64 : 1024));
  if (blocks == 0) return;
  launch_kernel(expert_load_kernel, blocks, 256, smem_load ? static_cast<size_t>(E) * sizeof(int) : 0, stream, index,
                slots, E, load, smem_load);
}

}  // namespace detail
}  // namespace mt::cuda

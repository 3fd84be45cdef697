#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma_sm80.cuh"
#include "kernels/cuda/router_kernels.h"
#include "kernels/cuda/kernel_launch.cuh"

// Layout: one warp per token; lane l owns experts l, l+32, l+64, ... (EPL = experts per lane, a compile-
// time constant so the per-lane arrays stay in registers). Each block's 8 warps reduce their aux
// statistics in shared memory into one partial row per block; a second kernel sums the rows in a fixed
// order, so the statistics are bitwise reproducible run to run.

namespace mt::cuda {

namespace {

using mma::bf16;
constexpr int kWarps = detail::kRouterWarps;
constexpr int kNone = INT_MAX;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float round_bf16_dev(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
__device__ __forceinline__ void store_out(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_out(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

// Total order of the top-k: NaN first, then larger value, then lower index.
__device__ __forceinline__ bool ranks_before(float va, int ia, float vb, int ib) {
  if (ib == kNone) return ia != kNone;
  if (ia == kNone) return false;
  const bool na = isnan(va), nb = isnan(vb);
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

// One token's logits into the lanes (expert lane + 32j in x[j]); lanes beyond E hold −inf.
template <int EPL, typename Tin>
__device__ __forceinline__ void load_token(const Tin* row, int E, int lane, float (&x)[EPL]) {
#pragma unroll
  for (int j = 0; j < EPL; ++j) {
    const int e = lane + 32 * j;
    x[j] = e < E ? to_float(row[e]) : -INFINITY;
  }
}

// fp32 softmax of one token's logits (in place, from load_token), as softmax_rows_f32 does on the CPU: max,
// exp(x − max) in fp32, the sum in double, one fp32 division. Lanes beyond E hold p = 0.
template <int EPL>
__device__ __forceinline__ void softmax_lanes(int E, int lane, float (&p)[EPL]) {
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < EPL; ++j) m = fmaxf(m, p[j]);
  m = mma::warp_max(m);
  double s = 0.0;
#pragma unroll
  for (int j = 0; j < EPL; ++j) {
    const int e = lane + 32 * j;
    p[j] = e < E ? expf(p[j] - m) : 0.0f;
    s += p[j];
  }
  const float fs = static_cast<float>(mma::warp_sum(s));
#pragma unroll
  for (int j = 0; j < EPL; ++j) p[j] = p[j] / fs;
}

// GPT-OSS's routing weights: the softmax over the k selected logits (lane s < k holds the s-th, `x`), as the CPU's
// softmax_rows_f32 over those k values: max, exp(x − max) in fp32, summed in double in slot order, one division.
// Returns lane s's weight (lanes >= k: 0).
__device__ __forceinline__ float topk_softmax_lane(float x, int k, int lane) {
  const float m = mma::warp_max(lane < k ? x : -INFINITY);
  const float ex = lane < k ? expf(x - m) : 0.0f;
  double s = 0.0;
  for (int j = 0; j < k; ++j) s += __shfl_sync(0xffffffffu, ex, j);
  return lane < k ? ex / static_cast<float>(s) : 0.0f;
}

// The value x[e] of expert e (held by lane e % 32 in slot e / 32), delivered to every lane.
template <int EPL>
__device__ __forceinline__ float value_of_expert(const float (&x)[EPL], int e) {
  float v = 0.0f;
#pragma unroll
  for (int j = 0; j < EPL; ++j)
    if (j == (e >> 5)) v = x[j];
  return __shfl_sync(0xffffffffu, v, e & 31);
}

// Top-k over the warp's probabilities. Returns this lane's mask of selected j (bit j = expert lane+32j);
// lane s < k receives the s-th selection in (idx, val).
template <int EPL>
__device__ __forceinline__ uint32_t topk_warp(const float (&p)[EPL], int E, int k, int lane, int& idx, float& val) {
  uint32_t taken = 0;
#pragma unroll
  for (int j = 0; j < EPL; ++j)
    if (lane + 32 * j >= E) taken |= 1u << j;
  const uint32_t padding = taken;
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
  return taken & ~padding;
}

// topk_softmax (GPT-OSS): the top-k of the logits themselves and a softmax over those k; the statistics still come
// from the full softmax and its own top-k (the aux loss reads softmax(logits), hf-numerics.md §4.2).
template <int EPL, typename Tin>
__global__ void __launch_bounds__(kWarps * 32)
    router_forward_kernel(const Tin* __restrict__ logits, int T, int E, int k, bool norm, bool bf16_mode,
                          bool topk_softmax, int tokens_per_block, int32_t* __restrict__ index,
                          float* __restrict__ weights, int32_t* __restrict__ part_count,
                          float* __restrict__ part_psum) {
  pdl_wait();
  extern __shared__ float smem[];  // [kWarps][E] psum, then [kWarps][E] counts (as int)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool stats = part_count != nullptr;
  int cnt[EPL];
  float ps[EPL];
#pragma unroll
  for (int j = 0; j < EPL; ++j) cnt[j] = 0, ps[j] = 0.0f;

  const int t0 = blockIdx.x * tokens_per_block, t1 = min(T, t0 + tokens_per_block);
  for (int t = t0 + warp; t < t1; t += kWarps) {
    float p[EPL];
    load_token<EPL>(logits + static_cast<int64_t>(t) * E, E, lane, p);
    int idx = 0;
    float val = 0.0f;
    uint32_t sel = 0;
    if (topk_softmax) {
      sel = topk_warp<EPL>(p, E, k, lane, idx, val);  // of the logits
      const float v = topk_softmax_lane(val, k, lane);
      if (lane < k) {
        index[static_cast<int64_t>(t) * k + lane] = idx;
        weights[static_cast<int64_t>(t) * k + lane] = bf16_mode ? round_bf16_dev(v) : v;
      }
      if (!stats) continue;
      softmax_lanes<EPL>(E, lane, p);
      if (!bf16_mode) sel = topk_warp<EPL>(p, E, k, lane, idx, val);  // the aux loss's top-k is of p
    } else {
      softmax_lanes<EPL>(E, lane, p);
      sel = topk_warp<EPL>(p, E, k, lane, idx, val);
      // Renormalise in slot order, the CPU's summation order.
      float sum = 0.0f;
      for (int s = 0; s < k; ++s) sum += __shfl_sync(0xffffffffu, val, s);
      if (lane < k) {
        const float v = norm ? val / sum : val;
        index[static_cast<int64_t>(t) * k + lane] = idx;
        weights[static_cast<int64_t>(t) * k + lane] = bf16_mode ? round_bf16_dev(v) : v;
      }
    }
    if (stats) {
      if (bf16_mode) {
        // HF's aux loss takes softmax(bf16 logits) in bf16 and its own top-k of those values.
#pragma unroll
        for (int j = 0; j < EPL; ++j) p[j] = round_bf16_dev(p[j]);
        int i2;
        float v2;
        const uint32_t sel2 = topk_warp<EPL>(p, E, k, lane, i2, v2);
#pragma unroll
        for (int j = 0; j < EPL; ++j) cnt[j] += (sel2 >> j) & 1u, ps[j] += p[j];
      } else {
#pragma unroll
        for (int j = 0; j < EPL; ++j) cnt[j] += (sel >> j) & 1u, ps[j] += p[j];
      }
    }
  }
  if (!stats) return;
  float* s_psum = smem;
  int* s_cnt = reinterpret_cast<int*>(smem + kWarps * E);
#pragma unroll
  for (int j = 0; j < EPL; ++j) {
    const int e = lane + 32 * j;
    if (e < E) s_psum[warp * E + e] = ps[j], s_cnt[warp * E + e] = cnt[j];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    float a = 0.0f;
    int c = 0;
    for (int w = 0; w < kWarps; ++w) a += s_psum[w * E + e], c += s_cnt[w * E + e];
    part_psum[static_cast<int64_t>(blockIdx.x) * E + e] = a;
    part_count[static_cast<int64_t>(blockIdx.x) * E + e] = c;
  }
}

// One warp per expert: sums the per-block partial rows (fixed order) into the step's statistics.
__global__ void aux_stats_reduce_kernel(const int32_t* __restrict__ part_count, const float* __restrict__ part_psum,
                                        int rows, int E, int32_t* __restrict__ count, float* __restrict__ psum) {
  pdl_wait();
  const int e = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (e >= E) return;
  double a = 0.0;
  int c = 0;
  for (int r = lane; r < rows; r += 32)
    a += part_psum[static_cast<int64_t>(r) * E + e], c += part_count[static_cast<int64_t>(r) * E + e];
  a = mma::warp_sum(a);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
  if (lane == 0) {
    count[e] += c;
    psum[e] = static_cast<float>(static_cast<double>(psum[e]) + a);
  }
}

__global__ void aux_loss_finish_kernel(const int32_t* __restrict__ count, const float* __restrict__ psum, int E,
                                       double rows, bool bf16_mode, double daux, float* __restrict__ aux,
                                       float* __restrict__ aux_dp) {
  pdl_wait();
  __shared__ double s_part[32];
  double a = 0.0;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const double f = rows > 0 ? count[e] / rows : 0.0;
    double P = rows > 0 ? psum[e] / rows : 0.0;
    if (bf16_mode) P = static_cast<double>(round_bf16_dev(static_cast<float>(P)));
    a += f * P;
    aux_dp[e] = static_cast<float>(rows > 0 ? daux * E * f / rows : 0.0);
  }
  a = mma::warp_sum(a);
  if ((threadIdx.x & 31) == 0) s_part[threadIdx.x / 32] = a;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) t += s_part[w];
    aux[0] = static_cast<float>(t * E);
  }
}

// The balanced-routing probe's routes: slot (t, j) -> (t·k + j) mod E (router.h).
__global__ void router_balanced_index_kernel(int32_t* __restrict__ index, int64_t slots, int E) {
  pdl_wait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < slots;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    index[i] = static_cast<int32_t>(i % E);
}

// The routing fault probe (router.h): one thread per faulted token scans its logits for the best expert
// outside its top-k (ties to the lower index, as the router) and puts it in the k-th slot.
template <typename Tin>
__global__ void router_fault_index_kernel(int32_t* __restrict__ index, const Tin* __restrict__ logits, int64_t T,
                                          int k, int E, int every) {
  pdl_wait();
  for (int64_t f = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; f * every < T;
       f += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = f * every;
    int32_t* row = index + t * k;
    int best = -1;
    float best_v = 0.0f;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int j = 0; j < k; ++j) taken |= row[j] == e;
      const float v = static_cast<float>(logits[t * E + e]);
      if (!taken && (best < 0 || v > best_v)) best = e, best_v = v;
    }
    row[k - 1] = best;
  }
}

// topk_softmax (GPT-OSS): the routing path is the k-way softmax's backward on the selected logits only,
// dl_s = v_s·(dw_s − Σ_j dw_j·v_j) with v recomputed as the forward computed it; the aux path as for Qwen.
template <int EPL, typename Tin, typename Tout>
__global__ void __launch_bounds__(kWarps * 32)
    router_backward_kernel(const float* __restrict__ dweights, const Tin* __restrict__ logits,
                           const int32_t* __restrict__ index, const float* __restrict__ aux_dp, int T, int E, int k,
                           bool norm, bool bf16_mode, bool topk_softmax, Tout* __restrict__ dlogits) {
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * kWarps + threadIdx.x / 32;
  if (t >= T) return;
  float p[EPL];
  load_token<EPL>(logits + static_cast<int64_t>(t) * E, E, lane, p);
  const int my_idx = lane < k ? index[static_cast<int64_t>(t) * k + lane] : 0;
  const float my_dw = lane < k ? dweights[static_cast<int64_t>(t) * k + lane] : 0.0f;
  if (topk_softmax) {
    float my_x = 0.0f;
    for (int s = 0; s < k; ++s) {
      const float xs = value_of_expert<EPL>(p, min(max(__shfl_sync(0xffffffffu, my_idx, s), 0), E - 1));
      if (lane == s) my_x = xs;
    }
    const float v = topk_softmax_lane(my_x, k, lane);
    double dot = 0.0;  // in slot order, as the CPU
    for (int s = 0; s < k; ++s)
      dot += static_cast<double>(__shfl_sync(0xffffffffu, my_dw, s)) * __shfl_sync(0xffffffffu, v, s);
    const float g = v * (my_dw - static_cast<float>(dot));
    float dl[EPL];
#pragma unroll
    for (int j = 0; j < EPL; ++j) dl[j] = 0.0f;
    for (int s = 0; s < k; ++s) {
      const int e = min(max(__shfl_sync(0xffffffffu, my_idx, s), 0), E - 1);
      const float gs = __shfl_sync(0xffffffffu, g, s);
      if ((e & 31) == lane) {
#pragma unroll
        for (int j = 0; j < EPL; ++j)
          if (j == (e >> 5)) dl[j] = gs;
      }
    }
    if (aux_dp) {
      softmax_lanes<EPL>(E, lane, p);
      float pa[EPL], ad[EPL];
      double dot2 = 0.0;
#pragma unroll
      for (int j = 0; j < EPL; ++j) {
        const int e = lane + 32 * j;
        pa[j] = bf16_mode ? round_bf16_dev(p[j]) : p[j];
        ad[j] = e < E ? aux_dp[e] : 0.0f;
        dot2 += static_cast<double>(pa[j]) * ad[j];
      }
      const float fdot2 = static_cast<float>(mma::warp_sum(dot2));
#pragma unroll
      for (int j = 0; j < EPL; ++j) dl[j] += pa[j] * (ad[j] - fdot2);
    }
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
      const int e = lane + 32 * j;
      if (e < E) store_out(dlogits + static_cast<int64_t>(t) * E + e, dl[j]);
    }
    return;
  }
  softmax_lanes<EPL>(E, lane, p);
  // p at each selected expert, fetched from its owner lane into the slot's lane.
  float my_p = 0.0f;
  for (int s = 0; s < k; ++s) {
    const float pj = value_of_expert<EPL>(p, min(max(__shfl_sync(0xffffffffu, my_idx, s), 0), E - 1));
    if (lane == s) my_p = pj;
  }
  float g = my_dw;
  if (norm) {
    // v'_s = v_s / Σv: dv_s = (dv'_s − Σ_j dv'_j·v'_j) / Σv.
    float sum = 0.0f;
    for (int s = 0; s < k; ++s) sum += __shfl_sync(0xffffffffu, my_p, s);
    const double dot = mma::warp_sum(lane < k ? static_cast<double>(my_dw) * (my_p / sum) : 0.0);
    g = (my_dw - static_cast<float>(dot)) / sum;
  }
  float dp[EPL];
#pragma unroll
  for (int j = 0; j < EPL; ++j) dp[j] = 0.0f;
  for (int s = 0; s < k; ++s) {
    const int e = min(max(__shfl_sync(0xffffffffu, my_idx, s), 0), E - 1);
    const float gs = __shfl_sync(0xffffffffu, g, s);
    if ((e & 31) == lane) {
#pragma unroll
      for (int j = 0; j < EPL; ++j)
        if (j == (e >> 5)) dp[j] += gs;
    }
  }
  double dot = 0.0;
#pragma unroll
  for (int j = 0; j < EPL; ++j) dot += static_cast<double>(p[j]) * dp[j];
  const float fdot = static_cast<float>(mma::warp_sum(dot));
  float dl[EPL];
#pragma unroll
  for (int j = 0; j < EPL; ++j) dl[j] = p[j] * (dp[j] - fdot);
  if (aux_dp) {
    float pa[EPL], ad[EPL];
    double dot2 = 0.0;
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
      const int e = lane + 32 * j;
      pa[j] = bf16_mode ? round_bf16_dev(p[j]) : p[j];
      ad[j] = e < E ? aux_dp[e] : 0.0f;
      dot2 += static_cast<double>(pa[j]) * ad[j];
    }
    const float fdot2 = static_cast<float>(mma::warp_sum(dot2));
#pragma unroll
    for (int j = 0; j < EPL; ++j) dl[j] += pa[j] * (ad[j] - fdot2);
  }
#pragma unroll
  for (int j = 0; j < EPL; ++j) {
    const int e = lane + 32 * j;
    if (e < E) store_out(dlogits + static_cast<int64_t>(t) * E + e, dl[j]);
  }
}

int experts_per_lane(int64_t E) {
  int epl = 1;
  while (epl * 32 < E) epl *= 2;
  return epl;
}

// Dispatch on the experts-per-lane constant.
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
      break;  // experts_per_lane never exceeds 32 (E <= 1024 is checked by the caller)
  }
}

}  // namespace

namespace detail {

void router_forward_launch(const void* logits, bool logits_bf16, int T, int E, int k, bool norm, bool bf16_mode,
                           bool topk_softmax, int tokens_per_block, int blocks, int32_t* index, float* weights,
                           int32_t* part_count, float* part_psum, cudaStream_t stream) {
  const size_t smem = part_count ? static_cast<size_t>(kWarps) * E * 8 : 0;
  with_epl(experts_per_lane(E), [&](auto epl_c) {
    constexpr int EPL = decltype(epl_c)::value;
    auto launch = [&](auto* in) {
      using Tin = std::remove_const_t<std::remove_pointer_t<decltype(in)>>;
      auto kern = router_forward_kernel<EPL, Tin>;
      if (smem > 48 * 1024)
        MT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      launch_kernel(kern, blocks, kWarps * 32, smem, stream, in, T, E, k, norm, bf16_mode, topk_softmax,
          tokens_per_block, index, weights, part_count, part_psum);
    };
    if (logits_bf16)
      launch(static_cast<const bf16*>(logits));
    else
      launch(static_cast<const float*>(logits));
  });
}

void aux_stats_reduce_launch(const int32_t* part_count, const float* part_psum, int rows, int E, int32_t* count,
                             float* psum, cudaStream_t stream) {
  constexpr int kWarpsPerBlock = 8;
  launch_kernel(aux_stats_reduce_kernel, (E + kWarpsPerBlock - 1) / kWarpsPerBlock, kWarpsPerBlock * 32, 0, stream,
      part_count, part_psum, rows, E, count, psum);
}

void aux_loss_finish_launch(const int32_t* count, const float* psum, int E, double rows, bool bf16_mode, double daux,
                            float* aux, float* aux_dp, cudaStream_t stream) {
  launch_kernel(aux_loss_finish_kernel, 1, 256, 0, stream, count, psum, E, rows, bf16_mode, daux, aux, aux_dp);
}

void router_balanced_index_launch(int32_t* index, int64_t T, int k, int E, cudaStream_t stream) {
  const int64_t slots = T * k;
  const int blocks = static_cast<int>(std::min<int64_t>((slots + 255) / 256, 1024));
  launch_kernel(router_balanced_index_kernel, blocks, 256, 0, stream, index, slots, E);
}

void router_fault_index_launch(int32_t* index, const void* logits, bool logits_bf16, int64_t T, int k, int E, int every,
                               cudaStream_t stream) {
  const int64_t faulted = (T + every - 1) / every;
  const int blocks = static_cast<int>(std::min<int64_t>((faulted + 127) / 128, 1024));
  if (logits_bf16)
    launch_kernel(router_fault_index_kernel<__nv_bfloat16>, blocks, 128, 0, stream, index,
                  static_cast<const __nv_bfloat16*>(logits), T, k, E, every);
  else
    launch_kernel(router_fault_index_kernel<float>, blocks, 128, 0, stream, index, static_cast<const float*>(logits), T,
                  k, E, every);
}

void router_backward_launch(const float* dweights, const void* logits, bool logits_bf16, const int32_t* index,
                            const float* aux_dp, int T, int E, int k, bool norm, bool bf16_mode, bool topk_softmax,
                            void* dlogits, bool dlogits_bf16, cudaStream_t stream) {
  const int blocks = (T + kWarps - 1) / kWarps;
  with_epl(experts_per_lane(E), [&](auto epl_c) {
    constexpr int EPL = decltype(epl_c)::value;
    auto launch = [&](auto* in, auto* out) {
      using Tin = std::remove_const_t<std::remove_pointer_t<decltype(in)>>;
      using Tout = std::remove_pointer_t<decltype(out)>;
      launch_kernel(router_backward_kernel<EPL, Tin, Tout>, blocks, kWarps * 32, 0, stream, dweights, in, index,
          aux_dp, T, E, k, norm, bf16_mode, topk_softmax, out);
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
  });
}

}  // namespace detail
}  // namespace mt::cuda

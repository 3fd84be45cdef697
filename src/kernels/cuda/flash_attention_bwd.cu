#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_attention_kernels.h"
#include "kernels/cuda/flash_attention_tiles.cuh"
#include "kernels/cuda/mma_sm80.cuh"
#include "kernels/cuda/kernel_launch.cuh"

// Flash attention backward (FlashAttention-2 dataflow, mma.sync). Three launches:
//   1. delta[h][t] = Σ_d dO·O (fp32), D/8 lanes per (token, head), and the fp32 accumulators zeroed.
//   2. one block per (query head, 128-key tile, column slice), 8 warps owning 16 keys each. The block
//      walks the query rows that can see its keys in steps of BMQ (Q, dO, lse, delta double-buffered
//      with cp.async) and recomputes Pᵀ = exp(K·Qᵀ·scale − lse) transposed, so Pᵀ and
//      dSᵀ = Pᵀ ⊙ (V·dOᵀ − delta) sit in the score registers as A fragments for dV += Pᵀ·dO and
//      dK += dSᵀ·Q (columns of its slice). dSᵀ goes through shared memory for dQ += dS·K (slice
//      columns), which is added to an fp32 buffer with atomics; at the end dK, dV (this head's part of
//      its KV head) are added to fp32 buffers with atomics. One slice of all columns except at D = 256 (two
//      slices: the dK/dV accumulators of a full row would not fit in registers), see flash_attention_tiles.cuh.
//      MLA's D 192 / Dv 128: q, k, Sᵀ, dK, dQ over 192 columns, v, dO, dPᵀ, dV over 128.
//   3. fp32 buffers -> bf16 outputs (dQ and dK take the softmax scale here).
// With sinks' gradient requested, a small kernel after 1 adds dsinks from lse and delta (fixed order).
// A sliding window: the queries of a key tile end at last_query(last key) (flash_attention_tiles.cuh), and the
// per-step first keys (s_ds) carry the window, so the mask and the fully-visible test are the causal ones.
// Launches 1 (with the zeroing) and 3 are detail::flash_bwd_prologue / flash_bwd_epilogue, which the
// Hopper backward (flash_attention_bwd_sm90.cu, the default for head_dim 128 on a cc 9.0 GPU) shares.
// NOTE: fp32 atomics make dQ/dK/dV not bitwise reproducible run to run (the sum order varies); the
// values agree to fp32 rounding.

namespace mt::cuda {

namespace {

using flash::kBwdBN;
using flash::kBwdThreads;
using flash::kBwdWarps;
using mma::bf16;

// p[0] += a, p[1] += b (p 8-byte aligned). One vector atomic on Hopper: the dQ atomics are what bounds
// this kernel (L2 throughput), so halving their count matters.
__device__ __forceinline__ void atomic_add2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(a, b));
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

// A tile of ROWS rows with the backward's block of kBwdThreads threads (flash_attention_tiles.cuh).
template <int ROWS, int D>
__device__ __forceinline__ void load_rows(uint32_t s, const bf16* base, int row0, int T, int H, int head) {
  static_assert(ROWS * (D / 8) % kBwdThreads == 0, "tile chunks must split evenly");
  flash::load_rows<ROWS, D, kBwdThreads>(s, base, row0, T, H, head);
}

// The prologue in one launch: delta[h][t] = Σ_d dO·O (fp32; D here is the value head size, dO and O are
// [T][Hq][D]), a group of D/8 lanes per (token, head), one 16-byte packet of each a lane; and, grid-stride, the
// zeroing of the fp32 accumulators (nq4, nk4, nv4 float4s of dq_acc, dk_acc, dv_acc) and of the sm90 backward's
// item counter, `counter`. Before, three memsets and the delta kernel: a memset cannot start early under programmatic
// dependent launch, so each cost a full kernel boundary, and the delta kernel's 4-byte loads ran at ~2.8 TB/s.
template <int D>
__global__ void __launch_bounds__(256) flash_bwd_prologue_kernel(const bf16* __restrict__ dout,
                                                                 const bf16* __restrict__ out, int T, int Hq,
                                                                 float* __restrict__ delta, float4* zero_q,
                                                                 int64_t nq4, float4* zero_k, int64_t nk4,
                                                                 float4* zero_v, int64_t nv4, int* counter) {
  pdl_wait();
  constexpr int G = D / 8;  // lanes per row (2..32, a power of two)
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int64_t i = tid; i < nq4; i += threads) zero_q[i] = z;
  for (int64_t i = tid; i < nk4; i += threads) zero_k[i] = z;
  for (int64_t i = tid; i < nv4; i += threads) zero_v[i] = z;
  if (tid == 0 && counter) *counter = 0;
  const int64_t w = tid / G, rows = static_cast<int64_t>(T) * Hq;
  const int lane = static_cast<int>(tid % G);
  float acc = 0.0f;
  if (w < rows) {
    const uint4 g = *reinterpret_cast<const uint4*>(dout + w * D + lane * 8);
    const uint4 o = *reinterpret_cast<const uint4*>(out + w * D + lane * 8);
    const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&g);
    const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&o);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 a = __bfloat1622float2(g2[e]), b = __bfloat1622float2(o2[e]);
      acc += a.x * b.x + a.y * b.y;
    }
  }
#pragma unroll
  for (int off = G / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (w < rows && lane == 0) delta[(w % Hq) * T + w / Hq] = acc;
}

// The sinks' gradient, dsinks[h] += −Σ_t p_sink(t)·delta[h][t] with p_sink = exp(sinks[h] − lse[h][t]): the sink's
// column has a zero value vector, so its dP is 0 and its dS = p_sink·(0 − delta). One block per head: thread i
// sums tokens i, i + 256, ... in order, then a fixed tree over the threads, and thread 0 adds the total: the same
// order every run (bitwise reproducible, no atomics), and no other block touches dsinks[h].
constexpr int kSinkThreads = 256;
__global__ void __launch_bounds__(kSinkThreads) flash_sink_grad_kernel(const float* __restrict__ lse,
                                                                       const float* __restrict__ delta,
                                                                       const float* __restrict__ sinks,
                                                                       float* __restrict__ dsinks, int T) {
  pdl_wait();
  __shared__ float part[kSinkThreads];
  const int h = blockIdx.x;
  const float sink = sinks[h];
  const float* l = lse + static_cast<int64_t>(h) * T;
  const float* d = delta + static_cast<int64_t>(h) * T;
  float acc = 0.0f;
  for (int t = threadIdx.x; t < T; t += kSinkThreads) acc += expf(sink - l[t]) * d[t];
  part[threadIdx.x] = acc;
  __syncthreads();
#pragma unroll
  for (int w = kSinkThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) dsinks[h] -= part[0];
}

// fp32 accumulators -> bf16 for dK (nk elements) and dV (nv) in one launch (blockIdx.y: 0 dK times the softmax
// scale, 1 dV).
__global__ void dkdv_to_bf16_kernel(const float* __restrict__ dk_acc, const float* __restrict__ dv_acc, int64_t nk,
                                    int64_t nv, float dk_mul, bf16* __restrict__ dk, bf16* __restrict__ dv) {
  pdl_wait();
  const int64_t n = blockIdx.y == 0 ? nk : nv;
  const float* src = blockIdx.y == 0 ? dk_acc : dv_acc;
  bf16* dst = blockIdx.y == 0 ? dk : dv;
  const float mul = blockIdx.y == 0 ? dk_mul : 1.0f;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * 4) {
    const float4 v = *reinterpret_cast<const float4*>(src + i);
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x * mul, v.y * mul);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z * mul, v.w * mul);
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&lo);
    packed.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(dst + i) = packed;
  }
}

// DET (the deterministic backward): no dQ here (flash_bwd_dq_kernel makes it), and this head's dK, dV
// are stored, not added, into per-query-head buffers [T][Hq][DQK] / [T][Hq][DV] that dkdv_group_sum_kernel sums
// over the GQA group in head order, so no sum depends on which block finishes first.
// DQK: head size of q and k (K, Q tiles; Sᵀ, dK, dQ); DV: of v and dO (V, dO tiles; dPᵀ, dV). Where they differ
// (MLA's 192 / 128) the k-loops run to the larger with the other product's steps left out at compile time.
template <int DQK, int DV, int SLICES, bool DET>
__global__ void __launch_bounds__(kBwdThreads, flash::BwdCfg<DQK, DV>::MIN_BLOCKS)
    flash_bwd_kernel(detail::FlashArgs a, const bf16* __restrict__ q, const bf16* __restrict__ k,
                     const bf16* __restrict__ v, const bf16* __restrict__ dout, const float* __restrict__ lse,
                     const float* __restrict__ delta, float* __restrict__ dq_acc, float* __restrict__ dk_acc,
                     float* __restrict__ dv_acc) {
  pdl_wait();
  using C = flash::BwdTiles<DQK, DV, SLICES>;
  constexpr int BN = kBwdBN, BMQ = C::BMQ, DHK = C::DHK, DHV = C::DHV, CH = DQK / 8, CHV = DV / 8, NQ = BMQ / 8;
  constexpr int NDK = DHK / 8, NDV = DHV / 8, ND = NDK > NDV ? NDK : NDV;
  constexpr int KS = (DQK > DV ? DQK : DV) / 16, KSK = DQK / 16, KSV = DV / 16;  // Sᵀ/dPᵀ k-steps
  constexpr int WQ = C::WQ, WD = C::WD, DQN = C::DQN;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sK = mma::smem_u32(smem);
  const uint32_t sV = sK + C::K_BYTES;
  const uint32_t sQ0 = sV + C::V_BYTES;                                         // 2 buffers
  const uint32_t sO0 = sQ0 + 2 * C::Q_BYTES;                                    // dO, 2 buffers
  // dSᵀ [BN][LDS]
  bf16* sdS = reinterpret_cast<bf16*>(smem + C::K_BYTES + C::V_BYTES + 2 * C::Q_BYTES + 2 * C::O_BYTES);
  float* s_lse = reinterpret_cast<float*>(sdS + BN * C::LDS);                   // [2][BMQ], log2 units
  float* s_delta = s_lse + 2 * BMQ;                                             // [2][BMQ]
  int* s_ds = reinterpret_cast<int*>(s_delta + 2 * BMQ);  // [2][BMQ] first visible key (flash::first_key)

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, qd = lane & 3, mi_ = lane >> 3;
  const int h = blockIdx.x, hk = h / (a.Hq / a.Hk);
  const int T = a.T;
  const int k0 = blockIdx.y * BN;  // tile 0 (the most queries) is scheduled first
  // This block's columns: dQ and dK [dk0, dk0 + DHK), dV [dv0, dv0 + DHV).
  const int dk0 = blockIdx.z * DHK, dv0 = blockIdx.z * DHV;
  const int k_last = min(k0 + BN, T) - 1;
  // The queries that see a key of the tile: from the first key on (causal) to the last that sees the last key
  // (its document's end, or with a window W the earlier k_last + W − 1): O(BN + W) queries per key tile.
  const int q_lo = k0, q_hi = flash::last_query(a, k_last);
  const int nsteps = (q_hi - q_lo + BMQ) / BMQ;
  const float scale_log2 = a.scale * 1.4426950408889634f;

  auto load_step = [&](int buf, int qs) {
    load_rows<BMQ, DQK>(sQ0 + buf * C::Q_BYTES, q, qs, T, a.Hq, h);
    load_rows<BMQ, DV>(sO0 + buf * C::O_BYTES, dout, qs, T, a.Hq, h);
    for (int i = threadIdx.x; i < BMQ; i += kBwdThreads) {
      const int t = qs + i;
      const bool valid = t < T;
      s_lse[buf * BMQ + i] = valid ? lse[static_cast<int64_t>(h) * T + t] * 1.4426950408889634f : 0.0f;
      s_delta[buf * BMQ + i] = valid ? delta[static_cast<int64_t>(h) * T + t] : 0.0f;
      s_ds[buf * BMQ + i] = valid ? flash::first_key(a, t) : INT_MAX;  // rows past T see no key
    }
  };

  load_rows<BN, DQK>(sK, k, k0, T, a.Hk, hk);
  load_rows<BN, DV>(sV, v, k0, T, a.Hk, hk);
  load_step(0, q_lo);
  mma::cp_async_commit();

  const int kr0 = k0 + warp * 16 + g, kr1 = kr0 + 8;  // this thread's key rows
  float dk[NDK][4], dv[NDV][4];  // columns dk0 + 8j + 2qd (+1), dv0 + 8j + 2qd (+1)
#pragma unroll
  for (int j = 0; j < ND; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      if (j < NDK) dk[j][c] = 0.0f;
      if (j < NDV) dv[j][c] = 0.0f;
    }

  for (int st = 0; st < nsteps; ++st) {
    const int qs = q_lo + st * BMQ, buf = st & 1;
    const uint32_t sQ = sQ0 + buf * C::Q_BYTES, sO = sO0 + buf * C::O_BYTES;
    const float* lse2 = s_lse + buf * BMQ;
    const float* dlt = s_delta + buf * BMQ;
    const int* dsq = s_ds + buf * BMQ;
    mma::cp_async_wait<0>();
    __syncthreads();
    if (st + 1 < nsteps) load_step(buf ^ 1, qs + BMQ);
    mma::cp_async_commit();

    // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: the warp's 16 keys x BMQ queries.
    float sp[NQ][4], dp[NQ][4];
#pragma unroll
    for (int j = 0; j < NQ; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) sp[j][c] = 0.0f, dp[j][c] = 0.0f;
    // At DQK != DV, Sᵀ's and dPᵀ's k-steps run as two loops (KS = 0 skips the joint one): fewer fragments live.
    if constexpr (DQK != DV) {
#pragma unroll
      for (int kk = 0; kk < KSK; ++kk) {
        uint32_t ak[4];
        mma::ldmatrix_x4(ak, sK + flash::tile_offset<CH>(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int pr = 0; pr < NQ / 2; ++pr) {
          uint32_t bq[4];
          const int row = 16 * pr + (mi_ >> 1) * 8 + (lane & 7), col = kk * 16 + (mi_ & 1) * 8;
          mma::ldmatrix_x4(bq, sQ + flash::tile_offset<CH>(row, col));
          mma::mma_16816(sp[2 * pr], ak, bq[0], bq[1]);
          mma::mma_16816(sp[2 * pr + 1], ak, bq[2], bq[3]);
        }
      }
#pragma unroll
      for (int kk = 0; kk < KSV; ++kk) {
        uint32_t av[4];
        mma::ldmatrix_x4(av, sV + flash::tile_offset<CHV>(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int pr = 0; pr < NQ / 2; ++pr) {
          uint32_t bo[4];
          const int row = 16 * pr + (mi_ >> 1) * 8 + (lane & 7), col = kk * 16 + (mi_ & 1) * 8;
          mma::ldmatrix_x4(bo, sO + flash::tile_offset<CHV>(row, col));
          mma::mma_16816(dp[2 * pr], av, bo[0], bo[1]);
          mma::mma_16816(dp[2 * pr + 1], av, bo[2], bo[3]);
        }
      }
    }
#pragma unroll
    for (int kk = 0; kk < (DQK == DV ? KS : 0); ++kk) {
      uint32_t ak[4], av[4];
      if (kk < KSK)
        mma::ldmatrix_x4(ak, sK + flash::tile_offset<CH>(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
      if (kk < KSV)
        mma::ldmatrix_x4(av, sV + flash::tile_offset<CHV>(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
#pragma unroll
      for (int pr = 0; pr < NQ / 2; ++pr) {
        uint32_t bq[4], bo[4];
        const int row = 16 * pr + (mi_ >> 1) * 8 + (lane & 7), col = kk * 16 + (mi_ & 1) * 8;
        if (kk < KSK) mma::ldmatrix_x4(bq, sQ + flash::tile_offset<CH>(row, col));
        if (kk < KSV) mma::ldmatrix_x4(bo, sO + flash::tile_offset<CHV>(row, col));
        if (kk < KSK) {
          mma::mma_16816(sp[2 * pr], ak, bq[0], bq[1]);
          mma::mma_16816(sp[2 * pr + 1], ak, bq[2], bq[3]);
        }
        if (kk < KSV) {
          mma::mma_16816(dp[2 * pr], av, bo[0], bo[1]);
          mma::mma_16816(dp[2 * pr + 1], av, bo[2], bo[3]);
        }
      }
    }

    // Pᵀ = exp2(s·scale·log2e − lse·log2e) on visible (key, query) pairs; dSᵀ = Pᵀ ⊙ (dPᵀ − delta).
    // Masking is skipped when every key of the warp is visible to every query of the step (first keys grow
    // with the query: the step's last query has the greatest).
    const bool full = k0 + warp * 16 + 15 <= qs && k0 + warp * 16 >= dsq[BMQ - 1];
#pragma unroll
    for (int j = 0; j < NQ; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int qi = 8 * j + 2 * qd + (c & 1);
        const int key = c < 2 ? kr0 : kr1, qt = qs + qi;
        const bool vis = full || (key <= qt && key >= dsq[qi]);
        const float p = vis ? exp2f(sp[j][c] * scale_log2 - lse2[qi]) : 0.0f;
        sp[j][c] = p;
        dp[j][c] = p * (dp[j][c] - dlt[qi]);
      }
    }

    // dV += Pᵀ·dO and dK += dSᵀ·Q over the slice's columns (queries 16t..16t+15 = score tiles 2t, 2t+1
    // as the A operand's k); column pairs up to the wider of the two slices.
#pragma unroll
    for (int t = 0; t < BMQ / 16; ++t) {
      uint32_t pa[4], sa[4];
      pa[0] = mma::pack_bf16(sp[2 * t][0], sp[2 * t][1]);
      pa[1] = mma::pack_bf16(sp[2 * t][2], sp[2 * t][3]);
      pa[2] = mma::pack_bf16(sp[2 * t + 1][0], sp[2 * t + 1][1]);
      pa[3] = mma::pack_bf16(sp[2 * t + 1][2], sp[2 * t + 1][3]);
      sa[0] = mma::pack_bf16(dp[2 * t][0], dp[2 * t][1]);
      sa[1] = mma::pack_bf16(dp[2 * t][2], dp[2 * t][3]);
      sa[2] = mma::pack_bf16(dp[2 * t + 1][0], dp[2 * t + 1][1]);
      sa[3] = mma::pack_bf16(dp[2 * t + 1][2], dp[2 * t + 1][3]);
      if constexpr (!DET) {  // dSᵀ (bf16) to shared memory for dQ: rows = keys, columns = queries.
        bf16* r0p = sdS + (warp * 16 + g) * C::LDS + 16 * t + 2 * qd;
        *reinterpret_cast<uint32_t*>(r0p) = sa[0];
        *reinterpret_cast<uint32_t*>(r0p + 8 * C::LDS) = sa[1];
        *reinterpret_cast<uint32_t*>(r0p + 8) = sa[2];
        *reinterpret_cast<uint32_t*>(r0p + 8 * C::LDS + 8) = sa[3];
      }
#pragma unroll
      for (int pr = 0; pr < ND / 2; ++pr) {
        uint32_t bo[4], bq[4];
        const int row = 16 * t + (mi_ & 1) * 8 + (lane & 7), col = 16 * pr + (mi_ >> 1) * 8;
        if (pr < NDV / 2) mma::ldmatrix_x4_trans(bo, sO + flash::tile_offset<CHV>(row, dv0 + col));
        if (pr < NDK / 2) mma::ldmatrix_x4_trans(bq, sQ + flash::tile_offset<CH>(row, dk0 + col));
        if (pr < NDV / 2) {
          mma::mma_16816(dv[2 * pr], pa, bo[0], bo[1]);
          mma::mma_16816(dv[2 * pr + 1], pa, bo[2], bo[3]);
        }
        if (pr < NDK / 2) {
          mma::mma_16816(dk[2 * pr], sa, bq[0], bq[1]);
          mma::mma_16816(dk[2 * pr + 1], sa, bq[2], bq[3]);
        }
      }
    }
    __syncthreads();

    // dQ[step rows, slice] += dS·K: A = dS (queries x keys) read transposed from dSᵀ, B = K (keys x DHK).
    if constexpr (!DET) {
      const int wq = (warp % WQ) * 16, wd = dk0 + (warp / WQ) * (DHK / WD);
      float dq[DQN][4];
#pragma unroll
      for (int j = 0; j < DQN; ++j) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t as[4];
        mma::ldmatrix_x4_trans(
            as, mma::smem_u32(sdS + (kk * 16 + (mi_ >> 1) * 8 + (lane & 7)) * C::LDS + wq + (mi_ & 1) * 8));
#pragma unroll
        for (int pr = 0; pr < DQN / 2; ++pr) {
          uint32_t bk[4];
          mma::ldmatrix_x4_trans(
              bk, sK + flash::tile_offset<CH>(kk * 16 + (mi_ & 1) * 8 + (lane & 7), wd + 16 * pr + (mi_ >> 1) * 8));
          mma::mma_16816(dq[2 * pr], as, bk[0], bk[1]);
          mma::mma_16816(dq[2 * pr + 1], as, bk[2], bk[3]);
        }
        if constexpr (DQN % 2 != 0) {  // the last 8 columns: keys kk·16 .. +15 as two 8x8 matrices
          uint32_t bk[2];
          const int krow = kk * 16 + (mi_ & 1) * 8 + (lane & 7);
          mma::ldmatrix_x2_trans(bk, sK + flash::tile_offset<CH>(krow, wd + 8 * (DQN - 1)));
          mma::mma_16816(dq[DQN - 1], as, bk[0], bk[1]);
        }
      }
      const int qa = qs + wq + g, qb = qa + 8;
#pragma unroll
      for (int j = 0; j < DQN; ++j) {
        const int d = wd + 8 * j + 2 * qd;
        if (qa < T) atomic_add2(dq_acc + (static_cast<int64_t>(qa) * a.Hq + h) * DQK + d, dq[j][0], dq[j][1]);
        if (qb < T) atomic_add2(dq_acc + (static_cast<int64_t>(qb) * a.Hq + h) * DQK + d, dq[j][2], dq[j][3]);
      }
    }
  }

  // Row r of dK / dV: (r·H + head)·DQK / ·DV (H, head = Hq, h for DET's per-head rows, else Hk, hk).
  const int64_t H = DET ? a.Hq : a.Hk, hh = DET ? h : hk;
  if constexpr (DET) {  // this head's dK, dV, stored in its own rows [key][h]
#pragma unroll
    for (int j = 0; j < ND; ++j) {
      const int dkc = dk0 + 8 * j + 2 * qd, dvc = dv0 + 8 * j + 2 * qd;
      if (kr0 < T) {
        const int64_t r = static_cast<int64_t>(kr0) * H + hh;
        if (j < NDK) *reinterpret_cast<float2*>(dk_acc + r * DQK + dkc) = make_float2(dk[j][0], dk[j][1]);
        if (j < NDV) *reinterpret_cast<float2*>(dv_acc + r * DV + dvc) = make_float2(dv[j][0], dv[j][1]);
      }
      if (kr1 < T) {
        const int64_t r = static_cast<int64_t>(kr1) * H + hh;
        if (j < NDK) *reinterpret_cast<float2*>(dk_acc + r * DQK + dkc) = make_float2(dk[j][2], dk[j][3]);
        if (j < NDV) *reinterpret_cast<float2*>(dv_acc + r * DV + dvc) = make_float2(dv[j][2], dv[j][3]);
      }
    }
  } else {  // this head's share of dK, dV for the KV head
#pragma unroll
    for (int j = 0; j < ND; ++j) {
      const int dkc = dk0 + 8 * j + 2 * qd, dvc = dv0 + 8 * j + 2 * qd;
      if (kr0 < T) {
        const int64_t r = static_cast<int64_t>(kr0) * H + hh;
        if (j < NDK) atomic_add2(dk_acc + r * DQK + dkc, dk[j][0], dk[j][1]);
        if (j < NDV) atomic_add2(dv_acc + r * DV + dvc, dv[j][0], dv[j][1]);
      }
      if (kr1 < T) {
        const int64_t r = static_cast<int64_t>(kr1) * H + hh;
        if (j < NDK) atomic_add2(dk_acc + r * DQK + dkc, dk[j][2], dk[j][3]);
        if (j < NDV) atomic_add2(dv_acc + r * DV + dvc, dv[j][2], dv[j][3]);
      }
    }
  }
}

// The deterministic backward's dQ (FlashAttention-2's dQ as a forward-shaped pass): one block per (query
// head, 64-query tile), four warps of 16 query rows, walking the tile's key range [first_key(first query),
// last query] in tiles of DQ_BN keys (K and V double-buffered with cp.async; a warp skips the tiles none of its
// rows sees, as the forward). Per key tile it recomputes S = Q·Kᵀ and dP = dO·Vᵀ, then
// P = exp2(S·scale·log2e − lse·log2e) and dS = P ⊙ (dP − delta) exactly as flash_bwd_kernel does (dS rounded to
// bf16 for the MMA), and dQ += dS·K stays in registers: each dQ element is one sum in key order, stored once (no
// atomics). Cost: S and dP are computed twice (here and
// in the dK/dV pass), 7 GEMM passes instead of 5. DQK / DV as in flash_bwd_kernel: the dQ accumulator is 16 x DQK
// per warp (DQK / 2 registers per thread), so 192 takes 32-key tiles as 256 does (dQ 96 + S, dP 16 each).
template <int DQK, int DV = DQK>
struct DqCfg {
  static constexpr int BM = 64, WARPS = 4, BN = DQK >= 192 ? 32 : 64;
  static constexpr int SMEM = (BM * DQK + BM * DV + 2 * BN * DQK + 2 * BN * DV) * 2;  // Q, dO, 2 x (K, V)
};

template <int DQK, int DV>
__global__ void __launch_bounds__(DqCfg<DQK, DV>::WARPS * 32)
    flash_bwd_dq_kernel(detail::FlashArgs a, const bf16* __restrict__ q, const bf16* __restrict__ k,
                        const bf16* __restrict__ v, const bf16* __restrict__ dout, const float* __restrict__ lse,
                        const float* __restrict__ delta, float* __restrict__ dq_acc) {
  pdl_wait();
  using Cfg = DqCfg<DQK, DV>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, THREADS = Cfg::WARPS * 32;
  constexpr int CH = DQK / 8, CHV = DV / 8, NO = DQK / 8, NS = BN / 8;
  constexpr int KS = (DQK > DV ? DQK : DV) / 16, KSK = DQK / 16, KSV = DV / 16;  // S/dP k-steps
  constexpr int K_TILE = BN * DQK * 2, V_TILE = BN * DV * 2;  // bytes of one K, one V buffer
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = mma::smem_u32(smem);
  const uint32_t sO = sQ + BM * DQK * 2;     // dO
  const uint32_t sK0 = sO + BM * DV * 2;     // two K buffers, then two V buffers
  const uint32_t sV0 = sK0 + 2 * K_TILE;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, qd = lane & 3, mi_ = lane >> 3;
  const int h = blockIdx.x, hk = h / (a.Hq / a.Hk);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * BM;  // the longest key ranges first
  const int T = a.T;
  const int q_last = min(q0 + BM, T) - 1;
  const int kv_lo = flash::first_key(a, q0);
  const int ntiles = (q_last - kv_lo + BN) / BN;

  flash::load_rows<BM, DQK, THREADS>(sQ, q, q0, T, a.Hq, h);
  flash::load_rows<BM, DV, THREADS>(sO, dout, q0, T, a.Hq, h);
  flash::load_rows<BN, DQK, THREADS>(sK0, k, kv_lo, T, a.Hk, hk);
  flash::load_rows<BN, DV, THREADS>(sV0, v, kv_lo, T, a.Hk, hk);
  mma::cp_async_commit();

  const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;
  const int lo0 = r0 < T ? flash::first_key(a, r0) : T, lo1 = r1 < T ? flash::first_key(a, r1) : T;
  // The warp's first row. Its rows' least and greatest first keys are read per key tile below (L1 hits), not
  // kept: four more live registers made ptxas spill 44 bytes at D = 128 (12 this way, 8 before the window).
  const int w_first = q0 + warp * 16;
  constexpr float kLog2e = 1.4426950408889634f;
  const float scale_log2 = a.scale * kLog2e;
  const float lse0 = r0 < T ? lse[static_cast<int64_t>(h) * T + r0] * kLog2e : 0.0f;
  const float lse1 = r1 < T ? lse[static_cast<int64_t>(h) * T + r1] * kLog2e : 0.0f;
  const float dl0 = r0 < T ? delta[static_cast<int64_t>(h) * T + r0] : 0.0f;
  const float dl1 = r1 < T ? delta[static_cast<int64_t>(h) * T + r1] : 0.0f;
  float dq[NO][4];
#pragma unroll
  for (int j = 0; j < NO; ++j) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.0f;

  for (int jt = 0; jt < ntiles; ++jt) {
    const int k0 = kv_lo + jt * BN;
    const uint32_t sK = sK0 + (jt & 1) * K_TILE, sV = sV0 + (jt & 1) * V_TILE;
    mma::cp_async_wait<0>();
    __syncthreads();  // this tile landed, and every warp is done with the other buffer
    if (jt + 1 < ntiles) {
      flash::load_rows<BN, DQK, THREADS>(sK0 + ((jt + 1) & 1) * K_TILE, k, k0 + BN, T, a.Hk, hk);
      flash::load_rows<BN, DV, THREADS>(sV0 + ((jt + 1) & 1) * V_TILE, v, k0 + BN, T, a.Hk, hk);
    }
    mma::cp_async_commit();
    // No row of this warp sees a key of the tile (a warp past T sees none): dS = 0, skipped as in the forward.
    if (w_first >= T || k0 > w_first + 15 || k0 + BN - 1 < flash::first_key(a, w_first)) continue;

    // S = Q·Kᵀ and dP = dO·Vᵀ for the warp's 16 rows x BN keys.
    float s[NS][4], dp[NS][4];
#pragma unroll
    for (int j = 0; j < NS; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) s[j][c] = 0.0f, dp[j][c] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      uint32_t aq[4], ao[4];
      if (kk < KSK)
        mma::ldmatrix_x4(aq, sQ + flash::tile_offset<CH>(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
      if (kk < KSV)
        mma::ldmatrix_x4(ao, sO + flash::tile_offset<CHV>(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
#pragma unroll
      for (int pr = 0; pr < NS / 2; ++pr) {
        uint32_t bk[4], bv[4];
        const int krow = 16 * pr + (mi_ >> 1) * 8 + (lane & 7), kcol = kk * 16 + (mi_ & 1) * 8;
        if (kk < KSK) mma::ldmatrix_x4(bk, sK + flash::tile_offset<CH>(krow, kcol));
        if (kk < KSV) mma::ldmatrix_x4(bv, sV + flash::tile_offset<CHV>(krow, kcol));
        if (kk < KSK) {
          mma::mma_16816(s[2 * pr], aq, bk[0], bk[1]);
          mma::mma_16816(s[2 * pr + 1], aq, bk[2], bk[3]);
        }
        if (kk < KSV) {
          mma::mma_16816(dp[2 * pr], ao, bv[0], bv[1]);
          mma::mma_16816(dp[2 * pr + 1], ao, bv[2], bv[3]);
        }
      }
    }

    // dS = P ⊙ (dP − delta) on the visible (query, key) pairs; masking as in the forward.
    const bool full = k0 + BN - 1 <= w_first && k0 >= flash::first_key(a, min(w_first + 15, T - 1));
#pragma unroll
    for (int j = 0; j < NS; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int key = k0 + 8 * j + 2 * qd + (c & 1);
        const int row = c < 2 ? r0 : r1, lo = c < 2 ? lo0 : lo1;
        const bool vis = full || (key <= row && key >= lo);
        const float p = vis ? exp2f(s[j][c] * scale_log2 - (c < 2 ? lse0 : lse1)) : 0.0f;
        s[j][c] = p * (dp[j][c] - (c < 2 ? dl0 : dl1));
      }
    }

    // dQ += dS·K, dS rounded to bf16 from the score registers (keys 16t..16t+15 = score tiles 2t, 2t+1).
#pragma unroll
    for (int t = 0; t < BN / 16; ++t) {
      uint32_t sa[4];
      sa[0] = mma::pack_bf16(s[2 * t][0], s[2 * t][1]);
      sa[1] = mma::pack_bf16(s[2 * t][2], s[2 * t][3]);
      sa[2] = mma::pack_bf16(s[2 * t + 1][0], s[2 * t + 1][1]);
      sa[3] = mma::pack_bf16(s[2 * t + 1][2], s[2 * t + 1][3]);
#pragma unroll
      for (int pr = 0; pr < DQK / 16; ++pr) {
        uint32_t b[4];
        const int krow = 16 * t + (mi_ & 1) * 8 + (lane & 7);
        mma::ldmatrix_x4_trans(b, sK + flash::tile_offset<CH>(krow, 16 * pr + (mi_ >> 1) * 8));
        mma::mma_16816(dq[2 * pr], sa, b[0], b[1]);
        mma::mma_16816(dq[2 * pr + 1], sa, b[2], b[3]);
      }
    }
  }

  // Unscaled fp32 dQ, one store per element (the epilogue applies the softmax scale and rounds to bf16).
#pragma unroll
  for (int j = 0; j < NO; ++j) {
    const int d = 8 * j + 2 * qd;
    if (r0 < T) *reinterpret_cast<float2*>(dq_acc + (static_cast<int64_t>(r0) * a.Hq + h) * DQK + d) =
        make_float2(dq[j][0], dq[j][1]);
    if (r1 < T) *reinterpret_cast<float2*>(dq_acc + (static_cast<int64_t>(r1) * a.Hq + h) * DQK + d) =
        make_float2(dq[j][2], dq[j][3]);
  }
}

// The deterministic backward's dK, dV: Σ over the G query heads of each KV head, in head order, of the
// per-head sums [T][Hq][Dk] / [T][Hq][Dv] -> bf16 [T][Hk][Dk] / [T][Hk][Dv] (dK times the softmax scale). Four
// elements per thread.
__global__ void dkdv_group_sum_kernel(const float* __restrict__ dk_part, const float* __restrict__ dv_part, int T,
                                      int Hk, int G, int Dk, int Dv, float dk_mul, bf16* __restrict__ dk,
                                      bf16* __restrict__ dv) {
  pdl_wait();
  const int D = blockIdx.y == 0 ? Dk : Dv;
  const int64_t n = static_cast<int64_t>(T) * Hk * D;
  const float* src = blockIdx.y == 0 ? dk_part : dv_part;
  bf16* dst = blockIdx.y == 0 ? dk : dv;
  const float mul = blockIdx.y == 0 ? dk_mul : 1.0f;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * 4) {
    const int64_t row = i / D;  // t · Hk + hk
    const int d = static_cast<int>(i % D);
    const float* p = src + (row * G) * D + d;  // [t][hk·G + 0][d]: the group's heads are consecutive
    float4 acc = *reinterpret_cast<const float4*>(p);
    for (int gi = 1; gi < G; ++gi) {
      const float4 x = *reinterpret_cast<const float4*>(p + static_cast<int64_t>(gi) * D);
      acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
    }
    const __nv_bfloat162 lo = __floats2bfloat162_rn(acc.x * mul, acc.y * mul);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(acc.z * mul, acc.w * mul);
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&lo);
    packed.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(dst + i) = packed;
  }
}

// fp32 accumulators -> bf16, times `mul` (the softmax scale for dQ and dK).
__global__ void scale_to_bf16_kernel(const float* __restrict__ src, int64_t n, float mul, bf16* __restrict__ dst) {
  pdl_wait();
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 2; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x * 2) {
    const float2 v = *reinterpret_cast<const float2*>(src + i);
    *reinterpret_cast<__nv_bfloat162*>(dst + i) = __floats2bfloat162_rn(v.x * mul, v.y * mul);
  }
}

void to_bf16(const float* src, int64_t n, float mul, void* dst, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n / 2 + 255) / 256, 65536);
  launch_kernel(scale_to_bf16_kernel, static_cast<int>(blocks), 256, 0, stream, src, n, mul, static_cast<bf16*>(dst));
}

// Checks first (nothing is queued when the device cannot run this head_dim), then zeroes the fp32
// buffers and runs the three launches.
template <int DQK, int DV, int SLICES>
void bwd_launch_d(const detail::FlashArgs& a, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                  const bf16* out, const float* lse, void* dq, void* dk, void* dv, float* dq_acc, float* dk_acc,
                  float* dv_acc, float* delta, cudaStream_t stream) {
  constexpr int smem = flash::BwdTiles<DQK, DV, SLICES>::SMEM;
  flash::require_smem(smem, DQK, "backward");
  auto kern = flash_bwd_kernel<DQK, DV, SLICES, false>;
  MT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  detail::flash_bwd_prologue(a, dout, out, dq_acc, dk_acc, dv_acc, delta, stream);
  detail::flash_sink_grad_launch(a, lse, delta, stream);
  const dim3 grid(a.Hq, (a.T + kBwdBN - 1) / kBwdBN, SLICES);
  launch_kernel(kern, grid, kBwdThreads, smem, stream, a, q, k, v, dout, lse, delta, dq_acc, dk_acc, dv_acc);
  detail::flash_bwd_epilogue(a, dq_acc, dk_acc, dv_acc, dq, dk, dv, stream);
}

// The deterministic backward: prologue (delta), the dK/dV pass into per-head buffers, the dQ pass, then
// dq to bf16 and the group sums of dK, dV.
template <int DQK, int DV, int SLICES>
void bwd_det_launch_d(const detail::FlashArgs& a, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                      const bf16* out, const float* lse, void* dq, void* dk, void* dv, float* dq_acc, float* dk_part,
                      float* dv_part, float* delta, cudaStream_t stream) {
  constexpr int D = DQK;
  using Dq = DqCfg<DQK, DV>;
  constexpr int smem = flash::BwdTiles<DQK, DV, SLICES>::SMEM, dq_smem = Dq::SMEM;
  flash::require_smem(smem, D, "backward");
  flash::require_smem(dq_smem, D, "deterministic dQ backward");
  auto kern = flash_bwd_kernel<DQK, DV, SLICES, true>;
  auto dq_kern = flash_bwd_dq_kernel<DQK, DV>;
  MT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  MT_CUDA_CHECK(cudaFuncSetAttribute(dq_kern, cudaFuncAttributeMaxDynamicSharedMemorySize, dq_smem));
  // The zeroing is not needed (every element is stored once), but the prologue does delta in the same launch.
  detail::flash_bwd_prologue(a, dout, out, dq_acc, dk_part, dv_part, delta, stream);
  detail::flash_sink_grad_launch(a, lse, delta, stream);
  const dim3 grid(a.Hq, (a.T + kBwdBN - 1) / kBwdBN, SLICES);
  launch_kernel(kern, grid, kBwdThreads, smem, stream, a, q, k, v, dout, lse, delta, dq_acc, dk_part, dv_part);
  const dim3 dq_grid(a.Hq, (a.T + Dq::BM - 1) / Dq::BM);
  launch_kernel(dq_kern, dq_grid, Dq::WARPS * 32, dq_smem, stream, a, q, k, v, dout, lse,
                static_cast<const float*>(delta), dq_acc);
  to_bf16(dq_acc, static_cast<int64_t>(a.T) * a.Hq * D, a.scale, dq, stream);
  const int dv_dim = detail::flash_value_dim(a);
  const int64_t nk = static_cast<int64_t>(a.T) * a.Hk * std::max(D, dv_dim);  // the larger of dK, dV
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((nk / 4 + 255) / 256, 32768));
  launch_kernel(dkdv_group_sum_kernel, dim3(blocks, 2), 256, 0, stream, static_cast<const float*>(dk_part),
                static_cast<const float*>(dv_part), a.T, a.Hk, a.Hq / a.Hk, D, dv_dim, a.scale,
                static_cast<bf16*>(dk), static_cast<bf16*>(dv));
}

// DV: the value head size (dO and O rows); the accumulators' sizes come from a.D (dQ, dK) and DV (dV).
template <int DV>
void prologue_launch_d(const detail::FlashArgs& a, const bf16* dout, const bf16* out, float* dq_acc, float* dk_acc,
                       float* dv_acc, float* delta, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(a.T) * a.Hq;
  const int64_t nq4 = rows * a.D / 4, nk4 = static_cast<int64_t>(a.T) * a.Hk * a.D / 4;
  const int64_t nv4 = static_cast<int64_t>(a.T) * a.Hk * DV / 4;
  // The sm90 backward's item counter: the delta workspace's extra element (flash_attention.cpp allocates it).
  int* counter = reinterpret_cast<int*>(delta + rows);
  const auto blocks = static_cast<unsigned>((rows * (DV / 8) + 255) / 256);
  launch_kernel(flash_bwd_prologue_kernel<DV>, blocks, 256, 0, stream, dout, out, a.T, a.Hq, delta,
      reinterpret_cast<float4*>(dq_acc), nq4, reinterpret_cast<float4*>(dk_acc), nk4,
      reinterpret_cast<float4*>(dv_acc), nv4, counter);
}

template <int N>
using IntC = std::integral_constant<int, N>;

std::atomic<int> g_mla_slices{-1};  // detail::flash_bwd_mla_slices_set; -1: the environment

// Calls go(DQK, DV, SLICES) (integral constants) for a's head sizes: BwdCfg's slices, or for MLA's 192 / 128 the
// ones detail::flash_bwd_mla_slices picks.
template <typename Go>
void bwd_dispatch(const detail::FlashArgs& a, Go&& go) {
  if (detail::flash_value_dim(a) != a.D) {
    MT_CUDA_REQUIRE(a.D == 192 && detail::flash_value_dim(a) == 128,
                    "flash attention backward: head_dim " + std::to_string(a.D) + " with v_dim " +
                        std::to_string(detail::flash_value_dim(a)) + " (supported: 192 with 128)");
    if (detail::flash_bwd_mla_slices() == 2) return go(IntC<192>{}, IntC<128>{}, IntC<2>{});
    return go(IntC<192>{}, IntC<128>{}, IntC<1>{});
  }
  using flash::BwdCfg;
  switch (a.D) {
    case 16: return go(IntC<16>{}, IntC<16>{}, IntC<BwdCfg<16>::SLICES>{});
    case 32: return go(IntC<32>{}, IntC<32>{}, IntC<BwdCfg<32>::SLICES>{});
    case 64: return go(IntC<64>{}, IntC<64>{}, IntC<BwdCfg<64>::SLICES>{});
    case 128: return go(IntC<128>{}, IntC<128>{}, IntC<BwdCfg<128>::SLICES>{});
    case 256: return go(IntC<256>{}, IntC<256>{}, IntC<BwdCfg<256>::SLICES>{});
    default:
      MT_CUDA_REQUIRE(false, "flash attention backward: head_dim " + std::to_string(a.D) +
                                 " (supported: 16, 32, 64, 128, 256, 192 with v_dim 128)");
  }
}

}  // namespace

namespace detail {

void flash_bwd_prologue(const FlashArgs& a, const void* dout, const void* out, float* dq_acc, float* dk_acc,
                        float* dv_acc, float* delta, cudaStream_t stream) {
  const auto* o = static_cast<const bf16*>(out);
  const auto* g = static_cast<const bf16*>(dout);
  switch (flash_value_dim(a)) {  // delta's lanes per row follow dO's and O's head size
    case 16: return prologue_launch_d<16>(a, g, o, dq_acc, dk_acc, dv_acc, delta, stream);
    case 32: return prologue_launch_d<32>(a, g, o, dq_acc, dk_acc, dv_acc, delta, stream);
    case 64: return prologue_launch_d<64>(a, g, o, dq_acc, dk_acc, dv_acc, delta, stream);
    case 128: return prologue_launch_d<128>(a, g, o, dq_acc, dk_acc, dv_acc, delta, stream);
    case 256: return prologue_launch_d<256>(a, g, o, dq_acc, dk_acc, dv_acc, delta, stream);
    default:
      MT_CUDA_REQUIRE(false, "flash attention backward: value head size " + std::to_string(flash_value_dim(a)) +
                                 " (supported: 16, 32, 64, 128, 256)");
  }
}

void flash_bwd_epilogue(const FlashArgs& a, const float* dq_acc, const float* dk_acc, const float* dv_acc, void* dq,
                        void* dk, void* dv, cudaStream_t stream) {
  const int64_t nq = static_cast<int64_t>(a.T) * a.Hq * a.D, nk = static_cast<int64_t>(a.T) * a.Hk * a.D;
  const int64_t nv = static_cast<int64_t>(a.T) * a.Hk * flash_value_dim(a);
  if (dq_acc != nullptr) to_bf16(dq_acc, nq, a.scale, dq, stream);
  if (nk == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((std::max(nk, nv) / 4 + 255) / 256, 32768));
  launch_kernel(dkdv_to_bf16_kernel, dim3(blocks, 2), 256, 0, stream, dk_acc, dv_acc, nk, nv, a.scale,
      static_cast<bf16*>(dk), static_cast<bf16*>(dv));
}

void flash_sink_grad_launch(const FlashArgs& a, const float* lse, const float* delta, cudaStream_t stream) {
  if (a.dsinks == nullptr || a.T == 0) return;
  MT_CUDA_REQUIRE(a.sinks != nullptr, "flash attention backward: dsinks without sinks");
  launch_kernel(flash_sink_grad_kernel, a.Hq, kSinkThreads, 0, stream, lse, static_cast<const float*>(delta),
                a.sinks, a.dsinks, a.T);
}

void flash_bwd_mla_slices_set(int slices) { g_mla_slices.store(slices); }

int flash_bwd_mla_slices() {
  const int set = g_mla_slices.load();
  if (set == 1 || set == 2) return set;
  static const int from_env = [] {
    const char* e = std::getenv("MIXTUNE_FLASH_BWD_MLA_SLICES");
    return e && std::string(e) == "2" ? 2 : 1;
  }();
  return from_env;
}

void flash_bwd_launch(const FlashArgs& a, const void* dout, const void* q, const void* k, const void* v,
                      const void* out, const float* lse, void* dq, void* dk, void* dv, float* dq_acc, float* dk_acc,
                      float* dv_acc, float* delta, cudaStream_t stream) {
  if (a.T == 0) return;
  bwd_dispatch(a, [&](auto d_c, auto dv_c, auto s_c) {
    bwd_launch_d<decltype(d_c)::value, decltype(dv_c)::value, decltype(s_c)::value>(
        a, static_cast<const bf16*>(dout), static_cast<const bf16*>(q), static_cast<const bf16*>(k),
        static_cast<const bf16*>(v), static_cast<const bf16*>(out), lse, dq, dk, dv, dq_acc, dk_acc, dv_acc, delta,
        stream);
  });
}

void flash_bwd_deterministic_launch(const FlashArgs& a, const void* dout, const void* q, const void* k, const void* v,
                                    const void* out, const float* lse, void* dq, void* dk, void* dv, float* dq_acc,
                                    float* dk_part, float* dv_part, float* delta, cudaStream_t stream) {
  if (a.T == 0) return;
  bwd_dispatch(a, [&](auto d_c, auto dv_c, auto s_c) {
    bwd_det_launch_d<decltype(d_c)::value, decltype(dv_c)::value, decltype(s_c)::value>(
        a, static_cast<const bf16*>(dout), static_cast<const bf16*>(q), static_cast<const bf16*>(k),
        static_cast<const bf16*>(v), static_cast<const bf16*>(out), lse, dq, dk, dv, dq_acc, dk_part, dv_part, delta,
        stream);
  });
}

}  // namespace detail
}  // namespace mt::cuda

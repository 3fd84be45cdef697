#include <cuda_bf16.h>

#include <climits>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_attention_kernels.h"
#include "kernels/cuda/flash_attention_tiles.cuh"
#include "kernels/cuda/mma_sm80.cuh"
#include "kernels/cuda/kernel_launch.cuh"

// Flash attention forward (FlashAttention-2 dataflow, mma.sync): one block per (query head, BM-query
// tile), BM / 16 warps of 16 query rows. K/V tiles of BN keys stream through a cp.async double buffer
// (BM, BN per head_dim: flash_attention_tiles.cuh); the running max / sum stay in registers (scores in
// the log2 domain, exp2), P is rounded to bf16 straight from the score accumulators into A fragments
// for P·V. A query tile may span several packed documents: its key range is [first_key(first query),
// last query] (first_key: the document start, or with a sliding window W the later t − W + 1, so a window
// costs O(T·W)); per warp, a key tile that none of the warp's 16 rows sees is skipped (it would leave the
// running max, sum and O bitwise as they are), and the per-element mask runs only in tiles that not every
// row of the warp sees entirely. Sinks: the running max starts at the sink's logit and the sink's exp joins
// the row sum at the end, so lse includes it and the weights sum to 1 − p_sink.
// DQK: head size of q and k (Q and K tiles, Q·Kᵀ k-steps); DV: of v and out (V tiles, the O accumulator). Equal
// except MLA's 192 / 128, whose output rows are staged in the first 16·DV·2 bytes of the warp's Q rows.

namespace mt::cuda {

namespace {

using flash::FwdCfg;
using mma::bf16;

using flash::load_rows;

template <int DQK, int DV>
__global__ void __launch_bounds__(FwdCfg<DQK, DV>::WARPS * 32, FwdCfg<DQK, DV>::MIN_BLOCKS)
    flash_fwd_kernel(detail::FlashArgs a, const bf16* __restrict__ q, const bf16* __restrict__ k,
                     const bf16* __restrict__ v, bf16* __restrict__ out, float* __restrict__ lse) {
  pdl_wait();
  using Cfg = FwdCfg<DQK, DV>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, THREADS = Cfg::WARPS * 32;
  constexpr int CH = DQK / 8, CHV = DV / 8, NO = DV / 8, NS = BN / 8;
  constexpr int K_TILE = BN * DQK * 2, V_TILE = BN * DV * 2;  // bytes of one K, one V buffer
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = mma::smem_u32(smem);
  const uint32_t sK0 = sQ + BM * DQK * 2;  // two K buffers, then two V buffers
  const uint32_t sV0 = sK0 + 2 * K_TILE;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, qd = lane & 3, mi_ = lane >> 3;
  const int h = blockIdx.x, hk = h / (a.Hq / a.Hk);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * BM;  // the longest key ranges first
  const int T = a.T;
  const int q_last = min(q0 + BM, T) - 1;
  const int kv_lo = flash::first_key(a, q0);
  const int ntiles = (q_last - kv_lo + BN) / BN;

  load_rows<BM, DQK, THREADS>(sQ, q, q0, T, a.Hq, h);
  load_rows<BN, DQK, THREADS>(sK0, k, kv_lo, T, a.Hk, hk);
  load_rows<BN, DV, THREADS>(sV0, v, kv_lo, T, a.Hk, hk);
  mma::cp_async_commit();

  const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;
  // Each row's first visible key (rows past T see none: T is past every key they could be shown).
  const int lo0 = r0 < T ? flash::first_key(a, r0) : T, lo1 = r1 < T ? flash::first_key(a, r1) : T;
  // The warp's rows [w_first, w_last]: no key outside [w_lo_min, w_last] is visible to any of them, and keys
  // [w_lo_max, w_first] are visible to all (first keys grow with the row; a warp past T sees nothing).
  const int w_first = q0 + warp * 16, w_last = min(w_first + 15, T - 1);
  const int w_lo_min = w_first < T ? flash::first_key(a, w_first) : INT_MAX;
  const int w_lo_max = w_first < T ? flash::first_key(a, w_last) : INT_MAX;
  constexpr float kLog2e = 1.4426950408889634f;
  const float scale_log2 = a.scale * kLog2e;
  // The sink's logit in the log2 domain (-inf: none); the running max starts there, so every exp stays <= 1.
  const float sink2 = a.sinks ? a.sinks[h] * kLog2e : -INFINITY;
  float o[NO][4];
#pragma unroll
  for (int j = 0; j < NO; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m0 = sink2, m1 = sink2, l0 = 0.0f, l1 = 0.0f;

  for (int jt = 0; jt < ntiles; ++jt) {
    const int k0 = kv_lo + jt * BN;
    const uint32_t sK = sK0 + (jt & 1) * K_TILE, sV = sV0 + (jt & 1) * V_TILE;
    mma::cp_async_wait<0>();
    __syncthreads();  // this tile landed, and every warp is done with the other buffer
    if (jt + 1 < ntiles) {
      load_rows<BN, DQK, THREADS>(sK0 + ((jt + 1) & 1) * K_TILE, k, k0 + BN, T, a.Hk, hk);
      load_rows<BN, DV, THREADS>(sV0 + ((jt + 1) & 1) * V_TILE, v, k0 + BN, T, a.Hk, hk);
    }
    mma::cp_async_commit();
    if (k0 > w_last || k0 + BN - 1 < w_lo_min) continue;  // no row of this warp sees a key of the tile

    // S = Q · Kᵀ for the warp's 16 rows x BN keys.
    float s[NS][4];
#pragma unroll
    for (int j = 0; j < NS; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < DQK / 16; ++kk) {
      uint32_t af[4];
      mma::ldmatrix_x4(af, sQ + flash::tile_offset<CH>(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
#pragma unroll
      for (int pr = 0; pr < NS / 2; ++pr) {
        uint32_t b[4];
        const int krow = 16 * pr + (mi_ >> 1) * 8 + (lane & 7);
        mma::ldmatrix_x4(b, sK + flash::tile_offset<CH>(krow, kk * 16 + (mi_ & 1) * 8));
        mma::mma_16816(s[2 * pr], af, b[0], b[1]);
        mma::mma_16816(s[2 * pr + 1], af, b[2], b[3]);
      }
    }

    // Scale into the log2 domain; mask unless every key of the tile is visible to every row of the warp.
    const bool full = k0 + BN - 1 <= w_first && k0 >= w_lo_max;
    float tmax0 = -INFINITY, tmax1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < NS; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float x = s[j][c] * scale_log2;
        if (!full) {
          const int key = k0 + 8 * j + 2 * qd + (c & 1);
          const int row = c < 2 ? r0 : r1, lo = c < 2 ? lo0 : lo1;
          if (key > row || key < lo) x = -INFINITY;
        }
        s[j][c] = x;
      }
      tmax0 = fmaxf(tmax0, fmaxf(s[j][0], s[j][1]));
      tmax1 = fmaxf(tmax1, fmaxf(s[j][2], s[j][3]));
    }
#pragma unroll
    for (int o_ = 1; o_ < 4; o_ <<= 1) {
      tmax0 = fmaxf(tmax0, __shfl_xor_sync(0xffffffffu, tmax0, o_));
      tmax1 = fmaxf(tmax1, __shfl_xor_sync(0xffffffffu, tmax1, o_));
    }
    const float mn0 = fmaxf(m0, tmax0), mn1 = fmaxf(m1, tmax1);
    // A row with no visible key so far keeps m = -inf; subtract 0 then so exp2 gives 0, not NaN.
    const float base0 = mn0 == -INFINITY ? 0.0f : mn0, base1 = mn1 == -INFINITY ? 0.0f : mn1;
    const float alpha0 = exp2f(m0 - base0), alpha1 = exp2f(m1 - base1);
    m0 = mn0, m1 = mn1;
    l0 *= alpha0, l1 *= alpha1;
#pragma unroll
    for (int j = 0; j < NO; ++j) o[j][0] *= alpha0, o[j][1] *= alpha0, o[j][2] *= alpha1, o[j][3] *= alpha1;
#pragma unroll
    for (int j = 0; j < NS; ++j) {
      s[j][0] = exp2f(s[j][0] - base0), s[j][1] = exp2f(s[j][1] - base0);
      s[j][2] = exp2f(s[j][2] - base1), s[j][3] = exp2f(s[j][3] - base1);
      l0 += s[j][0] + s[j][1], l1 += s[j][2] + s[j][3];
    }

    // O += P · V, P rounded to bf16 from the score registers (keys 16t..16t+15 = score tiles 2t, 2t+1).
#pragma unroll
    for (int t = 0; t < BN / 16; ++t) {
      uint32_t pa[4];
      pa[0] = mma::pack_bf16(s[2 * t][0], s[2 * t][1]);
      pa[1] = mma::pack_bf16(s[2 * t][2], s[2 * t][3]);
      pa[2] = mma::pack_bf16(s[2 * t + 1][0], s[2 * t + 1][1]);
      pa[3] = mma::pack_bf16(s[2 * t + 1][2], s[2 * t + 1][3]);
#pragma unroll
      for (int pr = 0; pr < DV / 16; ++pr) {
        uint32_t b[4];
        const int vrow = 16 * t + (mi_ & 1) * 8 + (lane & 7);
        mma::ldmatrix_x4_trans(b, sV + flash::tile_offset<CHV>(vrow, 16 * pr + (mi_ >> 1) * 8));
        mma::mma_16816(o[2 * pr], pa, b[0], b[1]);
        mma::mma_16816(o[2 * pr + 1], pa, b[2], b[3]);
      }
    }
  }

  // Finish: full row sums across the quad, normalise, stage the warp's rows in its own part of sQ (16 rows of DV
  // columns in the tile layout of CHV chunks from the start of its 16·DQK·2 bytes: at DV == DQK exactly where
  // the rows were).
#pragma unroll
  for (int o_ = 1; o_ < 4; o_ <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o_);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o_);
  }
  if (a.sinks) l0 += exp2f(sink2 - m0), l1 += exp2f(sink2 - m1);  // m >= sink2 (finite): the sink's column
  const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
  // Where block row r (one of the warp's 16), column col is staged: the Q tile's own place for it at DV == DQK.
  auto stage_at = [&](int r, int col) -> unsigned char* {
    if constexpr (DV == DQK)
      return smem + flash::tile_offset<CH>(r, col);
    else
      return smem + warp * 16 * DQK * 2 + flash::tile_offset<CHV>(r - warp * 16, col);
  };
#pragma unroll
  for (int j = 0; j < NO; ++j) {
    const int col = 8 * j + 2 * qd;
    *reinterpret_cast<uint32_t*>(stage_at(warp * 16 + g, col)) = mma::pack_bf16(o[j][0] * inv0, o[j][1] * inv0);
    *reinterpret_cast<uint32_t*>(stage_at(warp * 16 + g + 8, col)) = mma::pack_bf16(o[j][2] * inv1, o[j][3] * inv1);
  }
  if (qd == 0) {
    constexpr float kLn2 = 0.6931471805599453f;
    if (r0 < T) lse[static_cast<int64_t>(h) * T + r0] = l0 > 0.0f ? (m0 + log2f(l0)) * kLn2 : -INFINITY;
    if (r1 < T) lse[static_cast<int64_t>(h) * T + r1] = l1 > 0.0f ? (m1 + log2f(l1)) * kLn2 : -INFINITY;
  }
  __syncwarp();
  static_assert(16 * CHV % 32 == 0, "output rows split over the lanes");
#pragma unroll
  for (int it = 0; it < 16 * CHV / 32; ++it) {
    const int idx = it * 32 + lane;
    const int i = warp * 16 + idx / CHV, c = idx % CHV, t = q0 + i;
    if (t < T)
      *reinterpret_cast<uint4*>(out + (static_cast<int64_t>(t) * a.Hq + h) * DV + c * 8) =
          *reinterpret_cast<const uint4*>(stage_at(i, c * 8));
  }
}

template <int DQK, int DV = DQK>
void fwd_launch_d(const detail::FlashArgs& a, const void* q, const void* k, const void* v, void* out, float* lse,
                  cudaStream_t stream) {
  constexpr int smem = flash::fwd_smem_bytes<DQK, DV>();
  flash::require_smem(smem, DQK, "forward");
  auto kern = flash_fwd_kernel<DQK, DV>;
  MT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(a.Hq, (a.T + FwdCfg<DQK, DV>::BM - 1) / FwdCfg<DQK, DV>::BM);
  launch_kernel(kern, grid, FwdCfg<DQK, DV>::WARPS * 32, smem, stream, a, static_cast<const bf16*>(q),
      static_cast<const bf16*>(k), static_cast<const bf16*>(v), static_cast<bf16*>(out), lse);
}

}  // namespace

namespace detail {

void flash_fwd_launch(const FlashArgs& a, const void* q, const void* k, const void* v, void* out, float* lse,
                      cudaStream_t stream) {
  if (a.T == 0) return;
  if (flash_value_dim(a) != a.D) {
    MT_CUDA_REQUIRE(a.D == 192 && flash_value_dim(a) == 128,
                    "flash attention forward: head_dim " + std::to_string(a.D) + " with v_dim " +
                        std::to_string(flash_value_dim(a)) + " (supported: 192 with 128)");
    return fwd_launch_d<192, 128>(a, q, k, v, out, lse, stream);
  }
  switch (a.D) {
    case 16: return fwd_launch_d<16>(a, q, k, v, out, lse, stream);
    case 32: return fwd_launch_d<32>(a, q, k, v, out, lse, stream);
    case 64: return fwd_launch_d<64>(a, q, k, v, out, lse, stream);
    case 128: return fwd_launch_d<128>(a, q, k, v, out, lse, stream);
    case 256: return fwd_launch_d<256>(a, q, k, v, out, lse, stream);
    default:
      MT_CUDA_REQUIRE(false, "flash attention forward: head_dim " + std::to_string(a.D) +
                                 " (supported: 16, 32, 64, 128, 256)");
  }
}

}  // namespace detail
}  // namespace mt::cuda

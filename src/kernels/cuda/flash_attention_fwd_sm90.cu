#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_attention_kernels.h"
#include "kernels/cuda/flash_attention_tiles.cuh"
#include "kernels/cuda/sm90_common.cuh"
#include "kernels/cuda/tensor_checks.h"
#include "kernels/cuda/kernel_launch.cuh"

// Hopper (sm_90a) flash-attention forward for head_dim 128 and 64: TMA tile loads, wgmma, producer/consumer
// warpgroups (the FlashAttention-3 dataflow, written from its description). Same contract as the
// mma.sync forward (flash_attention_fwd.cu): causal GQA over packed documents, scores and softmax in
// fp32 (log2 domain, exp2), P rounded to bf16 unnormalised, out = P·V / rowsum, lse [Hq][T] natural log.
//
// Block = one head x 128 queries, 3 warpgroups (384 threads, one block per SM: 161 KiB of shared memory):
//   warpgroup 0: producer (setmaxnreg 24). One thread loads Q once, then per key tile of 128 keys the K
//                tile (arming k_full[s]) and the V tile (v_full[s]) into a 2-stage ring; it waits on
//                k_empty[s] / v_empty[s] before refilling a stage. Tiles are [128 rows][128 columns]
//                bf16 stored as two [128 rows][64 columns] boxes (128-byte rows, 128-byte swizzle).
//   warpgroups 1, 2: consumers (setmaxnreg 240), query rows 64c .. 64c + 63 of the block (c = 0, 1).
//                S = Q·Kᵀ: wgmma m64n128k16, Q and K from shared memory (both K-major).
//                O += P·V: wgmma m64n128k16 with P from registers (the bf16 pairs of the S accumulator
//                are already the A fragment) and V from shared memory as an MN-major B operand.
// Consumer loop (software-pipelined inside the warpgroup): S_0 and its softmax first; then for each
// tile j: issue S_{j+1} = Q·K_{j+1}ᵀ, issue O += P_j·V_j, wait for S_{j+1} (hand K_{j+1} back), run its
// masking / max / exp2 / row sums while P_j·V_j runs on the tensor cores, wait for P_j·V_j (hand V_j
// back), rescale O by exp2(m_old − m_new), pack P_{j+1}. The two consumer warpgroups overlap each
// other as well. Registers per consumer thread: S 64 + O 64 fp32, P 32 (bf16x2).
// Key range of a block: [doc_start(first query), last query] in tiles of 128; a tile is masked per
// element (key > row or key < doc_start(row)) only when not every key is visible to every row.
// Epilogue: each consumer warpgroup normalises its 64 rows, stages them in its own (finished) rows of
// the Q buffer, 16-byte stores to out; rows past T are neither loaded (TMA zero fill) nor stored.
// Grid (Hq, query tiles), the last query tiles (longest key ranges) first; the query heads of one KV
// head are neighbours in launch order, so their K/V tiles come from L2.
//
// head_dim 64 (GPT-OSS) is the same kernel with one 64-column box per row: Q·Kᵀ is 4 k-steps, O += P·V is
// m64n64k16 (O 32 registers), 80 KiB of shared memory. It alone also takes a sliding window, sinks and any
// scale, with the mma.sync forward's semantics: key range from flash::first_key (the document start or
// t − W + 1), the running max starts at the sink's logit and the sink's exp2 joins the row sum (lse includes
// it). A key tile that no row of a consumer warpgroup sees is computed masked (all -inf): it leaves m, l and
// O exactly as they are (alpha 1 or, with no key seen yet, 0 on zeros; P = 0), so the results are those of a
// skip. The head_dim 128 instantiation keeps the plain path (doc_start bounds, no sink): its code is unchanged.
//
// MLA (DeepSeek-V3: q and k 192 columns, v and out 128) is the same kernel with three boxes per Q and K row and two
// per V row: Q·Kᵀ is 12 k-steps of m64n128k16, O += P·V as at head_dim 128 (O 64 registers); 208 KiB of tiles
// (Q 48 + 2 x (K 48 + V 32)), 211 KiB with the barriers, anchor and alignment slack. Plain path with any softmax
// scale (MLA's yarn scale), no window or sinks. Auto's default since its tests passed on an
// H200 (MIXTUNE_FLASH_FWD_SM90_MLA=0 opts out, flash_attention.cpp).

namespace mt::cuda {

namespace {

using sm90::bf16;
#if MT_SM90A_DEVICE
using sm90::pack_bf16;
using sm90::sts_u32;
#endif

constexpr int kBM = 128;                     // queries per block: 2 consumer warpgroups x 64
constexpr int kBN = 128;                     // keys per K/V tile
constexpr int kStages = 2;                   // K/V ring
constexpr int kThreads = 384;                // producer warpgroup + 2 consumer warpgroups
constexpr int kBoxBytes = 128 * 128;         // one [128 rows][64 columns] box: 16 KiB
constexpr int kNumBars = 1 + 4 * kStages;    // q_full, k_full[], v_full[], k_empty[], v_empty[]
static_assert(kBM == kBN, "the visible-tile test and the tile count assume square tiles");

// Shared-memory layout per head size: a Q or K tile is [128 rows][DQK columns] stored as DQK / 64 boxes, a V tile
// [128 rows][DV columns] as DV / 64 boxes (DQK = DV except MLA's 192 / 128).
template <int DQK, int DV = DQK>
struct Layout {
  static_assert(((DQK == 64 || DQK == 128) && DV == DQK) || (DQK == 192 && DV == 128),
                "the sm90 forward is built for head_dim 64 and 128, and 192 with 128-column values");
  static constexpr int kQKBoxes = DQK / 64, kVBoxes = DV / 64;
  static constexpr int kQKTileBytes = kQKBoxes * kBoxBytes;  // 32 KiB (128), 16 KiB (64), 48 KiB (192)
  static constexpr int kVTileBytes = kVBoxes * kBoxBytes;
  static constexpr int kQOff = 0;
  static constexpr int kKOff = kQOff + kQKTileBytes;
  static constexpr int kVOff = kKOff + kStages * kQKTileBytes;
  static constexpr int kBarOff = kVOff + kStages * kVTileBytes;
  static constexpr int kAnchorOff = kBarOff + kNumBars * 8;  // EARLY: each consumer thread's running row sums
  static constexpr int kSmemBytes = 1024 + kAnchorOff + 256 * 8;  // 1 KiB of slack to align the tiles to 1024
  static_assert(kBarOff % 1024 == 0, "tiles stay 1024-aligned (the 128-byte swizzle atom)");
  // Window and sinks: head_dim 64 only (head_dim 128 keeps its measured plain path; MLA has neither). Any scale
  // runs at every size (the kernel multiplies by a.scale); flash_fwd_sm90_takes_args says which calls come here.
  static constexpr bool kFeatures = DQK == 64;
  static_assert(kSmemBytes <= 227 * 1024, "an sm90 block's shared memory");
};

#if MT_SM90A_DEVICE

// S[64] = Q rows (64 x D, from q_rows) · K tile (128 keys x D)ᵀ: D / 16 k-steps of 16 columns; columns
// 64..127 live in the second box (+16 KiB), a k-step inside a box is +32 bytes.
template <int D>
__device__ __forceinline__ void issue_qk(float (&s)[64], uint32_t q_rows, uint32_t k_tile) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t off = (kk >> 2) * kBoxBytes + (kk & 3) * 32;
    sm90::wgmma_m64n128k16<0, 0>(s, sm90::smem_desc(q_rows + off), sm90::smem_desc(k_tile + off), kk > 0 ? 1 : 0);
  }
}

// O[64] += P (64 x 128 keys, registers) · V tile (128 keys x 128 columns, MN-major): k-step kk takes
// keys 16kk .. 16kk + 15 (+16 rows of 128 bytes = 2 KiB); the second 64-column box is the leading byte
// offset (16 KiB) away.
// head_dim 64: O[32] += P · V tile (128 keys x 64 columns, one box; m64n64k16, the leading byte offset unused).
template <int D>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (&p)[32], uint32_t v_tile) {
#pragma unroll
  for (int kk = 0; kk < kBN / 16; ++kk) {
    if constexpr (D == 128)
      sm90::wgmma_m64n128k16_rs<1>(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
                                   sm90::smem_desc_mn_lbo(v_tile + kk * 2048, kBoxBytes), 1);
    else
      sm90::wgmma_m64n64k16_rs<1>(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
                                  sm90::smem_desc_mn_lbo(v_tile + kk * 2048, kBoxBytes), 1);
  }
}

// Per-thread row state: accumulator element s[4j + e] is row r0 (e < 2) or r0 + 8 (e >= 2), key
// k0 + 8j + 2·qd + (e & 1) of the tile.
struct RowState {
  float m0, m1;  // running max of the scaled scores (log2 domain); -inf while no key was visible
  float l0, l1;  // this thread's part of the running row sums (the quad's 4 parts are added at the end)
};

// Hides the keys a row does not see (key > row or key < its first key ds0 / ds1: doc_start(row), or
// flash::first_key(row) with the features): s = -inf.
__device__ __forceinline__ void mask_tile(float (&s)[64], int k0, int qd, int r0, int ds0, int ds1) {
  const int r1 = r0 + 8;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = k0 + 8 * j + 2 * qd + (e & 1);
      const bool hidden = e < 2 ? (key > r0 || key < ds0) : (key > r1 || key < ds1);
      if (hidden) s[4 * j + e] = -INFINITY;
    }
  }
}

// Takes the row max, rescales the running state and turns s into exp2(s·scale − m) in place. Returns
// the factors the previous O rows must be multiplied by.
__device__ __forceinline__ void softmax_tile(float (&s)[64], RowState& st, float& alpha0, float& alpha1,
                                             float scale_log2) {
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    mx0 = fmaxf(mx0, fmaxf(s[4 * j], s[4 * j + 1]));
    mx1 = fmaxf(mx1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
#pragma unroll
  for (int x = 1; x < 4; x <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
  }
  // scale_log2 > 0, so the max of the scaled scores is the scaled max (-inf stays -inf).
  const float mn0 = fmaxf(st.m0, mx0 * scale_log2), mn1 = fmaxf(st.m1, mx1 * scale_log2);
  // A row with no visible key so far keeps m = -inf; subtract 0 then so exp2 gives 0, not NaN.
  const float b0 = mn0 == -INFINITY ? 0.0f : mn0, b1 = mn1 == -INFINITY ? 0.0f : mn1;
  alpha0 = exp2f(st.m0 - b0);
  alpha1 = exp2f(st.m1 - b1);
  st.m0 = mn0;
  st.m1 = mn1;
  float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    s[4 * j] = exp2f(fmaf(s[4 * j], scale_log2, -b0));
    s[4 * j + 1] = exp2f(fmaf(s[4 * j + 1], scale_log2, -b0));
    s[4 * j + 2] = exp2f(fmaf(s[4 * j + 2], scale_log2, -b1));
    s[4 * j + 3] = exp2f(fmaf(s[4 * j + 3], scale_log2, -b1));
    sum0 += s[4 * j] + s[4 * j + 1];
    sum1 += s[4 * j + 2] + s[4 * j + 3];
  }
  st.l0 = st.l0 * alpha0 + sum0;
  st.l1 = st.l1 * alpha1 + sum1;
}

// P as wgmma A fragments: k-step kk (keys 16kk .. 16kk + 15) is accumulator elements 8kk .. 8kk + 7.
__device__ __forceinline__ void pack_p(uint32_t (&p)[32], const float (&s)[64]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) p[i] = pack_bf16(s[2 * i], s[2 * i + 1]);
}

#endif  // MT_SM90A_DEVICE

// EARLY: the next tile's softmax is pinned before the wait for this tile's P·V (see the loop).
template <int DQK, int DV, bool EARLY>
__global__ void __launch_bounds__(kThreads, 1)
    flash_fwd_sm90_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                          const __grid_constant__ CUtensorMap map_v, detail::FlashArgs a, bf16* __restrict__ out,
                          float* __restrict__ lse) {
  pdl_wait();
#if MT_SM90A_DEVICE
  using namespace sm90;
  using L = Layout<DQK, DV>;
  constexpr int kQKTileBytes = L::kQKTileBytes, kVTileBytes = L::kVTileBytes;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t sQ = base + L::kQOff, sK = base + L::kKOff, sV = base + L::kVOff;
  const uint32_t q_full = base + L::kBarOff;
  auto k_full = [&](int s) { return q_full + 8u * (1 + s); };
  auto v_full = [&](int s) { return q_full + 8u * (1 + kStages + s); };
  auto k_empty = [&](int s) { return q_full + 8u * (1 + 2 * kStages + s); };
  auto v_empty = [&](int s) { return q_full + 8u * (1 + 3 * kStages + s); };

  const int tid = threadIdx.x;
  const int T = a.T;
  const int h = blockIdx.x, hk = h / (a.Hq / a.Hk);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBM;  // the longest key ranges first
  const int q_last = min(q0 + kBM, T) - 1;
  int kv_lo;
  if constexpr (L::kFeatures)
    kv_lo = flash::first_key(a, q0);
  else
    kv_lo = a.doc_start[q0];
  const int ntiles = (q_last - kv_lo + kBN) / kBN;  // >= 1 for valid bounds (kv_lo <= q0 <= q_last)

  if (tid == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(k_full(s), 1);  // the producer's arrive.expect_tx
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), CONSUMER_THREADS);  // every consumer thread, once per tile
      mbar_init(v_empty(s), CONSUMER_THREADS);
    }
    // Make the initialised barriers visible to the other threads and to the async (TMA) proxy.
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();

  if (tid < 128) {
    // ---- producer warpgroup: one thread issues every TMA load.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (tid == 0 && ntiles > 0) {
      tma_prefetch_map(&map_q);
      tma_prefetch_map(&map_k);
      tma_prefetch_map(&map_v);
      // Full box bytes even where a box runs past T (TMA counts the zero fill).
      mbar_arrive_expect_tx(q_full, kQKTileBytes);
#pragma unroll
      for (int b = 0; b < L::kQKBoxes; ++b) tma_load_2d(sQ + b * kBoxBytes, &map_q, q_full, h * DQK + 64 * b, q0);
      for (int jt = 0; jt < ntiles; ++jt) {
        const int s = jt & 1, k0 = kv_lo + jt * kBN;
        const uint32_t parity = ((jt >> 1) & 1) ^ 1;  // the stage's previous use; a fresh barrier passes
        mbar_wait(k_empty(s), parity);
        mbar_arrive_expect_tx(k_full(s), kQKTileBytes);
#pragma unroll
        for (int b = 0; b < L::kQKBoxes; ++b)
          tma_load_2d(sK + s * kQKTileBytes + b * kBoxBytes, &map_k, k_full(s), hk * DQK + 64 * b, k0);
        mbar_wait(v_empty(s), parity);
        mbar_arrive_expect_tx(v_full(s), kVTileBytes);
#pragma unroll
        for (int b = 0; b < L::kVBoxes; ++b)
          tma_load_2d(sV + s * kVTileBytes + b * kBoxBytes, &map_v, v_full(s), hk * DV + 64 * b, k0);
      }
    }
  } else {
    // ---- consumer warpgroups.
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    // Only with malformed bounds (doc_start past the block's last query): nothing to attend, nothing
    // stored, and the producer loads nothing either. NOTE: this early exit also matters to ptxas (13.0): without
    // one, it allocated this branch within the 168-register launch budget instead of setmaxnreg's 240
    // (208 bytes of spills, serialized wgmma). Check `ptxas -v` after changing this branch.
    if (ntiles <= 0) return;
    const int c = tid / 128 - 1;  // rows 64c .. 64c + 63 of the block
    const int ctid = tid - 128 * (c + 1);
    const int w = ctid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
    const int lrow = 64 * c + 16 * w + g;  // this thread's rows: lrow and lrow + 8 of the block
    const int r0 = q0 + lrow, r1 = r0 + 8;
    // Each row's first visible key; rows past T see no key (first key T): they stay finite and are never stored.
    int ds0, ds1, ds_max;
    float sink2 = -INFINITY;  // the sink's logit in the log2 domain (-inf: none)
    if constexpr (L::kFeatures) {
      ds0 = r0 < T ? flash::first_key(a, r0) : T, ds1 = r1 < T ? flash::first_key(a, r1) : T;
      ds_max = flash::first_key(a, q_last);  // first_key is non-decreasing in t
      if (a.sinks) sink2 = a.sinks[h] * 1.4426950408889634f;
    } else {
      ds0 = r0 < T ? a.doc_start[r0] : T, ds1 = r1 < T ? a.doc_start[r1] : T;
      ds_max = a.doc_start[q_last];  // doc_start is non-decreasing in t
    }
    const float scale_log2 = a.scale * 1.4426950408889634f;
    const uint32_t q_rows = sQ + c * 64 * 128;
    const uint32_t anchor = base + L::kAnchorOff + (tid - 128) * 8;  // EARLY's store target, never read

    float o[DV / 2], s[64];
    uint32_t p[32];
#pragma unroll
    for (int i = 0; i < DV / 2; ++i) o[i] = 0.0f;
    // The running max starts at the sink's logit (so every exp stays <= 1), as in the mma.sync forward.
    RowState st{sink2, sink2, 0.0f, 0.0f};
    float alpha0 = 0.0f, alpha1 = 0.0f;
    // Every key of the tile at k0 is visible to every row of the block: no mask.
    auto visible = [&](int k0) { return k0 + kBN - 1 <= q0 && k0 >= ds_max; };

    mbar_wait(q_full, 0);
    mbar_wait(k_full(0), 0);
    wgmma_fence();
    issue_qk<DQK>(s, q_rows, sK);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);
    mbar_arrive(k_empty(0));
    if (!visible(kv_lo)) mask_tile(s, kv_lo, qd, r0, ds0, ds1);
    softmax_tile(s, st, alpha0, alpha1, scale_log2);
    pack_p(p, s);

    // Tiles 0 .. ntiles - 2: S of the next tile, then P·V of this one (no branch around the MMAs: the
    // accumulators keep one register assignment through the loop).
    for (int jt = 0; jt + 1 < ntiles; ++jt) {
      const int cur = jt & 1, nxt = cur ^ 1;
      mbar_wait(k_full(nxt), ((jt + 1) >> 1) & 1);
      wgmma_fence();  // s, p and o were written by ordinary instructions since the last MMAs
      issue_qk<DQK>(s, q_rows, sK + nxt * kQKTileBytes);
      wgmma_commit();
      mbar_wait(v_full(cur), (jt >> 1) & 1);
      wgmma_fence();  // S_{j+1} issue and a wait since the last fence (ptxas would insert this one itself)
      issue_pv<DV>(o, p, sV + cur * kVTileBytes);
      wgmma_commit();
      wgmma_wait<1>();  // S_{j+1} done (groups complete in order); P_j·V_j may still run
      fence_regs(s);
      mbar_arrive(k_empty(nxt));
      const int k0 = kv_lo + (jt + 1) * kBN;
      if (!visible(k0)) mask_tile(s, k0, qd, r0, ds0, ds1);
      softmax_tile(s, st, alpha0, alpha1, scale_log2);
      if constexpr (EARLY) {
        // ptxas (13.0) sinks the exp2 and row sums below the wait (SASS: every MUFU.EX2 of the loop after its
        // last WARPGROUP.DEPBAR), so the softmax never overlapped P_j·V_j; empty asm operand fences do not
        // survive into PTX and did not change that (bench/NOTES.md 85). A shared-memory store of the row sums
        // (which need every exp2 of the tile) is a memory operation ptxas keeps before the wait.
        fence_regs(s);
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(anchor), "f"(st.l0), "f"(st.l1) : "memory");
      }
      wgmma_wait<0>();  // P_j·V_j done: o readable, p writable
      fence_regs(o);
      fence_regs(s);  // keeps the packing below after the wait
      mbar_arrive(v_empty(cur));
#pragma unroll
      for (int j = 0; j < DV / 8; ++j) {
        o[4 * j] *= alpha0, o[4 * j + 1] *= alpha0;
        o[4 * j + 2] *= alpha1, o[4 * j + 3] *= alpha1;
      }
      pack_p(p, s);
    }
    {  // P·V of the last tile
      const int jt = ntiles - 1, cur = jt & 1;
      mbar_wait(v_full(cur), (jt >> 1) & 1);
      wgmma_fence();
      issue_pv<DV>(o, p, sV + cur * kVTileBytes);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(o);
      mbar_arrive(v_empty(cur));
    }

    // ---- epilogue: full row sums across the quad, normalise, stage in this warpgroup's rows of the
    // Q buffer (its last MMA has completed; the other warpgroup reads only its own rows) with the
    // 128-byte swizzle (16-byte chunk ^ row % 8: conflict-free 4-byte writes and 16-byte reads).
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {
      st.l0 += __shfl_xor_sync(0xffffffffu, st.l0, x);
      st.l1 += __shfl_xor_sync(0xffffffffu, st.l1, x);
    }
    if constexpr (L::kFeatures) {
      // The sink's column (m >= sink2, finite): lse includes it and the weights sum to 1 − p_sink.
      if (a.sinks) st.l0 += exp2f(sink2 - st.m0), st.l1 += exp2f(sink2 - st.m1);
    }
    const float inv0 = st.l0 > 0.0f ? 1.0f / st.l0 : 0.0f, inv1 = st.l1 > 0.0f ? 1.0f / st.l1 : 0.0f;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // async-proxy reads before generic writes
    unsigned char* stage = smem + L::kQOff;
#pragma unroll
    for (int j = 0; j < DV / 8; ++j) {
      const int box = j >> 3, chunk = (j & 7) ^ (lrow & 7);  // (lrow + 8) % 8 == lrow % 8
      unsigned char* at = stage + box * kBoxBytes + lrow * 128 + chunk * 16 + qd * 4;
      *reinterpret_cast<uint32_t*>(at) = pack_bf16(o[4 * j] * inv0, o[4 * j + 1] * inv0);
      *reinterpret_cast<uint32_t*>(at + 8 * 128) = pack_bf16(o[4 * j + 2] * inv1, o[4 * j + 3] * inv1);
    }
    if (qd == 0) {
      constexpr float kLn2 = 0.6931471805599453f;
      if (r0 < T) lse[static_cast<int64_t>(h) * T + r0] = st.l0 > 0.0f ? (st.m0 + log2f(st.l0)) * kLn2 : -INFINITY;
      if (r1 < T) lse[static_cast<int64_t>(h) * T + r1] = st.l1 > 0.0f ? (st.m1 + log2f(st.l1)) * kLn2 : -INFINITY;
    }
    named_barrier_sync(1 + c, 128);
    // 64 rows x CH = DV / 8 chunks of 16 bytes; CH consecutive threads write one row's 2·DV bytes (staged in the
    // first DV / 64 boxes of the Q tile).
    constexpr int CH = DV / 8;
#pragma unroll
    for (int it = 0; it < 64 * CH / 128; ++it) {
      const int idx = it * 128 + ctid;
      const int row = 64 * c + idx / CH, cc = idx % CH, t = q0 + row;
      if (t < T) {
        const unsigned char* src = stage + (cc >> 3) * kBoxBytes + row * 128 + (((cc & 7) ^ (row & 7)) * 16);
        *reinterpret_cast<uint4*>(out + (static_cast<int64_t>(t) * a.Hq + h) * DV + cc * 8) =
            *reinterpret_cast<const uint4*>(src);
      }
    }
  }
#else
  // Built for another architecture: the host never launches this (flash_fwd_sm90_supported).
  __trap();
#endif
}

// q/k/v [T][H][D] bf16 as a 2-D tensor [T rows][H·D columns]: a box is 64 columns (128 bytes, the
// swizzle span) of 128 consecutive tokens at column h·D (+64); rows past T read as zeros.
CUtensorMap rows_map(const char* what, const void* data, int T, int H, int D) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(H) * D, static_cast<cuuint64_t>(T)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(H) * D * 2};
  const cuuint32_t box[2] = {64, 128}, estride[2] = {1, 1};
  const CUresult r = sm90::tensor_map_encoder()(
      &m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(data), dims, strides, box, estride,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MT_CUDA_REQUIRE(r == CUDA_SUCCESS, std::string("flash attention forward (sm90): cuTensorMapEncodeTiled failed for ") +
                                         what + " (CUresult " + std::to_string(static_cast<int>(r)) + ")");
  return m;
}

template <int DQK, int DV = DQK>
void launch_d(const detail::FlashArgs& a, const void* q, const void* k, const void* v, void* out, float* lse,
              bool early, cudaStream_t stream) {
  const CUtensorMap mq = rows_map("q", q, a.T, a.Hq, DQK);
  const CUtensorMap mk = rows_map("k", k, a.T, a.Hk, DQK);
  const CUtensorMap mv = rows_map("v", v, a.T, a.Hk, DV);
  auto* kernel = early ? flash_fwd_sm90_kernel<DQK, DV, true> : flash_fwd_sm90_kernel<DQK, DV, false>;
  constexpr int smem = Layout<DQK, DV>::kSmemBytes;
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(a.Hq, (a.T + kBM - 1) / kBM);
  launch_kernel(kernel, grid, kThreads, smem, stream, mq, mk, mv, a, static_cast<bf16*>(out), lse);
}

}  // namespace

namespace detail {

std::atomic<int> g_fwd_early_softmax{-1};  // flash_fwd_sm90_early_softmax_set; -1: the environment

void flash_fwd_sm90_early_softmax_set(int on) { g_fwd_early_softmax.store(on); }

bool flash_fwd_sm90_supported(const FlashArgs& a) {
  // gridDim.y holds the query tiles (at most 65535); TMA coordinates are int32 (T·H < 2^31 is checked
  // by the caller).
  const int dv = flash_value_dim(a);
  return (((a.D == 128 || a.D == 64) && dv == a.D) || (a.D == 192 && dv == 128)) && a.Hk > 0 && a.Hq % a.Hk == 0 &&
         (static_cast<int64_t>(a.T) + kBM - 1) / kBM <= 65535 &&
         sm90::device_runs_sm90a<flash_fwd_sm90_kernel<128, 128, true>>();
}

// head_dim 64: any args; MLA's 192 / 128: any scale, no window or sinks; head_dim 128: plain only.
bool flash_fwd_sm90_takes_args(const FlashArgs& a) {
  if (a.D == 64) return true;
  if (a.D == 192) return a.window == 0 && a.sinks == nullptr && a.dsinks == nullptr;
  return flash_args_plain(a);
}

void flash_fwd_sm90_launch(const FlashArgs& a, const void* q, const void* k, const void* v, void* out, float* lse,
                           cudaStream_t stream) {
  if (a.T == 0) return;  // a tensor map needs non-empty dimensions
  MT_CUDA_REQUIRE(flash_fwd_sm90_supported(a), "flash attention forward (sm90): needs head_dim 128 or 64, or 192 "
                                                "with v_dim 128 (got " + std::to_string(a.D) + " / " +
                                                std::to_string(flash_value_dim(a)) +
                                                "), a cc 9.0 GPU and a build with 90a in CMAKE_CUDA_ARCHITECTURES");
  MT_CUDA_REQUIRE(flash_fwd_sm90_takes_args(a), "flash attention forward (sm90): no sliding window or sinks at "
                                                "head_dim 128 or 192, no softmax scale other than head_dim^-1/2 at "
                                                "128 (the mma.sync kernel and the head_dim 64 one have them)");
  MT_CUDA_REQUIRE(aligned16(q) && aligned16(k) && aligned16(v) && aligned16(out),
                  "flash attention forward (sm90): q, k, v and out must be 16-byte aligned (TMA, 16-byte stores)");
  static const bool early_from_env = [] {
    const char* e = std::getenv("MIXTUNE_FLASH_FWD_EARLY_SOFTMAX");
    return !(e && std::string(e) == "0");
  }();
  const int set = g_fwd_early_softmax.load();
  const bool early = set >= 0 ? set != 0 : early_from_env;
  if (a.D == 64)
    launch_d<64>(a, q, k, v, out, lse, early, stream);
  else if (a.D == 192)
    launch_d<192, 128>(a, q, k, v, out, lse, early, stream);
  else
    launch_d<128>(a, q, k, v, out, lse, early, stream);
}

}  // namespace detail
}  // namespace mt::cuda

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/flash_attention_kernels.h"
#include "kernels/cuda/sm90_common.cuh"
#include "kernels/cuda/flash_dq_layout.cuh"
#include "kernels/cuda/tensor_checks.h"
#include "kernels/cuda/kernel_launch.cuh"

// Hopper (sm_90a) flash-attention backward for head_dim 128: TMA tile loads, wgmma, producer/consumer
// warpgroups (the FlashAttention-3 backward dataflow, written from its description). Same contract and
// workspace as the mma.sync backward (flash_attention_bwd.cu), whose prologue (zeroed fp32 buffers,
// delta = rowsum(dO ⊙ O)) and dK/dV epilogue (fp32 -> bf16, dK times the scale) it shares; dq_acc has
// this kernel's own layout (below) and its own conversion.
//
// Work item = G query heads of one KV head (G divides Hq / Hk; the launcher picks it, below) x one tile of
// 128 keys (k0 .. k0 + 127); block = 3 warpgroups (384 threads, one block per SM, 226.5 KiB of shared
// memory), one block per SM claiming items (or one block per item). The block loads the item's K and V
// tiles once and, head after head, walks the queries that can see them, q_lo = k0 .. q_hi =
// doc_end(last key) − 1, in steps of 64 (dK, dV summed over the G heads in registers):
//   warpgroup 0: producer (setmaxnreg 40). Thread 0 loads K, V (kv_full, once kv_empty says the previous
//                item's are no longer read) and per step the Q and dO tiles
//                (64 x 128 each, two [64 rows][64 columns] 128B-swizzled boxes) into a 2-stage ring
//                (q_full[s]); warp 1 writes the step's lse·log2e, delta and doc_start (INT_MAX past T) of
//                the 64 queries beside them and arrives on q_full[s] as well. Both wait on q_empty[s].
//   warpgroups 1, 2: consumers (setmaxnreg 232); warpgroup c owns keys 64c .. 64c + 63 of the tile
//                (M = keys, as in the mma.sync backward, so Pᵀ and dSᵀ sit in the accumulators). Per step:
//                Sᵀ = K_c·Qᵀ and dPᵀ = V_c·dOᵀ  (wgmma m64n64k16, all operands K-major in shared memory;
//                Sᵀ of the next step is issued right after this step's dQ GEMM, below);
//                once Sᵀ is in: Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e) (0 where a key is not visible; no
//                mask where every pair of the step is visible), packed to bf16, and dV_c += Pᵀ·dO issued
//                (m64n128k16, A = the packed accumulators from registers, B = dO MN-major) while dPᵀ may
//                still run; once dPᵀ is in: dSᵀ = P ⊙ (dPᵀ − delta) from the bf16 P (the fp32 P registers
//                are the budget), dK_c += dSᵀ·Q issued the same way; dSᵀ (bf16) to shared memory ([128
//                keys][64 queries], 128B swizzle, double-buffered); a barrier of both consumer warpgroups,
//                then dQ[:, 64c .. 64c + 63] = dS·K[:, 64c ..] (m64n64k16, A = dS M-major, B = the K box
//                of those columns MN-major) over all 128 keys; once dV and dK are done (their A registers
//                free), the next step's Sᵀ is queued behind it, so the tensor cores work while this step
//                waits for dQ and stages it (+7% at seq 4096). The fp32 dQ tile goes to a double-buffered
//                staging tile and reaches dq_acc by one 16 KiB bulk reduce-add (cp.reduce.async.bulk
//                .add.f32, performed at L2), which needs the tile contiguous in dq_acc: the layout
//                [Hq][2 column halves][T][64] with column pairs permuted per row (dq_to_bf16_kernel).
//   At an item's end each consumer warpgroup releases K, V (kv_empty) and adds its dK, then dV rows (this
//   head's share of the KV head) to dk_acc / dv_acc [T][Hk][128] through its staging buffers, one 512-byte
//   bulk reduce-add per row, waiting only until the sources are read.
// Items in launch order: the query heads of one KV head are neighbours (K, V from L2) and key tile 0 (the
// most queries) goes first. Grid: one block per item (default), or one per SM (MIXTUNE_FLASH_BWD_PERSISTENT=1,
// a static split of the items; see the launcher).
// NOTE: dQ/dK/dV are not bitwise reproducible (fp32 reductions in varying order), as in the mma.sync one.

namespace mt::cuda {

namespace {

using sm90::bf16;
#if MT_SM90A_DEVICE
using sm90::ex2;
using sm90::lds_f2;
using sm90::lds_i1;
using sm90::lds_i2;
using sm90::pack_bf16;
using sm90::sts_f2;
using sm90::sts_u32;
#endif

constexpr int kD = 128;                // head_dim
constexpr int kBN = 128;               // keys per block: 2 consumer warpgroups x 64
constexpr int kBM = 64;                // queries per step
constexpr int kStages = 2;             // Q / dO ring
constexpr int kThreads = 384;          // producer warpgroup + 2 consumer warpgroups
constexpr int kKVBox = kBN * 128;      // one [128 keys][64 columns] box: 16 KiB
constexpr int kQBox = kBM * 128;       // one [64 queries][64 columns] box: 8 KiB
constexpr int kKOff = 0;
constexpr int kVOff = kKOff + 2 * kKVBox;
constexpr int kQOff = kVOff + 2 * kKVBox;            // kStages x 2 boxes
constexpr int kOOff = kQOff + kStages * 2 * kQBox;   // dO, kStages x 2 boxes
constexpr int kSOff = kOOff + kStages * 2 * kQBox;   // dSᵀ [128 keys][64 queries], 2 buffers of 16 KiB
constexpr int kDQBytes = kBM * 64 * 4;               // one dQ staging tile: [64 rows][64 columns] fp32
constexpr int kDQOff = kSOff + 2 * kBN * kBM * 2;    // dQ staging, 2 warpgroups x 2 buffers
constexpr int kRowOff = kDQOff + 4 * kDQBytes;       // per stage: lse2[64], delta[64], doc_start[64]
constexpr int kRowBytes = 3 * kBM * 4;
constexpr int kBarOff = kRowOff + kStages * kRowBytes;
constexpr int kNumBars = 2 + 2 * kStages + 4;  // kv_full, kv_empty, q_full[], q_empty[], item_full[2], item_empty[2]
constexpr int kItemOff = kBarOff + kNumBars * 8;  // int[2]
constexpr int kSmemBytes = 1024 + kItemOff + 8;  // 1 KiB of slack to align the tiles to 1024
static_assert(kSOff % 1024 == 0 && kDQOff % 1024 == 0, "swizzled tiles stay 1024-aligned");
static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");

#if MT_SM90A_DEVICE

// acc[32] = A rows (64 keys x 128, K-major in two 16 KiB boxes, descriptor low half a_lo) · B (64
// queries x 128, K-major in two 8 KiB boxes, b_lo)ᵀ: 8 k-steps of 16 columns; k-step kk is box kk / 4,
// +32 bytes per step inside a box (offsets in 16-byte units).
template <int KK = 0>
__device__ __forceinline__ void issue_kq(float (&acc)[32], uint32_t a_lo, uint32_t b_lo) {
  if constexpr (KK < kD / 16) {
    constexpr int oa = ((KK >> 2) * kKVBox + (KK & 3) * 32) >> 4, ob = ((KK >> 2) * kQBox + (KK & 3) * 32) >> 4;
    sm90::wgmma_m64n64k16_lo<0, 0, oa, ob>(acc, a_lo, b_lo, KK > 0 ? 1 : 0);
    issue_kq<KK + 1>(acc, a_lo, b_lo);
  }
}

// acc[64] += A (64 keys x 64 queries, registers: k-step kk = a[4kk .. 4kk + 3]) · B (64 queries x 128
// columns, MN-major in two 8 KiB boxes: leading byte offset 8 KiB in b_lo, +16 rows = +2 KiB per k-step).
template <int KK = 0>
__device__ __forceinline__ void issue_rs(float (&acc)[64], const uint32_t (&a)[16], uint32_t b_lo) {
  if constexpr (KK < kBM / 16) {
    sm90::wgmma_m64n128k16_rs_lo<1, KK * 2048 / 16>(acc, a[4 * KK], a[4 * KK + 1], a[4 * KK + 2], a[4 * KK + 3],
                                                    b_lo, 1);
    issue_rs<KK + 1>(acc, a, b_lo);
  }
}

// dq[32] = dS (64 queries x 128 keys; stored as dSᵀ [128 keys][64 queries], M-major) · K box (128 keys x
// 64 columns, MN-major): 8 k-steps of 16 keys, +2 KiB each in both.
template <int KK = 0>
__device__ __forceinline__ void issue_dq(float (&dq)[32], uint32_t ds_lo, uint32_t k_lo) {
  if constexpr (KK < kBN / 16) {
    sm90::wgmma_m64n64k16_lo<1, 1, KK * 2048 / 16, KK * 2048 / 16>(dq, ds_lo, k_lo, KK > 0 ? 1 : 0);
    issue_dq<KK + 1>(dq, ds_lo, k_lo);
  }
}

#endif  // MT_SM90A_DEVICE

// dq_acc layout of this kernel: flash_dq_layout.cuh (a step's dQ tile of one warpgroup, 64 rows x 64
// columns, is one contiguous run: one bulk reduce-add instead of 64). dq = this x scale, back to
// [T][Hq][128] bf16; one thread per column pair, reads in storage order.
__global__ void dq_to_bf16_kernel(const float* __restrict__ acc, int T, int Hq, float scale, bf16* __restrict__ dq) {
  pdl_wait();
  const int64_t n = static_cast<int64_t>(T) * Hq * 64;  // column pairs
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int slot = static_cast<int>(i & 31);
    const int64_t row = i >> 5;  // (2h + c) * T + t
    const int t = static_cast<int>(row % T), hc = static_cast<int>(row / T);
    const int pair = flash_dq_slot(t, slot);
    const float2 v = *reinterpret_cast<const float2*>(acc + 2 * i);
    *reinterpret_cast<__nv_bfloat162*>(dq + (static_cast<int64_t>(t) * Hq + (hc >> 1)) * kD + 64 * (hc & 1) +
                                       2 * pair) = __floats2bfloat162_rn(v.x * scale, v.y * scale);
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    flash_bwd_sm90_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                          const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_do,
                          detail::FlashArgs a, const float* __restrict__ lse, const float* __restrict__ delta,
                          float* __restrict__ dq_acc, float* __restrict__ dk_acc, float* __restrict__ dv_acc,
                          int* __restrict__ item_counter, int heads_per_item) {
  pdl_wait();
#if MT_SM90A_DEVICE
  using namespace sm90;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t sK = base + kKOff, sV = base + kVOff, sQ = base + kQOff, sO = base + kOOff, sS = base + kSOff;
  const uint32_t kv_full = base + kBarOff, kv_empty = kv_full + 8u;
  auto q_full = [&](int s) { return kv_full + 8u * (2 + s); };
  auto q_empty = [&](int s) { return kv_full + 8u * (2 + kStages + s); };
  auto item_full = [&](int s) { return kv_full + 8u * (2 + 2 * kStages + s); };
  auto item_empty = [&](int s) { return kv_full + 8u * (4 + 2 * kStages + s); };
  const uint32_t s_items = base + kItemOff;  // int[2]: the block's next items (a ring of two)

  const int tid = threadIdx.x;
  const int T = a.T;
  // Work items (G query heads h0 .. h0 + G − 1 of one KV head, key tile ky), key tile 0 (the most queries)
  // first and the head groups of one KV head next to each other (K, V from L2): item = ky·(Hq / G) + h0 / G.
  // Block b starts with item b and then takes
  // the next unclaimed one (gridDim.x + an atomic counter the prologue zeroes), greedily as the hardware
  // would hand out blocks: a static split left blocks up to ~20% apart with packed documents, whose items'
  // lengths vary. Its producer thread claims an item when it starts loading it and passes the index to the
  // other roles through a ring of two shared slots (item_full / item_empty); an index >= n_items ends
  // them all. A grid of one block per item is the non-persistent launch.
  // An item covers heads_per_item query heads of one KV head (G, dividing Hq / Hk): their steps run one
  // head after the other on the same K, V tiles and dK, dV accumulators, so the item's fixed cost (K, V
  // load, pipeline fill, the dK/dV flush) is paid once per G heads (the launcher picks G).
  const int G = heads_per_item, n_groups = a.Hq / G;
  const int n_items = n_groups * ((T + kBN - 1) / kBN);
  // Every role but the claiming thread: the block's next item from the ring (k counts the items taken).
  auto take_item = [&](int k) {
    const int slot = k & 1;
    mbar_wait(item_full(slot), (k >> 1) & 1);
    int item;
    asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(item) : "r"(s_items + 4u * slot) : "memory");
    mbar_arrive(item_empty(slot));
    return item;
  };
  struct Item {
    int h0, hk, k0, q_lo, nq, nsteps;  // nq query steps per head, nsteps = G·nq
  };
  auto item_at = [&](int item) {
    Item it;
    it.h0 = (item % n_groups) * G, it.hk = it.h0 / (a.Hq / a.Hk), it.k0 = (item / n_groups) * kBN;
    const int k_last = min(it.k0 + kBN, T) - 1;
    it.q_lo = it.k0;
    it.nq = (a.doc_end[k_last] - 1 - it.q_lo + kBM) / kBM;  // >= 1 for valid bounds (doc_end(k) > k)
    it.nsteps = G * it.nq;
    return it;
  };
  // Step st of an item: query head h0 + st / nq, queries from q_lo + (st mod nq)·64.
  struct StepAt {
    int h, qs;
  };
  auto step_at = [&](const Item& it, int st) {
    const int j = st / it.nq;
    return StepAt{it.h0 + j, it.q_lo + (st - j * it.nq) * kBM};
  };

  if (tid == 0) {
    mbar_init(kv_full, 1);
    mbar_init(kv_empty, CONSUMER_THREADS);  // every consumer thread, once per item
    for (int s = 0; s < 2; ++s) {
      mbar_init(item_full(s), 1);                    // the claiming thread
      mbar_init(item_empty(s), CONSUMER_THREADS + 32);  // the consumers and warp 1 once they have read it
    }
    for (int s = 0; s < kStages; ++s) {
      mbar_init(q_full(s), 1 + 32);          // the TMA thread's arrive.expect_tx + warp 1's 32 lanes
      mbar_init(q_empty(s), CONSUMER_THREADS);  // every consumer thread, once per step
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();

  // Stages and barrier phases run on across the block's items: gst counts the block's steps (stage gst & 1,
  // use gst >> 1), `done` its items (the K/V barriers' phase).
  if (tid < 128) {
    // ---- producer warpgroup.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (tid == 0) {
      tma_prefetch_map(&map_q);
      tma_prefetch_map(&map_do);
      int gst = 0, done = 0;
      for (int k = 0;; ++k) {
        const int slot = k & 1;
        mbar_wait(item_empty(slot), ((k >> 1) & 1) ^ 1);  // the slot's previous item has been read by all
        // One block per item (gridDim.x == n_items): no claim (the counter stays unread).
        const int item = k == 0                                  ? static_cast<int>(blockIdx.x)
                         : static_cast<int>(gridDim.x) >= n_items ? n_items
                                                                  : static_cast<int>(gridDim.x) + atomicAdd(item_counter, 1);
        asm volatile("st.shared.s32 [%0], %1;\n" ::"r"(s_items + 4u * slot), "r"(item) : "memory");
        mbar_arrive(item_full(slot));  // release: the store above before the arrival
        if (item >= n_items) break;
        const Item it = item_at(item);
        if (it.nsteps <= 0) continue;
        // The next item's K, V once the consumers are done with this one's (its last MMAs have completed):
        // the load runs while they flush dK, dV.
        if (done > 0) mbar_wait(kv_empty, (done - 1) & 1);
        mbar_arrive_expect_tx(kv_full, 4 * kKVBox);  // full box bytes even past T (zero fill counts)
        tma_load_2d(sK, &map_k, kv_full, it.hk * kD, it.k0);
        tma_load_2d(sK + kKVBox, &map_k, kv_full, it.hk * kD + 64, it.k0);
        tma_load_2d(sV, &map_v, kv_full, it.hk * kD, it.k0);
        tma_load_2d(sV + kKVBox, &map_v, kv_full, it.hk * kD + 64, it.k0);
        for (int st = 0; st < it.nsteps; ++st, ++gst) {
          const int s = gst & 1;
          const StepAt at = step_at(it, st);
          mbar_wait(q_empty(s), ((gst >> 1) & 1) ^ 1);  // the stage's previous use; a fresh barrier passes
          mbar_arrive_expect_tx(q_full(s), 4 * kQBox);  // Q + dO boxes
          const uint32_t q_at = sQ + s * 2 * kQBox, o_at = sO + s * 2 * kQBox;
          tma_load_2d(q_at, &map_q, q_full(s), at.h * kD, at.qs);
          tma_load_2d(q_at + kQBox, &map_q, q_full(s), at.h * kD + 64, at.qs);
          tma_load_2d(o_at, &map_do, q_full(s), at.h * kD, at.qs);
          tma_load_2d(o_at + kQBox, &map_do, q_full(s), at.h * kD + 64, at.qs);
        }
        ++done;
      }
    } else if (tid >= 32 && tid < 64) {
      const int lane = tid - 32;
      int gst = 0;
      for (int k = 0;; ++k) {
        const int item = take_item(k);
        if (item >= n_items) break;
        const Item it = item_at(item);
        for (int st = 0; st < it.nsteps; ++st, ++gst) {
          const int s = gst & 1;
          const StepAt at = step_at(it, st);
          const int qs = at.qs;
          mbar_wait(q_empty(s), ((gst >> 1) & 1) ^ 1);
          float* lse2 = reinterpret_cast<float*>(smem + kRowOff + s * kRowBytes);
          float* dlt = lse2 + kBM;
          int* dsq = reinterpret_cast<int*>(dlt + kBM);
#pragma unroll
          for (int i = lane; i < kBM; i += 32) {
            const int t = qs + i;
            const bool valid = t < T;
            lse2[i] = valid ? lse[static_cast<int64_t>(at.h) * T + t] * 1.4426950408889634f : 0.0f;
            dlt[i] = valid ? delta[static_cast<int64_t>(at.h) * T + t] : 0.0f;
            dsq[i] = valid ? a.doc_start[t] : INT_MAX;  // rows past T see no key
          }
          mbar_arrive(q_full(s));  // release: the writes above before the arrival
        }
      }
    }
  } else {
    // ---- consumer warpgroups.
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    // Never true for a launch of at most n_items blocks. Also keeps ptxas (13.0) allocating this branch at
    // setmaxnreg's budget (see the forward's note): re-check `ptxas -v` after editing either branch.
    // Budgets: the producer's lse / delta / doc_start loop spills at 24 registers (52 bytes), so 40 for it
    // and 232 for the consumers (2 x 128 x 232 + 128 x 40 <= 64 Ki registers).
    if (static_cast<int>(blockIdx.x) >= n_items) return;
    const int c = tid / 128 - 1;  // keys 64c .. 64c + 63 of the tile
    const int ctid = tid - 128 * (c + 1);
    const int w = ctid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
    const int lrow = 64 * c + 16 * w + g;  // this thread's keys: lrow and lrow + 8 of the tile
    const float scale_log2 = a.scale * 1.4426950408889634f;
    const uint32_t k_rows = sK + c * 64 * 128, v_rows = sV + c * 64 * 128;
    const uint32_t dq_stage = base + kDQOff + c * 2 * kDQBytes;  // + (gst & 1) * kDQBytes
    // This thread's dSᵀ row (key lrow; lrow + 8 is +1 KiB) and dQ staging row (16w + g; +8 rows).
    const uint32_t ds_row_off = lrow * 128, dq_row = dq_stage + (16 * w + g) * 256 + qd * 8;
    const int dq_swz = g & 3;  // column pair 4j + qd of rows 16w + g (+8) goes to pair slot 4(j ^ (g & 3)) + qd
    const uint32_t kv_row = dq_stage + (16 * w + g) * 512 + qd * 8;  // dK / dV staging rows (the flush)

    float dv[64], dk[64];
    float sp[32], dp[32];
    int gst = 0, done = 0;
    for (int k = 0;; ++k) {
      const int item = take_item(k);
      if (item >= n_items) break;
      const Item it = item_at(item);
      if (it.nsteps <= 0) continue;
      const int k0 = it.k0;
      const int kr0 = k0 + lrow, kr1 = kr0 + 8;
#pragma unroll
      for (int i = 0; i < 64; ++i) dv[i] = 0.0f, dk[i] = 0.0f;
      mbar_wait(kv_full, done & 1);

      // Sᵀ = K_c·Qᵀ of block step gs into sp. An item's first step's is issued here and every
      // later step's by the step before it, right after that step's dQ GEMM, so the tensor cores have it
      // queued while that step waits for dQ and stages the tile (they idled there before).
      auto issue_scores = [&](int gs) {
        const int s = gs & 1;
        mbar_wait(q_full(s), (gs >> 1) & 1);
        wgmma_fence();
        issue_kq(sp, smem_desc_lo(k_rows, 16), smem_desc_lo(sQ + s * 2 * kQBox, 16));
        wgmma_commit();
      };
      issue_scores(gst);
      // One step (st of the item, gs of the block); HAS_NEXT: issue the next step's Sᵀ before staging this
      // step's dQ (the item's last step is peeled off: a wgmma inside a branch that ptxas cannot prove
      // uniform serialises every wgmma, C7518).
      auto step = [&]<bool HAS_NEXT>(int st, int gs) {
        const StepAt at = step_at(it, st);
        const int s = gs & 1, h = at.h, qs = at.qs;
        const uint32_t q_at = sQ + s * 2 * kQBox, o_at = sO + s * 2 * kQBox, ds_at = sS + s * kBN * kBM * 2;
        const uint32_t lse2 = base + kRowOff + s * kRowBytes, dlt = lse2 + kBM * 4, dsq = dlt + kBM * 4;

        wgmma_fence();
        issue_kq(dp, smem_desc_lo(v_rows, 16), smem_desc_lo(o_at, 16));  // dPᵀ = V_c·dOᵀ
        wgmma_commit();
        wgmma_wait<1>();  // Sᵀ done
        fence_regs(sp);
        // Pᵀ: element 4j + e is key lrow (+8 for e >= 2), query 8j + 2qd + (e & 1) of the step. Masking
        // is skipped when every key of the tile is visible to every query of the step.
        const bool full = k0 + kBN - 1 <= qs && k0 >= lds_i1(dsq + (kBM - 1) * 4);
        const int rel = kr0 - qs - 2 * qd;  // key kr0 is visible to query qs + qi only if rel <= qi - 2qd
        if (full) {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const float2 l2 = lds_f2(lse2 + (8 * j + 2 * qd) * 4);
#pragma unroll
            for (int e = 0; e < 4; ++e)
              sp[4 * j + e] = ex2(fmaf(sp[4 * j + e], scale_log2, -((e & 1) ? l2.y : l2.x)));
          }
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const int qi = 8 * j + 2 * qd;
            const float2 l2 = lds_f2(lse2 + qi * 4);
            const int2 ds2 = lds_i2(dsq + qi * 4);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = e < 2 ? kr0 : kr1, dstart = (e & 1) ? ds2.y : ds2.x;
              const bool vis = rel + (e < 2 ? 0 : 8) <= 8 * j + (e & 1) && key >= dstart;
              const float p = ex2(fmaf(sp[4 * j + e], scale_log2, -((e & 1) ? l2.y : l2.x)));
              sp[4 * j + e] = vis ? p : 0.0f;
            }
          }
        }
        // P (bf16) is final: dV += Pᵀ·dO goes to the tensor cores while dPᵀ may still be running.
        uint32_t pp[16], sa[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) pp[i] = pack_bf16(sp[2 * i], sp[2 * i + 1]);
        wgmma_fence();
        issue_rs(dv, pp, smem_desc_lo(o_at, kQBox));
        wgmma_commit();
        wgmma_wait<1>();  // dPᵀ done (dV may still run)
        fence_regs(dp);
        // dSᵀ = Pᵀ ⊙ (dPᵀ − delta), from the bf16 P (its fp32 registers are free by now: the register
        // budget); dS is rounded to bf16 for the tensor cores right after.
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float2 d2 = lds_f2(dlt + (8 * j + 2 * qd) * 4);
          const float2 p0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pp[2 * j]));
          const float2 p1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pp[2 * j + 1]));
          sa[2 * j] = pack_bf16(p0.x * (dp[4 * j] - d2.x), p0.y * (dp[4 * j + 1] - d2.y));
          sa[2 * j + 1] = pack_bf16(p1.x * (dp[4 * j + 2] - d2.x), p1.y * (dp[4 * j + 3] - d2.y));
        }
        wgmma_fence();
        issue_rs(dk, sa, smem_desc_lo(q_at, kQBox));  // dK += dSᵀ·Q
        wgmma_commit();

        // dSᵀ to shared memory: row = key (lrow, lrow + 8), 128 bytes of 64 queries, 16-byte chunk j ^ row % 8.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // wgmma reads of 2 steps ago first
        {
          const uint32_t ds_row = ds_at + ds_row_off + qd * 4;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const uint32_t at = ds_row + ((j ^ (lrow & 7)) << 4);  // (lrow + 8) % 8 == lrow % 8
            sts_u32(at, sa[2 * j]);
            sts_u32(at + 8 * 128, sa[2 * j + 1]);
          }
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // visible to wgmma (async proxy)
        if (ctid == 0) bulk_wait_read<1>();  // the dQ tile of two steps ago has left this staging buffer
        named_barrier_sync(1, 256);           // both halves of dSᵀ written

        float dq[32];
        wgmma_fence();
        issue_dq(dq, smem_desc_lo(ds_at, kKVBox), smem_desc_lo(sK + c * kKVBox, kKVBox));
        wgmma_commit();
        if constexpr (HAS_NEXT) {
          wgmma_wait<1>();  // dV, dK done: P and dS registers free (the budget: dv, dk, dq, sp = 192)
          fence_regs(dv);
          fence_regs(dk);
          issue_scores(gs + 1);
          wgmma_wait<1>();  // dQ done: Q, dO and this dSᵀ buffer are free; the next Sᵀ may still run
        } else {
          wgmma_wait<0>();
          fence_regs(dv);
          fence_regs(dk);
        }
        fence_regs(dq);
        mbar_arrive(q_empty(s));

        // dQ rows 16w + g (+8) of the step, columns 64c + 8j + 2qd, to this step's staging buffer (column
        // pairs permuted per row: conflict-free float2 stores), then one bulk reduce-add of the whole tile
        // (contiguous in dq_acc's layout, below).
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t at = dq_row + s * kDQBytes + ((j ^ dq_swz) << 5);
          sts_f2(at, dq[4 * j], dq[4 * j + 1]);
          sts_f2(at + 8 * 256, dq[4 * j + 2], dq[4 * j + 3]);
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        named_barrier_sync(2 + c, 128);
        if (ctid == 0) {
          bulk_reduce_add_f32(dq_acc + (static_cast<int64_t>(2 * h + c) * T + qs) * 64, dq_stage + s * kDQBytes,
                                static_cast<uint32_t>(min(kBM, T - qs)) * 256);
          bulk_commit();
        }
      };
      for (int st = 0; st + 1 < it.nsteps; ++st) step.template operator()<true>(st, gst + st);
      step.template operator()<false>(it.nsteps - 1, gst + it.nsteps - 1);
      gst += it.nsteps;
      ++done;
      mbar_arrive(kv_empty);  // the last step waited for all its MMAs: K and V may be overwritten

      // This head's share of dK, dV (rows kr0, kr1 = tile rows 16w + g (+8) of this warpgroup, columns
      // 8j + 2qd), one matrix at a time through this warpgroup's two dQ staging buffers (32 KiB: 64 rows
      // of 512 bytes), added to dk_acc / dv_acc [T][Hk][128] by one 512-byte bulk reduce-add per row.
      // Waits are for the sources only (cp.async.bulk.wait_group.read): the adds themselves complete before
      // the grid does, and nothing in this kernel reads dq_acc / dk_acc / dv_acc back (waiting for the
      // writes as well cost ~3% at seq 4096).
      if (ctid == 0) bulk_wait_read<0>();  // the last dQ tiles have left the staging buffers
      named_barrier_sync(2 + c, 128);
      auto flush = [&](const float(&acc)[64], float* dst) {
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          sts_f2(kv_row + 32 * j, acc[4 * j], acc[4 * j + 1]);
          sts_f2(kv_row + 8 * 512 + 32 * j, acc[4 * j + 2], acc[4 * j + 3]);
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        named_barrier_sync(2 + c, 128);
        if (ctid < 64) {
          const int key = k0 + 64 * c + ctid;
          if (key < T)
            bulk_reduce_add_f32(dst + (static_cast<int64_t>(key) * a.Hk + it.hk) * kD, dq_stage + ctid * 512, 512);
          bulk_commit();
          bulk_wait_read<0>();
        }
        named_barrier_sync(2 + c, 128);
      };
      flush(dk, dk_acc);
      flush(dv, dv_acc);
    }
  }
#else
  // Built for another architecture: the host never launches this (flash_bwd_sm90_supported).
  __trap();
#endif
}

// [T][H][128] bf16 as a 2-D tensor [T rows][H·128 columns]; a box is 64 columns (128 bytes, the swizzle
// span) of `rows` consecutive tokens; rows past T read as zeros.
CUtensorMap rows_map(const void* data, int T, int H, int rows) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(H) * kD, static_cast<cuuint64_t>(T)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(H) * kD * 2};
  return sm90::make_map("flash attention backward (sm90)", data, 2, dims, strides, static_cast<cuuint32_t>(rows));
}


}  // namespace

namespace detail {

void flash_dq_sums_to_bf16(const float* dq_acc, int T, int Hq, float scale, void* dq, cudaStream_t stream) {
  const int64_t pairs = static_cast<int64_t>(T) * Hq * 64;
  if (pairs == 0) return;
  launch_kernel(dq_to_bf16_kernel, static_cast<int>(std::min<int64_t>((pairs + 255) / 256, 65536)), 256, 0, stream,
      dq_acc, T, Hq, scale, static_cast<bf16*>(dq));
}

// Query heads per work item. More heads per item pay the item's fixed cost (K, V load, pipeline fill, the
// dK/dV flush) fewer times, but make fewer, longer items, which the SMs share out less evenly. Measured (H200,
// 32/4 heads, bench/NOTES.md 83), backward TFLOP/s for G = 1 / 2 / 4 / 8: one sequence of 4,096 453 / 464 /
// 462 / 252; 8,192 455 / 464 / 469 / 451; 16,384 472 / 492 / 493 / 465; 4,096 as documents of 512 190 / 197 /
// 181 / 170, of 2,048 386 / 398 / 405 / 244; 4 rows of 1,024 287 / 303 / 247 / 214. G = 2 is within 2% of the
// best everywhere and G = 4 loses up to 19% with short documents (whose items the launcher cannot see: their
// bounds live on the GPU), so: 2 where the group divides by 2 and there are at least two items per SM (one
// item per SM would leave the longest items' blocks to finish alone), else 1. (A model of the greedy schedule
// with a fixed cost per item picked 4 and 8 where those measured worse.)
std::atomic<int> g_heads_forced{-1};  // flash_bwd_sm90_heads_set; -1: not set (the environment then)

int heads_by_rule(int T, int Hq, int Hk, int sms) {
  const int64_t items_at_2 = static_cast<int64_t>(Hq / 2) * ((T + kBN - 1) / kBN);
  return (Hq / Hk) % 2 == 0 && items_at_2 >= 2 * static_cast<int64_t>(sms) ? 2 : 1;
}

void flash_bwd_sm90_heads_set(int g) { g_heads_forced.store(g); }

int flash_bwd_sm90_heads_per_item(int T, int Hq, int Hk, int sms) {
  const int group = std::max(Hq / std::max(Hk, 1), 1);
  static const int from_env = [] {
    const char* e = std::getenv("MIXTUNE_FLASH_BWD_HEADS");
    if (!e || !*e) return 0;
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    MT_CUDA_REQUIRE(*end == '\0' && v >= 0 && v <= 1024,
                    std::string("MIXTUNE_FLASH_BWD_HEADS: '") + e + "' is not a number of query heads (0 = choose)");
    return static_cast<int>(v);
  }();
  const int set = g_heads_forced.load();
  const int want = set >= 0 ? set : from_env;
  if (want > 0) {  // forced: the largest divisor of the group not above it
    int g = std::min(want, group);
    while (group % g) --g;
    return g;
  }
  return heads_by_rule(T, Hq, Hk, sms);
}

bool flash_bwd_sm90_supported(const FlashArgs& a) {
  if (a.D == 192) return flash_bwd_sm90_mla_supported(a);  // MLA's 192 / 128: flash_attention_bwd_sm90_mla.cu
  // TMA coordinates and the item count are int32 (T·H < 2^31 is checked by the caller).
  return a.D == kD && flash_value_dim(a) == kD && a.Hk > 0 && a.Hq % a.Hk == 0 &&
         sm90::device_runs_sm90a<flash_bwd_sm90_kernel>();
}

void flash_bwd_sm90_launch(const FlashArgs& a, const void* dout, const void* q, const void* k, const void* v,
                           const void* out, const float* lse, void* dq, void* dk, void* dv, float* dq_acc,
                           float* dk_acc, float* dv_acc, float* delta, cudaStream_t stream) {
  if (a.D == 192)  // MLA's 192 / 128
    return flash_bwd_sm90_mla_launch(a, dout, q, k, v, out, lse, dq, dk, dv, dq_acc, dk_acc, dv_acc, delta, stream);
  if (a.T == 0) return;  // a tensor map needs non-empty dimensions
  MT_CUDA_REQUIRE(flash_bwd_sm90_supported(a), "flash attention backward (sm90): needs head_dim and v_dim 128, or 192 "
                                               "with v_dim 128 (got " + std::to_string(a.D) + " / " +
                                                   std::to_string(flash_value_dim(a)) +
                                                   "), a cc 9.0 GPU and a build with 90a in CMAKE_CUDA_ARCHITECTURES");
  MT_CUDA_REQUIRE(flash_args_plain(a),
                  "flash attention backward (sm90): no sliding window, sinks or softmax scale other than "
                  "head_dim^-1/2 here (the mma.sync kernel has them)");
  MT_CUDA_REQUIRE(aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dout) && aligned16(dq_acc),
                  "flash attention backward (sm90): q, k, v, dout and dq_acc must be 16-byte aligned (TMA, bulk "
                  "reduce-add)");
  const CUtensorMap mq = rows_map(q, a.T, a.Hq, kBM);
  const CUtensorMap mo = rows_map(dout, a.T, a.Hq, kBM);
  const CUtensorMap mk = rows_map(k, a.T, a.Hk, kBN);
  const CUtensorMap mv = rows_map(v, a.T, a.Hk, kBN);
  MT_CUDA_CHECK(cudaFuncSetAttribute(flash_bwd_sm90_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  flash_bwd_prologue(a, dout, out, dq_acc, dk_acc, dv_acc, delta, stream);
  // One block per SM claiming items from a counter (the next item's K, V load under this one's dK/dV flush);
  // MIXTUNE_FLASH_BWD_PERSISTENT=0: one block per item. Measured (bench/NOTES.md 56): +1-4% over one block per
  // item from one document to packed documents of 512 tokens (a static split of the items, NOTES 55, lost
  // 14% on those).
  static const bool persistent = [] {
    const char* e = std::getenv("MIXTUNE_FLASH_BWD_PERSISTENT");
    return !(e && std::string(e) == "0");
  }();
  int device = 0;
  MT_CUDA_CHECK(cudaGetDevice(&device));
  const int sms = std::max(device_context(device).sm_count, 1);
  const int g = flash_bwd_sm90_heads_per_item(a.T, a.Hq, a.Hk, sms);
  int64_t grid = static_cast<int64_t>(a.Hq / g) * ((a.T + kBN - 1) / kBN);  // work items
  // The workspace's last element, zeroed by the prologue.
  int* item_counter = reinterpret_cast<int*>(delta + static_cast<int64_t>(a.Hq) * a.T);
  if (persistent) grid = std::min<int64_t>(grid, sms);
  launch_kernel(flash_bwd_sm90_kernel, static_cast<int>(grid), kThreads, kSmemBytes, stream, mq, mk, mv, mo, a, lse,
      delta, dq_acc, dk_acc, dv_acc, item_counter, g);
  if (dq) flash_dq_sums_to_bf16(dq_acc, a.T, a.Hq, a.scale, dq, stream);  // null: the caller reads dq_acc
  flash_bwd_epilogue(a, nullptr, dk_acc, dv_acc, dq, dk, dv, stream);
}

}  // namespace detail
}  // namespace mt::cuda

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_context.h"
#include "kernels/cuda/flash_attention_kernels.h"
#include "kernels/cuda/flash_dq_layout.cuh"
#include "kernels/cuda/kernel_launch.cuh"
#include "kernels/cuda/sm90_common.cuh"
#include "kernels/cuda/tensor_checks.h"

// Hopper (sm_90a) flash-attention backward for MLA's head sizes (DeepSeek-V3, Moonlight): q and k 192 columns, v and
// dO 128. Same contract and workspace as the head_dim 128 Hopper backward (flash_attention_bwd_sm90.cu, whose
// entry points route 192 / 128 here) and the mma.sync one: the shared prologue (zeroed fp32 buffers, delta =
// rowsum(dO ⊙ O)) and dK/dV epilogue; dq_acc in this kernel's layout (below) with its own conversion. Any softmax
// scale (MLA passes its yarn scale), no window or sinks.
//
// Why not the head_dim 128 kernel's layout (keys as M, two consumer warpgroups of 64 keys): dK 96 + dV 64 + Sᵀ 32 +
// dPᵀ 32 fp32 registers per thread would not fit its 232 (NOTES.md, "Hopper backward at 192 / 128", has the
// arithmetic). This is FlashAttention-3's shape for head dim 192 (written from its launch parameters): queries as M
// for S and dP, head columns as M for dK and dV, three consumer warpgroups.
//
// Work item = G query heads of one KV head (as at head_dim 128) x one tile of 96 keys (k0 .. k0 + 95); block = 4
// warpgroups (512 threads, one block per SM, 226.6 KiB of shared memory), one block per SM claiming items. The block
// loads the item's K and V tiles once and, head after head, walks the queries that can see them, q_lo = k0 .. q_hi =
// doc_end(last key) − 1, in steps of 64 (dK, dV summed over the G heads in registers):
//   warpgroup 0: producer (setmaxnreg 32). Thread 0 loads K (three [96 rows][64 columns] 128B-swizzled boxes) and V
//                (two) once kv_empty says the previous item's are no longer read, and per step the Q (three [64][64]
//                boxes) and dO (two) tiles into a 2-stage ring (q_full[s]); warp 1 writes the step's lse·log2e, delta
//                and doc_start (INT_MAX past T) of the 64 queries beside them and arrives on q_full[s] as well.
//   warpgroups 1..3: consumers (setmaxnreg 160); consumer w owns keys 32w .. 32w + 31 of the tile for S, dP, P, dS
//                and dV, and head columns 64w .. 64w + 63 for dK and dQ. Per step:
//                S = Q·K_wᵀ, dP = dO·V_wᵀ (m64n32k16: 64 queries x 32 keys, operands K-major in shared memory);
//                P = exp2(S·scale·log2e − lse·log2e) (0 where a key is not visible; no mask where every pair of the
//                warpgroup's keys and the step's queries is visible), written as Pᵀ [96 keys][64 queries] (stmatrix
//                .trans, this warpgroup's 32 rows); dV_wᵀ += dOᵀ·P_w (two m64n32k16 tiles of 64 value columns, A = dO
//                MN-major, B = its own Pᵀ rows, so a warpgroup barrier suffices); dS = P ⊙ (dP − delta) from the
//                bf16 P (as at head_dim 128), written as dSᵀ (double-buffered: every warpgroup reads all 96 rows);
//                a barrier of the three consumers; dK_wᵀ += Q_wᵀ·dS (m64n96k16, A = Q box w MN-major, B = dSᵀ
//                K-major) and dQ_w = dS·K_w (m64n64k16 over 96 keys, A = dSᵀ M-major, B = K box w MN-major); the next
//                step's S is queued behind dQ once dV and dK are done. The fp32 dQ tile (64 x 64) goes to the
//                warpgroup's staging tile and reaches dq_acc by one 16 KiB bulk reduce-add: dq_acc is [Hq][3 column
//                thirds][T][64] with flash_dq_layout.cuh's in-row permutation (dq_to_bf16_mla_kernel converts it).
//   At an item's end each consumer releases K, V (kv_empty) and adds its dV (128 columns of its 32 keys) and dK (its
//   64 columns of the 96 keys) to dv_acc / dk_acc [T][Hk][128 / 192] through its staging tile, one bulk reduce-add
//   per key row (rows padded to 528 / 272 bytes in the staging tile: conflict-free transposed stores).
// NOTE: dQ/dK/dV are not bitwise reproducible (fp32 reductions in varying order), as in the other fast backwards.

namespace mt::cuda {

namespace {

using sm90::bf16;
#if MT_SM90A_DEVICE
using sm90::ex2;
using sm90::lds_f1;
using sm90::lds_i1;
using sm90::pack_bf16;
using sm90::sts_f1;
using sm90::sts_f2;
#endif

constexpr int kDqk = 192, kDv = 128;             // q, k and v, dO head sizes
constexpr int kBN = 96;                           // keys per item: 3 consumer warpgroups x 32
constexpr int kBM = 64;                           // queries per step
constexpr int kStages = 2;                        // Q / dO ring
constexpr int kConsumerGroups = 3;
constexpr int kConsumers = 128 * kConsumerGroups;  // 384 consumer threads
constexpr int kThreads = 128 + kConsumers;         // producer warpgroup + 3 consumer warpgroups
constexpr int kQKBoxes = kDqk / 64, kVBoxes = kDv / 64;  // 64-column (128-byte) boxes per row: 3, 2
constexpr int kKVBox = kBN * 128;                  // one [96 keys][64 columns] box: 12 KiB
constexpr int kQBox = kBM * 128;                   // one [64 queries][64 columns] box: 8 KiB
constexpr int kQStage = kQKBoxes * kQBox, kOStage = kVBoxes * kQBox;
constexpr int kPSBytes = kBN * kBM * 2;            // Pᵀ or dSᵀ: [96 keys][64 queries] bf16, 12 KiB
constexpr int kDQBytes = kBM * 64 * 4;             // one warpgroup's dQ staging tile: [64 rows][64 columns] fp32
constexpr int kKOff = 0;
constexpr int kVOff = kKOff + kQKBoxes * kKVBox;
constexpr int kQOff = kVOff + kVBoxes * kKVBox;
constexpr int kOOff = kQOff + kStages * kQStage;
constexpr int kPOff = kOOff + kStages * kOStage;   // Pᵀ, one buffer
constexpr int kSOff = kPOff + kPSBytes;            // dSᵀ, kStages buffers
constexpr int kDQOff = kSOff + kStages * kPSBytes;  // dQ staging, one tile per consumer warpgroup
constexpr int kRowOff = kDQOff + kConsumerGroups * kDQBytes;  // per stage: lse2[64], delta[64], doc_start[64]
constexpr int kRowBytes = 3 * kBM * 4;
constexpr int kBarOff = kRowOff + kStages * kRowBytes;
constexpr int kNumBars = 2 + 2 * kStages + 4;  // kv_full, kv_empty, q_full[], q_empty[], item_full[2], item_empty[2]
constexpr int kItemOff = kBarOff + kNumBars * 8;  // int[2]
constexpr int kSmemBytes = 1024 + kItemOff + 8;   // 1 KiB of slack to align the tiles to 1024
// The item's end stages dV in halves of 16 keys (rows of 512 + 16 bytes) and dK in halves of 48 keys (256 + 16).
constexpr int kDvRow = 528, kDkRow = 272;
static_assert(kVOff % 1024 == 0 && kQOff % 1024 == 0 && kOOff % 1024 == 0 && kPOff % 1024 == 0 &&
                  kSOff % 1024 == 0 && kDQOff % 1024 == 0,
              "swizzled tiles stay 1024-aligned (the 128-byte swizzle atom)");
static_assert(16 * kDvRow <= kDQBytes && 48 * kDkRow <= kDQBytes, "the dK/dV flush fits the staging tile");
static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");

#if MT_SM90A_DEVICE

// acc[16] = A (64 queries x 16·KSTEPS, K-major in [64][64] boxes: Q or dO) · B (32 keys x 16·KSTEPS, K-major rows of
// [96][64] boxes: this warpgroup's K or V rows)ᵀ: k-step kk is box kk / 4, +32 bytes per step inside a box (offsets
// in 16-byte units).
template <int KSTEPS, int KK = 0>
__device__ __forceinline__ void issue_qk(float (&acc)[16], uint32_t a_lo, uint32_t b_lo) {
  if constexpr (KK < KSTEPS) {
    constexpr int oa = ((KK >> 2) * kQBox + (KK & 3) * 32) >> 4, ob = ((KK >> 2) * kKVBox + (KK & 3) * 32) >> 4;
    sm90::wgmma_m64n32k16_lo<0, 0, oa, ob>(acc, a_lo, b_lo, KK > 0 ? 1 : 0);
    issue_qk<KSTEPS, KK + 1>(acc, a_lo, b_lo);
  }
}

// dv[b] += dO box b ᵀ (64 value columns x 64 queries, MN-major: +16 queries = +2 KiB) · Pᵀ rows (32 keys x 64
// queries, K-major: +32 bytes)ᵀ, for the two 64-column boxes b.
template <int KK = 0>
__device__ __forceinline__ void issue_dv(float (&dv)[2][16], uint32_t o_lo, uint32_t p_lo) {
  if constexpr (KK < kBM / 16) {
    sm90::wgmma_m64n32k16_lo<1, 0, KK * 2048 / 16, KK * 32 / 16>(dv[0], o_lo, p_lo, 1);
    sm90::wgmma_m64n32k16_lo<1, 0, (kQBox + KK * 2048) / 16, KK * 32 / 16>(dv[1], o_lo, p_lo, 1);
    issue_dv<KK + 1>(dv, o_lo, p_lo);
  }
}

// dk += Q box w ᵀ (64 columns x 64 queries, MN-major) · dSᵀ (96 keys x 64 queries, K-major)ᵀ.
template <int KK = 0>
__device__ __forceinline__ void issue_dk(float (&dk)[48], uint32_t q_lo, uint32_t ds_lo) {
  if constexpr (KK < kBM / 16) {
    sm90::wgmma_m64n96k16_lo<1, 0, KK * 2048 / 16, KK * 32 / 16>(dk, q_lo, ds_lo, 1);
    issue_dk<KK + 1>(dk, q_lo, ds_lo);
  }
}

// dq[32] = dS (64 queries x 96 keys; stored as dSᵀ [96 keys][64 queries], M-major) · K box w (96 keys x 64 columns,
// MN-major): 6 k-steps of 16 keys, +2 KiB each in both (the head_dim 128 kernel's dQ operands).
template <int KK = 0>
__device__ __forceinline__ void issue_dq(float (&dq)[32], uint32_t ds_lo, uint32_t k_lo) {
  if constexpr (KK < kBN / 16) {
    sm90::wgmma_m64n64k16_lo<1, 1, KK * 2048 / 16, KK * 2048 / 16>(dq, ds_lo, k_lo, KK > 0 ? 1 : 0);
    issue_dq<KK + 1>(dq, ds_lo, k_lo);
  }
}

#endif  // MT_SM90A_DEVICE

// dq_acc (flash_dq_layout.cuh's in-row permutation, [Hq][3 thirds][T][64]) x scale -> dq [T][Hq][192] bf16; one
// thread per column pair, reads in storage order.
__global__ void dq_to_bf16_mla_kernel(const float* __restrict__ acc, int T, int Hq, float scale, bf16* __restrict__ dq) {
  pdl_wait();
  const int64_t n = static_cast<int64_t>(T) * Hq * (kDqk / 2);  // column pairs
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int slot = static_cast<int>(i & 31);
    const int64_t row = i >> 5;  // (3h + c) * T + t
    const int t = static_cast<int>(row % T), hc = static_cast<int>(row / T);
    const int h = hc / kQKBoxes, c = hc - kQKBoxes * h;
    const int pair = flash_dq_slot(t, slot);
    const float2 v = *reinterpret_cast<const float2*>(acc + 2 * i);
    *reinterpret_cast<__nv_bfloat162*>(dq + (static_cast<int64_t>(t) * Hq + h) * kDqk + 64 * c + 2 * pair) =
        __floats2bfloat162_rn(v.x * scale, v.y * scale);
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    flash_bwd_sm90_mla_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
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
  const uint32_t sK = base + kKOff, sV = base + kVOff, sQ = base + kQOff, sO = base + kOOff, sP = base + kPOff,
                 sS = base + kSOff;
  const uint32_t kv_full = base + kBarOff, kv_empty = kv_full + 8u;
  auto q_full = [&](int s) { return kv_full + 8u * (2 + s); };
  auto q_empty = [&](int s) { return kv_full + 8u * (2 + kStages + s); };
  auto item_full = [&](int s) { return kv_full + 8u * (2 + 2 * kStages + s); };
  auto item_empty = [&](int s) { return kv_full + 8u * (4 + 2 * kStages + s); };
  const uint32_t s_items = base + kItemOff;  // int[2]: the block's next items (a ring of two)

  const int tid = threadIdx.x;
  const int T = a.T;
  // Items and their claiming as in flash_attention_bwd_sm90.cu: item = ky·(Hq / G) + h0 / G (key tile 0, the most
  // queries, first; the head groups of one KV head next to each other); block b starts with item b and then takes
  // the next unclaimed one (gridDim.x + the counter the prologue zeroes); the producer thread claims and passes the
  // index through a ring of two shared slots; an index >= n_items ends every role.
  const int G = heads_per_item, n_groups = a.Hq / G;
  const int n_items = n_groups * ((T + kBN - 1) / kBN);
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
    mbar_init(kv_empty, kConsumers);  // every consumer thread, once per item
    for (int s = 0; s < 2; ++s) {
      mbar_init(item_full(s), 1);                // the claiming thread
      mbar_init(item_empty(s), kConsumers + 32);  // the consumers and warp 1 once they have read it
    }
    for (int s = 0; s < kStages; ++s) {
      mbar_init(q_full(s), 1 + 32);       // the TMA thread's arrive.expect_tx + warp 1's 32 lanes
      mbar_init(q_empty(s), kConsumers);  // every consumer thread, once per step
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();

  // Stages and barrier phases run on across the block's items: gst counts the block's steps (stage gst & 1, use
  // gst >> 1), `done` its items (the K/V barriers' phase).
  if (tid < 128) {
    // ---- producer warpgroup.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 32;\n" ::: "memory");
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
        // The next item's K, V once the consumers are done with this one's: the load runs under their dK/dV flush.
        if (done > 0) mbar_wait(kv_empty, (done - 1) & 1);
        mbar_arrive_expect_tx(kv_full, (kQKBoxes + kVBoxes) * kKVBox);  // full box bytes even past T
#pragma unroll
        for (int b = 0; b < kQKBoxes; ++b) tma_load_2d(sK + b * kKVBox, &map_k, kv_full, it.hk * kDqk + 64 * b, it.k0);
#pragma unroll
        for (int b = 0; b < kVBoxes; ++b) tma_load_2d(sV + b * kKVBox, &map_v, kv_full, it.hk * kDv + 64 * b, it.k0);
        for (int st = 0; st < it.nsteps; ++st, ++gst) {
          const int s = gst & 1;
          const StepAt at = step_at(it, st);
          mbar_wait(q_empty(s), ((gst >> 1) & 1) ^ 1);  // the stage's previous use; a fresh barrier passes
          mbar_arrive_expect_tx(q_full(s), (kQKBoxes + kVBoxes) * kQBox);  // Q + dO boxes
          const uint32_t q_at = sQ + s * kQStage, o_at = sO + s * kOStage;
#pragma unroll
          for (int b = 0; b < kQKBoxes; ++b) tma_load_2d(q_at + b * kQBox, &map_q, q_full(s), at.h * kDqk + 64 * b, at.qs);
#pragma unroll
          for (int b = 0; b < kVBoxes; ++b) tma_load_2d(o_at + b * kQBox, &map_do, q_full(s), at.h * kDv + 64 * b, at.qs);
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
          mbar_wait(q_empty(s), ((gst >> 1) & 1) ^ 1);
          float* lse2 = reinterpret_cast<float*>(smem + kRowOff + s * kRowBytes);
          float* dlt = lse2 + kBM;
          int* dsq = reinterpret_cast<int*>(dlt + kBM);
#pragma unroll 1  // unrolled, the loop spills 12 bytes at the producer's 32 registers (ptxas 13.0)
          for (int i = lane; i < kBM; i += 32) {
            const int t = at.qs + i;
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
    asm volatile("setmaxnreg.inc.sync.aligned.u32 160;\n" ::: "memory");
    // Never true for a launch of at most n_items blocks; keeps ptxas allocating this branch at setmaxnreg's budget
    // (see the head_dim 128 kernels' notes): re-check `ptxas -v` after editing either branch. Budgets: 128 x 32 for
    // the producer + 384 x 160 = 64 Ki registers.
    if (static_cast<int>(blockIdx.x) >= n_items) return;
    const int w = tid / 128 - 1;  // keys 32w .. 32w + 31 of the tile; head columns 64w .. 64w + 63
    const int ctid = tid - 128 * (w + 1);
    const int wq = ctid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
    const int row0 = 16 * wq + g;  // this thread's query rows of a step: row0 and row0 + 8
    const float scale_log2 = a.scale * 1.4426950408889634f;
    const uint32_t k_rows = sK + w * 32 * 128, v_rows = sV + w * 32 * 128;  // this warpgroup's keys in each box
    const uint32_t dq_stage = base + kDQOff + w * kDQBytes;
    const uint32_t dq_row = dq_stage + row0 * 256 + qd * 8;  // dQ staging rows row0 (+8 rows = +2 KiB)
    const int dq_swz = g & 3;  // column pair 4j + qd of rows row0 (+8) goes to pair slot 4(j ^ (g & 3)) + qd
    // stmatrix .trans of a 32-key slice of Pᵀ / dSᵀ: x4 number t holds the 8 x 8 blocks (row half h, key group j) =
    // (0, 2t), (1, 2t), (0, 2t + 1), (1, 2t + 1) (registers pp[4t .. 4t + 3]); lane 8i + c gives stored row c of block
    // i: key 32w + 16t + 8(i >> 1) + c, its 16-byte chunk of queries 16wq + 8(i & 1) .. + 7 at chunk (2wq + (i & 1)) ^ c
    // (the 128B swizzle; the key's row % 8 is c).
    const int mi = lane >> 3, mc = lane & 7;
    const uint32_t st_off = (32 * w + 8 * (mi >> 1) + mc) * 128 + (((2 * wq + (mi & 1)) ^ mc) << 4);

    float dv[2][16], dk[48];
    float sp[16], dp[16];
    int gst = 0, done = 0;
    for (int k = 0;; ++k) {
      const int item = take_item(k);
      if (item >= n_items) break;
      const Item it = item_at(item);
      if (it.nsteps <= 0) continue;
      const int k0 = it.k0;
      const int kw0 = k0 + 32 * w;  // this warpgroup's first key
#pragma unroll
      for (int i = 0; i < 16; ++i) dv[0][i] = 0.0f, dv[1][i] = 0.0f;
#pragma unroll
      for (int i = 0; i < 48; ++i) dk[i] = 0.0f;
      mbar_wait(kv_full, done & 1);

      // S = Q·K_wᵀ of block step gs into sp: the item's first step's here, every later step's by the step before,
      // right after that step's dQ GEMM.
      auto issue_scores = [&](int gs) {
        const int s = gs & 1;
        mbar_wait(q_full(s), (gs >> 1) & 1);
        wgmma_fence();
        issue_qk<kDqk / 16>(sp, smem_desc_lo(sQ + s * kQStage, 16), smem_desc_lo(k_rows, 16));
        wgmma_commit();
      };
      issue_scores(gst);
      // One step (st of the item, gs of the block); HAS_NEXT: issue the next step's S before staging this step's dQ
      // (the item's last step is peeled off: a wgmma inside a branch that ptxas cannot prove uniform serialises
      // every wgmma, C7518).
      auto step = [&]<bool HAS_NEXT>(int st, int gs) {
        const StepAt at = step_at(it, st);
        const int s = gs & 1, h = at.h, qs = at.qs;
        const uint32_t q_at = sQ + s * kQStage, o_at = sO + s * kOStage, ds_at = sS + s * kPSBytes;
        const uint32_t lse2 = base + kRowOff + s * kRowBytes, dlt = lse2 + kBM * 4, dsq = dlt + kBM * 4;

        wgmma_fence();
        issue_qk<kDv / 16>(dp, smem_desc_lo(o_at, 16), smem_desc_lo(v_rows, 16));  // dP = dO·V_wᵀ
        wgmma_commit();
        const float l0 = lds_f1(lse2 + row0 * 4), l1 = lds_f1(lse2 + (row0 + 8) * 4);
        wgmma_wait<1>();  // S done
        fence_regs(sp);
        // P: element 4j + e is query row0 (+8 for e >= 2) of the step, key kw0 + 8j + 2qd + (e & 1). No mask where
        // every key of this warpgroup is visible to every query of the step (doc_start grows with the query: the
        // step's last row has the greatest; rows past T have INT_MAX).
        const bool full = kw0 + 31 <= qs && kw0 >= lds_i1(dsq + (kBM - 1) * 4);
        if (full) {
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) sp[4 * j + e] = ex2(fmaf(sp[4 * j + e], scale_log2, -(e < 2 ? l0 : l1)));
        } else {
          const int ds0 = lds_i1(dsq + row0 * 4), ds1 = lds_i1(dsq + (row0 + 8) * 4);
          const int q0 = qs + row0;
          // Key kw0 + 8j + 2qd + (e & 1) is visible to query q0 (+8) if rel + 8j + (e & 1) <= 0 (+8), key >= start.
          const int rel = kw0 + 2 * qd - q0;
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = kw0 + 8 * j + 2 * qd + (e & 1);
              const bool vis = rel + 8 * j + (e & 1) <= (e < 2 ? 0 : 8) && key >= (e < 2 ? ds0 : ds1);
              const float p = ex2(fmaf(sp[4 * j + e], scale_log2, -(e < 2 ? l0 : l1)));
              sp[4 * j + e] = vis ? p : 0.0f;
            }
        }
        // pp[2j + hh] = the bf16 pair of row half hh (row0 + 8hh), key group j: elements 4j + 2hh, + 1.
        uint32_t pp[8], sa[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) pp[i] = pack_bf16(sp[2 * i], sp[2 * i + 1]);
        // Pᵀ to this warpgroup's 32 rows (its own dV of the previous step, their last reader, has completed).
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        stmatrix_x4_trans(sP + st_off, pp[0], pp[1], pp[2], pp[3]);
        stmatrix_x4_trans(sP + st_off + 16 * 128, pp[4], pp[5], pp[6], pp[7]);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // visible to wgmma (async proxy)
        named_barrier_sync(2 + w, 128);
        wgmma_fence();
        issue_dv(dv, smem_desc_lo(o_at, kQBox), smem_desc_lo(sP + w * 32 * 128, 16));  // dV_wᵀ += dOᵀ·P_w
        wgmma_commit();
        const float d0 = lds_f1(dlt + row0 * 4), d1 = lds_f1(dlt + (row0 + 8) * 4);
        wgmma_wait<1>();  // dP done (dV may still run)
        fence_regs(dp);
        // dS = P ⊙ (dP − delta) from the bf16 P, rounded to bf16 for the tensor cores right after.
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float2 p2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pp[i]));
          const float dd = (i & 1) ? d1 : d0;
          sa[i] = pack_bf16(p2.x * (dp[2 * i] - dd), p2.y * (dp[2 * i + 1] - dd));
        }
        // dSᵀ to this step's buffer: its last readers (every warpgroup's dK and dQ of two steps ago) completed before
        // each warpgroup reached the previous step's barrier below.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        stmatrix_x4_trans(ds_at + st_off, sa[0], sa[1], sa[2], sa[3]);
        stmatrix_x4_trans(ds_at + st_off + 16 * 128, sa[4], sa[5], sa[6], sa[7]);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        if (ctid == 0) bulk_wait_read<0>();   // the previous step's dQ tile has left the staging tile
        named_barrier_sync(1, kConsumers);  // all 96 dSᵀ rows written

        float dq[32];
        wgmma_fence();
        issue_dk(dk, smem_desc_lo(q_at + w * kQBox, kQBox), smem_desc_lo(ds_at, 16));  // dK_wᵀ += Q_wᵀ·dS
        wgmma_commit();
        issue_dq(dq, smem_desc_lo(ds_at, kPSBytes), smem_desc_lo(sK + w * kKVBox, kKVBox));  // dQ_w = dS·K_w
        wgmma_commit();
        if constexpr (HAS_NEXT) {
          wgmma_wait<1>();  // dV, dK done: the next S may take the P and dS registers' place
          fence_regs(dv[0]);
          fence_regs(dv[1]);
          fence_regs(dk);
          issue_scores(gs + 1);
          wgmma_wait<1>();  // dQ done: Q, dO are free; the next S may still run
        } else {
          wgmma_wait<0>();
          fence_regs(dv[0]);
          fence_regs(dv[1]);
          fence_regs(dk);
        }
        fence_regs(dq);
        mbar_arrive(q_empty(s));

        // dQ rows row0 (+8) of the step, columns 64w + 8j + 2qd, to the staging tile (column pairs permuted per row:
        // conflict-free float2 stores), then one bulk reduce-add of the whole tile.
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t at = dq_row + ((j ^ dq_swz) << 5);
          sts_f2(at, dq[4 * j], dq[4 * j + 1]);
          sts_f2(at + 8 * 256, dq[4 * j + 2], dq[4 * j + 3]);
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        named_barrier_sync(2 + w, 128);
        if (ctid == 0) {
          bulk_reduce_add_f32(dq_acc + (static_cast<int64_t>(kQKBoxes * h + w) * T + qs) * 64, dq_stage,
                              static_cast<uint32_t>(min(kBM, T - qs)) * 256);
          bulk_commit();
        }
      };
      for (int st = 0; st + 1 < it.nsteps; ++st) step.template operator()<true>(st, gst + st);
      step.template operator()<false>(it.nsteps - 1, gst + it.nsteps - 1);
      gst += it.nsteps;
      ++done;
      mbar_arrive(kv_empty);  // the last step waited for all its MMAs: K and V may be overwritten

      // This head group's share of dV (value columns 64b + row0 (+8), keys kw0 + 8j + 2qd (+1)) and dK (columns 64w +
      // row0 (+8), keys k0 + 8j + 2qd (+1)) through the staging tile, key rows padded (bank = 4·row + column mod 32:
      // the 32 lanes' stores hit 32 banks), one bulk reduce-add per key row into [T][Hk][128 / 192]. Waits are for
      // the sources only (the adds complete before the grid does; nothing here reads the sums back).
      if (ctid == 0) bulk_wait_read<0>();  // the last dQ tile has left the staging tile
      named_barrier_sync(2 + w, 128);
      // Staged rows 0 .. nrows − 1 (row_bytes apart) of `bytes` each -> dst + (first_key + row)·Hk·cols.
      auto flush_rows = [&](int nrows, int row_bytes, uint32_t bytes, int first_key, float* dst, int cols) {
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        named_barrier_sync(2 + w, 128);
        if (ctid < nrows) {
          const int key = first_key + ctid;
          if (key < T)
            bulk_reduce_add_f32(dst + static_cast<int64_t>(key) * a.Hk * cols, dq_stage + ctid * row_bytes, bytes);
          bulk_commit();
          bulk_wait_read<0>();
        }
        named_barrier_sync(2 + w, 128);
      };
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // dV: keys kw0 + 16·half .. + 15, 512 bytes a row
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#pragma unroll
        for (int jj = 0; jj < 2; ++jj)
#pragma unroll
          for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = 8 * jj + 2 * qd + (e & 1), col = 64 * b + row0 + 8 * (e >> 1);
              sts_f1(dq_stage + key * kDvRow + col * 4, dv[b][4 * (2 * half + jj) + e]);
            }
        flush_rows(16, kDvRow, kDv * 4, kw0 + 16 * half, dv_acc + static_cast<int64_t>(it.hk) * kDv, kDv);
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // dK: keys k0 + 48·half .. + 47, this warpgroup's 256 bytes a row
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#pragma unroll
        for (int jj = 0; jj < 6; ++jj)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = 8 * jj + 2 * qd + (e & 1), col = row0 + 8 * (e >> 1);
            sts_f1(dq_stage + key * kDkRow + col * 4, dk[4 * (6 * half + jj) + e]);
          }
        flush_rows(48, kDkRow, 64 * 4, k0 + 48 * half, dk_acc + static_cast<int64_t>(it.hk) * kDqk + 64 * w, kDqk);
      }
    }
  }
#else
  // Built for another architecture: the host never launches this (flash_bwd_sm90_mla_supported).
  __trap();
#endif
}

// [T][H][D] bf16 as a 2-D tensor [T rows][H·D columns]; a box is 64 columns (128 bytes, the swizzle span) of `rows`
// consecutive tokens; rows past T read as zeros.
CUtensorMap rows_map(const void* data, int T, int H, int D, int rows) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(H) * D, static_cast<cuuint64_t>(T)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(H) * D * 2};
  return sm90::make_map("flash attention backward (sm90, 192 / 128)", data, 2, dims, strides,
                        static_cast<cuuint32_t>(rows));
}

}  // namespace

namespace detail {

bool flash_bwd_sm90_mla_supported(const FlashArgs& a) {
  // TMA coordinates and the item count are int32 (T·H < 2^31 is checked by the caller).
  return a.D == kDqk && flash_value_dim(a) == kDv && a.Hk > 0 && a.Hq % a.Hk == 0 &&
         sm90::device_runs_sm90a<flash_bwd_sm90_mla_kernel>();
}

void flash_bwd_sm90_mla_launch(const FlashArgs& a, const void* dout, const void* q, const void* k, const void* v,
                               const void* out, const float* lse, void* dq, void* dk, void* dv, float* dq_acc,
                               float* dk_acc, float* dv_acc, float* delta, cudaStream_t stream) {
  if (a.T == 0) return;  // a tensor map needs non-empty dimensions
  MT_CUDA_REQUIRE(flash_bwd_sm90_mla_supported(a),
                  "flash attention backward (sm90, MLA): needs head_dim 192 with v_dim 128 (got " +
                      std::to_string(a.D) + " / " + std::to_string(flash_value_dim(a)) +
                      "), a cc 9.0 GPU and a build with 90a in CMAKE_CUDA_ARCHITECTURES");
  MT_CUDA_REQUIRE(a.window == 0 && a.sinks == nullptr && a.dsinks == nullptr,
                  "flash attention backward (sm90, MLA): no sliding window or sinks here (the mma.sync kernel has them)");
  MT_CUDA_REQUIRE(aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dout) && aligned16(dq_acc),
                  "flash attention backward (sm90, MLA): q, k, v, dout and dq_acc must be 16-byte aligned (TMA, bulk "
                  "reduce-add)");
  MT_CUDA_REQUIRE(dq != nullptr, "flash attention backward (sm90, MLA): makes a bf16 dq (no dQ sums at 192 / 128)");
  const CUtensorMap mq = rows_map(q, a.T, a.Hq, kDqk, kBM);
  const CUtensorMap mo = rows_map(dout, a.T, a.Hq, kDv, kBM);
  const CUtensorMap mk = rows_map(k, a.T, a.Hk, kDqk, kBN);
  const CUtensorMap mv = rows_map(v, a.T, a.Hk, kDv, kBN);
  MT_CUDA_CHECK(
      cudaFuncSetAttribute(flash_bwd_sm90_mla_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  flash_bwd_prologue(a, dout, out, dq_acc, dk_acc, dv_acc, delta, stream);
  // One block per SM claiming items (MIXTUNE_FLASH_BWD_PERSISTENT=0: one block per item), as at head_dim 128.
  static const bool persistent = [] {
    const char* e = std::getenv("MIXTUNE_FLASH_BWD_PERSISTENT");
    return !(e && std::string(e) == "0");
  }();
  int device = 0;
  MT_CUDA_CHECK(cudaGetDevice(&device));
  const int sms = std::max(device_context(device).sm_count, 1);
  // Heads per item by the head_dim 128 kernel's rule (its items are 128 keys, these 96: the rule's "two items per
  // SM" threshold is met a little earlier here; MLA itself is MHA, where G is 1).
  const int g = flash_bwd_sm90_heads_per_item(a.T, a.Hq, a.Hk, sms);
  int64_t grid = static_cast<int64_t>(a.Hq / g) * ((a.T + kBN - 1) / kBN);  // work items
  int* item_counter = reinterpret_cast<int*>(delta + static_cast<int64_t>(a.Hq) * a.T);  // zeroed by the prologue
  if (persistent) grid = std::min<int64_t>(grid, sms);
  launch_kernel(flash_bwd_sm90_mla_kernel, static_cast<int>(grid), kThreads, kSmemBytes, stream, mq, mk, mv, mo, a,
                lse, delta, dq_acc, dk_acc, dv_acc, item_counter, g);
  const int64_t pairs = static_cast<int64_t>(a.T) * a.Hq * (kDqk / 2);
  launch_kernel(dq_to_bf16_mla_kernel, static_cast<int>(std::min<int64_t>((pairs + 255) / 256, 65536)), 256, 0,
                stream, dq_acc, a.T, a.Hq, a.scale, static_cast<bf16*>(dq));
  flash_bwd_epilogue(a, nullptr, dk_acc, dv_acc, dq, dk, dv, stream);
}

}  // namespace detail
}  // namespace mt::cuda

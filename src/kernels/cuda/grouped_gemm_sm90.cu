#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/grouped_gemm_kernels.h"
#include "kernels/cuda/grouped_schedule.cuh"
#include "kernels/cuda/sm90_common.cuh"
#include "kernels/cuda/tensor_checks.h"
#include "kernels/cuda/kernel_launch.cuh"

// Hopper (sm_90a) M-grouped forward and dgrad of the grouped expert GEMM: y rows of expert e = x rows of e · W_eᵀ
// (dgrad: dx rows of e = dy rows of e · W_e, W read as an N-major B),
// with TMA tile loads and warpgroup MMA (wgmma) from 128-byte-swizzled shared memory (NOTES.md,
// "Grouped expert GEMM", Hopper paragraph). Same contract and device-side schedule as the mma.sync
// kernel in grouped_gemm.cu; selected by grouped_gemm.cpp only on cc 9.x.
//
// Block = 3 warpgroups (384 threads), one block per SM, persistent over the tiles:
//   warpgroup 0: producer. One thread issues, per k-step, a TMA load of the x tile [128 rows][64 k]
//                and of the W_e tile [BN rows][64 k] into stage s, arming full[s] with the byte count.
//   warpgroups 1, 2: consumers, rows 64·c .. 64·c + 63 of the 128-row tile, all BN columns, fp32
//                accumulators in registers (BN / 2 per thread). Per k-step: wait full[s], four
//                wgmma m64nBNk16 (k = 16 each), commit; once the previous step's group has completed
//                (wait_group 1) its stage is handed back through empty[s]. A warpgroup whose rows all
//                lie past the expert's end skips its MMAs. Epilogue: the warpgroup writes its 64 x BN
//                tile as bf16 in chunks of 64 columns into two alternating 8 KiB buffers (the 128B-swizzled
//                layout of a TMA box) and goes on; warp 1 + c of the producer warpgroup (idle otherwise)
//                stores each chunk, by one TMA tensor store, or, when the slab runs past its expert's end
//                (the rows after it belong to the next expert), by 16-byte stores of the expert's rows only,
//                and hands the buffer back (free[c][b]).
// Stage/phase bookkeeping: producer and consumers walk the same (tile, k-step) sequence, so both keep a
// running stage index and a phase bit that flips each time the index wraps; the producer waits for
// empty[s] to complete the phase before the one it will fill (parity ^ 1: the first pass never blocks).
// Rows: x is one 2-D map over the grouped rows; a tile's last rows may belong to the next expert (or be
// zero-filled past the tensor): they are computed and never stored. W is a 3-D map [E][Nout][K], so
// n-tiles past Nout read zeros, never the next expert. y's map clips columns past Nout and rows past the
// tensor.

namespace mt::cuda {

namespace {

using namespace sm90;

struct Sm90Args {
  const int32_t* offsets;
  bf16* y;
  int E, N, K;        // N = Nout (columns of y, rows of W_e)
  int* tile_counter;  // DYN kernels: zero at launch; tiles gridDim.x, gridDim.x + 1, ... go to whoever asks first
};

// B_MN = false: forward, the W_e tile is [BN rows of Nout][64 k] (K-major, one TMA box).
// B_MN = true: dgrad (dx = dy · W_e: the reduction runs over W's rows), the tile is [64 rows of the
// reduction][BN columns] loaded as BN / 64 boxes of [64][64] (N-major B, wgmma's transposed-B form).
// STAGES_T, STORE, LOAD: STAGES_T 0 is TileCfg's default (4 for BN 256; 3 where E leaves no room); STORE and
// LOAD false are the bench's mainloop probes (detail::grouped_gemm_sm90_probe_set): no output (the
// accumulators are still consumed, so ptxas keeps the MMAs), or full barriers armed without TMA loads (the
// MMAs read whatever the stages hold).
// DYN (detail::grouped_gemm_sm90_dynamic_set, MIXTUNE_GROUPED_DYNAMIC=1; off by default): the
// producer thread claims each next tile from p.tile_counter (atomicAdd, as the wgrad does) and hands it to the
// consumers and storer warps through a ring of TQ slots (tile_full / tile_empty barriers, -1 ends), instead of
// every role walking tiles blockIdx.x, + gridDim.x, ... An expert's last tile with <= 64 rows costs less than a
// full one, and on the static walk the kernel ends with the block that drew the most full tiles (the forward's
// time follows the m-tile count: bench/NOTES.md 76-79); claimed tiles even the blocks' work out. Measured
// (NOTES 80): 2-8% faster with skewed (trained-router-like) routing, 2-15% slower with balanced routing (the ring's
// hand-off), no change in the standard step, whose random-init router is near-uniform.
template <int BN, bool B_MN, int STAGES_T = 0, bool STORE = true, bool LOAD = true, bool DYN = false>
__global__ void __launch_bounds__(THREADS, 1)
    grouped_sm90_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                        const __grid_constant__ CUtensorMap map_y, Sm90Args p) {
  pdl_wait();
#if MT_SM90A_DEVICE
  using Cfg = TileCfg<BN, STAGES_T, STORE>;
  constexpr int STAGES = Cfg::STAGES, CHUNK = Cfg::CHUNK_BYTES, TQ = Cfg::RING;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t sA = base, sB = base + STAGES * A_BYTES, sOut = base + Cfg::PIPE_BYTES;
  const uint32_t full_bar = sOut + Cfg::OUT_BYTES, empty_bar = full_bar + STAGES * 8;
  // [consumer warpgroup c][buffer b] at + 8 (2c + b): a chunk staged (the warpgroup's threads) / stored (the
  // storer warp's lane 0).
  const uint32_t staged_bar = empty_bar + STAGES * 8, free_bar = staged_bar + 32;
  const uint32_t tile_full = free_bar + 32, tile_empty = tile_full + 8 * TQ;  // DYN's ring
  int* s_off = reinterpret_cast<int*>(smem + Cfg::PIPE_BYTES + Cfg::OUT_BYTES + Cfg::BAR_BYTES);
  int* s_tiles = s_off + (p.E + 1);
  int* s_ring = s_tiles + (p.E + 1);
  const int tid = threadIdx.x;

  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, 1);                  // the producer's arrive.expect_tx
      mbar_init(empty_bar + 8 * s, CONSUMER_THREADS);  // every consumer thread, once per k-step
    }
    for (int i = 0; i < 4; ++i) {
      mbar_init(staged_bar + 8 * i, 128);
      mbar_init(free_bar + 8 * i, 1);
    }
    if constexpr (DYN) {
      for (int i = 0; i < TQ; ++i) {
        mbar_init(tile_full + 8 * i, 1);                                // the producer thread
        mbar_init(tile_empty + 8 * i, CONSUMER_THREADS + (STORE ? 64 : 0));  // consumers and storer lanes
      }
    }
    // Make the initialised barriers visible to the other threads and to the async (TMA) proxy.
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  grouped_schedule_build<THREADS, BM>(p.offsets, p.E, s_off, s_tiles);  // ends with __syncthreads (covers the barrier init)
  const int ntn = (p.N + BN - 1) / BN, KT = (p.K + BK - 1) / BK;
  const int total = s_tiles[p.E] * ntn;  // < 2^31: launch_bn checks the bound
  // DYN: the next tile from the ring (-1: none left); `it` counts this thread's takes.
  auto take = [&](uint32_t& it) -> int {
    const uint32_t slot = it % TQ;
    while (!mbar_try_wait(tile_full + 8 * slot, (it / TQ) & 1)) {
    }
    const int t = s_ring[slot];
    mbar_arrive(tile_empty + 8 * slot);
    ++it;
    return t;
  };

  if (tid < 128) {
    // ---- producer warpgroup: gives most of its registers to the consumers; one thread works.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (tid == 0) {
      tma_prefetch_map(&map_x);
      tma_prefetch_map(&map_w);
      int stage = 0;
      uint32_t phase = 0, handed = 0;  // handed: tiles put in the ring (DYN)
      for (int t = blockIdx.x;;) {
        if constexpr (DYN) {
          const uint32_t slot = handed % TQ;
          mbar_wait(tile_empty + 8 * slot, ((handed / TQ) & 1) ^ 1);
          s_ring[slot] = t < total ? t : -1;
          mbar_arrive(tile_full + 8 * slot);
          ++handed;
        }
        if (t >= total) break;
        // Claimed before this tile's loads are issued, so the atomic's round trip hides behind them.
        const int next = DYN ? static_cast<int>(gridDim.x) + atomicAdd(p.tile_counter, 1) : t + static_cast<int>(gridDim.x);
        const GroupedTile tp = grouped_tile<BM, BN>(t, ntn, s_off, s_tiles, p.E);
        for (int kb = 0; kb < KT; ++kb) {
          mbar_wait(empty_bar + 8 * stage, phase ^ 1);
          const uint32_t fb = full_bar + 8 * stage;
          if constexpr (!LOAD) {
            mbar_arrive(fb);
            if (++stage == STAGES) stage = 0, phase ^= 1;
            continue;
          }
          // Full box bytes even where the box runs past the tensor (TMA counts the zero fill).
          mbar_arrive_expect_tx(fb, Cfg::STAGE_BYTES);
          tma_load_2d(sA + stage * A_BYTES, &map_x, fb, kb * BK, tp.row0);
          if constexpr (B_MN) {
#pragma unroll
            for (int j = 0; j < BN / 64; ++j)
              tma_load_3d(sB + stage * Cfg::B_BYTES + j * (BK * 128), &map_w, fb, tp.n0 + 64 * j, kb * BK, tp.e);
          } else {
            // A TMA box holds at most 256 rows: the 384-wide tile's W comes as two boxes of 192.
#pragma unroll
            for (int h = 0; h < (BN == 384 ? 2 : 1); ++h)
              tma_load_3d(sB + stage * Cfg::B_BYTES + h * 192 * 128, &map_w, fb, kb * BK, tp.n0 + 192 * h, tp.e);
          }
          if (++stage == STAGES) stage = 0, phase ^= 1;
        }
        t = next;
      }
    } else if (STORE && tid >= 32 && tid < 96) {
      // ---- storer warps: warp 1 + c stores consumer warpgroup c's chunks. Same tile walk and `active` rule as
      // the consumers, so both count the same chunks: chunk number n goes through buffer n % 2.
      const int c = tid / 32 - 1, lane = tid & 31;
      if (lane == 0) tma_prefetch_map(&map_y);
      uint32_t n = 0, it = 0;
      for (int t = DYN ? take(it) : static_cast<int>(blockIdx.x); t >= 0 && t < total;
           t = DYN ? take(it) : t + static_cast<int>(gridDim.x)) {
        const GroupedTile tp = grouped_tile<BM, BN>(t, ntn, s_off, s_tiles, p.E);
        const int my_row0 = tp.row0 + 64 * c;
        if (my_row0 >= tp.row_end) continue;
        const int rows = min(64, tp.row_end - my_row0);
        for (int ch = 0; ch < BN / 64; ++ch, ++n) {
          const int b = n & 1, col0 = tp.n0 + 64 * ch;
          const uint32_t buf = sOut + (c * 2 + b) * CHUNK;
          mbar_wait(staged_bar + 8 * (2 * c + b), (n >> 1) & 1);
          if (rows == 64) {
            if (lane == 0) {
              if (col0 < p.N) {  // the map clips columns past Nout
                tma_store_2d(&map_y, buf, col0, my_row0);
                bulk_commit();
                bulk_wait_read<0>();  // TMA has read the buffer: it may be rewritten
              }
            }
          } else {
            // The expert ends inside this slab: rows past `rows` belong to the next expert, never stored.
#pragma unroll 2  // unroll 4 spills at the storer warp's 40 registers
            for (int idx = lane; idx < rows * 8; idx += 32) {
              const int row = idx >> 3, u = idx & 7, col = col0 + 8 * u;  // Nout % 8 == 0: whole units
              const uint4 v = lds_u32x4(buf + row * 128 + ((u ^ (row & 7)) << 4));
              if (col < p.N) *reinterpret_cast<uint4*>(p.y + static_cast<int64_t>(my_row0 + row) * p.N + col) = v;
            }
            __syncwarp();
          }
          if (lane == 0) mbar_arrive(free_bar + 8 * (2 * c + b));
        }
      }
      if (lane == 0) bulk_wait_all<0>();  // the last stores complete before the block exits
    }
  } else {
    // ---- consumer warpgroups.
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int c = tid / 128 - 1;  // rows 64c .. 64c + 63 of the tile
    const int w = (tid / 32) & 3, lane = tid & 31, g = lane >> 2, q = lane & 3;
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
    int stage = 0;
    uint32_t phase = 0, n = 0, it = 0;  // n: chunks this warpgroup has staged; it: tiles taken (DYN)
    for (int t = DYN ? take(it) : static_cast<int>(blockIdx.x); t >= 0 && t < total;
         t = DYN ? take(it) : t + static_cast<int>(gridDim.x)) {
      const GroupedTile tp = grouped_tile<BM, BN>(t, ntn, s_off, s_tiles, p.E);
      // A warpgroup whose 64 rows all lie past the expert's end (an expert's last tile holding <= 64
      // rows) issues no MMAs: the other warpgroup then has the SM's tensor cores to itself. It still
      // waits on every stage and hands it back, so the barrier phases stay in step. (Written as a loop
      // bound, not a branch around the MMAs: ptxas serialises wgmma inside a divergent branch.)
      const int my_row0 = tp.row0 + 64 * c;
      const bool active = my_row0 < tp.row_end;
      int prev = 0;
      const int kt_mma = active ? KT : 0;
      for (int kb = 0; kb < kt_mma; ++kb) {
        mbar_wait(full_bar + 8 * stage, phase);
        const uint64_t da = smem_desc(sA + stage * A_BYTES + c * 64 * 128);
        const uint64_t db =
            B_MN ? smem_desc_mn(sB + stage * Cfg::B_BYTES) : smem_desc(sB + stage * Cfg::B_BYTES);
        constexpr int b_step = B_MN ? (16 * 128) >> 4 : 2;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk)
          wgmma_tile<BN, 0, B_MN ? 1 : 0>(acc, da + 2 * kk, db + b_step * kk, (kb | kk) != 0);
        wgmma_commit();
        if (kb > 0) {
          wgmma_wait<1>();
          mbar_arrive(empty_bar + 8 * prev);
        }
        prev = stage;
        if (++stage == STAGES) stage = 0, phase ^= 1;
      }
      for (int kb = kt_mma; kb < KT; ++kb) {
        mbar_wait(full_bar + 8 * stage, phase);
        if (kb > 0) mbar_arrive(empty_bar + 8 * prev);
        prev = stage;
        if (++stage == STAGES) stage = 0, phase ^= 1;
      }
      wgmma_wait<0>();
      fence_regs(acc);
      mbar_arrive(empty_bar + 8 * prev);  // this warpgroup's last MMAs are done with the stage
      if constexpr (!STORE) {
        // Probe: consume the accumulators (ptxas drops MMAs whose results are never read) without storing.
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) sum += acc[i];
        if (active && sum == -1.0f && p.E < 0) p.y[0] = __float2bfloat16(sum);  // never true: E >= 1
        continue;
      }
      if (!active) continue;
      // ---- epilogue, chunk by chunk of 64 columns: accumulator fragments -> bf16 pairs in buffer n % 2 of this
      // warpgroup ([64 rows][128 bytes], 16-byte unit u of row r at unit u ^ (r % 8): conflict-free writes, and
      // the layout a 128B-swizzled TMA box reads), once the storer warp has handed that buffer back.
      const int r0 = 16 * w + g;
#pragma unroll
      for (int ch = 0; ch < BN / 64; ++ch, ++n) {
        const int b = n & 1;
        const uint32_t buf = sOut + (c * 2 + b) * CHUNK;
        mbar_wait(free_bar + 8 * (2 * c + b), ((n >> 1) & 1) ^ 1);
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const int j = 8 * ch + jj;
          const uint32_t at = buf + (((jj ^ g) << 4) | (q << 2));
          sts_u32(at + r0 * 128, pack_bf16(acc[4 * j], acc[4 * j + 1]));
          sts_u32(at + (r0 + 8) * 128, pack_bf16(acc[4 * j + 2], acc[4 * j + 3]));
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic writes -> TMA's reads
        mbar_arrive(staged_bar + 8 * (2 * c + b));
      }
    }
  }
#else
  // Built for another architecture: the host never launches this (grouped_gemm_sm90_compiled).
  __trap();
#endif
}

// Column tile width (pick_bn) and stage count: the 256-wide tile with 4 stages where the shared memory holds
// them beside E experts' offsets, else with 3 (E in the hundreds), else the 128-wide tile (5 stages). The
// 128 x 384 tile (3 stages) where the bench's probe asks for it, or MIXTUNE_WGMMA_BN=384 and the output width is
// a multiple of 384.
struct TileChoice {
  int bn, stages;
};
TileChoice tile_choice(int N, int E) {
  if (detail::grouped_gemm_sm90_probe_get().bn == 384 ||
      (wgmma_bn_forced() == 384 && N % 384 == 0 && smem_bytes<384>(E) <= smem_optin_bytes()))
    return {384, TileCfg<384>::STAGES};
  if (pick_bn(N) == 256) {
    if (smem_bytes<256>(E) <= smem_optin_bytes()) return {256, TileCfg<256>::STAGES};
    if (smem_bytes<256, 3>(E) <= smem_optin_bytes()) return {256, 3};
  }
  require_smem_fits(smem_bytes<128>(E), "grouped gemm (wgmma) with " + std::to_string(E) + " experts");
  return {128, TileCfg<128>::STAGES};
}

// y [rows][N] (dgrad: dx [rows][K]) as the epilogue's TMA store target: boxes of [64 rows][64 columns].
CUtensorMap out_map(void* y, int64_t rows, int N) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(N), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(N) * 2};
  return make_map("y", y, 2, dims, strides, 64);
}

template <int BN, bool B_MN, int STAGES_T = 0, bool STORE = true, bool LOAD = true, bool DYN = false>
void launch_bn(const CUtensorMap& mx, const CUtensorMap& mw, const CUtensorMap& my, const Sm90Args& a, int64_t rows,
               int sm_count, cudaStream_t stream) {
  const int64_t max_tiles = (rows / BM + a.E) * ((a.N + BN - 1) / BN);
  if (max_tiles <= 0) return;
  MT_CUDA_REQUIRE(max_tiles < (int64_t{1} << 31), "grouped gemm (wgmma): more than 2^31 tiles");
  const size_t smem = smem_bytes<BN, STAGES_T, STORE>(a.E);
  require_smem_fits(smem, "grouped gemm (wgmma) with " + std::to_string(a.E) + " experts");
  auto kern = grouped_sm90_kernel<BN, B_MN, STAGES_T, STORE, LOAD, DYN>;
  MT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const int grid = static_cast<int>(std::min<int64_t>(max_tiles, std::max(sm_count, 1)));
  launch_kernel(kern, grid, THREADS, smem, stream, mx, mw, my, a);
}

// The shape's tile choice (the 384-wide one included), or on the 256-wide tile the bench's probe: 3 or 4 stages
// (forward and dgrad), no stores or no loads (forward only). With a tile counter (a.tile_counter) and no probe:
// the claimed-tile (DYN) build of the 128- or 256-wide tile.
template <bool B_MN>
void launch(const TileChoice& tc, const CUtensorMap& mx, const CUtensorMap& mw, const CUtensorMap& my,
            const Sm90Args& a, int64_t rows, int sm_count, cudaStream_t stream) {
  const detail::GroupedSm90Probe pr = detail::grouped_gemm_sm90_probe_get();
  if (a.tile_counter != nullptr && pr.stages == 0 && pr.bn == 0 && tc.bn != 384) {
    if (tc.bn == 128) return launch_bn<128, B_MN, 0, true, true, true>(mx, mw, my, a, rows, sm_count, stream);
    if (tc.stages == 4) return launch_bn<256, B_MN, 4, true, true, true>(mx, mw, my, a, rows, sm_count, stream);
    return launch_bn<256, B_MN, 3, true, true, true>(mx, mw, my, a, rows, sm_count, stream);
  }
  if (tc.bn == 384) return launch_bn<384, B_MN>(mx, mw, my, a, rows, sm_count, stream);
  if (tc.bn == 128) return launch_bn<128, B_MN>(mx, mw, my, a, rows, sm_count, stream);
  if (pr.bn == 0 && (pr.stages == 0 || (pr.store && pr.load && (pr.stages == 3 || pr.stages == 4)))) {
    if ((pr.stages == 0 ? tc.stages : pr.stages) == 4) return launch_bn<256, B_MN, 4>(mx, mw, my, a, rows, sm_count, stream);
    return launch_bn<256, B_MN, 3>(mx, mw, my, a, rows, sm_count, stream);
  }
  if constexpr (!B_MN) {
    if (!pr.store && pr.load && pr.stages == 4)
      return launch_bn<256, false, 4, false>(mx, mw, my, a, rows, sm_count, stream);
    if (!pr.store && pr.load && pr.stages == 3)
      return launch_bn<256, false, 3, false>(mx, mw, my, a, rows, sm_count, stream);
    if (pr.store && !pr.load && pr.stages == 4)
      return launch_bn<256, false, 4, true, false>(mx, mw, my, a, rows, sm_count, stream);
  }
  MT_CUDA_REQUIRE(false, std::string("grouped gemm (wgmma): no probe build of the ") + (B_MN ? "dgrad" : "forward") +
                             " for this stage count / store / load choice");
}

// The checks both launchers share (TMA: int32 coordinates, 16-byte aligned global addresses).
void check_launch(const char* op, const void* a, const void* w, const void* out, int E, int64_t rows, int N, int K) {
  MT_CUDA_REQUIRE(detail::grouped_gemm_sm90_compiled(), std::string(op) +
                                                             ": needs a cc 9.0 GPU and a build with "
                                                             "CMAKE_CUDA_ARCHITECTURES including 90a");
  MT_CUDA_REQUIRE(rows < (int64_t{1} << 31) && E >= 1 && E <= 4096 && N % 8 == 0 && K % 8 == 0,
                  std::string(op) + ": rows must fit TMA's int32 coordinates, E in [1, 4096], both widths "
                                    "multiples of 8");
  MT_CUDA_REQUIRE(aligned16(a) && aligned16(w) && aligned16(out),
                  std::string(op) + ": operands and output must be 16-byte aligned (TMA loads and stores)");
}

}  // namespace

namespace detail {

namespace {
std::atomic<int> g_probe{0};  // stages | store << 8 | load << 9 | (bn == 384) << 10; 0 = no probe
}  // namespace

void grouped_gemm_sm90_probe_set(GroupedSm90Probe p) {
  const bool off = p.stages == 0 && p.bn == 0;
  g_probe.store(off ? 0 : (p.stages | (p.store ? 256 : 0) | (p.load ? 512 : 0) | (p.bn == 384 ? 1024 : 0)));
}
GroupedSm90Probe grouped_gemm_sm90_probe_get() {
  const int v = g_probe.load();
  if (v == 0) return {};
  return {v & 255, (v & 256) != 0, (v & 512) != 0, (v & 1024) ? 384 : 0};
}

namespace {
std::atomic<int> g_dynamic{-1};  // grouped_gemm_sm90_dynamic_set; -1: MIXTUNE_GROUPED_DYNAMIC (default off)
}  // namespace

void grouped_gemm_sm90_dynamic_set(int on) { g_dynamic.store(on); }
bool grouped_gemm_sm90_dynamic() {
  const int set = g_dynamic.load();
  if (set >= 0) return set == 1;
  static const bool env_on = [] {
    const char* e = std::getenv("MIXTUNE_GROUPED_DYNAMIC");
    return e != nullptr && std::string(e) == "1";
  }();
  return env_on;
}

bool grouped_gemm_sm90_compiled() { return sm90::device_runs_sm90a<grouped_sm90_kernel<256, false>>(); }

void grouped_gemm_fwd_sm90_launch(const void* x, const void* w, void* y, const int32_t* offsets, int E, int64_t rows,
                                  int N, int K, int sm_count, int* tile_counter, cudaStream_t stream) {
  if (rows <= 0) return;  // no rows: nothing to compute (a tensor map needs non-empty dimensions)
  check_launch("grouped gemm forward (wgmma)", x, w, y, E, rows, N, K);
  const cuuint64_t xdims[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(rows)};
  const cuuint64_t xstrides[1] = {static_cast<cuuint64_t>(K) * 2};
  const cuuint64_t wdims[3] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(N), static_cast<cuuint64_t>(E)};
  const cuuint64_t wstrides[2] = {static_cast<cuuint64_t>(K) * 2, static_cast<cuuint64_t>(N) * K * 2};
  const Sm90Args a{offsets, static_cast<bf16*>(y), E, N, K, tile_counter};
  const CUtensorMap mx = make_map("x", x, 2, xdims, xstrides, BM), my = out_map(y, rows, N);
  const TileChoice tc = tile_choice(N, E);
  const CUtensorMap mw = make_map("w", w, 3, wdims, wstrides, tc.bn == 384 ? 192 : tc.bn);  // a box holds <= 256 rows
  launch<false>(tc, mx, mw, my, a, rows, sm_count, stream);
}

void grouped_gemm_dgrad_sm90_launch(const void* dy, const void* w, void* dx, const int32_t* offsets, int E,
                                    int64_t rows, int J, int K, int sm_count, int* tile_counter, cudaStream_t stream) {
  if (rows <= 0) return;
  check_launch("grouped gemm dgrad (wgmma)", dy, w, dx, E, rows, K, J);
  // dy [rows][J] is the K-major A operand (reduction J); W [E][J][K] is read as [64 rows of J][64 of K]
  // boxes (N-major B); dx [rows][K] is the output (width K).
  const cuuint64_t ydims[2] = {static_cast<cuuint64_t>(J), static_cast<cuuint64_t>(rows)};
  const cuuint64_t ystrides[1] = {static_cast<cuuint64_t>(J) * 2};
  const cuuint64_t wdims[3] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(J), static_cast<cuuint64_t>(E)};
  const cuuint64_t wstrides[2] = {static_cast<cuuint64_t>(K) * 2, static_cast<cuuint64_t>(J) * K * 2};
  const Sm90Args a{offsets, static_cast<bf16*>(dx), E, K, J, tile_counter};
  const CUtensorMap my = make_map("dy", dy, 2, ydims, ystrides, BM), mo = out_map(dx, rows, K);
  const CUtensorMap mw = make_map("w", w, 3, wdims, wstrides, BK);
  launch<true>(tile_choice(K, E), my, mw, mo, a, rows, sm_count, stream);
}

}  // namespace detail
}  // namespace mt::cuda

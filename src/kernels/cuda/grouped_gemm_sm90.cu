#include <algorithm>
#include <atomic>
#include <cstdint>
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
//                lie past the expert's end skips its MMAs. Epilogue: the consumer writes its 64 x BN
//                tile as bf16 into its own staging buffer (staged[c]) and goes on to the next tile's
//                MMAs; warp 1 + c of the producer warpgroup (idle otherwise) copies the buffer out as
//                coalesced 16-byte stores (rows past the expert's end and columns past Nout skipped) and
//                frees it (free[c]). The consumers' tensor cores then idle only for the register-to-
//                shared-memory copy, not for the global stores.
// Stage/phase bookkeeping: producer and consumers walk the same (tile, k-step) sequence, so both keep a
// running stage index and a phase bit that flips each time the index wraps; the producer waits for
// empty[s] to complete the phase before the one it will fill (parity ^ 1: the first pass never blocks).
// Rows: x is one 2-D map over the grouped rows; a tile's last rows may belong to the next expert (or be
// zero-filled past the tensor): they are computed and never stored. W is a 3-D map [E][Nout][K], so
// n-tiles past Nout read zeros, never the next expert.

namespace mt::cuda {

namespace {

using namespace sm90;

struct Sm90Args {
  const int32_t* offsets;
  bf16* y;
  int E, N, K;  // N = Nout (columns of y, rows of W_e)
};


// B_MN = false: forward, the W_e tile is [BN rows of Nout][64 k] (K-major, one TMA box).
// B_MN = true: dgrad (dx = dy · W_e: the reduction runs over W's rows), the tile is [64 rows of the
// reduction][BN columns] loaded as BN / 64 boxes of [64][64] (N-major B, wgmma's transposed-B form).
// STAGES_T, STORE, LOAD: the bench's mainloop probes (detail::grouped_gemm_sm90_probe_set); training runs the
// defaults. STORE = false computes the tiles and stores nothing; LOAD = false arms the full barriers without
// TMA loads (the MMAs read whatever the stages hold), so only the tensor cores and the barriers are timed.
template <int BN, bool B_MN, int STAGES_T = 0, bool STORE = true, bool LOAD = true>
__global__ void __launch_bounds__(THREADS, 1)
    grouped_sm90_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                            Sm90Args p) {
  pdl_wait();
#if MT_SM90A_DEVICE
  using Cfg = TileCfg<BN, STAGES_T, STORE>;
  constexpr int STAGES = Cfg::STAGES;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t sA = base, sB = base + STAGES * A_BYTES, sOut = base + Cfg::PIPE_BYTES;
  const uint32_t full_bar = sOut + Cfg::OUT_BYTES, empty_bar = full_bar + STAGES * 8;
  const uint32_t staged_bar = empty_bar + STAGES * 8, free_bar = staged_bar + 16;  // [consumer warpgroup]
  int* s_off = reinterpret_cast<int*>(smem + Cfg::PIPE_BYTES + Cfg::OUT_BYTES + Cfg::BAR_BYTES);
  int* s_tiles = s_off + (p.E + 1);
  const int tid = threadIdx.x;

  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, 1);                  // the producer's arrive.expect_tx
      mbar_init(empty_bar + 8 * s, CONSUMER_THREADS);  // every consumer thread, once per k-step
    }
    for (int c = 0; c < 2; ++c) {
      mbar_init(staged_bar + 8 * c, 128);  // the consumer warpgroup's threads, once per staged tile
      mbar_init(free_bar + 8 * c, 32);     // its storer warp's lanes
    }
    // Make the initialised barriers visible to the other threads and to the async (TMA) proxy.
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  grouped_schedule_build<THREADS, BM>(p.offsets, p.E, s_off, s_tiles);  // ends with __syncthreads (covers the barrier init)
  const int ntn = (p.N + BN - 1) / BN, KT = (p.K + BK - 1) / BK;
  const int64_t total = static_cast<int64_t>(s_tiles[p.E]) * ntn;

  if (tid < 128) {
    // ---- producer warpgroup: gives most of its registers to the consumers; one thread works.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (tid == 0) {
      tma_prefetch_map(&map_x);
      tma_prefetch_map(&map_w);
      int stage = 0;
      uint32_t phase = 0;
      for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
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
            tma_load_3d(sB + stage * Cfg::B_BYTES, &map_w, fb, kb * BK, tp.n0, tp.e);
          }
          if (++stage == STAGES) stage = 0, phase ^= 1;
        }
      }
    } else if (STORE && tid >= 32 && tid < 96) {
      // ---- storer warps: warp 1 + c copies consumer warpgroup c's staged tiles out. Same tile walk and
      // `active` rule as the consumers, so both count the same staged tiles.
      const int c = tid / 32 - 1, lane = tid & 31;
      const uint32_t buf = sOut + c * (Cfg::OUT_BYTES / 2);
      constexpr int UNITS = BN / 8;  // 16-byte units per row
      uint32_t n = 0;
      for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
        const GroupedTile tp = grouped_tile<BM, BN>(t, ntn, s_off, s_tiles, p.E);
        const int my_row0 = tp.row0 + 64 * c;
        if (my_row0 >= tp.row_end) continue;
        mbar_wait(staged_bar + 8 * c, n & 1);
        const int rows = min(64, tp.row_end - my_row0);
#pragma unroll 4
        for (int idx = lane; idx < rows * UNITS; idx += 32) {
          const int row = idx / UNITS, u = idx % UNITS, col = tp.n0 + 8 * u;  // Nout % 8 == 0: whole units
          const uint4 v = lds_u32x4(buf + (u >> 3) * 8192 + row * 128 + (((u & 7) ^ (row & 7)) << 4));
          if (col < p.N) *reinterpret_cast<uint4*>(p.y + static_cast<int64_t>(my_row0 + row) * p.N + col) = v;
        }
        mbar_arrive(free_bar + 8 * c);
        ++n;
      }
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
    uint32_t phase = 0, staged = 0;  // staged: tiles this warpgroup has handed to its storer warp
    for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
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
      if (STORE && active) {
        // ---- epilogue: accumulator fragments -> bf16 pairs in this warpgroup's staging buffer, 64-column
        // blocks of [64 rows][128 bytes], 16-byte units XOR-swizzled by row (conflict-free writes and
        // reads), once the storer warp has copied out the previous tile.
        mbar_wait(free_bar + 8 * c, (staged & 1) ^ 1);
        const uint32_t buf = sOut + c * (Cfg::OUT_BYTES / 2);
        const int r0 = 16 * w + g;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const uint32_t at = buf + (j >> 3) * 8192 + ((((j & 7) ^ g) << 4) | (q << 2));
          sts_u32(at + r0 * 128, pack_bf16(acc[4 * j], acc[4 * j + 1]));
          sts_u32(at + (r0 + 8) * 128, pack_bf16(acc[4 * j + 2], acc[4 * j + 3]));
        }
        mbar_arrive(staged_bar + 8 * c);
        ++staged;
      }
    }
  }
#else
  // Built for another architecture: the host never launches this (grouped_gemm_sm90_compiled).
  __trap();
#endif
}

// 256-wide column tiles where pick_bn prefers them and the shared memory holds them with E experts' offsets
// (a few thousand experts leave room only for the 128-wide tile's smaller staging).
int tile_bn(int N, int E) {
  if (pick_bn(N) == 256 && smem_bytes<256>(E) <= smem_optin_bytes()) return 256;
  require_smem_fits(smem_bytes<128>(E), "grouped gemm (wgmma) with " + std::to_string(E) + " experts");
  return 128;
}

template <int BN, bool B_MN, int STAGES_T = 0, bool STORE = true, bool LOAD = true>
void launch_bn(const CUtensorMap& mx, const CUtensorMap& mw, const Sm90Args& a, int64_t rows, int sm_count,
               cudaStream_t stream) {
  const int64_t max_tiles = (rows / BM + a.E) * ((a.N + BN - 1) / BN);
  if (max_tiles <= 0) return;
  const size_t smem = smem_bytes<BN, STAGES_T, STORE>(a.E);
  require_smem_fits(smem, "grouped gemm (wgmma) probe");
  auto kern = grouped_sm90_kernel<BN, B_MN, STAGES_T, STORE, LOAD>;
  MT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const int grid = static_cast<int>(std::min<int64_t>(max_tiles, std::max(sm_count, 1)));
  launch_kernel(kern, grid, THREADS, smem, stream, mx, mw, a);
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
                  std::string(op) + ": operands and output must be 16-byte aligned (TMA loads, 16-byte stores)");
}

}  // namespace

namespace detail {

namespace {
std::atomic<int> g_probe{0};  // stages | store << 8 | load << 9; 0 = no probe
}  // namespace

void grouped_gemm_sm90_probe_set(GroupedSm90Probe p) {
  g_probe.store(p.stages == 0 ? 0 : (p.stages | (p.store ? 256 : 0) | (p.load ? 512 : 0)));
}
GroupedSm90Probe grouped_gemm_sm90_probe_get() {
  const int v = g_probe.load();
  return {v & 255, (v & 256) != 0, (v & 512) != 0};
}

bool grouped_gemm_sm90_compiled() { return sm90::device_runs_sm90a<grouped_sm90_kernel<256, false>>(); }

void grouped_gemm_fwd_sm90_launch(const void* x, const void* w, void* y, const int32_t* offsets, int E, int64_t rows,
                                  int N, int K, int sm_count, cudaStream_t stream) {
  if (rows <= 0) return;  // no rows: nothing to compute (a tensor map needs non-empty dimensions)
  check_launch("grouped gemm forward (wgmma)", x, w, y, E, rows, N, K);
  const cuuint64_t xdims[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(rows)};
  const cuuint64_t xstrides[1] = {static_cast<cuuint64_t>(K) * 2};
  const cuuint64_t wdims[3] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(N), static_cast<cuuint64_t>(E)};
  const cuuint64_t wstrides[2] = {static_cast<cuuint64_t>(K) * 2, static_cast<cuuint64_t>(N) * K * 2};
  const Sm90Args a{offsets, static_cast<bf16*>(y), E, N, K};
  const CUtensorMap mx = make_map("x", x, 2, xdims, xstrides, BM);
  if (tile_bn(N, E) == 256) {
    const CUtensorMap mw = make_map("w", w, 3, wdims, wstrides, 256);
    const detail::GroupedSm90Probe pr = detail::grouped_gemm_sm90_probe_get();
    if (pr.stages == 0)
      launch_bn<256, false>(mx, mw, a, rows, sm_count, stream);
    else if (pr.stages == 2 && pr.store && pr.load)
      launch_bn<256, false, 2, true, true>(mx, mw, a, rows, sm_count, stream);
    else if (pr.stages == 2 && !pr.store && pr.load)
      launch_bn<256, false, 2, false, true>(mx, mw, a, rows, sm_count, stream);
    else if (pr.stages == 3 && !pr.store && pr.load)
      launch_bn<256, false, 3, false, true>(mx, mw, a, rows, sm_count, stream);
    else if (pr.stages == 4 && !pr.store && pr.load)
      launch_bn<256, false, 4, false, true>(mx, mw, a, rows, sm_count, stream);
    else if (pr.stages == 3 && !pr.store && !pr.load)
      launch_bn<256, false, 3, false, false>(mx, mw, a, rows, sm_count, stream);
    else if (pr.stages == 3 && pr.store && !pr.load)
      launch_bn<256, false, 3, true, false>(mx, mw, a, rows, sm_count, stream);
    else
      MT_CUDA_REQUIRE(false, "grouped gemm (wgmma): no probe build for this stage count / store / load choice");
  } else {
    const CUtensorMap mw = make_map("w", w, 3, wdims, wstrides, 128);
    launch_bn<128, false>(mx, mw, a, rows, sm_count, stream);
  }
}

void grouped_gemm_dgrad_sm90_launch(const void* dy, const void* w, void* dx, const int32_t* offsets, int E,
                                    int64_t rows, int J, int K, int sm_count, cudaStream_t stream) {
  if (rows <= 0) return;
  check_launch("grouped gemm dgrad (wgmma)", dy, w, dx, E, rows, K, J);
  // dy [rows][J] is the K-major A operand (reduction J); W [E][J][K] is read as [64 rows of J][64 of K]
  // boxes (N-major B); dx [rows][K] is the output (width K).
  const cuuint64_t ydims[2] = {static_cast<cuuint64_t>(J), static_cast<cuuint64_t>(rows)};
  const cuuint64_t ystrides[1] = {static_cast<cuuint64_t>(J) * 2};
  const cuuint64_t wdims[3] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(J), static_cast<cuuint64_t>(E)};
  const cuuint64_t wstrides[2] = {static_cast<cuuint64_t>(K) * 2, static_cast<cuuint64_t>(J) * K * 2};
  const Sm90Args a{offsets, static_cast<bf16*>(dx), E, K, J};
  const CUtensorMap my = make_map("dy", dy, 2, ydims, ystrides, BM);
  const CUtensorMap mw = make_map("w", w, 3, wdims, wstrides, BK);
  if (tile_bn(K, E) == 256)
    launch_bn<256, true>(my, mw, a, rows, sm_count, stream);
  else
    launch_bn<128, true>(my, mw, a, rows, sm_count, stream);
}

}  // namespace detail
}  // namespace mt::cuda

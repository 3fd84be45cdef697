#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/grouped_gemm_kernels.h"
#include "kernels/cuda/sm90_common.cuh"
#include "kernels/cuda/kernel_launch.cuh"

// Hopper (sm_90a) K-grouped weight gradient of the grouped expert GEMM:
//   dW_e [M][N] (+)= Σ_{rows r of expert e} dy[r][m] · x[r][n]   (+ a second row segment dy2/x2, offsets2)
// with TMA tile loads and wgmma. Both operands are MN-major in shared memory: dyᵀ is the A operand
// (M-major: a row of dy is 128 bytes of m per 64-wide chunk) and x the B operand (N-major), the reduction
// runs over the grouped rows.
//
// Same block shape as the forward (grouped_gemm_sm90.cu): warpgroup 0 produces, warpgroups 1 and 2 each
// own 64 of the tile's 128 m-rows and all BN n-columns. Tile = (expert, m-tile, n-tile), expert-major
// so concurrent tiles share the expert's rows in L2. Unlike the forward's, these tiles cost what their
// expert's row count says (1 to 51 k-steps under the bench's skewed routing), so the persistent blocks
// take them from a global counter (atomicAdd by the producer thread, handed to the consumers through a
// small ring in shared memory) instead of round-robin: a block that drew large tiles takes fewer.
// Per k-step the producer loads 64 grouped rows of dy (two [64 rows][64 m] boxes) and of x (BN / 64
// [64 rows][64 n] boxes), starting at the expert's first row: TMA has no notion of the expert boundary,
// so in the last k-step of a segment the rows past the expert's end (the next expert's rows, or zero
// fill past the tensor) are zeroed in shared memory by the consumers before the MMAs read the stage
// (generic-proxy stores, then fence.proxy.async and a barrier of the 256 consumer threads).
// Epilogue: no read-add-write round trips on the SM (those made the first version latency-bound: each
// tile waited for its dW reads). Each consumer warpgroup writes its 64 x BN accumulators, 128 bytes of
// columns (a chunk) at a time, into 128B-swizzled staging buffers and one thread hands them to TMA: a
// reduce-add into dW (cp.reduce.async.bulk.tensor .add: fp32 adds for F32 dW; for BF16 dW the sum is
// rounded to bf16 and added in bf16, as Transformers accumulates bf16 gradients), or a plain tensor store
// when overwriting. A tile whose expert has no rows in either segment adds nothing (overwrite: stores
// zeros). The staging holds a whole tile where shared memory allows (every BF16 tile; half an F32 256-wide
// tile): the consumers write their chunks, hand them over and go on to the next tile's MMAs while TMA
// drains them, instead of waiting for each 8 KiB buffer to be read (with two buffers per warpgroup the
// down / gate_up wgrad ran 9% / 3% slower: bench/NOTES.md 39).

namespace mt::cuda {

namespace {

using namespace sm90;

struct WgradArgs {
  const int32_t* offsets1;
  const int32_t* offsets2;  // null: one segment
  int* tile_counter;        // zero at launch: tiles gridDim.x, gridDim.x + 1, ... go to whoever asks first
  int E, M, N;
  bool accumulate;
  int nbuf;  // staging buffers per consumer warpgroup: 2, 4 or 8, dividing the tile's chunks
};

// Shared memory: the stages (fewer than the forward's: room for the output staging), nbuf 8 KiB staging
// buffers per consumer warpgroup, the barriers, both segments' offsets.
template <int BN, bool DW_BF16>
struct WgradCfg {
  static constexpr int STAGES = BN == 256 ? 3 : 5;
  static constexpr int B_BYTES = BN * BK * 2;
  static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
  static constexpr int PIPE_BYTES = STAGES * STAGE_BYTES;  // a multiple of 1024
  static constexpr int ESZ = DW_BF16 ? 2 : 4;
  static constexpr int CW = 128 / ESZ;                     // dW columns per chunk
  static constexpr int CHUNKS = BN / CW;                   // chunks per warpgroup and tile: 2, 4 or 8
  static constexpr int OUT_BYTES = 64 * 128;               // one staging buffer: 64 rows of 128 bytes
  static constexpr int TQ = 4;                             // tile ring slots
  static constexpr int BAR_BYTES = 2 * STAGES * 8 + 2 * TQ * 8;  // full, empty [STAGES]; tile full, empty [TQ]
  static size_t smem_bytes(int E, int nbuf) {  // + the ring's tile indices and both segments' offsets
    return 1024 + PIPE_BYTES + 2 * static_cast<size_t>(nbuf) * OUT_BYTES + BAR_BYTES +
           (TQ + 2 * static_cast<size_t>(E + 1)) * sizeof(int);
  }
};

#if MT_SM90A_DEVICE
// Zeroes rows [valid, BK) of `chunks` consecutive [BK rows][128 bytes] chunks starting at `base` (the
// swizzle only permutes 16-byte units inside a row, so a row is zeroed as a whole). 256 consumer threads.
__device__ __forceinline__ void zero_rows(unsigned char* base, int chunks, int valid, int ctid) {
  const int per_chunk = (BK - valid) * 8;  // 16-byte units
  for (int u = ctid; u < chunks * per_chunk; u += CONSUMER_THREADS) {
    const int c = u / per_chunk, v = u - c * per_chunk;
    *reinterpret_cast<uint4*>(base + c * (BK * 128) + valid * 128 + v * 16) = make_uint4(0, 0, 0, 0);
  }
}
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }

__device__ __forceinline__ void tma_reduce_add_3d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2) {
  asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
#endif

template <int BN, bool DW_BF16>
__global__ void __launch_bounds__(THREADS, 1)
    grouped_wgrad_sm90_kernel(const __grid_constant__ CUtensorMap map_dy1, const __grid_constant__ CUtensorMap map_x1,
                              const __grid_constant__ CUtensorMap map_dy2, const __grid_constant__ CUtensorMap map_x2,
                              const __grid_constant__ CUtensorMap map_dw, WgradArgs p) {
  pdl_wait();
#if MT_SM90A_DEVICE
  using Cfg = WgradCfg<BN, DW_BF16>;
  constexpr int STAGES = Cfg::STAGES;
  const int nbuf = p.nbuf;
  const int out_total = 2 * nbuf * Cfg::OUT_BYTES;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t sA = base, sB = base + STAGES * A_BYTES, sOut = base + Cfg::PIPE_BYTES;
  constexpr int TQ = Cfg::TQ;
  const uint32_t full_bar = sOut + out_total, empty_bar = full_bar + STAGES * 8;
  const uint32_t tile_full = empty_bar + STAGES * 8, tile_empty = tile_full + TQ * 8;
  int* s_tile = reinterpret_cast<int*>(smem + Cfg::PIPE_BYTES + out_total + Cfg::BAR_BYTES);  // -1: no more
  int* s_off1 = s_tile + TQ;
  int* s_off2 = s_off1 + (p.E + 1);
  const int tid = threadIdx.x;
  const bool two = p.offsets2 != nullptr;

  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, 1);
      mbar_init(empty_bar + 8 * s, CONSUMER_THREADS);
    }
    for (int s = 0; s < TQ; ++s) {
      mbar_init(tile_full + 8 * s, 1);
      mbar_init(tile_empty + 8 * s, CONSUMER_THREADS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  for (int e = tid; e <= p.E; e += THREADS) {
    s_off1[e] = p.offsets1[e];
    s_off2[e] = two ? p.offsets2[e] : 0;
  }
  __syncthreads();
  const int ntm = (p.M + BM - 1) / BM, ntn = (p.N + BN - 1) / BN;
  const int total = p.E * ntm * ntn;  // < 2^31: checked by the launcher
  // Tile t -> expert, first m, first n; the k-steps of each segment.
  struct Tile {
    int e, m0, n0, r1, c1, r2, c2, kb1, kt;  // r: first row, c: rows of segment 1 / 2
  };
  auto tile_of = [&](int t) {
    Tile x;
    const int per_e = ntm * ntn;
    x.e = t / per_e;
    const int rem = t - x.e * per_e;
    x.m0 = (rem / ntn) * BM;
    x.n0 = (rem % ntn) * BN;
    x.r1 = s_off1[x.e];
    x.c1 = s_off1[x.e + 1] - x.r1;
    x.r2 = s_off2[x.e];
    x.c2 = s_off2[x.e + 1] - x.r2;
    x.kb1 = (x.c1 + BK - 1) / BK;
    x.kt = x.kb1 + (x.c2 + BK - 1) / BK;
    return x;
  };

  if (tid < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (tid == 0) {
      tma_prefetch_map(&map_dy1);
      tma_prefetch_map(&map_x1);
      if (two) {
        tma_prefetch_map(&map_dy2);
        tma_prefetch_map(&map_x2);
      }
      int stage = 0;
      uint32_t phase = 0, handed = 0;  // handed: tiles put in the ring (slot handed % TQ)
      for (int t = blockIdx.x;; ++handed) {
        // Hand the tile (or the end, -1) to the consumers, then ask for the next one: the atomic's round
        // trip runs while this tile's loads are issued.
        const uint32_t slot = handed % TQ;
        mbar_wait(tile_empty + 8 * slot, ((handed / TQ) & 1) ^ 1);
        s_tile[slot] = t < total ? t : -1;
        mbar_arrive(tile_full + 8 * slot);
        if (t >= total) break;
        const int next = static_cast<int>(gridDim.x) + atomicAdd(p.tile_counter, 1);
        const Tile tl = tile_of(t);
        t = next;
        for (int kb = 0; kb < tl.kt; ++kb) {
          mbar_wait(empty_bar + 8 * stage, phase ^ 1);
          const uint32_t fb = full_bar + 8 * stage;
          mbar_arrive_expect_tx(fb, Cfg::STAGE_BYTES);
          const bool first = kb < tl.kb1;
          const CUtensorMap* my = first ? &map_dy1 : &map_dy2;
          const CUtensorMap* mx = first ? &map_x1 : &map_x2;
          const int row = first ? tl.r1 + kb * BK : tl.r2 + (kb - tl.kb1) * BK;
          const uint32_t a = sA + stage * A_BYTES, b = sB + stage * Cfg::B_BYTES;
#pragma unroll
          for (int j = 0; j < BM / 64; ++j) tma_load_2d(a + j * (BK * 128), my, fb, tl.m0 + 64 * j, row);
#pragma unroll
          for (int j = 0; j < BN / 64; ++j) tma_load_2d(b + j * (BK * 128), mx, fb, tl.n0 + 64 * j, row);
          if (++stage == STAGES) stage = 0, phase ^= 1;
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int ctid = tid - 128;
    const int c = ctid / 128;  // m-rows 64c .. 64c + 63 of the tile
    const int w = (ctid / 32) & 3, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const bool elected = (ctid & 127) == 0;  // issues this warpgroup's TMA stores
    float acc[BN / 2];
    int stage = 0;
    uint32_t phase = 0, taken = 0;  // taken: tiles read from the ring
    for (;; ++taken) {
      const uint32_t slot = taken % TQ;
      // A bare spin: the consumers are at ptxas's register limit here (mbar_wait's clock-bounded slow path,
      // or even an iteration count, made the 256-wide kernels spill); the stage waits below keep the trap.
      while (!mbar_try_wait(tile_full + 8 * slot, (taken / TQ) & 1)) {
      }
      const int t = s_tile[slot];
      mbar_arrive(tile_empty + 8 * slot);
      if (t < 0) break;
      const Tile tl = tile_of(t);
      // An expert without rows adds nothing, or (overwrite) stores zeros: selected in the epilogue, not by
      // zeroing acc here (a non-wgmma write of the accumulators in the tile loop made ptxas serialise every
      // wgmma of the kernel: info C7515, sessions 4 to 9).
      if (tl.kt == 0 && p.accumulate) continue;
      int prev = 0;
      for (int kb = 0; kb < tl.kt; ++kb) {
        mbar_wait(full_bar + 8 * stage, phase);
        const bool first = kb < tl.kb1;
        const int valid = first ? min(BK, tl.c1 - kb * BK) : min(BK, tl.c2 - (kb - tl.kb1) * BK);
        if (valid < BK) {  // rows past the expert's end: zero them (uniform across the consumers)
          zero_rows(smem + (sA - base) + stage * A_BYTES, BM / 64, valid, ctid);
          zero_rows(smem + (sB - base) + stage * Cfg::B_BYTES, BN / 64, valid, ctid);
          asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
          consumer_sync();
        }
        const uint64_t da = smem_desc_mn(sA + stage * A_BYTES + c * (BK * 128));
        const uint64_t db = smem_desc_mn(sB + stage * Cfg::B_BYTES);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk)
          wgmma_tile<BN, 1, 1>(acc, da + 128 * kk, db + 128 * kk, (kb | kk) != 0);  // 16 rows = 2048 bytes
        wgmma_commit();
        if (kb > 0) {
          wgmma_wait<1>();
          mbar_arrive(empty_bar + 8 * prev);
        }
        prev = stage;
        if (++stage == STAGES) stage = 0, phase ^= 1;
      }
      // Unconditional wait (a no-op without MMAs): a wgmma wait inside a branch makes ptxas serialise every
      // wgmma of the kernel (warning C7518, which the earlier versions of this kernel had; removing it
      // changed neither the bench nor the training step: the dW reduce traffic is the limit).
      wgmma_wait<0>();
      fence_regs(acc);
      if (tl.kt > 0) mbar_arrive(empty_bar + 8 * prev);

      // ---- epilogue: per warp 16 m-rows; per 8-column group j the thread holds rows g and g + 8, columns
      // 2q, 2q + 1 (accumulators 4j .. 4j + 3). Chunks of 128 bytes of columns (CW of them) go through the
      // staging buffers in rounds of nbuf: 16-byte unit u of row r sits at unit u ^ (r % 8) (the 128-byte
      // swizzle TMA reads). A round first waits until TMA has read the buffers' previous chunks (handed over
      // a tile earlier when a round is the whole tile, so normally long done).
      constexpr int ESZ = Cfg::ESZ, CW = Cfg::CW;
#pragma unroll
      for (int ch = 0; ch < Cfg::CHUNKS; ++ch) {
        const int k = ch & (nbuf - 1);  // buffer of this chunk in its round
        if (k == 0) {
          if (elected) bulk_wait_read<0>();
          warpgroup_sync(c);
        }
        const uint32_t buf = sOut + (c * nbuf + k) * Cfg::OUT_BYTES;
#pragma unroll
        for (int jj = 0; jj < CW / 8; ++jj) {
          const int j = ch * (CW / 8) + jj;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = 16 * w + g + 8 * h;
            const int byte = (8 * jj + 2 * q) * ESZ;
            const uint32_t at = buf + r * 128 + ((((byte >> 4) ^ (r & 7)) << 4) | (byte & 15));
            const float v0 = tl.kt > 0 ? acc[4 * j + 2 * h] : 0.0f, v1 = tl.kt > 0 ? acc[4 * j + 2 * h + 1] : 0.0f;
            if constexpr (DW_BF16) {
              const __nv_bfloat162 b2 = __floats2bfloat162_rn(v0, v1);
              asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(*reinterpret_cast<const uint32_t*>(&b2))
                           : "memory");
            } else {
              asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(v0), "f"(v1) : "memory");
            }
          }
        }
        if (k == nbuf - 1) {  // the round is staged: hand its chunks to TMA
          asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
          warpgroup_sync(c);
          if (elected) {
            for (int b = 0; b < nbuf; ++b) {
              const uint32_t src = sOut + (c * nbuf + b) * Cfg::OUT_BYTES;
              const int col = tl.n0 + (ch - k + b) * CW;
              if (p.accumulate)
                tma_reduce_add_3d(&map_dw, src, col, tl.m0 + 64 * c, tl.e);
              else
                tma_store_3d(&map_dw, src, col, tl.m0 + 64 * c, tl.e);
            }
            bulk_commit();
          }
        }
      }
    }
    if (elected) bulk_wait_all<0>();  // the staging buffers must outlive the reads of the last chunks
  }
#else
  __trap();  // built for another architecture: the host never launches this (grouped_gemm_sm90_compiled)
#endif
}

template <int BN, bool DW_BF16>
void launch_wgrad(const CUtensorMap* maps, WgradArgs a, int sm_count, cudaStream_t stream) {
  using Cfg = WgradCfg<BN, DW_BF16>;
  const int64_t tiles = static_cast<int64_t>(a.E) * ((a.M + BM - 1) / BM) * ((a.N + BN - 1) / BN);
  if (tiles <= 0) return;
  MT_CUDA_REQUIRE(tiles < (int64_t{1} << 30), "grouped gemm wgrad (wgmma): " + std::to_string(tiles) +
                                                  " tiles; the tile counter takes fewer than 2^30");
  // As many staging buffers as the tile has chunks where they fit (with many experts the offsets take the
  // room); two at least.
  const size_t optin = smem_optin_bytes();
  a.nbuf = Cfg::CHUNKS;
  while (a.nbuf > 2 && Cfg::smem_bytes(a.E, a.nbuf) > optin) a.nbuf /= 2;
  const size_t smem = Cfg::smem_bytes(a.E, a.nbuf);
  require_smem_fits(smem, "grouped gemm wgrad (wgmma) with " + std::to_string(a.E) + " experts");
  auto kern = grouped_wgrad_sm90_kernel<BN, DW_BF16>;
  MT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const int grid = static_cast<int>(std::min<int64_t>(tiles, std::max(sm_count, 1)));
  launch_kernel(kern, grid, THREADS, smem, stream, maps[0], maps[1], maps[2], maps[3], maps[4], a);
}

}  // namespace

namespace detail {

void grouped_gemm_wgrad_sm90_launch(const void* dy, const void* x, int64_t rows, void* dw, bool dw_bf16,
                                    const int32_t* offsets, int E, int M, int N, bool accumulate, int sm_count,
                                    int* tile_counter, cudaStream_t stream, const void* dy2, const void* x2,
                                    int64_t rows2, const int32_t* offsets2) {
  MT_CUDA_REQUIRE(grouped_gemm_sm90_compiled(),
                  "grouped gemm wgrad (wgmma): needs a cc 9.0 GPU and a build with CMAKE_CUDA_ARCHITECTURES "
                  "including 90a");
  const bool two = dy2 != nullptr;
  MT_CUDA_REQUIRE(rows < (int64_t{1} << 31) && rows2 < (int64_t{1} << 31) && E >= 1 && E <= 4096 && M % 8 == 0 &&
                      N % 8 == 0,
                  "grouped gemm wgrad (wgmma): rows must fit TMA's int32 coordinates, E in [1, 4096], M and N "
                  "multiples of 8");
  for (const void* ptr : {dy, x, dy2, x2, static_cast<const void*>(dw)})
    MT_CUDA_REQUIRE((reinterpret_cast<uintptr_t>(ptr) & 15u) == 0,
                    "grouped gemm wgrad (wgmma): operands must be 16-byte aligned (TMA)");
  // A tensor map needs non-empty dimensions: an empty segment gets a one-row map that is never read
  // (its offsets are all zero, so no k-step touches it).
  auto map2d = [](const char* what, const void* data, int64_t nrows, int width) {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(width), static_cast<cuuint64_t>(std::max<int64_t>(nrows, 1))};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(width) * 2};
    return make_map(what, data, 2, dims, strides, BK);
  };
  CUtensorMap maps[5];
  maps[0] = map2d("dy", dy, rows, M);
  maps[1] = map2d("x", x, rows, N);
  maps[2] = two ? map2d("dy2", dy2, rows2, M) : maps[0];
  maps[3] = two ? map2d("x2", x2, rows2, N) : maps[1];
  const int esz = dw_bf16 ? 2 : 4;
  const cuuint64_t wdims[3] = {static_cast<cuuint64_t>(N), static_cast<cuuint64_t>(M), static_cast<cuuint64_t>(E)};
  const cuuint64_t wstrides[2] = {static_cast<cuuint64_t>(N) * esz, static_cast<cuuint64_t>(M) * N * esz};
  maps[4] = make_map("dw", dw, 3, wdims, wstrides, 64, /*f32=*/!dw_bf16);
  const WgradArgs a{offsets, two ? offsets2 : nullptr, tile_counter, E, M, N, accumulate, /*nbuf: launch_wgrad*/ 0};
  const bool wide = pick_bn(N) == 256;
  if (dw_bf16)
    wide ? launch_wgrad<256, true>(maps, a, sm_count, stream) : launch_wgrad<128, true>(maps, a, sm_count, stream);
  else
    wide ? launch_wgrad<256, false>(maps, a, sm_count, stream) : launch_wgrad<128, false>(maps, a, sm_count, stream);
}

}  // namespace detail
}  // namespace mt::cuda

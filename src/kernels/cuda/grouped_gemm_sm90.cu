#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes through the runtime (no libcuda link)
#include <cuda_bf16.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/grouped_gemm_kernels.h"
#include "kernels/cuda/grouped_schedule.cuh"

// Hopper (sm_90a) M-grouped forward of the grouped expert GEMM: y rows of expert e = x rows of e · W_eᵀ,
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
//                (wait_group 1) its stage is handed back through empty[s].
// Stage/phase bookkeeping: producer and consumers walk the same (tile, k-step) sequence, so both keep a
// running stage index and a phase bit that flips each time the index wraps; the producer waits for
// empty[s] to complete the phase before the one it will fill (parity ^ 1: the first pass never blocks).
// Rows: x is one 2-D map over the grouped rows; a tile's last rows may belong to the next expert (or be
// zero-filled past the tensor): they are computed and never stored. W is a 3-D map [E][Nout][K], so
// n-tiles past Nout read zeros, never the next expert.

namespace mt::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int BM = 128, BK = 64;
constexpr int THREADS = 384;  // warpgroup 0 produces, 1 and 2 consume
constexpr int A_BYTES = BM * BK * 2;  // one x stage: 128 rows of 128 bytes

template <int BN>
struct TileCfg {
  static constexpr int STAGES = BN == 256 ? 4 : 6;  // ~192 KiB of stages either way
  static constexpr int B_BYTES = BN * BK * 2;
  static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
  static constexpr int PIPE_BYTES = STAGES * STAGE_BYTES;
  static constexpr int BAR_BYTES = 2 * STAGES * 8;  // full[STAGES], empty[STAGES] mbarriers
  static_assert(BN == 128 || BN == 256, "wgmma tile width");
};

// Dynamic shared memory: 1 KiB of slack to align the stages to 1024 bytes (the 128-byte swizzle
// pattern repeats every 8 rows of 128 bytes; TMA and wgmma both assume the atom starts 1024-aligned),
// the stages, the barriers, then offsets[E + 1] and the m-tile prefix [E + 1].
template <int BN>
size_t smem_bytes(int E) {
  return 1024 + TileCfg<BN>::PIPE_BYTES + TileCfg<BN>::BAR_BYTES + 2 * static_cast<size_t>(E + 1) * sizeof(int);
}

struct Sm90Args {
  const int32_t* offsets;
  bf16* y;
  int E, N, K;  // N = Nout (columns of y, rows of W_e)
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MT_SM90A_DEVICE 1
#else
#define MT_SM90A_DEVICE 0
#endif

#if MT_SM90A_DEVICE

constexpr int CONSUMER_THREADS = 256;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier (shared::cta, 64-bit) ----
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Producer: one arrival plus the number of bytes the TMA loads of this phase will deliver.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// A wait that has not completed after ~10 s (2e10 clocks) is a pipeline bug (byte count or phase): trap
// (the launch fails with an unspecified launch failure) instead of hanging the GPU. No printf here: a
// call inside the kernel makes ptxas serialize the wgmma pipeline and ignore setmaxnreg.
__device__ __forceinline__ void mbar_wait_slow(uint32_t bar, uint32_t parity) {
  const long long t0 = clock64();
  while (!mbar_try_wait(bar, parity))
    if (clock64() - t0 > 20000000000LL) __trap();
}
// Returns once the phase with parity `parity` has completed (a fresh barrier is in phase 0, so
// waiting for parity 1 returns at once).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  if (!mbar_try_wait(bar, parity)) mbar_wait_slow(bar, parity);
}

// ---- TMA: tile loads completing on an mbarrier (coordinates innermost first, in elements) ----
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                            int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---- wgmma ----
// Shared-memory matrix descriptor of a K-major operand tile stored as rows of 64 bf16 (128 bytes) with
// the 128-byte swizzle, as TMA writes it: start address >> 4 (bits 0-13), leading byte offset (bits
// 16-29; unused for swizzled K-major, set to 1 by convention), stride byte offset = 1024 >> 4 (bits
// 32-45: 8 rows of 128 bytes between core-matrix groups along M/N), base offset 0 (bits 49-51; the tile
// is 1024-aligned), swizzle mode 1 = 128B (bits 62-63). Advancing k by 16 elements = +32 bytes = +2 in
// the address field (the hardware applies the XOR pattern on the absolute address bits).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}
// Descriptor of an MN-major (N-major) B tile, as the dgrad's W tile is stored: BN / 64 column chunks, each
// BK rows (the reduction index) of 64 bf16 (128 bytes, n contiguous), 128-byte swizzled as TMA writes
// them. For MN-major swizzled layouts the leading byte offset is the stride between 64-wide chunks
// along N (BK * 128 bytes) and the stride byte offset the stride between groups of 8 rows along K
// (1024 bytes). Advancing k by 16 rows = +2048 bytes = +128 in the address field.
__device__ __forceinline__ uint64_t smem_desc_mn(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((BK * 128) >> 4) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across wgmma waits.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d[64] += A (64x16, smem desc) · B (128x16, smem desc)ᵀ; scale_d == 0 ignores d (first k-step of a tile).
// TRANS_B = 1: B is stored N-major (rows of k, n contiguous) instead of K-major.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, %67;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

// d[128] += A (64x16, smem desc) · B (256x16, smem desc)ᵀ; scale_d == 0 ignores d (first k-step of a tile).
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, %131;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

template <int BN, bool B_MN>
__device__ __forceinline__ void wgmma_tile(float (&d)[BN / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  if constexpr (BN == 256)
    wgmma_m64n256k16<B_MN ? 1 : 0>(d, desc_a, desc_b, scale_d);
  else
    wgmma_m64n128k16<B_MN ? 1 : 0>(d, desc_a, desc_b, scale_d);
}

#endif  // MT_SM90A_DEVICE

// B_MN = false: forward, the W_e tile is [BN rows of Nout][64 k] (K-major, one TMA box).
// B_MN = true: dgrad (dx = dy · W_e: the reduction runs over W's rows), the tile is [64 rows of the
// reduction][BN columns] loaded as BN / 64 boxes of [64][64] (N-major B, wgmma's transposed-B form).
template <int BN, bool B_MN>
__global__ void __launch_bounds__(THREADS, 1)
    grouped_sm90_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                            Sm90Args p) {
#if MT_SM90A_DEVICE
  using Cfg = TileCfg<BN>;
  constexpr int STAGES = Cfg::STAGES;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t sA = base, sB = base + STAGES * A_BYTES;
  const uint32_t full_bar = base + Cfg::PIPE_BYTES, empty_bar = full_bar + STAGES * 8;
  int* s_off = reinterpret_cast<int*>(smem + Cfg::PIPE_BYTES + Cfg::BAR_BYTES);
  int* s_tiles = s_off + (p.E + 1);
  const int tid = threadIdx.x;

  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, 1);                  // the producer's arrive.expect_tx
      mbar_init(empty_bar + 8 * s, CONSUMER_THREADS);  // every consumer thread, once per k-step
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
    uint32_t phase = 0;
    for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
      const GroupedTile tp = grouped_tile<BM, BN>(t, ntn, s_off, s_tiles, p.E);
      int prev = 0;
      for (int kb = 0; kb < KT; ++kb) {
        mbar_wait(full_bar + 8 * stage, phase);
        const uint64_t da = smem_desc(sA + stage * A_BYTES + c * 64 * 128);
        const uint64_t db = B_MN ? smem_desc_mn(sB + stage * Cfg::B_BYTES) : smem_desc(sB + stage * Cfg::B_BYTES);
        constexpr int b_step = B_MN ? (16 * 128) >> 4 : 2;  // 16 rows of 128 bytes, or 32 bytes along a row
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk)
          wgmma_tile<BN, B_MN>(acc, da + 2 * kk, db + b_step * kk, (kb | kk) != 0);
        wgmma_commit();
        if (kb > 0) {  // the previous step's MMAs are done reading their stage
          wgmma_wait<1>();
          mbar_arrive(empty_bar + 8 * prev);
        }
        prev = stage;
        if (++stage == STAGES) stage = 0, phase ^= 1;
      }
      wgmma_wait<0>();
      fence_regs(acc);
      mbar_arrive(empty_bar + 8 * prev);

      // ---- epilogue: accumulator fragment (per warp 16 rows; per 8-column group j the thread holds
      // rows g and g + 8, columns 2q, 2q + 1) -> bf16 pairs, stored only inside the expert's rows and Nout.
      const int r = tp.row0 + 64 * c + 16 * w + g;
      const bool ok0 = r < tp.row_end, ok1 = r + 8 < tp.row_end;
      const int64_t at0 = static_cast<int64_t>(r) * p.N, at1 = at0 + 8 * static_cast<int64_t>(p.N);
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int col = tp.n0 + 8 * j + 2 * q;  // Nout % 8 == 0: col < Nout implies col + 1 < Nout
        if (col < p.N) {
          if (ok0)
            *reinterpret_cast<__nv_bfloat162*>(p.y + at0 + col) = __floats2bfloat162_rn(acc[4 * j], acc[4 * j + 1]);
          if (ok1)
            *reinterpret_cast<__nv_bfloat162*>(p.y + at1 + col) =
                __floats2bfloat162_rn(acc[4 * j + 2], acc[4 * j + 3]);
        }
      }
    }
  }
#else
  // Built for another architecture: the host never launches this (grouped_gemm_sm90_compiled).
  __trap();
#endif
}

// ---- host ----

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    MT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    MT_CUDA_REQUIRE(q == cudaDriverEntryPointSuccess && f != nullptr,
                    "grouped gemm (wgmma): the driver has no cuTensorMapEncodeTiled (needs a CUDA 12+ driver)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// Row-major bf16 tensor of `rank` dims (dims innermost first), box {64, box_rows, 1...}, 128-byte swizzle,
// zero fill out of bounds.
CUtensorMap make_map(const char* what, const void* data, int rank, const cuuint64_t* dims, const cuuint64_t* strides,
                     cuuint32_t box_rows) {
  CUtensorMap m;
  const cuuint32_t box[3] = {BK, box_rows, 1}, estride[3] = {1, 1, 1};
  const CUresult r = tensor_map_encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<void*>(data), dims,
                                          strides, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MT_CUDA_REQUIRE(r == CUDA_SUCCESS, std::string("grouped gemm (wgmma): cuTensorMapEncodeTiled failed for ") + what +
                                         " (CUresult " + std::to_string(static_cast<int>(r)) + ")");
  return m;
}

// Column tile width: the one with fewer padded columns, 256 on a tie (fewer x re-reads per output).
// MIXTUNE_WGMMA_BN=128|256 forces one (read once; for measuring).
int pick_bn(int N) {
  static const int forced = [] {
    const char* e = std::getenv("MIXTUNE_WGMMA_BN");
    return e ? std::atoi(e) : 0;
  }();
  if (forced == 128 || forced == 256) return forced;
  const int64_t pad256 = (N + 255) / 256 * 256, pad128 = (N + 127) / 128 * 128;
  return pad256 <= pad128 ? 256 : 128;
}

template <int BN, bool B_MN>
void launch_bn(const CUtensorMap& mx, const CUtensorMap& mw, const Sm90Args& a, int64_t rows, int sm_count,
               cudaStream_t stream) {
  const int64_t max_tiles = (rows / BM + a.E) * ((a.N + BN - 1) / BN);
  if (max_tiles <= 0) return;
  const size_t smem = smem_bytes<BN>(a.E);
  auto kern = grouped_sm90_kernel<BN, B_MN>;
  MT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const int grid = static_cast<int>(std::min<int64_t>(max_tiles, std::max(sm_count, 1)));
  kern<<<grid, THREADS, smem, stream>>>(mx, mw, a);
  MT_CUDA_CHECK_LAUNCH();
}

// The checks both launchers share (TMA: int32 coordinates, 16-byte aligned global addresses).
void check_launch(const char* op, const void* a, const void* w, int E, int64_t rows, int N, int K) {
  MT_CUDA_REQUIRE(detail::grouped_gemm_sm90_compiled(), std::string(op) +
                                                             ": needs a cc 9.0 GPU and a build with "
                                                             "CMAKE_CUDA_ARCHITECTURES including 90a");
  MT_CUDA_REQUIRE(rows < (int64_t{1} << 31) && E >= 1 && E <= 4096 && N % 8 == 0 && K % 8 == 0,
                  std::string(op) + ": rows must fit TMA's int32 coordinates, E in [1, 4096], both widths "
                                    "multiples of 8");
  MT_CUDA_REQUIRE((reinterpret_cast<uintptr_t>(a) & 15u) == 0 && (reinterpret_cast<uintptr_t>(w) & 15u) == 0,
                  std::string(op) + ": operands must be 16-byte aligned (TMA)");
}

}  // namespace

namespace detail {

bool grouped_gemm_sm90_compiled() {
  // The binary the current device would run: 90 only when an sm_90a cubin was built and the device is
  // cc 9.0 (any other GPU runs the sm_80 build, whose body traps). Cached per device.
  constexpr int MAX_DEVICES = 64;
  static std::atomic<int> cached[MAX_DEVICES];  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (dev >= 0 && dev < MAX_DEVICES && cached[dev].load() != 0) return cached[dev].load() == 1;
  cudaFuncAttributes attr{};
  bool ok = false;
  if (cudaFuncGetAttributes(&attr, grouped_sm90_kernel<256, false>) == cudaSuccess)
    ok = attr.binaryVersion == 90;
  else
    (void)cudaGetLastError();  // clear this call's error only
  if (dev >= 0 && dev < MAX_DEVICES) cached[dev].store(ok ? 1 : 2);
  return ok;
}

void grouped_gemm_fwd_sm90_launch(const void* x, const void* w, void* y, const int32_t* offsets, int E, int64_t rows,
                                  int N, int K, int sm_count, cudaStream_t stream) {
  if (rows <= 0) return;  // no rows: nothing to compute (a tensor map needs non-empty dimensions)
  check_launch("grouped gemm forward (wgmma)", x, w, E, rows, N, K);
  const cuuint64_t xdims[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(rows)};
  const cuuint64_t xstrides[1] = {static_cast<cuuint64_t>(K) * 2};
  const cuuint64_t wdims[3] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(N), static_cast<cuuint64_t>(E)};
  const cuuint64_t wstrides[2] = {static_cast<cuuint64_t>(K) * 2, static_cast<cuuint64_t>(N) * K * 2};
  const Sm90Args a{offsets, static_cast<bf16*>(y), E, N, K};
  const CUtensorMap mx = make_map("x", x, 2, xdims, xstrides, BM);
  if (pick_bn(N) == 256) {
    const CUtensorMap mw = make_map("w", w, 3, wdims, wstrides, 256);
    launch_bn<256, false>(mx, mw, a, rows, sm_count, stream);
  } else {
    const CUtensorMap mw = make_map("w", w, 3, wdims, wstrides, 128);
    launch_bn<128, false>(mx, mw, a, rows, sm_count, stream);
  }
}

void grouped_gemm_dgrad_sm90_launch(const void* dy, const void* w, void* dx, const int32_t* offsets, int E,
                                    int64_t rows, int J, int K, int sm_count, cudaStream_t stream) {
  if (rows <= 0) return;
  check_launch("grouped gemm dgrad (wgmma)", dy, w, E, rows, K, J);
  // dy [rows][J] is the K-major A operand (reduction J); W [E][J][K] is read as [64 rows of J][64 of K]
  // boxes (N-major B); dx [rows][K] is the output (width K).
  const cuuint64_t ydims[2] = {static_cast<cuuint64_t>(J), static_cast<cuuint64_t>(rows)};
  const cuuint64_t ystrides[1] = {static_cast<cuuint64_t>(J) * 2};
  const cuuint64_t wdims[3] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(J), static_cast<cuuint64_t>(E)};
  const cuuint64_t wstrides[2] = {static_cast<cuuint64_t>(K) * 2, static_cast<cuuint64_t>(J) * K * 2};
  const Sm90Args a{offsets, static_cast<bf16*>(dx), E, K, J};
  const CUtensorMap my = make_map("dy", dy, 2, ydims, ystrides, BM);
  const CUtensorMap mw = make_map("w", w, 3, wdims, wstrides, BK);
  if (pick_bn(K) == 256)
    launch_bn<256, true>(my, mw, a, rows, sm_count, stream);
  else
    launch_bn<128, true>(my, mw, a, rows, sm_count, stream);
}

}  // namespace detail
}  // namespace mt::cuda

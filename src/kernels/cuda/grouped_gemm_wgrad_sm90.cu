#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/grouped_gemm_kernels.h"
#include "kernels/cuda/sm90_common.cuh"

// Hopper (sm_90a) K-grouped weight gradient of the grouped expert GEMM:
//   dW_e [M][N] (+)= Σ_{rows r of expert e} dy[r][m] · x[r][n]   (+ a second row segment dy2/x2, offsets2)
// with TMA tile loads and wgmma. Both operands are MN-major in shared memory: dyᵀ is the A operand
// (M-major: a row of dy is 128 bytes of m per 64-wide chunk) and x the B operand (N-major), the reduction
// runs over the grouped rows.
//
// Same block shape as the forward (grouped_gemm_sm90.cu): warpgroup 0 produces, warpgroups 1 and 2 each
// own 64 of the tile's 128 m-rows and all BN n-columns. Tile = (expert, m-tile, n-tile), expert-major
// so concurrent tiles share the expert's rows in L2; persistent blocks take tiles round-robin.
// Per k-step the producer loads 64 grouped rows of dy (two [64 rows][64 m] boxes) and of x (BN / 64
// [64 rows][64 n] boxes), starting at the expert's first row: TMA has no notion of the expert boundary,
// so in the last k-step of a segment the rows past the expert's end (the next expert's rows, or zero
// fill past the tensor) are zeroed in shared memory by the consumers before the MMAs read the stage
// (generic-proxy stores, then fence.proxy.async and a barrier of the 256 consumer threads).
// Epilogue: the fp32 accumulators are added to dW (F32, or BF16 rounded once) or overwrite it, with
// 16-byte accesses after a transpose inside each quad of lanes; a tile whose expert has no rows in either
// segment adds nothing (overwrite: writes zeros).

namespace mt::cuda {

namespace {

using namespace sm90;

struct WgradArgs {
  const int32_t* offsets1;
  const int32_t* offsets2;  // null: one segment
  void* dw;
  int E, M, N;
  bool accumulate, dw_bf16;
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

// Quad transpose: lane q of a quad holds, for column groups j0 .. j0 + 3, the float2 at columns 2q, 2q + 1
// of row half h (accumulator elements 4j + 2h, 4j + 2h + 1); afterwards out[0..7] are columns 0..7 of group
// j0 + q. Step s: every lane sends its pair of group j0 + ((q + s) & 3) and receives, from lane
// (q - s) & 3, that lane's pair of group j0 + q (columns 2((q - s) & 3), +1).
template <int R>
__device__ __forceinline__ void quad_transpose(const float (&acc)[R], int j0, int h, int q, int lane, float (&out)[8]) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const int send = (q + s) & 3, from = (q - s) & 3;
    float x = 0.0f, y = 0.0f;
#pragma unroll
    for (int t = 0; t < 4; ++t)
      if (send == t) x = acc[4 * (j0 + t) + 2 * h], y = acc[4 * (j0 + t) + 2 * h + 1];
    x = __shfl_sync(0xffffffffu, x, (lane & ~3) | from);
    y = __shfl_sync(0xffffffffu, y, (lane & ~3) | from);
#pragma unroll
    for (int t = 0; t < 4; ++t)
      if (from == t) out[2 * t] = x, out[2 * t + 1] = y;
  }
}

// 8 consecutive dW elements at `at` (16-byte aligned): one 16-byte access for BF16, two for F32.
__device__ __forceinline__ void load8(const void* dw, bool bf16_dw, int64_t at, float (&v)[8]) {
  if (bf16_dw) {
    const uint4 r = *reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(dw) + at);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
  } else {
    const float4* d = reinterpret_cast<const float4*>(static_cast<const float*>(dw) + at);
    const float4 a = d[0], b = d[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
}
__device__ __forceinline__ void store8(void* dw, bool bf16_dw, int64_t at, const float (&v)[8]) {
  if (bf16_dw) {
    uint4 r;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(dw) + at) = r;
  } else {
    float4* d = reinterpret_cast<float4*>(static_cast<float*>(dw) + at);
    d[0] = make_float4(v[0], v[1], v[2], v[3]);
    d[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}
#endif

template <int BN>
__global__ void __launch_bounds__(THREADS, 1)
    grouped_wgrad_sm90_kernel(const __grid_constant__ CUtensorMap map_dy1, const __grid_constant__ CUtensorMap map_x1,
                              const __grid_constant__ CUtensorMap map_dy2, const __grid_constant__ CUtensorMap map_x2,
                              WgradArgs p) {
#if MT_SM90A_DEVICE
  using Cfg = TileCfg<BN>;
  constexpr int STAGES = Cfg::STAGES;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t sA = base, sB = base + STAGES * A_BYTES;
  const uint32_t full_bar = base + Cfg::PIPE_BYTES, empty_bar = full_bar + STAGES * 8;
  int* s_off1 = reinterpret_cast<int*>(smem + Cfg::PIPE_BYTES + Cfg::BAR_BYTES);
  int* s_off2 = s_off1 + (p.E + 1);
  const int tid = threadIdx.x;
  const bool two = p.offsets2 != nullptr;

  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, 1);
      mbar_init(empty_bar + 8 * s, CONSUMER_THREADS);
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
  const int64_t total = static_cast<int64_t>(p.E) * ntm * ntn;
  // Tile t -> expert, first m, first n; the k-steps of each segment.
  struct Tile {
    int e, m0, n0, r1, c1, r2, c2, kb1, kt;  // r: first row, c: rows of segment 1 / 2
  };
  auto tile_of = [&](int64_t t) {
    Tile x;
    const int per_e = ntm * ntn;
    x.e = static_cast<int>(t / per_e);
    const int rem = static_cast<int>(t - static_cast<int64_t>(x.e) * per_e);
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
      uint32_t phase = 0;
      for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
        const Tile tl = tile_of(t);
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
    float acc[BN / 2];
    int stage = 0;
    uint32_t phase = 0;
    for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
      const Tile tl = tile_of(t);
      if (tl.kt == 0) {
        if (p.accumulate) continue;  // nothing to add
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
      }
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
      if (tl.kt > 0) {
        wgmma_wait<0>();
        fence_regs(acc);
        mbar_arrive(empty_bar + 8 * prev);
      }

      // ---- epilogue: per warp 16 m-rows; per 8-column group j the thread holds rows g and g + 8, columns
      // 2q, 2q + 1. A 4 x 4 transpose of float2 inside each quad of lanes turns four groups j0 .. j0 + 3
      // into 8 contiguous columns per thread (group j0 + q), so the read-add-write of dW moves 16- or
      // 32-byte vectors and each row segment a warp touches is whole sectors. U quads of groups per round:
      // their loads issue together (U = 2 spills at BN = 256).
      const int m = tl.m0 + 64 * c + 16 * w + g;
      const int64_t at[2] = {(static_cast<int64_t>(tl.e) * p.M + m) * p.N,
                             (static_cast<int64_t>(tl.e) * p.M + m + 8) * p.N};
      const bool ok[2] = {m < p.M, m + 8 < p.M};
      constexpr int U = BN == 256 ? 1 : 2;
#pragma unroll
      for (int j0 = 0; j0 < BN / 8; j0 += 4 * U) {
        float v[U][2][8];  // [quad of groups][row half][8 columns]
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int h = 0; h < 2; ++h) quad_transpose(acc, j0 + 4 * u, h, q, lane, v[u][h]);
        float old[U][2][8];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int col = tl.n0 + 8 * (j0 + 4 * u + q);  // N % 8 == 0: the 8 columns are all in or all out
#pragma unroll
            for (int i = 0; i < 8; ++i) old[u][h][i] = 0.0f;
            if (p.accumulate && ok[h] && col < p.N) load8(p.dw, p.dw_bf16, at[h] + col, old[u][h]);
          }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int col = tl.n0 + 8 * (j0 + 4 * u + q);
            if (!ok[h] || col >= p.N) continue;
#pragma unroll
            for (int i = 0; i < 8; ++i) v[u][h][i] += old[u][h][i];
            store8(p.dw, p.dw_bf16, at[h] + col, v[u][h]);
          }
      }
    }
  }
#else
  __trap();  // built for another architecture: the host never launches this (grouped_gemm_sm90_compiled)
#endif
}

template <int BN>
void launch_wgrad(const CUtensorMap* maps, const WgradArgs& a, int sm_count, cudaStream_t stream) {
  const int64_t tiles = static_cast<int64_t>(a.E) * ((a.M + BM - 1) / BM) * ((a.N + BN - 1) / BN);
  if (tiles <= 0) return;
  const size_t smem = smem_bytes<BN>(a.E);
  auto kern = grouped_wgrad_sm90_kernel<BN>;
  MT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const int grid = static_cast<int>(std::min<int64_t>(tiles, std::max(sm_count, 1)));
  kern<<<grid, THREADS, smem, stream>>>(maps[0], maps[1], maps[2], maps[3], a);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace detail {

void grouped_gemm_wgrad_sm90_launch(const void* dy, const void* x, int64_t rows, void* dw, bool dw_bf16,
                                    const int32_t* offsets, int E, int M, int N, bool accumulate, int sm_count,
                                    cudaStream_t stream, const void* dy2, const void* x2, int64_t rows2,
                                    const int32_t* offsets2) {
  MT_CUDA_REQUIRE(grouped_gemm_sm90_compiled(),
                  "grouped gemm wgrad (wgmma): needs a cc 9.0 GPU and a build with CMAKE_CUDA_ARCHITECTURES "
                  "including 90a");
  const bool two = dy2 != nullptr;
  MT_CUDA_REQUIRE(rows < (int64_t{1} << 31) && rows2 < (int64_t{1} << 31) && E >= 1 && E <= 4096 && M % 8 == 0 &&
                      N % 8 == 0,
                  "grouped gemm wgrad (wgmma): rows must fit TMA's int32 coordinates, E in [1, 4096], M and N "
                  "multiples of 8");
  for (const void* ptr : {dy, x, dy2, x2})
    MT_CUDA_REQUIRE((reinterpret_cast<uintptr_t>(ptr) & 15u) == 0,
                    "grouped gemm wgrad (wgmma): operands must be 16-byte aligned (TMA)");
  // A tensor map needs non-empty dimensions: an empty segment gets a one-row map that is never read
  // (its offsets are all zero, so no k-step touches it).
  auto map2d = [](const char* what, const void* data, int64_t nrows, int width) {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(width), static_cast<cuuint64_t>(std::max<int64_t>(nrows, 1))};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(width) * 2};
    return make_map(what, data, 2, dims, strides, BK);
  };
  CUtensorMap maps[4];
  maps[0] = map2d("dy", dy, rows, M);
  maps[1] = map2d("x", x, rows, N);
  maps[2] = two ? map2d("dy2", dy2, rows2, M) : maps[0];
  maps[3] = two ? map2d("x2", x2, rows2, N) : maps[1];
  const WgradArgs a{offsets, two ? offsets2 : nullptr, dw, E, M, N, accumulate, dw_bf16};
  if (pick_bn(N) == 256)
    launch_wgrad<256>(maps, a, sm_count, stream);
  else
    launch_wgrad<128>(maps, a, sm_count, stream);
}

}  // namespace detail
}  // namespace mt::cuda

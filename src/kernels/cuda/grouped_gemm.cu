#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/grouped_gemm_kernels.h"
#include "kernels/cuda/grouped_schedule.cuh"
#include "kernels/cuda/mma_sm80.cuh"
#include "kernels/cuda/kernel_launch.cuh"

// Grouped expert GEMM: a templated M-grouped kernel (forward, dgrad) and a K-grouped one (wgrad) for the
// three products of an expert layer (NOTES.md, "Grouped expert GEMM"). The logical product is C[m][n] = Σ_k A(m, k) · B(n, k):
//   Fwd   (M-grouped): A = X rows of expert e [rows][K]   B = W_e [N][K]           C = Y rows [rows][N] bf16
//   Dgrad (M-grouped): A = dY rows [rows][J]             B = W_e [J][N] (k = j)   C = dX rows [rows][N] bf16
//   Wgrad (K-grouped): A = dY rows, read as [k = row][m]  B = X rows [k = row][n]  C = dW_e [M][N] fp32|bf16 (+=)
// Tiles BM x BN x BK with a cp.async multi-stage pipeline into XOR-swizzled shared memory, ldmatrix
// (.trans where the operand is stored k-major-by-rows) and mma.sync m16n8k16. The grid is persistent:
// each block reads the device offsets, builds the (expert, m-tile, n-tile) schedule in shared memory and
// strides over it, so token counts never travel to the host and empty experts cost nothing.

namespace mt::cuda {

namespace {

using mma::bf16;

// NOTE: one configuration for all three modes (the Qwen3-30B-A3B shapes are multiples of 128 and the
// expert row counts average a few hundred). 8 warps as 2 (m) x 4 (n), warp tile 64 x 32.
constexpr int BM = 128, BN = 128, BK = 64, STAGES = 3;
// Blocks per SM the compiler must fit. Measured on an H200 (bench/grouped_gemm_bench.cpp): the
// M-grouped products run best with one block (~220 registers, no spills), the K-grouped wgrad with two
// (registers capped at 128, a few bytes of spills): its tiles are short (a few hundred rows of
// reduction) and end in an fp32 read-add-write, which a second resident block overlaps.
#ifndef MT_GROUPED_GEMM_MIN_BLOCKS
#define MT_GROUPED_GEMM_MIN_BLOCKS 1
#endif
#ifndef MT_GROUPED_GEMM_WGRAD_MIN_BLOCKS
#define MT_GROUPED_GEMM_WGRAD_MIN_BLOCKS 2
#endif
constexpr int WARPS_M = 2, WARPS_N = 4, THREADS = WARPS_M * WARPS_N * 32;
constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N, MI = WTM / 16, NI = WTN / 8;
constexpr int A_STAGE = BM * BK, B_STAGE = BN * BK;  // elements per stage
constexpr int PIPE_BYTES = STAGES * (A_STAGE + B_STAGE) * 2;
constexpr int C_PAD = 8;  // staging row padding (elements): conflict-free fragment writes
static_assert(BM * (BN + C_PAD) * 4 <= PIPE_BYTES, "fp32 epilogue staging must fit in the pipeline buffers");
static_assert(BK % 64 == 0 && BM % 64 == 0 && BN % 64 == 0, "swizzle needs rows of >= 8 16-byte chunks");

enum class Mode { Fwd, Dgrad, Wgrad };

struct Problem {
  const bf16* A;
  int64_t lda;
  const bf16* B;
  int64_t ldb, b_stride;  // b_stride: elements between experts' B (Fwd/Dgrad), 0 for Wgrad
  void* C;
  int64_t ldc, c_stride;  // c_stride: elements between experts' C (Wgrad)
  const int32_t* offsets;
  int E, M, N, K;  // Fwd/Dgrad: N, K (rows come from offsets). Wgrad: M, N (reduction rows from offsets)
  bool accumulate;
  bool c_bf16;     // Wgrad: C is BF16 (the sum taken in fp32, rounded once per call) instead of F32
  // Wgrad with a second segment (two micro-batches reduced in one dW pass): its own rows and offsets,
  // same lda/ldb. A2 == nullptr: one segment.
  const bf16* A2 = nullptr;
  const bf16* B2 = nullptr;
  const int32_t* offsets2 = nullptr;
};

// Copies a rows x (chunks·8) tile into swizzled shared memory; rows >= row_lim or columns >= col_lim
// are zero-filled. g points at the tile's (row 0, column col0).
template <int ROWS, int CHUNKS>
__device__ __forceinline__ void load_tile(uint32_t s, const bf16* g, int64_t ld, int row_lim, int col0, int col_lim) {
  constexpr int TOTAL = ROWS * CHUNKS;
  static_assert(TOTAL % THREADS == 0, "tile chunks must split evenly over the threads");
#pragma unroll
  for (int it = 0; it < TOTAL / THREADS; ++it) {
    const int idx = it * THREADS + threadIdx.x;
    const int i = idx / CHUNKS, c = idx % CHUNKS;
    const bool valid = i < row_lim && col0 + c * 8 < col_lim;
    const bf16* src = valid ? g + i * ld + c * 8 : g;
    mma::cp_async_16(s + mma::swz(i, c * 8, CHUNKS), src, valid);
  }
}

// One pipeline stage's MMAs into the warp's 64x32 accumulator tile: BK/16 steps of ldmatrix + mma.sync.
// A_TRANS: A is stored [k][m] in shared memory (wgrad) rather than [m][k]; B_K: B is stored [n][k] (forward)
// rather than [k][n].
template <bool A_TRANS, bool B_K>
__device__ __forceinline__ void mma_stage(float (&acc)[MI][NI][4], uint32_t sA, uint32_t sB, int wm0, int wn0,
                                          int lane) {
  const int mi_ = lane >> 3;
#pragma unroll
  for (int kk = 0; kk < BK / 16; ++kk) {
    uint32_t a[MI][4], b[NI][2];
#pragma unroll
    for (int i = 0; i < MI; ++i) {
      if constexpr (A_TRANS)
        mma::ldmatrix_x4_trans(
            a[i], sA + mma::swz(kk * 16 + (mi_ >> 1) * 8 + (lane & 7), wm0 + 16 * i + (mi_ & 1) * 8, BM / 8));
      else
        mma::ldmatrix_x4(a[i], sA + mma::swz(wm0 + 16 * i + (lane & 15), kk * 16 + (lane >> 4) * 8, BK / 8));
    }
#pragma unroll
    for (int j = 0; j < NI / 2; ++j) {
      uint32_t r[4];
      if constexpr (B_K)
        mma::ldmatrix_x4(r, sB + mma::swz(wn0 + 16 * j + (mi_ >> 1) * 8 + (lane & 7), kk * 16 + (mi_ & 1) * 8, BK / 8));
      else
        mma::ldmatrix_x4_trans(
            r, sB + mma::swz(kk * 16 + (mi_ & 1) * 8 + (lane & 7), wn0 + 16 * j + (mi_ >> 1) * 8, BN / 8));
      b[2 * j][0] = r[0], b[2 * j][1] = r[1], b[2 * j + 1][0] = r[2], b[2 * j + 1][1] = r[3];
    }
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j) mma::mma_16816(acc[i][j], a[i], b[j][0], b[j][1]);
  }
}

// M-grouped products (forward, dgrad): rows of the grouped layout, tiles of BM rows inside one expert.
template <Mode MODE>
__global__ void __launch_bounds__(THREADS, MT_GROUPED_GEMM_MIN_BLOCKS) grouped_gemm_kernel(Problem p) {
  pdl_wait();
  static_assert(MODE != Mode::Wgrad, "the K-grouped wgrad has its own kernel");
  constexpr bool B_K = MODE == Mode::Fwd;  // B stored [n][k] (else [k][n]); A is always [m][k]
  extern __shared__ __align__(128) unsigned char smem[];
  int* s_off = reinterpret_cast<int*>(smem + PIPE_BYTES);  // [E + 1] offsets
  int* s_tiles = s_off + (p.E + 1);                        // [E + 1] m-tile prefix (M-grouped)
  const uint32_t sbase = mma::smem_u32(smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm0 = (warp / WARPS_N) * WTM, wn0 = (warp % WARPS_N) * WTN;

  // ---- schedule: offsets into shared memory, and the exclusive prefix of m-tiles.
  grouped_schedule_build<THREADS, BM>(p.offsets, p.E, s_off, s_tiles);
  const int ntn = (p.N + BN - 1) / BN;
  const int64_t total = static_cast<int64_t>(s_tiles[p.E]) * ntn;

  for (int64_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const GroupedTile t = grouped_tile<BM, BN>(tile, ntn, s_off, s_tiles, p.E);
    const int e = t.e, n0 = t.n0, row0 = t.row0, row_end = t.row_end, KT = (p.K + BK - 1) / BK;

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

    const bf16* Bexp = p.B + static_cast<int64_t>(e) * p.b_stride;
    auto load_stage = [&](int stage, int kt) {
      const uint32_t sA = sbase + stage * A_STAGE * 2;
      const uint32_t sB = sbase + (STAGES * A_STAGE + stage * B_STAGE) * 2;
      const int k0 = kt * BK;
      load_tile<BM, BK / 8>(sA, p.A + static_cast<int64_t>(row0) * p.lda + k0, p.lda, row_end - row0, k0, p.K);
      if constexpr (B_K)
        load_tile<BN, BK / 8>(sB, Bexp + static_cast<int64_t>(n0) * p.ldb + k0, p.ldb, p.N - n0, k0, p.K);
      else
        load_tile<BK, BN / 8>(sB, Bexp + static_cast<int64_t>(k0) * p.ldb + n0, p.ldb, p.K - k0, n0, p.N);
    };

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < KT) load_stage(s, s);
      mma::cp_async_commit();
    }
    for (int kt = 0; kt < KT; ++kt) {
      mma::cp_async_wait<STAGES - 2>();
      __syncthreads();
      const int nk = kt + STAGES - 1;
      if (nk < KT) load_stage(nk % STAGES, nk);
      mma::cp_async_commit();
      const int stage = kt % STAGES;
      const uint32_t sA = sbase + stage * A_STAGE * 2;
      const uint32_t sB = sbase + (STAGES * A_STAGE + stage * B_STAGE) * 2;
      mma_stage<false, B_K>(acc, sA, sB, wm0, wn0, lane);
    }
    mma::cp_async_wait<0>();
    __syncthreads();

    // ---- epilogue through shared memory, 16-byte global accesses.
    const int g = lane >> 2, q = lane & 3;
    {
      bf16* sC = reinterpret_cast<bf16*>(smem);
      constexpr int LDS = BN + C_PAD;
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) {
          const int r = wm0 + 16 * i + g, c = wn0 + 8 * j + 2 * q;
          *reinterpret_cast<uint32_t*>(sC + r * LDS + c) = mma::pack_bf16(acc[i][j][0], acc[i][j][1]);
          *reinterpret_cast<uint32_t*>(sC + (r + 8) * LDS + c) = mma::pack_bf16(acc[i][j][2], acc[i][j][3]);
        }
      __syncthreads();
      bf16* C = static_cast<bf16*>(p.C);
      for (int idx = tid; idx < BM * BN / 8; idx += THREADS) {
        const int i = idx / (BN / 8), c = (idx % (BN / 8)) * 8;
        if (row0 + i < row_end && n0 + c < p.N)
          *reinterpret_cast<uint4*>(C + static_cast<int64_t>(row0 + i) * p.ldc + n0 + c) =
              *reinterpret_cast<const uint4*>(sC + i * LDS + c);
      }
    }
    __syncthreads();  // the next tile's prologue reuses the staging memory
  }
}


// K-grouped weight gradient dW_e (+)= dY_eᵀ·X_e: one BM×BN tile of one expert's dW per block and tile, the
// reduction over that expert's rows (a few hundred per micro-batch: a short main loop). What dominates is
// the tile's fixed cost — the pipeline fill and the read-add-write of the dW tile — so this kernel
// overlaps them: once a tile's main loop is done, the next tile's first stages are issued (cp.async)
// before the current tile's epilogue, and the epilogue goes from registers straight to global memory
// (no staging through the pipeline buffers), loading a row of fragments' old values before adding.
template <int MIN_BLOCKS>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS) grouped_wgrad_kernel(Problem p) {
  pdl_wait();
  extern __shared__ __align__(128) unsigned char smem[];
  int* s_off = reinterpret_cast<int*>(smem + PIPE_BYTES);  // [E + 1] offsets
  int* s_off2 = s_off + (p.E + 1);                          // [E + 1] offsets of the second segment
  const uint32_t sbase = mma::smem_u32(smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm0 = (warp / WARPS_N) * WTM, wn0 = (warp % WARPS_N) * WTN;
  const int g = lane >> 2, q = lane & 3;
  const bool two = p.A2 != nullptr;
  for (int e = tid; e <= p.E; e += THREADS) {
    s_off[e] = p.offsets[e];
    s_off2[e] = two ? p.offsets2[e] : 0;
  }
  __syncthreads();
  const int ntn = (p.N + BN - 1) / BN, mtm = (p.M + BM - 1) / BM;
  const int64_t per_e = static_cast<int64_t>(mtm) * ntn, total = p.E * per_e;

  struct Tile {
    int e, m0, n0, row0, row_end, KT1, row0b, row_endb, KT;  // KT1 k-steps over segment 1, then segment 2
  };
  auto decode = [&](int64_t t) {
    Tile x;
    x.e = static_cast<int>(t / per_e);
    const int rem = static_cast<int>(t % per_e);
    x.m0 = (rem / ntn) * BM;
    x.n0 = (rem % ntn) * BN;
    x.row0 = s_off[x.e];
    x.row_end = s_off[x.e + 1];
    x.KT1 = (x.row_end - x.row0 + BK - 1) / BK;
    x.row0b = s_off2[x.e];
    x.row_endb = s_off2[x.e + 1];
    x.KT = x.KT1 + (x.row_endb - x.row0b + BK - 1) / BK;
    return x;
  };
  // The next tile this block owns that has work (an expert without rows adds nothing when accumulating).
  auto next_tile = [&](int64_t t) {
    while (t < total && p.accumulate && s_off[t / per_e + 1] == s_off[t / per_e] &&
           s_off2[t / per_e + 1] == s_off2[t / per_e])
      t += gridDim.x;
    return t;
  };
  auto load_stage = [&](const Tile& x, int stage, int kt) {
    const uint32_t sA = sbase + stage * A_STAGE * 2;
    const uint32_t sB = sbase + (STAGES * A_STAGE + stage * B_STAGE) * 2;
    const bool first = kt < x.KT1;
    const bf16* A = first ? p.A : p.A2;
    const bf16* B = first ? p.B : p.B2;
    const int r = first ? x.row0 + kt * BK : x.row0b + (kt - x.KT1) * BK;  // reduction rows of this stage
    const int end = first ? x.row_end : x.row_endb;
    load_tile<BK, BM / 8>(sA, A + static_cast<int64_t>(r) * p.lda + x.m0, p.lda, end - r, x.m0, p.M);
    load_tile<BK, BN / 8>(sB, B + static_cast<int64_t>(r) * p.ldb + x.n0, p.ldb, end - r, x.n0, p.N);
  };
  auto prologue = [&](const Tile& x) {
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < x.KT) load_stage(x, s, s);
      mma::cp_async_commit();
    }
  };

  int64_t tile = next_tile(blockIdx.x);
  if (tile >= total) return;
  Tile cur = decode(tile);
  prologue(cur);
  while (true) {
    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

    for (int kt = 0; kt < cur.KT; ++kt) {
      mma::cp_async_wait<STAGES - 2>();
      __syncthreads();
      const int nk = kt + STAGES - 1;
      if (nk < cur.KT) load_stage(cur, nk % STAGES, nk);
      mma::cp_async_commit();
      const int stage = kt % STAGES;
      const uint32_t sA = sbase + stage * A_STAGE * 2;
      const uint32_t sB = sbase + (STAGES * A_STAGE + stage * B_STAGE) * 2;
      mma_stage<true, false>(acc, sA, sB, wm0, wn0, lane);
    }
    mma::cp_async_wait<0>();
    __syncthreads();  // every warp is done with the pipeline buffers: the next tile may fill them

    const Tile done = cur;
    tile = next_tile(tile + gridDim.x);
    if (tile < total) {
      cur = decode(tile);
      prologue(cur);
    }

    // Epilogue of `done` from registers: per i, the 2·NI fragment pairs (rows r and r + 8, columns c, c + 1).
    const int64_t cbase = static_cast<int64_t>(done.e) * p.c_stride;
#pragma unroll
    for (int i = 0; i < MI; ++i) {
      // Positions are recomputed in the second loop rather than kept: registers are at the 128 cap.
      auto pos = [&](int j, int h, int64_t& at) {
        const int r = done.m0 + wm0 + 16 * i + g + 8 * h, c = done.n0 + wn0 + 8 * j + 2 * q;
        at = cbase + static_cast<int64_t>(r) * p.ldc + c;
        return r < p.M && c < p.N;  // N % 8 == 0: c < N implies c + 1 < N
      };
      float2 old[NI][2];
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          int64_t at;
          old[j][h] = make_float2(0.f, 0.f);
          if (pos(j, h, at) && p.accumulate) {
            if (p.c_bf16)
              old[j][h] =
                  __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(static_cast<const bf16*>(p.C) + at));
            else
              old[j][h] = *reinterpret_cast<const float2*>(static_cast<const float*>(p.C) + at);
          }
        }
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          int64_t at;
          if (!pos(j, h, at)) continue;
          const float x = acc[i][j][2 * h] + old[j][h].x, y = acc[i][j][2 * h + 1] + old[j][h].y;
          if (p.c_bf16)
            *reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(p.C) + at) = __floats2bfloat162_rn(x, y);
          else
            *reinterpret_cast<float2*>(static_cast<float*>(p.C) + at) = make_float2(x, y);
        }
    }
    if (tile >= total) break;
  }
}

// Blocks per SM the wgrad kernel is compiled for: 2 (128 registers, a few spills; a second block hides
// the first one's epilogue) by default; MIXTUNE_WGRAD_BLOCKS_PER_SM=1 selects the unspilled one-block
// build (for measuring which wins on a GPU).
int wgrad_blocks_per_sm() {
  static const int v = [] {
    const char* e = std::getenv("MIXTUNE_WGRAD_BLOCKS_PER_SM");
    return e && e[0] == '1' ? 1 : MT_GROUPED_GEMM_WGRAD_MIN_BLOCKS;
  }();
  return v;
}

template <Mode MODE>
void launch(const Problem& p, int64_t max_tiles, int sm_count, cudaStream_t stream) {
  if (max_tiles <= 0) return;
  auto kern = grouped_gemm_kernel<MODE == Mode::Wgrad ? Mode::Fwd : MODE>;
  if constexpr (MODE == Mode::Wgrad)
    kern = wgrad_blocks_per_sm() == 1 ? grouped_wgrad_kernel<1> : grouped_wgrad_kernel<2>;
  const size_t smem = PIPE_BYTES + 2 * (p.E + 1) * sizeof(int);
  // Attribute and occupancy are per kernel and device; cheap enough to query at every launch.
  MT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  int per_sm = 0;
  MT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, THREADS, smem));
  const int64_t grid = std::min<int64_t>(max_tiles, static_cast<int64_t>(std::max(per_sm, 1)) * sm_count);
  launch_kernel(kern, static_cast<int>(grid), THREADS, smem, stream, p);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

namespace detail {

void grouped_gemm_fwd_launch(const void* x, const void* w, void* y, const int32_t* offsets, int E, int64_t rows, int N,
                             int K, int sm_count, cudaStream_t stream) {
  Problem p{static_cast<const bf16*>(x),
            K,
            static_cast<const bf16*>(w),
            K,
            static_cast<int64_t>(N) * K,
            y,
            N,
            0,
            offsets,
            E,
            0,
            N,
            K,
            false,
            false};
  launch<Mode::Fwd>(p, (rows / BM + E) * ceil_div(N, BN), sm_count, stream);
}

void grouped_gemm_dgrad_launch(const void* dy, const void* w, void* dx, const int32_t* offsets, int E, int64_t rows,
                               int J, int K, int sm_count, cudaStream_t stream) {
  // dX [rows][K] = dY [rows][J] · W_e [J][K]: reduction over J, output columns K.
  Problem p{static_cast<const bf16*>(dy),
            J,
            static_cast<const bf16*>(w),
            K,
            static_cast<int64_t>(J) * K,
            dx,
            K,
            0,
            offsets,
            E,
            0,
            K,
            J,
            false,
            false};
  launch<Mode::Dgrad>(p, (rows / BM + E) * ceil_div(K, BN), sm_count, stream);
}

void grouped_gemm_wgrad_launch(const void* dy, const void* x, void* dw, bool dw_bf16, const int32_t* offsets, int E,
                               int M, int N, bool accumulate, int sm_count, cudaStream_t stream, const void* dy2,
                               const void* x2, const int32_t* offsets2) {
  // dW_e [M][N] (+)= Σ_r dY[r][m] · X[r][n].
  Problem p{static_cast<const bf16*>(dy),
            M,
            static_cast<const bf16*>(x),
            N,
            0,
            dw,
            N,
            static_cast<int64_t>(M) * N,
            offsets,
            E,
            M,
            N,
            0,
            accumulate,
            dw_bf16,
            static_cast<const bf16*>(dy2),
            static_cast<const bf16*>(x2),
            dy2 ? offsets2 : nullptr};
  launch<Mode::Wgrad>(p, static_cast<int64_t>(E) * ceil_div(M, BM) * ceil_div(N, BN), sm_count, stream);
}

}  // namespace detail
}  // namespace mt::cuda

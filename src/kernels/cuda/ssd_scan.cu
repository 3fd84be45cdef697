// Chunked SSD scan (Mamba2) forward and backward; the design, cost and precision are in ssd_scan.h.
//
// Every per-chunk product is a block-wide fp32 product over shared-memory tiles (mm below): 256 threads, thread
// (tm, tn) = (tid / 16, tid % 16) owns the outputs (tm + 16i, tn + 16j), so outputs of the same shape map to the same
// threads in every product (accumulators stay in registers across products). Tiles are stored row-major with odd
// row strides (65, 129 floats): a warp reads 2 rows (broadcast) of one operand and 16 consecutive or 16 odd-strided
// elements of the other, conflict-free either way. Tiles are zero-padded to the maximum sizes (Q = 64 rows, P ≤ 64,
// N ≤ 128), so smaller shapes and a partial last chunk need no bounds checks inside the products.
#include <climits>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_copy.h"
#include "kernels/cuda/kernel_launch.cuh"
#include "kernels/cuda/ssd_scan.h"
#include "kernels/cuda/tensor_checks.h"

namespace mt::cuda {

namespace {

constexpr int kQ = static_cast<int>(kSsdChunk);
constexpr int kPMax = 64, kNMax = 128;
constexpr int kThreads = 256;
constexpr int kLdQ = kQ + 1, kLdP = kPMax + 1, kLdN = kNMax + 1;
static_assert(kQ == 64 && kPMax == 64 && kNMax == 128 && kThreads == 256, "mm's thread map covers 64 x 128");
static_assert(kLdQ <= kLdN && kLdQ == kLdP, "tiles reuse each other's shared memory");

constexpr int kTileQN = kQ * kLdN;     // [64][129]
constexpr int kTileQP = kQ * kLdP;     // [64][65]
constexpr int kTileQQ = kQ * kLdQ;     // [64][65]
constexpr int kTilePN = kPMax * kLdN;  // [64][129]

struct Dims {
  int T, H, P, G, N, hpg, W, nc;
  int64_t xcol, bcol, ccol;  // first column of x, B, C in act
};

// Per-(chunk, head) vectors in shared memory.
struct ChunkVecs {
  float dt[kQ];
  float cs[kQ];   // inclusive cumulative sum of A·dt inside the chunk
  float ge[kQ];   // [document began before the chunk] · exp(cs_l)
  float w[kQ];    // [in the document of the chunk's last token] · exp(cs_last − cs_s)
  float rs[kQ];   // a row scale, per kernel
  float dcs[kQ];  // backward: ∂/∂cs
  float r[kQ];    // backward: the S_end term's share of ∂/∂cs_last, per row
  int start[kQ];  // first token of each row's document (INT_MAX past the chunk's end)
  float red[32];
};

__device__ __forceinline__ int chunk_len(const Dims& d, int z) { return min(kQ, d.T - z * kQ); }

// Fills v for chunk z (first token l0), head h; ends with a barrier. Warp 0 scans A·dt (two tokens per lane,
// then a shuffle scan: a fixed order, the same bits in every kernel).
__device__ void chunk_vectors(const Dims& d, const float* __restrict__ dt, const float* __restrict__ A,
                              const int32_t* __restrict__ start, int z, int h, ChunkVecs& v) {
  const int l0 = z * kQ, n = chunk_len(d, z), t = threadIdx.x;
  if (t < 32) {
    const int i0 = 2 * t, i1 = 2 * t + 1;
    const float a = A[h];
    const float d0 = i0 < n ? dt[static_cast<int64_t>(l0 + i0) * d.H + h] : 0.0f;
    const float d1 = i1 < n ? dt[static_cast<int64_t>(l0 + i1) * d.H + h] : 0.0f;
    const float a0 = a * d0, a1 = a * d1, pair = a0 + a1;
    float incl = pair;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float u = __shfl_up_sync(0xffffffffu, incl, o);
      if (t >= o) incl += u;
    }
    float excl = __shfl_up_sync(0xffffffffu, incl, 1);
    if (t == 0) excl = 0.0f;
    v.dt[i0] = d0;
    v.dt[i1] = d1;
    v.cs[i0] = excl + a0;
    v.cs[i1] = (excl + a0) + a1;
  }
  if (t < kQ) v.start[t] = t < n ? start[l0 + t] : INT_MAX;
  __syncthreads();
  if (t < kQ) {
    const float clast = v.cs[n - 1];
    const int slast = v.start[n - 1];
    v.ge[t] = (t < n && v.start[t] < l0) ? expf(v.cs[t]) : 0.0f;
    v.w[t] = (t < n && l0 + t >= slast) ? expf(clast - v.cs[t]) : 0.0f;
  }
  __syncthreads();
}

// Row l attends to row s of the chunk (s ≤ l, same document).
__device__ __forceinline__ bool in_mask(const ChunkVecs& v, int l0, int l, int s) {
  return s <= l && l0 + s >= v.start[l];
}

// s[r][c] (row stride lds) = g[r·ld + c] · (row_scale ? row_scale[r] : 1) for r < nr, c < ncols; 0 elsewhere in
// ROWS × COLS.
template <int ROWS, int COLS, typename TG>
__device__ void load_tile(float* s, int lds, const TG* __restrict__ g, int64_t ld, int nr, int ncols,
                          const float* row_scale) {
  for (int e = threadIdx.x; e < ROWS * COLS; e += kThreads) {
    const int r = e / COLS, c = e - r * COLS;
    float x = 0.0f;
    if (r < nr && c < ncols) {
      x = Elt<TG>::load(g, r * ld + c);
      if (row_scale) x *= row_scale[r];
    }
    s[r * lds + c] = x;
  }
}

// acc[i][j] += Σ_{k < K} la(tm + 16i, k) · lb(k, tn + 16j). UNROLL: k steps in flight (1 where registers are short).
template <int UNROLL = 2, int MI, int NJ, class LA, class LB>
__device__ __forceinline__ void mm(float (&acc)[MI][NJ], int K, LA la, LB lb) {
  const int tm = threadIdx.x >> 4, tn = threadIdx.x & 15;
#pragma unroll UNROLL
  for (int k = 0; k < K; ++k) {
    float a[MI], b[NJ];
#pragma unroll
    for (int i = 0; i < MI; ++i) a[i] = la(tm + 16 * i, k);
#pragma unroll
    for (int j = 0; j < NJ; ++j) b[j] = lb(k, tn + 16 * j);
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NJ; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  }
}

template <int MI, int NJ>
__device__ __forceinline__ void zero(float (&acc)[MI][NJ]) {
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NJ; ++j) acc[i][j] = 0.0f;
}

// Sum over the 16 threads that share tm (a half warp), fixed butterfly order; every one of them gets it.
__device__ __forceinline__ float row_sum16(float x) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ float load_param(const void* p, bool bf16_param, int i) {
  return bf16_param ? __bfloat162float(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
}

// ---------------------------------------------------------------------------------------------------------------
// (1) Chunk states. Forward: out[z][h] = Σ_s w_s dt_s x_s ⊗ B_s (from zero). Backward (BWD): the local ∂/∂S_in[z] =
// Σ_l ge_l dy_l ⊗ C_l. Both write carry[z][h] = ge_last (the decay of S_in into S_end; 0 when a document starts in
// the chunk).
template <typename TA, bool BWD>
__global__ void __launch_bounds__(kThreads) ssd_chunk_state_kernel(Dims d, const TA* __restrict__ act,
                                                                   const float* __restrict__ dt,
                                                                   const float* __restrict__ A,
                                                                   const int32_t* __restrict__ start,
                                                                   const float* __restrict__ dy,
                                                                   float* __restrict__ out, float* __restrict__ carry) {
  pdl_wait();
  extern __shared__ float smem[];
  __shared__ ChunkVecs v;
  float* sU = smem;             // [Q][kLdP]: rows of x·dt·w (forward) or dy·ge (backward)
  float* sV = smem + kTileQP;   // [Q][kLdN]: rows of B (forward) or C (backward)
  const int z = blockIdx.x, h = blockIdx.y, g = h / d.hpg, l0 = z * kQ, n = chunk_len(d, z);
  chunk_vectors(d, dt, A, start, z, h, v);
  if (threadIdx.x < kQ) v.rs[threadIdx.x] = BWD ? v.ge[threadIdx.x] : v.dt[threadIdx.x] * v.w[threadIdx.x];
  __syncthreads();
  const int64_t row0 = static_cast<int64_t>(l0) * d.W;
  if (BWD) {
    load_tile<kQ, kPMax>(sU, kLdP, dy + static_cast<int64_t>(l0) * d.H * d.P + static_cast<int64_t>(h) * d.P,
                         static_cast<int64_t>(d.H) * d.P, n, d.P, v.rs);
    load_tile<kQ, kNMax>(sV, kLdN, act + row0 + d.ccol + static_cast<int64_t>(g) * d.N, d.W, n, d.N, nullptr);
  } else {
    load_tile<kQ, kPMax>(sU, kLdP, act + row0 + d.xcol + static_cast<int64_t>(h) * d.P, d.W, n, d.P, v.rs);
    load_tile<kQ, kNMax>(sV, kLdN, act + row0 + d.bcol + static_cast<int64_t>(g) * d.N, d.W, n, d.N, nullptr);
  }
  __syncthreads();
  float acc[4][8];
  zero(acc);
  mm(acc, n, [&](int p, int l) { return sU[l * kLdP + p]; }, [&](int l, int k) { return sV[l * kLdN + k]; });
  const int tm = threadIdx.x >> 4, tn = threadIdx.x & 15;
  float* o = out + (static_cast<int64_t>(z) * d.H + h) * d.P * d.N;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int p = tm + 16 * i, k = tn + 16 * j;
      if (p < d.P && k < d.N) o[p * d.N + k] = acc[i][j];
    }
  if (threadIdx.x == 0) carry[z * d.H + h] = v.ge[n - 1];
}

// (2) The pass over chunks, one thread per state element. Forward (in place): chunk ends from zero -> the state
// entering each chunk (S_in[0] = 0, S_in[z + 1] = carry_z · S_in[z] + end_z). Backward: local ∂/∂S_in -> total
// (dS_in[z] = local[z] + carry_z · dS_in[z + 1]).
// Each thread loads kPassBatch chunks' values before it stores any: the compiler may not move a load above a store
// to the same buffer, so one value at a time made every chunk a dependent DRAM round trip (the forward pass took
// 0.60 ms at T = 4096, 43% of the forward, on an H100; ncu, session 37). The arithmetic and its order are
// unchanged: the same bits.
constexpr int kPassBatch = 16;
template <bool REVERSE>
__global__ void __launch_bounds__(kThreads)
    ssd_state_pass_kernel(int nc, int H, int PN, const float* __restrict__ carry, float* __restrict__ buf) {
  pdl_wait();
  const int h = blockIdx.y, e = blockIdx.x * kThreads + threadIdx.x;
  if (e >= PN) return;
  const auto at = [&](int z) { return buf + (static_cast<int64_t>(z) * H + h) * PN + e; };
  float s = 0.0f;
  for (int b = 0; b < nc; b += kPassBatch) {
    float val[kPassBatch], c[kPassBatch];
#pragma unroll
    for (int i = 0; i < kPassBatch; ++i) {
      const int z = REVERSE ? nc - 1 - (b + i) : b + i;
      if (b + i < nc) {
        val[i] = *at(z);
        c[i] = carry[z * H + h];
      }
    }
#pragma unroll
    for (int i = 0; i < kPassBatch; ++i) {
      const int z = REVERSE ? nc - 1 - (b + i) : b + i;
      if (b + i < nc) {
        if (!REVERSE) {
          *at(z) = s;
          s = fmaf(c[i], s, val[i]);
        } else {
          s = fmaf(c[i], s, val[i]);
          *at(z) = s;
        }
      }
    }
  }
}

// (3) cb[z][g][l][s] = C_l · B_s over the chunk's rows (all 64 × 64; rows past the chunk's end are 0).
template <typename TA>
__global__ void __launch_bounds__(kThreads) ssd_cb_kernel(Dims d, const TA* __restrict__ act, float* __restrict__ cb) {
  pdl_wait();
  extern __shared__ float smem[];
  float* sC = smem;
  float* sB = smem + kTileQN;
  const int z = blockIdx.x, g = blockIdx.y, l0 = z * kQ, n = chunk_len(d, z);
  const int64_t row0 = static_cast<int64_t>(l0) * d.W;
  load_tile<kQ, kNMax>(sC, kLdN, act + row0 + d.ccol + static_cast<int64_t>(g) * d.N, d.W, n, d.N, nullptr);
  load_tile<kQ, kNMax>(sB, kLdN, act + row0 + d.bcol + static_cast<int64_t>(g) * d.N, d.W, n, d.N, nullptr);
  __syncthreads();
  float acc[4][4];
  zero(acc);
  mm(acc, d.N, [&](int l, int k) { return sC[l * kLdN + k]; }, [&](int k, int s) { return sB[s * kLdN + k]; });
  const int tm = threadIdx.x >> 4, tn = threadIdx.x & 15;
  float* o = cb + (static_cast<int64_t>(z) * d.G + g) * kQ * kQ;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) o[(tm + 16 * i) * kQ + tn + 16 * j] = acc[i][j];
}

// (4) Forward outputs per (chunk, head): y = M·x + (ge ⊙ C)·S_inᵀ + D·x, M[l][s] = cb·exp(cs_l − cs_s)·dt_s (masked).
template <typename TA>
__global__ void __launch_bounds__(kThreads, 2) ssd_chunk_scan_fwd_kernel(
    Dims d, const TA* __restrict__ act, const float* __restrict__ dt, const float* __restrict__ A,
    const void* __restrict__ Dp, bool d_bf16, const int32_t* __restrict__ start, const float* __restrict__ cb,
    const float* __restrict__ s_in, float* __restrict__ y) {
  pdl_wait();
  extern __shared__ float smem[];
  __shared__ ChunkVecs v;
  float* sC = smem;                    // [Q][kLdN]: ge_l · C_l
  float* sS = sC + kTileQN;            // [P][kLdN]: S_in
  float* sX = sS + kTilePN;            // [Q][kLdP]: x
  float* sM = sX + kTileQP;            // [Q][kLdQ]
  const int z = blockIdx.x, h = blockIdx.y, g = h / d.hpg, l0 = z * kQ, n = chunk_len(d, z);
  chunk_vectors(d, dt, A, start, z, h, v);
  const int64_t row0 = static_cast<int64_t>(l0) * d.W;
  load_tile<kQ, kNMax>(sC, kLdN, act + row0 + d.ccol + static_cast<int64_t>(g) * d.N, d.W, n, d.N, v.ge);
  load_tile<kPMax, kNMax>(sS, kLdN, s_in + (static_cast<int64_t>(z) * d.H + h) * d.P * d.N, d.N, d.P, d.N, nullptr);
  load_tile<kQ, kPMax>(sX, kLdP, act + row0 + d.xcol + static_cast<int64_t>(h) * d.P, d.W, n, d.P, nullptr);
  const float* cbz = cb + (static_cast<int64_t>(z) * d.G + g) * kQ * kQ;
  for (int e = threadIdx.x; e < kQ * kQ; e += kThreads) {
    const int l = e / kQ, s = e % kQ;
    sM[l * kLdQ + s] = in_mask(v, l0, l, s) ? cbz[e] * expf(v.cs[l] - v.cs[s]) * v.dt[s] : 0.0f;
  }
  __syncthreads();
  float acc[4][4];
  zero(acc);
  mm(acc, n, [&](int l, int s) { return sM[l * kLdQ + s]; }, [&](int s, int p) { return sX[s * kLdP + p]; });
  mm(acc, d.N, [&](int l, int k) { return sC[l * kLdN + k]; }, [&](int k, int p) { return sS[p * kLdN + k]; });
  const float Dh = load_param(Dp, d_bf16, h);
  const int tm = threadIdx.x >> 4, tn = threadIdx.x & 15;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int l = tm + 16 * i, p = tn + 16 * j;
      if (l < n && p < d.P)
        y[static_cast<int64_t>(l0 + l) * d.H * d.P + static_cast<int64_t>(h) * d.P + p] =
            fmaf(Dh, sX[l * kLdP + p], acc[i][j]);
    }
}

// (5) Backward per (chunk, head): dx (into dact's x columns), ddt, and this chunk's dA and dD shares.
//   dxd = M'ᵀ·dy + w ⊙ (B·Gᵀ)        (xd = x·dt, M' = cb ⊙ exp(cs_l − cs_s) masked, G = dS_in[z + 1])
//   dcs_l = Σ_s dlog[l][s] − Σ_l' dlog[l'][l] + ge_l · dy_l·(C_l·S_inᵀ) − r_l (+ Σ r + ge_last·⟨G, S_in⟩ at the last)
//   with dlog = (dy·xdᵀ) ⊙ M', r_s = w_s · xd_s·(B_s·Gᵀ);  da = suffix sums of dcs; ddt = da·A + dxd·x;
//   dx = dxd·dt + D·dy; dA share Σ da·dt; dD share Σ dy·x.
template <typename TA>
__global__ void __launch_bounds__(kThreads, 2) ssd_chunk_scan_bwd_dx_kernel(
    Dims d, const TA* __restrict__ act, const float* __restrict__ dt, const float* __restrict__ A,
    const void* __restrict__ Dp, bool d_bf16, const int32_t* __restrict__ start, const float* __restrict__ cb,
    const float* __restrict__ s_in, const float* __restrict__ ds_in, const float* __restrict__ dy,
    TA* __restrict__ dact, float* __restrict__ ddt, float* __restrict__ part_a, float* __restrict__ part_d) {
  pdl_wait();
  extern __shared__ float smem[];
  __shared__ ChunkVecs v;
  float* sBC = smem;                // [Q][kLdQ] M' then dlog; then [Q][kLdN] C; then B
  float* sSG = sBC + kTileQN;       // [P][kLdN] S_in, then G
  float* sXd = sSG + kTilePN;       // [Q][kLdP] x·dt
  float* sDY = sXd + kTileQP;       // [Q][kLdP] dy
  const int z = blockIdx.x, h = blockIdx.y, g = h / d.hpg, l0 = z * kQ, n = chunk_len(d, z);
  const int tid = threadIdx.x, tm = tid >> 4, tn = tid & 15;
  chunk_vectors(d, dt, A, start, z, h, v);
  const int64_t row0 = static_cast<int64_t>(l0) * d.W;
  const int64_t HP = static_cast<int64_t>(d.H) * d.P;
  load_tile<kQ, kPMax>(sXd, kLdP, act + row0 + d.xcol + static_cast<int64_t>(h) * d.P, d.W, n, d.P, v.dt);
  load_tile<kQ, kPMax>(sDY, kLdP, dy + static_cast<int64_t>(l0) * HP + static_cast<int64_t>(h) * d.P, HP, n, d.P,
                       nullptr);
  const float* cbz = cb + (static_cast<int64_t>(z) * d.G + g) * kQ * kQ;
  for (int e = tid; e < kQ * kQ; e += kThreads) {
    const int l = e / kQ, s = e % kQ;
    sBC[l * kLdQ + s] = in_mask(v, l0, l, s) ? cbz[e] * expf(v.cs[l] - v.cs[s]) : 0.0f;
  }
  if (tid < kQ) v.dcs[tid] = 0.0f;
  __syncthreads();
  // The intra-chunk term.
  float dxd[4][4], tmp[4][4];
  zero(dxd);
  mm(dxd, n, [&](int s, int l) { return sBC[l * kLdQ + s]; }, [&](int l, int p) { return sDY[l * kLdP + p]; });
  zero(tmp);
  mm(tmp, d.P, [&](int l, int p) { return sDY[l * kLdP + p]; }, [&](int p, int s) { return sXd[s * kLdP + p]; });
  __syncthreads();  // every read of M' by the first product is done
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) sBC[(tm + 16 * i) * kLdQ + tn + 16 * j] *= tmp[i][j];
  __syncthreads();
  if (tid < kQ) {
    float row = 0.0f, col = 0.0f;
    for (int s = 0; s < kQ; ++s) row += sBC[tid * kLdQ + s];
    for (int l = 0; l < kQ; ++l) col += sBC[l * kLdQ + tid];
    v.dcs[tid] = row - col;
  }
  __syncthreads();
  // The inter-chunk output term: dcs_l += ge_l · Σ_p dy_l[p] · (C_l·S_inᵀ)[p].
  load_tile<kQ, kNMax>(sBC, kLdN, act + row0 + d.ccol + static_cast<int64_t>(g) * d.N, d.W, n, d.N, nullptr);
  load_tile<kPMax, kNMax>(sSG, kLdN, s_in + (static_cast<int64_t>(z) * d.H + h) * d.P * d.N, d.N, d.P, d.N, nullptr);
  __syncthreads();
  zero(tmp);
  mm(tmp, d.N, [&](int l, int k) { return sBC[l * kLdN + k]; }, [&](int k, int p) { return sSG[p * kLdN + k]; });
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int l = tm + 16 * i;
    float part = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) part = fmaf(sDY[l * kLdP + tn + 16 * j], tmp[i][j], part);
    part = row_sum16(part);
    if (tn == 0) v.dcs[l] = fmaf(v.ge[l], part, v.dcs[l]);
  }
  __syncthreads();
  // The chunk-end-state term, G = ∂/∂S_end = dS_in[z + 1] (0 for the last chunk); ⟨G, S_in⟩ while G replaces S_in.
  load_tile<kQ, kNMax>(sBC, kLdN, act + row0 + d.bcol + static_cast<int64_t>(g) * d.N, d.W, n, d.N, nullptr);
  float dot = 0.0f;
  {
    const float* gz = ds_in + (static_cast<int64_t>(z + 1) * d.H + h) * d.P * d.N;
    const bool have = z + 1 < d.nc;
    for (int e = tid; e < kPMax * kNMax; e += kThreads) {
      const int r = e / kNMax, c = e % kNMax;
      const float gv = (have && r < d.P && c < d.N) ? gz[r * d.N + c] : 0.0f;
      dot = fmaf(gv, sSG[r * kLdN + c], dot);
      sSG[r * kLdN + c] = gv;
    }
  }
  dot = block_sum(dot, v.red);  // has barriers: the tiles above are complete after it
  zero(tmp);
  mm(tmp, d.N, [&](int s, int k) { return sBC[s * kLdN + k]; }, [&](int k, int p) { return sSG[p * kLdN + k]; });
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int s = tm + 16 * i;
    float part = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      part = fmaf(sXd[s * kLdP + tn + 16 * j], tmp[i][j], part);
      dxd[i][j] = fmaf(v.w[s], tmp[i][j], dxd[i][j]);
    }
    part = row_sum16(part);
    if (tn == 0) v.r[s] = v.w[s] * part;
  }
  __syncthreads();
  if (tid == 0) {
    float rs = 0.0f;
    for (int s = 0; s < n; ++s) {
      rs += v.r[s];
      v.dcs[s] -= v.r[s];
    }
    v.dcs[n - 1] += rs + v.ge[n - 1] * dot;
    // da = suffix sums of dcs (cs is the inclusive prefix sum of a = A·dt); kept in v.rs.
    float run = 0.0f, da_dt = 0.0f;
    for (int l = n - 1; l >= 0; --l) {
      run += v.dcs[l];
      v.rs[l] = run;
      da_dt = fmaf(run, v.dt[l], da_dt);
    }
    part_a[z * d.H + h] = da_dt;
  }
  __syncthreads();
  const float Dh = load_param(Dp, d_bf16, h), Ah = A[h];
  float dd = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int s = tm + 16 * i;
    float part = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int p = tn + 16 * j;
      if (s < n && p < d.P) {
        const int64_t off = static_cast<int64_t>(l0 + s) * d.W + d.xcol + static_cast<int64_t>(h) * d.P + p;
        const float x = Elt<TA>::load(act, off), gy = sDY[s * kLdP + p];
        part = fmaf(dxd[i][j], x, part);
        dd = fmaf(gy, x, dd);
        Elt<TA>::store(dact, off, fmaf(dxd[i][j], v.dt[s], Dh * gy));
      }
    }
    part = row_sum16(part);
    if (tn == 0 && s < n) ddt[static_cast<int64_t>(l0 + s) * d.H + h] = fmaf(v.rs[s], Ah, part);
  }
  dd = block_sum(dd, v.red);
  if (tid == 0) part_d[z * d.H + h] = dd;
}

// (6) Backward per (chunk, group): dB and dC, the group's heads in order.
//   dC_l = Σ_s dCB[l][s] B_s + Σ_h ge_{h,l} dy_{h,l}·S_in_h       dB_s = Σ_l dCB[l][s] C_l + Σ_h w_{h,s} xd_{h,s}·G_h
//   dCB = Σ_h (dy_h·xd_hᵀ) ⊙ exp(cs_l − cs_s) masked.
template <typename TA>
__global__ void __launch_bounds__(kThreads, 2) ssd_chunk_scan_bwd_dbc_kernel(
    Dims d, const TA* __restrict__ act, const float* __restrict__ dt, const float* __restrict__ A,
    const int32_t* __restrict__ start, const float* __restrict__ s_in, const float* __restrict__ ds_in,
    const float* __restrict__ dy, TA* __restrict__ dact) {
  pdl_wait();
  extern __shared__ float smem[];
  __shared__ ChunkVecs v;
  float* sDY = smem;             // [Q][kLdP] dy (then ge·dy); at the end dCB [Q][kLdQ]
  float* sXd = sDY + kTileQP;    // [Q][kLdP] x·dt (then w·x·dt)
  float* sS = sXd + kTileQP;     // [P][kLdN] S_in; at the end C [Q][kLdN]
  float* sG = sS + kTilePN;      // [P][kLdN] G;    at the end B [Q][kLdN]
  const int z = blockIdx.x, g = blockIdx.y, l0 = z * kQ, n = chunk_len(d, z);
  const int tid = threadIdx.x, tm = tid >> 4, tn = tid & 15;
  const int64_t row0 = static_cast<int64_t>(l0) * d.W;
  const int64_t HP = static_cast<int64_t>(d.H) * d.P, PN = static_cast<int64_t>(d.P) * d.N;
  float dC[4][8], dB[4][8], dcb[4][4];
  zero(dC);
  zero(dB);
  zero(dcb);
  for (int h = g * d.hpg; h < (g + 1) * d.hpg; ++h) {
    __syncthreads();  // the previous head's reads of v and the tiles are done
    chunk_vectors(d, dt, A, start, z, h, v);
    load_tile<kQ, kPMax>(sDY, kLdP, dy + static_cast<int64_t>(l0) * HP + static_cast<int64_t>(h) * d.P, HP, n, d.P,
                         nullptr);
    load_tile<kQ, kPMax>(sXd, kLdP, act + row0 + d.xcol + static_cast<int64_t>(h) * d.P, d.W, n, d.P, v.dt);
    load_tile<kPMax, kNMax>(sS, kLdN, s_in + (static_cast<int64_t>(z) * d.H + h) * PN, d.N, d.P, d.N, nullptr);
    if (z + 1 < d.nc)
      load_tile<kPMax, kNMax>(sG, kLdN, ds_in + (static_cast<int64_t>(z + 1) * d.H + h) * PN, d.N, d.P, d.N, nullptr);
    else
      load_tile<kPMax, kNMax>(sG, kLdN, ds_in, d.N, 0, 0, nullptr);
    __syncthreads();
    float dm[4][4];
    zero(dm);
    mm<1>(dm, d.P, [&](int l, int p) { return sDY[l * kLdP + p]; }, [&](int p, int s) { return sXd[s * kLdP + p]; });
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int l = tm + 16 * i, s = tn + 16 * j;
        if (in_mask(v, l0, l, s)) dcb[i][j] = fmaf(dm[i][j], expf(v.cs[l] - v.cs[s]), dcb[i][j]);
      }
    __syncthreads();
    for (int e = tid; e < kQ * kPMax; e += kThreads) {
      const int r = e / kPMax, c = e % kPMax;
      sDY[r * kLdP + c] *= v.ge[r];
      sXd[r * kLdP + c] *= v.w[r];
    }
    __syncthreads();
    mm<1>(dC, d.P, [&](int l, int p) { return sDY[l * kLdP + p]; }, [&](int p, int k) { return sS[p * kLdN + k]; });
    mm<1>(dB, d.P, [&](int s, int p) { return sXd[s * kLdP + p]; }, [&](int p, int k) { return sG[p * kLdN + k]; });
  }
  __syncthreads();
  float* sCB = sDY;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) sCB[(tm + 16 * i) * kLdQ + tn + 16 * j] = dcb[i][j];
  load_tile<kQ, kNMax>(sS, kLdN, act + row0 + d.ccol + static_cast<int64_t>(g) * d.N, d.W, n, d.N, nullptr);
  load_tile<kQ, kNMax>(sG, kLdN, act + row0 + d.bcol + static_cast<int64_t>(g) * d.N, d.W, n, d.N, nullptr);
  __syncthreads();
  mm<1>(dC, n, [&](int l, int s) { return sCB[l * kLdQ + s]; }, [&](int s, int k) { return sG[s * kLdN + k]; });
  mm<1>(dB, n, [&](int s, int l) { return sCB[l * kLdQ + s]; }, [&](int l, int k) { return sS[l * kLdN + k]; });
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int l = tm + 16 * i, k = tn + 16 * j;
      if (l < n && k < d.N) {
        const int64_t off = row0 + static_cast<int64_t>(l) * d.W + static_cast<int64_t>(g) * d.N + k;
        Elt<TA>::store(dact, off + d.bcol, dB[i][j]);
        Elt<TA>::store(dact, off + d.ccol, dC[i][j]);
      }
    }
}

// (7) dA[h] = Σ_z part_a[z][h]; dD[h] += Σ_z part_d[z][h] (when dD is given), chunks in order.
__global__ void ssd_param_reduce_kernel(int nc, int H, const float* __restrict__ part_a,
                                        const float* __restrict__ part_d, float* __restrict__ dA,
                                        float* __restrict__ dD) {
  pdl_wait();
  const int h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= H) return;
  float a = 0.0f, dd = 0.0f;
  for (int z = 0; z < nc; ++z) {
    a += part_a[z * H + h];
    dd += part_d[z * H + h];
  }
  dA[h] = a;
  if (dD) dD[h] += dd;
}

// ---------------------------------------------------------------------------------------------------------------
// Host side.

constexpr size_t kSmemState = sizeof(float) * (kTileQP + kTileQN);
constexpr size_t kSmemCb = sizeof(float) * 2 * kTileQN;
constexpr size_t kSmemScan = sizeof(float) * (kTileQN + kTilePN + kTileQP + kTileQQ);
constexpr size_t kSmemBwdDx = sizeof(float) * (kTileQN + kTilePN + 2 * kTileQP);
constexpr size_t kSmemBwdDbc = sizeof(float) * (2 * kTileQP + 2 * kTilePN);

template <typename K>
void allow_smem(K kernel, size_t bytes) {
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

Dims check_common(const char* op, const SsdScanShape& s, const Tensor& act, const Tensor& dt, const Tensor& A,
                  const Tensor& D, const AttentionDocs& docs) {
  MT_CUDA_REQUIRE(s.heads >= 1 && s.head_dim >= 1 && s.groups >= 1 && s.state >= 1 && s.heads % s.groups == 0,
                  std::string(op) + ": " + std::to_string(s.heads) + " heads x " + std::to_string(s.head_dim) +
                      " in " + std::to_string(s.groups) + " groups, state " + std::to_string(s.state));
  MT_CUDA_REQUIRE(s.head_dim <= kPMax && s.state <= kNMax,
                  std::string(op) + ": head_dim " + std::to_string(s.head_dim) + " (at most 64) and state " +
                      std::to_string(s.state) + " (at most 128) are beyond the kernel's tiles");
  check_float_dtype(act, op);
  MT_CUDA_REQUIRE(act.ndim() == 2, std::string(op) + ": act must be [T, W], got " + tensor_where(act));
  const int dev = act.device().index;
  const int64_t T = act.dim(0), W = act.dim(1), HP = s.heads * s.head_dim, GN = s.groups * s.state;
  MT_CUDA_REQUIRE(W >= HP + 2 * GN, std::string(op) + ": act has " + std::to_string(W) + " columns, x | B | C need " +
                                        std::to_string(HP + 2 * GN));
  MT_CUDA_REQUIRE(T * W < (int64_t{1} << 31) && T * HP < (int64_t{1} << 31),
                  std::string(op) + ": " + std::to_string(T) + " tokens is too many for 32-bit row offsets");
  check_tensor(dt, "ssd scan dt", dev, DType::F32, T * s.heads);
  check_tensor(A, "ssd scan A", dev, DType::F32, s.heads);
  check_float_dtype(D, op);
  check_tensor(D, "ssd scan D", dev, D.dtype(), s.heads);
  check_tensor(docs.start, "ssd scan docs.start", dev, DType::I32, T);
  Dims d{};
  d.T = static_cast<int>(T);
  d.H = static_cast<int>(s.heads);
  d.P = static_cast<int>(s.head_dim);
  d.G = static_cast<int>(s.groups);
  d.N = static_cast<int>(s.state);
  d.hpg = d.H / d.G;
  d.W = static_cast<int>(W);
  d.nc = static_cast<int>((T + kQ - 1) / kQ);
  d.xcol = 0;
  d.bcol = HP;
  d.ccol = HP + GN;
  return d;
}

template <typename TA>
void launch_states_forward(const Dims& d, const TA* act, const Tensor& dt, const Tensor& A, const Tensor& docs_start,
                           float* states, float* carry, cudaStream_t stream) {
  auto k1 = ssd_chunk_state_kernel<TA, false>;
  allow_smem(k1, kSmemState);
  launch_kernel(k1, dim3(d.nc, d.H), dim3(kThreads), kSmemState, stream, d, act, dt.data_as<float>(),
                A.data_as<float>(), docs_start.data_as<int32_t>(), static_cast<const float*>(nullptr), states, carry);
  const int PN = d.P * d.N;
  launch_kernel(ssd_state_pass_kernel<false>, dim3((PN + kThreads - 1) / kThreads, d.H), dim3(kThreads), 0, stream,
                d.nc, d.H, PN, static_cast<const float*>(carry), states);
}

template <typename TA>
void launch_cb(const Dims& d, const TA* act, float* cb, cudaStream_t stream) {
  allow_smem(ssd_cb_kernel<TA>, kSmemCb);
  launch_kernel(ssd_cb_kernel<TA>, dim3(d.nc, d.G), dim3(kThreads), kSmemCb, stream, d, act, cb);
}

template <typename TA>
void forward_impl(const Dims& d, const Tensor& act, const Tensor& dt, const Tensor& A, const Tensor& D,
                  const AttentionDocs& docs, Tensor& y, float* states, cudaStream_t stream) {
  const TA* a = act.data_as<TA>();
  const Device dev = act.device();
  Tensor carry = Tensor::empty({static_cast<int64_t>(d.nc) * d.H}, DType::F32, dev);
  Tensor cb = Tensor::empty({static_cast<int64_t>(d.nc) * d.G * kQ * kQ}, DType::F32, dev);
  launch_states_forward<TA>(d, a, dt, A, docs.start, states, carry.data_as<float>(), stream);
  launch_cb<TA>(d, a, cb.data_as<float>(), stream);
  auto k = ssd_chunk_scan_fwd_kernel<TA>;
  allow_smem(k, kSmemScan);
  launch_kernel(k, dim3(d.nc, d.H), dim3(kThreads), kSmemScan, stream, d, a, dt.data_as<float>(), A.data_as<float>(),
                D.data(), D.dtype() == DType::BF16, docs.start.data_as<int32_t>(),
                static_cast<const float*>(cb.data_as<float>()), static_cast<const float*>(states), y.data_as<float>());
}

template <typename TA>
void backward_impl(const Dims& d, const Tensor& act, const Tensor& dt, const Tensor& A, const Tensor& D,
                   const AttentionDocs& docs, const Tensor& dy, const float* states, Tensor& dact, Tensor& ddt,
                   Tensor& dA, Tensor& dD, cudaStream_t stream) {
  const TA* a = act.data_as<TA>();
  const Device dev = act.device();
  const int64_t states_numel = static_cast<int64_t>(d.nc) * d.H * d.P * d.N;
  Tensor carry = Tensor::empty({static_cast<int64_t>(d.nc) * d.H}, DType::F32, dev);
  Tensor s_tmp;
  if (!states) {
    s_tmp = Tensor::empty({states_numel}, DType::F32, dev);
    launch_states_forward<TA>(d, a, dt, A, docs.start, s_tmp.data_as<float>(), carry.data_as<float>(), stream);
    states = s_tmp.data_as<float>();
  }
  Tensor ds_in = Tensor::empty({states_numel}, DType::F32, dev);
  auto k1 = ssd_chunk_state_kernel<TA, true>;
  allow_smem(k1, kSmemState);
  launch_kernel(k1, dim3(d.nc, d.H), dim3(kThreads), kSmemState, stream, d, a, dt.data_as<float>(), A.data_as<float>(),
                docs.start.data_as<int32_t>(), dy.data_as<float>(), ds_in.data_as<float>(), carry.data_as<float>());
  const int PN = d.P * d.N;
  launch_kernel(ssd_state_pass_kernel<true>, dim3((PN + kThreads - 1) / kThreads, d.H), dim3(kThreads), 0, stream,
                d.nc, d.H, PN, static_cast<const float*>(carry.data_as<float>()), ds_in.data_as<float>());
  Tensor cb = Tensor::empty({static_cast<int64_t>(d.nc) * d.G * kQ * kQ}, DType::F32, dev);
  launch_cb<TA>(d, a, cb.data_as<float>(), stream);
  Tensor part = Tensor::empty({2 * static_cast<int64_t>(d.nc) * d.H}, DType::F32, dev);
  float* part_a = part.data_as<float>();
  float* part_d = part_a + static_cast<int64_t>(d.nc) * d.H;
  auto kdx = ssd_chunk_scan_bwd_dx_kernel<TA>;
  allow_smem(kdx, kSmemBwdDx);
  launch_kernel(kdx, dim3(d.nc, d.H), dim3(kThreads), kSmemBwdDx, stream, d, a, dt.data_as<float>(),
                A.data_as<float>(), D.data(), D.dtype() == DType::BF16, docs.start.data_as<int32_t>(),
                static_cast<const float*>(cb.data_as<float>()), states,
                static_cast<const float*>(ds_in.data_as<float>()), dy.data_as<float>(), dact.data_as<TA>(),
                ddt.data_as<float>(), part_a, part_d);
  auto kbc = ssd_chunk_scan_bwd_dbc_kernel<TA>;
  allow_smem(kbc, kSmemBwdDbc);
  launch_kernel(kbc, dim3(d.nc, d.G), dim3(kThreads), kSmemBwdDbc, stream, d, a, dt.data_as<float>(),
                A.data_as<float>(), docs.start.data_as<int32_t>(), states,
                static_cast<const float*>(ds_in.data_as<float>()), dy.data_as<float>(), dact.data_as<TA>());
  launch_kernel(ssd_param_reduce_kernel, dim3((d.H + 127) / 128), dim3(128), 0, stream, d.nc, d.H,
                static_cast<const float*>(part_a), static_cast<const float*>(part_d), dA.data_as<float>(),
                dD.defined() ? dD.data_as<float>() : static_cast<float*>(nullptr));
}

}  // namespace

int64_t ssd_scan_states_numel(const SsdScanShape& s, int64_t tokens) {
  return (tokens + kSsdChunk - 1) / kSsdChunk * s.heads * s.head_dim * s.state;
}

void ssd_scan_forward(const SsdScanShape& s, const Tensor& act, const Tensor& dt, const Tensor& A, const Tensor& D,
                      const AttentionDocs& docs, Tensor& y, Tensor* states, cudaStream_t stream) {
  const char* op = "ssd_scan_forward";
  const Dims d = check_common(op, s, act, dt, A, D, docs);
  const int dev = act.device().index;
  check_tensor(y, "ssd scan y", dev, DType::F32, static_cast<int64_t>(d.T) * d.H * d.P);
  const int64_t numel = ssd_scan_states_numel(s, d.T);
  if (states) check_tensor(*states, "ssd scan states", dev, DType::F32, numel);
  if (d.T == 0) return;
  Tensor tmp;
  float* st = nullptr;
  if (states) {
    st = states->data_as<float>();
  } else {
    tmp = Tensor::empty({numel}, DType::F32, act.device());
    st = tmp.data_as<float>();
  }
  if (act.dtype() == DType::BF16)
    forward_impl<bf16>(d, act, dt, A, D, docs, y, st, stream);
  else
    forward_impl<float>(d, act, dt, A, D, docs, y, st, stream);
}

void ssd_scan_backward(const SsdScanShape& s, const Tensor& act, const Tensor& dt, const Tensor& A, const Tensor& D,
                       const AttentionDocs& docs, const Tensor& dy, const Tensor* states, Tensor& dact, Tensor& ddt,
                       Tensor& dA, Tensor& dD, cudaStream_t stream) {
  const char* op = "ssd_scan_backward";
  const Dims d = check_common(op, s, act, dt, A, D, docs);
  const int dev = act.device().index;
  check_tensor(dy, "ssd scan dy", dev, DType::F32, static_cast<int64_t>(d.T) * d.H * d.P);
  check_tensor(dact, "ssd scan dact", dev, act.dtype(), act.numel());
  check_tensor(ddt, "ssd scan ddt", dev, DType::F32, static_cast<int64_t>(d.T) * d.H);
  check_tensor(dA, "ssd scan dA", dev, DType::F32, d.H);
  if (dD.defined()) check_tensor(dD, "ssd scan dD", dev, DType::F32, d.H);
  if (states) check_tensor(*states, "ssd scan states", dev, DType::F32, ssd_scan_states_numel(s, d.T));
  if (d.T == 0) {
    fill_zero_async(dA, stream);
    return;
  }
  const float* st = states ? states->data_as<float>() : nullptr;
  if (act.dtype() == DType::BF16)
    backward_impl<bf16>(d, act, dt, A, D, docs, dy, st, dact, ddt, dA, dD, stream);
  else
    backward_impl<float>(d, act, dt, A, D, docs, dy, st, dact, ddt, dA, dD, stream);
}

}  // namespace mt::cuda

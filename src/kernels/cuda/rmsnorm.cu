#include "kernels/cuda/rmsnorm.h"

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/flash_dq_layout.cuh"
#include "kernels/cuda/rope_math.cuh"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/tensor_checks.h"
#include "kernels/cuda/kernel_launch.cuh"

namespace mt::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;

// One warp per row. With `res`, the row is first replaced by x + res (rounded to T) and written to `sum`.
// round_once (GPT-OSS): out = w·(x·rstd) rounded once, instead of w·round(x·rstd) rounded again.
template <typename T>
__global__ void rmsnorm_forward_kernel(const T* x, const T* res, const T* __restrict__ w,
                                       T* sum, T* out, float* rstd_out, int64_t rows, int64_t n, float eps,
                                       bool round_once) {
  pdl_wait();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* xr = x + row * n;
  float ss = 0.0f;
  if (res) {
    const T* rr = res + row * n;
    T* sr = sum + row * n;
    for (int64_t i = lane; i < n; i += 32) {
      const float h = Elt<T>::round(Elt<T>::load(xr, i) + Elt<T>::load(rr, i));
      Elt<T>::store(sr, i, h);
      ss += h * h;
    }
    xr = sr;  // the same lane reads back exactly the elements it wrote
  } else {
    for (int64_t i = lane; i < n; i += 32) {
      const float v = Elt<T>::load(xr, i);
      ss += v * v;
    }
  }
  ss = warp_sum(ss);
  const float rstd = rsqrtf(ss / static_cast<float>(n) + eps);
  if (rstd_out && lane == 0) rstd_out[row] = rstd;
  T* orow = out + row * n;
  for (int64_t i = lane; i < n; i += 32) {
    const float y = Elt<T>::load(xr, i) * rstd;
    Elt<T>::store(orow, i, Elt<T>::load(w, i) * (round_once ? y : Elt<T>::round(y)));
  }
}

// Backward pass 1, one warp per row: rstd and m = mean((dy ⊙ w) ⊙ y), y = x·rstd.
template <typename T>
__global__ void rmsnorm_row_stats_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                                         float* rstd_out, float* m_out, int64_t rows, int64_t n, float eps) {
  pdl_wait();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* xr = x + row * n;
  const T* gr = dy + row * n;
  float ss = 0.0f, dot = 0.0f;
  for (int64_t i = lane; i < n; i += 32) {
    const float v = Elt<T>::load(xr, i);
    ss += v * v;
    dot += Elt<T>::load(gr, i) * Elt<T>::load(w, i) * v;
  }
  ss = warp_sum(ss);
  dot = warp_sum(dot);
  const float rstd = rsqrtf(ss / static_cast<float>(n) + eps);
  if (lane == 0) {
    rstd_out[row] = rstd;
    m_out[row] = dot * rstd / static_cast<float>(n);
  }
}

// Backward pass 2: partial[chunk, c] = Σ_{rows of chunk} dy[r, c]·x[r, c]·rstd[r] (coalesced over c).
template <typename T>
__global__ void rmsnorm_dw_partial_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                          const float* __restrict__ rstd, float* partial, int64_t rows, int64_t n,
                                          int64_t chunk_rows) {
  pdl_wait();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= n) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t r1 = min(rows, r0 + chunk_rows);
  float s = 0.0f;
  for (int64_t r = r0; r < r1; ++r) s += Elt<T>::load(dy, r * n + c) * (Elt<T>::load(x, r * n + c) * rstd[r]);
  partial[blockIdx.y * n + c] = s;
}

// Backward pass 3: dw[c] += Σ_chunks partial[chunk, c], chunks in order.
__global__ void rmsnorm_dw_reduce_kernel(const float* __restrict__ partial, float* dw, int64_t chunks, int64_t n) {
  pdl_wait();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= n) return;
  float s = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) s += partial[k * n + c];
  dw[c] += s;
}

// Backward pass 4 (elementwise): dx = rstd·(dy·w − x·rstd·m) (+ dres).
template <typename T>
__global__ void rmsnorm_dx_kernel(const T* dy, const T* __restrict__ x, const T* __restrict__ w,
                                  const float* __restrict__ rstd, const float* __restrict__ m, const T* dres, T* dx,
                                  int64_t rows, int64_t n) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * n) return;
  const int64_t r = i / n, c = i - r * n;
  const float rs = rstd[r];
  float v = rs * (Elt<T>::load(dy, i) * Elt<T>::load(w, c) - Elt<T>::load(x, i) * rs * m[r]);
  if (dres) v += Elt<T>::load(dres, i);
  Elt<T>::store(dx, i, v);
}

// ---- bf16 rows held in registers (the common shapes: n = 256·VPL, or n ≤ 128 with fewer lanes) ----
// A group of LANES lanes owns one row; lane l holds the 16-byte packets l, l + LANES, … (VPL of them), so
// a row is read once (coalesced) and every later use comes from registers. The separate kernels above
// re-read each row up to three times with 2-byte loads, and reduced dw with one thread per column.

template <int LANES>
__device__ inline float group_sum(float v) {
#pragma unroll
  for (int o = LANES / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Rope (rmsnorm_rope_forward, attention's QK-norm): a row is one head of one token (row = t·heads + head) held
// by LANES lanes of 8 columns each (VPL 1), and the normalized bf16 row is then rotated as rope_forward does:
// lane l's partner columns (j ± D/2) sit in lane l ^ LANES/2 of the same group.
struct RowRope {
  const float* cos = nullptr;  // F32 [T, D/2]
  const float* sin = nullptr;
  int64_t heads = 1;
  // Backward only: dy is the flash backward's fp32 dQ sums (flash_dq_layout.cuh; D 128, 16 lanes) × dq_scale,
  // rounded to bf16 as its own conversion would, instead of a bf16 tensor.
  const float* dq_sums = nullptr;
  float dq_scale = 0;
  int64_t tokens = 0;
};

// A lane's 8 (cos, sin) of token t: half-columns 8·(lane mod LANES/2) onwards.
template <int LANES, int kHalf>
__device__ inline void rope_lane_tables(const RowRope& rope, int64_t t, int lane, float (&c)[8], float (&s)[8]) {
  const int64_t at = t * kHalf + (lane % (LANES / 2)) * 8;
  *reinterpret_cast<float4*>(c) = *reinterpret_cast<const float4*>(rope.cos + at);
  *reinterpret_cast<float4*>(c + 4) = *reinterpret_cast<const float4*>(rope.cos + at + 4);
  *reinterpret_cast<float4*>(s) = *reinterpret_cast<const float4*>(rope.sin + at);
  *reinterpret_cast<float4*>(s + 4) = *reinterpret_cast<const float4*>(rope.sin + at + 4);
}

// The rotation (or its transpose) of a lane's 8 columns: `own` are columns j.. of the first half (first) or of the
// second, `partner` the other half's, from the partner lane. Only the lane's own output of each pair is computed
// (rope_math.cuh's one-output formulas, which the RoPE kernels' pair functions are made of): half the arithmetic of
// computing both and keeping one (the forward is bound by its instruction count, not its loads: query heads
// 0.0403 -> 0.0278 ms, bench/NOTES.md 72).
template <bool kBackward>
__device__ inline void rope_lane(const float (&own)[8], const float (&partner)[8], const float (&c)[8],
                                 const float (&s)[8], bool first, float (&o)[8]) {
  const bool negate = kBackward ? !first : first;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float sp = negate ? -s[e] : s[e];
    o[e] = kBackward ? rope_out_backward(own[e], partner[e], c[e], sp) : rope_out_forward_bf16(own[e], partner[e], c[e], sp);
  }
}

template <int VPL, int LANES>
__global__ void __launch_bounds__(256) rmsnorm_forward_rows_kernel(const bf16* x, const bf16* res,
                                                                   const bf16* __restrict__ w, bf16* sum, bf16* out,
                                                                   float* rstd_out, int64_t rows, float eps,
                                                                   bool round_once) {
  pdl_wait();
  constexpr int kN = VPL * LANES * 8;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / LANES;
  const int lane = threadIdx.x % LANES;
  const bool valid = row < rows;  // no early return: the whole warp takes part in the shuffles
  const int64_t base = (valid ? row : 0) * kN;
  uint4 h[VPL];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    const int64_t off = base + static_cast<int64_t>(j * LANES + lane) * 8;
    float f[8];
    h[j] = valid ? *reinterpret_cast<const uint4*>(x + off) : make_uint4(0, 0, 0, 0);
    bf16x8_to_float(h[j], f);
    if (res) {  // h = bf16(x + res), the new residual stream
      float r[8];
      bf16x8_to_float(valid ? *reinterpret_cast<const uint4*>(res + off) : make_uint4(0, 0, 0, 0), r);
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] += r[e];
      h[j] = float_to_bf16x8(f);
      bf16x8_to_float(h[j], f);
      if (valid) *reinterpret_cast<uint4*>(sum + off) = h[j];
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += f[e] * f[e];
  }
  ss = group_sum<LANES>(ss);
  const float rstd = rsqrtf(ss / static_cast<float>(kN) + eps);
  if (!valid) return;
  if (rstd_out && lane == 0) rstd_out[row] = rstd;
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    const int c = (j * LANES + lane) * 8;
    float f[8], wf[8];
    bf16x8_to_float(h[j], f);
    bf16x8_to_float(*reinterpret_cast<const uint4*>(w + c), wf);
    if (round_once) {  // GPT-OSS: bf16(w · (x·rstd))
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = wf[e] * (f[e] * rstd);
    } else {  // Qwen: bf16(w · bf16(x·rstd))
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = wf[e] * Elt<bf16>::round(f[e] * rstd);
    }
    *reinterpret_cast<uint4*>(out + base + c) = float_to_bf16x8(f);
  }
}

// QK-norm + RoPE forward (rmsnorm_rope_forward): a group of LANES lanes, one 8-column packet each, takes R
// consecutive rows, R heads of one token (R divides the head count), so its R row loads are in flight together and
// the token's rope tables and the weights are loaded once for the R rows. That alone measured no faster than one
// row per group (the kernel was bound by its instructions, bench/NOTES.md 68); after rope_lane's cut, 2 rows are the
// fastest for the query heads (72). The arithmetic per row is the generic kernel's and rope_forward's, bit for bit.
template <int LANES, int R>
__global__ void __launch_bounds__(256, 4) rmsnorm_rope_forward_rows_kernel(const bf16* x, const bf16* __restrict__ w,
                                                                        bf16* out, int64_t rows, float eps,
                                                                        RowRope rope) {
  pdl_wait();
  static_assert(LANES >= 2, "the rotation partner sits in another lane");
  constexpr int kN = LANES * 8;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / LANES * R;
  const int lane = threadIdx.x % LANES;
  const bool valid = first < rows;  // rows is a multiple of R: a group's rows are all valid or all past the end
  const int64_t base = (valid ? first : 0) * kN + lane * 8;
  uint4 h[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    h[r] = valid ? *reinterpret_cast<const uint4*>(x + base + r * kN) : make_uint4(0, 0, 0, 0);
  float ss[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float f[8];
    bf16x8_to_float(h[r], f);
    ss[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) ss[r] += f[e] * f[e];
  }
#pragma unroll
  for (int r = 0; r < R; ++r) ss[r] = group_sum<LANES>(ss[r]);  // no early return before: whole-warp shuffles
  float c[8], sn[8], wf[8];
  rope_lane_tables<LANES, kN / 2>(rope, (valid ? first : 0) / rope.heads, lane, c, sn);
  bf16x8_to_float(*reinterpret_cast<const uint4*>(w + lane * 8), wf);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float rstd = rsqrtf(ss[r] / static_cast<float>(kN) + eps);
    float f[8], p[8], o[8];
    bf16x8_to_float(h[r], f);
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = Elt<bf16>::round(wf[e] * Elt<bf16>::round(f[e] * rstd));  // the norm's output
#pragma unroll
    for (int e = 0; e < 8; ++e) p[e] = __shfl_xor_sync(0xffffffffu, f[e], LANES / 2);
    rope_lane<false>(f, p, c, sn, lane < LANES / 2, o);
    if (valid) *reinterpret_cast<uint4*>(out + base + r * kN) = float_to_bf16x8(o);
  }
}

// The whole backward in one pass over the rows. Worker g (a group of LANES lanes) takes rows g, g + W, …
// (W workers in all, fixed by the shape), computes each row's stats, writes dx and adds dy ⊙ x·rstd
// into its own column sums; the block's sums become partial[block] (summed in order by rmsnorm_dw_sum_kernel).
// ROPE (rmsnorm_rope_backward): dy is the gradient of the rotated row; it is first taken back through the
// rotation (rope_backward, rounded to bf16 as that kernel stores it) in registers.
// Head-dim rows: at most 64 registers (four blocks per SM). Wider rows: no minimum (0), which keeps the hidden-size
// rows at 254 registers without spills; a minimum of 1 made ptxas spill 168 bytes there.
template <int VPL, int LANES, bool ROPE = false>
__global__ void __launch_bounds__(256, VPL == 1 ? 4 : 0)
    rmsnorm_backward_rows_kernel(const bf16* dy, const bf16* __restrict__ x, const bf16* __restrict__ w,
                                 const bf16* dres, bf16* dx, float* __restrict__ partial, int64_t rows, float eps,
                                 RowRope rope, bool prefetch_next) {
  pdl_wait();
  constexpr int kN = VPL * LANES * 8;
  const int64_t g = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / LANES;
  const int64_t workers = static_cast<int64_t>(gridDim.x) * blockDim.x / LANES;
  const int lane = threadIdx.x % LANES;
  float acc[VPL][8];  // w is re-read from L1 where needed: registers go to these sums
#pragma unroll
  for (int j = 0; j < VPL; ++j)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[j][e] = 0.0f;
  // Every worker runs the same number of iterations (shuffles need the whole warp); rows past the end
  // are masked.
  const int64_t iters = (rows + workers - 1) / workers;
  // Where the query heads' dQ comes from the flash backward's fp32 sums: lane l's 8 columns are one 32-byte run
  // (flash_dq_layout.cuh; D 128, 16 lanes; half l / 8, pairs 4(l % 8)..+3).
  auto dq_src = [&rope, lane](int64_t r) {
    const int64_t t = r / rope.heads, h = r % rope.heads;
    return rope.dq_sums + flash_dq_row_offset(rope.tokens, t, h, lane >> 3) + 2 * flash_dq_slot(t, 4 * (lane & 7));
  };
  for (int64_t it = 0; it < iters; ++it) {
    const int64_t row = g + it * workers;
    const bool valid = row < rows;
    const int64_t base = (valid ? row : 0) * kN;
    uint4 dyv[VPL], xv[VPL];
    float ss = 0.0f, dot = 0.0f;
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
      const int64_t off = base + static_cast<int64_t>(j * LANES + lane) * 8;
      dyv[j] = valid && dy ? *reinterpret_cast<const uint4*>(dy + off) : make_uint4(0, 0, 0, 0);
      xv[j] = valid ? *reinterpret_cast<const uint4*>(x + off) : make_uint4(0, 0, 0, 0);
    }
    // The residual gradient is read only after the row's sums: start bringing it into L1 with the row, so the
    // second pass does not wait for HBM a second time (no registers to hold it: the row's packets and the dw sums
    // fill them at 8 packets per lane). 0.0348 -> 0.0276 ms at [4096, 2048] (bench/NOTES.md 66).
    if (dres && valid)
#pragma unroll
      for (int j = 0; j < VPL; ++j)
        asm volatile("prefetch.global.L1 [%0];" ::"l"(dres + base + static_cast<int64_t>(j * LANES + lane) * 8));
    // The worker's next row into L1 while this one is worked on: with a row per iteration each lane had one or
    // two loads in flight and the loop waited for HBM at every row. Head-dim rows only: the hidden-size rows (8
    // packets per lane, 254 registers, one block per SM) were not measured with it.
    if constexpr (VPL <= 2) {
      const int64_t next = row + workers;
      if (prefetch_next && next < rows) {
#pragma unroll
        for (int j = 0; j < VPL; ++j) {
          const int64_t off = next * kN + static_cast<int64_t>(j * LANES + lane) * 8;
          if (dy) asm volatile("prefetch.global.L1 [%0];" ::"l"(dy + off));
          asm volatile("prefetch.global.L1 [%0];" ::"l"(x + off));
        }
        if constexpr (ROPE && LANES == 16)
          if (rope.dq_sums) asm volatile("prefetch.global.L1 [%0];" ::"l"(dq_src(next)));
      }
    }
    if constexpr (ROPE) {
      static_assert(VPL == 1 && LANES >= 2, "one 8-column packet per lane, the rotation partner in another lane");
      float g[8], p[8], o[8], c[8], sn[8];
      if constexpr (LANES == 16) {
        if (rope.dq_sums) {  // lane l holds columns 8l..8l+7
          const float* src = dq_src(valid ? row : 0);
          const float4 lo = *reinterpret_cast<const float4*>(src), hi = *reinterpret_cast<const float4*>(src + 4);
          const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
          for (int e = 0; e < 8; ++e) g[e] = Elt<bf16>::round(v[e] * rope.dq_scale);
        } else {
          bf16x8_to_float(dyv[0], g);
        }
      } else {
        bf16x8_to_float(dyv[0], g);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) p[e] = __shfl_xor_sync(0xffffffffu, g[e], LANES / 2);
      rope_lane_tables<LANES, kN / 2>(rope, (valid ? row : 0) / rope.heads, lane, c, sn);
      rope_lane<true>(g, p, c, sn, lane < LANES / 2, o);
      dyv[0] = float_to_bf16x8(o);  // rope_backward's bf16 output
    }
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
      float d[8], xf[8], wf[8];
      bf16x8_to_float(dyv[j], d);
      bf16x8_to_float(xv[j], xf);
      bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(w + (j * LANES + lane) * 8)), wf);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        ss += xf[e] * xf[e];
        dot += d[e] * wf[e] * xf[e];
      }
    }
    ss = group_sum<LANES>(ss);
    dot = group_sum<LANES>(dot);
    if (!valid) continue;
    const float rs = rsqrtf(ss / static_cast<float>(kN) + eps);
    const float m = dot * rs / static_cast<float>(kN);
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
      const int64_t off = base + static_cast<int64_t>(j * LANES + lane) * 8;
      float d[8], xf[8], wf[8], o[8];
      bf16x8_to_float(dyv[j], d);
      bf16x8_to_float(xv[j], xf);
      bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(w + (j * LANES + lane) * 8)), wf);
      float r[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (dres) bf16x8_to_float(*reinterpret_cast<const uint4*>(dres + off), r);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        acc[j][e] += d[e] * (xf[e] * rs);
        o[e] = rs * (d[e] * wf[e] - xf[e] * rs * m) + r[e];
      }
      *reinterpret_cast<uint4*>(dx + off) = float_to_bf16x8(o);
    }
  }
  // The block's groups add their sums pairwise through shared memory (a fixed tree), and group 0 writes
  // the block's partial row: one row per block keeps the final column sums short.
  constexpr int kGroups = 256 / LANES;
  __shared__ float4 red[kGroups / 2 > 0 ? kGroups / 2 : 1][VPL * LANES * 2];
  const int grp = threadIdx.x / LANES;
#pragma unroll
  for (int half = kGroups / 2; half >= 1; half /= 2) {
    if (grp >= half && grp < 2 * half)
#pragma unroll
      for (int j = 0; j < VPL; ++j) {
        red[grp - half][(j * LANES + lane) * 2] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
        red[grp - half][(j * LANES + lane) * 2 + 1] = make_float4(acc[j][4], acc[j][5], acc[j][6], acc[j][7]);
      }
    __syncthreads();
    if (grp < half)
#pragma unroll
      for (int j = 0; j < VPL; ++j) {
        const float4 a = red[grp][(j * LANES + lane) * 2], b = red[grp][(j * LANES + lane) * 2 + 1];
        acc[j][0] += a.x, acc[j][1] += a.y, acc[j][2] += a.z, acc[j][3] += a.w;
        acc[j][4] += b.x, acc[j][5] += b.y, acc[j][6] += b.z, acc[j][7] += b.w;
      }
    __syncthreads();
  }
  if (grp != 0) return;
  float* prow = partial + static_cast<int64_t>(blockIdx.x) * kN;
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    const int c = (j * LANES + lane) * 8;
    *reinterpret_cast<float4*>(prow + c) = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
    *reinterpret_cast<float4*>(prow + c + 4) = make_float4(acc[j][4], acc[j][5], acc[j][6], acc[j][7]);
  }
}

// dw[c] += Σ_b partial[b][c]: a block of 32 columns × 32 row strides (eight loads in flight per thread),
// then the 32 sums added in a fixed order (deterministic).
__global__ void __launch_bounds__(1024) rmsnorm_dw_sum_kernel(const float* __restrict__ partial, float* dw,
                                                              int64_t parts, int64_t n) {
  pdl_wait();
  __shared__ float s[32][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float v = 0.0f;
  if (c < n) {
    int64_t k = threadIdx.y;
    for (; k + 7 * 32 < parts; k += 8 * 32) {
      float t[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) t[u] = partial[(k + u * 32) * n + c];
#pragma unroll
      for (int u = 0; u < 8; ++u) v += t[u];
    }
    for (; k < parts; k += 32) v += partial[k * n + c];
  }
  s[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y == 0 && c < n) {
    float t = 0.0f;
#pragma unroll
    for (int k = 0; k < 32; ++k) t += s[k][threadIdx.x];
    dw[c] += t;
  }
}

// Lanes per row and packets per lane for a row of n bf16, or {0, 0} where the register path does not apply.
struct RowLayout {
  int vpl = 0, lanes = 0;
};
RowLayout row_layout(int64_t n) {
  if (n % 8 != 0) return {};
  const int64_t packets = n / 8;
  if (packets <= 32 && (packets & (packets - 1)) == 0) return {1, static_cast<int>(packets)};
  if (packets % 32 != 0) return {};
  const int64_t vpl = packets / 32;
  if (vpl == 1 || vpl == 2 || vpl == 4 || vpl == 6 || vpl == 8 || vpl == 12 || vpl == 16)
    return {static_cast<int>(vpl), 32};
  return {};
}


// Calls f.template operator()<VPL, LANES>() for the layout (one of the instantiated pairs, VPL ≤ kMaxVpl).
template <int kMaxVpl, typename F>
void with_row_layout(RowLayout l, F&& f) {
  if (l.lanes < 32) {
    switch (l.lanes) {
      case 1: return f.template operator()<1, 1>();
      case 2: return f.template operator()<1, 2>();
      case 4: return f.template operator()<1, 4>();
      case 8: return f.template operator()<1, 8>();
      case 16: return f.template operator()<1, 16>();
    }
  }
  switch (l.vpl) {
    case 1: return f.template operator()<1, 32>();
    case 2: return f.template operator()<2, 32>();
    case 4: return f.template operator()<4, 32>();
    case 6: return f.template operator()<6, 32>();
    case 8: return f.template operator()<8, 32>();
    case 12:
      if constexpr (kMaxVpl >= 12) return f.template operator()<12, 32>();
      break;
    case 16:
      if constexpr (kMaxVpl >= 16) return f.template operator()<16, 32>();
      break;
  }
  MT_CUDA_REQUIRE(false, "rmsnorm: no row layout for this width");
}

struct Rows {
  int device;
  int64_t rows, n;
};

Rows check_norm_io(const Tensor& x, const Tensor& w, const char* op) {
  check_float_dtype(x, op);
  MT_CUDA_REQUIRE(w.ndim() == 1 && x.ndim() >= 1 && x.dim(-1) == w.dim(0),
                  std::string(op) + ": input " + tensor_where(x) + " does not match weight " + tensor_where(w));
  const int dev = x.device().index;
  const int64_t n = w.dim(0);
  check_tensor(w, op, dev, x.dtype(), n);
  return {dev, n == 0 ? 0 : x.numel() / n, n};
}

template <typename T>
void launch_forward(const Tensor& x, const Tensor* res, const Tensor& w, float eps, Tensor* sum, Tensor& out,
                    Tensor* rstd, bool round_once, const Rows& r, cudaStream_t stream) {
  if (r.rows == 0 || r.n == 0) return;
  if constexpr (std::is_same_v<T, bf16>) {
    const RowLayout l = row_layout(r.n);
    const bf16* resp = res ? res->data_as<bf16>() : nullptr;
    bf16* sump = sum ? sum->data_as<bf16>() : nullptr;
    if (l.lanes > 0 && aligned16(x.data()) && aligned16(resp) && aligned16(w.data()) && aligned16(sump) &&
        aligned16(out.data())) {
      with_row_layout<16>(l, [&]<int VPL, int LANES>() {
        const unsigned blocks = blocks_for(r.rows * LANES, 256);
        launch_kernel(rmsnorm_forward_rows_kernel<VPL, LANES>, blocks, 256, 0, stream, x.data_as<bf16>(), resp,
            w.data_as<bf16>(), sump, out.data_as<bf16>(), rstd ? rstd->data_as<float>() : nullptr, r.rows, eps,
            round_once);
      });
      return;
    }
  }
  launch_kernel(rmsnorm_forward_kernel<T>, blocks_for(r.rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream,
      x.data_as<T>(), res ? res->data_as<T>() : nullptr, w.data_as<T>(), sum ? sum->data_as<T>() : nullptr,
      out.data_as<T>(), rstd ? rstd->data_as<float>() : nullptr, r.rows, r.n, eps, round_once);
}

void forward_any(const Tensor& x, const Tensor* res, const Tensor& w, float eps, Tensor* sum, Tensor& out,
                 Tensor* rstd, bool round_once, cudaStream_t stream, const char* op) {
  const Rows r = check_norm_io(x, w, op);
  check_tensor(out, op, r.device, x.dtype(), x.numel());
  if (res) check_tensor(*res, op, r.device, x.dtype(), x.numel());
  if (sum) check_tensor(*sum, op, r.device, x.dtype(), x.numel());
  if (rstd) check_tensor(*rstd, op, r.device, DType::F32, r.rows);
  if (x.dtype() == DType::BF16)
    launch_forward<bf16>(x, res, w, eps, sum, out, rstd, round_once, r, stream);
  else
    launch_forward<float>(x, res, w, eps, sum, out, rstd, round_once, r, stream);
}

std::atomic<bool> g_backward_prefetch_next{true};

// The one-pass backward (rmsnorm_backward_rows_kernel) and the ordered sum of its per-block dw partials. Workers:
// enough to fill the GPU (~1k rows of 2048 at a time) with at least 8 rows each on tall inputs (fewer partial rows
// to sum); fixed by the shape, so dw is deterministic and every caller of a shape sums in the same order.
// Head-dim rows (one packet per lane, ~64 registers: four blocks per SM) get 8,192 workers at least, the GPU's
// resident threads; 2,048 left the key heads' 16k rows 128 blocks, one per SM (14 us for 12 MB).
template <int VPL, int LANES, bool ROPE>
void backward_rows_launch(const bf16* dy, const Tensor& x, const Tensor& w, const bf16* dres, Tensor& dx, Tensor& dw,
                          const Rows& r, float eps, const RowRope& rope, cudaStream_t stream) {
  const int64_t per_block = 256 / LANES;
  const int64_t min_workers = (VPL == 1 ? 4 * 32768 : 32768) / LANES;
  const int64_t workers = std::min<int64_t>(r.rows, std::max<int64_t>(min_workers, r.rows / 8));
  const int64_t blocks = (workers + per_block - 1) / per_block;
  Tensor partial = Tensor::empty({blocks, r.n}, DType::F32, Device::cuda(r.device));
  launch_kernel(rmsnorm_backward_rows_kernel<VPL, LANES, ROPE>, static_cast<unsigned>(blocks), 256, 0, stream, dy,
      x.data_as<bf16>(), w.data_as<bf16>(), dres, dx.data_as<bf16>(), partial.data_as<float>(), r.rows, eps, rope,
      g_backward_prefetch_next.load());
  launch_kernel(rmsnorm_dw_sum_kernel, blocks_for(r.n, 32), dim3(32, 32), 0, stream, partial.data_as<float>(),
      dw.data_as<float>(), blocks, r.n);
}

template <typename T>
void launch_backward(const Tensor& dy, const Tensor& x, const Tensor& w, float eps, Tensor& dx, Tensor& dw,
                     const Tensor* dres, const Rows& r, cudaStream_t stream) {
  if (r.rows == 0 || r.n == 0) return;
  const Device d = Device::cuda(r.device);
  if constexpr (std::is_same_v<T, bf16>) {
    // Up to 8 packets per lane: wider rows (64 dw sums per lane already fill the registers) spill.
    const RowLayout l = row_layout(r.n).vpl <= 8 ? row_layout(r.n) : RowLayout{};
    const bf16* dresp = dres ? dres->data_as<bf16>() : nullptr;
    if (l.lanes > 0 && aligned16(dy.data()) && aligned16(x.data()) && aligned16(w.data()) && aligned16(dresp) &&
        aligned16(dx.data())) {
      with_row_layout<8>(l, [&]<int VPL, int LANES>() {
        backward_rows_launch<VPL, LANES, false>(dy.data_as<bf16>(), x, w, dresp, dx, dw, r, eps, {}, stream);
      });
      return;
    }
  }
  Tensor rstd = Tensor::empty({r.rows}, DType::F32, d);
  Tensor m = Tensor::empty({r.rows}, DType::F32, d);
  launch_kernel(rmsnorm_row_stats_kernel<T>, blocks_for(r.rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream,
      dy.data_as<T>(), x.data_as<T>(), w.data_as<T>(), rstd.data_as<float>(), m.data_as<float>(), r.rows, r.n, eps);
  // Fixed chunking (depends only on the shape): at most ~1024 partial rows per column.
  const int64_t chunk_rows = std::max<int64_t>(32, (r.rows + 1023) / 1024);
  const int64_t chunks = (r.rows + chunk_rows - 1) / chunk_rows;
  Tensor partial = Tensor::empty({chunks, r.n}, DType::F32, d);
  dim3 grid(blocks_for(r.n, 256), static_cast<unsigned>(chunks));
  launch_kernel(rmsnorm_dw_partial_kernel<T>, grid, 256, 0, stream, dy.data_as<T>(), x.data_as<T>(),
      rstd.data_as<float>(), partial.data_as<float>(), r.rows, r.n, chunk_rows);
  launch_kernel(rmsnorm_dw_reduce_kernel, blocks_for(r.n, 256), 256, 0, stream, partial.data_as<float>(),
      dw.data_as<float>(), chunks, r.n);
  // dx last: it may overwrite dy, which the dw passes read.
  launch_kernel(rmsnorm_dx_kernel<T>, blocks_for(r.rows * r.n, 256), 256, 0, stream, dy.data_as<T>(), x.data_as<T>(),
      w.data_as<T>(), rstd.data_as<float>(), m.data_as<float>(), dres ? dres->data_as<T>() : nullptr, dx.data_as<T>(),
      r.rows, r.n);
}

}  // namespace

void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& out, Tensor* rstd, cudaStream_t stream,
                     bool round_once) {
  forward_any(x, nullptr, w, eps, nullptr, out, rstd, round_once, stream, "rmsnorm_forward");
}

void rmsnorm_residual_forward(const Tensor& x, const Tensor& residual, const Tensor& w, float eps, Tensor& sum,
                              Tensor& out, Tensor* rstd, cudaStream_t stream, bool round_once) {
  forward_any(x, &residual, w, eps, &sum, out, rstd, round_once, stream, "rmsnorm_residual_forward");
}

namespace {

// The fused QK-norm + RoPE rows apply: bf16, one 8-column packet per lane (head_dim 16..256, a power of two),
// cos/sin [T, D/2] over x's rows (T · heads rows), everything 16-byte aligned.
bool rope_rows_apply(const Tensor& x, const Tensor& cos, const Tensor& sin, const Rows& r,
                     std::initializer_list<const Tensor*> more) {
  const RowLayout l = row_layout(r.n);
  if (x.dtype() != DType::BF16 || l.vpl != 1 || l.lanes < 2 || r.n % 16 != 0) return false;
  if (cos.ndim() != 2 || cos.dim(1) * 2 != r.n || cos.dim(0) == 0 || r.rows % cos.dim(0) != 0) return false;
  if (sin.numel() != cos.numel() || cos.dtype() != DType::F32 || sin.dtype() != DType::F32) return false;
  bool aligned = aligned16(x.data()) && aligned16(cos.data()) && aligned16(sin.data());
  for (const Tensor* t : more) aligned = aligned && aligned16(t->data());
  return aligned;
}

RowRope row_rope_of(const Tensor& cos, const Tensor& sin, const Rows& r, const char* op) {
  check_tensor(cos, op, r.device, DType::F32, cos.numel());
  check_tensor(sin, op, r.device, DType::F32, cos.numel());
  return {cos.data_as<float>(), sin.data_as<float>(), r.rows / cos.dim(0)};
}

std::atomic<int> g_rope_rows_per_group{0};

// Rows per lane group of the QK-norm + RoPE forward: 2 where the head count is even and 32,768 groups remain (the
// query heads: 1 / 2 / 4 rows measured 0.0289 / 0.0266 / 0.0277 ms, bench/NOTES.md 72), else 1 (the key heads' 16k
// rows: 0.0047 / 0.0051 / 0.0049); or the value detail::rmsnorm_rope_rows_per_group_set chose, where it divides the
// head count (a group's rows share one token).
int rope_rows_per_group(int64_t heads, int64_t rows) {
  const int set = g_rope_rows_per_group.load();
  if (set > 0) return heads % set == 0 ? set : 1;
  return heads % 2 == 0 && rows / 2 >= 32768 ? 2 : 1;
}

}  // namespace

namespace detail {
void rmsnorm_rope_rows_per_group_set(int rows) { g_rope_rows_per_group.store(rows); }
void rmsnorm_backward_prefetch_next_set(bool on) { g_backward_prefetch_next.store(on); }
}  // namespace detail

void rmsnorm_rope_forward(const Tensor& x, const Tensor& w, float eps, const Tensor& cos, const Tensor& sin,
                          Tensor& out, cudaStream_t stream) {
  const char* op = "rmsnorm_rope_forward";
  const Rows r = check_norm_io(x, w, op);
  check_tensor(out, op, r.device, x.dtype(), x.numel());
  if (r.rows == 0 || r.n == 0) return;
  if (!rope_rows_apply(x, cos, sin, r, {&w, &out})) {
    rmsnorm_forward(x, w, eps, out, nullptr, stream);
    rope_forward(out, cos, sin, out, stream);
    return;
  }
  const RowRope rope = row_rope_of(cos, sin, r, op);
  const int R = rope_rows_per_group(rope.heads, r.rows);
  with_row_layout<16>(row_layout(r.n), [&]<int VPL, int LANES>() {
    if constexpr (VPL == 1 && LANES >= 2) {
      auto launch = [&]<int kR>() {
        launch_kernel(rmsnorm_rope_forward_rows_kernel<LANES, kR>, blocks_for(r.rows / kR * LANES, 256), 256, 0,
            stream, x.data_as<bf16>(), w.data_as<bf16>(), out.data_as<bf16>(), r.rows, eps, rope);
      };
      if (R == 4) return launch.template operator()<4>();
      if (R == 2) return launch.template operator()<2>();
      launch.template operator()<1>();
    }
  });
}

void rmsnorm_rope_backward(const Tensor& dy, const Tensor& x, const Tensor& w, float eps, const Tensor& cos,
                           const Tensor& sin, Tensor& dx, Tensor& dw, cudaStream_t stream) {
  const char* op = "rmsnorm_rope_backward";
  const Rows r = check_norm_io(x, w, op);
  check_tensor(dy, op, r.device, x.dtype(), x.numel());
  check_tensor(dx, op, r.device, x.dtype(), x.numel());
  check_tensor(dw, op, r.device, DType::F32, r.n);
  if (r.rows == 0 || r.n == 0) return;
  if (!rope_rows_apply(x, cos, sin, r, {&w, &dy, &dx})) {
    Tensor unrotated = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    rope_backward(dy, cos, sin, unrotated, stream);
    rmsnorm_backward(unrotated, x, w, eps, dx, dw, nullptr, stream);
    return;
  }
  const RowRope rope = row_rope_of(cos, sin, r, op);
  with_row_layout<8>(row_layout(r.n), [&]<int VPL, int LANES>() {
    if constexpr (VPL == 1 && LANES >= 2)
      backward_rows_launch<VPL, LANES, true>(dy.data_as<bf16>(), x, w, nullptr, dx, dw, r, eps, rope, stream);
  });
}

void rmsnorm_rope_backward_from_flash_dq(const FlashDqSums& dq, const Tensor& x, const Tensor& w, float eps,
                                         const Tensor& cos, const Tensor& sin, Tensor& dx, Tensor& dw,
                                         cudaStream_t stream) {
  const char* op = "rmsnorm_rope_backward_from_flash_dq";
  const Rows r = check_norm_io(x, w, op);
  check_tensor(dx, op, r.device, x.dtype(), x.numel());
  check_tensor(dw, op, r.device, DType::F32, r.n);
  MT_CUDA_REQUIRE(dq.acc.defined() && dq.tokens * dq.heads == r.rows && r.n == 128 && dq.acc.numel() == r.rows * r.n,
                  std::string(op) + ": needs the sums of the query heads of x " + tensor_where(x) + " (head_dim 128)");
  check_tensor(dq.acc, op, r.device, DType::F32, dq.acc.numel());
  if (!rope_rows_apply(x, cos, sin, r, {&w, &dx})) {  // the rows kernels cannot take it: via a bf16 dq
    Tensor dq_bf16 = Tensor::empty(x.shape(), DType::BF16, x.device());
    flash_dq_sums_to_bf16(dq, dq_bf16, stream);
    rmsnorm_rope_backward(dq_bf16, x, w, eps, cos, sin, dx, dw, stream);
    return;
  }
  RowRope rope = row_rope_of(cos, sin, r, op);
  rope.dq_sums = dq.acc.data_as<float>();
  rope.dq_scale = dq.scale;
  rope.tokens = dq.tokens;
  backward_rows_launch<1, 16, true>(nullptr, x, w, nullptr, dx, dw, r, eps, rope, stream);
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, float eps, Tensor& dx, Tensor& dw,
                      const Tensor* dresidual, cudaStream_t stream) {
  const char* op = "rmsnorm_backward";
  const Rows r = check_norm_io(x, w, op);
  check_tensor(dy, op, r.device, x.dtype(), x.numel());
  check_tensor(dx, op, r.device, x.dtype(), x.numel());
  check_tensor(dw, op, r.device, DType::F32, r.n);
  if (dresidual) check_tensor(*dresidual, op, r.device, x.dtype(), x.numel());
  if (x.dtype() == DType::BF16)
    launch_backward<bf16>(dy, x, w, eps, dx, dw, dresidual, r, stream);
  else
    launch_backward<float>(dy, x, w, eps, dx, dw, dresidual, r, stream);
}

}  // namespace mt::cuda

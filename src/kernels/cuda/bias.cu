#include "kernels/cuda/bias.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernel_launch.cuh"
#include "kernels/cuda/tensor_checks.h"

// Layout shared by the kernels here: a warp covers 256 columns of a row, 8 per lane. With VEC (C % 8 == 0 and
// 16-byte aligned data) lane l holds the contiguous columns 8l..8l+7 (one 16-byte access for bf16, two for fp32);
// otherwise columns l, l + 32, …, l + 224 (scalar, still coalesced). The arithmetic per column is the same either
// way, so both give the same bits.

namespace mt::cuda {

namespace {

constexpr int kTileCols = 256;      // columns per warp (and per column-sum block)
constexpr int kSumWarps = 8;        // warps of a column-sum block, each taking every 8th row of a segment
constexpr int kAddThreads = 128;    // threads of a bias-add block: 1024 columns of one row
constexpr int kReduceRows = 8;      // threadIdx.y of the ordered reduce

template <bool VEC>
__device__ __forceinline__ int64_t lane_col(int lane, int k) {
  return VEC ? 8 * lane + k : lane + 32 * k;
}

template <typename T, bool VEC>
__device__ __forceinline__ void load8(const T* row, int64_t c0, int lane, int64_t C, float (&f)[8]) {
  if constexpr (VEC) {
    const int64_t c = c0 + 8 * lane;
    if (c >= C) {
#pragma unroll
      for (int k = 0; k < 8; ++k) f[k] = 0.0f;
    } else if constexpr (Elt<T>::kBf16) {
      bf16x8_to_float(*reinterpret_cast<const uint4*>(row + c), f);
    } else {
      const float4 lo = *reinterpret_cast<const float4*>(row + c), hi = *reinterpret_cast<const float4*>(row + c + 4);
      f[0] = lo.x, f[1] = lo.y, f[2] = lo.z, f[3] = lo.w, f[4] = hi.x, f[5] = hi.y, f[6] = hi.z, f[7] = hi.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t c = c0 + lane + 32 * k;
      f[k] = c < C ? Elt<T>::load(row, c) : 0.0f;
    }
  }
}

template <typename T, bool VEC>
__device__ __forceinline__ void store8(T* row, int64_t c0, int lane, int64_t C, const float (&f)[8]) {
  if constexpr (VEC) {
    const int64_t c = c0 + 8 * lane;
    if (c >= C) return;
    if constexpr (Elt<T>::kBf16) {
      *reinterpret_cast<uint4*>(row + c) = float_to_bf16x8(f);
    } else {
      *reinterpret_cast<float4*>(row + c) = make_float4(f[0], f[1], f[2], f[3]);
      *reinterpret_cast<float4*>(row + c + 4) = make_float4(f[4], f[5], f[6], f[7]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t c = c0 + lane + 32 * k;
      if (c < C) Elt<T>::store(row, c, f[k]);
    }
  }
}

__device__ __forceinline__ int64_t clamp_to(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

// The rows of the grouped layout that belong to some expert: [0, offsets[E]) clamped into [0, N].
__device__ __forceinline__ int64_t grouped_rows(const int32_t* offsets, int E, int64_t N) {
  return offsets ? clamp_to(__ldg(offsets + E), 0, N) : N;
}

// The expert of grouped row r: the last e in [0, E) with offsets[e] <= r (an empty expert shares its start with
// the next one, so the last is the one whose range holds r). Always in [0, E), whatever the offsets hold.
__device__ __forceinline__ int expert_of_row(const int32_t* offsets, int E, int64_t r) {
  int lo = 0, hi = E - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (__ldg(offsets + mid) <= r)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// y[r, c] = acc[r, c] + b[c] (dense), or y[r, c] += bias[e(r), c] (grouped: acc = y, offsets given). Block =
// kAddThreads threads × 8 columns of one row at a time; blockIdx.y strides over the rows.
template <typename T, typename B, bool VEC>
__global__ void __launch_bounds__(kAddThreads)
    bias_add_kernel(const float* acc, const T* acc_t, const B* __restrict__ bias, const int32_t* __restrict__ offsets,
                    int E, T* y, int64_t N, int64_t C) {
  pdl_wait();
  const int64_t rows = grouped_rows(offsets, E, N);
  const int lane = threadIdx.x & 31;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * kAddThreads / 32 + threadIdx.x / 32) * kTileCols;
  if (c0 >= C) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const B* br = bias + (offsets ? static_cast<int64_t>(expert_of_row(offsets, E, r)) * C : 0);
    float v[8], b[8];
    if (acc)
      load8<float, VEC>(acc + r * C, c0, lane, C, v);
    else
      load8<T, VEC>(acc_t + r * C, c0, lane, C, v);
    load8<B, VEC>(br, c0, lane, C, b);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] += b[k];
    store8<T, VEC>(y + r * C, c0, lane, C, v);
  }
}

// Column sums over segments of rows, pass 1. Block (column tile, chunk j) takes rows [j·chunk, (j+1)·chunk) of the
// summed rows and splits them at the expert boundaries; for each piece (expert e) its 8 warps sum every 8th row
// (in row order), the warps' sums are added in warp order, and the result goes to partial[j + e]. j + e is
// distinct for every non-empty (chunk, expert) piece (walking the rows, j or e grows at each new piece), so the
// partial rows number chunks + E − 1 at most, whatever the routing. Dense (offsets null): one expert.
template <typename T, bool VEC>
__global__ void __launch_bounds__(kSumWarps * 32)
    colsum_partial_kernel(const T* __restrict__ dy, const int32_t* __restrict__ offsets, int E, int64_t N, int64_t C,
                          int64_t chunk_rows, float* __restrict__ partial) {
  pdl_wait();
  __shared__ float red[kSumWarps][kTileCols];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTileCols;
  const int64_t j = blockIdx.y;
  const int64_t r1 = clamp_to((j + 1) * chunk_rows, 0, grouped_rows(offsets, E, N));
  for (int64_t s = j * chunk_rows; s < r1;) {  // the same trip on every thread of the block
    const int e = offsets ? expert_of_row(offsets, E, s) : 0;
    const int64_t end = offsets ? clamp_to(__ldg(offsets + e + 1), s + 1, r1) : r1;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t r = s + warp;
    // Four rows' loads in flight per lane, added in row order.
    for (; r + 3 * kSumWarps < end; r += 4 * kSumWarps) {
      float f[4][8];
#pragma unroll
      for (int u = 0; u < 4; ++u) load8<T, VEC>(dy + (r + u * kSumWarps) * C, c0, lane, C, f[u]);
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[k] += f[u][k];
    }
    for (; r < end; r += kSumWarps) {
      float f[8];
      load8<T, VEC>(dy + r * C, c0, lane, C, f);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] += f[k];
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) red[warp][lane_col<VEC>(lane, k)] = acc[k];
    __syncthreads();
    const int64_t c = c0 + threadIdx.x;  // kSumWarps · 32 == kTileCols: one column per thread
    if (c < C) {
      float t = 0.0f;
#pragma unroll
      for (int w = 0; w < kSumWarps; ++w) t += red[w][threadIdx.x];
      partial[(j + e) * C + c] = t;
    }
    __syncthreads();  // red is rewritten by the next piece
    s = end;
  }
}

// Pass 2: out[e, c] += Σ over the chunks j that hold rows of expert e of partial[j + e, c], in chunk order (each
// thread of a column strides over the chunks; the kReduceRows sums are then added in order). An expert without rows
// is left untouched.
__global__ void __launch_bounds__(32 * kReduceRows)
    colsum_reduce_kernel(const float* __restrict__ partial, const int32_t* __restrict__ offsets, int64_t N, int64_t C,
                         int64_t chunk_rows, float* out) {
  pdl_wait();
  __shared__ float s[kReduceRows][33];
  const int e = blockIdx.y, E = gridDim.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t rows = grouped_rows(offsets, E, N);
  const int64_t a = offsets ? clamp_to(__ldg(offsets + e), 0, rows) : 0;
  const int64_t b = offsets ? clamp_to(__ldg(offsets + e + 1), 0, rows) : rows;
  if (b <= a) return;  // the whole block: no rows for this expert
  const int64_t j0 = a / chunk_rows, j1 = (b - 1) / chunk_rows;
  float v = 0.0f;
  if (c < C)
    for (int64_t j = j0 + threadIdx.y; j <= j1; j += kReduceRows) v += partial[(j + e) * C + c];
  s[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t = 0.0f;
#pragma unroll
    for (int k = 0; k < kReduceRows; ++k) t += s[k][threadIdx.x];
    out[static_cast<int64_t>(e) * C + c] += t;
  }
}

// ---- host side ----

int64_t last_dim(const Tensor& t) { return t.ndim() >= 1 ? t.dim(-1) : 0; }

bool vec_ok(int64_t C, std::initializer_list<const void*> ptrs) {
  if (C % 8 != 0) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

template <typename T, typename B>
void launch_add(const float* acc, const T* acc_t, const B* bias, const int32_t* offsets, int E, T* y, int64_t N,
                int64_t C, bool vec, cudaStream_t stream) {
  const unsigned col_blocks = static_cast<unsigned>((C + 4 * kTileCols - 1) / (4 * kTileCols));
  const dim3 grid(col_blocks, static_cast<unsigned>(std::min<int64_t>(N, 4096)));
  if (vec)
    launch_kernel(bias_add_kernel<T, B, true>, grid, kAddThreads, 0, stream, acc, acc_t, bias, offsets, E, y, N, C);
  else
    launch_kernel(bias_add_kernel<T, B, false>, grid, kAddThreads, 0, stream, acc, acc_t, bias, offsets, E, y, N, C);
}

// y (+)= bias over the dtype pairs (y BF16|F32) × (bias BF16|F32).
void add_any(const float* acc, const Tensor& bias, const int32_t* offsets, int E, Tensor& y, int64_t N, int64_t C,
             cudaStream_t stream) {
  const bool vec = vec_ok(C, {acc, bias.data(), y.data()});
  const bool yb = y.dtype() == DType::BF16, bb = bias.dtype() == DType::BF16;
  if (yb && bb)
    launch_add<bf16, bf16>(acc, y.data_as<bf16>(), bias.data_as<bf16>(), offsets, E, y.data_as<bf16>(), N, C, vec,
                           stream);
  else if (yb)
    launch_add<bf16, float>(acc, y.data_as<bf16>(), bias.data_as<float>(), offsets, E, y.data_as<bf16>(), N, C, vec,
                            stream);
  else if (bb)
    launch_add<float, bf16>(acc, y.data_as<float>(), bias.data_as<bf16>(), offsets, E, y.data_as<float>(), N, C, vec,
                            stream);
  else
    launch_add<float, float>(acc, y.data_as<float>(), bias.data_as<float>(), offsets, E, y.data_as<float>(), N, C,
                             vec, stream);
}

// Rows per chunk: at least 128 (32 KiB of bf16 per 256-column tile), and few enough chunks (<= 256) that the
// partial rows stay small ((256 + E) · C floats). Depends on N only.
int64_t chunk_rows_for(int64_t N) {
  const int64_t per = (N + 255) / 256;
  return std::max<int64_t>(128, (per + 7) / 8 * 8);
}

// out [E, C] += column sums of dy's rows per expert (offsets null: E = 1, all N rows).
void column_sums(const Tensor& dy, const int32_t* offsets, int E, int64_t N, int64_t C, Tensor& out,
                 cudaStream_t stream) {
  if (N == 0 || C == 0) return;
  const int64_t chunk = chunk_rows_for(N), chunks = (N + chunk - 1) / chunk;
  Tensor partial = Tensor::empty({chunks + E - 1, C}, DType::F32, dy.device());
  const dim3 grid(static_cast<unsigned>((C + kTileCols - 1) / kTileCols), static_cast<unsigned>(chunks));
  const bool vec = vec_ok(C, {dy.data()});
  float* p = partial.data_as<float>();
  if (dy.dtype() == DType::BF16) {
    if (vec)
      launch_kernel(colsum_partial_kernel<bf16, true>, grid, kSumWarps * 32, 0, stream, dy.data_as<bf16>(), offsets,
                    E, N, C, chunk, p);
    else
      launch_kernel(colsum_partial_kernel<bf16, false>, grid, kSumWarps * 32, 0, stream, dy.data_as<bf16>(), offsets,
                    E, N, C, chunk, p);
  } else {
    if (vec)
      launch_kernel(colsum_partial_kernel<float, true>, grid, kSumWarps * 32, 0, stream, dy.data_as<float>(), offsets,
                    E, N, C, chunk, p);
    else
      launch_kernel(colsum_partial_kernel<float, false>, grid, kSumWarps * 32, 0, stream, dy.data_as<float>(),
                    offsets, E, N, C, chunk, p);
  }
  launch_kernel(colsum_reduce_kernel, dim3(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(E)),
                dim3(32, kReduceRows), 0, stream, static_cast<const float*>(p), offsets, N, C, chunk,
                out.data_as<float>());
}

// offsets I32 [E + 1] on `device`, E in [1, 65535] (the reduce's grid.y); returns E.
int check_offsets(const Tensor& offsets, const char* op, int device) {
  MT_CUDA_REQUIRE(offsets.defined() && offsets.ndim() == 1 && offsets.numel() >= 2 && offsets.numel() <= 65536,
                  std::string(op) + ": offsets must be I32 [E + 1] with 1 <= E <= 65535, got " +
                      tensor_where(offsets));
  check_tensor(offsets, op, device, DType::I32, offsets.numel());
  return static_cast<int>(offsets.numel() - 1);
}

}  // namespace

void bias_add_rows(const Tensor& acc, const Tensor& b, Tensor& y, cudaStream_t stream) {
  const char* op = "bias_add_rows";
  check_float_dtype(y, op);
  const int dev = y.device().index;
  const int64_t C = last_dim(y), N = C == 0 ? 0 : y.numel() / C;
  check_tensor(acc, op, dev, DType::F32, y.numel());
  check_float_dtype(b, op);
  check_tensor(b, op, dev, b.dtype(), C);
  if (N == 0 || C == 0) return;
  add_any(acc.data_as<float>(), b, nullptr, 1, y, N, C, stream);
}

void bias_backward(const Tensor& dy, Tensor& db, cudaStream_t stream) {
  const char* op = "bias_backward";
  check_float_dtype(dy, op);
  const int64_t C = last_dim(dy), N = C == 0 ? 0 : dy.numel() / C;
  check_tensor(db, op, dy.device().index, DType::F32, C);
  MT_CUDA_REQUIRE(db.ndim() == 1, std::string(op) + ": db must be [C], got " + tensor_where(db));
  column_sums(dy, nullptr, 1, N, C, db, stream);
}

void grouped_bias_add(Tensor& y, const Tensor& bias, const Tensor& offsets, cudaStream_t stream) {
  const char* op = "grouped_bias_add";
  check_float_dtype(y, op);
  MT_CUDA_REQUIRE(y.ndim() == 2, std::string(op) + ": y must be [N, C], got " + tensor_where(y));
  const int dev = y.device().index;
  const int E = check_offsets(offsets, op, dev);
  const int64_t N = y.dim(0), C = y.dim(1);
  check_float_dtype(bias, op);
  MT_CUDA_REQUIRE(bias.ndim() == 2 && bias.dim(0) == E && bias.dim(1) == C,
                  std::string(op) + ": bias must be [E=" + std::to_string(E) + ", C=" + std::to_string(C) + "], got " +
                      tensor_where(bias));
  check_tensor(bias, op, dev, bias.dtype(), int64_t{E} * C);
  if (N == 0 || C == 0) return;
  add_any(nullptr, bias, offsets.data_as<int32_t>(), E, y, N, C, stream);
}

void grouped_bias_backward(const Tensor& dy, const Tensor& offsets, Tensor& dbias, cudaStream_t stream) {
  const char* op = "grouped_bias_backward";
  check_float_dtype(dy, op);
  MT_CUDA_REQUIRE(dy.ndim() == 2, std::string(op) + ": dy must be [N, C], got " + tensor_where(dy));
  const int dev = dy.device().index;
  const int E = check_offsets(offsets, op, dev);
  const int64_t N = dy.dim(0), C = dy.dim(1);
  MT_CUDA_REQUIRE(dbias.ndim() == 2 && dbias.dim(0) == E && dbias.dim(1) == C,
                  std::string(op) + ": dbias must be F32 [E=" + std::to_string(E) + ", C=" + std::to_string(C) +
                      "], got " + tensor_where(dbias));
  check_tensor(dbias, op, dev, DType::F32, int64_t{E} * C);
  column_sums(dy, offsets.data_as<int32_t>(), E, N, C, dbias, stream);
}

}  // namespace mt::cuda

#include "kernels/cuda/conv1d_causal.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernel_launch.cuh"
#include "kernels/cuda/mamba2_common.cuh"
#include "kernels/cuda/tensor_checks.h"

namespace mt::cuda {

namespace {

constexpr int kRun = 16;       // consecutive tokens per thread
constexpr int kVecs = 32;      // channel vectors per block (threadIdx.x)
constexpr int kRuns = 8;       // runs per block (threadIdx.y)
constexpr int kMaxParts = 64;  // partial rows of the backward's dw/db at most
constexpr int kMaxK = 4;

struct ConvParams {
  const void* w;
  const void* b;  // null: no bias
  bool w_bf16, b_bf16;
};

// The K taps (and the bias) of channels c..c+V−1 as fp32.
template <int K, int V>
__device__ __forceinline__ void load_taps(const ConvParams& p, int64_t c, float (&w)[K][V], float (&b)[V]) {
#pragma unroll
  for (int e = 0; e < V; ++e) {
#pragma unroll
    for (int j = 0; j < K; ++j) w[j][e] = load_param(p.w, p.w_bf16, (c + e) * K + j);
    b[e] = p.b ? load_param(p.b, p.b_bf16, c + e) : 0.0f;
  }
}

// conv of one token from its window xw[o + j] = x[t − (K−1) + j]: taps j >= jmin only (the others read before the
// document's start), in order, no FMA (the CPU loop's bits), the bias last; rounded to T's precision.
template <typename T, int K, int V, int N>
__device__ __forceinline__ void conv_at(const float (&w)[K][V], const float (&b)[V], bool has_bias,
                                        const float (&xw)[N][V], int o, int64_t jmin, float (&conv)[V]) {
#pragma unroll
  for (int e = 0; e < V; ++e) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j)
      if (j >= jmin) acc = __fadd_rn(acc, __fmul_rn(w[j][e], xw[o + j][e]));
    if (has_bias) acc = __fadd_rn(acc, b[e]);
    conv[e] = Elt<T>::round(acc);
  }
}

// a[k] = a[k + S] for the first N − S rows (the window moves S tokens on).
template <int S, int N, int V>
__device__ __forceinline__ void shift_rows(float (&a)[N][V]) {
#pragma unroll
  for (int k = 0; k + S < N; ++k)
#pragma unroll
    for (int e = 0; e < V; ++e) a[k][e] = a[k + S][e];
}

// Rows t0 − (K−1) .. t0 − 1 of x into xw[0 .. K−2] (zero before the first token; masked per token later).
template <typename T, int K, int V, int N>
__device__ __forceinline__ void load_halo(const T* x, int64_t W, int64_t t0, float (&xw)[N][V]) {
#pragma unroll
  for (int k = 0; k + 1 < K; ++k) {
    const int64_t s = t0 - (K - 1) + k;
    if (s >= 0) {
      load_vec<V>(x + s * W, xw[k]);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) xw[k][e] = 0.0f;
    }
  }
}

// Tokens are taken a step at a time: the step's rows are loaded first (several loads in flight per thread), then
// computed. The backward holds more per token (dact, dconv), so it steps by 2 to stay at 2 blocks per SM.
constexpr int kStep = 4;
constexpr int kBwdStep = 2;

// Grid (channel vectors / 32, token runs / 8), block (32, 8). x = proj + col0 (row stride W). The window holds
// xw[k] = x[tc − (K−1) + k] for the step's first token tc.
template <typename T, int K, int V>
__global__ void __launch_bounds__(kVecs * kRuns, 2)
    conv_fwd_kernel(const T* __restrict__ x, int64_t W, ConvParams p, const int32_t* __restrict__ start,
                    T* __restrict__ act, int64_t tokens, int64_t C) {
  pdl_wait();
  constexpr int N = K - 1 + kStep;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kVecs + threadIdx.x) * V;
  const int64_t t0 = (static_cast<int64_t>(blockIdx.y) * kRuns + threadIdx.y) * kRun;
  if (c >= C || t0 >= tokens) return;
  float w[K][V], b[V];
  load_taps<K, V>(p, c, w, b);
  float xw[N][V];
  load_halo<T, K, V>(x + c, W, t0, xw);
  const int64_t t1 = min(t0 + kRun, tokens);
  for (int64_t tc = t0; tc < t1; tc += kStep) {
    int64_t jmin[kStep];
#pragma unroll
    for (int u = 0; u < kStep; ++u) {
      const int64_t t = tc + u;
      if (t < t1) {
        load_vec<V>(x + t * W + c, xw[K - 1 + u]);
        jmin[u] = start[t] - t + (K - 1);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) xw[K - 1 + u][e] = 0.0f;
        jmin[u] = 0;
      }
    }
#pragma unroll
    for (int u = 0; u < kStep; ++u) {
      const int64_t t = tc + u;
      if (t >= t1) break;
      float conv[V], out[V];
      conv_at<T, K, V, N>(w, b, p.b != nullptr, xw, u, jmin[u], conv);
#pragma unroll
      for (int e = 0; e < V; ++e) out[e] = silu_f(conv[e]);
      store_vec<V>(act + t * C + c, out);
    }
    shift_rows<kStep, N, V>(xw);
  }
}

// Grid (channel vectors / 32, parts), block (32, 8). Block y covers tokens [y·R, (y+1)·R); its thread row r takes
// the runs r, r + 8, … of that range. Per token u (the run's own tokens, then K − 1 of look-ahead) it recomputes
// conv and dconv[u] = dact · silu'(conv); dx[s] for s = u − (K−1) is Σ_j w[j] · dconv[s + K−1 − j] over the taps
// whose output s + K−1 − j is still in s's document (end[s]), in order j = 0..K−1, no FMA (the CPU loop's bits).
// dw[c, j] += dconv[u] · x[u − (K−1) + j] (taps inside u's document), db[c] += dconv[u], over own tokens only.
// Windows for the step's first token tc: xw[k] = x[tc − (K−1) + k], dc[k] = dconv[tc − (K−1) + k].
template <typename T, int K, int V>
__global__ void __launch_bounds__(kVecs * kRuns, 2)
    conv_bwd_kernel(const T* __restrict__ dact, const T* __restrict__ x, int64_t W, ConvParams p,
                    const int32_t* __restrict__ start, const int32_t* __restrict__ end, T* __restrict__ dx,
                    int64_t dW, float* __restrict__ part_w, float* __restrict__ part_b, int64_t tokens, int64_t C,
                    int64_t rows_per_part) {
  pdl_wait();
  constexpr int N = K - 1 + kBwdStep;
  constexpr int kVals = (K + 1) * kVecs * V;  // a block's dw (K rows) and db (1 row) values
  __shared__ float red[kRuns][kVals];
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kVecs + threadIdx.x) * V;
  const bool want = part_w != nullptr || part_b != nullptr;
  float gw[K][V], gb[V];
#pragma unroll
  for (int e = 0; e < V; ++e) {
    gb[e] = 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j) gw[j][e] = 0.0f;
  }
  if (c < C) {
    float w[K][V], b[V];
    load_taps<K, V>(p, c, w, b);
    const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_part;
    const int64_t r1 = min(r0 + rows_per_part, tokens);
    for (int64_t t0 = r0 + static_cast<int64_t>(threadIdx.y) * kRun; t0 < r1; t0 += kRuns * kRun) {
      const int64_t own_end = min(t0 + kRun, r1);
      const int64_t u_end = own_end + (K - 1);  // look-ahead: dx[s] needs dconv up to s + K − 1
      const int64_t load_end = min(u_end, tokens);
      float xw[N][V], dc[N][V];
      load_halo<T, K, V>(x + c, W, t0, xw);
#pragma unroll
      for (int k = 0; k < N; ++k)
#pragma unroll
        for (int e = 0; e < V; ++e) dc[k][e] = 0.0f;
      for (int64_t tc = t0; tc < u_end; tc += kBwdStep) {
        float da[kBwdStep][V];
        int64_t jmin[kBwdStep], taps_end[kBwdStep];
#pragma unroll
        for (int u = 0; u < kBwdStep; ++u) {
          const int64_t t = tc + u, s = t - (K - 1);
          if (t < load_end) {
            load_vec<V>(x + t * W + c, xw[K - 1 + u]);
            load_vec<V>(dact + t * C + c, da[u]);
            jmin[u] = start[t] - t + (K - 1);
          } else {
#pragma unroll
            for (int e = 0; e < V; ++e) xw[K - 1 + u][e] = 0.0f, da[u][e] = 0.0f;
            jmin[u] = 0;
          }
          // tap j of dx[s] reads dconv[s + K−1 − j]: kept while K−1 − j < end[s] − s
          taps_end[u] = (s >= t0 && t < u_end) ? end[s] - s : 0;
        }
#pragma unroll
        for (int u = 0; u < kBwdStep; ++u) {
          const int64_t t = tc + u;
          if (t < load_end) {
            float conv[V];
            conv_at<T, K, V, N>(w, b, p.b != nullptr, xw, u, jmin[u], conv);
#pragma unroll
            for (int e = 0; e < V; ++e) dc[K - 1 + u][e] = da[u][e] * silu_grad_f(conv[e]);
            if (want && t < own_end) {
#pragma unroll
              for (int e = 0; e < V; ++e) {
                gb[e] += dc[K - 1 + u][e];
#pragma unroll
                for (int j = 0; j < K; ++j)
                  if (j >= jmin[u]) gw[j][e] += dc[K - 1 + u][e] * xw[u + j][e];
              }
            }
          } else {
#pragma unroll
            for (int e = 0; e < V; ++e) dc[K - 1 + u][e] = 0.0f;  // past the last token: masked by end[s]
          }
        }
#pragma unroll
        for (int u = 0; u < kBwdStep; ++u) {
          const int64_t s = tc + u - (K - 1);
          if (s < t0 || tc + u >= u_end) continue;
          float g[V];
#pragma unroll
          for (int e = 0; e < V; ++e) {
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < K; ++j)
              if (K - 1 - j < taps_end[u]) acc = __fadd_rn(acc, __fmul_rn(w[j][e], dc[K - 1 + u - j][e]));
            g[e] = acc;
          }
          store_vec<V>(dx + s * dW + c, g);
        }
        shift_rows<kBwdStep, N, V>(xw);
        shift_rows<kBwdStep, N, V>(dc);
      }
    }
  }
  if (!want) return;
  // The block's sums: value q = j·(32·V) + lane·V + e (j = K: the bias), added over the 8 thread rows in order.
#pragma unroll
  for (int e = 0; e < V; ++e) {
#pragma unroll
    for (int j = 0; j < K; ++j) red[threadIdx.y][j * kVecs * V + threadIdx.x * V + e] = gw[j][e];
    red[threadIdx.y][K * kVecs * V + threadIdx.x * V + e] = gb[e];
  }
  __syncthreads();
  const int64_t c_base = static_cast<int64_t>(blockIdx.x) * kVecs * V;
  for (int q = threadIdx.y * kVecs + threadIdx.x; q < kVals; q += kVecs * kRuns) {
    const int j = q / (kVecs * V);
    const int64_t ch = c_base + q % (kVecs * V);
    if (ch >= C) continue;
    float sum = 0.0f;
#pragma unroll
    for (int r = 0; r < kRuns; ++r) sum += red[r][q];
    if (j < K) {
      if (part_w) part_w[static_cast<int64_t>(blockIdx.y) * C * K + ch * K + j] = sum;
    } else if (part_b) {
      part_b[static_cast<int64_t>(blockIdx.y) * C + ch] = sum;
    }
  }
}

struct ConvDims {
  int device;
  int64_t T, C, K, W;
  bool bf16;
};

ConvDims check_conv(const char* op, const Tensor& proj, int64_t col0, const Tensor& w, const Tensor& b,
                    const AttentionDocs& docs) {
  check_float_dtype(proj, op);
  MT_CUDA_REQUIRE(proj.ndim() == 2, std::string(op) + ": proj must be [T, W], got " + tensor_where(proj));
  const int dev = proj.device().index;
  MT_CUDA_REQUIRE(w.defined() && w.ndim() == 3 && w.dim(1) == 1 && w.dim(2) >= 1,
                  std::string(op) + ": weight must be [C, 1, K], got " + tensor_where(w));
  const ConvDims d{dev, proj.dim(0), w.dim(0), w.dim(2), proj.dim(1), proj.dtype() == DType::BF16};
  MT_CUDA_REQUIRE(d.K <= kMaxK, std::string(op) + ": conv width K = " + std::to_string(d.K) + " (built for K <= " +
                                    std::to_string(kMaxK) + ")");
  MT_CUDA_REQUIRE(col0 >= 0 && col0 + d.C <= d.W, std::string(op) + ": columns [" + std::to_string(col0) + ", " +
                                                      std::to_string(col0 + d.C) + ") outside proj " +
                                                      tensor_where(proj));
  MT_CUDA_REQUIRE(w.dtype() == DType::BF16 || w.dtype() == DType::F32,
                  std::string(op) + ": weight must be BF16 or F32, got " + tensor_where(w));
  check_tensor(w, op, dev, w.dtype(), d.C * d.K);
  if (b.defined()) {
    MT_CUDA_REQUIRE(b.dtype() == DType::BF16 || b.dtype() == DType::F32,
                    std::string(op) + ": bias must be BF16 or F32, got " + tensor_where(b));
    check_tensor(b, op, dev, b.dtype(), d.C);
  }
  check_tensor(docs.start, op, dev, DType::I32, d.T);
  check_tensor(docs.end, op, dev, DType::I32, d.T);
  return d;
}

ConvParams conv_params(const Tensor& w, const Tensor& b) {
  return {w.data(), b.defined() ? b.data() : nullptr, w.dtype() == DType::BF16,
          b.defined() && b.dtype() == DType::BF16};
}

// V channels per thread where every row start of x (and of the other [T, ·] operands) is V-element aligned.
bool vec_ok(int V, size_t elt, int64_t C, std::initializer_list<std::pair<const void*, int64_t>> rows) {
  if (C % V != 0) return false;
  for (const auto& [ptr, stride] : rows)
    if (stride % V != 0 || reinterpret_cast<uintptr_t>(ptr) % (V * elt) != 0) return false;
  return true;
}

template <typename T, int V>
void launch_fwd(const ConvDims& d, const T* x, ConvParams p, const int32_t* start, T* act, cudaStream_t stream) {
  const dim3 grid(blocks_for(d.C / V, kVecs), blocks_for(d.T, kRuns * kRun));
  MT_CUDA_REQUIRE(grid.y <= 65535u, "conv1d_causal_silu_forward: " + std::to_string(d.T) + " tokens (at most " +
                                        std::to_string(65535 * kRuns * kRun) + ")");
  const dim3 block(kVecs, kRuns);
  switch (d.K) {
    case 1: launch_kernel(conv_fwd_kernel<T, 1, V>, grid, block, 0, stream, x, d.W, p, start, act, d.T, d.C); break;
    case 2: launch_kernel(conv_fwd_kernel<T, 2, V>, grid, block, 0, stream, x, d.W, p, start, act, d.T, d.C); break;
    case 3: launch_kernel(conv_fwd_kernel<T, 3, V>, grid, block, 0, stream, x, d.W, p, start, act, d.T, d.C); break;
    default: launch_kernel(conv_fwd_kernel<T, 4, V>, grid, block, 0, stream, x, d.W, p, start, act, d.T, d.C); break;
  }
}

template <typename T, int V>
void launch_bwd(const ConvDims& d, const T* dact, const T* x, ConvParams p, const AttentionDocs& docs, T* dx,
                int64_t dW, float* part_w, float* part_b, int64_t parts, int64_t rows_per_part,
                cudaStream_t stream) {
  const dim3 grid(blocks_for(d.C / V, kVecs), static_cast<unsigned>(parts));
  const dim3 block(kVecs, kRuns);
  const int32_t* s = docs.start.data_as<int32_t>();
  const int32_t* e = docs.end.data_as<int32_t>();
#define MT_CONV_BWD(KK)                                                                                           \
  launch_kernel(conv_bwd_kernel<T, KK, V>, grid, block, 0, stream, dact, x, d.W, p, s, e, dx, dW, part_w, part_b, \
                d.T, d.C, rows_per_part)
  switch (d.K) {
    case 1: MT_CONV_BWD(1); break;
    case 2: MT_CONV_BWD(2); break;
    case 3: MT_CONV_BWD(3); break;
    default: MT_CONV_BWD(4); break;
  }
#undef MT_CONV_BWD
}

}  // namespace

void conv1d_causal_silu_forward(const Tensor& proj, int64_t col0, const Tensor& w, const Tensor& b,
                                const AttentionDocs& docs, Tensor& act, cudaStream_t stream) {
  const char* op = "conv1d_causal_silu_forward";
  const ConvDims d = check_conv(op, proj, col0, w, b, docs);
  check_tensor(act, op, d.device, proj.dtype(), d.T * d.C);
  if (d.T == 0 || d.C == 0) return;
  const ConvParams p = conv_params(w, b);
  const int32_t* start = docs.start.data_as<int32_t>();
  if (d.bf16) {
    const bf16* x = proj.data_as<bf16>() + col0;
    bf16* a = act.data_as<bf16>();
    if (vec_ok(8, 2, d.C, {{x, d.W}, {a, d.C}}))
      launch_fwd<bf16, 8>(d, x, p, start, a, stream);
    else
      launch_fwd<bf16, 1>(d, x, p, start, a, stream);
  } else {
    const float* x = proj.data_as<float>() + col0;
    float* a = act.data_as<float>();
    if (vec_ok(4, 4, d.C, {{x, d.W}, {a, d.C}}))
      launch_fwd<float, 4>(d, x, p, start, a, stream);
    else
      launch_fwd<float, 1>(d, x, p, start, a, stream);
  }
}

void conv1d_causal_silu_backward(const Tensor& dact, const Tensor& proj, int64_t col0, const Tensor& w,
                                 const Tensor& b, const AttentionDocs& docs, Tensor& dproj, int64_t dcol0,
                                 Tensor& dw, Tensor& db, cudaStream_t stream) {
  const char* op = "conv1d_causal_silu_backward";
  const ConvDims d = check_conv(op, proj, col0, w, b, docs);
  check_tensor(dact, op, d.device, proj.dtype(), d.T * d.C);
  check_float_dtype(dproj, op);
  MT_CUDA_REQUIRE(dproj.ndim() == 2 && dproj.dim(0) == d.T && dproj.dtype() == proj.dtype() && dcol0 >= 0 &&
                      dcol0 + d.C <= dproj.dim(1),
                  std::string(op) + ": dproj must be [" + std::to_string(d.T) + ", >= " +
                      std::to_string(dcol0 + d.C) + "] of proj's dtype (columns from " + std::to_string(dcol0) +
                      "), got " + tensor_where(dproj));
  check_tensor(dproj, op, d.device, proj.dtype(), dproj.numel());
  if (dw.defined()) check_tensor(dw, op, d.device, DType::F32, d.C * d.K);
  if (db.defined()) {
    MT_CUDA_REQUIRE(b.defined(), std::string(op) + ": a bias gradient without a bias");
    check_tensor(db, op, d.device, DType::F32, d.C);
  }
  if (d.T == 0 || d.C == 0) return;
  const ConvParams p = conv_params(w, b);
  // Parts of ≥ 128 tokens (a block's 8 runs), at most kMaxParts of them: fixed by T alone.
  const int64_t run_rows = kRuns * kRun;
  const int64_t runs = (d.T + run_rows - 1) / run_rows;
  const int64_t rows_per_part = run_rows * ((runs + kMaxParts - 1) / kMaxParts);
  const int64_t parts = (d.T + rows_per_part - 1) / rows_per_part;
  Tensor part_w, part_b;
  if (dw.defined()) part_w = Tensor::empty({parts, d.C * d.K}, DType::F32, Device::cuda(d.device));
  if (db.defined()) part_b = Tensor::empty({parts, d.C}, DType::F32, Device::cuda(d.device));
  float* pw = dw.defined() ? part_w.data_as<float>() : nullptr;
  float* pb = db.defined() ? part_b.data_as<float>() : nullptr;
  const int64_t dW = dproj.dim(1);
  if (d.bf16) {
    const bf16* x = proj.data_as<bf16>() + col0;
    const bf16* g = dact.data_as<bf16>();
    bf16* dx = dproj.data_as<bf16>() + dcol0;
    if (vec_ok(4, 2, d.C, {{x, d.W}, {g, d.C}, {dx, dW}}))
      launch_bwd<bf16, 4>(d, g, x, p, docs, dx, dW, pw, pb, parts, rows_per_part, stream);
    else
      launch_bwd<bf16, 1>(d, g, x, p, docs, dx, dW, pw, pb, parts, rows_per_part, stream);
  } else {
    const float* x = proj.data_as<float>() + col0;
    const float* g = dact.data_as<float>();
    float* dx = dproj.data_as<float>() + dcol0;
    if (vec_ok(4, 4, d.C, {{x, d.W}, {g, d.C}, {dx, dW}}))
      launch_bwd<float, 4>(d, g, x, p, docs, dx, dW, pw, pb, parts, rows_per_part, stream);
    else
      launch_bwd<float, 1>(d, g, x, p, docs, dx, dW, pw, pb, parts, rows_per_part, stream);
  }
  if (pw) ordered_column_sum(pw, parts, d.C * d.K, dw.data_as<float>(), stream);
  if (pb) ordered_column_sum(pb, parts, d.C, db.data_as<float>(), stream);
}

}  // namespace mt::cuda

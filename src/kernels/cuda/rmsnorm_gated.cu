#include "kernels/cuda/rmsnorm_gated.h"

#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernel_launch.cuh"
#include "kernels/cuda/mamba2_common.cuh"
#include "kernels/cuda/tensor_checks.h"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxParts = 512;  // partial rows of dw at most (backward blocks)

// rstd of each group from s_t (one warp per group, lanes strided, then the shuffle tree): fixed order.
__device__ __forceinline__ float group_sq_sum(const float* s_t, int g, int group, int lane) {
  float s = 0.0f;
  for (int i = g * group + lane; i < (g + 1) * group; i += 32) s += s_t[i] * s_t[i];
  return warp_sum(s);
}

// Block per row. Shared: t [n], rstd [G].
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    gated_fwd_kernel(const float* __restrict__ y, const T* __restrict__ z, int64_t W, const void* __restrict__ w,
                     bool w_bf16, int n, int group, float eps, T* __restrict__ out) {
  pdl_wait();
  extern __shared__ float smem[];
  float* s_t = smem;
  float* s_rstd = smem + n;
  const int64_t row = blockIdx.x;
  const float* yr = y + row * n;
  const T* zr = z + row * W;
  for (int i = threadIdx.x * V; i < n; i += kThreads * V) {
    float yv[V], zv[V];
    load_vec<V>(yr + i, yv);
    load_vec<V>(zr + i, zv);
#pragma unroll
    for (int e = 0; e < V; ++e) s_t[i + e] = yv[e] * silu_f(zv[e]);
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, G = n / group;
  for (int g = warp; g < G; g += kWarps) {
    const float s = group_sq_sum(s_t, g, group, lane);
    if (lane == 0) s_rstd[g] = 1.0f / sqrtf(s / static_cast<float>(group) + eps);
  }
  __syncthreads();
  for (int i = threadIdx.x * V; i < n; i += kThreads * V) {
    float o[V];
#pragma unroll
    for (int e = 0; e < V; ++e) o[e] = load_param(w, w_bf16, i + e) * (s_t[i + e] * s_rstd[(i + e) / group]);
    store_vec<V>(out + row * n + i, o);
  }
}

// Block per run of rows [b·R, (b+1)·R). Shared: t [n], dout [n], dw sums [n], rstd [G], m [G]. A thread owns the
// same elements in every pass, so its dw sums need no barrier.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    gated_bwd_kernel(const T* __restrict__ dout, const float* __restrict__ y, const T* __restrict__ z, int64_t W,
                     const void* __restrict__ w, bool w_bf16, int n, int group, float eps, float* __restrict__ dy,
                     T* __restrict__ dz, int64_t dW, float* __restrict__ partial, int64_t tokens,
                     int64_t rows_per_part) {
  pdl_wait();
  extern __shared__ float smem[];
  const int G = n / group;
  float* s_t = smem;
  float* s_g = smem + n;
  float* s_dw = smem + 2 * n;
  float* s_rstd = smem + 3 * n;
  float* s_m = s_rstd + G;
  for (int i = threadIdx.x * V; i < n; i += kThreads * V)
#pragma unroll
    for (int e = 0; e < V; ++e) s_dw[i + e] = 0.0f;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_part;
  const int64_t r1 = min(r0 + rows_per_part, tokens);
  for (int64_t row = r0; row < r1; ++row) {
    const float* yr = y + row * n;
    const T* zr = z + row * W;
    for (int i = threadIdx.x * V; i < n; i += kThreads * V) {
      float yv[V], zv[V], gv[V];
      load_vec<V>(yr + i, yv);
      load_vec<V>(zr + i, zv);
      load_vec<V>(dout + row * n + i, gv);
#pragma unroll
      for (int e = 0; e < V; ++e) s_t[i + e] = yv[e] * silu_f(zv[e]), s_g[i + e] = gv[e];
    }
    __syncthreads();
    // Per group: rstd, then m = mean(du ⊙ u) with u = t·rstd (as the CPU: the products after rstd is known).
    for (int g = warp; g < G; g += kWarps) {
      const float rs = 1.0f / sqrtf(group_sq_sum(s_t, g, group, lane) / static_cast<float>(group) + eps);
      float d = 0.0f;
      for (int i = g * group + lane; i < (g + 1) * group; i += 32)
        d += (s_g[i] * load_param(w, w_bf16, i)) * (s_t[i] * rs);
      d = warp_sum(d);
      if (lane == 0) s_rstd[g] = rs, s_m[g] = d / static_cast<float>(group);
    }
    __syncthreads();
    for (int i = threadIdx.x * V; i < n; i += kThreads * V) {
      float yv[V], zv[V], dyv[V], dzv[V];
      load_vec<V>(yr + i, yv);
      load_vec<V>(zr + i, zv);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const int gi = (i + e) / group;
        const float rs = s_rstd[gi], m = s_m[gi];
        const float u = s_t[i + e] * rs;
        const float dt = rs * (s_g[i + e] * load_param(w, w_bf16, i + e) - u * m);
        const float sig = 1.0f / (1.0f + expf(-zv[e]));
        dyv[e] = dt * zv[e] * sig;
        dzv[e] = dt * yv[e] * sig * (1.0f + zv[e] * (1.0f - sig));
        s_dw[i + e] += s_g[i + e] * u;
      }
      store_vec<V>(dy + row * n + i, dyv);
      store_vec<V>(dz + row * dW + i, dzv);
    }
    // The next row's first barrier orders this pass's reads of s_rstd / s_m before their next writes; s_t and s_g
    // are only touched by their owner here and in the first pass.
  }
  if (!partial) return;
  for (int i = threadIdx.x * V; i < n; i += kThreads * V)
#pragma unroll
    for (int e = 0; e < V; ++e) partial[static_cast<int64_t>(blockIdx.x) * n + i + e] = s_dw[i + e];
}

struct GatedDims {
  int device;
  int64_t T, n, W, group;
};

GatedDims check_gated(const char* op, const Tensor& y, const Tensor& proj, int64_t zcol0, const Tensor& w,
                      int64_t group) {
  check_float_dtype(proj, op);
  MT_CUDA_REQUIRE(proj.ndim() == 2, std::string(op) + ": proj must be [T, W], got " + tensor_where(proj));
  const int dev = proj.device().index;
  MT_CUDA_REQUIRE(w.defined() && w.ndim() == 1 && (w.dtype() == DType::BF16 || w.dtype() == DType::F32),
                  std::string(op) + ": weight must be BF16|F32 [n], got " + tensor_where(w));
  const GatedDims d{dev, proj.dim(0), w.dim(0), proj.dim(1), group};
  check_tensor(w, op, dev, w.dtype(), d.n);
  MT_CUDA_REQUIRE(group >= 1 && d.n % group == 0 && d.n < (int64_t{1} << 30),
                  std::string(op) + ": " + std::to_string(d.n) + " channels in groups of " + std::to_string(group));
  MT_CUDA_REQUIRE(zcol0 >= 0 && zcol0 + d.n <= d.W, std::string(op) + ": columns [" + std::to_string(zcol0) + ", " +
                                                        std::to_string(zcol0 + d.n) + ") outside proj " +
                                                        tensor_where(proj));
  check_tensor(y, op, dev, DType::F32, d.T * d.n);
  return d;
}

bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Dynamic shared memory above the default 48 KiB needs the kernel's opt-in.
template <typename K>
void allow_smem(K kernel, size_t bytes, const char* op) {
  if (bytes <= 48 * 1024) return;
  require_smem_fits(bytes, op);
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <typename T, int V>
void launch_fwd(const GatedDims& d, const float* y, const T* z, const Tensor& w, float eps, T* out,
                cudaStream_t stream) {
  const size_t smem = sizeof(float) * static_cast<size_t>(d.n + d.n / d.group);
  auto kernel = gated_fwd_kernel<T, V>;
  allow_smem(kernel, smem, "rmsnorm_gated_forward");
  launch_kernel(kernel, static_cast<unsigned>(d.T), kThreads, smem, stream, y, z, d.W, w.data(),
                w.dtype() == DType::BF16, static_cast<int>(d.n), static_cast<int>(d.group), eps, out);
}

template <typename T, int V>
void launch_bwd(const GatedDims& d, const T* dout, const float* y, const T* z, const Tensor& w, float eps, float* dy,
                T* dz, int64_t dW, float* partial, int64_t parts, int64_t rows_per_part, cudaStream_t stream) {
  const size_t smem = sizeof(float) * static_cast<size_t>(3 * d.n + 2 * (d.n / d.group));
  auto kernel = gated_bwd_kernel<T, V>;
  allow_smem(kernel, smem, "rmsnorm_gated_backward");
  launch_kernel(kernel, static_cast<unsigned>(parts), kThreads, smem, stream, dout, y, z, d.W, w.data(),
                w.dtype() == DType::BF16, static_cast<int>(d.n), static_cast<int>(d.group), eps, dy, dz, dW, partial,
                d.T, rows_per_part);
}

}  // namespace

void rmsnorm_gated_forward(const Tensor& y, const Tensor& proj, int64_t zcol0, const Tensor& w, int64_t group,
                           float eps, Tensor& out, cudaStream_t stream) {
  const char* op = "rmsnorm_gated_forward";
  const GatedDims d = check_gated(op, y, proj, zcol0, w, group);
  check_tensor(out, op, d.device, proj.dtype(), d.T * d.n);
  if (d.T == 0 || d.n == 0) return;
  const float* yp = y.data_as<float>();
  const bool v4 = d.n % 4 == 0 && d.W % 4 == 0 && zcol0 % 4 == 0 && aligned_to(yp, 16);
  if (proj.dtype() == DType::BF16) {
    const bf16* z = proj.data_as<bf16>() + zcol0;
    bf16* o = out.data_as<bf16>();
    if (v4 && aligned_to(z, 8) && aligned_to(o, 8))
      launch_fwd<bf16, 4>(d, yp, z, w, eps, o, stream);
    else
      launch_fwd<bf16, 1>(d, yp, z, w, eps, o, stream);
  } else {
    const float* z = proj.data_as<float>() + zcol0;
    float* o = out.data_as<float>();
    if (v4 && aligned_to(z, 16) && aligned_to(o, 16))
      launch_fwd<float, 4>(d, yp, z, w, eps, o, stream);
    else
      launch_fwd<float, 1>(d, yp, z, w, eps, o, stream);
  }
}

void rmsnorm_gated_backward(const Tensor& dout, const Tensor& y, const Tensor& proj, int64_t zcol0, const Tensor& w,
                            int64_t group, float eps, Tensor& dy, Tensor& dproj, int64_t dzcol0, Tensor& dw,
                            cudaStream_t stream) {
  const char* op = "rmsnorm_gated_backward";
  const GatedDims d = check_gated(op, y, proj, zcol0, w, group);
  check_tensor(dout, op, d.device, proj.dtype(), d.T * d.n);
  check_tensor(dy, op, d.device, DType::F32, d.T * d.n);
  check_float_dtype(dproj, op);
  MT_CUDA_REQUIRE(dproj.ndim() == 2 && dproj.dim(0) == d.T && dproj.dtype() == proj.dtype() && dzcol0 >= 0 &&
                      dzcol0 + d.n <= dproj.dim(1),
                  std::string(op) + ": dproj must be [" + std::to_string(d.T) + ", >= " +
                      std::to_string(dzcol0 + d.n) + "] of proj's dtype (columns from " + std::to_string(dzcol0) +
                      "), got " + tensor_where(dproj));
  check_tensor(dproj, op, d.device, proj.dtype(), dproj.numel());
  if (dw.defined()) check_tensor(dw, op, d.device, DType::F32, d.n);
  if (d.T == 0 || d.n == 0) return;
  // Runs of R rows, at most kMaxParts blocks: fixed by T alone.
  const int64_t rows_per_part = (d.T + kMaxParts - 1) / kMaxParts;
  const int64_t parts = (d.T + rows_per_part - 1) / rows_per_part;
  Tensor partial;
  if (dw.defined()) partial = Tensor::empty({parts, d.n}, DType::F32, Device::cuda(d.device));
  float* pp = dw.defined() ? partial.data_as<float>() : nullptr;
  const float* yp = y.data_as<float>();
  float* dyp = dy.data_as<float>();
  const int64_t dW = dproj.dim(1);
  const bool v4 = d.n % 4 == 0 && d.W % 4 == 0 && zcol0 % 4 == 0 && dW % 4 == 0 && dzcol0 % 4 == 0 &&
                  aligned_to(yp, 16) && aligned_to(dyp, 16);
  if (proj.dtype() == DType::BF16) {
    const bf16* z = proj.data_as<bf16>() + zcol0;
    const bf16* g = dout.data_as<bf16>();
    bf16* dz = dproj.data_as<bf16>() + dzcol0;
    if (v4 && aligned_to(z, 8) && aligned_to(g, 8) && aligned_to(dz, 8))
      launch_bwd<bf16, 4>(d, g, yp, z, w, eps, dyp, dz, dW, pp, parts, rows_per_part, stream);
    else
      launch_bwd<bf16, 1>(d, g, yp, z, w, eps, dyp, dz, dW, pp, parts, rows_per_part, stream);
  } else {
    const float* z = proj.data_as<float>() + zcol0;
    const float* g = dout.data_as<float>();
    float* dz = dproj.data_as<float>() + dzcol0;
    if (v4 && aligned_to(z, 16) && aligned_to(g, 16) && aligned_to(dz, 16))
      launch_bwd<float, 4>(d, g, yp, z, w, eps, dyp, dz, dW, pp, parts, rows_per_part, stream);
    else
      launch_bwd<float, 1>(d, g, yp, z, w, eps, dyp, dz, dW, pp, parts, rows_per_part, stream);
  }
  if (pp) ordered_column_sum(pp, parts, d.n, dw.data_as<float>(), stream);
}

}  // namespace mt::cuda

#include "kernels/cuda/mamba2_dt.h"

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernel_launch.cuh"
#include "kernels/cuda/mamba2_common.cuh"
#include "kernels/cuda/tensor_checks.h"

namespace mt::cuda {

namespace {

constexpr int kHeadsPerBlock = 32;  // threadIdx.x
constexpr int kRowLanes = 8;        // threadIdx.y
constexpr int kMaxParts = 128;      // partial rows of ddt_bias at most

// r = proj + dt_bias (rounded in bf16) and the clamped softplus, as the CPU block.
template <typename T>
__device__ __forceinline__ void dt_at(const T* proj, int64_t i, const void* bias, bool bias_bf16, int64_t h,
                                      float& r, float& v) {
  r = Elt<T>::round(__fadd_rn(Elt<T>::load(proj, i), load_param(bias, bias_bf16, h)));
  v = Elt<T>::round(softplus_f(r));
}

template <typename T>
__global__ void __launch_bounds__(256)
    dt_fwd_kernel(const T* __restrict__ proj, int64_t W, const void* __restrict__ bias, bool bias_bf16, float tmin,
                  float* __restrict__ dt, int64_t tokens, int64_t heads) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * heads) return;
  const int64_t t = i / heads, h = i - t * heads;
  const float lo = Elt<T>::round(tmin);
  float r, v;
  dt_at<T>(proj, t * W + h, bias, bias_bf16, h, r, v);
  dt[i] = v >= lo ? v : lo;
}

// Grid (heads / 32, parts), block (32, 8): block y covers rows [y·R, (y+1)·R), thread row r every 8th of them.
template <typename T>
__global__ void __launch_bounds__(kHeadsPerBlock * kRowLanes)
    dt_bwd_kernel(const float* __restrict__ ddt, const T* __restrict__ proj, int64_t W, const void* __restrict__ bias,
                  bool bias_bf16, float tmin, T* __restrict__ dproj, int64_t dW, float* __restrict__ partial,
                  int64_t tokens, int64_t heads, int64_t rows_per_part) {
  pdl_wait();
  __shared__ float red[kRowLanes][kHeadsPerBlock];
  const int64_t h = static_cast<int64_t>(blockIdx.x) * kHeadsPerBlock + threadIdx.x;
  const float lo = Elt<T>::round(tmin);
  float sum = 0.0f;
  if (h < heads) {
    const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_part;
    const int64_t r1 = min(r0 + rows_per_part, tokens);
    for (int64_t t = r0 + threadIdx.y; t < r1; t += kRowLanes) {
      float r, v;
      dt_at<T>(proj, t * W + h, bias, bias_bf16, h, r, v);
      const float through = v >= lo ? ddt[t * heads + h] : 0.0f;
      const float g = r > 20.0f ? through : through / (1.0f + expf(-r));
      Elt<T>::store(dproj, t * dW + h, g);
      sum += g;
    }
  }
  if (!partial) return;
  red[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && h < heads) {
    float s = 0.0f;
#pragma unroll
    for (int r = 0; r < kRowLanes; ++r) s += red[r][threadIdx.x];
    partial[static_cast<int64_t>(blockIdx.y) * heads + h] = s;
  }
}

__global__ void a_fwd_kernel(const void* __restrict__ a_log, bool is_bf16, float* __restrict__ A, int64_t heads) {
  pdl_wait();
  const int64_t h = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (h < heads) A[h] = -expf(load_param(a_log, is_bf16, h));
}

__global__ void a_bwd_kernel(const float* __restrict__ dA, const float* __restrict__ A, float* __restrict__ da_log,
                             int64_t heads) {
  pdl_wait();
  const int64_t h = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (h < heads) da_log[h] += dA[h] * A[h];
}

struct DtDims {
  int device;
  int64_t T, heads, W;
};

DtDims check_dt(const char* op, const Tensor& proj, int64_t col0, const Tensor& dt_bias) {
  check_float_dtype(proj, op);
  MT_CUDA_REQUIRE(proj.ndim() == 2, std::string(op) + ": proj must be [T, W], got " + tensor_where(proj));
  const int dev = proj.device().index;
  MT_CUDA_REQUIRE(dt_bias.defined() && dt_bias.ndim() == 1 &&
                      (dt_bias.dtype() == DType::BF16 || dt_bias.dtype() == DType::F32),
                  std::string(op) + ": dt_bias must be BF16|F32 [heads], got " + tensor_where(dt_bias));
  const DtDims d{dev, proj.dim(0), dt_bias.dim(0), proj.dim(1)};
  check_tensor(dt_bias, op, dev, dt_bias.dtype(), d.heads);
  MT_CUDA_REQUIRE(col0 >= 0 && col0 + d.heads <= d.W, std::string(op) + ": columns [" + std::to_string(col0) +
                                                          ", " + std::to_string(col0 + d.heads) + ") outside proj " +
                                                          tensor_where(proj));
  return d;
}

}  // namespace

void mamba2_dt_forward(const Tensor& proj, int64_t col0, const Tensor& dt_bias, double time_step_min, Tensor& dt,
                       cudaStream_t stream) {
  const char* op = "mamba2_dt_forward";
  const DtDims d = check_dt(op, proj, col0, dt_bias);
  check_tensor(dt, op, d.device, DType::F32, d.T * d.heads);
  if (d.T * d.heads == 0) return;
  const unsigned blocks = blocks_for(d.T * d.heads, 256);
  const bool bbf = dt_bias.dtype() == DType::BF16;
  const float tmin = static_cast<float>(time_step_min);
  if (proj.dtype() == DType::BF16)
    launch_kernel(dt_fwd_kernel<bf16>, blocks, 256, 0, stream, proj.data_as<bf16>() + col0, d.W, dt_bias.data(), bbf,
                  tmin, dt.data_as<float>(), d.T, d.heads);
  else
    launch_kernel(dt_fwd_kernel<float>, blocks, 256, 0, stream, proj.data_as<float>() + col0, d.W, dt_bias.data(),
                  bbf, tmin, dt.data_as<float>(), d.T, d.heads);
}

void mamba2_dt_backward(const Tensor& ddt, const Tensor& proj, int64_t col0, const Tensor& dt_bias,
                        double time_step_min, Tensor& dproj, int64_t dcol0, Tensor& ddt_bias, cudaStream_t stream) {
  const char* op = "mamba2_dt_backward";
  const DtDims d = check_dt(op, proj, col0, dt_bias);
  check_tensor(ddt, op, d.device, DType::F32, d.T * d.heads);
  check_float_dtype(dproj, op);
  MT_CUDA_REQUIRE(dproj.ndim() == 2 && dproj.dim(0) == d.T && dproj.dtype() == proj.dtype() && dcol0 >= 0 &&
                      dcol0 + d.heads <= dproj.dim(1),
                  std::string(op) + ": dproj must be [" + std::to_string(d.T) + ", >= " +
                      std::to_string(dcol0 + d.heads) + "] of proj's dtype (columns from " + std::to_string(dcol0) +
                      "), got " + tensor_where(dproj));
  check_tensor(dproj, op, d.device, proj.dtype(), dproj.numel());
  if (ddt_bias.defined()) check_tensor(ddt_bias, op, d.device, DType::F32, d.heads);
  if (d.T * d.heads == 0) return;
  // Parts of a multiple of 8 rows, at most kMaxParts of them: fixed by T alone.
  const int64_t rows_per_part =
      kRowLanes * ((((d.T + kMaxParts - 1) / kMaxParts) + kRowLanes - 1) / kRowLanes);
  const int64_t parts = (d.T + rows_per_part - 1) / rows_per_part;
  Tensor partial;
  if (ddt_bias.defined()) partial = Tensor::empty({parts, d.heads}, DType::F32, Device::cuda(d.device));
  float* pp = ddt_bias.defined() ? partial.data_as<float>() : nullptr;
  const dim3 grid(blocks_for(d.heads, kHeadsPerBlock), static_cast<unsigned>(parts));
  const dim3 block(kHeadsPerBlock, kRowLanes);
  const bool bbf = dt_bias.dtype() == DType::BF16;
  const float tmin = static_cast<float>(time_step_min);
  const int64_t dW = dproj.dim(1);
  if (proj.dtype() == DType::BF16)
    launch_kernel(dt_bwd_kernel<bf16>, grid, block, 0, stream, ddt.data_as<float>(), proj.data_as<bf16>() + col0,
                  d.W, dt_bias.data(), bbf, tmin, dproj.data_as<bf16>() + dcol0, dW, pp, d.T, d.heads,
                  rows_per_part);
  else
    launch_kernel(dt_bwd_kernel<float>, grid, block, 0, stream, ddt.data_as<float>(), proj.data_as<float>() + col0,
                  d.W, dt_bias.data(), bbf, tmin, dproj.data_as<float>() + dcol0, dW, pp, d.T, d.heads,
                  rows_per_part);
  if (pp) ordered_column_sum(pp, parts, d.heads, ddt_bias.data_as<float>(), stream);
}

void mamba2_a_forward(const Tensor& a_log, Tensor& A, cudaStream_t stream) {
  const char* op = "mamba2_a_forward";
  MT_CUDA_REQUIRE(a_log.defined() && a_log.device().is_cuda() && a_log.ndim() == 1 &&
                      (a_log.dtype() == DType::BF16 || a_log.dtype() == DType::F32),
                  std::string(op) + ": A_log must be BF16|F32 [heads] on a CUDA device, got " + tensor_where(a_log));
  const int dev = a_log.device().index;
  const int64_t heads = a_log.dim(0);
  check_tensor(A, op, dev, DType::F32, heads);
  if (heads == 0) return;
  launch_kernel(a_fwd_kernel, blocks_for(heads, 128), 128, 0, stream, a_log.data(), a_log.dtype() == DType::BF16,
                A.data_as<float>(), heads);
}

void mamba2_a_backward(const Tensor& dA, const Tensor& A, Tensor& da_log, cudaStream_t stream) {
  const char* op = "mamba2_a_backward";
  if (!da_log.defined()) return;  // a frozen A_log
  MT_CUDA_REQUIRE(A.defined() && A.device().is_cuda() && A.ndim() == 1,
                  std::string(op) + ": A must be F32 [heads] on a CUDA device, got " + tensor_where(A));
  const int dev = A.device().index;
  const int64_t heads = A.dim(0);
  check_tensor(A, op, dev, DType::F32, heads);
  check_tensor(dA, op, dev, DType::F32, heads);
  check_tensor(da_log, op, dev, DType::F32, heads);
  if (heads == 0) return;
  launch_kernel(a_bwd_kernel, blocks_for(heads, 128), 128, 0, stream, dA.data_as<float>(), A.data_as<float>(),
                da_log.data_as<float>(), heads);
}

}  // namespace mt::cuda

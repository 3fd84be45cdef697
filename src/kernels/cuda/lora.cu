// The elementwise passes of the LoRA ops (kernels/cuda/lora.h): the working copies, the grouped adapter's add and
// the scaled copy of u. The GEMMs are in lora.cpp.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernel_launch.cuh"
#include "kernels/cuda/lora.h"
#include "kernels/cuda/tensor_checks.h"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t items) { return std::min<unsigned>(std::max(blocks_for(items, kThreads), 1u), 65535u * 8); }

// dst = bf16(scale·src), F32 -> BF16.
__global__ void scale_to_bf16_kernel(const float* __restrict__ src, bf16* __restrict__ dst, float scale, int64_t n) {
  pdl_wait();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16_rn(scale * src[i]);
}

// The number of elements of the first min(N, *rows_end) rows of C columns.
__device__ __forceinline__ int64_t live_elements(const int32_t* rows_end, int64_t N, int64_t C) {
  const int64_t rows = rows_end ? min(N, static_cast<int64_t>(max(__ldg(rows_end), 0))) : N;
  return rows * C;
}

// y = bf16(y + scale·d) elementwise over the live rows; VEC: 8 elements (one 16-byte packet) per step.
template <bool VEC>
__global__ void add_rows_kernel(bf16* y, const bf16* __restrict__ d, float scale, const int32_t* rows_end, int64_t N,
                                int64_t C) {
  pdl_wait();
  const int64_t n = live_elements(rows_end, N, C);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if constexpr (VEC) {
    for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p * 8 < n; p += stride) {
      float fy[8], fd[8];
      bf16x8_to_float(reinterpret_cast<const uint4*>(y)[p], fy);
      bf16x8_to_float(reinterpret_cast<const uint4*>(d)[p], fd);
#pragma unroll
      for (int k = 0; k < 8; ++k) fy[k] += scale * fd[k];
      reinterpret_cast<uint4*>(y)[p] = float_to_bf16x8(fy);
    }
  } else {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
      y[i] = __float2bfloat16_rn(__bfloat162float(y[i]) + scale * __bfloat162float(d[i]));
  }
}

// dst = bf16(scale·src), BF16 -> BF16.
__global__ void scale_bf16_kernel(const bf16* __restrict__ src, bf16* __restrict__ dst, float scale, int64_t n) {
  pdl_wait();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16_rn(scale * __bfloat162float(src[i]));
}

void check_pair(const Tensor& master, const Tensor& copy, const char* what) {
  MT_CUDA_REQUIRE(master.defined() && copy.defined() && master.device().is_cuda() && master.device() == copy.device() &&
                      master.dtype() == DType::F32 && copy.dtype() == DType::BF16 && master.shape() == copy.shape(),
                  std::string("lora_working_copy: ") + what + ": F32 master and BF16 copy of one shape on one device, got " +
                      tensor_where(master) + " and " + tensor_where(copy));
}

}  // namespace

void lora_working_copy(const Tensor& a, const Tensor& b, float scale, Tensor& a16, Tensor& b16, cudaStream_t stream) {
  check_pair(a, a16, "A");
  check_pair(b, b16, "B");
  if (a.numel() > 0)
    launch_kernel(scale_to_bf16_kernel, grid_for(a.numel()), kThreads, 0, stream, a.data_as<float>(),
                  a16.data_as<bf16>(), 1.0f, a.numel());
  if (b.numel() > 0)
    launch_kernel(scale_to_bf16_kernel, grid_for(b.numel()), kThreads, 0, stream, b.data_as<float>(),
                  b16.data_as<bf16>(), scale, b.numel());
}

void lora_add_rows(Tensor& y, const Tensor& d, float scale, const int32_t* rows_end, cudaStream_t stream) {
  MT_CUDA_REQUIRE(y.defined() && d.defined() && y.ndim() == 2 && y.dtype() == DType::BF16 && d.dtype() == DType::BF16 &&
                      y.shape() == d.shape() && y.device().is_cuda() && y.device() == d.device(),
                  "lora_add_rows: y and d must be BF16 [N, C] on one device, got " + tensor_where(y) + " and " +
                      tensor_where(d));
  const int64_t N = y.dim(0), C = y.dim(1);
  if (N * C == 0) return;
  if (C % 8 == 0 && aligned16(y) && aligned16(d))
    launch_kernel(add_rows_kernel<true>, grid_for(N * C / 8), kThreads, 0, stream, y.data_as<bf16>(),
                  d.data_as<bf16>(), scale, rows_end, N, C);
  else
    launch_kernel(add_rows_kernel<false>, grid_for(N * C), kThreads, 0, stream, y.data_as<bf16>(), d.data_as<bf16>(),
                  scale, rows_end, N, C);
}

namespace detail {
// dst = bf16(scale·src) for BF16 tensors of one size (lora.cpp: s·u for the grouped dB).
void lora_scale_bf16(const Tensor& src, Tensor& dst, float scale, cudaStream_t stream) {
  MT_CUDA_REQUIRE(src.dtype() == DType::BF16 && dst.dtype() == DType::BF16 && src.numel() == dst.numel() &&
                      src.device() == dst.device(),
                  "lora_scale_bf16: " + tensor_where(src) + " into " + tensor_where(dst));
  if (src.numel() == 0) return;
  launch_kernel(scale_bf16_kernel, grid_for(src.numel()), kThreads, 0, stream, src.data_as<bf16>(),
                dst.data_as<bf16>(), scale, src.numel());
}
}  // namespace detail

}  // namespace mt::cuda

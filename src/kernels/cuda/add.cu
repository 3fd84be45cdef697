#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/add_kernels.h"
#include "kernels/cuda/cuda_check.h"

namespace mt::cuda {

namespace {

// 8 elements per thread when every pointer is 16-byte aligned (n % 8 handled by the scalar tail).
template <typename T>
__global__ void add_kernel(const T* __restrict__ a, const T* __restrict__ b, T* out, int64_t n) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (i >= n) return;
  if (i + 8 <= n) {
    if constexpr (sizeof(T) == 2) {
      const uint4 x = *reinterpret_cast<const uint4*>(a + i), y = *reinterpret_cast<const uint4*>(b + i);
      const __nv_bfloat162* xs = reinterpret_cast<const __nv_bfloat162*>(&x);
      const __nv_bfloat162* ys = reinterpret_cast<const __nv_bfloat162*>(&y);
      uint4 r;
      __nv_bfloat162* rs = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 p = __bfloat1622float2(xs[k]), q = __bfloat1622float2(ys[k]);
        rs[k] = __floats2bfloat162_rn(p.x + q.x, p.y + q.y);
      }
      *reinterpret_cast<uint4*>(out + i) = r;
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float4 x = reinterpret_cast<const float4*>(a + i)[h], y = reinterpret_cast<const float4*>(b + i)[h];
        reinterpret_cast<float4*>(out + i)[h] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
      }
    }
    return;
  }
  for (int64_t j = i; j < n; ++j) {
    if constexpr (sizeof(T) == 2)
      out[j] = __float2bfloat16_rn(__bfloat162float(a[j]) + __bfloat162float(b[j]));
    else
      out[j] = a[j] + b[j];
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T>
__global__ void add_scalar_kernel(const T* __restrict__ a, const T* __restrict__ b, T* out, int64_t n) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  if constexpr (sizeof(T) == 2)
    out[j] = __float2bfloat16_rn(__bfloat162float(a[j]) + __bfloat162float(b[j]));
  else
    out[j] = a[j] + b[j];
}

template <typename T>
void launch(const void* a, const void* b, void* out, int64_t n, cudaStream_t stream) {
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  T* o = static_cast<T*>(out);
  if (aligned16(a) && aligned16(b) && aligned16(out)) {
    const int64_t threads = (n + 7) / 8;
    add_kernel<T><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(x, y, o, n);
  } else {
    add_scalar_kernel<T><<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(x, y, o, n);
  }
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace detail {

void add_launch(const void* a, const void* b, void* out, int64_t n, bool bf16, cudaStream_t stream) {
  if (n == 0) return;
  if (bf16)
    launch<__nv_bfloat16>(a, b, out, n, stream);
  else
    launch<float>(a, b, out, n, stream);
}

}  // namespace detail

}  // namespace mt::cuda

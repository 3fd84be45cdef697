#include "kernels/cuda/rope.h"

#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/rope_math.cuh"
#include "kernels/cuda/tensor_checks.h"
#include "kernels/cuda/kernel_launch.cuh"

namespace mt::cuda {

namespace {

// Passed by value: the frequencies are computed on the host with the CPU reference's fp32 formula,
// so both backends (and HF, which computes them on the CPU) start from the same bits.
struct InvFreq {
  float v[kRopeMaxHeadDim / 2];
};

// attention_factor (YaRN's attention scaling) multiplies the fp32 values before the bf16 rounding, as the CPU
// reference and Transformers do; 1 leaves them unchanged.
template <typename P>
__global__ void rope_tables_kernel(const P* __restrict__ pos, InvFreq inv, float attention_factor, int64_t T,
                                   int64_t half, bool bf16_out, float* cos_out, float* sin_out) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * half) return;
  const int64_t t = i / half, j = i - t * half;
  const float f = inv.v[j] * static_cast<float>(pos[t]);
  // Double-precision cos/sin rounded once to fp32: the correctly rounded value, which is what the
  // host libm returns for the CPU reference (CUDA's fp32 cosf may be 1-2 ulp off).
  float c = static_cast<float>(cos(static_cast<double>(f))) * attention_factor;
  float s = static_cast<float>(sin(static_cast<double>(f))) * attention_factor;
  if (bf16_out) c = Elt<bf16>::round(c), s = Elt<bf16>::round(s);
  cos_out[i] = c;
  sin_out[i] = s;
}

// One thread per rotation pair (j, j + D/2) so that out may alias x.
template <typename T>
__global__ void rope_forward_kernel(const T* x, const float* __restrict__ cosv, const float* __restrict__ sinv, T* out,
                                    int64_t T_, int64_t heads, int64_t half) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T_ * heads * half) return;
  const int64_t j = i % half, row = i / half, t = row / heads;
  const int64_t base = row * 2 * half;
  const float c = cosv[t * half + j], s = sinv[t * half + j];
  const float a = Elt<T>::load(x, base + j), b = Elt<T>::load(x, base + j + half);
  // out_j = a·c + (−b)·s, out_{j+h} = b·c + a·s; each product and the sum rounded in bf16 mode.
  const float o1 = Elt<T>::round(Elt<T>::round(a * c) + Elt<T>::round(-b * s));
  const float o2 = Elt<T>::round(Elt<T>::round(b * c) + Elt<T>::round(a * s));
  Elt<T>::store(out, base + j, o1);
  Elt<T>::store(out, base + j + half, o2);
}

template <typename T>
__global__ void rope_backward_kernel(const T* dy, const float* __restrict__ cosv, const float* __restrict__ sinv, T* dx,
                                     int64_t T_, int64_t heads, int64_t half) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T_ * heads * half) return;
  const int64_t j = i % half, row = i / half, t = row / heads;
  const int64_t base = row * 2 * half;
  const float c = cosv[t * half + j], s = sinv[t * half + j];
  const float ga = Elt<T>::load(dy, base + j), gb = Elt<T>::load(dy, base + j + half);
  float o1, o2;
  rope_pair_backward(ga, gb, c, s, o1, o2);
  Elt<T>::store(dx, base + j, o1);
  Elt<T>::store(dx, base + j + half, o2);
}

// bf16 with half % 8 == 0 and 16-byte aligned arrays: 8 rotation pairs per thread, 16-byte accesses (the
// per-pair kernels above spent most of their time on 64-bit index divisions and 2-byte accesses).
template <bool kForward>
__global__ void rope_bf16x8_kernel(const bf16* x, const float* __restrict__ cosv, const float* __restrict__ sinv,
                                   bf16* out, int64_t T_, int64_t heads, int64_t half) {
  pdl_wait();
  const int64_t packets = half / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T_ * heads * packets) return;
  const int64_t row = i / packets, j = (i - row * packets) * 8, t = row / heads;
  const int64_t base = row * 2 * half;
  float a[8], b[8], c[8], s[8], o1[8], o2[8];
  bf16x8_to_float(*reinterpret_cast<const uint4*>(x + base + j), a);
  bf16x8_to_float(*reinterpret_cast<const uint4*>(x + base + j + half), b);
  const float4* cp = reinterpret_cast<const float4*>(cosv + t * half + j);
  const float4* sp = reinterpret_cast<const float4*>(sinv + t * half + j);
  *reinterpret_cast<float4*>(c) = cp[0], *reinterpret_cast<float4*>(c + 4) = cp[1];
  *reinterpret_cast<float4*>(s) = sp[0], *reinterpret_cast<float4*>(s + 4) = sp[1];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if constexpr (kForward)  // as rope_forward_kernel: each product and the sum rounded to bf16
      rope_pair_forward_bf16(a[e], b[e], c[e], s[e], o1[e], o2[e]);
    else  // as rope_backward_kernel
      rope_pair_backward(a[e], b[e], c[e], s[e], o1[e], o2[e]);
  }
  *reinterpret_cast<uint4*>(out + base + j) = float_to_bf16x8(o1);
  *reinterpret_cast<uint4*>(out + base + j + half) = float_to_bf16x8(o2);
}

bool rope_packed(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& out, int64_t half) {
  return x.dtype() == DType::BF16 && half % 8 == 0 && aligned16(x) && aligned16(cos) && aligned16(sin) &&
         aligned16(out);
}

struct RopeDims {
  int device;
  int64_t T, half, heads;
};

RopeDims check_rope(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& out, const char* op) {
  check_float_dtype(x, op);
  const int dev = x.device().index;
  MT_CUDA_REQUIRE(cos.ndim() == 2 && cos.dim(1) > 0,
                  std::string(op) + ": cos table must be F32 [T, D/2], got " + tensor_where(cos));
  const int64_t T = cos.dim(0), half = cos.dim(1);
  check_tensor(cos, op, dev, DType::F32, T * half);
  check_tensor(sin, op, dev, DType::F32, T * half);
  MT_CUDA_REQUIRE(T > 0 ? x.numel() % (T * 2 * half) == 0 : x.numel() == 0,
                  std::string(op) + ": input " + tensor_where(x) + " is not [T=" + std::to_string(T) + ", heads, " +
                      std::to_string(2 * half) + "]");
  check_tensor(out, op, dev, x.dtype(), x.numel());
  return {dev, T, half, T == 0 ? 0 : x.numel() / (T * 2 * half)};
}

}  // namespace

namespace {

void tables_launch(const Tensor& positions, const InvFreq& inv, float attention_factor, int64_t half, bool bf16_out,
                   Tensor& cos, Tensor& sin, cudaStream_t stream, const char* op) {
  MT_CUDA_REQUIRE(positions.defined() && positions.device().is_cuda() &&
                      (positions.dtype() == DType::I64 || positions.dtype() == DType::I32),
                  std::string(op) + ": positions must be I64 or I32 on a CUDA device, got " + tensor_where(positions));
  const int dev = positions.device().index;
  const int64_t T = positions.numel();
  check_tensor(cos, op, dev, DType::F32, T * half);
  check_tensor(sin, op, dev, DType::F32, T * half);
  if (T == 0) return;
  const unsigned blocks = blocks_for(T * half, 256);
  if (positions.dtype() == DType::I64)
    launch_kernel(rope_tables_kernel<int64_t>, blocks, 256, 0, stream, positions.data_as<int64_t>(), inv,
        attention_factor, T, half, bf16_out, cos.data_as<float>(), sin.data_as<float>());
  else
    launch_kernel(rope_tables_kernel<int32_t>, blocks, 256, 0, stream, positions.data_as<int32_t>(), inv,
        attention_factor, T, half, bf16_out, cos.data_as<float>(), sin.data_as<float>());
}

}  // namespace

void rope_tables(const Tensor& positions, int64_t head_dim, double theta, bool bf16_out, Tensor& cos, Tensor& sin,
                 cudaStream_t stream) {
  const char* op = "rope_tables";
  MT_CUDA_REQUIRE(head_dim > 0 && head_dim % 2 == 0 && head_dim <= kRopeMaxHeadDim,
                  std::string(op) + ": head_dim must be even and in [2, 512], got " + std::to_string(head_dim));
  const int64_t half = head_dim / 2;
  InvFreq inv{};
  const float base = static_cast<float>(theta);
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv.v[i] = 1.0f / std::pow(base, e);  // the CPU reference's (and Transformers') fp32 formula
  }
  tables_launch(positions, inv, 1.0f, half, bf16_out, cos, sin, stream, op);
}

void rope_tables(const Tensor& positions, const std::vector<float>& inv_freq, float attention_factor, bool bf16_out,
                 Tensor& cos, Tensor& sin, cudaStream_t stream) {
  const char* op = "rope_tables";
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  MT_CUDA_REQUIRE(half > 0 && 2 * half <= kRopeMaxHeadDim,
                  std::string(op) + ": " + std::to_string(half) + " frequencies (head_dim must be in [2, 512])");
  InvFreq inv{};
  std::copy(inv_freq.begin(), inv_freq.end(), inv.v);
  tables_launch(positions, inv, attention_factor, half, bf16_out, cos, sin, stream, op);
}

void rope_forward(const Tensor& x, const Tensor& cos, const Tensor& sin, Tensor& out, cudaStream_t stream) {
  const RopeDims d = check_rope(x, cos, sin, out, "rope_forward");
  const int64_t n = d.T * d.heads * d.half;
  if (n == 0) return;
  if (rope_packed(x, cos, sin, out, d.half)) {
    launch_kernel(rope_bf16x8_kernel<true>, blocks_for(n / 8, 256), 256, 0, stream, x.data_as<bf16>(),
        cos.data_as<float>(), sin.data_as<float>(), out.data_as<bf16>(), d.T, d.heads, d.half);
    return;
  }
  if (x.dtype() == DType::BF16)
    launch_kernel(rope_forward_kernel<bf16>, blocks_for(n, 256), 256, 0, stream, x.data_as<bf16>(),
        cos.data_as<float>(), sin.data_as<float>(), out.data_as<bf16>(), d.T, d.heads, d.half);
  else
    launch_kernel(rope_forward_kernel<float>, blocks_for(n, 256), 256, 0, stream, x.data_as<float>(),
        cos.data_as<float>(), sin.data_as<float>(), out.data_as<float>(), d.T, d.heads, d.half);
}

void rope_backward(const Tensor& dy, const Tensor& cos, const Tensor& sin, Tensor& dx, cudaStream_t stream) {
  const RopeDims d = check_rope(dy, cos, sin, dx, "rope_backward");
  const int64_t n = d.T * d.heads * d.half;
  if (n == 0) return;
  if (rope_packed(dy, cos, sin, dx, d.half)) {
    launch_kernel(rope_bf16x8_kernel<false>, blocks_for(n / 8, 256), 256, 0, stream, dy.data_as<bf16>(),
        cos.data_as<float>(), sin.data_as<float>(), dx.data_as<bf16>(), d.T, d.heads, d.half);
    return;
  }
  if (dy.dtype() == DType::BF16)
    launch_kernel(rope_backward_kernel<bf16>, blocks_for(n, 256), 256, 0, stream, dy.data_as<bf16>(),
        cos.data_as<float>(), sin.data_as<float>(), dx.data_as<bf16>(), d.T, d.heads, d.half);
  else
    launch_kernel(rope_backward_kernel<float>, blocks_for(n, 256), 256, 0, stream, dy.data_as<float>(),
        cos.data_as<float>(), sin.data_as<float>(), dx.data_as<float>(), d.T, d.heads, d.half);
}

}  // namespace mt::cuda

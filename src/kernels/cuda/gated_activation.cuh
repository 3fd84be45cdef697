// The experts' gated activations on the packed [N, 2F] gate|up layout (gate columns 0..F-1, up F..2F-1):
// out[r, c] = act(gate, up) · row_weight[r] (the routing weight folded in when given). One structure for every
// activation: one thread per element or per 16-byte packet forward, a warp per row backward (the routing-weight
// gradient is a row sum, kept in a fixed lane/shuffle order). An activation is a struct with
//   template <typename T> __device__ static float value(float g, float u)  — rounded to T where the CPU rounds
//   __device__ static void grad(float da, float g, float u, float& dg, float& du)  — fp32 on the saved g, u
// (swiglu.cu: SiLU; swiglu_oai.cu: GPT-OSS's clamped SwiGLU).
#pragma once
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernel_launch.cuh"
#include "kernels/cuda/tensor_checks.h"

namespace mt::cuda::gated {

constexpr int kWarpsPerBlock = 8;

template <class Act, typename T>
__global__ void forward_kernel(const T* __restrict__ gu, const float* __restrict__ w, T* __restrict__ out, int64_t N,
                               int64_t F) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * F) return;
  const int64_t r = i / F, c = i - r * F;
  float a = Act::template value<T>(Elt<T>::load(gu, r * 2 * F + c), Elt<T>::load(gu, r * 2 * F + F + c));
  if (w) a = a * w[r];
  Elt<T>::store(out, i, a);
}

template <class Act, typename T>
__global__ void backward_kernel(const T* __restrict__ dout, const T* __restrict__ gu, const float* __restrict__ w,
                                T* __restrict__ dgu, float* dw, int64_t N, int64_t F) {
  pdl_wait();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= N) return;
  const float wr = w ? w[r] : 1.0f;
  float dot = 0.0f;
  for (int64_t c = lane; c < F; c += 32) {
    const float g = Elt<T>::load(gu, r * 2 * F + c), u = Elt<T>::load(gu, r * 2 * F + F + c);
    const float d = Elt<T>::load(dout, r * F + c);
    if (dw) dot += d * Act::template value<T>(g, u);  // the forward's a, bit for bit
    float dg, du;
    Act::grad(d * wr, g, u, dg, du);
    Elt<T>::store(dgu, r * 2 * F + c, dg);
    Elt<T>::store(dgu, r * 2 * F + F + c, du);
  }
  if (dw) {
    dot = warp_sum(dot);
    if (lane == 0) dw[r] = dot;
  }
}

// bf16 with F % 8 == 0 and 16-byte aligned rows: the same math on 8 columns per thread with 16-byte loads and stores
// (per-element kernels moving 2 bytes per access ran at ~1.4 TB/s).
template <class Act>
__global__ void forward_bf16x8_kernel(const bf16* __restrict__ gu, const float* __restrict__ w, bf16* __restrict__ out,
                                      int64_t N, int64_t F) {
  pdl_wait();
  const int64_t packets = F / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * packets) return;
  const int64_t r = i / packets, c = (i - r * packets) * 8;
  float g[8], u[8], a[8];
  bf16x8_to_float(*reinterpret_cast<const uint4*>(gu + r * 2 * F + c), g);
  bf16x8_to_float(*reinterpret_cast<const uint4*>(gu + r * 2 * F + F + c), u);
  const float wr = w ? w[r] : 1.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    a[e] = Act::template value<bf16>(g[e], u[e]);
    if (w) a[e] = a[e] * wr;
  }
  *reinterpret_cast<uint4*>(out + r * F + c) = float_to_bf16x8(a);
}

template <class Act>
__global__ void backward_bf16x8_kernel(const bf16* __restrict__ dout, const bf16* __restrict__ gu,
                                       const float* __restrict__ w, bf16* __restrict__ dgu, float* dw, int64_t N,
                                       int64_t F) {
  pdl_wait();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= N) return;
  const float wr = w ? w[r] : 1.0f;
  float dot = 0.0f;
  for (int64_t c = lane * 8; c < F; c += 32 * 8) {
    float g[8], u[8], d[8], dg[8], du[8];
    bf16x8_to_float(*reinterpret_cast<const uint4*>(gu + r * 2 * F + c), g);
    bf16x8_to_float(*reinterpret_cast<const uint4*>(gu + r * 2 * F + F + c), u);
    bf16x8_to_float(*reinterpret_cast<const uint4*>(dout + r * F + c), d);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (dw) dot += d[e] * Act::template value<bf16>(g[e], u[e]);
      Act::grad(d[e] * wr, g[e], u[e], dg[e], du[e]);
    }
    *reinterpret_cast<uint4*>(dgu + r * 2 * F + c) = float_to_bf16x8(dg);
    *reinterpret_cast<uint4*>(dgu + r * 2 * F + F + c) = float_to_bf16x8(du);
  }
  if (dw) {
    dot = warp_sum(dot);
    if (lane == 0) dw[r] = dot;
  }
}

inline bool packed_bf16(const Tensor& t, int64_t F) { return t.dtype() == DType::BF16 && F % 8 == 0 && aligned16(t); }

struct Dims {
  int device;
  int64_t N, F;
};

inline Dims check_gate_up(const Tensor& gate_up, const char* op) {
  check_float_dtype(gate_up, op);
  MT_CUDA_REQUIRE(gate_up.ndim() == 2 && gate_up.dim(1) % 2 == 0,
                  std::string(op) + ": gate_up must be [N, 2F], got " + tensor_where(gate_up));
  return {gate_up.device().index, gate_up.dim(0), gate_up.dim(1) / 2};
}

// out [N, F] = act(gate_up [N, 2F]) (· row_weight [N] F32 when given); out of gate_up's dtype.
template <class Act>
void forward(const char* op, const Tensor& gate_up, const Tensor* row_weight, Tensor& out, cudaStream_t stream) {
  const Dims d = check_gate_up(gate_up, op);
  check_tensor(out, op, d.device, gate_up.dtype(), d.N * d.F);
  if (row_weight) check_tensor(*row_weight, op, d.device, DType::F32, d.N);
  if (d.N * d.F == 0) return;
  const float* w = row_weight ? row_weight->data_as<float>() : nullptr;
  if (packed_bf16(gate_up, d.F) && packed_bf16(out, d.F)) {
    launch_kernel(forward_bf16x8_kernel<Act>, blocks_for(d.N * (d.F / 8), 256), 256, 0, stream,
                  gate_up.data_as<bf16>(), w, out.data_as<bf16>(), d.N, d.F);
    return;
  }
  const unsigned blocks = blocks_for(d.N * d.F, 256);
  if (gate_up.dtype() == DType::BF16)
    launch_kernel(forward_kernel<Act, bf16>, blocks, 256, 0, stream, gate_up.data_as<bf16>(), w, out.data_as<bf16>(),
                  d.N, d.F);
  else
    launch_kernel(forward_kernel<Act, float>, blocks, 256, 0, stream, gate_up.data_as<float>(), w,
                  out.data_as<float>(), d.N, d.F);
}

// dgate_up [N, 2F] = d act · (dout ⊙ row_weight); drow_weight [N] (when given) = Σ_c dout · act.
template <class Act>
void backward(const char* op, const Tensor& dout, const Tensor& gate_up, const Tensor* row_weight, Tensor& dgate_up,
              Tensor* drow_weight, cudaStream_t stream) {
  const Dims d = check_gate_up(gate_up, op);
  check_tensor(dout, op, d.device, gate_up.dtype(), d.N * d.F);
  check_tensor(dgate_up, op, d.device, gate_up.dtype(), d.N * 2 * d.F);
  if (row_weight) check_tensor(*row_weight, op, d.device, DType::F32, d.N);
  MT_CUDA_REQUIRE(!drow_weight || row_weight, std::string(op) + ": drow_weight given without row_weight");
  if (drow_weight) check_tensor(*drow_weight, op, d.device, DType::F32, d.N);
  if (d.N == 0) return;
  const float* w = row_weight ? row_weight->data_as<float>() : nullptr;
  float* dw = drow_weight ? drow_weight->data_as<float>() : nullptr;
  const unsigned blocks = blocks_for(d.N, kWarpsPerBlock);
  if (packed_bf16(gate_up, d.F) && packed_bf16(dout, d.F) && packed_bf16(dgate_up, d.F)) {
    launch_kernel(backward_bf16x8_kernel<Act>, blocks, 32 * kWarpsPerBlock, 0, stream, dout.data_as<bf16>(),
                  gate_up.data_as<bf16>(), w, dgate_up.data_as<bf16>(), dw, d.N, d.F);
    return;
  }
  if (gate_up.dtype() == DType::BF16)
    launch_kernel(backward_kernel<Act, bf16>, blocks, 32 * kWarpsPerBlock, 0, stream, dout.data_as<bf16>(),
                  gate_up.data_as<bf16>(), w, dgate_up.data_as<bf16>(), dw, d.N, d.F);
  else
    launch_kernel(backward_kernel<Act, float>, blocks, 32 * kWarpsPerBlock, 0, stream, dout.data_as<float>(),
                  gate_up.data_as<float>(), w, dgate_up.data_as<float>(), dw, d.N, d.F);
}

}  // namespace mt::cuda::gated

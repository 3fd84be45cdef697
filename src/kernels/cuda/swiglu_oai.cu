#include "kernels/cuda/swiglu_oai.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernel_launch.cuh"
#include "kernels/cuda/tensor_checks.h"

// The structure of swiglu.cu (one thread per element or per 16-byte packet forward, a warp per row backward for
// the routing-weight row sum); only the element math differs.

namespace mt::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr float kLimit = 7.0f;    // cpu::kSwigluOaiLimit
constexpr float kAlpha = 1.702f;  // cpu::kSwigluOaiAlpha

// The clamps written as std::min / std::clamp are (the CPU's), so a NaN passes through them alike.
__device__ __forceinline__ float clamp_gate(float g) { return kLimit < g ? kLimit : g; }
__device__ __forceinline__ float clamp_up(float u) { return u < -kLimit ? -kLimit : (kLimit < u ? kLimit : u); }

// a = (u' + 1)·g'·sigmoid(α·g'), each op rounded to T as the CPU's bf16 path (identity for fp32).
template <typename T>
__device__ __forceinline__ float swiglu_oai_a(float g, float u) {
  const float gc = clamp_gate(g), uc = clamp_up(u);
  const float z = Elt<T>::round(gc * kAlpha);
  const float s = Elt<T>::round(1.0f / (1.0f + expf(-z)));
  const float glu = Elt<T>::round(gc * s);
  return Elt<T>::round(Elt<T>::round(uc + 1.0f) * glu);
}

// da -> (dg, du) in fp32 on the saved g, u, as cpu::swiglu_oai_backward_rows.
__device__ __forceinline__ void swiglu_oai_grad(float da, float g, float u, float& dg, float& du) {
  const float gc = clamp_gate(g), uc = clamp_up(u);
  const float s = 1.0f / (1.0f + expf(-kAlpha * gc));
  const float glu = gc * s;
  dg = g <= kLimit ? da * (uc + 1.0f) * (s + kAlpha * gc * s * (1.0f - s)) : 0.0f;  // d glu/d g' = s + α·g'·s·(1−s)
  du = (u >= -kLimit && u <= kLimit) ? da * glu : 0.0f;
}

template <typename T>
__global__ void swiglu_oai_forward_kernel(const T* __restrict__ gu, const float* __restrict__ w, T* __restrict__ out,
                                          int64_t N, int64_t F) {
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * F) return;
  const int64_t r = i / F, c = i - r * F;
  float a = swiglu_oai_a<T>(Elt<T>::load(gu, r * 2 * F + c), Elt<T>::load(gu, r * 2 * F + F + c));
  if (w) a = a * w[r];
  Elt<T>::store(out, i, a);
}

// One warp per row (the routing-weight gradient is a row sum, kept in a fixed lane/shuffle order).
template <typename T>
__global__ void swiglu_oai_backward_kernel(const T* __restrict__ dout, const T* __restrict__ gu,
                                           const float* __restrict__ w, T* __restrict__ dgu, float* dw, int64_t N,
                                           int64_t F) {
  pdl_wait();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= N) return;
  const float wr = w ? w[r] : 1.0f;
  float dot = 0.0f;
  for (int64_t c = lane; c < F; c += 32) {
    const float g = Elt<T>::load(gu, r * 2 * F + c), u = Elt<T>::load(gu, r * 2 * F + F + c);
    const float d = Elt<T>::load(dout, r * F + c);
    if (dw) dot += d * swiglu_oai_a<T>(g, u);  // the forward's a, bit for bit
    float dg, du;
    swiglu_oai_grad(d * wr, g, u, dg, du);
    Elt<T>::store(dgu, r * 2 * F + c, dg);
    Elt<T>::store(dgu, r * 2 * F + F + c, du);
  }
  if (dw) {
    dot = warp_sum(dot);
    if (lane == 0) dw[r] = dot;
  }
}

// bf16 with F % 8 == 0 and 16-byte aligned rows: the same math on 8 columns per thread, 16-byte accesses.
__global__ void swiglu_oai_forward_bf16x8_kernel(const bf16* __restrict__ gu, const float* __restrict__ w,
                                                 bf16* __restrict__ out, int64_t N, int64_t F) {
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
    a[e] = swiglu_oai_a<bf16>(g[e], u[e]);
    if (w) a[e] = a[e] * wr;
  }
  *reinterpret_cast<uint4*>(out + r * F + c) = float_to_bf16x8(a);
}

__global__ void swiglu_oai_backward_bf16x8_kernel(const bf16* __restrict__ dout, const bf16* __restrict__ gu,
                                                  const float* __restrict__ w, bf16* __restrict__ dgu, float* dw,
                                                  int64_t N, int64_t F) {
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
      if (dw) dot += d[e] * swiglu_oai_a<bf16>(g[e], u[e]);
      swiglu_oai_grad(d[e] * wr, g[e], u[e], dg[e], du[e]);
    }
    *reinterpret_cast<uint4*>(dgu + r * 2 * F + c) = float_to_bf16x8(dg);
    *reinterpret_cast<uint4*>(dgu + r * 2 * F + F + c) = float_to_bf16x8(du);
  }
  if (dw) {
    dot = warp_sum(dot);
    if (lane == 0) dw[r] = dot;
  }
}

bool packed_bf16(const Tensor& t, int64_t F) { return t.dtype() == DType::BF16 && F % 8 == 0 && aligned16(t); }

struct Dims {
  int device;
  int64_t N, F;
};

Dims check_gate_up(const Tensor& gate_up, const char* op) {
  check_float_dtype(gate_up, op);
  MT_CUDA_REQUIRE(gate_up.ndim() == 2 && gate_up.dim(1) % 2 == 0,
                  std::string(op) + ": gate_up must be [N, 2F], got " + tensor_where(gate_up));
  return {gate_up.device().index, gate_up.dim(0), gate_up.dim(1) / 2};
}

}  // namespace

void swiglu_oai_forward(const Tensor& gate_up, const Tensor* row_weight, Tensor& out, cudaStream_t stream) {
  const char* op = "swiglu_oai_forward";
  const Dims d = check_gate_up(gate_up, op);
  check_tensor(out, op, d.device, gate_up.dtype(), d.N * d.F);
  if (row_weight) check_tensor(*row_weight, op, d.device, DType::F32, d.N);
  if (d.N * d.F == 0) return;
  const float* w = row_weight ? row_weight->data_as<float>() : nullptr;
  if (packed_bf16(gate_up, d.F) && packed_bf16(out, d.F)) {
    launch_kernel(swiglu_oai_forward_bf16x8_kernel, blocks_for(d.N * (d.F / 8), 256), 256, 0, stream,
                  gate_up.data_as<bf16>(), w, out.data_as<bf16>(), d.N, d.F);
    return;
  }
  const unsigned blocks = blocks_for(d.N * d.F, 256);
  if (gate_up.dtype() == DType::BF16)
    launch_kernel(swiglu_oai_forward_kernel<bf16>, blocks, 256, 0, stream, gate_up.data_as<bf16>(), w,
                  out.data_as<bf16>(), d.N, d.F);
  else
    launch_kernel(swiglu_oai_forward_kernel<float>, blocks, 256, 0, stream, gate_up.data_as<float>(), w,
                  out.data_as<float>(), d.N, d.F);
}

void swiglu_oai_backward(const Tensor& dout, const Tensor& gate_up, const Tensor* row_weight, Tensor& dgate_up,
                         Tensor* drow_weight, cudaStream_t stream) {
  const char* op = "swiglu_oai_backward";
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
    launch_kernel(swiglu_oai_backward_bf16x8_kernel, blocks, 32 * kWarpsPerBlock, 0, stream, dout.data_as<bf16>(),
                  gate_up.data_as<bf16>(), w, dgate_up.data_as<bf16>(), dw, d.N, d.F);
    return;
  }
  if (gate_up.dtype() == DType::BF16)
    launch_kernel(swiglu_oai_backward_kernel<bf16>, blocks, 32 * kWarpsPerBlock, 0, stream, dout.data_as<bf16>(),
                  gate_up.data_as<bf16>(), w, dgate_up.data_as<bf16>(), dw, d.N, d.F);
  else
    launch_kernel(swiglu_oai_backward_kernel<float>, blocks, 32 * kWarpsPerBlock, 0, stream, dout.data_as<float>(),
                  gate_up.data_as<float>(), w, dgate_up.data_as<float>(), dw, d.N, d.F);
}

}  // namespace mt::cuda

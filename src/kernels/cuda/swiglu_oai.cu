#include "kernels/cuda/swiglu_oai.h"

#include "kernels/cuda/gated_activation.cuh"

namespace mt::cuda {

namespace {

constexpr float kLimit = 7.0f;    // cpu::kSwigluOaiLimit
constexpr float kAlpha = 1.702f;  // cpu::kSwigluOaiAlpha

// The clamps written as std::min / std::clamp are (the CPU's), so a NaN passes through them alike.
__device__ __forceinline__ float clamp_gate(float g) { return kLimit < g ? kLimit : g; }
__device__ __forceinline__ float clamp_up(float u) { return u < -kLimit ? -kLimit : (kLimit < u ? kLimit : u); }

struct ClampedSwiglu {
  // a = (u' + 1)·g'·sigmoid(α·g'), each op rounded to T as the CPU's bf16 path (identity for fp32).
  template <typename T>
  __device__ static float value(float g, float u) {
    const float gc = clamp_gate(g), uc = clamp_up(u);
    const float z = Elt<T>::round(gc * kAlpha);
    const float s = Elt<T>::round(1.0f / (1.0f + expf(-z)));
    const float glu = Elt<T>::round(gc * s);
    return Elt<T>::round(Elt<T>::round(uc + 1.0f) * glu);
  }
  // da -> (dg, du) in fp32 on the saved g, u, as cpu::swiglu_oai_backward_rows.
  __device__ static void grad(float da, float g, float u, float& dg, float& du) {
    const float gc = clamp_gate(g), uc = clamp_up(u);
    const float s = 1.0f / (1.0f + expf(-kAlpha * gc));
    const float glu = gc * s;
    dg = g <= kLimit ? da * (uc + 1.0f) * (s + kAlpha * gc * s * (1.0f - s)) : 0.0f;  // d glu/d g' = s + α·g'·s·(1−s)
    du = (u >= -kLimit && u <= kLimit) ? da * glu : 0.0f;
  }
};

}  // namespace

void swiglu_oai_forward(const Tensor& gate_up, const Tensor* row_weight, Tensor& out, cudaStream_t stream) {
  gated::forward<ClampedSwiglu>("swiglu_oai_forward", gate_up, row_weight, out, stream);
}

void swiglu_oai_backward(const Tensor& dout, const Tensor& gate_up, const Tensor* row_weight, Tensor& dgate_up,
                         Tensor* drow_weight, cudaStream_t stream) {
  gated::backward<ClampedSwiglu>("swiglu_oai_backward", dout, gate_up, row_weight, dgate_up, drow_weight, stream);
}

}  // namespace mt::cuda

#include "kernels/cuda/swiglu.h"

#include "kernels/cuda/gated_activation.cuh"

namespace mt::cuda {

namespace {

// a = bf16(bf16(silu(g)) · u) as HF's two bf16 ops (identity rounding for fp32).
struct Silu {
  template <typename T>
  __device__ static float value(float g, float u) {
    return Elt<T>::round(Elt<T>::round(g / (1.0f + expf(-g))) * u);
  }
  // silu'(g) = sig·(1 + g·(1 − sig)).
  __device__ static void grad(float da, float g, float u, float& dg, float& du) {
    const float sig = 1.0f / (1.0f + expf(-g));
    du = da * g * sig;
    dg = da * u * sig * (1.0f + g * (1.0f - sig));
  }
};

}  // namespace

void swiglu_forward(const Tensor& gate_up, const Tensor* row_weight, Tensor& out, cudaStream_t stream) {
  gated::forward<Silu>("swiglu_forward", gate_up, row_weight, out, stream);
}

void swiglu_backward(const Tensor& dout, const Tensor& gate_up, const Tensor* row_weight, Tensor& dgate_up,
                     Tensor* drow_weight, cudaStream_t stream) {
  gated::backward<Silu>("swiglu_backward", dout, gate_up, row_weight, dgate_up, drow_weight, stream);
}

}  // namespace mt::cuda

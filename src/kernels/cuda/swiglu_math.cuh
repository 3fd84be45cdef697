// The SwiGLU activation of one bf16 (gate, up) pair, as HF computes it in bf16: a = bf16(bf16(silu(g)) · u).
// One definition for the SwiGLU kernels and the grouped GEMM that applies it in its store (bit-equal).
#pragma once
#include "kernels/cuda/cuda_common.cuh"

namespace mt::cuda {

__device__ inline float swiglu_a_bf16(float g, float u) {
  return Elt<bf16>::round(Elt<bf16>::round(g / (1.0f + expf(-g))) * u);
}

}  // namespace mt::cuda

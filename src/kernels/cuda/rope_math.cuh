// RoPE on one rotation pair (x_j, x_{j+D/2}) with the table's (cos, sin), as the RoPE kernels compute it. The fused
// QK-norm + RoPE rows (rmsnorm.cu, rope_lane) compute each lane's half of the same formulas and get the same bits.
#pragma once
#include "kernels/cuda/cuda_common.cuh"

namespace mt::cuda {

// Forward in bf16 mode: each product and the sum rounded to bf16 (HF's bf16 ops).
__device__ inline void rope_pair_forward_bf16(float a, float b, float c, float s, float& o1, float& o2) {
  o1 = Elt<bf16>::round(Elt<bf16>::round(a * c) + Elt<bf16>::round(-b * s));
  o2 = Elt<bf16>::round(Elt<bf16>::round(b * c) + Elt<bf16>::round(a * s));
}

// Backward (the rotation's transpose) in fp32: dx_j = ga·c + gb·s, dx_{j+D/2} = gb·c − ga·s, with the fused
// multiply-add written out so every kernel contracts it the same way.
__device__ inline void rope_pair_backward(float ga, float gb, float c, float s, float& o1, float& o2) {
  o1 = __fmaf_rn(ga, c, __fmul_rn(gb, s));
  o2 = __fmaf_rn(gb, c, -__fmul_rn(ga, s));
}

}  // namespace mt::cuda

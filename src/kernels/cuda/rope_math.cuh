// RoPE on one rotation pair (x_j, x_{j+D/2}) with the table's (cos, sin): the RoPE kernels compute both outputs of a
// pair, the fused QK-norm + RoPE rows (rmsnorm.cu, rope_lane) only a lane's own one, through the same formulas, so
// the two paths agree bit for bit.
#pragma once
#include "kernels/cuda/cuda_common.cuh"

namespace mt::cuda {

// One output of a pair, from its own input, its partner's and the sine signed for that output (sp = −s for x_j's
// forward output and x_{j+D/2}'s backward one, +s otherwise; negating a factor negates the product exactly).
// Forward in bf16 mode: each product and the sum rounded to bf16 (HF's bf16 ops).
__device__ inline float rope_out_forward_bf16(float own, float partner, float c, float sp) {
  return Elt<bf16>::round(Elt<bf16>::round(own * c) + Elt<bf16>::round(partner * sp));
}
// Backward (the rotation's transpose) in fp32, with the fused multiply-add written out so every kernel contracts it
// the same way.
__device__ inline float rope_out_backward(float own, float partner, float c, float sp) {
  return __fmaf_rn(own, c, __fmul_rn(partner, sp));
}

// Both outputs: forward o1 = a·c − b·s, o2 = b·c + a·s; backward dx_j = ga·c + gb·s, dx_{j+D/2} = gb·c − ga·s.
__device__ inline void rope_pair_forward_bf16(float a, float b, float c, float s, float& o1, float& o2) {
  o1 = rope_out_forward_bf16(a, b, c, -s);
  o2 = rope_out_forward_bf16(b, a, c, s);
}
__device__ inline void rope_pair_backward(float ga, float gb, float c, float s, float& o1, float& o2) {
  o1 = rope_out_backward(ga, gb, c, s);
  o2 = rope_out_backward(gb, ga, c, -s);
}

}  // namespace mt::cuda

// SwiGLU activation: a = silu(g) ⊙ u, silu(g) = g·sigmoid(g).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace mt::cpu {

// g, u F32 [N, F] -> a F32 [N, F]. bf16: silu rounded, then the product rounded (two bf16 ops).
Tensor swiglu_forward(const Tensor& g, const Tensor& u, bool bf16);
// da [N, F] -> dg, du (overwritten, allocated here).
void swiglu_backward(const Tensor& da, const Tensor& g, const Tensor& u, Tensor& dg, Tensor& du);

// Raw forms over rows with strides (the experts keep gate and up side by side in one [N, 2I] buffer).
void swiglu_forward_rows(int64_t rows, int64_t F, const float* g, const float* u, int64_t ld_in, float* a,
                         int64_t ld_out, bool bf16);
void swiglu_backward_rows(int64_t rows, int64_t F, const float* da, int64_t ld_da, const float* g, const float* u,
                          int64_t ld_in, float* dg, float* du, int64_t ld_out);

}  // namespace mt::cpu

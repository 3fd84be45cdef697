// Biases on the GPU (GPT-OSS: the attention projections, the router and the experts have them), the twins of
// kernels/cpu/linear.h (bias_backward) and the bias steps of kernels/cpu/experts.cpp:
//   dense     y [N, C] = acc [N, C] + b [C]                          (the fused add behind linear_forward_bias)
//             db [C] += Σ_rows dy                                     (fp32, deterministic)
//   grouped   rows [offsets[e], offsets[e+1]) of y get bias[e]        (the expert-sorted layout, moe_permute.h)
//             dbias [E, C] += per-expert column sums of dy            (fp32, deterministic)
// offsets: I32 [E + 1] on the device, as the grouped GEMMs take them (non-decreasing, offsets[0] = 0, offsets[E] <=
// N; moe_plan makes them so). Rows at or past offsets[E] (padding) are neither changed nor summed. Malformed offsets
// give wrong values but never an access outside y, bias or dbias.
// Deterministic: fixed row chunks, a fixed order inside each chunk and an ordered sum over the chunks; the chunking
// depends on N and the offsets only. Every call is asynchronous on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include "core/tensor.h"

namespace mt::cuda {

// acc F32 [N, C], b BF16|F32 [C] -> y BF16|F32 [N, C] = acc + b, rounded once to y's dtype (as addmm's epilogue).
// y may alias acc when y is F32.
void bias_add_rows(const Tensor& acc, const Tensor& b, Tensor& y, cudaStream_t stream);

// dy BF16|F32 [N, C] (any shape whose last dim is C) -> db F32 [C] += Σ over rows (fp32).
void bias_backward(const Tensor& dy, Tensor& db, cudaStream_t stream);

// y BF16|F32 [N, C], bias BF16|F32 [E, C], offsets I32 [E + 1]: y[r] += bias[e] for r in [offsets[e],
// offsets[e+1]). BF16 y: y = bf16(y + bias) (the GEMM output is already rounded: two roundings, as Transformers'
// grouped path adds the bias in place).
void grouped_bias_add(Tensor& y, const Tensor& bias, const Tensor& offsets, cudaStream_t stream);

// dy BF16|F32 [N, C], offsets I32 [E + 1] -> dbias F32 [E, C] += Σ of expert e's rows of dy (fp32). An expert
// without rows is left as it was.
void grouped_bias_backward(const Tensor& dy, const Tensor& offsets, Tensor& dbias, cudaStream_t stream);

}  // namespace mt::cuda

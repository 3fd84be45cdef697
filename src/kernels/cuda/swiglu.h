// SwiGLU on the packed [N, 2F] gate|up layout (one GEMM produces both halves; the experts keep it so):
//   a = silu(g) ⊙ u, silu(g) = g·sigmoid(g);  optionally out = a · w_row (the routing weight of the row).
// BF16: a = bf16(bf16(silu(g)) · u) (two bf16 ops as HF), then out = bf16(a · w_row). F32: plain fp32.
#pragma once
#include <cuda_runtime_api.h>

#include "core/tensor.h"

namespace mt::cuda {

// gate_up [N, 2F] (BF16|F32) -> out [N, F] same dtype. row_weight: F32 [N] or null.
void swiglu_forward(const Tensor& gate_up, const Tensor* row_weight, Tensor& out, cudaStream_t stream);

// dout [N, F] -> dgate_up [N, 2F] (overwritten; fp32 math, rounded once to the dtype).
// With row_weight, the gradient is taken through out = a·w; drow_weight (F32 [N], may be null) receives
// Σ_i dout_i · a_i (a as the forward computed it, bf16-rounded in BF16 mode).
void swiglu_backward(const Tensor& dout, const Tensor& gate_up, const Tensor* row_weight, Tensor& dgate_up,
                     Tensor* drow_weight, cudaStream_t stream);

}  // namespace mt::cuda

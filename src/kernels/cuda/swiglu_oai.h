// GPT-OSS's clamped SwiGLU on the packed [N, 2F] gate|up layout (the layout of swiglu.h; the loader has
// de-interleaved HF's gate/up columns). The CPU twin is kernels/cpu/swiglu_oai.h (hf-numerics.md §4.2):
//   g' = min(g, 7);  u' = clamp(u, −7, 7);  a = (u' + 1) · g'·sigmoid(1.702·g');  optionally out = a · w_row.
// BF16: every op rounded as the eager bf16 ops do (1.702·g', the sigmoid, g'·s, u' + 1, the product), then
// out = bf16(a · w_row) as swiglu.h. F32: plain fp32. NaN inputs propagate as on the CPU (min/clamp keep them).
#pragma once
#include <cuda_runtime_api.h>

#include "core/tensor.h"

namespace mt::cuda {

// gate_up [N, 2F] (BF16|F32) -> out [N, F] same dtype. row_weight: F32 [N] or null.
void swiglu_oai_forward(const Tensor& gate_up, const Tensor* row_weight, Tensor& out, cudaStream_t stream);

// dout [N, F] -> dgate_up [N, 2F] (overwritten; fp32 math on the saved gate_up, rounded once to the dtype). The
// clamps pass the gradient where their input lies inside the bounds, bounds included (torch.clamp's rule): g > 7
// (or NaN) gets none, nor u outside [−7, 7]. With row_weight the gradient is taken through out = a·w; drow_weight
// (F32 [N], may be null) receives Σ_i dout_i · a_i (a as the forward computed it, bf16-rounded in BF16 mode).
void swiglu_oai_backward(const Tensor& dout, const Tensor& gate_up, const Tensor* row_weight, Tensor& dgate_up,
                         Tensor* drow_weight, cudaStream_t stream);

}  // namespace mt::cuda

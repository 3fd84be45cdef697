// Mamba2's time step and A on the GPU, the twins of the dt / A loops of layers/mamba2_mixer_block.cpp (Transformers'
// torch path, hf-numerics.md §6.2):
//   dt[t, h] = max(softplus(proj[t, col0 + h] + dt_bias[h]), time_step_min)      A[h] = −exp(A_log[h])
// In BF16 (proj BF16) the add and the softplus are bf16 ops (each rounded) and torch.clamp takes the bound in bf16;
// dt itself is handed on as F32 (the scan's input). softplus as torch: x > 20 passes through, else log1p(exp(x)).
// Backward as the CPU block: the clamp passes the gradient where the (rounded) softplus >= the bound, softplus' =
// sigmoid(x) (1 above the threshold); the bf16 roundings pass the gradient through.
//
// Bytes per call (heads 64, T = 16384: T·heads = 1.05 M): forward reads 2 B (proj, bf16) and writes 4 B (dt) per
// element = 6.3 MB -> ~1.6 µs at ~4 TB/s (launch-bound in practice); backward reads ddt 4 B + proj 2 B, writes
// dproj 2 B = 8.4 MB -> ~2 µs, plus the ddt_bias partials (≤ 128 rows × heads fp32, 32 KB). The A ops touch
// `heads` floats.
// Deterministic ddt_bias: one thread per (head, every 8th row of a block's rows) in row order, the 8 thread rows
// added in order, one partial row per block (≤ 128 blocks of rows, fixed by T), then an ordered column sum.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor.h"

namespace mt::cuda {

// dt = max(softplus(proj[:, col0 + h] + dt_bias[h]), time_step_min) -> dt F32 [T, heads]; in BF16 (proj BF16)
// the add and the softplus round to bf16 and the bound is bf16(time_step_min) (the CPU block's rounding);
// softplus as torch (threshold 20). dt_bias [heads] BF16|F32.
void mamba2_dt_forward(const Tensor& proj, int64_t col0, const Tensor& dt_bias, double time_step_min, Tensor& dt,
                       cudaStream_t stream);
// ddt F32 [T, heads] -> written into dproj's columns [dcol0, dcol0 + heads) (proj's dtype), through the clamp
// and softplus as the CPU block; ddt_bias F32 [heads] += Σ_t (fixed order; undefined = frozen). The sum is over
// the fp32 gradients (before dproj's rounding), as the CPU block's bias_backward.
void mamba2_dt_backward(const Tensor& ddt, const Tensor& proj, int64_t col0, const Tensor& dt_bias,
                        double time_step_min, Tensor& dproj, int64_t dcol0, Tensor& ddt_bias, cudaStream_t stream);
// A = −exp(A_log) F32 [heads] (A_log BF16|F32); dA_log F32 [heads] += dA ⊙ A (undefined = frozen).
void mamba2_a_forward(const Tensor& a_log, Tensor& A, cudaStream_t stream);
void mamba2_a_backward(const Tensor& dA, const Tensor& A, Tensor& da_log, cudaStream_t stream);

}  // namespace mt::cuda
